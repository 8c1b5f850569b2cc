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

The modules, bottom up; each imports only those below it (``tests/test_layers.py`` checks it):

- ``v1``: the generated gRPC stubs.
- ``_json``: the one-shot JSON encoder under the receipts' and the params' encoding. No IO.
- ``models``, ``fingerprints``: plain values; the offline fingerprint. No IO.
- ``statements``: offline verification of signed grant statements (:func:`verify_grant`). No IO.
- ``errors``: one exception hierarchy under :class:`OncegateError`; statuses decoded by reason.
- ``wire``: the request messages and the call metadata. No IO.
- ``channel``: the gRPC channel to one gate.
- ``rpc``: :class:`~oncegate.rpc.GateRpc`, the five worker RPCs over the channel.
- ``guard``: the at-most-once protocol (attempt, heartbeat, decorator) over ``rpc``.
- ``client``: :class:`Gate`, the RPCs plus the guard's entry points.
- ``resolver``: :class:`Resolver`, settling unresolved actions by asking the provider.
- ``local_gate``: :func:`local`, the gate server itself in this process (the native extension's).
- ``aio``: the same client on an event loop; its ``rpc``, ``attempt``, ``decorator`` and ``client``
  are the one source the threaded ``rpc``, ``guard.attempt``, ``guard.decorator`` and ``client``
  are generated from (``generate_sync.py``, unasync).
"""

from oncegate.client import Gate
from oncegate.errors import (
    AlreadyCompletedError,
    BudgetExceededError,
    CompletedByOtherError,
    CompleteUnacknowledgedError,
    DefiniteFailureError,
    FieldViolation,
    ForbiddenScopeError,
    InProgressError,
    InvalidRequestError,
    KeyReusedError,
    LeaseExpiredUnresolvedError,
    OncegateError,
    OutcomeUnknownError,
    PendingApprovalError,
    PolicyDeniedError,
    RateLimitedError,
    ReceiptDecodeError,
    StoreUnavailableError,
    TokenMismatchError,
    TokenUnknownError,
    TransportError,
    UnauthenticatedError,
)
from oncegate.errors import deprecated as _deprecated
from oncegate.errors.deprecated import *  # noqa: F403 - the aliases, named by its __all__
from oncegate.fingerprints import ParamsError, canonical_form, fingerprint, parse_params
from oncegate.guard import Attempt, GuardOptions, current_scope, scope
from oncegate.local_gate import LocalGate, LocalServer, local
from oncegate.models import (
    ActionRecord,
    ActionRef,
    ActionState,
    Approval,
    Completed,
    Completion,
    CompletionSource,
    Decision,
    Failed,
    Grant,
    ReceiptFormat,
    ReleaseReason,
    RequestTokenResult,
    Scope,
    Settled,
    Unknown,
    Unresolved,
)
from oncegate.resolver import Resolver
from oncegate.statements import GrantClaims, PublicKeys, StatementError, verify_grant

__all__ = [
    "ActionRecord",
    "ActionRef",
    "ActionState",
    "AlreadyCompletedError",
    "Approval",
    "Attempt",
    "BudgetExceededError",
    "CompleteUnacknowledgedError",
    "Completed",
    "CompletedByOtherError",
    "Completion",
    "CompletionSource",
    "Decision",
    "DefiniteFailureError",
    "Failed",
    "FieldViolation",
    "ForbiddenScopeError",
    "Gate",
    "Grant",
    "GrantClaims",
    "GuardOptions",
    "InProgressError",
    "InvalidRequestError",
    "KeyReusedError",
    "LeaseExpiredUnresolvedError",
    "LocalGate",
    "LocalServer",
    "OncegateError",
    "OutcomeUnknownError",
    "ParamsError",
    "PendingApprovalError",
    "PolicyDeniedError",
    "PublicKeys",
    "RateLimitedError",
    "ReceiptDecodeError",
    "ReceiptFormat",
    "ReleaseReason",
    "RequestTokenResult",
    "Resolver",
    "Scope",
    "Settled",
    "StatementError",
    "StoreUnavailableError",
    "TokenMismatchError",
    "TokenUnknownError",
    "TransportError",
    "UnauthenticatedError",
    "Unknown",
    "Unresolved",
    "canonical_form",
    "current_scope",
    "fingerprint",
    "local",
    "parse_params",
    "scope",
    "verify_grant",
]
# The deprecated names from before the Error suffix (oncegate.errors.deprecated).
__all__ += _deprecated.__all__
