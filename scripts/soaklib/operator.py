"""The operator: reconciles expired leases through the operator API, as a person on call would.

A round lists every agent's unresolved actions (``ListUnresolved`` per agent: listing one agent does
not depend on the agents index, which is only a hint), asks the provider whether each action
happened, and resolves it: ``ResolveExpired(COMPLETED)`` with the provider's receipt, or
``ResolveExpired(FAILED)``. The final listing at the end of a soak is the same listing, kept as a
``final_unresolved`` event for the checker. Every RPC is recorded through the same interceptor as
the workers' (``who`` = ``operator``). It runs in the soak's main thread, between faults.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import grpc

from oncegate.errors import OncegateError, from_rpc_error
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.v1.oncegate_pb2_grpc import GateAdminServiceStub

from soaklib.client import AGENTS
from soaklib.history import History, Recorder, intercepted
from soaklib.provider import ProviderClient


class Operator:
    """An operator principal's admin client to one gate (the caller picks which)."""

    def __init__(self, history: History, gates: list[tuple[str, str]], api_key: str, provider_port: int) -> None:
        self.metadata = (("authorization", f"Bearer {api_key}"),)
        self.stubs = []
        self.channels = []
        for name, target in gates:
            options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                       ("grpc.max_reconnect_backoff_ms", 1000)]
            channel = intercepted(grpc.insecure_channel(target, options=options), Recorder(history, "operator", name))
            self.channels.append(channel)
            self.stubs.append(GateAdminServiceStub(channel))  # type: ignore[no-untyped-call]
        self.provider = ProviderClient(provider_port)
        self.history = history

    def close(self) -> None:
        self.provider.close()
        for channel in self.channels:
            channel.close()

    def _call(self, stub_index: int, rpc: str, request: Any) -> Any:
        try:
            return getattr(self.stubs[stub_index % len(self.stubs)], rpc)(
                request, timeout=5.0, metadata=self.metadata)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from err

    def list_unresolved(self, gate: int, attempts: int = 1) -> list[pb.UnresolvedAction] | None:
        """Every agent's unresolved actions, or None when a page could not be had."""
        found: list[pb.UnresolvedAction] = []
        for agent in range(AGENTS):
            page_token = ""
            while True:
                request = pb.ListUnresolvedRequest(agent_id=f"soak-agent-{agent}", page_size=200,
                                                   page_token=page_token)
                reply = self._retry(gate, "ListUnresolved", request, attempts)
                if reply is None:
                    return None
                found.extend(reply.actions)
                page_token = reply.next_page_token
                if not page_token:
                    break
        return found

    def _retry(self, gate: int, rpc: str, request: Any, attempts: int) -> Any:
        for i in range(attempts):
            try:
                return self._call(gate + i, rpc, request)
            except OncegateError as err:
                if not err.retryable or i == attempts - 1:
                    return None
                time.sleep(0.5)
        return None

    def reconcile(self, gate: int) -> dict[str, int]:
        """One round; returns how many actions it resolved each way."""
        counts = {"listed": 0, "completed": 0, "failed": 0, "refused": 0}
        for entry in self.list_unresolved(gate) or []:
            counts["listed"] += 1
            key = [entry.action.scope.agent_id, entry.action.scope.run_id, entry.action.key]
            answer = self.provider.call(op="lookup", key=key)
            if answer["performed"]:
                request = pb.ResolveExpiredRequest(
                    action=entry.action, resolution=pb.RESOLUTION_COMPLETED,
                    receipt=json.dumps({"tx": answer["receipt"]}, separators=(",", ":")).encode(),
                    receipt_format=pb.RECEIPT_FORMAT_JSON,  # replayed by the guard as the value
                    note="soak operator: the provider performed it")
            else:
                request = pb.ResolveExpiredRequest(action=entry.action, resolution=pb.RESOLUTION_FAILED,
                                                   note="soak operator: the provider never saw it")
            try:
                self._call(gate, "ResolveExpired", request)
                counts["completed" if answer["performed"] else "failed"] += 1
            except OncegateError:
                counts["refused"] += 1
        return counts

    def settled_by_resolvers(self, cannot_tell: Callable[[str], bool], deadline: float) -> None:
        """Waits (listing each second) until every unresolved action is one whose provider key the
        provider cannot tell, or the deadline passes: the resolvers settle the rest within seconds."""
        while time.time() < deadline:
            found = self.list_unresolved(0, attempts=3)
            if found is not None and all(cannot_tell(a.provider_key) for a in found):
                return
            time.sleep(1.0)

    def final_listing(self, deadline: float) -> None:
        """Lists until one full listing succeeds (or the deadline passes) and records it."""
        gate = 0
        while True:
            found = self.list_unresolved(gate, attempts=3)
            if found is not None or time.time() > deadline:
                break
            gate += 1
            time.sleep(1.0)
        keys = [[a.action.scope.agent_id, a.action.scope.run_id, a.action.key] for a in found or []]
        self.history.write(t="final_unresolved", time=time.time(), complete=found is not None, keys=keys,
                           provider_keys=[a.provider_key for a in found or []])
