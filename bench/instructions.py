#!/usr/bin/env python3
"""Instructions per cycle under callgrind: the `instructions` scenario of `make bench` (and
Redis's table in `all`).

Seconds of CPU per call move by a third between runs on shared 2-core machines, too much to see a
change of a few µs; instructions barely move (within about 2% between runs of one build). Two
counts, each the difference of two runs of different sizes divided by the difference of their
sizes, so that connecting, loading and warming up cancel out:

- Redis's own instructions per cycle (`redis`), Redis under `valgrind --tool=callgrind`, one
  sequential caller: `powertools` (AWS Lambda Powertools' `@idempotent_function`, its two
  commands; needs the bench's virtualenv), `in-process` (the oncegate decorator with its gate in
  process, unsigned), `gate-unsigned` and `gate-signed` (a gate server loaded by `oncegate bench
  --scenario grant-complete --concurrency 1`, without and with a signing key; the signed gate
  also seals its chain once per `--seal-interval`, which valgrind's slowdown spreads over fewer
  pairs). Redis's user-space instructions only: the kernel's share of its socket calls is not in
  it.
- The gate's own instructions per grant-complete pair (`gate`), the gate under callgrind (every
  thread, the signing thread included) on a plain Redis, 32 callers (`--callers`), unsigned and
  signed, and the functions whose own instructions differ most between the two. Valgrind hides the CPU's SHA
  extensions and aws-lc's ADX/BMI2 paths, so hashing and signatures weigh more here than natively.

Usage: `.venv-bench/bin/python bench/instructions.py [--bin target/dist/oncegate] [--part redis]
[--part gate] [--only NAME ...] [--json] [--keep DIR]`. Every process it starts is killed at the
end.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import DEFAULT_BIN, Gate, Redis, run, signing_key

REDIS_ROWS = {
    "powertools": "AWS Lambda Powertools `@idempotent_function` (its two commands)",
    "in-process": "the oncegate decorator, its gate in process, unsigned",
    "gate-unsigned": "a gate server, unsigned: `oncegate bench --scenario grant-complete "
                     "--concurrency 1`",
    "gate-signed": "the same, signing (and sealing its chain every 50 ms)",
}

ROOTS = re.compile(r"start_thread|clone\.S|thread_start|call_once\{\{vtable\.shim\}\}|"
                   r"__rust_begin_short_backtrace|libc_start|below main|lang_start|block_on|"
                   r"enter_runtime|^\?\?\?:main$|oncegate::main|^\?\?\?:0x")
"""Frames callgrind_annotate charges a whole thread to (thread and program entry points): left out
of the gate's listing, which is about the functions that do the work."""


SLOW = ["--no-admin-socket", "--store-timeout-ms", "30000"]
"""A gate's flags here: under valgrind (the gate, or the Redis it calls) a call or a connection
takes many times its usual time, and the default store timeout would fail it."""


class Callgrind:
    """Counters of a process under callgrind: zeroed, then dumped into a new file."""

    def __init__(self, out: Path):
        self.out = out

    def wrapper(self) -> list:
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}"]

    def count(self, pid: int, work) -> tuple:
        """(instructions, dump file) of process `pid` while `work()` ran."""
        before = set(self.out.parent.glob(f"{self.out.name}.*"))
        run(["callgrind_control", "-z", str(pid)], timeout=120)
        work()
        run(["callgrind_control", "-d", str(pid)], timeout=120)
        for _ in range(300):
            for dump in set(self.out.parent.glob(f"{self.out.name}.*")) - before:
                found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
                if found:
                    return int(found.group(1)), dump
            time.sleep(0.1)
        raise RuntimeError("callgrind wrote no dump")


def python_runner(name: str, redis_url: str, tmp: Path):
    """A function running n cycles of a Python contender in this process (set up, warm)."""
    import python_cycles

    python_cycles.SCRATCH = str(tmp)  # the gate in process keeps its directory there
    if name == "powertools":
        cycle = python_cycles.powertools_cycle(redis_url)
    else:
        cycle = python_cycles.in_process_cycle(redis_url)
    counter = iter(range(10**9))
    for _ in range(20):
        cycle(next(counter))

    def work(n: int) -> None:
        for _ in range(n):
            cycle(next(counter))

    return work, lambda: None


