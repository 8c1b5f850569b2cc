"""Receipts an operator writes are receipts: against the real gate, an action left unresolved and
settled by its local operator (``oncegate admin resolve`` over the admin socket) replays, in the
threaded and the asyncio guard, as the text or the JSON value the operator said it is; a receipt
this client cannot decode is a :class:`ReceiptDecodeError` naming the action and who wrote it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

import oncegate.aio
from oncegate import (
    ActionRef,
    ActionState,
    Completion,
    CompletionSource,
    Decision,
    Gate,
    Grant,
    OncegateError,
    OutcomeUnknownError,
    ReceiptDecodeError,
    ReceiptFormat,
    Scope,
)
from oncegate.guard import protocol
from oncegate.guard.options import GuardOptions, Request

from conftest import RealGate

AGENT = "reconciled-agent"


def times_out(grant: Grant) -> None:
    raise TimeoutError("the provider did not answer")


def left_unresolved(gate: Gate, run_id: str, params: dict[str, Any]) -> ActionRef:
    """An attempt whose outcome is unknown and whose lease has ended: an operator's to settle."""
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", params, times_out, agent_id=AGENT, run_id=run_id, lease_ttl=1.0, heartbeat=False)
    action = unknown.value.action
    assert action is not None
    deadline = time.monotonic() + 30
    while gate.get_action(action).state is not ActionState.EXPIRED:
        assert time.monotonic() < deadline, "the lease did not end"
        time.sleep(0.1)
    return action


def resolve(real_gate: RealGate, action: ActionRef, receipt: str, *options: str) -> str:
    """The operator found the action happened: ``oncegate admin resolve --outcome completed``."""
    scope = action.scope
    return real_gate.admin(
        "resolve",
        *("--agent", scope.agent_id, "--run", scope.run_id, "--key", action.key),
        *("--outcome", "completed", "--receipt", receipt, *options),
    )


def test_an_operators_text_receipt_replays_as_text(gate: Gate, real_gate: RealGate, run_id: str) -> None:
    action = left_unresolved(gate, run_id, {"n": 1})
    # Text that would parse as JSON: the operator's word, not the bytes, says what it is.
    shown = resolve(real_gate, action, "12345", "--receipt-format", "text")
    assert "receipt_format  text" in shown, shown
    ran: list[Grant] = []
    replay = gate.run("pay", {"n": 1}, ran.append, agent_id=AGENT, run_id=run_id)
    assert replay == "12345" and isinstance(replay, str) and not ran
    # A decode= for the workers' receipts does not apply to an operator's text.
    assert gate.run("pay", {"n": 1}, ran.append, decode=bytes.upper, agent_id=AGENT, run_id=run_id) == "12345"
    answer = gate.request_token("pay", {"n": 1}, agent_id=AGENT, run_id=run_id)
    assert answer.decision is Decision.ALREADY_COMPLETED and answer.completion is not None
    done = answer.completion
    assert done.receipt_format is ReceiptFormat.TEXT and done.source is CompletionSource.OPERATOR
    assert done.operator == "local-operator"


def test_an_operators_json_receipt_replays_as_the_value(gate: Gate, real_gate: RealGate, run_id: str) -> None:
    action = left_unresolved(gate, run_id, {"n": 2})
    # No --receipt-format: the CLI says JSON because it parses as JSON.
    shown = resolve(real_gate, action, '{"transfer_id": "tr-op-2", "amount": 50}')
    assert "receipt_format  json" in shown, shown
    ran: list[Grant] = []
    replay = gate.run("pay", {"n": 2}, ran.append, agent_id=AGENT, run_id=run_id)
    assert replay == {"transfer_id": "tr-op-2", "amount": 50} and not ran
    record = gate.get_action(action)
    assert record.completion is not None and record.completion.receipt_format is ReceiptFormat.JSON


def test_a_receipt_this_client_cannot_decode_names_the_action_and_its_writer(gate: Gate, run_id: str) -> None:
    with pytest.raises(OutcomeUnknownError) as unknown:
        gate.run("pay", {"n": 3}, times_out, agent_id=AGENT, run_id=run_id)
    action = unknown.value.action
    assert action is not None
    # A worker completes by hand with raw bytes, which the guard's JSON decoder rejects.
    gate.complete(action, unknown.value.token, b"\xffraw-42")
    ran: list[Grant] = []
    with pytest.raises(ReceiptDecodeError) as raised:
        gate.run("pay", {"n": 3}, ran.append, agent_id=AGENT, run_id=run_id)
    err = raised.value
    assert isinstance(err, OncegateError) and not ran
    assert isinstance(err.__cause__, (json.JSONDecodeError, UnicodeDecodeError))
    assert (err.writer, err.operator, err.receipt_format) == ("worker", "", ReceiptFormat.UNSPECIFIED)
    assert err.action == action and err.receipt == b"\xffraw-42"
    message = str(err)
    for part in (f"agent {AGENT!r}", f"run {run_id!r}", f"key {action.key!r}", "written by a worker"):
        assert part in message, message
    assert "raw bytes" in message and "not run again" in message


def test_asyncio_replays_operator_receipts_by_their_format(
    gate: Gate, real_gate: RealGate, gate_target: str, run_id: str
) -> None:
    text = left_unresolved(gate, run_id, {"n": 4})
    resolve(real_gate, text, "wire 88213 confirmed by phone")
    value = left_unresolved(gate, run_id, {"n": 5})
    resolve(real_gate, value, "[1, 2, 3]", "--receipt-format", "json")

    async def fails(grant: Grant) -> None:
        raise AssertionError("a settled action must not run")

    async def scenario() -> tuple[Any, Any, ReceiptDecodeError]:
        async with oncegate.aio.Gate(gate_target) as aio:
            first = await aio.run("pay", {"n": 4}, fails, agent_id=AGENT, run_id=run_id)
            second = await aio.run("pay", {"n": 5}, fails, agent_id=AGENT, run_id=run_id)
            # A worker's receipt is the worker decoder's to read; one it rejects is the error.
            with pytest.raises(ReceiptDecodeError) as raised:
                await aio.run(
                    "pay", {"n": 3, "raw": True}, fails, decode=_reject, agent_id=AGENT, run_id=run_id
                )
            return first, second, raised.value

    granted = gate.request_token("pay", {"n": 3, "raw": True}, agent_id=AGENT, run_id=run_id)
    assert granted.grant is not None
    gate.complete(granted.action, granted.grant.token, b"not for this decoder")
    first, second, err = asyncio.run(scenario())
    assert first == "wire 88213 confirmed by phone" and second == [1, 2, 3]
    assert err.writer == "worker" and f"run {run_id!r}" in str(err) and "ValueError" in str(err)


def test_the_decode_error_names_the_operator_when_an_operator_wrote_it(run_id: str) -> None:
    """An operator's receipt recorded before operators said its format (UNSPECIFIED) is read by
    the guard's decoder; when that fails, the error names the operator, not a worker."""
    action = ActionRef(Scope(AGENT, run_id), "invoice-7")
    old = Completion(b"tx 7", None, 3, "", CompletionSource.OPERATOR, operator="ops-alice")
    with pytest.raises(ReceiptDecodeError) as raised:
        protocol.decode_replay(GuardOptions(), Request("pay", {}, action.scope), action, old)
    assert raised.value.writer == "operator" and raised.value.operator == "ops-alice"
    assert "written by operator 'ops-alice' with no format stated" in str(raised.value)


def _reject(receipt: bytes) -> Any:
    raise ValueError(f"not a receipt this agent wrote: {receipt!r}")
