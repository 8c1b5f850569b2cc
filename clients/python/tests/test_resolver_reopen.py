"""The resolver under a settlement that fails and may pass: the gate's stream sends an unresolved
action once, so a ``ResolveExpired`` answered ``UNAVAILABLE`` (its store did not answer) while the
stream stays open would leave the action for a person until the resolver restarts. The resolver
reopens its stream instead, and the gate sends the action again.

The answer is injected by a stand-in for the gate's operator service (a real grpcio server): a
real gate cannot fail one ``ResolveExpired`` while its stream goes on without leaving that call's
outcome unknown. ``test_resolver.py`` holds the resolver to the real gate's answers."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

from oncegate import Resolver
from oncegate.models import Completed
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.v1 import oncegate_pb2_grpc as pb_grpc


def unresolved() -> pb.UnresolvedAction:
    return pb.UnresolvedAction(
        action=pb.ActionRef(scope=pb.Scope(agent_id="billing-1", run_id="run-1"), key="invoice-9"),
        fencing=7,
        provider_key="og-0123",
        action_name="payments.transfer",
        params_json='{"amount":7}',
        token="t",
    )


class FlakyAdmin(pb_grpc.GateAdminServiceServicer):
    """One unresolved action whose first settlement fails UNAVAILABLE; streams stay open."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.opens = 0
        self.settlements = 0
        self.settled = threading.Event()

    def WatchUnresolved(self, request, context):  # noqa: N802 (the gRPC method's name)
        with self.lock:
            self.opens += 1
        if not self.settled.is_set():
            yield pb.WatchUnresolvedResponse(action=unresolved())
        # Nothing more, and open until the caller goes away.
        gone = threading.Event()
        context.add_callback(gone.set)
        gone.wait()

    def ResolveExpired(self, request, context):  # noqa: N802
        assert request.expected_fencing == 7, request
        with self.lock:
            self.settlements += 1
            first = self.settlements == 1
        if first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the store did not answer in time")
        self.settled.set()
        return pb.ResolveExpiredResponse(fencing=7)


def test_a_settlement_answered_unavailable_is_tried_again_on_a_reopened_stream() -> None:
    admin = FlakyAdmin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_GateAdminServiceServicer_to_server(admin, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    resolver = Resolver(f"127.0.0.1:{port}", backoff=(0.02, 0.2))
    lookups = []

    @resolver.lookup("payments.transfer")
    def bank(u):
        lookups.append(u.provider_key)
        return Completed(f"tx for {u.provider_key}", text=True)

    running = threading.Thread(target=resolver.run, daemon=True)
    running.start()
    try:
        assert admin.settled.wait(30), "the action is settled once the settlement can pass"
    finally:
        resolver.stop()
        running.join(10)
        server.stop(0)
    assert admin.settlements == 2, "failed once, then settled"
    assert admin.opens >= 2, f"the stream was reopened: {admin.opens} opens"
    assert lookups == ["og-0123", "og-0123"], "the provider was asked again"
