"""Authorization against the real gate binary (see ``conftest.gate_target``): a rule's denial, a
budget's refusal and a held action each reach the caller as their own exception, and a held action
is never run by the guard."""

from __future__ import annotations

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


def test_a_budget_refuses_and_says_when_it_frees(gate: Gate, run_id: str) -> None:
    agent = f"sms-{run_id}"
    first = gate.request_token("sms.send", {"to": "1"}, agent_id=agent, run_id=run_id)
    assert first.decision is Decision.GRANTED
    with pytest.raises(BudgetExceededError) as refused:
        gate.request_token("sms.send", {"to": "2"}, agent_id=agent, run_id=run_id)
    assert refused.value.budget == "sms-per-hour"
    assert refused.value.retry_after is not None and refused.value.retry_after > 3500


def test_a_held_action_is_not_a_grant(gate: Gate, run_id: str) -> None:
    answer = gate.request_token("files.delete", {"path": "/x"}, agent_id="billing-agent", run_id=run_id)
    assert answer.decision is Decision.PENDING_APPROVAL and answer.grant is None
    assert answer.approval is not None and answer.approval.reason == "deletes need approval"
    ran: list[Grant] = []
    with pytest.raises(PendingApprovalError) as held:
        gate.run("files.delete", {"path": "/x"}, ran.append, agent_id="billing-agent", run_id=run_id)
    assert held.value.approval_id == answer.approval.id
    assert not ran
