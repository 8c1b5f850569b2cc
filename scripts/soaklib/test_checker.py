"""The checker on hand-written histories: for each rule, histories that break it (and the events it
names) and nearby ones that do not. Run with ``pytest scripts/soaklib`` (``make test-soak``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from soaklib.checker import CODE, check, ts

T = 1_700_000_000.0
KEY = ("agent", "run", "k1")
RECON, REGRANT = "pay.reconcile", "pay.regrant"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ref() -> dict[str, Any]:
    return {"scope": {"agent_id": KEY[0], "run_id": KEY[1]}, "key": KEY[2]}


def err(reason: str | None, code: str | None = None) -> dict[str, Any]:
    return {"code": code or CODE.get(reason or "", "UNAVAILABLE"), "reason": reason, "metadata": {}}


def op(rpc: str, start: float, end: float, req: dict[str, Any], reply: dict[str, Any] | None = None,
       error: dict[str, Any] | None = None) -> dict[str, Any]:
    event = {"t": "op", "rpc": rpc, "who": "c", "gate": "g", "start": T + start, "end": T + end,
             "req": req, "ok": error is None}
    event.update({"reply": reply or {}} if error is None else {"error": error})
    return event


def completion(token: str = "t1", fencing: int = 1, receipt: str = "eDE=") -> dict[str, Any]:
    return {"receipt": receipt, "fencing": str(fencing), "token": token, "source": "COMPLETION_SOURCE_WORKER"}


def rt(start: float, end: float, *, token: str | None = None, fencing: int = 1, lease: float = 2.0,
       holder: str = "h1", action: str = RECON, params: str = '{"x":1}',
       done: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    req = {"scope": ref()["scope"], "action": action, "params_json": params, "idempotency_key": KEY[2],
           "holder": holder}
    reply: dict[str, Any] = {"action": ref()}
    if token:
        reply["grant"] = {"token": token, "fencing": str(fencing), "lease_expires_at": iso(T + start + lease),
                          "provider_key": "og-x"}
    if done:
        reply["completion"] = done
    return op("RequestToken", start, end, req, None if error else reply, error)


def call(rpc: str, start: float, end: float, token: str, reply: dict[str, Any] | None = None,
         error: dict[str, Any] | None = None) -> dict[str, Any]:
    return op(rpc, start, end, {"action": ref(), "token": token}, reply, error)


def resolve(start: float, end: float, reply: dict[str, Any] | None = None) -> dict[str, Any]:
    return op("ResolveExpired", start, end, {"action": ref(), "resolution": "RESOLUTION_FAILED"}, reply or {})


def execute(at: float, token: str, fencing: int = 1, outcome: str = "ok", effect: bool = True) -> dict[str, Any]:
    return {"t": "provider", "time": T + at, "key": list(KEY), "provider_key": "og-x", "token": token,
            "fencing": fencing, "outcome": outcome, "effect": effect}


def final(*keys: tuple[str, str, str], complete: bool = True) -> dict[str, Any]:
    return {"t": "final_unresolved", "time": T + 100, "complete": complete, "keys": [list(k) for k in keys]}


RUN = {"t": "run", "time": T, "regrant_actions": [REGRANT]}


def rules(*events: dict[str, Any]) -> list[str]:
    return sorted(v.rule for v in check([RUN, *events]).violations)


def test_a_clean_history_breaks_nothing() -> None:
    assert rules(
        rt(0, 0.1, token="t1"), execute(0.2, "t1"),
        call("Complete", 0.3, 0.4, "t1", {"completion": completion()}),
        rt(1, 1.1, holder="h2", done=completion()),
        rt(1.2, 1.3, holder="h3", error=err("IDEMPOTENCY_IN_PROGRESS")) | {"start": T + 0.05, "end": T + 0.15},
        final(),
    ) == []


def test_timestamps_with_any_fraction() -> None:
    assert ts("2023-11-14T22:13:20Z") == T
    assert abs(ts("2023-11-14T22:13:20.123456789Z") - (T + 0.123456789)) < 1e-6  # type: ignore[operator]


# -- double_execution


def test_two_tokens_executing_under_reconcile_is_a_double_execution() -> None:
    # t1's lease ended; the gate granted again under a reconcile policy, and both ran.
    history = [rt(0, 0.1, token="t1"), execute(0.2, "t1"), rt(3, 3.1, token="t2", fencing=2, holder="h2"),
               execute(3.2, "t2", 2, effect=False), final(KEY)]
    assert rules(*history) == ["double_execution"]
    violation = check([RUN, *history]).violations[0]
    assert {e.get("token") for e in violation.events if e["t"] == "provider"} == {"t1", "t2"}


def test_a_declined_first_execution_does_not_count() -> None:
    assert rules(rt(0, 0.1, token="t1"), execute(0.2, "t1", outcome="declined", effect=False),
                 call("Release", 0.3, 0.4, "t1", {"fencing": "1"}),
                 rt(1, 1.1, token="t2", fencing=2, holder="h2"), execute(1.2, "t2", 2),
                 call("Complete", 1.3, 1.4, "t2", {"completion": completion("t2", 2)}), final()) == []


def test_a_regrant_allows_it_when_the_gate_flags_the_second_complete() -> None:
    assert rules(
        rt(0, 0.1, token="t1", action=REGRANT), execute(0.2, "t1"),
        rt(3, 3.1, token="t2", fencing=2, holder="h2", action=REGRANT), execute(3.2, "t2", 2, effect=False),
        call("Complete", 3.3, 3.4, "t2", {"completion": completion("t2", 2)}),
        call("Complete", 3.5, 3.6, "t1", error=err("COMPLETED_BY_OTHER")), final(),
    ) == []


def test_a_regrant_whose_two_completes_were_both_accepted_unflagged_breaks_it() -> None:
    assert rules(
        rt(0, 0.1, token="t1", action=REGRANT), execute(0.2, "t1"),
        rt(3, 3.1, token="t2", fencing=2, holder="h2", action=REGRANT), execute(3.2, "t2", 2, effect=False),
        call("Complete", 3.3, 3.4, "t2", {"completion": completion("t2", 2)}),
        call("Complete", 3.5, 3.6, "t1", {"completion": completion("t2", 2)}), final(),
    ) == ["double_execution"]


def test_an_operator_resolution_allows_it() -> None:
    # The worker stalled past its lease; the operator resolved FAILED; a new grant ran; the stalled
    # worker then ran too (the provider key kept the effect single) and its Complete was refused.
    assert rules(
        rt(0, 0.1, token="t1"), resolve(3, 3.1, {"fencing": "1"}),
        rt(4, 4.1, token="t2", fencing=2, holder="h2"), execute(4.2, "t2", 2),
        call("Complete", 4.3, 4.4, "t2", {"completion": completion("t2", 2)}),
        execute(5, "t1", effect=False), call("Complete", 5.1, 5.2, "t1", error=err("TOKEN_MISMATCH")), final(),
    ) == []


# -- lost_completion


def test_a_grant_after_an_acknowledged_complete_is_a_lost_completion() -> None:
    history = [rt(0, 0.1, token="t1"), call("Complete", 0.3, 0.4, "t1", {"completion": completion()}),
               rt(5, 5.1, token="t2", fencing=2, holder="h2"), final()]
    assert rules(*history) == ["lost_completion"]
    violation = check([RUN, *history]).violations[0]
    assert [e["rpc"] for e in violation.events] == ["Complete", "RequestToken"]


def test_an_expired_answer_or_a_listing_after_a_complete_is_a_lost_completion() -> None:
    assert rules(rt(0, 0.1, token="t1"), call("Complete", 0.3, 0.4, "t1", {"completion": completion()}),
                 rt(5, 5.1, holder="h2", error=err("LEASE_EXPIRED_UNRESOLVED")), final()) == ["lost_completion"]
    assert rules(rt(0, 0.1, token="t1"), call("Complete", 0.3, 0.4, "t1", {"completion": completion()}),
                 final(KEY)) == ["lost_completion"]


def test_two_different_completions_for_one_key() -> None:
    assert rules(rt(0, 0.1, token="t1"), call("Complete", 0.3, 0.4, "t1", {"completion": completion()}),
                 rt(1, 1.1, holder="h2", done=completion(receipt="eDI=")), final()) == ["lost_completion"]


def test_a_complete_whose_answer_was_lost_may_still_be_missing() -> None:
    # STORE_UNAVAILABLE: not acknowledged, so a later in-progress answer is no loss.
    assert rules(rt(0, 0.1, token="t1"), call("Complete", 0.3, 0.4, "t1", error=err("STORE_UNAVAILABLE")),
                 rt(0.5, 0.6, holder="h2", error=err("IDEMPOTENCY_IN_PROGRESS")), final()) == []


# -- overlapping_grant


def test_a_grant_inside_another_tokens_lease_overlaps() -> None:
    history = [rt(0, 0.1, token="t1"), rt(1, 1.1, token="t2", fencing=2, holder="h2"), final(KEY)]
    assert rules(*history) == ["overlapping_grant"]


def test_a_grant_after_a_release_does_not_overlap() -> None:
    assert rules(rt(0, 0.1, token="t1"), call("Release", 0.5, 0.6, "t1", {"fencing": "1"}),
                 rt(1, 1.1, token="t2", fencing=2, holder="h2"), final(KEY)) == []


def test_an_extended_lease_counts() -> None:
    extend = call("ExtendLease", 1, 1.1, "t1", {"lease_expires_at": iso(T + 5)})
    assert rules(rt(0, 0.1, token="t1", action=REGRANT), extend,
                 rt(3, 3.1, token="t2", fencing=2, holder="h2", action=REGRANT), final(KEY)) == ["overlapping_grant"]
    assert rules(rt(0, 0.1, token="t1", action=REGRANT),
                 rt(3, 3.1, token="t2", fencing=2, holder="h2", action=REGRANT), final(KEY)) == []


# -- fencing_order


def test_fencing_must_grow_with_real_time() -> None:
    history = [rt(0, 0.1, token="t1", fencing=10), call("Release", 0.2, 0.3, "t1", {"fencing": "10"}),
               rt(1, 1.1, token="t2", fencing=9, holder="h2"), final(KEY)]
    assert rules(*history) == ["fencing_order"]


def test_two_tokens_with_one_fencing_or_one_token_with_two() -> None:
    assert "fencing_order" in rules(rt(0, 0.1, token="t1", fencing=5), call("Release", 0.2, 0.3, "t1"),
                                    rt(1, 1.1, token="t2", fencing=5, holder="h2"), final(KEY))
    assert rules(rt(0, 0.1, token="t1", fencing=5), rt(0.2, 0.3, token="t1", fencing=6),
                 final(KEY)) == ["fencing_order"]


def test_concurrent_grants_need_no_order() -> None:
    # t2 was asked before t1's reply came back: either order is possible (t1 released first).
    assert rules(rt(0, 0.5, token="t1", fencing=10), call("Release", 0.6, 0.7, "t1"),
                 rt(0.4, 0.8, token="t2", fencing=9, holder="h2", lease=0.0), final(KEY)) == []


# -- unresolved_not_listed


def test_an_unsettled_grant_must_be_listed() -> None:
    assert rules(rt(0, 0.1, token="t1"), execute(0.2, "t1", outcome="ambiguous"), final()) == [
        "unresolved_not_listed"]
    assert rules(rt(0, 0.1, token="t1"), execute(0.2, "t1", outcome="ambiguous"), final(KEY)) == []


def test_a_grant_that_something_may_have_settled_need_not_be_listed() -> None:
    assert rules(rt(0, 0.1, token="t1"), call("Release", 0.2, 0.3, "t1", error=err("STORE_UNAVAILABLE")),
                 final()) == []
    assert rules(rt(0, 0.1, token="t1"), resolve(3, 3.1), final()) == []


def test_no_final_listing_is_a_violation() -> None:
    assert rules(rt(0, 0.1, token="t1")) == ["unresolved_not_listed"]
    assert rules(rt(0, 0.1, token="t1"), final(KEY, complete=False)) == ["unresolved_not_listed"]


# -- disallowed_error


def test_errors_the_contract_does_not_allow_for_the_rpc() -> None:
    assert rules(rt(0, 0.1, token="t1"), call("Complete", 0.2, 0.3, "t1", error=err("LEASE_EXPIRED_UNRESOLVED")),
                 final(KEY)) == ["disallowed_error"]
    assert rules(rt(0, 0.1, holder="h", error=err("IDEMPOTENCY_IN_PROGRESS", "FAILED_PRECONDITION")),
                 final()) == ["disallowed_error"]
    assert rules(rt(0, 0.1, error=err("INTERNAL")), final()) == ["disallowed_error"]
    assert rules(rt(0, 0.1, error=err(None, "PERMISSION_DENIED")), final()) == ["disallowed_error"]


def test_transport_failures_and_allowed_refusals_are_fine() -> None:
    assert rules(rt(0, 0.1, error=err(None, "UNAVAILABLE")), rt(0.2, 0.3, error=err(None, "DEADLINE_EXCEEDED")),
                 rt(0.4, 0.5, error=err("STORE_UNAVAILABLE")), final()) == []


def test_wrong_answers_token_unknown_and_key_reused() -> None:
    assert rules(rt(0, 0.1, token="t1"), call("Complete", 0.2, 0.3, "t1", error=err("TOKEN_UNKNOWN")),
                 final(KEY)) == ["disallowed_error"]
    assert rules(rt(0, 0.1, token="t1"), rt(0.2, 0.3, holder="h2", error=err("IDEMPOTENCY_KEY_REUSED")),
                 final(KEY)) == ["disallowed_error"]
    assert rules(rt(0, 0.1, token="t1"), rt(0.2, 0.3, holder="h2", params='{"x":2}',
                                             error=err("IDEMPOTENCY_KEY_REUSED")), final(KEY)) == []


def lookup(at: float, answer: str, provider_key: str = "og-x") -> dict[str, Any]:
    return {"t": "lookup", "time": T + at, "provider_key": provider_key, "answer": answer, "receipt": None}


def resolver_run(*events: dict[str, Any]) -> list[str]:
    return sorted(v.rule for v in check([{**RUN, "resolver": True}, *events]).violations)


def test_resolvers_leave_only_what_the_provider_cannot_tell() -> None:
    lapsed = rt(0.0, 0.1, token="t1")
    listed = {**final(KEY), "provider_keys": ["og-x"]}
    # The provider could not tell, every time it was asked: left for a person, as it should be.
    assert resolver_run(lapsed, lookup(2.5, "unknown"), lookup(3.0, "unknown"), listed) == []
    # It could answer (once), or nobody asked it: the resolvers should have settled it.
    assert resolver_run(lapsed, lookup(2.5, "unknown"), lookup(3.0, "failed"), listed) == ["resolver_left_answerable"]
    assert resolver_run(lapsed, lookup(2.5, "completed"), listed) == ["resolver_left_answerable"]
    assert resolver_run(lapsed, listed) == ["resolver_left_answerable"]
    # Without resolvers the rule does not apply: the operator's listing is for a person.
    assert rules(lapsed, listed) == []


def test_a_resolver_told_already_settled_is_allowed() -> None:
    lapsed = rt(0.0, 0.1, token="t1")
    settled = resolve(2.5, 2.6, {"fencing": "1"})
    second = op("ResolveExpired", 2.7, 2.8, {"action": ref(), "resolution": "RESOLUTION_FAILED",
                                             "expected_fencing": "1"}, error=err("ALREADY_SETTLED"))
    assert resolver_run(lapsed, settled, second, {**final(), "provider_keys": []}) == []
    wrong = op("ResolveExpired", 2.7, 2.8, {"action": ref()}, error=err("ALREADY_SETTLED", "ABORTED"))
    assert resolver_run(lapsed, settled, wrong, {**final(), "provider_keys": []}) == ["disallowed_error"]
