"""What the gate answers with: the root :class:`OncegateError` and one subclass per ``ErrorReason``.

Each class's ``REASON`` is read from the generated ``ErrorReason`` enum, so a reason this module
names is one the proto defines; the properties read the ``ErrorInfo`` metadata the reason carries.
This module does not decode statuses (:mod:`oncegate.errors.status` does), nor own the guard's
errors (:mod:`oncegate.errors.outcome`) or the public names (:mod:`oncegate.errors`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar, Protocol

import grpc
from google.protobuf import timestamp_pb2

from oncegate.models import ActionRef, ReleaseReason, Scope, json_encode
from oncegate.v1.oncegate_pb2 import ErrorReason

__all__ = [
    "DOMAIN",
    "AlreadyCompletedError",
    "BudgetExceededError",
    "CompletedByOtherError",
    "FieldViolation",
    "ForbiddenScopeError",
    "InProgressError",
    "InvalidRequestError",
    "KeyReusedError",
    "LeaseExpiredUnresolvedError",
    "OncegateError",
    "PolicyDeniedError",
    "RateLimitedError",
    "Settler",
    "StoreUnavailableError",
    "TokenMismatchError",
    "TokenUnknownError",
    "TransportError",
    "UnauthenticatedError",
    "UnsettledGrant",
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
        retry_after_ms: Milliseconds to wait before the same request may succeed (``RetryInfo``,
            else the ``retry_after_ms`` metadata), if given. Every client says retry delays in
            milliseconds with the unit in the name (TypeScript ``retryAfterMs``; Rust: a
            ``Duration``). ``retry_after`` (seconds) is its deprecated alias.
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
        retry_after_ms: int | None = None,
        field_violations: Iterable[FieldViolation] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason if reason is not None else self.REASON
        self.code = code
        self.metadata: dict[str, str] = dict(metadata or {})
        if retry_after is not None:
            if retry_after_ms is not None:
                raise TypeError("pass retry_after_ms, or its deprecated name retry_after, not both")
            _deprecated_retry_after(stacklevel=3)
            retry_after_ms = round(retry_after * 1000)
        self.retry_after_ms: int | None = retry_after_ms
        self.field_violations: tuple[FieldViolation, ...] = tuple(field_violations)

    @property
    def retry_after(self) -> float | None:
        """Deprecated: :attr:`retry_after_ms` in seconds (every client now says milliseconds)."""
        _deprecated_retry_after(stacklevel=3)
        return None if self.retry_after_ms is None else self.retry_after_ms / 1000

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
    """Another holder's lease on the action is live. Retry the same request after ``retry_after_ms``."""

    REASON = ErrorReason.Name(ErrorReason.IDEMPOTENCY_IN_PROGRESS)
    _RETRYABLE = True


class Settler(Protocol):
    """What settles a grant: a client's ``complete`` and ``release`` (``Gate``, or ``oncegate.aio``'s,
    whose methods return awaitables)."""

    def complete(self, action: ActionRef, token: str, receipt: bytes) -> Any: ...

    def release(self, action: ActionRef, token: str, reason: ReleaseReason = ...) -> Any: ...


class UnsettledGrant:
    """Mixed into the errors that carry a grant whose outcome is unknown: they settle it.

    After reconciling with the provider (ask it with ``provider_key``): :meth:`complete` with the
    result if the action happened, :meth:`release` if it did not. The client or guard that raised
    the error is bound to it, with the guard's own receipt encoder, so the receipt is stored
    exactly as a guarded call would have stored it and a later replay decodes it. With
    ``oncegate.aio`` both return awaitables: ``await err.complete(result)``.
    """

    action: ActionRef | None
    token: str
    _settler: Settler | None = None
    _encode: Callable[[Any], bytes] = staticmethod(json_encode)

    def bind(self, settler: Settler, encode: Callable[[Any], bytes] = json_encode) -> None:
        """Lets :meth:`complete` and :meth:`release` settle through ``settler``, encoding results
        with ``encode``. The client and the guard call it when they raise the error."""
        self._settler = settler
        self._encode = encode

    def complete(self, result: Any) -> Any:
        """Records ``result`` as the action's receipt, encoded as the guard encodes results (JSON
        by default). Returns the stored completion (an awaitable with ``oncegate.aio``)."""
        settler, action = self._settled_by()
        return settler.complete(action, self.token, self._encode(result))

    def release(self, reason: ReleaseReason = ReleaseReason.DEFINITE_FAILURE) -> Any:
        """Gives the token back: the provider says the action did not happen
        (``DEFINITE_FAILURE``), or it was never attempted (``NOT_ATTEMPTED``). Returns the fencing
        number (an awaitable with ``oncegate.aio``)."""
        settler, action = self._settled_by()
        return settler.release(action, self.token, reason)

    def _settled_by(self) -> tuple[Settler, ActionRef]:
        if self._settler is None or self.action is None or not self.token:
            raise RuntimeError(
                "this error is not bound to a gate (it was not raised by a client or a guard); "
                "call gate.complete(err.action, err.token, receipt) or gate.release(...) instead"
            )
        return self._settler, self.action


