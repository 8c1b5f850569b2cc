"""The checker: judges a recorded history (``soaklib/history.py`` describes the events) against the
gate's promises, and names the events that break each one. Standard library only, no IO but
:func:`load`, so it can judge histories recorded anywhere.

Rules (``Violation.rule``):

* ``double_execution``: two tokens of one action key executed at the provider (declined calls,
  which had no effect, do not count) while neither a regrant (the action's policy is ``regrant``
  and the later grant came after the earlier lease) nor an operator resolution allowed it; or it
  was allowed but both Completes were accepted without the gate flagging the double execution
  (``COMPLETED_BY_OTHER``, a superseded completion, or a refusal of the stale token).
* ``lost_completion``: after a completion was acknowledged (Complete, an operator resolution, or a
  replay), a later RequestToken was granted, in progress or expired instead of replaying it, a
  later Release/ExtendLease succeeded, the listing at the end named the action, or two different
  completions were reported for one key.
* ``overlapping_grant``: a token granted while another token's acknowledged lease on the same key
  was live and no Release of that token had been sent.
* ``fencing_order``: fencing not strictly increasing across grants in real-time order, two tokens
  with one fencing number, or one token with two.
* ``unresolved_not_listed``: a grant that nothing could have settled (no Complete or Release with
  its token, no completion of its key, no operator call on its key since) is missing from the
  final ``ListUnresolved``, or there is no complete final listing.
* ``resolver_left_answerable`` (runs with resolvers only): the final ``ListUnresolved`` holds an
  action whose provider key the provider could answer (a ``lookup`` of it answered ``completed``
  or ``failed``, or none answered at all): the resolvers should have settled it.
* ``disallowed_error``: an error docs/CONTRACT.md §3 does not allow for that RPC (or with the wrong
  gRPC code, or ``INTERNAL``: the contract lists it for every RPC, but it means the gate could not
  read its own store, never expected in a healthy run), a status without ErrorInfo other than a
  transport failure, or a wrong answer: ``TOKEN_UNKNOWN`` for a key whose grant was acknowledged
  (records outlive a soak), ``IDEMPOTENCY_KEY_REUSED`` for a key only ever asked with one request.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

Key = tuple[str, str, str]
EPS = 0.05  # seconds: wire durations are rounded up to milliseconds; clocks are one clock

COMMON = {"INVALID_REQUEST", "UNAUTHENTICATED", "FORBIDDEN_SCOPE", "RATE_LIMITED", "STORE_UNAVAILABLE"}
ALLOWED = {
    "RequestToken": COMMON | {"IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_IN_PROGRESS", "LEASE_EXPIRED_UNRESOLVED"},
    "Complete": COMMON | {"TOKEN_MISMATCH", "TOKEN_UNKNOWN", "COMPLETED_BY_OTHER"},
    "Release": COMMON | {"TOKEN_MISMATCH", "TOKEN_UNKNOWN", "ALREADY_COMPLETED"},
    "ExtendLease": COMMON | {"TOKEN_MISMATCH", "TOKEN_UNKNOWN", "ALREADY_COMPLETED", "LEASE_EXPIRED_UNRESOLVED"},
    "GetAction": set(COMMON),
    "RecordExternalCompletion": COMMON | {"IDEMPOTENCY_KEY_REUSED", "ALREADY_COMPLETED"},
    "ResolveExpired": COMMON | {"LEASE_NOT_EXPIRED", "ALREADY_COMPLETED", "ALREADY_SETTLED"},
    "ListUnresolved": set(COMMON),
}
CODE = {
    "IDEMPOTENCY_KEY_REUSED": "FAILED_PRECONDITION", "IDEMPOTENCY_IN_PROGRESS": "ABORTED",
    "LEASE_EXPIRED_UNRESOLVED": "FAILED_PRECONDITION", "TOKEN_MISMATCH": "FAILED_PRECONDITION",
    "TOKEN_UNKNOWN": "FAILED_PRECONDITION", "COMPLETED_BY_OTHER": "FAILED_PRECONDITION",
    "ALREADY_COMPLETED": "FAILED_PRECONDITION", "LEASE_NOT_EXPIRED": "FAILED_PRECONDITION",
    "ALREADY_SETTLED": "FAILED_PRECONDITION",
    "INVALID_REQUEST": "INVALID_ARGUMENT", "UNAUTHENTICATED": "UNAUTHENTICATED",
    "FORBIDDEN_SCOPE": "PERMISSION_DENIED", "RATE_LIMITED": "RESOURCE_EXHAUSTED",
    "STORE_UNAVAILABLE": "UNAVAILABLE", "INTERNAL": "INTERNAL",
}
# Statuses without ErrorInfo that the network or the client makes (a gate killed mid-call
# resets the stream: UNKNOWN "Stream removed" in grpc-python).
TRANSPORT = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN"}
RULES = ("double_execution", "lost_completion", "overlapping_grant", "fencing_order",
         "unresolved_not_listed", "resolver_left_answerable", "disallowed_error")


@dataclass
class Violation:
    rule: str
    key: Key | None
    message: str
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def add(self, rule: str, key: Key | None, message: str, *events: dict[str, Any]) -> None:
        self.violations.append(Violation(rule, key, message, list(events)))


def load(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def ts(value: str | None) -> float | None:
    """An RFC 3339 timestamp of the proto JSON mapping (0, 3, 6 or 9 fraction digits) in seconds."""
    if not value:
        return None
    main, _, frac = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(main + "+00:00").timestamp() + (float("0." + frac) if frac else 0.0)


def reason(op: dict[str, Any]) -> str | None:
    return (op.get("error") or {}).get("reason")


def op_key(op: dict[str, Any]) -> Key | None:
    req = op.get("req", {})
    if op["rpc"] == "RequestToken":
        ref = (op.get("reply") or {}).get("action")
        if ref is None:
            if not req.get("idempotency_key"):
                return None
            ref = {"scope": req.get("scope", {}), "key": req["idempotency_key"]}
    else:
        ref = req.get("action")
        if ref is None:
            return None
    scope = ref.get("scope", {})
    return (scope.get("agent_id", ""), scope.get("run_id", ""), ref.get("key", ""))


def unknown_outcome(op: dict[str, Any]) -> bool:
    """The call may or may not have been applied."""
    return not op["ok"] and reason(op) in (None, "STORE_UNAVAILABLE", "INTERNAL")


@dataclass
class Grant:
    token: str
    fencing: int
    first: dict[str, Any]  # the first reply that carried it
    asked_from: float  # earliest start of a RequestToken by its holder: it cannot be older
    lease_end: float
    action: str


class KeyHistory:
    """Everything the history says about one action key."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.grants: dict[str, Grant] = {}
        self.executions: dict[str, list[dict[str, Any]]] = defaultdict(list)


