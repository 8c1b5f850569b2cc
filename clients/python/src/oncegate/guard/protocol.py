"""The guard's decisions, without IO: shared by the threaded attempt and the asyncio one.

Each function decides or words one step of the protocol (see :mod:`oncegate.guard`): the holder an
attempt names, the lease its heartbeat keeps, the pause while another holder's attempt is in
progress, how a block that ended is settled, and the errors the guard raises. Calling the gate,
sleeping and threads are the business of :mod:`oncegate.guard.attempt` and
:mod:`oncegate.aio.attempt`, which both follow these decisions, so the two cannot drift apart.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any, Literal

from oncegate.errors import (
    CompleteUnacknowledgedError,
    DefiniteFailureError,
    InProgressError,
    OncegateError,
    OutcomeUnknownError,
    PendingApprovalError,
    ReceiptDecodeError,
)
from oncegate.guard.options import GuardOptions, Request
from oncegate.models import (
    ActionRef,
    Completion,
    CompletionSource,
    Grant,
    ReceiptFormat,
    RequestTokenResult,
)

__all__ = [
    "Settlement",
    "decode_replay",
    "default_holder",
    "encode_failed",
    "in_progress_beyond_wait",
    "in_progress_pause",
    "is_definite",
    "lease_seconds",
    "log_interrupted",
    "log_release_failed",
    "no_result",
    "not_acknowledged",
    "pending_approval",
    "receipt_writer",
    "reconcile_hint",
    "retry_seconds",
    "settlement",
    "unknown_outcome",
]

logger = logging.getLogger("oncegate")

Settlement = Literal["no_result", "interrupted", "release", "unknown"]
"""How a granted block that ended without ``complete()`` or ``skip()`` is settled."""


def default_holder() -> str:
    """A holder name unique to one attempt, so a lost grant reply is re-delivered to it alone:
    host, process, a random id drawn once per process, and a per-process counter (no system call
    per attempt)."""
    prefix, counter = _holder or _start_holders()
    return f"{prefix}{next(counter)}"


_holder: tuple[str, Iterator[int]] | None = None
"""The process's holder prefix and counter; drawn again in a forked child."""


def _start_holders() -> tuple[str, Iterator[int]]:
    global _holder
    _holder = (f"py:{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex}:", itertools.count(1))
    return _holder


def _forget_holders() -> None:
    global _holder
    _holder = None


os.register_at_fork(after_in_child=_forget_holders)


def lease_seconds(options: GuardOptions, grant: Grant) -> float | None:
    """The lease the heartbeat keeps extending: the one asked for, else the one granted."""
    if options.lease_ttl is not None:
        return options.lease_ttl
    if grant.lease_expires_at is None:
        return None
    return max(1.0, (grant.lease_expires_at - datetime.now(timezone.utc)).total_seconds())


def retry_seconds(err: OncegateError) -> float | None:
    """The gate's retry delay in seconds, for sleeping (the errors say milliseconds)."""
    return None if err.retry_after_ms is None else err.retry_after_ms / 1000


def in_progress_pause(options: GuardOptions, err: InProgressError, remaining: float) -> float:
    """The pause before asking again while another holder's attempt is in progress."""
    pause = options.poll_interval
    hint = retry_seconds(err)
    if hint is not None:
        pause = min(pause, hint)
    return max(0.01, min(pause, remaining))


def in_progress_beyond_wait(request: Request, err: InProgressError, max_wait: float) -> InProgressError:
    """The error when the live lease outlasts what is left of the wait: waiting would only end in
    the same error, so the guard says so at once, and why it may be the caller's own doing."""
    hint = retry_seconds(err)
    left = f"{hint:.0f} s" if hint is not None else "longer"
    return InProgressError(
        f"{request.action}: another attempt holds a live lease for {left} more, beyond what is "
        f"left of max_wait ({max_wait:g} s), so the guard did not wait. The live lease may be this "
        "caller's own earlier attempt (one that raised OutcomeUnknownError, timed out or crashed): "
        "reconcile it with the provider using its provider key, then settle it (err.complete(result) "
        "or err.release() on that OutcomeUnknownError; operators: `oncegate admin get` shows its "
        "token). Otherwise another worker is running it: retry later, or raise max_wait above the "
        "lease to wait for it.",
        reason=err.reason,
        code=err.code,
        metadata=err.metadata,
        retry_after_ms=err.retry_after_ms,
        field_violations=err.field_violations,
    )


def decode_replay(options: GuardOptions, request: Request, action: ActionRef, completion: Completion) -> Any:
    """The stored receipt of a replay, decoded by its format: an operator's JSON as the value, an
    operator's text as a ``str``, a worker's by the guard's decoder. A receipt that cannot be read
    is a :class:`~oncegate.errors.ReceiptDecodeError` naming the action and who wrote it (never
    the decoder's bare error, and never a reason to run the action again)."""
    receipt_format = completion.receipt_format
    try:
        if receipt_format is ReceiptFormat.JSON:
            return json.loads(completion.receipt)
        if receipt_format is ReceiptFormat.TEXT:
            return completion.receipt.decode("utf-8")
        return options.decode(completion.receipt)
    except Exception as err:
        raise ReceiptDecodeError(
            f"{request.action} (agent {action.scope.agent_id!r}, run {action.scope.run_id!r}, key "
            f"{action.key!r}) already completed, but its receipt ({len(completion.receipt)} bytes, "
            f"written by {receipt_writer(completion)}) cannot be decoded: {type(err).__name__}: {err}. "
            f"The action was not run again. {_decode_hint(completion)}",
            action=action,
            completion=completion,
        ) from err


