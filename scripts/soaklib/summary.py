"""The soak's summary of a history and its checker report: operations, faults by kind, violations
by rule (with the events that break each, the first few), and availability per fault window.

Availability of a window is the share of the calls that overlap it (started before it ended and
ended after it began) which the gate answered OK, and the share it answered definitely (OK or a
refusal the state machine decides, as opposed to ``STORE_UNAVAILABLE``, ``INTERNAL`` or a transport
failure). Calls that overlap no fault are the ``no fault`` row.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from typing import Any

from soaklib.checker import RULES, Report

SHOWN_PER_RULE = 3


def _definite(op: dict[str, Any]) -> bool:
    if op["ok"]:
        return True
    return (op.get("error") or {}).get("reason") not in (None, "STORE_UNAVAILABLE", "INTERNAL")


def availability(events: list[dict[str, Any]]) -> dict[str, tuple[int, float, float]]:
    """Per fault kind (and ``no fault``): (calls, share OK, share answered definitely)."""
    faults = [e for e in events if e.get("t") == "nemesis"]
    ops = [e for e in events if e.get("t") == "op"]
    rows: dict[str, list[dict[str, Any]]] = {}
    for op in ops:
        kinds = {f["kind"] for f in faults if op["start"] < f["end"] and op["end"] > f["start"]}
        for kind in kinds or {"no fault"}:
            rows.setdefault(kind, []).append(op)
    return {
        kind: (len(calls), sum(o["ok"] for o in calls) / len(calls), sum(map(_definite, calls)) / len(calls))
        for kind, calls in sorted(rows.items())
    }


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile of sorted ``values``."""
    return values[min(len(values) - 1, max(0, math.ceil(share * len(values)) - 1))]


def settlement_latency(events: list[dict[str, Any]]) -> str | None:
    """Resolver runs: how the resolvers' settlements went, and lease end → settlement."""
    resolutions = [e for e in events if e.get("t") == "resolution"]
    if not resolutions:
        return None
    by = Counter(e["settled"] for e in resolutions)
    waits = sorted(e["time"] - e["lease_expired_at"] for e in resolutions
                   if e["settled"] in ("completed", "failed") and e.get("lease_expired_at") is not None)
    line = f"resolver settlements: {', '.join(f'{k} {v}' for k, v in by.most_common())}"
    if waits:
        line += (f"; lease end → settlement: median {statistics.median(waits):.2f}s, "
                 f"p99 {percentile(waits, 0.99):.2f}s, max {waits[-1]:.2f}s (n={len(waits)})")
    final = next((e for e in events if e.get("t") == "final_unresolved"), None)
    if final is not None:
        line += f"; left unresolved at the end: {len(final['keys'])}"
    return line


def table_sizes(events: list[dict[str, Any]]) -> list[str]:
    """PostgreSQL runs: each table's size (``pg_total_relation_size``) at the first sample, at
    the quarter marks and at the last, and its largest."""
    samples = sorted((e for e in events if e.get("t") == "table_sizes"), key=lambda e: e["time"])
    if not samples:
        return []
    t0 = samples[0]["time"]
    marks = sorted({0, len(samples) // 4, len(samples) // 2, 3 * len(samples) // 4, len(samples) - 1})
    at = ", ".join(f"{samples[i]['time'] - t0:.0f}s" for i in marks)
    lines = [f"table sizes (pg_total_relation_size, KiB) at {at} of {len(samples)} samples, and the largest"]
    for table in sorted({name for e in samples for name in e["sizes"]}):
        sizes = [e["sizes"].get(table, 0) // 1024 for e in samples]
        lines.append(f"  {table:<32} " + " ".join(f"{sizes[i]:>7}" for i in marks) + f"  max {max(sizes)}")
    return lines


def summary(events: list[dict[str, Any]], report: Report, title: str = "soak") -> str:
    lines = [f"== {title}"]
    run = next((e for e in events if e.get("t") == "run"), {})
    if run:
        lines.append(f"deployment {run.get('deployment')}, seed {run.get('seed')}, "
                     f"duration {run.get('duration')}s, gates {len(run.get('gates', []))}")
    ops = [e for e in events if e.get("t") == "op"]
    by_rpc = Counter(o["rpc"] for o in ops)
    answers = Counter("OK" if o["ok"] else (o["error"].get("reason") or o["error"].get("code")) for o in ops)
    lines.append(f"operations: {len(ops)} ({', '.join(f'{k} {v}' for k, v in by_rpc.most_common())})")
    lines.append(f"answers: {', '.join(f'{k} {v}' for k, v in answers.most_common())}")
    verdicts = Counter(e["verdict"] for e in events if e.get("t") == "guard")
    lines.append(f"guarded attempts: {sum(verdicts.values())} ({', '.join(f'{k} {v}' for k, v in verdicts.most_common())})")
    s = report.stats
    lines.append(f"provider: {s.get('executions', 0)} executions, {s.get('effects', 0)} effects, "
                 f"{s.get('keys', 0)} action keys; keys executed by two tokens (allowed): "
                 f"{s.get('double_executions_allowed', 0)}; double executions flagged by the gate in "
                 f"the history: {s.get('double_execution_evidence', 0)}")
    scraped = [e for e in events if e.get("t") == "metrics"]
    if scraped:
        total = sum(sum((e.get("double_executions") or {}).values()) for e in scraped)
        lines.append(f"oncegate_double_executions_total at the end (since each gate's last restart): {total:g}")
    faults = [e for e in events if e.get("t") == "nemesis"]
    by_kind = Counter(f["kind"] for f in faults)
    settle_line = settlement_latency(events)
    if settle_line:
        lines.append(settle_line)
    lines.append(f"faults: {len(faults)} ({', '.join(f'{k} {v}' for k, v in sorted(by_kind.items()))})")
    lines.extend(table_sizes(events))
    lines.append("availability per fault window: kind, calls, answered OK, answered definitely")
    for kind, (calls, ok, definite) in availability(events).items():
        lines.append(f"  {kind:<14} {calls:>7} {ok:>8.1%} {definite:>8.1%}")
    counts = Counter(v.rule for v in report.violations)
    lines.append("violations: " + ", ".join(f"{rule} {counts.get(rule, 0)}" for rule in RULES))
    for rule in RULES:
        for v in [v for v in report.violations if v.rule == rule][:SHOWN_PER_RULE]:
            lines.append(f"  [{rule}] {v.key}: {v.message}")
            for e in v.events:
                lines.append("      " + json.dumps(e, sort_keys=True)[:600])
    lines.append("RESULT: " + ("PASS" if not report.violations else f"FAIL ({len(report.violations)} violations)"))
    return "\n".join(lines)
