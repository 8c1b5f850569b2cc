#!/usr/bin/env python3
"""Two oncegate binaries, before and after a change, under the Python rows of `make bench`
(scripts/bench_python.py: 8 worker processes, one call at a time each, the native client sending
its deadline as `grpc-timeout`), interleaved in one window: per round and binary, a fresh Redis
and a gate on it, then the chosen rows. Prints one line per round and binary (cycles/s, and the
client's, gate's and Redis's CPU µs per cycle), the medians and, with the `powertools` row, each
other row's cycles/s ÷ Powertools' of the same run, round by round.

Usage: scripts/bench_python_ab.py BEFORE AFTER [--rounds 4] [--seconds 4]
       [--only oncegate-native-stubs] [--python .venv/bin/python] [--gate-args "--worker-threads 1"]
       [--gate-log pipe]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402  (scripts/bench.py: its Redis and Gate)


def one_run(binary: str, opts: argparse.Namespace) -> dict[str, dict[str, float]]:
    """A fresh Redis and an unsigned gate on it (`binary`), and the rows run against them."""
    with tempfile.TemporaryDirectory(prefix="bench-python-ab-") as tmp:
        redis = bench.Redis(tmp)
        try:
            bench.BIN = binary
            gate = bench.Gate(
                redis_url=redis.url(),
                extra=["--unsigned", *opts.gate_args.split()],
                log=opts.gate_log,
            )
            try:
                command = [
                    opts.python, str(HERE / "bench_python.py"),
                    "--redis-url", redis.url(), "--gate", gate.addr,
                    "--gate-pid", str(gate.proc.pid), "--redis-pid", str(redis.proc.pid),
                    "--workers", str(opts.workers), "--seconds", str(opts.seconds),
                ]  # fmt: skip
                for row in opts.only:
                    command += ["--only", row]
                return json.loads(bench.run(command, timeout=600))
            finally:
                gate.stop()
        finally:
            redis.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", help="the oncegate binary before the change")
    parser.add_argument("after", help="the oncegate binary after it")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per row")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--gate-log",
        choices=["discard", "pipe"],
        default="discard",
        help="the gates' standard error: /dev/null as in `make bench` (discard), or a pipe this "
        "script reads and drops, as a log collector would (pipe)",
    )
    parser.add_argument("--only", action="append", help="a row of bench_python.py (repeatable)")
    parser.add_argument(
        "--python",
        default=str(HERE.parent / ".venv" / "bin" / "python"),
        help="a virtualenv with the oncegate client (and Powertools, for its row)",
    )
    parser.add_argument("--gate-args", default="", help="extra `oncegate serve` flags for both gates")
    opts = parser.parse_args()
    opts.only = opts.only or ["oncegate-native-stubs", "oncegate-decorator"]
    measured: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(1, opts.rounds + 1):
        # Alternate which binary goes first, so neither always runs on a warmer machine.
        order = ["before", "after"] if round_ % 2 else ["after", "before"]
        for name in order:
            rows = one_run(getattr(opts, name), opts)
            for row in opts.only:
                result = rows[row]
                measured.setdefault((row, name), []).append(result)
                print(f"round {round_} {name:6} {row}: {describe(result)}", flush=True)
    print("medians:")
    for (row, name), results in measured.items():
        medians = {key: statistics.median(r[key] for r in results) for key in results[0] if key in FIELDS}
        print(f"  {row} {name:6}: {describe(medians)}")
    if "powertools" in opts.only:
        # Each row against Powertools of the same run (same Redis, same minute): the ratio the
        # bench reports, round by round, since the machine's speed moves between rounds.
        print("÷ powertools, per round (median):")
        for row in [r for r in opts.only if r != "powertools"]:
            for name in ("before", "after"):
                ratios = [
                    mine["cycles_per_s"] / theirs["cycles_per_s"]
                    for mine, theirs in zip(measured[(row, name)], measured[("powertools", name)])
                ]
                listed = ", ".join(f"{r:.3f}" for r in ratios)
                print(f"  {row} {name:6}: {listed} ({statistics.median(ratios):.3f})")
    return 0


FIELDS = ["cycles_per_s", "client_cpu_us_per_cycle", "gate_cpu_us_per_cycle", "redis_cpu_us_per_cycle"]


def describe(result: dict[str, float]) -> str:
    return ", ".join(f"{key} {result[key]:,.0f}" for key in FIELDS if key in result)


if __name__ == "__main__":
    sys.exit(main())
