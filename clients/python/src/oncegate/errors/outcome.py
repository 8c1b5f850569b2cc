"""What the guard could not settle, and the marker of a definite failure.

:class:`OutcomeUnknownError` (and :class:`CompleteUnacknowledgedError`, the Rust guard's
``GuardError::CompleteUnacknowledged``) are raised by the guard; :class:`DefiniteFailureError` is
raised by the guarded function. All three sit under :class:`~oncegate.errors.OncegateError` with
``reason`` ``None``, and print as their message alone, as they did before joining the hierarchy.
This module does not decide when they are raised: the guard does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncegate.errors.gate import OncegateError, UnsettledGrant
from oncegate.models import CompletionSource, ReceiptFormat

if TYPE_CHECKING:
    from oncegate.models import ActionRef, Approval, Completion, Grant

__all__ = [
    "CompleteUnacknowledgedError",
    "DefiniteFailureError",
    "OutcomeUnknownError",
    "PendingApprovalError",
    "ReceiptDecodeError",
]


class DefiniteFailureError(OncegateError):
    """Raise it (or a subclass) from a guarded function when the action definitely had no effect,
    e.g. the provider declined it. The guard then releases the token so that the action can be
    granted again, and re-raises.

    It takes any arguments, as :class:`Exception` does.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(Exception.__str__(Exception(*args)))
        self.args = args

    def __str__(self) -> str:
        return Exception.__str__(self)


class PendingApprovalError(OncegateError):
    """A rule holds the action for an operator's approval (``DECISION_PENDING_APPROVAL``): nothing
    ran, and this is not a grant. Once an operator approves ``approval.id``, the same request (same
    key fields) is granted once; a changed request needs its own approval.
    """

    def __init__(self, message: str, *, action: ActionRef, approval: Approval) -> None:
        super().__init__(message)
        self.action = action
        self.approval = approval

    def __str__(self) -> str:
        return Exception.__str__(self)

    @property
    def approval_id(self) -> str:
        """The approval to wait for."""
        return self.approval.id


class OutcomeUnknownError(UnsettledGrant, OncegateError):
    """The guarded action may or may not have taken effect, so the guard did not release its token.

    Reconcile: ask the provider with :attr:`provider_key` whether the action happened, then
    ``err.complete(result)`` if it did (the receipt is encoded by the guard's own encoder, so the
    next guarded call replays it) or ``err.release()`` if it did not. Until then the action stays
    authorized (and later expired), and the gate refuses to run it again. The cause is chained as
    ``__cause__``.
    """

    def __init__(self, message: str, *, action: ActionRef, grant: Grant) -> None:
        super().__init__(message)
        self.action = action
        self.grant = grant

    def __str__(self) -> str:
        return Exception.__str__(self)

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


class CompleteUnacknowledgedError(OutcomeUnknownError):
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


class ReceiptDecodeError(OncegateError):
    """A replayed receipt that this client cannot decode. The action is *not* run again.

    A receipt is decoded by its format: an operator's JSON receipt as the value it holds, an
    operator's text receipt as a ``str``, and a worker's (``ReceiptFormat.UNSPECIFIED``) by the
    guard's ``decode`` (JSON by default). The message names the action (agent, run, key) and who
    wrote the receipt (a worker, or the operator by name, and the format). A worker's receipt that
    fails is usually one completed by hand with raw bytes (``gate.complete(action, token,
    b"msg-42")``; ``err.complete(result)`` encodes as the guard does) or by a guard with another
    ``encode``: pass a ``decode=`` that reads it. ``receipt`` and ``completion`` hold what is
    stored; the decoder's error is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, action: ActionRef, completion: Completion) -> None:
        super().__init__(message)
        self.action = action
        self.completion = completion

    def __str__(self) -> str:
        return Exception.__str__(self)

    @property
    def receipt(self) -> bytes:
        """The stored receipt, as the gate returned it."""
        return self.completion.receipt

    @property
    def writer(self) -> str:
        """Who wrote the receipt: ``"worker"`` or ``"operator"``."""
        return "operator" if self.completion.source == CompletionSource.OPERATOR else "worker"

    @property
    def operator(self) -> str:
        """The operator principal who wrote it (empty for a worker's receipt)."""
        return self.completion.operator

    @property
    def receipt_format(self) -> ReceiptFormat:
        """The format its writer stated (``UNSPECIFIED``: a worker's, in its client's encoding)."""
        return self.completion.receipt_format
