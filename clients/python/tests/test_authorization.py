"""Authorization against the real gate binary (see ``conftest.gate_target``): a rule's denial, a
budget's refusal and a held action each reach the caller as their own exception, and a held action
is never run by the guard."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from oncegate import (
    BudgetExceededError,
    Decision,
    Gate,
    Grant,
    PendingApprovalError,
    PolicyDeniedError,
)


def test_a_rule_denies_by_agent(gate: Gate, run_id: str) -> None:
    with pytest.raises(PolicyDeniedError) as denied:
        gate.request_token("pay", {"a": 1}, agent_id="mallory", run_id=run_id)
    assert denied.value.policy_id == "no-mallory"
    assert not denied.value.retryable


def test_a_budget_refuses_and_says_used_limit_and_when_it_frees(gate: Gate, run_id: str) -> None:
    agent = f"sms-{run_id}"
    first = gate.request_token("sms.send", {"to": "1"}, agent_id=agent, run_id=run_id)
    assert first.decision is Decision.GRANTED
    with pytest.raises(BudgetExceededError) as refused:
        gate.request_token("sms.send", {"to": "2"}, agent_id=agent, run_id=run_id)
    err = refused.value
    assert err.budget == "sms-per-hour" and not err.retryable
    # A velocity cap counts grants: the amounts are grants, in the budget's units.
    assert (err.used, err.limit, err.requested) == ("1", "1", "1")
    assert err.retry_after_ms is not None and err.retry_after_ms > 3_500_000
    assert err.retry_at is not None and err.retry_at > datetime.now(timezone.utc)
    # It reads as the gate words it: used and limit, when (UTC) and in how long it frees up.
    at = err.retry_at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{err.retry_at.microsecond // 1000:03d}Z"
    assert str(err).startswith(
        'BUDGET_EXCEEDED: budget "sms-per-hour" would be exceeded: 1 of 1 used in the last 1 h, and '
        f"this action needs 1; nothing was recorded; it frees up at {at} (in "
    ), str(err)


def test_a_held_action_is_not_a_grant(gate: Gate, run_id: str) -> None:
    answer = gate.request_token("files.delete", {"path": "/x"}, agent_id="billing-agent", run_id=run_id)
    assert answer.decision is Decision.PENDING_APPROVAL and answer.grant is None
    assert answer.approval is not None and answer.approval.reason == "deletes need approval"
    ran: list[Grant] = []
    with pytest.raises(PendingApprovalError) as held:
        gate.run("files.delete", {"path": "/x"}, ran.append, agent_id="billing-agent", run_id=run_id)
    assert held.value.approval_id == answer.approval.id
    assert not ran
