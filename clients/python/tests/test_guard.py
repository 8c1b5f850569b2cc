"""The client and the guard's protocol, against the in-memory fake gate."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any

import pytest

from oncegate import (
    ActionRef,
    ActionState,
    CompletionUnrecorded,
    Decision,
    DefiniteFailure,
    Gate,
    Grant,
    GuardOptions,
    InProgress,
    InProgressError,
    InvalidRequest,
    InvalidRequestError,
    KeyReused,
    OncegateError,
    OutcomeUnknown,
    OutcomeUnknownError,
    ReleaseReason,
    Scope,
    TokenMismatch,
    fingerprint,
)

from fake_gate import FakeGate

TRANSFER = {"amount": 5000, "currency": "EUR", "to": "DE89370400440532013000", "memo": "Invoice 42"}


class Declined(Exception):
    """A provider's definite refusal."""


def scope_kwargs(run_id: str) -> dict[str, Any]:
    return {"agent_id": "billing-agent", "run_id": run_id}


def test_raw_rpcs_grant_complete_replay(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    first = fake_gate.request_token("payments.transfer", TRANSFER, **scope_kwargs(run_id))
    assert first.decision is Decision.GRANTED and first.grant is not None
    assert first.fingerprint == fingerprint(
        "payments.transfer", TRANSFER, key_fields=["/amount", "/currency", "/to"]
    )
    completion = fake_gate.complete(first.action, first.grant.token, b'{"id":"tr-1"}')
    assert completion.receipt == b'{"id":"tr-1"}' and completion.fencing == 1
    replay = fake_gate.request_token("payments.transfer", TRANSFER, **scope_kwargs(run_id))
    assert replay.decision is Decision.ALREADY_COMPLETED and replay.grant is None
    assert replay.completion is not None and replay.completion.receipt == b'{"id":"tr-1"}'
    record = fake_gate.get_action(first.action)
    assert record.state is ActionState.COMPLETED and record.completion == completion
    assert fake.metadata[0]["authorization"] == "Bearer test-key"


def test_errors_carry_their_details(fake_gate: Gate, run_id: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        fake_gate.request_token("pay", '{"a":1,"a":2}', **scope_kwargs(run_id))
    assert raised.value.field == "params_json"
    assert raised.value.field_violations[0].field == "params_json"
    granted = fake_gate.request_token("pay", {"a": 1}, **scope_kwargs(run_id))
    with pytest.raises(TokenMismatch) as mismatch:
        fake_gate.complete(granted.action, "not-a-token", b"")
    assert mismatch.value.reason == "TOKEN_MISMATCH" and not mismatch.value.retryable


def test_run_executes_once_and_replays(fake_gate: Gate, run_id: str) -> None:
    calls: list[Grant] = []

    def pay(grant: Grant) -> dict[str, Any]:
        calls.append(grant)
        return {"transfer_id": "tr-1", "provider_key": grant.provider_key}

    first = fake_gate.run("payments.transfer", TRANSFER, pay, **scope_kwargs(run_id))
    again = fake_gate.run("payments.transfer", {**TRANSFER, "memo": "rewritten"}, pay, **scope_kwargs(run_id))
    assert first == again == {"transfer_id": "tr-1", "provider_key": calls[0].provider_key}
    assert len(calls) == 1


def test_key_reused_is_raised_and_not_retried(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    fake_gate.run(
        "payments.transfer",
        TRANSFER,
        lambda grant: "ok",
        idempotency_key="invoice-42",
        **scope_kwargs(run_id),
    )
    ran: list[int] = []
    before = fake.calls["RequestToken"]
    with pytest.raises(KeyReused) as raised:
        fake_gate.run(
            "payments.transfer",
            {**TRANSFER, "amount": 5100},
            lambda grant: ran.append(1),
            idempotency_key="invoice-42",
            **scope_kwargs(run_id),
        )
    assert raised.value.differing_fields == ("/amount",)
    assert not ran and fake.calls["RequestToken"] == before + 1


def test_definite_failure_releases_and_the_next_attempt_gets_a_higher_fencing(
    fake_gate: Gate, run_id: str
) -> None:
    grants: list[Grant] = []

    def pay(grant: Grant) -> str:
        grants.append(grant)
        return "paid"

    def declined(grant: Grant) -> None:
        grants.append(grant)
        raise Declined("card declined")

    with pytest.raises(Declined):
        fake_gate.run("payments.transfer", TRANSFER, declined, definite=(Declined,), **scope_kwargs(run_id))

    def marked(grant: Grant) -> None:
        grants.append(grant)
        raise DefiniteFailure("provider said no")

    with pytest.raises(DefiniteFailure):
        fake_gate.run("payments.transfer", TRANSFER, marked, **scope_kwargs(run_id))
    result = fake_gate.run("payments.transfer", TRANSFER, pay, **scope_kwargs(run_id))
    assert result == "paid"
    assert [grant.fencing for grant in grants] == [1, 2, 3]


def test_unmarked_exception_is_outcome_unknown_and_keeps_the_token(
    fake_gate: Gate, fake: FakeGate, run_id: str
) -> None:
    def times_out(grant: Grant) -> None:
        raise TimeoutError("provider did not answer")

    with pytest.raises(OutcomeUnknown) as raised:
        fake_gate.run("payments.transfer", TRANSFER, times_out, **scope_kwargs(run_id))
    unknown = raised.value
    assert isinstance(unknown.__cause__, TimeoutError)
    assert unknown.provider_key in str(unknown) and unknown.fencing == 1
    assert fake.calls["Release"] == 0
    assert fake_gate.get_action(unknown.action).state is ActionState.AUTHORIZED
    with pytest.raises(InProgress):
        fake_gate.run(
            "payments.transfer", TRANSFER, lambda grant: "again", max_wait=0, **scope_kwargs(run_id)
        )
    fake_gate.complete(unknown.action, unknown.token, b'"reconciled"')
    assert (
        fake_gate.run("payments.transfer", TRANSFER, lambda grant: "again", **scope_kwargs(run_id))
        == "reconciled"
    )


def test_waits_while_in_progress_then_replays(fake_gate: Gate, run_id: str) -> None:
    started = threading.Event()

    def slow(grant: Grant) -> str:
        started.set()
        time.sleep(0.4)
        return "first"

    # Its lease (2 s) ends within the waiter's max_wait (5 s): the waiter waits for it.
    worker = threading.Thread(
        target=lambda: fake_gate.run("pay", {"a": 1}, slow, lease_ttl=2, **scope_kwargs(run_id))
    )
    worker.start()
    started.wait(5)
    ran: list[int] = []
    result = fake_gate.run(
        "pay",
        {"a": 1},
        lambda grant: ran.append(1),
        max_wait=5,
        poll_interval=0.05,
        **scope_kwargs(run_id),
    )
    worker.join()
    assert result == "first" and not ran


def test_a_lease_beyond_max_wait_fails_at_once_and_says_it_may_be_ours(
    fake_gate: Gate, fake: FakeGate, run_id: str
) -> None:
    # The live lease (300 s, as RetryInfo says) outlasts max_wait: waiting could only end in the
    # same error, so the guard asks once and stops, saying the lease may be the caller's own.
    fake_gate.request_token("pay", {"a": 1}, holder="other", **scope_kwargs(run_id))
    with pytest.raises(InProgress) as raised:
        fake_gate.run(
            "pay", {"a": 1}, lambda grant: None, max_wait=5, poll_interval=0.05, **scope_kwargs(run_id)
        )
    assert fake.calls["RequestToken"] == 2, "one ask, no polling"
    assert raised.value.retry_after_ms is not None and raised.value.retry_after_ms > 200_000
    message = str(raised.value)
    assert "beyond what is left of max_wait (5 s)" in message
    assert "may be this caller's own earlier attempt" in message and "provider key" in message


def test_complete_is_retried_until_acknowledged(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    fake.fail_next["Complete"] = 2
    assert fake_gate.run("pay", {"a": 1}, lambda grant: {"ok": True}, **scope_kwargs(run_id)) == {"ok": True}
    assert fake.calls["Complete"] == 3


def test_complete_never_acknowledged(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    fake.fail_next["Complete"] = 1000
    with pytest.raises(CompletionUnrecorded) as raised:
        fake_gate.run("pay", {"a": 1}, lambda grant: {"ok": True}, retry_timeout=0.3, **scope_kwargs(run_id))
    unrecorded = raised.value
    assert isinstance(unrecorded, OutcomeUnknown)
    assert unrecorded.result == {"ok": True} and unrecorded.receipt == b'{"ok":true}'
    fake.fail_next["Complete"] = 0
    fake_gate.complete(unrecorded.action, unrecorded.token, unrecorded.receipt)
    assert fake_gate.get_action(unrecorded.action).state is ActionState.COMPLETED


def test_lost_grant_reply_is_redelivered_to_the_same_attempt(
    fake_gate: Gate, fake: FakeGate, run_id: str
) -> None:
    fake.lose_reply["RequestToken"] = 1
    grants: list[Grant] = []
    fake_gate.run("pay", {"a": 1}, lambda grant: grants.append(grant), **scope_kwargs(run_id))
    assert len(grants) == 1 and grants[0].fencing == 1
    assert fake.calls["RequestToken"] == 2


def test_store_unavailable_on_request_is_retried(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    fake.fail_next["RequestToken"] = 2
    assert fake_gate.run("pay", {"a": 1}, lambda grant: 7, **scope_kwargs(run_id)) == 7


def test_heartbeat_extends_the_lease(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    seen: list[ActionState] = []

    def long_work(grant: Grant) -> str:
        time.sleep(1.5)
        seen.append(fake_gate.get_action(attempt.action).state)  # type: ignore[arg-type]
        return "done"

    attempt = fake_gate.attempt("pay", {"a": 1}, lease_ttl=0.6, **scope_kwargs(run_id))
    assert attempt.run(long_work) == "done"
    assert seen == [ActionState.AUTHORIZED]
    assert fake.calls["ExtendLease"] >= 2


def test_attempt_context_manager(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    with fake_gate.attempt("pay", {"a": 1}, **scope_kwargs(run_id)) as attempt:
        assert not attempt.replayed and attempt.grant is not None
        attempt.skip()
    assert fake.calls["Release"] == 1
    with (
        pytest.raises(OutcomeUnknown, match="without complete"),
        fake_gate.attempt("pay", {"a": 1}, **scope_kwargs(run_id)) as attempt,
    ):
        pass
    assert fake_gate.get_action(attempt.action).state is ActionState.AUTHORIZED  # type: ignore[arg-type]
    assert attempt.grant is not None
    fake_gate.release(attempt.action, attempt.grant.token, ReleaseReason.NOT_ATTEMPTED)  # type: ignore[arg-type]
    with fake_gate.attempt("pay", {"a": 1}, **scope_kwargs(run_id)) as attempt:
        attempt.complete(["receipt"])
    with fake_gate.attempt("pay", {"a": 1}, **scope_kwargs(run_id)) as replay:
        assert replay.replayed and replay.result == ["receipt"] and replay.grant is None


def test_decorator_with_scope(fake_gate: Gate, fake: FakeGate) -> None:
    calls: list[dict[str, Any]] = []

    @fake_gate.action("payments.transfer")
    def transfer(amount: int, currency: str, to: str, memo: str = "", *, grant: Grant) -> dict[str, Any]:
        """Sends money."""
        calls.append({"amount": amount, "memo": memo, "key": grant.provider_key})
        return {"transfer_id": f"tr-{len(calls)}"}

    assert transfer.__doc__ == "Sends money."
    with fake_gate.scope(agent_id="billing-agent", run_id="run-decorator"):
        first = transfer(5000, "EUR", to="DE89", idempotency_key="invoice-42")
        second = transfer(5000, currency="EUR", to="DE89", memo="rewritten", idempotency_key="invoice-42")
        with pytest.raises(KeyReused):
            transfer(5001, "EUR", "DE89", idempotency_key="invoice-42")
    other_run = transfer(
        5000, "EUR", "DE89", agent_id="billing-agent", run_id="run-other", idempotency_key="invoice-42"
    )
    assert first == second == {"transfer_id": "tr-1"} and other_run == {"transfer_id": "tr-2"}
    assert [call["amount"] for call in calls] == [5000, 5000]
    assert calls[0]["key"] != calls[1]["key"]
    with pytest.raises(TypeError, match="no scope"):
        transfer(1, "EUR", "DE89")


def test_decorator_params_and_control_arguments(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    seen: list[tuple[Any, ...]] = []

    @fake_gate.action("notify", key_fields_hint=None)
    def notify(agent_id: str, channel: str, text: str = "hi", **extra: Any) -> str:
        seen.append((agent_id, channel, text, extra))
        return "sent"

    assert notify("agent-7", "email", run_id=run_id, intent_id="welcome", urgent=True) == "sent"
    assert seen == [("agent-7", "email", "hi", {"urgent": True})]
    expected = fingerprint("notify", {"channel": "email", "text": "hi", "urgent": True}, "welcome")
    record = fake.records[("agent-7", run_id, expected)]
    assert record.fencing == 1

    with pytest.raises(TypeError, match=r"\*args"):
        fake_gate.action("bad")(lambda *args: None)


def test_key_fields_hint_warns_on_policy_drift(
    fake_gate: Gate, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    @fake_gate.action("payments.transfer", key_fields_hint=["/amount", "/to"])
    def transfer(amount: int, currency: str, to: str) -> str:
        return "ok"

    with caplog.at_level(logging.WARNING, logger="oncegate"):
        transfer(1, "EUR", "DE89", agent_id="a", run_id=run_id)
    assert "differs from the hint" in caplog.text


def test_decorated_signature_hides_the_grant(fake_gate: Gate) -> None:
    @fake_gate.action("payments.transfer")
    def transfer(amount: int, currency: str, *, grant: Grant) -> str:
        return "ok"

    assert list(inspect.signature(transfer).parameters) == ["amount", "currency"]
    assert "grant" not in transfer.__annotations__


def test_definite_oncegate_error_still_leaves_an_unknown_outcome_unknown(
    fake_gate: Gate, fake: FakeGate, run_id: str
) -> None:
    # OutcomeUnknownError joined the OncegateError hierarchy; `definite=(OncegateError,)` must not
    # start releasing a token after an unknown outcome (here from a guard nested in the function).
    def nested(grant: Grant) -> None:
        raise OutcomeUnknownError("inner", action=ActionRef(Scope("a", "r"), "inner:key"), grant=grant)

    with pytest.raises(OutcomeUnknownError) as raised:
        fake_gate.run("pay", {"a": 1}, nested, definite=(OncegateError,), **scope_kwargs(run_id))
    inner = raised.value.__cause__
    assert isinstance(inner, OutcomeUnknownError) and str(inner) == "inner"
    assert fake.calls["Release"] == 0

    def refused(grant: Grant) -> None:
        raise InvalidRequestError("the provider's gate refused")

    with pytest.raises(InvalidRequestError):
        fake_gate.run("pay", {"b": 1}, refused, definite=(OncegateError,), **scope_kwargs(run_id))
    assert fake.calls["Release"] == 1


def test_max_wait_bounds_the_wait_for_another_holder(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    # A lease that ends within max_wait is waited for, polling; one beyond it is not.
    fake_gate.request_token("pay", {"a": 1}, holder="other", lease_ttl=1.0, **scope_kwargs(run_id))
    with pytest.raises(InProgressError):
        fake_gate.run(
            "pay", {"a": 1}, lambda grant: None, max_wait=0.3, poll_interval=0.05, **scope_kwargs(run_id)
        )
    assert fake.calls["RequestToken"] == 2
    assert GuardOptions().max_wait == 30.0


def test_wait_timeout_is_a_deprecated_name_of_max_wait(fake_gate: Gate, run_id: str) -> None:
    with pytest.warns(DeprecationWarning, match="use max_wait") as warned:
        options = GuardOptions(wait_timeout=2.5)
    assert options == GuardOptions(max_wait=2.5) and options.max_wait == 2.5
    assert warned[0].filename == __file__  # the warning names the caller's line, not the package's
    with pytest.warns(DeprecationWarning, match="use max_wait"):
        assert options.wait_timeout == 2.5
    with pytest.raises(TypeError, match="not both"):
        GuardOptions(max_wait=1.0, wait_timeout=2.0)
    fake_gate.request_token("pay", {"a": 1}, holder="other", **scope_kwargs(run_id))
    with pytest.warns(DeprecationWarning) as warned, pytest.raises(InProgressError) as raised:
        fake_gate.run(
            "pay", {"a": 1}, lambda grant: None, wait_timeout=0.3, poll_interval=0.05, **scope_kwargs(run_id)
        )
    assert "max_wait (0.3 s)" in str(raised.value)
    assert warned[0].filename == __file__
