"""What a model may be told when the guard stops a tool call: the gate's answer in words, what
happened and what to do next, without the token, the provider key or any param value (a model's
context is no place for credentials).

The adapters hand it to their framework where the framework reports tool errors to the model
(the Agents SDK's ``failure_error_function``; LangGraph's ``ToolNode(handle_tool_errors=...)``).
Its parameter is annotated :class:`~oncegate.OncegateError`, so a framework that reads the
annotation to choose what it catches (LangGraph does) turns the gate's refusals into words and lets
every other exception propagate (to a node's ``RetryPolicy``, or to the developer). The words
follow the MCP gateway's answers, refusal by refusal.
"""

from __future__ import annotations

from datetime import datetime, timezone

from oncegate.errors import (
    BudgetExceededError,
    DefiniteFailureError,
    InProgressError,
    KeyReusedError,
    LeaseExpiredUnresolvedError,
    OncegateError,
    OutcomeUnknownError,
    PendingApprovalError,
    PolicyDeniedError,
    RateLimitedError,
    StoreUnavailableError,
    TransportError,
)

__all__ = ["model_message"]

NOT_AROUND = "Do not retry it under another idempotency key or with other arguments to get around this"


def model_message(error: OncegateError) -> str:
    """A tool result for the model that says why the gate stopped the call, and what to do now."""
    if isinstance(error, PendingApprovalError):
        reason = f" ({error.approval.reason})" if error.approval.reason else ""
        return (
            f"Not executed yet: this call is held for a person's approval{reason}; its approval id "
            f"is {error.approval_id}. Nothing ran. Wait for the decision, then call again with the "
            "same arguments: once approved it runs once; if declined, it will not run. "
            f"{NOT_AROUND}."
        )
    if isinstance(error, PolicyDeniedError):
        if error.approval_id:
            return (
                "Not executed. A person declined the approval this call needed (approval "
                f"{error.approval_id}); the tool did not run. Do not retry the same call: ask the "
                "user what they want instead."
            )
        rule = f'the rule "{error.policy_id}"' if error.policy_id else "no rule permits it"
        return (
            f"Not executed: the gate's rules forbid this call ({rule}); nothing ran. "
            f"{NOT_AROUND}; ask a person if it is needed."
        )
    if isinstance(error, BudgetExceededError):
        return _budget(error)
    if isinstance(error, KeyReusedError):
        fields = ", ".join(error.differing_fields) or "unknown"
        return (
            "Not executed. This idempotency key was already used for a call with different "
            f"arguments (differing fields: {fields}); that earlier call stands. Do not retry under "
            "a new idempotency key to get around this: if a second, different action is really "
            "wanted, confirm it with the user first."
        )
    if isinstance(error, OutcomeUnknownError):
        return (
            "The outcome of this call is unknown: the action may or may not have happened. Do not "
            "retry it, under this or any other idempotency key, until it has been reconciled with "
            "the provider; a retry before then is refused, and after it the retry returns the "
            "recorded result."
        )
    if isinstance(error, LeaseExpiredUnresolvedError):
        return (
            "Not executed. An earlier attempt of this call ended with an unknown outcome and has "
            "not been reconciled: it may have happened. Do not retry it, under this or any other "
            "idempotency key, until it has been reconciled with the provider."
        )
    if isinstance(error, InProgressError):
        return (
            "Not executed here: another attempt of the same call is still running. Wait for its "
            "result instead of calling it again; calling later with the same arguments returns it "
            "once it is recorded."
        )
    if isinstance(error, DefiniteFailureError):
        return f"The action failed and had no effect: {error}"
    if isinstance(error, RateLimitedError):
        return f"Not executed: too many calls right now; nothing ran. Call again {_after(error)}."
    if isinstance(error, (StoreUnavailableError, TransportError)):
        return (
            "Not executed: the gate that makes sure this action runs at most once is unavailable; "
            "nothing was done. Call again later with the same arguments."
        )
    return f"Not executed: the gate refused this call ({error.reason or type(error).__name__})."


def _budget(error: BudgetExceededError) -> str:
    what = (
        f'the budget "{error.budget}" would be exceeded ({error.used} of {error.limit} used, and '
        f"this call needs {error.requested})"
    )
    if error.retry_at is None:
        return (
            f"Not executed: {what}; this call alone is above the limit, so waiting will not help "
            f"and nothing ran. {NOT_AROUND}; ask a person."
        )
    return (
        f"Not executed: {what}; nothing ran. It frees up at {_iso(error.retry_at)} "
        f"({_after(error)}): do not call again before then. {NOT_AROUND}."
    )


def _after(error: OncegateError) -> str:
    """When to call again, exactly as the gate said it: in milliseconds, said in seconds."""
    if error.retry_after_ms is None:
        return "later"
    seconds, millis = divmod(error.retry_after_ms, 1000)
    return f"in {seconds}.{millis:03d} s" if millis else f"in {seconds} s"


def _iso(at: datetime) -> str:
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
