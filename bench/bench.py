#!/usr/bin/env python3
"""`make bench`: the gate against the physical limit and beside its peers, on this machine.

One entry point, one scenario per run (bench/README.md says what each measures):

- `all` (the default): `stores` and the Python rows interleaved round by round, Redis's memory per
  completed action and Redis's instructions per cycle; written into BENCHMARKS.md between its
  markers;
- `stores`: the redis-benchmark limit, the gate on Redis and on the embedded store (every
  scenario; signed and unsigned; with rules and budgets), this disk's fdatasync, Redis's memory;
- `python`: the Python rows beside Powertools and the seeds' authorizer;
- `signing`: each store's signed and unsigned grant-complete rows, paired;
- `instructions`: Redis's instructions per cycle and the gate's per pair, under callgrind;
- `ab`: two builds (`--a`, `--b`) interleaved, signed and unsigned, and under the Python rows.

Measures target/dist/oncegate by default (the `dist` profile: what the Docker image and `make
dist` ship) and says which profile and binary it measured. Python standard library only (the
Python rows run in the bench's own virtualenv). Every process it starts is its own, on loopback,
and is killed at the end.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ab
import python_side
import stores
from harness import DEFAULT_BIN, ROOT, Gate, Redis, machine, run, write_benchmarks
from instructions import redis_table

SCENARIOS = ["all", "stores", "python", "signing", "instructions", "ab"]


class Started(list):
    """The gates a scenario started, stopped together at its end."""

    def __init__(self, binary):
        super().__init__()
        self.binary = binary

    def __call__(self, **kwargs) -> Gate:
        self.append(Gate(self.binary, **kwargs))
        return self[-1]

    def stop(self) -> None:
        while self:
            self.pop().stop()


def has_python(opts) -> bool:
    return opts.python_seconds > 0 and Path(opts.python).exists()


def measure_stores(opts, tmp, redis, with_python) -> dict:
    """`stores` (and, `with_python`, the Python rows once per round): every figure of the run."""
    started = Started(opts.bin)
    found = {"python": []}
    try:
        gates = stores.store_gates(started, opts.bin, redis, tmp)
        each_round = None
        if with_python:
            py_gates = python_side.python_gates(started, opts.bin, redis, tmp, opts)
            each_round = lambda i: found["python"].append(
                python_side.python_round(redis, py_gates, opts))
        found["fsync"] = stores.fsync_latency(os.path.join(tmp, "embedded"))
        found["lim"], found["results"] = stores.rounds(redis, gates, opts, each_round=each_round)
    finally:
        started.stop()
    found["mem"] = stores.measure_memory(opts.bin, redis, opts)
    return found


def stores_lines(found, opts) -> list:
    return [*stores.rows_table(found["lim"], found["results"]),
            *stores.targets(found["lim"], found["results"], found["fsync"], opts),
            *stores.signing_lines(found["results"]), *stores.authorization_lines(found["results"]),
            *stores.memory_lines(found["mem"])]


def instructions(opts, *args) -> str:
    """instructions.py's output. Powertools and the gate in process need the bench's virtualenv;
    without it, Redis's instructions are counted for the gate's rows alone."""
    venv = Path(opts.python).exists()
    only = [] if venv else ["--only", "gate-unsigned", "--only", "gate-signed"]
    return run([opts.python if venv else sys.executable, str(ROOT / "bench" / "instructions.py"),
                "--bin", str(opts.bin), *only, *args], timeout=3600)


def redis_instructions(opts) -> dict:
    """Redis's instructions per cycle, or {} when skipped or without valgrind."""
    if opts.no_instructions or not shutil.which("valgrind"):
        return {}
    print("Redis instructions per cycle (callgrind):", flush=True)
    return json.loads(instructions(opts, "--part", "redis", "--json").strip().splitlines()[-1])["redis"]


def scenario_lines(opts) -> list:
    """Runs the scenario: its result lines."""
    if opts.scenario == "ab":
        return ab.ab(opts)
    if opts.scenario == "instructions":
        return instructions(opts).splitlines()
    with tempfile.TemporaryDirectory(prefix="oncegate-bench-") as tmp:
        redis = Redis(tmp)
        try:
            if opts.scenario == "python":
                started = Started(opts.bin)
                try:
                    gates = python_side.python_gates(started, opts.bin, redis, tmp, opts)
                    python = []
                    for i in range(opts.runs if has_python(opts) else 0):
                        print(f"round {i + 1} of {opts.runs}", flush=True)
                        python.append(python_side.python_round(redis, gates, opts))
                finally:
                    started.stop()
                return python_side.python_table(python, opts)
            if opts.scenario == "signing":
                started = Started(opts.bin)
                try:
                    gates = stores.store_gates(started, opts.bin, redis, tmp, signing_only=True)
                    lim, results = stores.rounds(redis, gates, opts, limit=False)
                finally:
                    started.stop()
                return [*stores.rows_table(lim, results), "", *stores.signing_lines(results)]
            found = measure_stores(opts, tmp, redis, opts.scenario == "all" and has_python(opts))
        finally:
            redis.stop()
    lines = stores_lines(found, opts)
    if opts.scenario == "all":
        lines += python_side.python_table(found["python"], opts)
        lines += redis_table(redis_instructions(opts))
    return lines


