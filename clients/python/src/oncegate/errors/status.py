"""Decoding a failed call: a gRPC status with rich details becomes the exception for its reason.

Every gate error is a gRPC status carrying one ``google.rpc.ErrorInfo`` (domain ``oncegate``) in
its rich details. :func:`from_rpc_error` turns such a status into the :class:`OncegateError`
subclass named by the reason (:data:`BY_REASON`), with the metadata, ``RetryInfo`` and
``BadRequest`` details decoded. A status without an oncegate ``ErrorInfo`` (a deadline, a refused
connection, a proxy's answer) becomes a :class:`TransportError`. The classes live in
:mod:`oncegate.errors.gate`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from oncegate.errors.gate import (
    DOMAIN,
    AlreadyCompletedError,
    BudgetExceededError,
    CompletedByOtherError,
    FieldViolation,
    ForbiddenScopeError,
    InProgressError,
    InvalidRequestError,
    KeyReusedError,
    LeaseExpiredUnresolvedError,
    OncegateError,
    PolicyDeniedError,
    RateLimitedError,
    StoreUnavailableError,
    TokenMismatchError,
    TokenUnknownError,
    TransportError,
    UnauthenticatedError,
    parse_int,
)
from oncegate.v1.oncegate_pb2 import ErrorReason

__all__ = ["BY_REASON", "from_rpc_error"]

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


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
            PolicyDeniedError,
            BudgetExceededError,
        )
        if cls.REASON is not None
    },
    # Four reasons get the generic class, with `reason` set: LEASE_NOT_EXPIRED,
    # APPROVAL_NOT_PENDING and ALREADY_SETTLED answer only operator and resolver RPCs
    # (ResolveExpired, DecideApproval), which a worker does not call; INTERNAL is a fault on the
    # server's side (logged there) that a caller can only report, not handle or retry.
    ErrorReason.Name(ErrorReason.LEASE_NOT_EXPIRED): OncegateError,
    ErrorReason.Name(ErrorReason.APPROVAL_NOT_PENDING): OncegateError,
    ErrorReason.Name(ErrorReason.ALREADY_SETTLED): OncegateError,
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
    retry_after_ms: int | None = None
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
            retry_after_ms = retry.retry_delay.ToMilliseconds()
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
    if info is None:
        return TransportError(message, code=code, retry_after_ms=retry_after_ms, field_violations=violations)
    metadata = dict(info.metadata)
    if retry_after_ms is None:
        retry_after_ms = parse_int(metadata.get("retry_after_ms"))
    cls = BY_REASON.get(info.reason, OncegateError)
    return cls(
        message,
        reason=info.reason,
        code=code,
        metadata=metadata,
        retry_after_ms=retry_after_ms,
        field_violations=violations,
    )


def _rich_status(trailing: Iterable[Any]) -> status_pb2.Status | None:
    for key, value in trailing:
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            status.ParseFromString(value)
            return status
    return None
