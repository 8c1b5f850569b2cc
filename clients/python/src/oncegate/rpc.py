"""The RPC layer: one channel to one gate, and one method per worker RPC.

It owns the channel, the metadata sent on every call, and the conversion between the plain
values of :mod:`oncegate.models` and the generated messages; a failed call raises what
:func:`oncegate.errors.from_rpc_error` makes of its status. It knows nothing of the guard: retries,
waiting and leases are the business of :mod:`oncegate.guard`, which builds on this class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2

from oncegate.errors import UnsettledGrant, from_rpc_error
from oncegate.fingerprints import encode_params
from oncegate.models import (
    ActionRecord,
    ActionRef,
    Completion,
    ReleaseReason,
    RequestTokenResult,
    Scope,
)
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub

__all__ = [
    "GateRpc",
    "Seconds",
    "complete_request",
    "extend_lease_request",
    "release_request",
    "request_token_request",
]

T = TypeVar("T")
_Self = TypeVar("_Self", bound="GateRpc")
Seconds = float | timedelta
"""A duration: seconds, or a :class:`~datetime.timedelta`."""


class GateRpc:
    """The RPCs of one oncegate server, without the guard (:class:`~oncegate.Gate` adds it).

    Args:
        target: ``host:port`` of the gate.
        api_key: Sent as ``authorization: Bearer <key>`` on every call.
        credentials: TLS channel credentials; a plaintext channel when ``None``.
        timeout: Deadline of each call, in seconds.
        options: Extra gRPC channel options.

    Every method raises an :class:`~oncegate.errors.OncegateError` subclass named by the gate's
    error reason, or :class:`~oncegate.errors.TransportError` when the gate was not reached. It
    is thread-safe and can be used as a context manager that closes its channel.
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
        if credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.insecure_channel(target, options=list(options))
        self._stub = ActionGateServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: Callable[..., T], request: Any) -> T:
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            error = from_rpc_error(err)
            if isinstance(error, UnsettledGrant):
                # It settles its grant itself (err.complete / err.release), through this client.
                error.bind(self)
            raise error from err

    def request_token(
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
        return RequestTokenResult.from_proto(self._call(self._stub.RequestToken, request))

    def complete(self, action: ActionRef, token: str, receipt: bytes) -> Completion:
        """Records that the attempt ran and what it returned; repeating it is a no-op that returns
        the stored completion."""
        request = complete_request(action, token, receipt)
        return Completion.from_proto(self._call(self._stub.Complete, request).completion)

    def release(
        self,
        action: ActionRef,
        token: str,
        reason: ReleaseReason = ReleaseReason.DEFINITE_FAILURE,
    ) -> int:
        """Gives the token back after a definite failure, or when the action was not attempted.

        Never after a timeout: reconcile with the provider first. Returns the released grant's
        fencing number (the next grant gets a higher one).
        """
        response: pb.ReleaseResponse = self._call(self._stub.Release, release_request(action, token, reason))
        return response.fencing

    def extend_lease(self, action: ActionRef, token: str, ttl: Seconds) -> datetime:
        """Moves the lease of a live token to ``ttl`` from now (store clock); returns the new expiry."""
        request = extend_lease_request(action, token, ttl)
        response: pb.ExtendLeaseResponse = self._call(self._stub.ExtendLease, request)
        return response.lease_expires_at.ToDatetime(tzinfo=timezone.utc)

    def get_action(self, action: ActionRef) -> ActionRecord:
        """Reads the record of an action as it stands, for reconciliation."""
        request = pb.GetActionRequest(action=action.to_proto())
        return ActionRecord.from_proto(self._call(self._stub.GetAction, request))


def request_token_request(
    action: str,
    params: Mapping[str, Any] | str,
    *,
    agent_id: str,
    run_id: str,
    intent_id: str | None,
    idempotency_key: str | None,
    holder: str | None,
    lease_ttl: Seconds | None,
) -> pb.RequestTokenRequest:
    """The RequestToken message (shared with :mod:`oncegate.aio.rpc`)."""
    request = pb.RequestTokenRequest(
        scope=Scope(agent_id, run_id).to_proto(),
        action=action,
        params_json=params if isinstance(params, str) else encode_params(params),
        intent_id=intent_id or "",
        idempotency_key=idempotency_key or "",
        holder=holder or "",
    )
    if lease_ttl is not None:
        request.lease_ttl.CopyFrom(_duration(lease_ttl))
    return request


def complete_request(action: ActionRef, token: str, receipt: bytes) -> pb.CompleteRequest:
    """The Complete message."""
    return pb.CompleteRequest(action=action.to_proto(), token=token, receipt=receipt)


def release_request(action: ActionRef, token: str, reason: ReleaseReason) -> pb.ReleaseRequest:
    """The Release message."""
    # The generated stub types enum fields as their wrapper class; any of its ints is accepted.
    return pb.ReleaseRequest(action=action.to_proto(), token=token, reason=int(reason))  # type: ignore[arg-type]


def extend_lease_request(action: ActionRef, token: str, ttl: Seconds) -> pb.ExtendLeaseRequest:
    """The ExtendLease message."""
    return pb.ExtendLeaseRequest(action=action.to_proto(), token=token, ttl=_duration(ttl))


def _duration(value: Seconds) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    if isinstance(value, timedelta):
        duration.FromTimedelta(value)
    else:
        duration.FromNanoseconds(round(value * 1e9))
    return duration
