"""oncegate: run each side-effecting action of an agent at most once.

Quick start::

    from oncegate import Gate

    gate = Gate("localhost:50051")

    @gate.action("payments.transfer")
    def transfer(*, amount: int, currency: str, to: str, memo: str = "", grant) -> dict:
        return provider.transfer(amount, currency, to, memo, idempotency_key=grant.provider_key)

    with gate.scope(agent_id="billing-agent", run_id="run-7"):
        receipt = transfer(amount=5000, currency="EUR", to="DE89...", idempotency_key="invoice-42")

See :class:`Gate` for the raw RPCs, :mod:`oncegate.guard` for the protocol the guard follows,
:mod:`oncegate.errors` for the exceptions, and :func:`fingerprint` to compute keys offline.
"""

from oncegate.client import Gate
from oncegate.errors import (
    AlreadyCompleted,
    CompletedByOther,
    CompletionUnrecorded,
    DefiniteFailure,
    FieldViolation,
    ForbiddenScope,
    InProgress,
    InvalidRequest,
    KeyReused,
    LeaseExpiredUnresolved,
    OncegateError,
    OutcomeUnknown,
    RateLimited,
    StoreUnavailable,
    TokenMismatch,
    TokenUnknown,
    TransportError,
    Unauthenticated,
)
from oncegate.fingerprints import ParamsError, canonical_form, fingerprint, parse_params
from oncegate.guard import Attempt, GuardOptions, current_scope, scope
from oncegate.models import (
    ActionRecord,
    ActionRef,
    ActionState,
    Completion,
    CompletionSource,
    Decision,
    Grant,
    ReleaseReason,
    RequestTokenResult,
    Scope,
)

__all__ = [
    "ActionRecord",
    "ActionRef",
    "ActionState",
    "AlreadyCompleted",
    "Attempt",
    "CompletedByOther",
    "Completion",
    "CompletionSource",
    "CompletionUnrecorded",
    "Decision",
    "DefiniteFailure",
    "FieldViolation",
    "ForbiddenScope",
    "Gate",
    "Grant",
    "GuardOptions",
    "InProgress",
    "InvalidRequest",
    "KeyReused",
    "LeaseExpiredUnresolved",
    "OncegateError",
    "OutcomeUnknown",
    "ParamsError",
    "RateLimited",
    "ReleaseReason",
    "RequestTokenResult",
    "Scope",
    "StoreUnavailable",
    "TokenMismatch",
    "TokenUnknown",
    "TransportError",
    "Unauthenticated",
    "canonical_form",
    "current_scope",
    "fingerprint",
    "parse_params",
    "scope",
]
