"""What the gate answered: one exception class per ``ErrorReason``, and the decoding of a status.

Every gate error is a gRPC status carrying one ``google.rpc.ErrorInfo`` (domain ``oncegate``) in
its rich details. :func:`from_rpc_error` turns such a status into the :class:`OncegateError`
subclass named by the reason, with the metadata, ``RetryInfo`` and ``BadRequest`` details decoded.
A status without an oncegate ``ErrorInfo`` (a deadline, a refused connection, a proxy's answer)
becomes a :class:`TransportError`.

Each class's ``REASON`` is read from the generated ``ErrorReason`` enum, so a reason this module
names is one the proto defines. This module does not own the errors of the guard (see
:mod:`oncegate.errors.outcome`) nor the public names (see :mod:`oncegate.errors`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from oncegate.v1.oncegate_pb2 import ErrorReason

__all__ = [
    "BY_REASON",
    "DOMAIN",
    "AlreadyCompletedError",
    "CompletedByOtherError",
    "FieldViolation",
    "ForbiddenScopeError",
    "InProgressError",
    "InvalidRequestError",
    "KeyReusedError",
    "LeaseExpiredUnresolvedError",
    "OncegateError",
    "RateLimitedError",
    "StoreUnavailableError",
    "TokenMismatchError",
    "TokenUnknownError",
    "TransportError",
    "UnauthenticatedError",
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
    """The root of every oncegate exception: a gate call that did not succeed, or (in the
    subclasses of :mod:`oncegate.errors.outcome`) an outcome the guard could not settle.

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


class KeyReusedError(OncegateError):
    """The idempotency key names a stored request whose key fields differ. Never retry, and never
    mint a new key on your own: the request changed, find out why."""

    REASON = ErrorReason.Name(ErrorReason.IDEMPOTENCY_KEY_REUSED)

    @property
    def differing_fields(self) -> tuple[str, ...]:
        """Key-field JSON Pointers (``/amount``), or ``action`` / ``intent_id``, that differ."""
        raw = self.metadata.get("differing_fields", "")
        return tuple(name for name in raw.split(",") if name)


class InProgressError(OncegateError):
    """Another holder's lease on the action is live. Retry the same request after ``retry_after``."""

    REASON = ErrorReason.Name(ErrorReason.IDEMPOTENCY_IN_PROGRESS)
    _RETRYABLE = True


class LeaseExpiredUnresolvedError(OncegateError):
    """A grant's lease ended without Complete or Release. Reconcile with the provider (using the
    provider key), then Complete or Release with the old token."""

    REASON = ErrorReason.Name(ErrorReason.LEASE_EXPIRED_UNRESOLVED)

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


class TokenMismatchError(OncegateError):
    """The token was never granted for this action."""

    REASON = ErrorReason.Name(ErrorReason.TOKEN_MISMATCH)


class TokenUnknownError(OncegateError):
    """The action has no record."""

    REASON = ErrorReason.Name(ErrorReason.TOKEN_UNKNOWN)


class CompletedByOtherError(OncegateError):
    """Another token completed the action: it ran more than once."""

    REASON = ErrorReason.Name(ErrorReason.COMPLETED_BY_OTHER)

    @property
    def fencing(self) -> int | None:
        """The fencing number of the grant that completed the action."""
        return _int(self.metadata.get("fencing"))

    @property
    def completed_at(self) -> datetime | None:
        """When the action was completed."""
        return _timestamp(self.metadata.get("completed_at"))


class AlreadyCompletedError(OncegateError):
    """Release or ExtendLease of an action that already completed."""

    REASON = ErrorReason.Name(ErrorReason.ALREADY_COMPLETED)


class InvalidRequestError(OncegateError):
    """The request is malformed; ``field_violations`` say where."""

    REASON = ErrorReason.Name(ErrorReason.INVALID_REQUEST)

    @property
    def field(self) -> str:
        """The request field at fault."""
        return self.metadata.get("field", "")


class UnauthenticatedError(OncegateError):
    """The credential is missing or wrong."""

    REASON = ErrorReason.Name(ErrorReason.UNAUTHENTICATED)


class ForbiddenScopeError(OncegateError):
    """The credential may not act in this scope."""

    REASON = ErrorReason.Name(ErrorReason.FORBIDDEN_SCOPE)


class StoreUnavailableError(OncegateError):
    """The gate's store is unreachable; nothing was granted. Retry with backoff."""

    REASON = ErrorReason.Name(ErrorReason.STORE_UNAVAILABLE)
    _RETRYABLE = True


class RateLimitedError(OncegateError):
    """Too many requests; retry after ``retry_after``."""

    REASON = ErrorReason.Name(ErrorReason.RATE_LIMITED)
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


BY_REASON: Mapping[str, type[OncegateError]] = {
    **{
        cls.REASON: cls
        for cls in (
            KeyReusedError,
            InProgressError,
            LeaseExpiredUnresolvedError,
            TokenMismatchError,
            TokenUnknownError,
            CompletedByOtherError,
            AlreadyCompletedError,
            InvalidRequestError,
            UnauthenticatedError,
            ForbiddenScopeError,
            StoreUnavailableError,
            RateLimitedError,
        )
        if cls.REASON is not None
    },
    # Two reasons get the generic class, with `reason` set: LEASE_NOT_EXPIRED answers only the
    # operator RPC ResolveExpired, which this client does not call; INTERNAL is a fault on the
    # server's side (logged there) that a caller can only report, not handle or retry.
    ErrorReason.Name(ErrorReason.LEASE_NOT_EXPIRED): OncegateError,
    ErrorReason.Name(ErrorReason.INTERNAL): OncegateError,
}
"""The exception class of each ``ErrorReason`` (every value but ``ERROR_REASON_UNSPECIFIED``)."""


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
    cls = BY_REASON.get(info.reason, OncegateError)
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