class LeaseExpiredUnresolvedError(UnsettledGrant, OncegateError):
    """A grant's lease ended without Complete or Release: its outcome is unknown. Reconcile with
    the provider (ask it with :attr:`provider_key`), then :meth:`complete` (it happened) or
    :meth:`release` (it did not) the old token: the error settles it itself."""

    REASON = ErrorReason.Name(ErrorReason.LEASE_EXPIRED_UNRESOLVED)

    @property
    def action(self) -> ActionRef | None:  # type: ignore[override]
        """The action, as the gate names it (to Complete or Release with)."""
        key = self.metadata.get("key")
        if not key:
            return None
        return ActionRef(Scope(self.metadata.get("agent_id", ""), self.metadata.get("run_id", "")), key)

    @property
    def token(self) -> str:  # type: ignore[override]
        """The token of the unresolved grant."""
        return self.metadata.get("token", "")

    @property
    def provider_key(self) -> str:
        """The key the provider was given: ask it whether the action happened."""
        return self.metadata.get("provider_key", "")

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
    """Too many requests; retry after ``retry_after_ms``."""

    REASON = ErrorReason.Name(ErrorReason.RATE_LIMITED)
    _RETRYABLE = True


class PolicyDeniedError(OncegateError):
    """An authorization policy forbids the action (or none permits it), or an operator denied its
    approval. Nothing was recorded. Do not retry."""

    REASON = ErrorReason.Name(ErrorReason.POLICY_DENIED)

    @property
    def policy_id(self) -> str:
        """The deciding policy's id (empty when no policy permits the action)."""
        return self.metadata.get("policy_id", "")

    @property
    def approval_id(self) -> str:
        """The denied approval's id, when an operator denied it."""
        return self.metadata.get("approval_id", "")


class BudgetExceededError(OncegateError):
    """A budget or velocity cap would be exceeded by this action. Nothing was recorded.

    The message is the gate's, as a person reads it: ``budget "eur-per-day" would be exceeded:
    9950.00 of 10000.00 used in the last 1 d, and this action needs 100.00; nothing was recorded;
    it frees up at 2026-12-03T14:05:00Z (in 23 h 59 min)``. The properties carry the same for
    programs: the amounts as the gate writes them in the budget's units (decimal text, exact:
    ``Decimal(err.used)`` to compute with them), :attr:`retry_at` and ``retry_after_ms`` (both
    ``None`` when the action alone is above the limit).
    """

    REASON = ErrorReason.Name(ErrorReason.BUDGET_EXCEEDED)

    @property
    def budget(self) -> str:
        """The budget's name."""
        return self.metadata.get("budget", "")

    @property
    def used(self) -> str:
        """What the budget's window holds already, in its units (``"9950.00"``; grants for a
        velocity cap)."""
        return self.metadata.get("used", "")

    @property
    def limit(self) -> str:
        """The budget's limit over its window, in its units."""
        return self.metadata.get("limit", "")

    @property
    def requested(self) -> str:
        """What this action would add, in the budget's units."""
        return self.metadata.get("requested", "")

    @property
    def retry_at(self) -> datetime | None:
        """When enough of the window frees up (UTC), as the gate's store clock saw it; ``None``
        when the action alone is above the limit."""
        return parse_timestamp(self.metadata.get("retry_at"))


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


def _deprecated_retry_after(stacklevel: int) -> None:
    warnings.warn(
        "OncegateError.retry_after (seconds) is deprecated, use retry_after_ms (every client says "
        "retry delays in milliseconds); retry_after goes in the release after the first one",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


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
