"""The threaded guard's native loop (oncegate.guard.runner, native/src/guard.rs and heartbeat.rs):
the common case made natively, and every other case handed to the Python ``Attempt`` exactly
where it stopped. The rest of the suite (test_guard.py's ``gate.run`` and decorator tests) runs
through it too; here are the cases that only it has, and the checks that it is the one running.
Under ONCEGATE_PURE_PYTHON=1 there is no native loop: the tests that need one are skipped."""

from __future__ import annotations

import collections
import decimal
import enum
import functools
import logging
import multiprocessing
import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from oncegate import (
    ActionState,
    CompletedByOtherError,
    CompletionUnrecorded,
    Gate,
    Grant,
    InProgressError,
    OutcomeUnknown,
    _native,  # type: ignore[attr-defined]
    native,
)
from oncegate.guard import protocol
from oncegate.guard import runner as runner_module
from oncegate.guard.attempt import Attempt
from oncegate.models import json_encode

from fake_gate import FakeGate

pytestmark = pytest.mark.skipif(not native.enabled(), reason="the native loop needs the native core")


def scope_kwargs(run_id: str) -> dict[str, Any]:
    return {"agent_id": "billing-agent", "run_id": run_id}


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[Attempt]:
    """Every Attempt the runner makes (it makes one only to hand a call over)."""
    made: list[Attempt] = []

    class Counted(Attempt):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(runner_module, "Attempt", Counted)
    return made


def test_a_granted_call_is_made_natively_and_its_grant_is_the_models(
    fake_gate: Gate, fake: FakeGate, run_id: str, attempts: list[Attempt]
) -> None:
    grants: list[Grant] = []
    redelivered: list[Grant | None] = []

    @fake_gate.action("pay", holder="worker-1")
    def pay(to: str, amount: int, grant: Grant) -> dict[str, Any]:
        grants.append(grant)
        # The same holder asking again gets its grant back, made by the Python models.
        again = fake_gate.request_token(
            "pay", {"to": to, "amount": amount}, holder="worker-1", **scope_kwargs(run_id)
        )
        redelivered.append(again.grant)
        return {"paid": amount, "to": to}

    assert pay("alice", 5, **scope_kwargs(run_id)) == {"paid": 5, "to": "alice"}
    assert attempts == [], "the common case made an Attempt: it did not run on the native loop"
    assert fake.calls["RequestToken"] == 2 and fake.calls["Complete"] == 1
    (grant,) = grants
    assert type(grant) is Grant and grant.provider_key and grant.token
    assert redelivered == [grant]
    assert isinstance(grant.lease_expires_at, datetime) and grant.lease_expires_at.tzinfo is timezone.utc
    answer = fake_gate.request_token("pay", {"to": "alice", "amount": 5}, **scope_kwargs(run_id))
    assert answer.completion is not None and answer.completion.receipt == b'{"paid":5,"to":"alice"}'
    # A replay is not the common case: handed over, answered from the stored receipt, not run.
    assert pay("alice", 5, **scope_kwargs(run_id)) == {"paid": 5, "to": "alice"}
    assert len(grants) == 1 and len(attempts) == 1 and attempts[0].replayed


def test_gate_run_and_a_function_without_grant_or_plain_signature(
    fake_gate: Gate, fake: FakeGate, run_id: str, attempts: list[Attempt]
) -> None:
    seen: list[Any] = []
    assert fake_gate.run("pay", {"a": 1}, lambda grant: seen.append(grant) or 7, **scope_kwargs(run_id)) == 7
    assert type(seen[0]) is Grant

    @fake_gate.action("note")
    def note(text: str) -> str:  # no grant
        return text.upper()

    @fake_gate.action("tagged")
    def tagged(text: str, /, **tags: str) -> dict[str, Any]:  # not plain: called through BoundCall.invoke
        return {"text": text, **tags}

    assert note("hi", **scope_kwargs(run_id)) == "HI"
    assert tagged("x", colour="red", **scope_kwargs(run_id)) == {"text": "x", "colour": "red"}
    assert attempts == []
    assert fake.calls["Complete"] == 3


def test_the_function_raising_is_settled_by_the_attempt(
    fake_gate: Gate, fake: FakeGate, run_id: str, attempts: list[Attempt]
) -> None:
    @fake_gate.action("pay", definite=(ValueError,))
    def pay(amount: int) -> None:
        if amount < 0:
            raise ValueError("declined")
        raise TimeoutError("the provider did not answer")

    with pytest.raises(ValueError, match="declined") as declined:
        pay(-1, **scope_kwargs(run_id))
    assert declined.value.__traceback__ is not None
    assert fake.calls["Release"] == 1  # definite: released
    with pytest.raises(OutcomeUnknown) as unknown:
        pay(1, **scope_kwargs(run_id))
    assert isinstance(unknown.value.__cause__, TimeoutError)
    assert fake.calls["Release"] == 1  # unknown: kept
    record = fake_gate.get_action(unknown.value.action)
    assert record.state is ActionState.AUTHORIZED and record.holder == attempts[-1].holder
    assert len(attempts) == 2


