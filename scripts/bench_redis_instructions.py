#!/usr/bin/env python3
"""What Redis spends per cycle, in instructions: Powertools' commands against the gate's functions.

Redis's CPU per call moves by a third between runs on the shared 2-core machines, too much to see
a change of a few µs in the functions. Instructions barely move (within about 2% between runs of
one build: Redis's timer work and the signed gate's seals run by time): this starts its own redis-server
on a free loopback port under `valgrind --tool=callgrind`, runs each contender for two counts of
cycles from one sequential caller, and prints the instructions Redis executed per cycle (the
difference of the two runs divided by the difference of their counts, so that connecting, loading
the library and warming up cancel out). Redis's own user-space instructions only: the kernel's
share of its socket calls is not counted (every contender here makes two round trips to Redis
per cycle).

Contenders:

- `powertools`: AWS Lambda Powertools' `@idempotent_function` on `RedisCachePersistenceLayer`
  (needs the bench's virtualenv, `.venv-bench`), as in `scripts/bench_python.py`;
- `in-process`: the oncegate decorator with its gate in the process, on this Redis, unsigned
  (`oncegate.local`, the Python table's `oncegate-decorator-in-process` row);
- `gate-unsigned`, `gate-signed`: a gate server on this Redis (release build), loaded by
  `oncegate bench --scenario grant-complete --concurrency 1 --actions N`, without and with a
  signing key; the signed gate also seals its receipt chain once per `--seal-interval`, which
  under valgrind's slowdown falls on fewer pairs than at full speed (see the per-command table).

Usage: `.venv-bench/bin/python scripts/bench_redis_instructions.py [--bin target/release/oncegate]
[--cycles 400 1200] [--only NAME ...] [--json]`. Prints a table (`make bench` prints it as one of
its rows' tables); `--per-command` adds Redis's inclusive
instructions per cycle by command (`callgrind_annotate`), `--keep DIR` keeps each contender's
dump (of the longer run) for `callgrind_annotate`. The server is killed at the end.
"""

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

