"""The transport under the RPC layer: the native core (``oncegate._native``) for plaintext
``host:port`` channels, grpcio for the others and for everything when ``ONCEGATE_PURE_PYTHON=1``.

The whole suite runs on whichever transport the environment selects (``make test-python`` runs
it on the native core, then a subset with ``ONCEGATE_PURE_PYTHON=1``); these tests check which
one a channel took and what only a transport can get wrong: deadlines, unreachable gates, large
messages both ways, cancellation, a connection lost between calls, a closed channel, a fork.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from datetime import timezone
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from oncegate import Gate, TransportError, aio, native
from oncegate.models import (
    ActionRef,
    ActionState,
    Approval,
    Completion,
    CompletionSource,
    Decision,
    Grant,
    ReceiptFormat,
    RequestTokenResult,
    Scope,
)
from oncegate.rpc import GateRpc
from oncegate.v1 import oncegate_pb2_grpc as pb_grpc
from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub

from conftest import REPO_ROOT
from fake_gate import FakeGate, serve

NATIVE = os.environ.get(native.PURE_PYTHON) != "1"
native_only = pytest.mark.skipif(not NATIVE, reason="the native core is off (ONCEGATE_PURE_PYTHON=1)")


class SlowGate(FakeGate):
    """A fake gate whose GetAction answers after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def GetAction(self, request: Any, context: grpc.ServicerContext) -> Any:
        time.sleep(self.delay)
        return super().GetAction(request, context)


@pytest.fixture
def slow_target() -> Iterator[str]:
    with serve(SlowGate(delay=1.5)) as target:
        yield target


def test_the_environment_selects_the_transport(fake_target: str) -> None:
    with Gate(fake_target) as gate:
        assert isinstance(gate._open(), native.Stub if NATIVE else ActionGateServiceStub)
        assert native.enabled() is NATIVE

    async def opened() -> Any:
        async with aio.Gate(fake_target) as gate:
            return gate._open()

    assert isinstance(asyncio.run(opened()), native.AioStub if NATIVE else ActionGateServiceStub)


@native_only
@pytest.mark.parametrize(
    ("target", "credentials", "options", "expected"),
    [
        ("127.0.0.1:50051", None, (), "http://127.0.0.1:50051"),
        ("localhost:50051", None, (), "http://localhost:50051"),
        ("dns:///gate.internal:443", None, (), "http://gate.internal:443"),
        ("[::1]:50051", None, (), "http://[::1]:50051"),
        ("unix:/var/run/oncegate/admin.sock", None, (), None),
        ("127.0.0.1", None, (), None),
        ("127.0.0.1:50051", grpc.ssl_channel_credentials(), (), None),
        ("127.0.0.1:50051", None, (("grpc.max_receive_message_length", 1 << 20),), None),
    ],
)
def test_what_the_native_core_serves(
    target: str, credentials: Any, options: Any, expected: str | None
) -> None:
    assert native.endpoint(target, credentials, options) == expected


def test_grpc_options_keep_the_grpcio_channel(fake: FakeGate, fake_target: str, run_id: str) -> None:
    options = (("grpc.max_receive_message_length", 1 << 22),)
    with Gate(fake_target, options=options) as gate:
        assert isinstance(gate._open(), ActionGateServiceStub)
        assert gate.run("pay", {"a": 1}, lambda grant: "paid", agent_id="a", run_id=run_id) == "paid"
    assert fake.calls["Complete"] == 1


def test_a_deadline_past_is_a_retryable_transport_error(slow_target: str) -> None:
    ref = ActionRef(key="k", scope=Scope("a", "r"))
    with GateRpc(slow_target, timeout=0.3) as rpc, pytest.raises(TransportError) as raised:
        rpc.get_action(ref)
    assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED and raised.value.retryable


def test_an_unreachable_gate_is_unavailable() -> None:
    with GateRpc("127.0.0.1:1", timeout=2.0) as rpc, pytest.raises(TransportError) as raised:
        rpc.get_action(ActionRef(key="k", scope=Scope("a", "r")))
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE and raised.value.retryable


def test_large_messages_both_ways(fake_target: str, run_id: str) -> None:
    receipt = {"blob": "x" * 300_000}  # past HTTP/2's initial 64 KiB window, both ways
    with Gate(fake_target) as gate:
        assert gate.run("upload", {"a": 1}, lambda grant: receipt, agent_id="a", run_id=run_id) == receipt
        replay = gate.run("upload", {"a": 1}, lambda grant: {"blob": "never"}, agent_id="a", run_id=run_id)
    assert replay == receipt


