"""What a Temporal workflow sees when the gate stops an activity: the gate's refusal or an unknown
outcome as an ``ApplicationError`` whose type, retryability and ``next_retry_delay`` say what to do,
and whose one detail (a dict of strings and numbers, which every payload converter carries) names
the action: agent, run, key, and the provider key where the outcome is unknown, never the token.

It decides nothing about the protocol; :mod:`oncegate.integrations.temporal` calls it on the
guard's errors.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from temporalio.exceptions import ApplicationError

from oncegate.errors import (
    InProgressError,
    KeyReusedError,
    LeaseExpiredUnresolvedError,
    OncegateError,
    OutcomeUnknownError,
    PendingApprovalError,
)
from oncegate.guard.options import Request

__all__ = ["application_error"]


def application_error(
    err: OncegateError, request: Request, retry_unknown: bool, wait_delay: timedelta
) -> ApplicationError:
    """The ``ApplicationError`` a workflow sees for a refusal or an unknown outcome."""
    scope, key = request.scope, request.idempotency_key
    where = f"{request.action} (agent {scope.agent_id!r}, run {scope.run_id!r}, key {key!r})"
    detail: dict[str, Any] = {
        "reason": err.reason,
        "action": request.action,
        "agent_id": request.scope.agent_id,
        "run_id": request.scope.run_id,
        "key": request.idempotency_key,
    }
    if isinstance(err, KeyReusedError):
        fields = list(err.differing_fields)
        detail["differing_fields"] = fields
        return ApplicationError(
            f"{where}: this activity id was already used with other input ({', '.join(fields) or 'params'} "
            "differ); a retry cannot change an activity's input: fix the workflow, never mint a new key",
            detail,
            type="OncegateKeyReused",
            non_retryable=True,
        )
    if isinstance(err, InProgressError):
        delay = None if err.retry_after_ms is None else timedelta(milliseconds=err.retry_after_ms)
        detail["retry_after_ms"] = err.retry_after_ms
        return ApplicationError(
            f"{where}: another attempt holds the lease; retry after {err.retry_after_ms} ms",
            detail,
            type="OncegateInProgress",
            next_retry_delay=delay,
        )
    if isinstance(err, OutcomeUnknownError):
        detail["provider_key"] = err.provider_key
        detail["fencing"] = err.fencing
        remaining = None
        if retry_unknown and err.grant.lease_expires_at is not None:
            remaining = max(timedelta(0), err.grant.lease_expires_at - datetime.now(timezone.utc))
        return ApplicationError(
            f"{where}: the outcome is unknown (the action may have happened); reconcile with the provider "
            f"using provider key {err.provider_key}, then run this activity again under the same activity id",
            detail,
            type="OncegateOutcomeUnknown",
            non_retryable=not retry_unknown,
            next_retry_delay=remaining,
        )
    if isinstance(err, LeaseExpiredUnresolvedError):
        detail["provider_key"] = err.provider_key
        detail["fencing"] = err.fencing
        return ApplicationError(
            f"{where}: an earlier attempt's lease ended with no outcome; a resolver or an operator "
            f"settles it with the provider (provider key {err.provider_key}), and a later attempt replays it",
            detail,
            type="OncegateUnresolved",
            next_retry_delay=wait_delay,
        )
    if isinstance(err, PendingApprovalError):
        detail["approval_id"] = err.approval_id
        return ApplicationError(
            f"{where}: waits for an operator's approval {err.approval_id}",
            detail,
            type="OncegatePendingApproval",
            next_retry_delay=wait_delay,
        )
    delay = None if err.retry_after_ms is None else timedelta(milliseconds=err.retry_after_ms)
    return ApplicationError(
        f"{where}: {err}",
        detail,
        type="Oncegate" + type(err).__name__.removesuffix("Error"),
        non_retryable=not err.retryable,
        next_retry_delay=delay,
    )
