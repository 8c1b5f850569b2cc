"""Settling an unknown outcome from Python, against the real gate: the errors that carry an
unsettled grant name what settling it needs (action, token, fencing, provider key, since when) and
settle it themselves with the guard's own encoder; a receipt the guard cannot decode is an oncegate
error that says what happened; a live lease beyond ``max_wait`` fails at once; enums print their
names."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

import oncegate.aio
from oncegate import (
    ActionState,
    Decision,
    Gate,
    Grant,
    InProgressError,
    LeaseExpiredUnresolvedError,
    OncegateError,
    OutcomeUnknownError,
    ReceiptDecodeError,
    ReleaseReason,
)


def scope_kwargs(run_id: str) -> dict[str, Any]:
    return {"agent_id": "settle-agent", "run_id": run_id}


def times_out(grant: Grant) -> None:
    raise TimeoutError("the provider did not answer")


def test_an_unknown_outcome_completed_by_hand_is_replayed_decoded(gate: Gate, run_id: str) -> None:
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", {"n": 1}, times_out, **scope_kwargs(run_id))
    err = unknown.value
    # The provider says it happened: record its result through the error, as the guard would have.
    completion = err.complete({"transfer_id": "tr-9"})
    assert completion.receipt == b'{"transfer_id":"tr-9"}' and completion.fencing == err.fencing
    ran: list[Grant] = []
    assert gate.run("pay", {"n": 1}, ran.append, **scope_kwargs(run_id)) == {"transfer_id": "tr-9"}
    assert not ran


def test_an_unknown_outcome_released_by_hand_runs_again(gate: Gate, run_id: str) -> None:
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", {"n": 2}, times_out, **scope_kwargs(run_id))
    assert unknown.value.release() == unknown.value.fencing
    assert (
        gate.run("pay", {"n": 2}, lambda grant: grant.fencing, **scope_kwargs(run_id)) > unknown.value.fencing
    )


def test_the_guards_own_encoder_is_used(gate: Gate, run_id: str) -> None:
    options: dict[str, Any] = {"encode": lambda r: f"text:{r}".encode(), "decode": lambda b: b.decode()}
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", {"n": 3}, times_out, **options, **scope_kwargs(run_id))
    assert unknown.value.complete("ok").receipt == b"text:ok"
    assert gate.run("pay", {"n": 3}, times_out, **options, **scope_kwargs(run_id)) == "text:ok"


def test_an_expired_lease_names_what_settling_it_needs_and_settles_it(gate: Gate, run_id: str) -> None:
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", {"n": 4}, times_out, lease_ttl=1.0, heartbeat=False, **scope_kwargs(run_id))
    time.sleep(1.3)
    with pytest.raises(LeaseExpiredUnresolvedError) as expired:
        gate.run("pay", {"n": 4}, times_out, **scope_kwargs(run_id))
    err = expired.value
    assert err.action == unknown.value.action
    assert (err.token, err.fencing, err.provider_key) == (
        unknown.value.token,
        unknown.value.fencing,
        unknown.value.provider_key,
    )
    assert err.lease_expired_at is not None and err.provider_key.startswith("og-")
    assert err.provider_key in str(err)
    err.complete({"transfer_id": "tr-4"})
    assert gate.run("pay", {"n": 4}, times_out, **scope_kwargs(run_id)) == {"transfer_id": "tr-4"}


def test_a_raw_request_tokens_expired_lease_settles_through_the_client(gate: Gate, run_id: str) -> None:
    granted = gate.request_token("pay", {"n": 5}, lease_ttl=1.0, **scope_kwargs(run_id))
    assert granted.grant is not None
    time.sleep(1.3)
    with pytest.raises(LeaseExpiredUnresolvedError) as expired:
        gate.request_token("pay", {"n": 5}, **scope_kwargs(run_id))
    assert expired.value.action == granted.action
    assert expired.value.provider_key == granted.grant.provider_key
    assert expired.value.release(ReleaseReason.NOT_ATTEMPTED) == granted.grant.fencing
    assert gate.request_token("pay", {"n": 5}, **scope_kwargs(run_id)).decision is Decision.GRANTED


def test_get_action_carries_the_provider_key_and_hides_the_token_from_agents(gate: Gate, run_id: str) -> None:
    granted = gate.request_token("pay", {"n": 6}, **scope_kwargs(run_id))
    assert granted.grant is not None
    record = gate.get_action(granted.action)
    assert record.state is ActionState.AUTHORIZED
    assert record.provider_key == granted.grant.provider_key
    assert record.token == "", "an agent never sees a live token it was not handed"


def test_a_receipt_stored_as_raw_bytes_is_a_clear_error_not_a_json_error(gate: Gate, run_id: str) -> None:
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", {"n": 7}, times_out, **scope_kwargs(run_id))
    # The trap: completing by hand with raw bytes rather than err.complete(result).
    gate.complete(unknown.value.action, unknown.value.token, b"msg-42")
    ran: list[Grant] = []
    with pytest.raises(ReceiptDecodeError) as raised:
        gate.run("pay", {"n": 7}, ran.append, **scope_kwargs(run_id))
    err = raised.value
    assert isinstance(err, OncegateError) and not isinstance(err, json.JSONDecodeError)
    assert isinstance(err.__cause__, json.JSONDecodeError)
    assert err.receipt == b"msg-42" and err.action == unknown.value.action and not ran
    assert "cannot be decoded" in str(err) and "raw bytes" in str(err)


def test_waiting_on_our_own_unknown_attempt_fails_at_once(gate: Gate, run_id: str) -> None:
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", {"n": 8}, times_out, **scope_kwargs(run_id))
    # The gate's RetryInfo says the lease has ~300 s left, beyond max_wait (30 s): no waiting.
    with pytest.raises(InProgressError) as raised:
        gate.run("pay", {"n": 8}, times_out, **scope_kwargs(run_id))
    assert raised.value.retry_after_ms is not None and raised.value.retry_after_ms > 30_000
    assert "may be this caller's own earlier attempt" in str(raised.value)
    unknown.value.release()


def test_asyncio_errors_settle_when_awaited(gate_target: str, run_id: str) -> None:
    async def scenario() -> Any:
        async with oncegate.aio.Gate(gate_target) as gate:

            async def fails(grant: Grant) -> None:
                raise TimeoutError

            with pytest.raises(OutcomeUnknownError) as unknown:
                await gate.run("pay", {"n": 9}, fails, **scope_kwargs(run_id))
            await unknown.value.complete({"transfer_id": "tr-a"})
            return await gate.run("pay", {"n": 9}, fails, **scope_kwargs(run_id))

    assert asyncio.run(scenario()) == {"transfer_id": "tr-a"}


def test_enums_print_their_names() -> None:
    assert str(Decision.ALREADY_COMPLETED) == "ALREADY_COMPLETED"
    assert f"{ActionState.EXPIRED}" == "EXPIRED" and f"{Decision.GRANTED:>8}" == " GRANTED"
    assert Decision.GRANTED == 1 and repr(Decision.GRANTED) == "<Decision.GRANTED: 1>"