CONTENDERS = ["powertools", "in-process", "gate-unsigned", "gate-signed"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nothing answered on 127.0.0.1:{port} within {seconds} s")


class Callgrind:
    """redis-server under callgrind; `measure` zeroes its counters, runs a workload, dumps them."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.out = tmp / "callgrind.out"
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}",
             "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.port, 60)
        self.url = f"redis://127.0.0.1:{self.port}"

    def control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True,
                       capture_output=True, timeout=120)

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], check=True,
                              capture_output=True, text=True, timeout=120).stdout

    def measure(self, run) -> tuple[int, str, dict[str, int]]:
        """(instructions, dump file, calls by command) of Redis while `run()` ran."""
        before = set(glob.glob(f"{self.out}.*"))
        self.cli("CONFIG", "RESETSTAT")
        self.control("-z")
        run()
        self.control("-d")
        calls = {m.group(1): int(m.group(2)) for m in re.finditer(
            r"^cmdstat_([\w|]+):calls=(\d+)", self.cli("INFO", "commandstats"), re.M)}
        for _ in range(100):
            new = set(glob.glob(f"{self.out}.*")) - before
            if new:
                dump = new.pop()
                text = Path(dump).read_text()
                found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                if found:
                    return int(found.group(1)), dump, calls
            time.sleep(0.1)
        raise RuntimeError("callgrind wrote no dump")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def python_runner(name: str, redis_url: str, tmp: Path):
    """A function running n cycles of a Python contender in this process (set up, warm)."""
    import bench_python

    bench_python.SCRATCH = str(tmp)  # the gate in process keeps its directory there
    if name == "powertools":
        cycle = bench_python.powertools_cycle(redis_url)
    else:
        cycle = bench_python.in_process_cycle(redis_url)
    counter = iter(range(10**9))
    for _ in range(20):
        cycle(next(counter))

    def run(n: int) -> None:
        for _ in range(n):
            cycle(next(counter))

    return run, lambda: None


def gate_runner(name: str, redis_url: str, binary: str, tmp: Path):
    """A function running n grant-complete pairs through a gate server on `redis_url`."""
    port = free_port()
    flags = ["--redis-url", redis_url, "--listen", f"127.0.0.1:{port}", "--no-admin-socket",
             "--data-dir", str(tmp / name)]
    if name == "gate-signed":
        key = tmp / "signing-key.pem"
        if not key.exists():
            subprocess.run([binary, "keys", "generate", "--out", str(key)], check=True,
                           capture_output=True)
        flags += ["--signing-key", str(key)]
    else:
        flags += ["--unsigned"]
    gate = subprocess.Popen([binary, "serve", *flags], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or gate.poll() is not None:
                gate.kill()
                raise RuntimeError(f"{name}: the gate did not start")
            time.sleep(0.2)

    def run(n: int) -> None:
        subprocess.run([binary, "bench", "--target", f"127.0.0.1:{port}", "--scenario",
                        "grant-complete", "--concurrency", "1", "--warmup", "0", "--duration",
                        "600", "--actions", str(n)], check=True, capture_output=True)

    run(20)
    return run, gate.kill


def per_command(dump: str) -> dict[str, int]:
    """Inclusive instructions of each `*Command` function in a dump."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                          check=True, capture_output=True, text=True).stdout
    found = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+\S+:(\w+Command)\b", line)
        if m:
            found[m.group(2)] = int(m.group(1).replace(",", ""))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(ROOT / "target" / "release" / "oncegate"))
    parser.add_argument("--cycles", type=int, nargs=2, default=[400, 1200])
    parser.add_argument("--only", choices=CONTENDERS, action="append")
    parser.add_argument("--per-command", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    parser.add_argument("--keep", type=Path, help="copy each contender's dump into this directory")
    opts = parser.parse_args()
    low, high = sorted(opts.cycles)
    if low == high:
        parser.error("--cycles needs two different counts")
    with tempfile.TemporaryDirectory(prefix="oncegate-redis-ir-") as tmp_name:
        tmp = Path(tmp_name)
        redis = Callgrind(tmp)
        rows = []
        try:
            for name in opts.only or CONTENDERS:
                if name.startswith("gate-"):
                    run, done = gate_runner(name, redis.url, opts.bin, tmp)
                else:
                    run, done = python_runner(name, redis.url, tmp)
                try:
                    small, _, _ = redis.measure(lambda: run(low))
                    big, dump, calls = redis.measure(lambda: run(high))
                finally:
                    done()
                per_cycle = (big - small) / (high - low)
                if opts.keep:
                    opts.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(dump, opts.keep / f"callgrind.{name}.out")
                commands = {}
                if opts.per_command:
                    commands = {c: ir / high for c, ir in per_command(dump).items()}
                calls = {c: n / high for c, n in calls.items() if c not in ("config", "info")}
                rows.append((name, per_cycle, commands, calls))
                print(f"{name}: {per_cycle:,.0f} instructions per cycle", file=sys.stderr)
        finally:
            redis.stop()
    if opts.json:
        print(json.dumps({name: {"instructions_per_cycle": per_cycle, "commands_per_cycle": calls}
                          for name, per_cycle, _, calls in rows}))
        return
    print(f"Redis instructions per cycle ({low} and {high} cycles, one caller; callgrind):\n")
    print("| contender | instructions per cycle | ÷ first row | commands per cycle |")
    print("| --- | ---: | ---: | --- |")
    for name, per_cycle, _, calls in rows:
        counted = ", ".join(f"{c} {n:.2f}" for c, n in sorted(calls.items(), key=lambda kv: -kv[1]))
        print(f"| {name} | {per_cycle:,.0f} | {per_cycle / rows[0][1]:.2f} | {counted} |")
    if opts.per_command:
        for name, _, commands, _ in rows:
            print(f"\n{name}, inclusive per cycle by command ({high}-cycle run):")
            for command, ir in sorted(commands.items(), key=lambda kv: -kv[1])[:12]:
                print(f"  {command:<24} {ir:>12,.0f}")


if __name__ == "__main__":
    main()
