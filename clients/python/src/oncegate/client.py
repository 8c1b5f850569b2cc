"""The synchronous oncegate client: one method per RPC, plus the guard entry points."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2

from oncegate import guard
from oncegate.errors import from_rpc_error
from oncegate.fingerprints import encode_params
from oncegate.models import (
    ActionRecord,
    ActionRef,
    Completion,
    Grant,
    ReleaseReason,
    RequestTokenResult,
    Scope,
)
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub

__all__ = ["Gate"]

T = TypeVar("T")
Seconds = float | timedelta


class Gate:
    """A client of one oncegate server.

    Args:
        target: ``host:port`` of the gate.
        api_key: Sent as ``authorization: Bearer <key>`` on every call.
        credentials: TLS channel credentials; a plaintext channel when ``None``.
        timeout: Deadline of each call, in seconds.
        options: Extra gRPC channel options.

    Every method raises an :class:`~oncegate.errors.OncegateError` subclass named by the gate's
    error reason, or :class:`~oncegate.errors.TransportError` when the gate was not reached. A
    ``Gate`` is thread-safe and can be used as a context manager that closes its channel.
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

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: Callable[..., T], request: Any) -> T:
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from err

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
        return RequestTokenResult.from_proto(self._call(self._stub.RequestToken, request))

    def complete(self, action: ActionRef, token: str, receipt: bytes) -> Completion:
        """Records that the attempt ran and what it returned; repeating it is a no-op that returns
        the stored completion."""
        request = pb.CompleteRequest(action=action.to_proto(), token=token, receipt=receipt)
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
        # The generated stub types enum fields as their wrapper class; any of its ints is accepted.
        request = pb.ReleaseRequest(action=action.to_proto(), token=token, reason=int(reason))  # type: ignore[arg-type]
        response: pb.ReleaseResponse = self._call(self._stub.Release, request)
        return response.fencing

    def extend_lease(self, action: ActionRef, token: str, ttl: Seconds) -> datetime:
        """Moves the lease of a live token to ``ttl`` from now (store clock); returns the new expiry."""
        request = pb.ExtendLeaseRequest(action=action.to_proto(), token=token, ttl=_duration(ttl))
        response: pb.ExtendLeaseResponse = self._call(self._stub.ExtendLease, request)
        return response.lease_expires_at.ToDatetime(tzinfo=timezone.utc)

    def get_action(self, action: ActionRef) -> ActionRecord:
        """Reads the record of an action as it stands, for reconciliation."""
        request = pb.GetActionRequest(action=action.to_proto())
        return ActionRecord.from_proto(self._call(self._stub.GetAction, request))

    def attempt(
        self,
        action: str,
        params: Mapping[str, Any],
        *,
        agent_id: str,
        run_id: str,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        key_fields_hint: Sequence[str] | None = None,
        **options: Any,
    ) -> guard.Attempt:
        """A guarded attempt of one action, as a context manager.

        Entering it asks for a token (waiting while another holder's attempt is in progress);
        the body then runs the action unless ``attempt.replayed``, and calls
        ``attempt.complete(result)``. See :class:`~oncegate.guard.Attempt` for what happens on
        exceptions, and :class:`~oncegate.guard.GuardOptions` for ``options``.
        """
        return guard.Attempt(
            self,
            guard.Request(action, dict(params), Scope(agent_id, run_id), intent_id, idempotency_key),
            guard.GuardOptions(**options),
            key_fields_hint=key_fields_hint,
        )

    def run(
        self,
        action: str,
        params: Mapping[str, Any],
        fn: Callable[[Grant], T],
        *,
        agent_id: str,
        run_id: str,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        key_fields_hint: Sequence[str] | None = None,
        **options: Any,
    ) -> T:
        """Runs ``fn(grant)`` at most once for this action and returns its result.

        On a replay ``fn`` does not run and the stored receipt, decoded by the ``decode`` option,
        is returned instead. See :meth:`attempt` for the arguments.
        """
        return self.attempt(
            action,
            params,
            agent_id=agent_id,
            run_id=run_id,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            key_fields_hint=key_fields_hint,
            **options,
        ).run(fn)

    def action(
        self, name: str, *, key_fields_hint: Sequence[str] | None = None, **options: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorates a tool function so that each logical call runs at most once.

        The function's arguments (by name, defaults included) are the params, except
        ``agent_id``, ``run_id``, ``idempotency_key`` and ``intent_id``, which the caller may pass
        as keywords (or take from :meth:`scope`). A parameter named ``grant`` receives the
        :class:`~oncegate.models.Grant`. See :func:`oncegate.guard.action` for details.
        """
        return guard.action(
            self, name, key_fields_hint=key_fields_hint, options=guard.GuardOptions(**options)
        )

    @staticmethod
    def scope(agent_id: str, run_id: str) -> AbstractContextManager[Scope]:
        """Sets the scope that decorated actions use when a call does not name one."""
        return guard.scope(agent_id, run_id)


def _duration(value: Seconds) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    if isinstance(value, timedelta):
        duration.FromTimedelta(value)
    else:
        duration.FromNanoseconds(round(value * 1e9))
    return duration