def gate_runner(name: str, redis_url: str, binary: str, tmp: Path):
    """A function running n grant-complete pairs, one at a time, through a gate on `redis_url`."""
    signing = ["--signing-key", signing_key(binary, tmp)] if name == "gate-signed" else ["--unsigned"]
    gate = Gate(binary, redis_url=redis_url, extra=[*SLOW, *signing])

    def work(n: int) -> None:
        gate.load("grant-complete", "--concurrency", 1, "--warmup", 0, "--duration", 600,
                  "--actions", n)

    work(20)
    return work, gate.stop


def redis_part(opts, tmp: Path) -> dict:
    """Redis's instructions per cycle by contender, with its commands per cycle."""
    low, high = sorted(opts.cycles)
    callgrind = Callgrind(tmp / "redis.callgrind")
    redis = Redis(tmp, wrapper=callgrind.wrapper())
    rows = {}
    try:
        for name in opts.only or REDIS_ROWS:
            if name.startswith("gate-"):
                work, done = gate_runner(name, redis.url(), opts.bin, tmp)
            else:
                work, done = python_runner(name, redis.url(), tmp)
            try:
                small, _ = callgrind.count(redis.proc.pid, lambda: work(low))
                redis.cli("CONFIG", "RESETSTAT")
                big, dump = callgrind.count(redis.proc.pid, lambda: work(high))
                calls = redis.commands()
            finally:
                done()
            if opts.keep:
                opts.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(dump, opts.keep / f"redis.{name}.callgrind")
            rows[name] = {"instructions_per_cycle": (big - small) / (high - low),
                          "commands_per_cycle": {c: n / high for c, n in calls.items()
                                                 if c not in ("config", "info")}}
            print(f"Redis, {name}: {rows[name]['instructions_per_cycle']:,.0f} instructions per "
                  "cycle", file=sys.stderr, flush=True)
    finally:
        redis.stop()
    return rows


def functions(dump: Path) -> dict:
    """function → its own instructions, from callgrind_annotate."""
    out = run(["callgrind_annotate", "--inclusive=no", "--threshold=100", str(dump)])
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if m:
            name = re.sub(r"\s*\[.*\]$", "", m.group(2))
            found[name] = found.get(name, 0) + int(m.group(1).replace(",", ""))
    return found


def gate_part(opts, tmp: Path) -> dict:
    """The gate's own instructions per grant-complete pair, unsigned and signed, and its
    functions' own instructions per pair."""
    low, high = sorted(opts.pairs)
    redis = Redis(tmp)
    rows = {}
    try:
        for mode in ("unsigned", "signed"):
            callgrind = Callgrind(tmp / f"gate-{mode}.callgrind")
            signing = ["--unsigned"] if mode == "unsigned" else ["--signing-key",
                                                                 signing_key(opts.bin, tmp)]
            gate = Gate(opts.bin, redis_url=redis.url(), extra=[*SLOW, *signing],
                        wrapper=callgrind.wrapper())
            try:
                load = lambda n: gate.load("grant-complete", "--concurrency", opts.callers, "--duration",
                                           600, "--warmup", 0, "--actions", n, timeout=900)
                load(low)  # warm-up: connections, caches, the runtime's threads
                small, _ = callgrind.count(gate.proc.pid, lambda: load(low))
                big, dump = callgrind.count(gate.proc.pid, lambda: load(high))
            finally:
                gate.stop()
            if opts.keep:
                opts.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(dump, opts.keep / f"gate.{mode}.callgrind")
            rows[mode] = {"instructions_per_pair": (big - small) / (high - low),
                          "functions": {f: n / high for f, n in functions(dump).items()}}
            print(f"gate, {mode}: {rows[mode]['instructions_per_pair']:,.0f} instructions per pair",
                  file=sys.stderr, flush=True)
    finally:
        redis.stop()
    return rows