def test_calls_from_many_threads_share_one_channel(fake: FakeGate, fake_target: str, run_id: str) -> None:
    results: list[str] = []
    with Gate(fake_target) as gate:

        def work(n: int) -> None:
            for i in range(10):
                results.append(
                    gate.run("pay", {"n": n, "i": i}, lambda grant: "ok", agent_id="a", run_id=run_id)
                )

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == ["ok"] * 80 and fake.calls["Complete"] == 80


def test_a_cancelled_call_leaves_the_channel_usable(slow_target: str) -> None:
    ref = ActionRef(key="k", scope=Scope("a", "r"))

    async def scenario() -> None:
        async with aio.GateRpc(slow_target, timeout=10.0) as rpc:
            call = asyncio.ensure_future(rpc.get_action(ref))
            await asyncio.sleep(0.2)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            # The next call gets its own answer.
            record = await rpc.get_action(ref)
            assert record.state is ActionState.ABSENT

    asyncio.run(scenario())


def test_a_call_after_close_is_refused(fake_target: str) -> None:
    rpc = GateRpc(fake_target)
    rpc.get_action(ActionRef(key="k", scope=Scope("a", "r")))
    rpc.close()
    with pytest.raises(ValueError, match="closed channel"):
        rpc.get_action(ActionRef(key="k", scope=Scope("a", "r")))


@native_only
def test_a_connection_lost_while_idle_is_replaced() -> None:
    ref = ActionRef(key="k", scope=Scope("a", "r"))
    fake = FakeGate()
    with serve(fake) as target:
        rpc = GateRpc(target)  # the RPC layer alone: no guard to retry for it
        assert rpc.get_action(ref).state is ActionState.ABSENT
    # The server is gone, and its connection with it; a new one listens on the same port.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ActionGateServiceServicer_to_server(fake, server)
    server.add_insecure_port(target)
    server.start()
    try:
        assert rpc.get_action(ref).state is ActionState.ABSENT
    finally:
        server.stop(grace=None)
        rpc.close()


