"""Every exception of a gate call or of the guard, in one hierarchy::

    OncegateError                       a gate call failed, or the guard could not settle
    ├── KeyReusedError                  IDEMPOTENCY_KEY_REUSED
    ├── InProgressError                 IDEMPOTENCY_IN_PROGRESS
    ├── LeaseExpiredUnresolvedError     LEASE_EXPIRED_UNRESOLVED
    ├── TokenMismatchError              TOKEN_MISMATCH
    ├── TokenUnknownError               TOKEN_UNKNOWN
    ├── CompletedByOtherError           COMPLETED_BY_OTHER
    ├── AlreadyCompletedError           ALREADY_COMPLETED
    ├── InvalidRequestError             INVALID_REQUEST
    ├── UnauthenticatedError            UNAUTHENTICATED
    ├── ForbiddenScopeError             FORBIDDEN_SCOPE
    ├── StoreUnavailableError           STORE_UNAVAILABLE
    ├── RateLimitedError                RATE_LIMITED
    ├── PolicyDeniedError               POLICY_DENIED
    ├── BudgetExceededError             BUDGET_EXCEEDED
    ├── TransportError                  no oncegate ErrorInfo: the gate was not reached
    ├── PendingApprovalError            DECISION_PENDING_APPROVAL: nothing ran, an operator decides
    ├── OutcomeUnknownError             the guard kept the token: reconcile
    │   └── CompleteUnacknowledgedError the action ran; its Complete was not acknowledged
    ├── ReceiptDecodeError              a replayed receipt the guard's decoder cannot read
    └── DefiniteFailureError            raised by a guarded function: release the token

``LeaseExpiredUnresolvedError`` and ``OutcomeUnknownError`` carry a grant whose outcome is unknown
(:class:`~oncegate.errors.gate.UnsettledGrant`): after reconciling, ``err.complete(result)`` or
``err.release()`` settles it.

``LEASE_NOT_EXPIRED``, ``APPROVAL_NOT_PENDING`` and ``ALREADY_SETTLED`` (answers to operator and
resolver RPCs) and ``INTERNAL`` (a
server fault) come as
:class:`OncegateError` itself, with ``reason`` set. :mod:`oncegate.errors.gate` owns the gate's
errors, :mod:`oncegate.errors.status` decodes them (:func:`from_rpc_error`), and
:mod:`oncegate.errors.outcome` owns the guard's. This module only names them, and re-exports the
names from before the ``Error`` suffix, deprecated aliases defined in
:mod:`oncegate.errors.deprecated`.
"""

from oncegate.errors import deprecated
from oncegate.errors.deprecated import *  # noqa: F403 - the aliases, named by deprecated.__all__
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
    UnsettledGrant,
)
from oncegate.errors.outcome import (
    CompleteUnacknowledgedError,
    DefiniteFailureError,
    OutcomeUnknownError,
    PendingApprovalError,
    ReceiptDecodeError,
)
from oncegate.errors.status import from_rpc_error

__all__ = [
    "DOMAIN",
    "AlreadyCompletedError",
    "BudgetExceededError",
    "CompleteUnacknowledgedError",
    "CompletedByOtherError",
    "DefiniteFailureError",
    "FieldViolation",
    "ForbiddenScopeError",
    "InProgressError",
    "InvalidRequestError",
    "KeyReusedError",
    "LeaseExpiredUnresolvedError",
    "OncegateError",
    "OutcomeUnknownError",
    "PendingApprovalError",
    "PolicyDeniedError",
    "RateLimitedError",
    "ReceiptDecodeError",
    "StoreUnavailableError",
    "TokenMismatchError",
    "TokenUnknownError",
    "TransportError",
    "UnauthenticatedError",
    "UnsettledGrant",
    "from_rpc_error",
]
__all__ += deprecated.__all__
