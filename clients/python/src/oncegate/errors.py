"""Exceptions by reason: what the gate refused, and what the guard could not settle.

Every gate error is a gRPC status carrying one ``google.rpc.ErrorInfo`` (domain ``oncegate``) in
its rich details. :func:`from_rpc_error` turns such a status into the :class:`OncegateError`
subclass named by the reason, with the metadata, ``RetryInfo`` and ``BadRequest`` details decoded.
A status without an oncegate ``ErrorInfo`` (a deadline, a refused connection, a proxy's answer)
becomes a :class:`TransportError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from oncegate.models import ActionRef, Grant

__all__ = [
    "DOMAIN",
    "AlreadyCompleted",
    "CompletedByOther",
    "CompletionUnrecorded",
    "DefiniteFailure",
    "FieldViolation",
    "ForbiddenScope",
    "InProgress",
    "InvalidRequest",
    "KeyReused",
    "LeaseExpiredUnresolved",
    "OncegateError",
    "OutcomeUnknown",
    "RateLimited",
    "StoreUnavailable",
    "TokenMismatch",
    "TokenUnknown",
    "TransportError",
    "Unauthenticated",
    "from_rpc_error",
]

DOMAIN = "oncegate"
"""The ``ErrorInfo.domain`` of every gate error."""

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class FieldViolation:
    """One ``google.rpc.BadRequest`` field violation."""

    field: str
    description: str


class OncegateError(Exception):
    """A gate call that did not succeed.

    Attributes:
        reason: The ``ErrorInfo`` reason (``IDEMPOTENCY_KEY_REUSED``...), or ``None`` when the status
            carried no oncegate ``ErrorInfo``.
        metadata: The ``ErrorInfo`` metadata: every dynamic value of the error.
        code: The gRPC status code.
        retry_after: Seconds to wait before the same request may succeed (``RetryInfo``), if given.
        field_violations: The ``BadRequest`` field violations, if any.
    """

    REASON: ClassVar[str | None] = None
    _RETRYABLE: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        code: grpc.StatusCode | None = None,
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        field_violations: Iterable[FieldViolation] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason if reason is not None else self.REASON
        self.code = code
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after = retry_after
        self.field_violations: tuple[FieldViolation, ...] = tuple(field_violations)

    @property
    def retryable(self) -> bool:
        """Whether repeating the same request later may succeed."""
        return self._RETRYABLE

    def __str__(self) -> str:
        label = self.reason or (self.code.name if self.code is not None else "ERROR")
        return f"{label}: {self.message}"


class KeyReused(OncegateError):
    """The idempotency key names a stored request whose key fields differ. Never retry, and never
    mint a new key on your own: the request changed, find out why."""

    REASON = "IDEMPOTENCY_KEY_REUSED"

    @property
    def differing_fields(self) -> tuple[str, ...]:
        """Key-field JSON Pointers (``/amount``), or ``action`` / ``intent_id``, that differ."""
        raw = self.metadata.get("differing_fields", "")
        return tuple(name for name in raw.split(",") if name)


class InProgress(OncegateError):
    """Another holder's lease on the action is live. Retry the same request after ``retry_after``."""

    REASON = "IDEMPOTENCY_IN_PROGRESS"
    _RETRYABLE = True


class LeaseExpiredUnresolved(OncegateError):
    """A grant's lease ended without Complete or Release. Reconcile with the provider (using the
    provider key), then Complete or Release with the old token."""

    REASON = "LEASE_EXPIRED_UNRESOLVED"

    @property
    def token(self) -> str:
        """The token of the unresolved grant."""
        return self.metadata.get("token", "")

    @property
    def fencing(self) -> int | None:
        """The fencing number of the unresolved grant."""
        return _int(self.metadata.get("fencing"))

    @property
    def lease_expired_at(self) -> datetime | None:
        """When the lease ended."""
        return _timestamp(self.metadata.get("lease_expired_at"))


class TokenMismatch(OncegateError):
    """The token was never granted for this action."""

    REASON = "TOKEN_MISMATCH"


class TokenUnknown(OncegateError):
    """The action has no record."""

    REASON = "TOKEN_UNKNOWN"


class CompletedByOther(OncegateError):
    """Another token completed the action: it ran more than once."""

    REASON = "COMPLETED_BY_OTHER"

    @property
    def fencing(self) -> int | None:
        """The fencing number of the grant that completed the action."""
        return _int(self.metadata.get("fencing"))

    @property
    def completed_at(self) -> datetime | None:
        """When the action was completed."""
        return _timestamp(self.metadata.get("completed_at"))


class AlreadyCompleted(OncegateError):
    """Release or ExtendLease of an action that already completed."""

    REASON = "ALREADY_COMPLETED"


class InvalidRequest(OncegateError):
    """The request is malformed; ``field_violations`` say where."""

    REASON = "INVALID_REQUEST"

    @property
    def field(self) -> str:
        """The request field at fault."""
        return self.metadata.get("field", "")