def test_a_gate_shutting_down_does_not_wait_for_an_idle_client(tmp_path: Any) -> None:
    # A gate shutting down asks each connection to acknowledge a PING before it closes it: a
    # client that answered only while it called would hold the gate for its whole drain.
    binary = os.environ.get("ONCEGATE_BIN", str(REPO_ROOT / "target" / "debug" / "oncegate"))
    command = [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(
        [*command, "--no-admin-socket", "--drain-seconds", "120"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    try:
        assert process.stdout is not None
        found = re.search(r"listening on (\S+)", process.stdout.readline())
        assert found, "the gate did not start"
        rpc = GateRpc(found.group(1))
        assert rpc.get_action(ActionRef(key="k", scope=Scope("a", "r"))).state is ActionState.ABSENT
        time.sleep(0.5)  # idle
        process.terminate()
        assert process.wait(timeout=60) == 0  # far less than the drain it was given
        rpc.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@native_only
def test_worker_calls_travel_on_one_session_that_a_draining_gate_ends(tmp_path: Any) -> None:
    # RequestToken and Complete go as messages of one Session stream (docs/CONTRACT.md), logged
    # as their unary methods; a gate shutting down ends the open session instead of waiting for
    # it, and the next call opens another on a new gate at the same address.
    binary = os.environ.get("ONCEGATE_BIN", str(REPO_ROOT / "target" / "debug" / "oncegate"))
    log_path = tmp_path / "gate.log"

    def start(listen: str) -> tuple[subprocess.Popen[str], str]:
        command = [binary, "serve", "--listen", listen, "--data-dir", str(tmp_path / "data")]
        with log_path.open("a") as log:
            process = subprocess.Popen(
                [*command, "--no-admin-socket", "--drain-seconds", "120"],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, "RUST_LOG": "info"},
            )
        assert process.stdout is not None
        found = re.search(r"listening on (\S+)", process.stdout.readline())
        assert found, f"the gate did not start: {log_path.read_text()}"
        return process, found.group(1)

    process, target = start("127.0.0.1:0")
    rpc = GateRpc(target)
    try:
        for i in range(3):
            answer = rpc.request_token("payments.transfer", {"i": i}, agent_id="a", run_id="r")
            assert answer.decision is Decision.GRANTED and answer.grant is not None
            rpc.complete(answer.action, answer.grant.token, b"{}")
        process.terminate()
        assert process.wait(timeout=60) == 0  # far less than the drain it was given
        log = log_path.read_text()
        assert "drain deadline passed" not in log, log
        finished = re.findall(r"rpc=oncegate\.v1\.ActionGateService/(\w+)\b[^\n]*finished", log)
        # The stream, logged once opened, then its calls as their unary methods.
        assert finished == ["Session"] + ["RequestToken", "Complete"] * 3, log

        process, _ = start(target)
        answer = rpc.request_token("payments.transfer", {"i": 3}, agent_id="a", run_id="r")
        assert answer.decision is Decision.GRANTED
    finally:
        rpc.close()
        if process.poll() is None:
            process.kill()
            process.wait()


def _in_child(out: Any) -> None:
    try:
        rpc = _PARENT_RPC["rpc"]
        out.put(
            [rpc.get_action(ActionRef(key=f"child-{i}", scope=Scope("a", "r"))).state.name for i in range(50)]
        )
    except BaseException as err:  # reported to the parent, which fails
        out.put(repr(err))


_PARENT_RPC: dict[str, GateRpc] = {}


@native_only  # grpcio needs GRPC_ENABLE_FORK_SUPPORT for this; its own matter
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_a_forked_child_uses_the_parents_client(gate_target: str) -> None:
    # The RPC layer alone, so that no guard retries over a failure.
    rpc = GateRpc(gate_target, api_key="test-key")
    # Used before the fork: the child inherits an open connection and the runtime that drove it,
    # which the parent goes on using while the child calls: each must use its own.
    assert rpc.get_action(ActionRef(key="parent", scope=Scope("a", "r"))).state is ActionState.ABSENT
    _PARENT_RPC["rpc"] = rpc
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_in_child, args=(out,))
    child.start()
    try:
        parent = [
            rpc.get_action(ActionRef(key=f"parent-{i}", scope=Scope("a", "r"))).state.name for i in range(50)
        ]
        assert out.get(timeout=60) == ["ABSENT"] * 50
        assert parent == ["ABSENT"] * 50
    finally:
        child.join(timeout=30)
        _PARENT_RPC.clear()
        rpc.close()
    assert child.exitcode == 0


def test_the_models_of_plain_values_equal_those_their_init_makes() -> None:
    """The plain-value calls' models are made without the dataclasses' ``__init__``
    (``native._made``): each must equal, field for field, what the ``__init__`` makes."""
    lease, done = (1_796_000_000, 123_456_789), (1_796_000_001, 999)
    lease_at, done_at = native._time(lease), native._time(done)
    assert lease_at == Timestamp(seconds=lease[0], nanos=lease[1]).ToDatetime(tzinfo=timezone.utc)
    assert done_at == Timestamp(seconds=done[0], nanos=done[1]).ToDatetime(tzinfo=timezone.utc)
    completion = (b'{"ok":true}', done, 7, "tok", 2, "ops-alice", 1)
    answer = native.request_token_result(
        (2, "agent", "run", "key-1", "v1-ab", ("tok", 7, lease, "pk", "jws"), completion, True, None)
    )
    expected_completion = Completion(
        b'{"ok":true}', done_at, 7, "tok", CompletionSource.OPERATOR, "ops-alice", ReceiptFormat.JSON
    )
    expected = RequestTokenResult(
        Decision.ALREADY_COMPLETED,
        ActionRef(Scope("agent", "run"), "key-1"),
        "v1-ab",
        Grant("tok", 7, lease_at, "pk", "jws"),
        expected_completion,
        True,
        None,
    )
    assert answer == expected
    assert hash(answer.action) == hash(expected.action)
    for made, built in [
        (answer, expected),
        (answer.action, expected.action),
        (answer.action.scope, expected.action.scope),
        (answer.grant, expected.grant),
        (answer.completion, expected.completion),
    ]:
        assert type(made) is type(built)
        assert vars(made) == vars(built)
        assert [field.name for field in dataclasses.fields(built)] == list(vars(made))
    bare = native.request_token_result((1, "", "", "", "", None, None, False, ("ap-1", None, "p", "why")))
    assert bare.grant is None and bare.completion is None
    assert bare.approval == Approval("ap-1", None, "p", "why")
    with pytest.raises(ValueError):
        native.request_token_result((99, "", "", "", "", None, None, False, None))