def index(events: list[dict[str, Any]], report: Report) -> tuple[dict[Key, KeyHistory], dict[str, Any]]:
    """Groups the operations and executions by action key; collects each token's grant."""
    keys: dict[Key, KeyHistory] = defaultdict(KeyHistory)
    run: dict[str, Any] = {}
    ops = sorted((e for e in events if e.get("t") == "op"), key=lambda e: e["start"])
    for e in events:
        if e.get("t") == "provider" and e.get("outcome") != "declined":
            keys[tuple(e["key"])].executions[e["token"]].append(e)  # type: ignore[index]
        elif e.get("t") == "run":
            run = e
    asked: dict[tuple[Key, str], float] = {}
    for op in ops:
        key = op_key(op)
        if key is None:
            continue
        h = keys[key]
        h.ops.append(op)
        rpc = op["rpc"]
        if rpc == "RequestToken":
            holder = op["req"].get("holder", "")
            asked.setdefault((key, holder), op["start"])
            grant = (op.get("reply") or {}).get("grant")
            if op["ok"] and grant:
                token = grant["token"]
                lease = ts(grant.get("lease_expires_at")) or 0.0
                if token not in h.grants:
                    since = asked[(key, holder)] if holder else op["start"]
                    h.grants[token] = Grant(token, int(grant.get("fencing", 0)), op, since, lease,
                                            op["req"].get("action", ""))
                g = h.grants[token]
                g.lease_end = max(g.lease_end, lease)
                if int(grant.get("fencing", 0)) != g.fencing:
                    report.add("fencing_order", key, f"token {token} carried fencing {g.fencing} "
                               f"and then {grant.get('fencing')}", g.first, op)
        elif rpc == "ExtendLease" and op["ok"]:
            g2 = h.grants.get(op["req"].get("token", ""))
            if g2 is not None:
                g2.lease_end = max(g2.lease_end, ts(op["reply"].get("lease_expires_at")) or 0.0)
    return keys, run


