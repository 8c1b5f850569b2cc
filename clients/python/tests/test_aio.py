"""The asyncio client (``oncegate.aio``): the same guard semantics as the threaded one, on an event
loop, against the in-memory fake gate and against the real gate binary.

Each test runs its scenario with ``asyncio.run``: a ``grpc.aio`` channel belongs to one loop, so a
client is created inside the scenario.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from oncegate import (
    ActionState,
    CompleteUnacknowledgedError,
    Decision,
    DefiniteFailureError,
    Grant,
    InProgressError,
    KeyReusedError,
    LeaseExpiredUnresolvedError,
    OutcomeUnknownError,
    TransportError,
    fingerprint,
)
from oncegate.aio import Gate

from conftest import TRANSFER_KEY_FIELDS
from fake_gate import FakeGate

TRANSFER = {"amount": 5000, "currency": "EUR", "to": "DE89370400440532013000", "memo": "Invoice 42"}


def scope_kwargs(run_id: str) -> dict[str, Any]:
    return {"agent_id": "billing-agent", "run_id": run_id}


# -- against the fake gate: the protocol's branches -------------------------------------------


def test_runs_once_then_replays_and_awaits_coroutines(fake_target: str, fake: FakeGate, run_id: str) -> None:
    grants: list[Grant] = []

    async def pay(grant: Grant) -> dict[str, Any]:
        grants.append(grant)
        await asyncio.sleep(0)
        return {"transfer_id": "tr-1"}

    async def scenario() -> tuple[Any, Any, Any]:
        async with Gate(fake_target, api_key="k") as gate:
            first = await gate.run("pay", {"a": 1}, pay, **scope_kwargs(run_id))
            again = await gate.run("pay", {"a": 1}, pay, **scope_kwargs(run_id))
            plain = await gate.run("pay", {"b": 2}, lambda grant: "not a coroutine", **scope_kwargs(run_id))
            return first, again, plain

    first, again, plain = asyncio.run(scenario())
    assert first == again == {"transfer_id": "tr-1"} and plain == "not a coroutine"
    assert len(grants) == 1 and fake.calls["Complete"] == 2
    assert fake.metadata[0]["authorization"] == "Bearer k"


def test_definite_failure_releases(fake_target: str, fake: FakeGate, run_id: str) -> None:
    async def scenario() -> list[int]:
        fencings: list[int] = []

        async def declined(grant: Grant) -> None:
            fencings.append(grant.fencing)
            raise DefiniteFailureError("card declined")

        async with Gate(fake_target) as gate:
            with pytest.raises(DefiniteFailureError):
                await gate.run("pay", {"a": 1}, declined, **scope_kwargs(run_id))
            await gate.run(
                "pay", {"a": 1}, lambda grant: fencings.append(grant.fencing), **scope_kwargs(run_id)
            )
        return fencings

    assert asyncio.run(scenario()) == [1, 2]
    assert fake.calls["Release"] == 1


def test_unknown_outcome_keeps_the_token(fake_target: str, fake: FakeGate, run_id: str) -> None:
    async def scenario() -> tuple[OutcomeUnknownError, ActionState]:
        async with Gate(fake_target) as gate:

            async def times_out(grant: Grant) -> None:
                raise TimeoutError("the bank did not answer")

            with pytest.raises(OutcomeUnknownError) as raised:
                await gate.run("pay", {"a": 1}, times_out, **scope_kwargs(run_id))
            return raised.value, (await gate.get_action(raised.value.action)).state

    unknown, state = asyncio.run(scenario())
    assert isinstance(unknown.__cause__, TimeoutError) and unknown.fencing == 1
    assert state is ActionState.AUTHORIZED and fake.calls["Release"] == 0


def test_a_cancelled_body_keeps_the_token(fake_target: str, fake: FakeGate, run_id: str) -> None:
    async def scenario() -> ActionState:
        async with Gate(fake_target) as gate:

            async def hangs(grant: Grant) -> None:
                await asyncio.sleep(30)

            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(gate.run("pay", {"a": 1}, hangs, **scope_kwargs(run_id)), 0.3)
            ref_state = next(iter(fake.records.values())).state
            return ActionState(ref_state)

    assert asyncio.run(scenario()) is ActionState.AUTHORIZED
    assert fake.calls["Release"] == 0 and fake.calls["Complete"] == 0


def test_a_second_task_waits_on_the_same_loop_then_replays(fake_target: str, run_id: str) -> None:
    async def scenario() -> tuple[Any, Any, int]:
        runs = 0

        async def slow(grant: Grant) -> str:
            nonlocal runs
            runs += 1
            await asyncio.sleep(0.5)
            return "first"

        async with Gate(fake_target) as gate:
            # Its lease (2 s) ends within the second task's max_wait (10 s): the second waits.
            first = asyncio.create_task(gate.run("pay", {"a": 1}, slow, lease_ttl=2, **scope_kwargs(run_id)))
            await asyncio.sleep(0.1)
            second = await gate.run(
                "pay", {"a": 1}, slow, max_wait=10, poll_interval=0.05, **scope_kwargs(run_id)
            )
            return await first, second, runs

    assert asyncio.run(scenario()) == ("first", "first", 1)


def test_in_progress_is_bounded_by_max_wait(fake_target: str, run_id: str) -> None:
    async def scenario() -> None:
        async with Gate(fake_target) as gate:
            await gate.request_token("pay", {"a": 1}, holder="someone-else", **scope_kwargs(run_id))
            with pytest.raises(InProgressError):
                await gate.run(
                    "pay",
                    {"a": 1},
                    lambda grant: "x",
                    max_wait=0.2,
                    poll_interval=0.05,
                    **scope_kwargs(run_id),
                )

    asyncio.run(scenario())


def test_complete_is_retried_then_reported_unacknowledged(
    fake_target: str, fake: FakeGate, run_id: str
) -> None:
    async def scenario() -> CompleteUnacknowledgedError:
        async with Gate(fake_target) as gate:
            fake.fail_next["Complete"] = 2
            assert await gate.run("pay", {"a": 1}, lambda grant: 1, **scope_kwargs(run_id)) == 1
            fake.fail_next["Complete"] = 1000
            with pytest.raises(CompleteUnacknowledgedError) as raised:
                await gate.run(
                    "pay", {"b": 2}, lambda grant: {"ok": True}, retry_timeout=0.3, **scope_kwargs(run_id)
                )
            return raised.value

    unacknowledged = asyncio.run(scenario())
    assert unacknowledged.result == {"ok": True} and unacknowledged.receipt == b'{"ok":true}'
    assert fake.calls["Release"] == 0


def test_store_unavailable_and_a_lost_grant_reply_are_retried(
    fake_target: str, fake: FakeGate, run_id: str
) -> None:
    fake.fail_next["RequestToken"] = 1
    fake.lose_reply["RequestToken"] = 1
    grants: list[Grant] = []

    async def scenario() -> None:
        async with Gate(fake_target) as gate:
            await gate.run("pay", {"a": 1}, grants.append, **scope_kwargs(run_id))

    asyncio.run(scenario())
    assert len(grants) == 1 and grants[0].fencing == 1 and fake.calls["RequestToken"] == 3


def test_heartbeat_task_extends_the_lease(fake_target: str, fake: FakeGate, run_id: str) -> None:
    async def scenario() -> list[ActionState]:
        seen: list[ActionState] = []
        async with Gate(fake_target) as gate:
            attempt = gate.attempt("pay", {"a": 1}, lease_ttl=0.6, **scope_kwargs(run_id))

            async def long_work(grant: Grant) -> str:
                await asyncio.sleep(1.5)
                assert attempt.action is not None
                seen.append((await gate.get_action(attempt.action)).state)
                return "done"

            assert await attempt.run(long_work) == "done"
        return seen

    assert asyncio.run(scenario()) == [ActionState.AUTHORIZED]
    assert fake.calls["ExtendLease"] >= 2


def test_attempt_block_skip_complete_replay(fake_target: str, fake: FakeGate, run_id: str) -> None:
    async def scenario() -> None:
        async with Gate(fake_target) as gate:
            async with gate.attempt("pay", {"a": 1}, **scope_kwargs(run_id)) as attempt:
                assert not attempt.replayed and attempt.grant is not None
                await attempt.skip()
            with pytest.raises(OutcomeUnknownError, match="without complete"):
                async with gate.attempt("pay", {"b": 1}, **scope_kwargs(run_id)):
                    pass
            async with gate.attempt("pay", {"a": 1}, **scope_kwargs(run_id)) as attempt:
                await attempt.complete(["receipt"])
            async with gate.attempt("pay", {"a": 1}, **scope_kwargs(run_id)) as replay:
                assert replay.replayed and replay.result == ["receipt"] and replay.grant is None

    asyncio.run(scenario())
    assert fake.calls["Release"] == 1


def test_decorator_with_the_ambient_scope(fake_target: str, fake: FakeGate, run_id: str) -> None:
    provider_keys: list[str] = []

    async def scenario() -> tuple[Any, Any]:
        async with Gate(fake_target) as gate:

            @gate.action("payments.transfer", key_fields_hint=TRANSFER_KEY_FIELDS)
            async def transfer(
                amount: int, currency: str, to: str, memo: str = "", *, grant: Grant
            ) -> dict[str, Any]:
                provider_keys.append(grant.provider_key)
                return {"transfer_id": f"tr-{len(provider_keys)}", "amount": amount}

            assert "grant" not in inspect.signature(transfer).parameters
            assert inspect.iscoroutinefunction(transfer)
            with gate.scope(agent_id="billing-agent", run_id=run_id):
                first = await transfer(5000, "EUR", "DE89", memo="Invoice 42", idempotency_key="invoice-42")
                retry = await transfer(5000, "EUR", "DE89", memo="rewritten", idempotency_key="invoice-42")
                with pytest.raises(KeyReusedError):
                    await transfer(5001, "EUR", "DE89", idempotency_key="invoice-42")
            return first, retry

    first, retry = asyncio.run(scenario())
    assert first == retry == {"transfer_id": "tr-1", "amount": 5000} and len(provider_keys) == 1


def test_one_client_per_loop_and_reopened_after_its_loop_ended(fake_target: str, run_id: str) -> None:
    gate = Gate(fake_target)
    first = asyncio.run(gate.run("pay", {"a": 1}, lambda grant: "once", **scope_kwargs(run_id)))
    # The first loop has ended: the client opens a new channel in the next one.
    second = asyncio.run(gate.run("pay", {"a": 1}, lambda grant: "twice", **scope_kwargs(run_id)))
    asyncio.run(gate.close())
    assert first == second == "once"


def test_unreachable_gate_is_a_transport_error() -> None:
    async def scenario() -> TransportError:
        async with Gate("127.0.0.1:1", timeout=2.0) as gate:
            with pytest.raises(TransportError) as raised:
                await gate.request_token("pay", {"a": 1}, agent_id="a", run_id="r")
            return raised.value

    assert asyncio.run(scenario()).retryable


# -- against the real gate --------------------------------------------------------------------


def test_real_gate_rpcs_and_refusals(gate_target: str, run_id: str) -> None:
    async def scenario() -> None:
        async with Gate(gate_target) as gate:
            first = await gate.request_token(
                "payments.transfer", TRANSFER, idempotency_key="inv-1", **scope_kwargs(run_id)
            )
            assert (
                first.decision is Decision.GRANTED and first.grant is not None and first.action.key == "inv-1"
            )
            assert first.fingerprint == fingerprint(
                "payments.transfer", TRANSFER, key_fields=TRANSFER_KEY_FIELDS
            )
            expiry = await gate.extend_lease(first.action, first.grant.token, 60)
            assert expiry > first.grant.lease_expires_at - __import__("datetime").timedelta(seconds=300)
            completion = await gate.complete(first.action, first.grant.token, b"paid")
            replay = await gate.request_token(
                "payments.transfer",
                {**TRANSFER, "memo": "x"},
                idempotency_key="inv-1",
                **scope_kwargs(run_id),
            )
            assert replay.decision is Decision.ALREADY_COMPLETED and replay.completion == completion
            with pytest.raises(KeyReusedError) as reused:
                await gate.request_token(
                    "payments.transfer",
                    {**TRANSFER, "amount": 1},
                    idempotency_key="inv-1",
                    **scope_kwargs(run_id),
                )
            assert reused.value.differing_fields == ("/amount",)
            assert (await gate.get_action(first.action)).state is ActionState.COMPLETED

    asyncio.run(scenario())


def test_real_gate_guard_end_to_end(gate_target: str, run_id: str) -> None:
    async def scenario() -> None:
        runs: list[int] = []

        async def pay(grant: Grant) -> str:
            runs.append(grant.fencing)
            await asyncio.sleep(0.3)
            return f"tr-{grant.fencing}"

        async with Gate(gate_target) as gate:
            concurrent = await asyncio.gather(
                gate.run("pay", {"n": 1}, pay, lease_ttl=5, poll_interval=0.05, **scope_kwargs(run_id)),
                gate.run("pay", {"n": 1}, pay, lease_ttl=5, poll_interval=0.05, **scope_kwargs(run_id)),
            )
            # Fencing numbers come from the store clock: compare with the one granted.
            assert len(runs) == 1 and concurrent == [f"tr-{runs[0]}"] * 2

            async def declined(grant: Grant) -> None:
                raise DefiniteFailureError("no funds")

            with pytest.raises(DefiniteFailureError):
                await gate.run("pay", {"n": 2}, declined, **scope_kwargs(run_id))
            again = await gate.run("pay", {"n": 2}, pay, **scope_kwargs(run_id))
            assert again == f"tr-{runs[-1]}" and len(runs) == 2

            async def times_out(grant: Grant) -> None:
                raise TimeoutError

            with pytest.raises(OutcomeUnknownError) as unknown:
                await gate.run(
                    "pay", {"n": 3}, times_out, lease_ttl=1.0, heartbeat=False, **scope_kwargs(run_id)
                )
            await asyncio.sleep(1.3)
            with pytest.raises(LeaseExpiredUnresolvedError) as expired:
                await gate.run("pay", {"n": 3}, pay, **scope_kwargs(run_id))
            assert expired.value.token == unknown.value.token

    asyncio.run(scenario())


def test_real_gate_heartbeat_keeps_a_long_action_authorized(gate_target: str, run_id: str) -> None:
    async def scenario() -> list[ActionState]:
        states: list[ActionState] = []
        async with Gate(gate_target) as gate:
            attempt = gate.attempt("pay", {"long": True}, lease_ttl=1.5, **scope_kwargs(run_id))

            async def long_work(grant: Grant) -> str:
                await asyncio.sleep(2.5)
                assert attempt.action is not None
                states.append((await gate.get_action(attempt.action)).state)
                return "done"

            assert await attempt.run(long_work) == "done"
        return states

    assert asyncio.run(scenario()) == [ActionState.AUTHORIZED]
