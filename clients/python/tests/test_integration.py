"""The client and the guard against the real gate binary (see ``conftest.gate_target``).

The gate runs with the ``payments.transfer`` policy (key fields ``/amount``, ``/currency``,
``/to``); every other action has no policy, so all its params are key fields.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

import pytest

from oncegate import (
    ActionState,
    AlreadyCompleted,
    Decision,
    DefiniteFailure,
    Gate,
    Grant,
    InProgress,
    InvalidRequest,
    KeyReused,
    LeaseExpiredUnresolved,
    OutcomeUnknown,
    TokenMismatch,
    TokenUnknown,
    fingerprint,
)
from oncegate.models import ActionRef, Scope

from conftest import TRANSFER_KEY_FIELDS, VECTORS

TRANSFER = {"amount": 5000, "currency": "EUR", "to": "DE89370400440532013000", "memo": "Invoice 42"}
VECTOR_CASES = [
    case
    for case in json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]
    if case["key_fields"] is None
    or (case["action"] == "payments.transfer" and sorted(case["key_fields"]) == sorted(TRANSFER_KEY_FIELDS))
]


def scope_kwargs(run_id: str) -> dict[str, Any]:
    return {"agent_id": "billing-agent", "run_id": run_id}


@pytest.mark.parametrize("case", VECTOR_CASES, ids=[case["name"] for case in VECTOR_CASES])
def test_gate_agrees_with_the_vectors(gate: Gate, run_id: str, case: dict[str, Any]) -> None:
    ask = lambda: gate.request_token(  # noqa: E731
        case["action"], case["params_json"], intent_id=case["intent"], **scope_kwargs(run_id)
    )
    if "error" in case:
        with pytest.raises(InvalidRequest):
            ask()
    else:
        assert ask().fingerprint == case["fingerprint"]


def test_grant_complete_replay(gate: Gate, run_id: str) -> None:
    first = gate.request_token("payments.transfer", TRANSFER, **scope_kwargs(run_id))
    assert first.decision is Decision.GRANTED and first.grant is not None and not first.redelivered
    # The first grant's fencing number is the store clock in microseconds (it never goes backwards).
    assert (
        first.grant.fencing > 10**15 and first.grant.provider_key and first.grant.lease_expires_at is not None
    )
    assert first.fingerprint == fingerprint("payments.transfer", TRANSFER, key_fields=TRANSFER_KEY_FIELDS)
    assert first.action.key == first.fingerprint
    completion = gate.complete(first.action, first.grant.token, b'{"transfer_id":"tr-1"}')
    assert completion.receipt == b'{"transfer_id":"tr-1"}' and completion.fencing == first.grant.fencing
    assert gate.complete(first.action, first.grant.token, b'{"transfer_id":"tr-1"}') == completion
    replay = gate.request_token("payments.transfer", TRANSFER, **scope_kwargs(run_id))
    assert replay.decision is Decision.ALREADY_COMPLETED and replay.grant is None
    assert replay.completion is not None and replay.completion.receipt == completion.receipt
    assert replay.completion.token == first.grant.token
    record = gate.get_action(first.action)
    assert record.state is ActionState.COMPLETED and record.fingerprint == first.fingerprint


def test_memo_rewrite_replays_and_amount_change_is_key_reused(gate: Gate, run_id: str) -> None:
    first = gate.request_token(
        "payments.transfer", TRANSFER, idempotency_key="invoice-42", **scope_kwargs(run_id)
    )
    assert first.grant is not None and first.action.key == "invoice-42"
    gate.complete(first.action, first.grant.token, b"paid")
    rewritten = gate.request_token(
        "payments.transfer",
        {**TRANSFER, "memo": "Invoice #42 (corrected)"},
        idempotency_key="invoice-42",
        **scope_kwargs(run_id),
    )
    assert rewritten.decision is Decision.ALREADY_COMPLETED
    with pytest.raises(KeyReused) as raised:
        gate.request_token(
            "payments.transfer",
            {**TRANSFER, "amount": 5100},
            idempotency_key="invoice-42",
            **scope_kwargs(run_id),
        )
    assert raised.value.differing_fields == ("/amount",)
    assert "5100" not in str(raised.value) and "5100" not in json.dumps(raised.value.metadata)


def test_in_progress_for_a_second_caller(gate: Gate, run_id: str) -> None:
    first = gate.request_token("pay", {"a": 1}, holder="worker-a", **scope_kwargs(run_id))
    assert first.grant is not None
    with pytest.raises(InProgress) as raised:
        gate.request_token("pay", {"a": 1}, holder="worker-b", **scope_kwargs(run_id))
    assert raised.value.retry_after_ms is not None and 0 < raised.value.retry_after_ms <= 300_000
    again = gate.request_token("pay", {"a": 1}, holder="worker-a", **scope_kwargs(run_id))
    # The same token, fencing and lease end (CONTRACT §2); its statement is signed anew, and its
    # `iat` differs when the two calls straddle a second.
    assert again.redelivered and again.grant is not None and again.grant.statement
    assert dataclasses.replace(again.grant, statement="") == dataclasses.replace(first.grant, statement="")
    with pytest.raises(InProgress):
        gate.run("pay", {"a": 1}, lambda grant: "second", max_wait=0, **scope_kwargs(run_id))


def test_guard_waits_for_the_first_caller_and_replays(gate: Gate, run_id: str) -> None:
    started = threading.Event()

    def slow(grant: Grant) -> str:
        started.set()
        time.sleep(1.0)
        return "first"

    # Its lease (5 s) ends within the waiter's max_wait (20 s): the waiter waits for it.
    worker = threading.Thread(
        target=lambda: gate.run("pay", {"b": 2}, slow, lease_ttl=5, **scope_kwargs(run_id))
    )
    worker.start()
    assert started.wait(10)
    ran: list[Grant] = []
    result = gate.run("pay", {"b": 2}, ran.append, max_wait=20, poll_interval=0.1, **scope_kwargs(run_id))
    worker.join()
    assert result == "first" and not ran


def test_guard_releases_on_definite_failure(gate: Gate, run_id: str) -> None:
    grants: list[Grant] = []

    def pay(grant: Grant) -> str:
        grants.append(grant)
        return "paid"

    def declined(grant: Grant) -> None:
        grants.append(grant)
        raise DefiniteFailure("card declined")

    with pytest.raises(DefiniteFailure):
        gate.run("payments.transfer", TRANSFER, declined, **scope_kwargs(run_id))
    ref = ActionRef(
        Scope("billing-agent", run_id),
        fingerprint("payments.transfer", TRANSFER, key_fields=TRANSFER_KEY_FIELDS),
    )
    record = gate.get_action(ref)
    assert record.state is ActionState.ABSENT and record.fencing > 0
    assert (
        gate.run(
            "payments.transfer",
            TRANSFER,
            pay,
            **scope_kwargs(run_id),
        )
        == "paid"
    )
    assert grants[1].fencing == grants[0].fencing + 1 == record.fencing + 1
    assert grants[0].token != grants[1].token


def test_guard_never_releases_on_an_unknown_outcome(gate: Gate, run_id: str) -> None:
    def times_out(grant: Grant) -> None:
        raise TimeoutError("provider did not answer in 30 s")

    with pytest.raises(OutcomeUnknown) as raised:
        gate.run("payments.transfer", TRANSFER, times_out, **scope_kwargs(run_id))
    unknown = raised.value
    assert isinstance(unknown.__cause__, TimeoutError) and unknown.fencing > 0 and unknown.provider_key
    record = gate.get_action(unknown.action)
    assert record.state is ActionState.AUTHORIZED and record.fencing == unknown.fencing
    gate.complete(unknown.action, unknown.token, b'"reconciled"')
    assert (
        gate.run("payments.transfer", TRANSFER, lambda grant: "twice", **scope_kwargs(run_id)) == "reconciled"
    )


def test_decorator_with_contextvar_scope(gate: Gate, run_id: str) -> None:
    provider_keys: list[str] = []

    @gate.action("payments.transfer", key_fields_hint=TRANSFER_KEY_FIELDS)
    def transfer(amount: int, currency: str, to: str, memo: str = "", *, grant: Grant) -> dict[str, Any]:
        provider_keys.append(grant.provider_key)
        return {"transfer_id": f"tr-{len(provider_keys)}", "amount": amount}

    with gate.scope(agent_id="billing-agent", run_id=run_id):
        first = transfer(5000, "EUR", "DE89", memo="Invoice 42", idempotency_key="invoice-42")
        retry = transfer(
            amount=5000, currency="EUR", to="DE89", memo="rewritten", idempotency_key="invoice-42"
        )
        with pytest.raises(KeyReused):
            transfer(5001, "EUR", "DE89", idempotency_key="invoice-42")
    assert first == retry == {"transfer_id": "tr-1", "amount": 5000}
    assert len(provider_keys) == 1


def test_heartbeat_keeps_a_long_action_authorized(gate: Gate, run_id: str) -> None:
    states: list[ActionState] = []
    attempt = gate.attempt("pay", {"long": True}, lease_ttl=2.0, **scope_kwargs(run_id))

    def long_work(grant: Grant) -> str:
        time.sleep(3.0)
        assert attempt.action is not None
        states.append(gate.get_action(attempt.action).state)
        return "done"

    assert attempt.run(long_work) == "done"
    assert states == [ActionState.AUTHORIZED]


def test_expired_lease_is_left_for_reconciliation(gate: Gate, run_id: str) -> None:
    first = gate.request_token("pay", {"c": 3}, lease_ttl=1.0, **scope_kwargs(run_id))
    assert first.grant is not None
    time.sleep(1.5)
    assert gate.get_action(first.action).state is ActionState.EXPIRED
    with pytest.raises(LeaseExpiredUnresolved) as raised:
        gate.request_token("pay", {"c": 3}, **scope_kwargs(run_id))
    assert raised.value.token == first.grant.token and raised.value.fencing == first.grant.fencing
    late = gate.complete(first.action, first.grant.token, b"late but real")
    assert late.receipt == b"late but real"


def test_refusals(gate: Gate, run_id: str) -> None:
    with pytest.raises(InvalidRequest) as invalid:
        gate.request_token("pay", "[1]", **scope_kwargs(run_id))
    assert invalid.value.field_violations
    granted = gate.request_token("pay", {"d": 4}, **scope_kwargs(run_id))
    assert granted.grant is not None
    with pytest.raises(TokenMismatch):
        gate.complete(granted.action, "not-a-token", b"")
    with pytest.raises(TokenUnknown):
        gate.complete(ActionRef(Scope("billing-agent", run_id), "no-such-key"), granted.grant.token, b"")
    gate.complete(granted.action, granted.grant.token, b"done")
    with pytest.raises(AlreadyCompleted):
        gate.release(granted.action, granted.grant.token)
    with pytest.raises(AlreadyCompleted):
        gate.extend_lease(granted.action, granted.grant.token, 10)