def check(events: list[dict[str, Any]]) -> Report:
    """Every rule over the whole history."""
    report = Report()
    keys, run = index(events, report)
    regrant_actions = set(run.get("regrant_actions", [])) if "regrant_actions" in run else None
    final = next((e for e in events if e.get("t") == "final_unresolved"), None)
    listed = {tuple(k) for k in final["keys"]} if final else set()
    for key, h in keys.items():
        check_errors(report, key, h)
        check_fencing(report, key, h)
        check_overlap(report, key, h)
        check_completions(report, key, h, listed)
        check_executions(report, key, h, regrant_actions)
    check_listing(report, keys, final, listed)
    if run.get("resolver"):
        check_resolver_left(report, events, final)
    for op in (e for e in events if e.get("t") == "op" and op_key(e) is None):
        check_error_allowed(report, None, op)
    report.stats = {
        "ops": sum(1 for e in events if e.get("t") == "op"),
        "keys": len(keys),
        "executions": sum(1 for e in events if e.get("t") == "provider"),
        "effects": sum(1 for e in events if e.get("t") == "provider" and e.get("effect")),
        "double_executions_allowed": sum(1 for h in keys.values() if len(h.executions) > 1),
        "double_execution_evidence": sum(len(evidence(h)) for h in keys.values()),
    }
    return report


def check_error_allowed(report: Report, key: Key | None, op: dict[str, Any]) -> None:
    if op["ok"]:
        return
    err = op["error"]
    why = err.get("reason")
    if why is None:
        if err.get("code") not in TRANSPORT:
            report.add("disallowed_error", key, f"{op['rpc']}: status {err.get('code')} without ErrorInfo", op)
    elif why not in ALLOWED.get(op["rpc"], set()):
        report.add("disallowed_error", key, f"{op['rpc']} answered {why}, which the contract does not allow", op)
    elif CODE.get(why) != err.get("code"):
        report.add("disallowed_error", key, f"{why} came with code {err.get('code')}, not {CODE.get(why)}", op)


def check_errors(report: Report, key: Key, h: KeyHistory) -> None:
    requests = {(o["req"].get("action"), o["req"].get("params_json"), o["req"].get("intent_id"))
                for o in h.ops if o["rpc"] == "RequestToken"}
    granted_by = min((g.first["end"] for g in h.grants.values()), default=None)
    for op in h.ops:
        check_error_allowed(report, key, op)
        why = reason(op)
        if why == "IDEMPOTENCY_KEY_REUSED" and op["rpc"] == "RequestToken" and len(requests) == 1:
            report.add("disallowed_error", key, "IDEMPOTENCY_KEY_REUSED for a key only ever asked with "
                       "one request", op)
        if why == "TOKEN_UNKNOWN" and granted_by is not None and granted_by < op["start"]:
            report.add("disallowed_error", key, f"{op['rpc']} answered TOKEN_UNKNOWN after a grant of "
                       "this key was acknowledged: the record was lost", op)


def ordered(h: KeyHistory) -> list[Grant]:
    return sorted(h.grants.values(), key=lambda g: g.fencing)


