"""The RPC layer: one method per worker RPC, over one channel to one gate.

It owns the calls: the conversion between the plain values of :mod:`oncegate.models` and the
generated messages (built by :mod:`oncegate.wire`), or, on the native core, the plain-value calls
of its stub (:class:`oncegate.native.Stub`: no protobuf object in Python), and what a failed call
raises, which is what
:func:`oncegate.errors.from_rpc_error` makes of its status. The channel is
:class:`~oncegate.aio.channel.Channel`'s. It knows nothing of the guard: retries, waiting and
leases are the business of :mod:`oncegate.guard`, which builds on this class.

One source, two clients: ``oncegate/aio/rpc.py`` is written by hand, and ``generate_sync.py``
writes the threaded ``oncegate/rpc.py`` from it with unasync.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

import grpc

from oncegate import native
from oncegate.aio.channel import Channel
from oncegate.errors import OncegateError, UnsettledGrant, from_rpc_error
from oncegate.fingerprints import encode_params
from oncegate.models import ActionRecord, ActionRef, Completion, ReleaseReason, RequestTokenResult
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.wire import (
    Seconds,
    complete_request,
    extend_lease_request,
    get_action_request,
    nanoseconds,
    release_request,
    request_token_request,
)

__all__ = [
    "GateRpc",
    "Seconds",
    "complete_request",
    "extend_lease_request",
    "release_request",
    "request_token_request",
]

T = TypeVar("T")


class GateRpc(Channel):
    """The RPCs of one oncegate server, without the guard (:class:`~oncegate.aio.client.Gate` adds
    it).

    Args:
        target: The gate's address in any of :data:`oncegate.address.FORMS`; without it
            ``ONCEGATE_TARGET``, else ``127.0.0.1:50051``.
        api_key: Sent as ``authorization: Bearer <key>`` on every call.
        credentials: TLS channel credentials; a plaintext channel when ``None``.
        timeout: Deadline of each call, in seconds.
        options: Extra gRPC channel options.

    Every method raises an :class:`~oncegate.errors.OncegateError` subclass named by the gate's
    error reason, or :class:`~oncegate.errors.TransportError` when the gate was not reached. See
    :class:`~oncegate.aio.channel.Channel` for how the channel opens and closes.
    """

    async def _call(self, method: Callable[..., Awaitable[T]], *args: Any) -> T:
        try:
            return await method(*args, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise self._failure(err) from err

    def _failure(self, err: grpc.RpcError) -> OncegateError:
        """What a failed call raises: the error its status names, bound to this client when it
        settles its grant itself (``err.complete`` / ``err.release``)."""
        error = from_rpc_error(err)
        if isinstance(error, UnsettledGrant):
            error.bind(self)
        return error

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
        """Asks for the one-shot token of one attempt of an action.

        Args:
            action: The action type or tool name, e.g. ``"payments.transfer"``.
            params: The action's arguments: a mapping (sent as compact JSON) or JSON text as is.
            agent_id: The agent's id.
            run_id: The workflow-run id that survives restarts of the agent.
            intent_id: Separates deliberate repeats (two real $10 transfers) from retries.
            idempotency_key: Names the logical action; retries must then carry the same key fields.
            holder: Names the asking worker, so that it gets its own token back if a reply is lost.
            lease_ttl: Lease length; the action policy's when ``None``.

        Returns:
            A grant (execute, then Complete or Release) or the completion of an action that
            already ran (do not execute).
        """
        stub = self._open()
        if isinstance(stub, native.Stub):
            return await self._call(
                stub.request_token,
                action,
                params if isinstance(params, str) else encode_params(params),
                agent_id,
                run_id,
                intent_id or "",
                idempotency_key or "",
                holder or "",
                None if lease_ttl is None else nanoseconds(lease_ttl),
            )
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
        return RequestTokenResult.from_proto(await self._call(stub.RequestToken, request))

    async def complete(self, action: ActionRef, token: str, receipt: bytes) -> Completion:
        """Records that the attempt ran and what it returned; repeating it is a no-op that returns
        the stored completion."""
        stub = self._open()
        if isinstance(stub, native.Stub):
            return await self._call(stub.complete, action, token, receipt)
        response: pb.CompleteResponse = await self._call(
            stub.Complete, complete_request(action, token, receipt)
        )
        return Completion.from_proto(response.completion)

    async def release(
        self,
        action: ActionRef,
        token: str,
        reason: ReleaseReason = ReleaseReason.DEFINITE_FAILURE,
    ) -> int:
        """Gives the token back after a definite failure, or when the action was not attempted.

        Never after a timeout: reconcile with the provider first. Returns the released grant's
        fencing number (the next grant gets a higher one).
        """
        stub = self._open()
        if isinstance(stub, native.Stub):
            return await self._call(stub.release, action, token, int(reason))
        response: pb.ReleaseResponse = await self._call(stub.Release, release_request(action, token, reason))
        return response.fencing

    async def extend_lease(self, action: ActionRef, token: str, ttl: Seconds) -> datetime:
        """Moves the lease of a live token to ``ttl`` from now (store clock); returns the new expiry."""
        stub = self._open()
        if isinstance(stub, native.Stub):
            return await self._call(stub.extend_lease, action, token, nanoseconds(ttl))
        response: pb.ExtendLeaseResponse = await self._call(
            stub.ExtendLease, extend_lease_request(action, token, ttl)
        )
        return response.lease_expires_at.ToDatetime(tzinfo=timezone.utc)

    async def get_action(self, action: ActionRef) -> ActionRecord:
        """Reads the record of an action as it stands, for reconciliation."""
        request = get_action_request(action)
        return ActionRecord.from_proto(await self._call(self._open().GetAction, request))