def redis_table(rows: dict) -> list:
    if not rows:
        return ["", "Redis instructions per cycle: skipped (--no-instructions, or no valgrind)."]
    first = next(iter(rows.values()))["instructions_per_cycle"]
    lines = ["", "Redis's own instructions per cycle, one sequential caller, Redis under callgrind "
             "(`bench/instructions.py`: within about 2% on every run of the same build, where "
             "seconds move by a third; Redis's timer work and the gate's seals run by time, not "
             "by cycle; the kernel's share of Redis's socket calls is not in it):", "",
             "| contender | instructions per cycle | ÷ first row | FCALLs per cycle | commands run per "
             "cycle, the functions' included |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, row in rows.items():
        calls = row["commands_per_cycle"]
        ran = sum(n for c, n in calls.items() if c != "fcall" and not c.startswith("config"))
        lines.append(f"| {REDIS_ROWS.get(name, name)} | {row['instructions_per_cycle']:,.0f} | "
                     f"{row['instructions_per_cycle'] / first:.2f} | {calls.get('fcall', 0):.2f} | "
                     f"{ran:.2f} |")
    if "gate-signed" in rows and "gate-unsigned" in rows:
        ratio = (rows["gate-signed"]["instructions_per_cycle"]
                 / rows["gate-unsigned"]["instructions_per_cycle"])
        lines += ["", f"- Redis instructions per grant-complete pair, signed ÷ unsigned: {ratio:.2f} "
                  f"(target ≤ 1.2: {'met' if ratio <= 1.2 else 'MISSED'})"]
    return lines


def gate_table(rows: dict, top: int, callers: int) -> list:
    if not rows:
        return []
    u, s = rows["unsigned"], rows["signed"]
    lines = ["", f"The gate's own instructions per grant-complete pair, {callers} callers, on Redis, under "
             f"callgrind: unsigned {u['instructions_per_pair']:,.0f}, signed "
             f"{s['instructions_per_pair']:,.0f} "
             f"({s['instructions_per_pair'] / u['instructions_per_pair']:.2f}×). The functions "
             "whose own instructions per pair differ most:", "",
             "| signed − unsigned | unsigned | signed | function |", "| ---: | ---: | ---: | --- |"]
    uf, sf = u["functions"], s["functions"]
    names = sorted((n for n in set(uf) | set(sf) if not ROOTS.search(n)),
                   key=lambda n: -(sf.get(n, 0) - uf.get(n, 0)))
    for name in names[:top]:
        a, b = uf.get(name, 0), sf.get(name, 0)
        lines.append(f"| {b - a:,.0f} | {a:,.0f} | {b:,.0f} | `{name[:120]}` |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(DEFAULT_BIN))
    parser.add_argument("--part", choices=["redis", "gate"], action="append",
                        help="what to count (repeatable; default both)")
    parser.add_argument("--cycles", type=int, nargs=2, default=[400, 1200],
                        help="the two sizes of Redis's runs")
    parser.add_argument("--pairs", type=int, nargs=2, default=[500, 2000],
                        help="the two sizes of the gate's runs")
    parser.add_argument("--only", choices=list(REDIS_ROWS), action="append",
                        help="Redis's contenders to count (repeatable; default every one)")
    parser.add_argument("--callers", type=int, default=32,
                        help="the gate's count: concurrent callers of its load (default 32)")
    parser.add_argument("--top", type=int, default=15, help="the gate's functions listed")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.add_argument("--keep", type=Path, help="copy each longer run's dump into this directory")
    opts = parser.parse_args()
    if len(set(opts.cycles)) < 2 or len(set(opts.pairs)) < 2:
        parser.error("--cycles and --pairs need two different sizes each")
    if not shutil.which("valgrind"):
        sys.exit("valgrind not found (make bench installs it on Debian)")
    parts = opts.part or ["redis", "gate"]
    with tempfile.TemporaryDirectory(prefix="oncegate-instructions-") as tmp:
        found = {"redis": redis_part(opts, Path(tmp)) if "redis" in parts else {},
                 "gate": gate_part(opts, Path(tmp)) if "gate" in parts else {}}
    if opts.json:
        print(json.dumps(found))
        return
    print("\n".join(redis_table(found["redis"]) + gate_table(found["gate"], opts.top, opts.callers)))


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as error:
        sys.exit(f"{error}\n{error.stdout[-3000:]}\n{error.stderr}")
