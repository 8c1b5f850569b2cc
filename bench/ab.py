"""Two oncegate builds, A (before a change) and B (after it), interleaved in one window: the `ab`
scenario of `make bench`.

Per round, A and B in turn (A first in odd rounds, B first in even ones, so that neither always
runs on the warmer machine): grant-complete at the bench's concurrency through a gate of each
build, on the bench's Redis unsigned and signed and on a fresh embedded store unsigned and signed,
loaded by that build's own `oncegate bench`; then, when the bench's virtualenv is there, the
Python rows (python_cycles.py, `--python-rows`) through a gate of each build on Redis at its
defaults. Prints one line per run, then the medians and B ÷ A. Owns the interleaving and the
comparison; processes and meters are harness.py's.
"""

import json
import os
import statistics
import tempfile
from pathlib import Path

from harness import ROOT, Gate, Redis, run, signing_key, timed_load

GATE_ROWS = ["Redis, unsigned", "Redis, signed", "embedded, unsigned", "embedded, signed"]
PYTHON_FIELDS = ["cycles_per_s", "client_cpu_us_per_cycle", "gate_cpu_us_per_cycle",
                 "redis_cpu_us_per_cycle"]


def gate_run(binary, row, redis, tmp, name, opts) -> dict:
    """One grant-complete run through a gate of `binary` in the deployment `row`."""
    signed = row.endswith(", signed")
    signing = ["--signing-key", signing_key(binary, tmp)] if signed else ["--unsigned"]
    store = ({"redis_url": redis.url()} if row.startswith("Redis")
             else {"data_dir": tempfile.mkdtemp(prefix=f"{name}-", dir=tmp)})
    gate = Gate(binary, extra=["--no-admin-socket", *signing], **store)
    try:
        report = timed_load(gate, redis if row.startswith("Redis") else None, "grant-complete",
                            opts)
    finally:
        gate.stop()
    return {"pairs_per_s": report["throughput"]["pairs_per_s"],
            "gate_cpu_us_per_call": report["cpu_us"]["gate"],
            **({"redis_cpu_us_per_call": report["cpu_us"]["redis"]} if "redis" in report["cpu_us"]
               else {})}


def python_run(binary, redis, opts) -> dict:
    """The Python rows through a gate of `binary` on Redis at its defaults."""
    redis.cli("FLUSHALL")
    gate = Gate(binary, redis_url=redis.url(), extra=["--no-admin-socket"], log=opts.gate_log)
    try:
        command = [opts.python, str(ROOT / "bench" / "python_cycles.py"), "--redis-url",
                   redis.url(), "--gate", gate.addr, "--gate-pid", str(gate.proc.pid),
                   "--redis-pid", str(redis.proc.pid), "--workers", str(opts.python_workers),
                   "--seconds", str(opts.python_seconds)]
        for row in opts.python_rows:
            command += ["--only", row]
        return json.loads(run(command, timeout=opts.python_seconds * 4 * len(opts.python_rows)
                              + 300).strip().splitlines()[-1])
    finally:
        gate.stop()


def describe(result: dict) -> str:
    return ", ".join(f"{key} {value:,.1f}" for key, value in result.items())


def compare(measured: dict) -> list:
    """Per row: A's and B's medians of every figure, and B ÷ A."""
    lines = ["", "| row | figure | A | B | B ÷ A |", "| --- | --- | ---: | ---: | ---: |"]
    for row, by_build in measured.items():
        if not by_build["A"] or not by_build["B"]:
            continue
        for field in by_build["A"][0]:
            a = statistics.median(r[field] for r in by_build["A"])
            b = statistics.median(r[field] for r in by_build["B"])
            lines.append(f"| {row} | {field} | {a:,.1f} | {b:,.1f} | "
                         f"{b / a if a else float('nan'):.3f} |")
    return lines


def ab(opts) -> list:
    """The scenario: its lines, ready to print."""
    builds = {"A": str(Path(opts.a).resolve()), "B": str(Path(opts.b).resolve())}
    python = opts.python_seconds > 0 and Path(opts.python).exists()
    rows = [*GATE_ROWS, *(f"Python: {row}" for row in opts.python_rows if python)]
    measured = {row: {"A": [], "B": []} for row in rows}
    with tempfile.TemporaryDirectory(prefix="oncegate-ab-") as tmp:
        redis = Redis(tmp)
        try:
            for i in range(opts.runs):
                order = ["A", "B"] if i % 2 == 0 else ["B", "A"]
                for row in GATE_ROWS:
                    redis.cli("FLUSHALL")
                    for name in order:
                        result = gate_run(builds[name], row, redis, tmp, name, opts)
                        measured[row][name].append(result)
                        print(f"round {i + 1} {name} {row}: {describe(result)}", flush=True)
                for name in order if python else []:
                    results = python_run(builds[name], redis, opts)
                    for row, result in results.items():
                        result = {k: result[k] for k in PYTHON_FIELDS if k in result}
                        measured[f"Python: {row}"][name].append(result)
                        print(f"round {i + 1} {name} Python {row}: {describe(result)}", flush=True)
        finally:
            redis.stop()
    return [f"A: {builds['A']}", f"B: {builds['B']}",
            f"{opts.runs} rounds; grant-complete at {opts.concurrency} callers on "
            f"{opts.connections} connection(s), {opts.duration:g} s after {opts.warmup:g} s; "
            + (f"Python rows in {opts.python_workers} processes, {opts.python_seconds:g} s each"
               if python else f"Python rows skipped ({opts.python} not found, or "
                              "--python-seconds 0)"),
            *compare(measured)]


def check(opts) -> None:
    """Exits with a message unless both builds are given and exist."""
    for name in ("a", "b"):
        binary = getattr(opts, name)
        if not binary or not os.access(binary, os.X_OK):
            raise SystemExit(f"ab needs two oncegate binaries: make bench SCENARIO=ab A=<binary> "
                             f"B=<binary> ({name.upper()}={binary or 'not given'})")
