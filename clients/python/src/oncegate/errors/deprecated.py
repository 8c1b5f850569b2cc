"""The exceptions' names from before the ``Error`` suffix, kept as deprecated aliases.

Each is the very class it names (so ``except KeyReused:`` still catches). This module is their one
definition: :mod:`oncegate.errors` and :mod:`oncegate` re-export its ``__all__``, and the table
"Deprecated names" of the client's README, the one place they are documented, is checked against
it by ``tests/test_names.py``. No version of the client has been released yet (``CHANGELOG.md``);
the aliases go in the release after the first one.
"""

from oncegate.errors.gate import (
    AlreadyCompletedError,
    CompletedByOtherError,
    ForbiddenScopeError,
    InProgressError,
    InvalidRequestError,
    KeyReusedError,
    LeaseExpiredUnresolvedError,
    RateLimitedError,
    StoreUnavailableError,
    TokenMismatchError,
    TokenUnknownError,
    UnauthenticatedError,
)
from oncegate.errors.outcome import CompleteUnacknowledgedError, DefiniteFailureError, OutcomeUnknownError

AlreadyCompleted = AlreadyCompletedError
CompletedByOther = CompletedByOtherError
CompletionUnrecorded = CompleteUnacknowledgedError
DefiniteFailure = DefiniteFailureError
ForbiddenScope = ForbiddenScopeError
InProgress = InProgressError
InvalidRequest = InvalidRequestError
KeyReused = KeyReusedError
LeaseExpiredUnresolved = LeaseExpiredUnresolvedError
OutcomeUnknown = OutcomeUnknownError
RateLimited = RateLimitedError
StoreUnavailable = StoreUnavailableError
TokenMismatch = TokenMismatchError
TokenUnknown = TokenUnknownError
Unauthenticated = UnauthenticatedError

__all__ = [
    "AlreadyCompleted",
    "CompletedByOther",
    "CompletionUnrecorded",
    "DefiniteFailure",
    "ForbiddenScope",
    "InProgress",
    "InvalidRequest",
    "KeyReused",
    "LeaseExpiredUnresolved",
    "OutcomeUnknown",
    "RateLimited",
    "StoreUnavailable",
    "TokenMismatch",
    "TokenUnknown",
    "Unauthenticated",
]