def check_fencing(report: Report, key: Key, h: KeyHistory) -> None:
    grants = ordered(h)
    for a, b in zip(grants, grants[1:]):
        if a.fencing == b.fencing:
            report.add("fencing_order", key, f"tokens {a.token} and {b.token} share fencing {a.fencing}",
                       a.first, b.first)
    for a in grants:
        for b in grants:
            if a.first["end"] < b.asked_from and a.fencing >= b.fencing:
                report.add("fencing_order", key, f"grant {b.token} (fencing {b.fencing}) came after grant "
                           f"{a.token} (fencing {a.fencing}) but its fencing is not higher", a.first, b.first)


def release_started(h: KeyHistory, token: str) -> float | None:
    starts = [o["start"] for o in h.ops if o["rpc"] == "Release" and o["req"].get("token") == token]
    return min(starts, default=None)


def granted_after(a: Grant, b: Grant) -> bool:
    """Whether b's grant came after a's: certainly (b was asked after a's reply), or, for
    concurrent calls, as their fencing says (when fencing lies, ``fencing_order`` reports it)."""
    if b.asked_from >= a.first["end"]:
        return True
    return b.fencing > a.fencing and a.asked_from < b.first["end"]


def check_overlap(report: Report, key: Key, h: KeyHistory) -> None:
    for a in h.grants.values():
        released = release_started(h, a.token)
        for b in h.grants.values():
            if a is b or not granted_after(a, b):
                continue
            granted_by = b.first["end"]
            if granted_by < a.lease_end - EPS and (released is None or released > granted_by):
                report.add("overlapping_grant", key, f"token {b.token} (fencing {b.fencing}) granted by "
                           f"{granted_by:.3f} while token {a.token} (fencing {a.fencing}) was leased until "
                           f"{a.lease_end:.3f} and not released", a.first, b.first)


def completions(h: KeyHistory) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(op, completion) for every reply that shows the key's stored completion."""
    found = []
    for op in h.ops:
        reply = op.get("reply") or {}
        if op["ok"] and op["rpc"] in ("Complete", "RecordExternalCompletion", "ResolveExpired", "RequestToken"):
            if reply.get("completion"):
                found.append((op, reply["completion"]))
    return found


def check_completions(report: Report, key: Key, h: KeyHistory, listed: set[Key]) -> None:
    seen = completions(h)
    if not seen:
        return
    first_op, first = min(seen, key=lambda pair: pair[0]["end"])
    for op, c in seen:
        if (c.get("receipt"), c.get("fencing"), c.get("source")) != (
                first.get("receipt"), first.get("fencing"), first.get("source")):
            report.add("lost_completion", key, "two different completions reported", first_op, op)
    acked = first_op["end"]
    for op in h.ops:
        if op["start"] <= acked:
            continue
        why = reason(op)
        if op["rpc"] == "RequestToken" and (
                (op["ok"] and (op.get("reply") or {}).get("grant"))
                or why in ("IDEMPOTENCY_IN_PROGRESS", "LEASE_EXPIRED_UNRESOLVED")):
            report.add("lost_completion", key, "RequestToken after an acknowledged completion was not "
                       "answered with it", first_op, op)
        elif op["rpc"] in ("Release", "ExtendLease") and op["ok"]:
            report.add("lost_completion", key, f"{op['rpc']} succeeded after an acknowledged completion",
                       first_op, op)
    if key in listed:
        report.add("lost_completion", key, "listed as unresolved at the end after an acknowledged completion",
                   first_op)


def evidence(h: KeyHistory) -> list[dict[str, Any]]:
    """Replies showing the gate flagged a double execution: COMPLETED_BY_OTHER, or a Complete
    accepted for a token older than the newest grant given out before it (superseded)."""
    found = []
    for op in h.ops:
        if op["rpc"] != "Complete":
            continue
        if reason(op) == "COMPLETED_BY_OTHER":
            found.append(op)
        elif op["ok"]:
            fencing = int(op["reply"]["completion"].get("fencing", 0))
            newer = [g for g in h.grants.values() if g.fencing > fencing and g.first["end"] < op["start"]]
            if newer and op["reply"]["completion"].get("token") == op["req"].get("token"):
                found.append(op)
    return found


