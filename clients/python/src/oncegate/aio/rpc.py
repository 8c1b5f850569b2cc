"""The asyncio RPC layer: one ``grpc.aio`` channel to one gate, and one coroutine per worker RPC.

The same calls, values and errors as :class:`oncegate.rpc.GateRpc` (the request messages are built
by the same functions), awaited instead of blocking. The channel is opened on first use, inside
the event loop that uses it: a ``grpc.aio`` channel belongs to one loop, so a client must not be
shared between loops (each ``asyncio.run`` needs its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import grpc
import grpc.aio

from oncegate.errors import UnsettledGrant, from_rpc_error
from oncegate.models import ActionRecord, ActionRef, Completion, ReleaseReason, RequestTokenResult
from oncegate.rpc import (
    Seconds,
    complete_request,
    extend_lease_request,
    release_request,
    request_token_request,
)
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub

__all__ = ["GateRpc"]

T = TypeVar("T")
_Self = TypeVar("_Self", bound="GateRpc")


class GateRpc:
    """The RPCs of one oncegate server, awaited (:class:`oncegate.aio.Gate` adds the guard).

    Args:
        target: ``host:port`` of the gate.
        api_key: Sent as ``authorization: Bearer <key>`` on every call.
        credentials: TLS channel credentials; a plaintext channel when ``None``.
        timeout: Deadline of each call, in seconds.
        options: Extra gRPC channel options.

    Every coroutine raises an :class:`~oncegate.errors.OncegateError` subclass named by the gate's
    error reason, or :class:`~oncegate.errors.TransportError` when the gate was not reached. Use
    it as an ``async with`` block, or ``await close()``, to close the channel.
    """

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 10.0,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._credentials = credentials
        self._options = list(options)
        self._channel: grpc.aio.Channel | None = None
        self._stub: ActionGateServiceStub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )

    def _open(self) -> ActionGateServiceStub:
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            if self._loop is not None and self._loop is not loop and not self._loop.is_closed():
                raise RuntimeError(
                    "oncegate.aio: this client's channel belongs to another event loop; "
                    "create one client per loop"
                )
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._stub = ActionGateServiceStub(self._channel)  # type: ignore[no-untyped-call]
            self._loop = loop
        return self._stub

    async def close(self) -> None:
        """Closes the channel (a later call opens a new one)."""
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = self._loop = None

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _call(
        self, method: Callable[[ActionGateServiceStub], Callable[..., Awaitable[T]]], request: Any
    ) -> T:
        try:
            return await method(self._open())(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            error = from_rpc_error(err)
            if isinstance(error, UnsettledGrant):
                # It settles its grant itself (err.complete / err.release), through this client.
                error.bind(self)
            raise error from err

    async def request_token(
        self,
        action: str,
        params: Mapping[str, Any] | str,
        *,
        agent_id: str,
        run_id: str,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        holder: str | None = None,
        lease_ttl: Seconds | None = None,
    ) -> RequestTokenResult:
        """Asks for the one-shot token of one attempt; see :meth:`oncegate.rpc.GateRpc.request_token`."""
        request = request_token_request(
            action,
            params,
            agent_id=agent_id,
            run_id=run_id,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            holder=holder,
            lease_ttl=lease_ttl,
        )
        return RequestTokenResult.from_proto(await self._call(lambda stub: stub.RequestToken, request))

    async def complete(self, action: ActionRef, token: str, receipt: bytes) -> Completion:
        """Records that the attempt ran and what it returned; a repeat returns the stored completion."""
        response: pb.CompleteResponse = await self._call(
            lambda stub: stub.Complete, complete_request(action, token, receipt)
        )
        return Completion.from_proto(response.completion)

    async def release(
        self,
        action: ActionRef,
        token: str,
        reason: ReleaseReason = ReleaseReason.DEFINITE_FAILURE,
    ) -> int:
        """Gives the token back after a definite failure, or when the action was not attempted;
        returns the released grant's fencing number. Never after a timeout: reconcile first."""
        response: pb.ReleaseResponse = await self._call(
            lambda stub: stub.Release, release_request(action, token, reason)
        )
        return response.fencing

    async def extend_lease(self, action: ActionRef, token: str, ttl: Seconds) -> datetime:
        """Moves the lease of a live token to ``ttl`` from now (store clock); returns the new expiry."""
        response: pb.ExtendLeaseResponse = await self._call(
            lambda stub: stub.ExtendLease, extend_lease_request(action, token, ttl)
        )
        return response.lease_expires_at.ToDatetime(tzinfo=timezone.utc)

    async def get_action(self, action: ActionRef) -> ActionRecord:
        """Reads the record of an action as it stands, for reconciliation."""
        request = pb.GetActionRequest(action=action.to_proto())
        return ActionRecord.from_proto(await self._call(lambda stub: stub.GetAction, request))