def test_an_interrupt_propagates_and_keeps_the_token(
    fake_gate: Gate, fake: FakeGate, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    def interrupted(grant: Grant) -> None:
        raise KeyboardInterrupt

    with caplog.at_level(logging.WARNING, logger="oncegate"), pytest.raises(KeyboardInterrupt):
        fake_gate.run("pay", {"a": 1}, interrupted, **scope_kwargs(run_id))
    assert fake.calls["Release"] == 0
    assert "interrupted by KeyboardInterrupt; the token stays unreleased" in caplog.text


def test_a_result_that_cannot_be_encoded_is_unrecorded_and_keeps_the_token(
    fake_gate: Gate, fake: FakeGate, run_id: str
) -> None:
    encoded: list[Any] = []

    def encode(result: Any) -> bytes:
        encoded.append(result)
        raise TypeError("not a receipt")

    with pytest.raises(CompletionUnrecorded) as raised:
        fake_gate.run("pay", {"a": 1}, lambda grant: {"ok": 1}, encode=encode, **scope_kwargs(run_id))
    assert raised.value.result == {"ok": 1} and raised.value.receipt is None
    assert isinstance(raised.value.__cause__, TypeError)
    assert encoded == [{"ok": 1}], "the encoder ran more than once"
    assert fake.calls["Complete"] == 0 and fake.calls["Release"] == 0


def test_a_failed_complete_is_retried_from_the_native_calls_error(
    fake_gate: Gate, fake: FakeGate, run_id: str, attempts: list[Attempt]
) -> None:
    fake.fail_next["Complete"] = 1
    assert fake_gate.run("pay", {"a": 1}, lambda grant: "done", **scope_kwargs(run_id)) == "done"
    assert fake.calls["Complete"] == 2  # the native one, and the attempt's retry: not a third
    assert len(attempts) == 1 and attempts[0].completion is not None


def test_a_refused_complete_is_raised_as_the_gate_said(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    def work(grant: Grant) -> str:
        # Meanwhile the token is given back and another holder completes the action: the
        # Complete that follows is refused (completed by another token), and not retried.
        answer = fake_gate.request_token("pay", {"a": 2}, holder="worker-1", **scope_kwargs(run_id))
        fake_gate.release(answer.action, grant.token)
        other = fake_gate.request_token("pay", {"a": 2}, holder="worker-2", **scope_kwargs(run_id))
        assert other.grant is not None
        fake_gate.complete(other.action, other.grant.token, b'"theirs"')
        return "ran"

    with pytest.raises(CompletedByOtherError) as raised:
        fake_gate.run("pay", {"a": 2}, work, holder="worker-1", **scope_kwargs(run_id))
    assert not raised.value.retryable
    assert fake.calls["Complete"] == 2  # theirs, and ours once


def test_the_native_heartbeat_extends_the_lease_and_stops_with_the_call(
    fake_gate: Gate, fake: FakeGate, run_id: str, attempts: list[Attempt]
) -> None:
    def long_work(grant: Grant) -> str:
        time.sleep(1.5)
        # Two and a half leases later the lease still holds: another holder is refused.
        with pytest.raises(InProgressError):
            fake_gate.request_token("pay", {"a": 1}, holder="someone else", **scope_kwargs(run_id))
        return "done"

    assert fake_gate.run("pay", {"a": 1}, long_work, lease_ttl=0.6, **scope_kwargs(run_id)) == "done"
    assert attempts == []
    extended = fake.calls["ExtendLease"]
    assert extended >= 2, "the lease was not extended while the function ran"
    time.sleep(0.8)
    assert fake.calls["ExtendLease"] == extended, "the heartbeat outlived the call"


def test_a_failed_extension_is_retried_as_the_python_heartbeat_does(
    fake_gate: Gate, fake: FakeGate, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail_next["ExtendLease"] = 1

    def long_work(grant: Grant) -> str:
        time.sleep(1.2)
        return "done"

    with caplog.at_level(logging.INFO, logger="oncegate"):
        assert fake_gate.run("pay", {"a": 1}, long_work, lease_ttl=0.6, **scope_kwargs(run_id)) == "done"
    assert "extending the lease of" in caplog.text and "failed, will retry" in caplog.text
    assert fake.calls["ExtendLease"] >= 2
    assert (
        fake_gate.get_action(fake_gate.request_token("pay", {"a": 1}, **scope_kwargs(run_id)).action).state
        is ActionState.COMPLETED
    )


def test_threads_share_the_native_loop(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    @fake_gate.action("pay")
    def pay(n: int, grant: Grant) -> int:
        return n * 2

    results: list[int] = []
    lock = threading.Lock()

    def worker(start: int) -> None:
        for n in range(start, start + 25):
            value = pay(n, **scope_kwargs(run_id))
            with lock:
                results.append(value)

    threads = [threading.Thread(target=worker, args=(i * 100,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(2 * n for i in range(4) for n in range(i * 100, i * 100 + 25))
    assert fake.calls["Complete"] == 100


class Colour(enum.IntEnum):
    RED = 1


class Text(str):
    pass


RECEIPTS: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**63 - 1,
    -(2**63),
    0.1,
    -0.0,
    1e16,
    1.5e-7,
    123456789.125,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "plain",
    'quote " backslash \\ slash /',
    "\n\r\t\b\f\x00\x1f\x7f",
    "ünïcödé ✓ 𝄞 \u2028",
    [],
    (),
    {},
    [1, [2, [3, {"a": None}]]],
    (1, "two", 3.0),
    {"b": 1, "a": 2, "A": 3, "é": 4, "aa": 5, "": 6},
    {"ok": True, "receipt": {"id": "pay_1", "amount": 5000, "tags": ["x", "y"]}},
]
"""Values the native encoder writes itself: each must come out as json_encode's bytes."""

DEFERRED: list[Any] = [
    2**64,
    Colour.RED,
    Text("sub"),
    {1: "int key"},
    {"nested": {2: "x"}},
    "\ud800",
    decimal.Decimal("1.5"),
    collections.OrderedDict(a=1),
    {"set": {1}},
    functools.reduce(lambda inner, _: [inner], range(70), []),
]
"""Values it leaves to the Python encoder (which writes them, or refuses them as before)."""


@pytest.mark.parametrize("value", RECEIPTS, ids=repr)
def test_the_native_receipt_encoder_writes_what_json_encode_writes(value: Any) -> None:
    assert _native.receipt_json(value) == json_encode(value)


@pytest.mark.parametrize("value", DEFERRED, ids=lambda v: type(v).__name__)
def test_the_native_receipt_encoder_defers_what_it_does_not_know(value: Any) -> None:
    assert _native.receipt_json(value) is None


def test_a_deferred_receipt_is_encoded_or_refused_by_the_python_encoder(
    fake_gate: Gate, fake: FakeGate, run_id: str
) -> None:
    assert fake_gate.run("pay", {"a": 1}, lambda grant: {"colour": Colour.RED}, **scope_kwargs(run_id)) == {
        "colour": Colour.RED
    }
    answer = fake_gate.request_token("pay", {"a": 1}, **scope_kwargs(run_id))
    assert answer.completion is not None and answer.completion.receipt == b'{"colour":1}'
    with pytest.raises(CompletionUnrecorded) as raised:
        fake_gate.run("pay", {"a": 2}, lambda grant: {"when": decimal.Decimal("1")}, **scope_kwargs(run_id))
    assert isinstance(raised.value.__cause__, TypeError)


def _guarded_in_child(target: str, run_id: str, out: Any) -> None:
    try:
        gate = Gate(target, api_key="test-key")

        @gate.action("runner.fork", lease_ttl=1.0)
        def slow(n: int, grant: Grant) -> str:
            time.sleep(2.5)  # two and a half leases: only the child's heartbeat keeps it
            try:
                gate.request_token("runner.fork", {"n": n}, holder="another", agent_id="a", run_id=run_id)
            except InProgressError:
                return f"held {grant.fencing}"
            return "lost the lease"

        out.put([slow(n, agent_id="a", run_id=run_id) for n in range(2)] + [protocol.default_holder()])
    except BaseException as err:  # reported to the parent, which fails
        out.put(repr(err))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_a_forked_child_has_its_own_heartbeat_and_holder_names(gate_target: str, run_id: str) -> None:
    gate = Gate(gate_target, api_key="test-key")
    # The parent's scheduler thread and holder prefix exist before the fork; the child's must be
    # its own (the parent's thread does not exist in the child).
    assert (
        gate.run("runner.fork", {"n": -1}, lambda grant: "ok", lease_ttl=1.0, agent_id="a", run_id=run_id)
        == "ok"
    )
    parent_holder = protocol.default_holder()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_guarded_in_child, args=(gate_target, run_id, out))
    child.start()
    try:
        held = out.get(timeout=60)
    finally:
        child.join(timeout=30)
        gate.close()
    assert [answer.split()[0] for answer in held[:2]] == ["held", "held"], held
    assert held[2].split(":")[:3] != parent_holder.split(":")[:3]
    assert held[2].split(":")[2] == str(child.pid)