def check_executions(report: Report, key: Key, h: KeyHistory, regrant_actions: set[str] | None) -> None:
    tokens = sorted(h.executions, key=lambda t: h.executions[t][0]["fencing"])
    for a, b in zip(tokens, tokens[1:]):
        ga, gb = h.grants.get(a), h.grants.get(b)
        first_a, first_b = h.executions[a][0], h.executions[b][0]
        if ga is None or gb is None:
            report.add("double_execution", key, "a token executed that no grant reply shows", first_a, first_b)
            continue
        regrant = (regrant_actions is None or gb.action in regrant_actions) and gb.first["end"] >= ga.lease_end - EPS
        operator = any(o["rpc"] in ("ResolveExpired", "RecordExternalCompletion") and ga.asked_from <= o["start"]
                       and o["start"] <= gb.first["end"] for o in h.ops)
        if not (regrant or operator):
            report.add("double_execution", key, f"tokens {a} and {b} both executed and neither a regrant nor "
                       "an operator allowed the second", first_a, first_b, ga.first, gb.first)
            continue
        answered = {t: [o for o in h.ops if o["rpc"] == "Complete" and o["req"].get("token") == t
                        and not unknown_outcome(o)] for t in (a, b)}
        if answered[a] and answered[b] and all(o["ok"] for t in (a, b) for o in answered[t]) and not evidence(h):
            report.add("double_execution", key, f"tokens {a} and {b} both executed and both Completes were "
                       "accepted without the double execution being flagged", *answered[a], *answered[b])


def known_unsettled(h: KeyHistory, g: Grant) -> bool:
    for op in h.ops:
        rpc, token = op["rpc"], op["req"].get("token")
        if rpc in ("Complete", "Release") and token == g.token:
            return False
        if rpc == "Complete" and (op["ok"] or unknown_outcome(op) or reason(op) == "COMPLETED_BY_OTHER"):
            return False
        if rpc in ("ResolveExpired", "RecordExternalCompletion") and op["start"] >= g.asked_from:
            return False
    return not completions(h)


def check_listing(report: Report, keys: dict[Key, KeyHistory], final: dict[str, Any] | None,
                  listed: set[Key]) -> None:
    if final is None or not final.get("complete"):
        if any(g for h in keys.values() for g in h.grants.values()):
            report.add("unresolved_not_listed", None, "no complete final ListUnresolved in the history",
                       *([final] if final else []))
        return
    for key, h in keys.items():
        for g in h.grants.values():
            if key not in listed and known_unsettled(h, g):
                report.add("unresolved_not_listed", key, f"token {g.token} (fencing {g.fencing}) was never "
                           "settled and is not listed by ListUnresolved at the end", g.first, final)
                break


def check_resolver_left(report: Report, events: list[dict[str, Any]], final: dict[str, Any] | None) -> None:
    if final is None:
        return
    answers: dict[str, set[str]] = defaultdict(set)
    for e in events:
        if e.get("t") == "lookup":
            answers[e["provider_key"]].add(e["answer"])
    for key, provider_key in zip(final["keys"], final.get("provider_keys", [])):
        if answers.get(provider_key) != {"unknown"}:
            told = sorted(answers.get(provider_key, set())) or ["nothing: never looked up"]
            report.add("resolver_left_answerable", tuple(key), f"left unresolved although the provider "  # type: ignore[arg-type]
                       f"answered {', '.join(told)} for provider key {provider_key}", final)


def main() -> int:
    """``python -m soaklib.checker HISTORY.jsonl``: the summary, exit 1 on any violation."""
    import sys

    from soaklib.summary import summary

    events = load(Path(sys.argv[1]))
    report = check(events)
    print(summary(events, report, title=sys.argv[1]))
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