def header(opts, info, began, load_before) -> list:
    load_after = os.getloadavg()
    command = shlex.join(["python3", "bench/bench.py", *sys.argv[1:]])
    if opts.scenario == "all":
        command = "make bench  # = " + command
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))} in "
        f"{time.time() - began:.0f} s with:", "", "```sh", command, "```", "",
        f"- machine: {info['cores']} cores, {info['cpu']}, Linux {info['kernel']}; load generator, "
        "gate and Redis share the cores",
        f"- load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f}"
        + (f"; {opts.note}" if opts.note else ""),
        f"- {info['rustc']}; {info['redis']}; oncegate {info['commit']}, built with the "
        f"{info['build']}",
    ]
    if opts.scenario in ("all", "stores", "signing"):
        signing = opts.scenario == "signing"
        lines += [
            f"- {opts.concurrency} concurrent callers ({opts.connections} HTTP/2 connection(s))"
            + ("" if signing else f" and redis-benchmark -c {opts.concurrency}")
            + f"; medians of {opts.runs} runs of {opts.duration:g} s (gate runs after "
            f"{opts.warmup:g} s warm-up), and of {2 * opts.runs} for each store's signed and "
            "unsigned grant-complete rows (four runs back to back per round, U S S U or S U U S); "
            "Redis without persistence (--save '' --appendonly no); gate logging at its default "
            "(info, audit events on, stderr discarded); the gate on Redis serves unsigned (no "
            "--signing-key), the gate on the embedded store signs (the key it generates); one row "
            "each the other way round" + ("" if signing else ", and one each with the rules and "
                                          "budgets of bench/authorization.toml"),
            "- CPU µs per call: CPU time each process used during a run (warm-up included) "
            "divided by the calls made in it; the load generator is `oncegate bench`"
            + ("" if signing else " (or redis-benchmark for the limit)")]
    return lines + ["", ""]


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="all", choices=SCENARIOS)
    parser.add_argument("--bin", default=str(DEFAULT_BIN),
                        help="the oncegate binary to measure (default: this checkout's dist build)")
    parser.add_argument("--a", help="ab: the build before the change")
    parser.add_argument("--b", help="ab: the build after it")
    parser.add_argument("--runs", type=int, default=3,
                        help="rounds; medians are quoted (default 3)")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per gate run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--memory-actions", type=int, default=100_000)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"),
                        help="all: the file its results block is written into")
    parser.add_argument("--note", default="", help="conditions to record (e.g. 'machine busy')")
    parser.add_argument("--python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                        help="the bench virtualenv's python (Powertools, redis-py, the oncegate "
                             "client)")
    parser.add_argument("--python-workers", type=int, default=8)
    parser.add_argument("--python-seconds", type=float, default=4.0,
                        help="seconds per Python row per round; 0 skips the Python rows")
    parser.add_argument("--python-rows", action="append",
                        help="ab: the Python rows compared (repeatable; default "
                             "oncegate-native-stubs and oncegate-decorator)")
    parser.add_argument("--gate-args", default="",
                        help="extra `oncegate serve` flags for the Python rows' gates (none by "
                             "default: a user's gate runs at its defaults)")
    parser.add_argument("--gate-log", choices=["discard", "pipe"], default="discard",
                        help="ab: the Python rows' gates' standard error, discarded or read "
                             "through a pipe as a log collector would")
    parser.add_argument("--no-instructions", action="store_true",
                        help="all: skip counting Redis's instructions per cycle under callgrind")
    opts = parser.parse_args()
    opts.python_rows = opts.python_rows or ["oncegate-native-stubs", "oncegate-decorator"]
    opts.bin = Path(opts.bin).resolve()
    return opts


def main() -> None:
    opts = options()
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (make deps installs it on Debian)")
    if opts.scenario == "ab":
        ab.check(opts)
        opts.bin = Path(opts.b).resolve()
    elif not opts.bin.exists():
        sys.exit(f"{opts.bin} not found: build it with cargo build --profile dist --bin oncegate")
    began, load_before = time.time(), os.getloadavg()
    info = machine(opts.bin)
    try:
        lines = scenario_lines(opts)
    except subprocess.CalledProcessError as error:
        sys.exit(f"{shlex.join(map(str, error.cmd))} failed:\n{error.stdout[-3000:]}\n"
                 f"{error.stderr}")
    text = "\n".join(header(opts, info, began, load_before) + lines)
    print("\n" + text)
    if opts.scenario == "all":
        write_benchmarks(text, Path(opts.out))
        print(f"\nwritten to {opts.out}")


if __name__ == "__main__":
    main()
