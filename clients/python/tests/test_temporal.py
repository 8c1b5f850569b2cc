"""The Temporal adapter against the real gate: Temporal's server-less ``ActivityEnvironment`` drives
attempts 1, 2, 3... of one activity through the worker interceptor, as Temporal's retries would.

A completed attempt is replayed; a worker killed mid-activity (a real process, SIGKILLed) leaves
the retry held until its lease ends, then unresolved until a resolver settles it, then replayed; a
heartbeating activity longer than its lease keeps it; changed input under one activity id is
refused non-retryably; an unknown outcome fails non-retryably naming the provider key. Results and
failures cross Temporal's default data converter.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import temporalio.api.failure.v1
from temporalio import activity
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from oncegate import Completed, Resolver, Unknown, Unresolved
from oncegate.aio import Gate
from oncegate.guard import GuardOptions
from oncegate.integrations.temporal import OncegateInterceptor, current_grant, side_effect
from oncegate.integrations.temporal.testing import run_activity
from oncegate.models import ActionRef, ActionState, Scope

from conftest import RealGate
from temporal_activities import Invoice, Receipt, bank_calls, pay

PATIENCE = 60.0
INVOICE = Invoice(4200, "EUR", "DE89")


def environment(workflow_id: str, attempt: int, **info: Any) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = replace(
        env.info,
        activity_id="pay-1",
        attempt=attempt,
        workflow_id=workflow_id,
        workflow_run_id="run-1",
        **info,
    )
    return env


async def failure_of(run: Any) -> ApplicationError:
    with pytest.raises(ApplicationError) as raised:
        await run
    return raised.value


def transfer_to(ledger: Path) -> Any:
    @activity.defn(name="transfer")
    @side_effect("payments.transfer")
    async def transfer(invoice: Invoice) -> Receipt:
        return pay(ledger, invoice)

    return transfer


def test_a_completed_attempt_is_replayed_without_running(gate_target: str, tmp_path: Path) -> None:
    ledger, workflow = tmp_path / "bank.jsonl", f"wf-{uuid.uuid4().hex[:12]}"
    transfer = transfer_to(ledger)

    async def scenario() -> list[Any]:
        async with Gate(gate_target) as gate:
            guard = OncegateInterceptor(gate)
            return [
                await run_activity(environment(workflow, n), [guard], transfer, INVOICE) for n in (1, 2, 3)
            ]

    results = asyncio.run(scenario())
    assert results == [Receipt("tr-1", 4200)] * 3
    assert all(type(r) is Receipt for r in results), "a replay is the activity's return type"
    assert len(bank_calls(ledger)) == 1


def test_changed_input_under_one_activity_id_is_refused_non_retryably(
    gate_target: str, tmp_path: Path
) -> None:
    ledger, workflow = tmp_path / "bank.jsonl", f"wf-{uuid.uuid4().hex[:12]}"
    transfer = transfer_to(ledger)

    async def scenario() -> ApplicationError:
        async with Gate(gate_target) as gate:
            guard = OncegateInterceptor(gate)
            await run_activity(environment(workflow, 1), [guard], transfer, INVOICE)
            changed = replace(INVOICE, amount=9900)
            return await failure_of(run_activity(environment(workflow, 2), [guard], transfer, changed))

    error = asyncio.run(scenario())
    assert error.type == "OncegateKeyReused" and error.non_retryable
    assert "/amount" in str(error) and error.details[0]["differing_fields"] == ["/amount"]
    assert error.details[0]["key"] == "pay-1" and error.details[0]["agent_id"] == error.details[0]["agent_id"]
    assert len(bank_calls(ledger)) == 1
    assert_crosses_the_converter(error)


def test_an_unknown_outcome_fails_non_retryably_naming_the_provider_key(gate_target: str) -> None:
    workflow = f"wf-{uuid.uuid4().hex[:12]}"
    provider_keys: list[str] = []

    @activity.defn(name="transfer")
    @side_effect("payments.transfer")
    async def transfer(invoice: Invoice) -> Receipt:
        provider_keys.append(current_grant().provider_key)
        raise TimeoutError("the bank did not answer")

    async def scenario() -> tuple[ApplicationError, ApplicationError]:
        async with Gate(gate_target) as gate:
            guard = OncegateInterceptor(gate)
            first = await failure_of(run_activity(environment(workflow, 1), [guard], transfer, INVOICE))
            other = replace(INVOICE, to="DE00")
            retrying = OncegateInterceptor(gate, retry_unknown=True)
            second = await failure_of(
                run_activity(environment(f"{workflow}-b", 1), [retrying], transfer, other)
            )
            return first, second

    first, second = asyncio.run(scenario())
    assert first.type == "OncegateOutcomeUnknown" and first.non_retryable
    assert provider_keys[0] in str(first) and first.details[0]["provider_key"] == provider_keys[0]
    assert "token" not in first.details[0]
    assert isinstance(first.__cause__, Exception) and "TimeoutError" in str(first.__cause__)
    assert second.type == "OncegateOutcomeUnknown" and not second.non_retryable
    assert second.next_retry_delay is not None and second.next_retry_delay > timedelta(0)
    assert_crosses_the_converter(first)


def test_a_killed_worker_holds_the_retry_until_its_lease_ends_then_a_resolver_settles_it(
    gate_target: str, real_gate: RealGate, tmp_path: Path
) -> None:
    ledger, workflow = tmp_path / "bank.jsonl", f"wf-{uuid.uuid4().hex[:12]}"
    worker = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "temporal_activities.py"),
            gate_target,
            str(ledger),
            workflow,
            "run-1",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        },
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "called the bank"
    finally:
        os.kill(worker.pid, signal.SIGKILL)  # mid-activity: the bank was called, the gate never heard
        worker.wait()
    [call] = bank_calls(ledger)

    resolver = Resolver(f"unix:{real_gate.data_dir / 'admin.sock'}", agent_id=workflow)

    @resolver.lookup("payments.transfer")
    def ask_the_bank(unresolved: Unresolved) -> Any:
        paid = [c for c in bank_calls(ledger) if c["provider_key"] == unresolved.provider_key]
        return (
            Completed({"transfer_id": paid[0]["transfer_id"], "amount": paid[0]["amount"]})
            if paid
            else Unknown()
        )

    transfer = transfer_to(ledger)
    seen: list[ApplicationError] = []
    resolving = threading.Thread(target=resolver.run, daemon=True)

    async def retries() -> Any:
        async with Gate(gate_target) as gate:
            guard = OncegateInterceptor(gate, wait_delay=timedelta(milliseconds=200))
            deadline = time.monotonic() + PATIENCE
            for attempt in range(2, 1000):
                assert time.monotonic() < deadline, [e.type for e in seen]
                try:
                    return await run_activity(environment(workflow, attempt), [guard], transfer, INVOICE)
                except ApplicationError as failed:
                    seen.append(failed)
                error = seen[-1]
                if error.type == "OncegateUnresolved" and not resolving.is_alive():
                    resolving.start()
                # What Temporal does with a retryable failure: wait its delay, then the next attempt.
                assert not error.non_retryable and error.next_retry_delay is not None
                await asyncio.sleep(error.next_retry_delay.total_seconds())
            return None

    try:
        result = asyncio.run(retries())
    finally:
        resolver.stop()
    kinds = [e.type for e in seen]
    held = kinds.index("OncegateUnresolved")
    assert held >= 1 and set(kinds[:held]) == {"OncegateInProgress"}, kinds
    assert set(kinds[held:]) == {"OncegateUnresolved"}, kinds
    assert seen[0].next_retry_delay <= timedelta(seconds=2), "held for what is left of the lease"
    assert seen[held].details[0]["provider_key"] == call["provider_key"]
    assert result == Receipt("tr-1", 4200) and type(result) is Receipt, "replayed from the resolver's receipt"
    assert len(bank_calls(ledger)) == 1
    assert_crosses_the_converter(seen[0])


@pytest.mark.parametrize("heartbeats", [True, False])
def test_a_heartbeating_activity_keeps_its_lease_past_its_length(gate_target: str, heartbeats: bool) -> None:
    workflow = f"wf-{uuid.uuid4().hex[:12]}"
    lease = 1.0
    states: list[ActionState] = []

    async def scenario() -> Any:
        async with Gate(gate_target) as gate:

            @activity.defn(name="transfer")
            @side_effect("payments.transfer")
            async def transfer(invoice: Invoice) -> Receipt:
                started = time.monotonic()
                while time.monotonic() - started < 3.5 * lease:  # three and a half leases
                    if heartbeats:
                        activity.heartbeat()
                    await asyncio.sleep(lease / 10)
                ref = ActionRef(Scope(workflow, "run-1"), "pay-1")
                states.append((await gate.get_action(ref)).state)
                return Receipt("tr-1", invoice.amount)

            env = environment(workflow, 1, heartbeat_timeout=timedelta(seconds=lease))
            return await run_activity(env, [OncegateInterceptor(gate)], transfer, INVOICE)

    assert asyncio.run(scenario()) == Receipt("tr-1", 4200)
    assert states == [ActionState.AUTHORIZED if heartbeats else ActionState.EXPIRED]


def test_only_marked_or_named_activities_are_guarded(gate_target: str, tmp_path: Path) -> None:
    ledger, workflow = tmp_path / "bank.jsonl", f"wf-{uuid.uuid4().hex[:12]}"

    @activity.defn(name="notify")
    async def notify(invoice: Invoice) -> Receipt:
        return pay(ledger, invoice) if _has_grant() else Receipt("unguarded", invoice.amount)

    async def scenario() -> list[Any]:
        async with Gate(gate_target) as gate:
            plain = OncegateInterceptor(gate)
            named = OncegateInterceptor(gate, activities={"notify": "payments.transfer"})
            return [
                await run_activity(
                    environment(workflow, 1, activity_type="notify"), [plain], notify, INVOICE
                ),
                await run_activity(
                    environment(workflow, 1, activity_type="notify"), [named], notify, INVOICE
                ),
                await run_activity(
                    environment(workflow, 2, activity_type="notify"), [named], notify, INVOICE
                ),
            ]

    assert asyncio.run(scenario()) == [
        Receipt("unguarded", 4200),
        Receipt("tr-1", 4200),
        Receipt("tr-1", 4200),
    ]
    assert len(bank_calls(ledger)) == 1


def _has_grant() -> bool:
    try:
        current_grant()
    except RuntimeError:
        return False
    return True


def test_results_cross_the_default_data_converter(gate_target: str, tmp_path: Path) -> None:
    ledger, workflow = tmp_path / "bank.jsonl", f"wf-{uuid.uuid4().hex[:12]}"
    transfer = transfer_to(ledger)

    async def scenario() -> list[Any]:
        async with Gate(gate_target) as gate:
            guard = OncegateInterceptor(gate, options=GuardOptions(max_wait=0))
            executed = await run_activity(environment(workflow, 1), [guard], transfer, INVOICE)
            replayed = await run_activity(environment(workflow, 2), [guard], transfer, INVOICE)
            converter = DataConverter.default
            out = []
            for result in (executed, replayed):
                payloads = await converter.encode([result])
                out.append((await converter.decode(payloads, [Receipt]))[0])
            assert payloads == await converter.encode([executed]), "a replay encodes as the execution did"
            return out

    assert asyncio.run(scenario()) == [Receipt("tr-1", 4200)] * 2


def assert_crosses_the_converter(error: ApplicationError) -> None:
    """The workflow's view of ``error``: encoded by the worker's default converter and decoded."""

    async def round_trip() -> BaseException:
        converter = DataConverter.default
        failure = temporalio.api.failure.v1.Failure()
        await converter.encode_failure(error, failure)
        return await converter.decode_failure(failure)

    decoded = asyncio.run(round_trip())
    assert isinstance(decoded, ApplicationError)
    assert decoded.type == error.type and decoded.non_retryable == error.non_retryable
    assert decoded.next_retry_delay == error.next_retry_delay
    assert list(decoded.details) == list(error.details) and decoded.message == error.message