def receipt_writer(completion: Completion) -> str:
    """Who wrote a receipt and in what, as a person reads it: ``operator 'ops-alice' as text``, or
    ``a worker (fencing 17...) in its client's own encoding``."""
    if completion.source == CompletionSource.OPERATOR:
        what = {ReceiptFormat.JSON: "as JSON", ReceiptFormat.TEXT: "as text"}.get(
            completion.receipt_format, "with no format stated"
        )
        return f"operator {completion.operator!r} {what}"
    return f"a worker (fencing {completion.fencing}) in its client's own encoding"


def _decode_hint(completion: Completion) -> str:
    if completion.receipt_format is not ReceiptFormat.UNSPECIFIED:
        return (
            "The gate checks an operator's receipt against its format when it is recorded, so the "
            "stored receipt is not what was recorded: report it (err.receipt holds it)."
        )
    if completion.source == CompletionSource.OPERATOR:
        return "Pass a decode= that reads it (err.receipt holds it)."
    return (
        "This guard's decoder (JSON unless decode= says otherwise) cannot read what the worker's "
        "client wrote: it was probably completed with raw bytes (gate.complete(action, token, "
        "b'...')) rather than through the guard or err.complete(result), or by a client with another "
        "encoder. Pass a decode= that reads it (err.receipt holds it)."
    )


def is_definite(exc: Exception, definite: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` from the guarded body means the action had no effect (release the token)."""
    if isinstance(exc, DefiniteFailureError):
        return True
    if isinstance(exc, OutcomeUnknownError):
        # An unknown outcome (from a guard nested in the function) only became an OncegateError
        # when the exceptions got one root: `definite=(OncegateError,)` must not release after it.
        definite = tuple(cls for cls in definite if cls is not OncegateError)
    return isinstance(exc, definite)


def settlement(exc: BaseException | None, definite: tuple[type[BaseException], ...]) -> Settlement:
    """How a granted block that ended unsettled is settled: ``no_result`` (it ended without
    completing), ``interrupted`` (``KeyboardInterrupt``, ``asyncio.CancelledError``: propagate,
    keep the token), ``release`` (a definite failure) or ``unknown`` (anything else)."""
    if exc is None:
        return "no_result"
    if not isinstance(exc, Exception):
        return "interrupted"
    return "release" if is_definite(exc, definite) else "unknown"


def pending_approval(request: Request, answer: RequestTokenResult) -> PendingApprovalError:
    """The error a held action raises: nothing ran, an operator must approve it first."""
    assert answer.approval is not None
    approval = answer.approval
    return PendingApprovalError(
        f"{request.action} waits for an operator's approval {approval.id} ({approval.reason}); "
        "ask again with the same request once it is approved",
        action=answer.action,
        approval=approval,
    )


def reconcile_hint(grant: Grant) -> str:
    return (
        f"Reconcile with the provider using provider key {grant.provider_key!r}, then complete or "
        f"release token {grant.token!r} (fencing {grant.fencing})."
    )


def no_result(request: Request, action: ActionRef, grant: Grant) -> OutcomeUnknownError:
    return OutcomeUnknownError(
        f"{request.action} ({action.key}): the guarded block ended without complete() "
        f"or skip(), so the gate cannot know whether the action ran. {reconcile_hint(grant)}",
        action=action,
        grant=grant,
    )


def unknown_outcome(
    request: Request, action: ActionRef, grant: Grant, exc: BaseException
) -> OutcomeUnknownError:
    return OutcomeUnknownError(
        f"{request.action} ({action.key}): the outcome is unknown after "
        f"{type(exc).__name__}: {exc}. {reconcile_hint(grant)}",
        action=action,
        grant=grant,
    )


def encode_failed(
    request: Request, action: ActionRef, grant: Grant, result: Any, err: Exception
) -> CompleteUnacknowledgedError:
    return CompleteUnacknowledgedError(
        f"{request.action} ({action.key}) ran, but its result could not be encoded as a receipt: {err}",
        action=action,
        grant=grant,
        result=result,
        receipt=None,
    )


def not_acknowledged(
    request: Request, action: ActionRef, grant: Grant, result: Any, receipt: bytes, err: OncegateError
) -> CompleteUnacknowledgedError:
    return CompleteUnacknowledgedError(
        f"{request.action} ({action.key}) ran, but the gate did not "
        f"acknowledge its completion: {err}. Retry gate.complete() with this "
        "exception's action, token and receipt.",
        action=action,
        grant=grant,
        result=result,
        receipt=receipt,
    )


def log_interrupted(request: Request, action: ActionRef, grant: Grant, exc: BaseException) -> None:
    logger.warning(
        "oncegate: %s (%s) interrupted by %s; the token stays unreleased. %s",
        request.action,
        action.key,
        type(exc).__name__,
        reconcile_hint(grant),
    )


def log_release_failed(action: ActionRef, err: OncegateError) -> None:
    logger.warning(
        "oncegate: could not release %s after a definite failure (%s); it will need "
        "reconciling once its lease ends",
        action.key,
        err,
    )
