"""What the gate answers with: the root :class:`OncegateError` and one subclass per ``ErrorReason``.

Each class's ``REASON`` is read from the generated ``ErrorReason`` enum, so a reason this module
names is one the proto defines; the properties read the ``ErrorInfo`` metadata the reason carries.
This module does not decode statuses (:mod:`oncegate.errors.status` does), nor own the guard's
errors (:mod:`oncegate.errors.outcome`) or the public names (:mod:`oncegate.errors`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import ClassVar

import grpc
from google.protobuf import timestamp_pb2

from oncegate.v1.oncegate_pb2 import ErrorReason

__all__ = [
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
]

DOMAIN = "oncegate"
"""The ``ErrorInfo.domain`` of every gate error."""


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
        return parse_int(self.metadata.get("fencing"))

    @property
    def lease_expired_at(self) -> datetime | None:
        """When the lease ended."""
        return parse_timestamp(self.metadata.get("lease_expired_at"))


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
        return parse_int(self.metadata.get("fencing"))

    @property
    def completed_at(self) -> datetime | None:
        """When the action was completed."""
        return parse_timestamp(self.metadata.get("completed_at"))


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


def parse_int(value: str | None) -> int | None:
    """Parses an integer metadata value; ``None`` when absent or not an integer."""
    try:
        return int(value) if value else None
    except ValueError:
        return None


def parse_timestamp(value: str | None) -> datetime | None:
    """Parses an RFC 3339 time (nanosecond precision allowed) into an aware UTC datetime."""
    if not value:
        return None
    stamp = timestamp_pb2.Timestamp()
    try:
        stamp.FromJsonString(value)
    except ValueError:
        return None
    return stamp.ToDatetime(tzinfo=timezone.utc)
