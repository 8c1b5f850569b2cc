"""What a model may be told when the guard stops a tool call: the gate's answer in words, without
the token, the provider key or any param value (a model's context is no place for credentials).

The adapters hand it to their framework where the framework reports tool errors to the model
(the Agents SDK's ``failure_error_function``; LangGraph's ``ToolNode(handle_tool_errors=...)``).
"""

from __future__ import annotations

from oncegate.errors import (
    DefiniteFailureError,
    InProgressError,
    KeyReusedError,
    LeaseExpiredUnresolvedError,
    OncegateError,
    OutcomeUnknownError,
)

__all__ = ["model_message"]


def model_message(error: BaseException) -> str:
    """A tool result for the model that says why the gate stopped the call, and what not to do."""
    if isinstance(error, OutcomeUnknownError):
        return (
            "The outcome of this call is unknown: the action may have happened. It is left for "
            "reconciliation and will not run again until then; do not call it with other arguments."
        )
    if isinstance(error, LeaseExpiredUnresolvedError):
        return "An earlier attempt of this call ended without a known outcome; it needs reconciling first."
    if isinstance(error, KeyReusedError):
        fields = ", ".join(error.differing_fields) or "arguments"
        return (
            f"This idempotency key was already used for a request whose {fields} differ. Stop and ask "
            "a person; never use a new key to force the call through."
        )
    if isinstance(error, InProgressError):
        return (
            "The same call is still in progress elsewhere; wait for its result instead of calling it again."
        )
    if isinstance(error, DefiniteFailureError):
        return f"The action failed and had no effect: {error}"
    if isinstance(error, OncegateError):
        return f"The gate refused this call ({error.reason or type(error).__name__})."
    return f"The tool failed: {type(error).__name__}."
