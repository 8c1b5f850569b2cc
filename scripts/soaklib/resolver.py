"""The resolvers: in a ``--resolver`` soak they replace the operator's reconcile rounds.

One :class:`oncegate.Resolver` (the Python client's, threaded) per gate, as a ``resolver``
principal: each follows its gate's ``WatchUnresolved`` stream, asks the fake provider by provider
key (``lookup_provider_key``: completed, failed, or unknown for the keys the provider cannot tell)
and settles with ``ResolveExpired`` and ``expected_fencing``. Its RPCs go through the same
recording interceptor as everyone's (``who`` = ``resolver``), so the checker sees its settlements
as it sees an operator's; two or three replicas race for every action, as resolver replicas do.
Each settlement is also recorded as a ``resolution`` event: ``key``, ``fencing``,
``lease_expired_at`` (the store's clock, which is the machine's), ``time`` (when the settlement
was answered) and ``settled`` (completed, failed, by_other, left).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from oncegate import Completed, Failed, Resolver, Settled, Unknown, Unresolved
from oncegate.v1.oncegate_pb2_grpc import GateAdminServiceStub

from soaklib.history import History, Recorder, intercepted
from soaklib.provider import ProviderClient


class RecordedResolver(Resolver):
    """A resolver whose admin calls are recorded, and whose settlements are events."""

    def __init__(self, history: History, gate: tuple[str, str], api_key: str, provider_port: int) -> None:
        name, target = gate
        super().__init__(target, api_key=api_key, timeout=5.0, lookup_timeout=5.0, backoff=(0.2, 2.0),
                         note="soak resolver: the provider's lookup by provider key")
        self.history = history
        self.gate = name
        self._admin_stub = GateAdminServiceStub(  # type: ignore[no-untyped-call]
            intercepted(self._grpc(), Recorder(history, "resolver", name)))
        self.provider_port = provider_port
        self.lookup("soak.reconcile")(self.ask)
        self.lookup("soak.regrant")(self.ask)

    def ask(self, u: Unresolved) -> Any:
        provider = ProviderClient(self.provider_port)  # one per lookup: a timed-out one may linger
        try:
            answer = provider.call(op="lookup_provider_key", provider_key=u.provider_key)
        finally:
            provider.close()
        if answer["answer"] == "completed":
            return Completed({"tx": answer["receipt"]})
        if answer["answer"] == "failed":
            return Failed()
        return Unknown()

    def settle(self, unresolved: Unresolved) -> Settled:
        settled = super().settle(unresolved)
        scope = unresolved.action.scope
        expired = unresolved.lease_expired_at
        self.history.write(t="resolution", time=time.time(), gate=self.gate,
                           key=[scope.agent_id, scope.run_id, unresolved.action.key],
                           provider_key=unresolved.provider_key, fencing=unresolved.fencing,
                           lease_expired_at=expired.timestamp() if expired is not None else None,
                           settled=settled.value)
        return settled


class Resolvers:
    """One recorded resolver per gate, each on its own thread. Their log lines (one warning per
    action left for a person, dozens a minute here) are not printed: the ``resolution`` events and
    the summary say the same."""

    def __init__(self, history: History, gates: list[tuple[str, str]], api_key: str, provider_port: int) -> None:
        logging.getLogger("oncegate.resolver").propagate = False
        logging.getLogger("oncegate.resolver").addHandler(logging.NullHandler())
        self.resolvers = [RecordedResolver(history, gate, api_key, provider_port) for gate in gates]
        self.threads = [threading.Thread(target=r.run, daemon=True, name=f"resolver-{r.gate}")
                        for r in self.resolvers]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for resolver in self.resolvers:
            resolver.stop()
        for thread in self.threads:
            thread.join(30)
        for resolver in self.resolvers:
            resolver.close()