class Unauthenticated(OncegateError):
    """The credential is missing or wrong."""

    REASON = "UNAUTHENTICATED"


class ForbiddenScope(OncegateError):
    """The credential may not act in this scope."""

    REASON = "FORBIDDEN_SCOPE"


class StoreUnavailable(OncegateError):
    """The gate's store is unreachable; nothing was granted. Retry with backoff."""

    REASON = "STORE_UNAVAILABLE"
    _RETRYABLE = True


class RateLimited(OncegateError):
    """Too many requests; retry after ``retry_after``."""

    REASON = "RATE_LIMITED"
    _RETRYABLE = True


class TransportError(OncegateError):
    """A status without an oncegate ``ErrorInfo``: the gate was not reached, or did not answer in
    time. ``reason`` is ``None``; ``retryable`` follows the status code."""

    _RETRYABLE_CODES: ClassVar[frozenset[grpc.StatusCode]] = frozenset(
        {
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.ABORTED,
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.UNKNOWN,
        }
    )

    @property
    def retryable(self) -> bool:
        """Whether the status code is one that a later attempt may not meet."""
        return self.code in self._RETRYABLE_CODES


_BY_REASON: dict[str, type[OncegateError]] = {
    cls.REASON: cls
    for cls in (
        KeyReused,
        InProgress,
        LeaseExpiredUnresolved,
        TokenMismatch,
        TokenUnknown,
        CompletedByOther,
        AlreadyCompleted,
        InvalidRequest,
        Unauthenticated,
        ForbiddenScope,
        StoreUnavailable,
        RateLimited,
    )
    if cls.REASON is not None
}


class DefiniteFailure(Exception):
    """Raise it (or a subclass) from a guarded function when the action definitely had no effect,
    e.g. the provider declined it. The guard then releases the token so that the action can be
    granted again, and re-raises."""


class OutcomeUnknown(Exception):
    """The guarded action may or may not have taken effect, so the guard did not release its token.

    Reconcile: ask the provider with ``grant.provider_key`` whether the action happened, then call
    ``gate.complete(action, grant.token, receipt)`` if it did or ``gate.release(action,
    grant.token)`` if it did not. Until then the action stays authorized (and later expired), and
    the gate refuses to run it again. The cause is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, action: ActionRef, grant: Grant) -> None:
        super().__init__(message)
        self.action = action
        self.grant = grant

    @property
    def token(self) -> str:
        """The token to Complete or Release with after reconciling."""
        return self.grant.token

    @property
    def fencing(self) -> int:
        """The fencing number of the grant."""
        return self.grant.fencing

    @property
    def provider_key(self) -> str:
        """The key the provider was given, to look the action up there."""
        return self.grant.provider_key


class CompletionUnrecorded(OutcomeUnknown):
    """The action ran and returned, but the gate never acknowledged the Complete.

    ``result`` is what the function returned and ``receipt`` its encoded form (``None`` when the
    result could not be encoded): retry ``gate.complete(action, token, receipt)`` later. Until it
    is recorded the gate does not know the action happened, so it is an unknown outcome to
    everyone else.
    """

    def __init__(
        self, message: str, *, action: ActionRef, grant: Grant, result: Any, receipt: bytes | None
    ) -> None:
        super().__init__(message, action=action, grant=grant)
        self.result = result
        self.receipt = receipt


def from_rpc_error(error: grpc.RpcError) -> OncegateError:
    """Maps a failed gRPC call to the exception for its ``ErrorInfo`` reason."""
    code: grpc.StatusCode | None = error.code() if hasattr(error, "code") else None
    message: str = (error.details() if hasattr(error, "details") else None) or str(error)
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    status = _rich_status(trailing or ())
    info = None
    retry_after = None
    violations: list[FieldViolation] = []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            candidate = error_details_pb2.ErrorInfo()
            detail.Unpack(candidate)
            if candidate.domain == DOMAIN and info is None:
                info = candidate
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after = retry.retry_delay.ToTimedelta().total_seconds()
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
    if info is None:
        return TransportError(message, code=code, retry_after=retry_after, field_violations=violations)
    metadata = dict(info.metadata)
    if retry_after is None and "retry_after_ms" in metadata:
        millis = _int(metadata["retry_after_ms"])
        retry_after = millis / 1000 if millis is not None else None
    cls = _BY_REASON.get(info.reason, OncegateError)
    return cls(
        message,
        reason=info.reason,
        code=code,
        metadata=metadata,
        retry_after=retry_after,
        field_violations=violations,
    )


def _rich_status(trailing: Iterable[Any]) -> status_pb2.Status | None:
    for key, value in trailing:
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            status.ParseFromString(value)
            return status
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _timestamp(value: str | None) -> datetime | None:
    """Parses an RFC 3339 time (nanosecond precision allowed) into an aware UTC datetime."""
    if not value:
        return None
    stamp = timestamp_pb2.Timestamp()
    try:
        stamp.FromJsonString(value)
    except ValueError:
        return None
    return stamp.ToDatetime(tzinfo=timezone.utc)
