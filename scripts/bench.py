#!/usr/bin/env python3
"""`make bench`: the gate against the physical limit, on this machine, in one run.

Starts its own redis-server on a free loopback port (never the one on 6379), measures the limit
with redis-benchmark (an EVALSHA of scripts/bench_limit.lua, equivalent to one grant, and a plain
SET NX EX) at the same concurrency as the gate's callers, then loads the gate on Redis and the
gate on the embedded store with `oncegate bench` for every scenario (and grant-complete with
signing the other way round), several short runs each; measures this disk's fdatasync (the
embedded store's floor), the Python side beside Powertools (scripts/bench_python.py, in the
bench's own virtualenv), Redis memory per completed action, and Redis's instructions per cycle
under callgrind (scripts/bench_redis_instructions.py; --no-instructions skips it, as does a machine
without valgrind). Prints one table of medians with
the ratios to the EVALSHA limit of the same run and every target, and writes it, with
the exact command, the machine and the versions, into the generated block of BENCHMARKS.md.

Python standard library only (the Python comparison runs in its own virtualenv). Every process it
starts is its own and is killed at the end.
"""

import argparse
import json
import os
import platform
import re
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "oncegate"
LIMIT_SCRIPT = ROOT / "scripts" / "bench_limit.lua"
SCENARIOS = ["grant-complete", "replay", "contended", "mix"]
LIMIT = "EVALSHA (SET NX PX + INCR)"
BEGIN, END = "<!-- bench:begin (written by make bench) -->", "<!-- bench:end -->"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=300, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout, **kw).stdout


class Redis:
    def __init__(self, tmp):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if self.cli("PING").strip() == "PONG":
                    return
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def cli(self, *args, stdin=None):
        return run(["redis-cli", "-p", str(self.port), *args], input=stdin)

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def used_memory(self):
        info = self.cli("INFO", "memory")
        return int(re.search(r"used_memory:(\d+)", info).group(1))

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Gate:
    """`oncegate serve` on 127.0.0.1:0, on Redis or on the embedded store in a fresh directory."""

    def __init__(self, redis_url=None, data_dir=None, rust_log="info", extra=(), log="discard"):
        """`log`: where its standard error goes, "discard" (/dev/null, as `make bench` runs it) or
        "pipe" (a pipe this process reads and drops, as a log collector would)."""
        args = [str(BIN), "serve", "--listen", "127.0.0.1:0"]
        args += ["--redis-url", redis_url] if redis_url else ["--data-dir", data_dir]
        args += list(extra)
        env = dict(os.environ, RUST_LOG=rust_log)
        stderr = {"discard": subprocess.DEVNULL, "pipe": subprocess.PIPE}[log]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                     env=env)
        if log == "pipe":
            threading.Thread(target=drain, args=(self.proc.stderr.fileno(),), daemon=True).start()
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"oncegate did not start: {line!r}")
        self.addr = line.removeprefix("listening on ")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def drain(fd):
    """Reads `fd` until its end, dropping what it reads."""
    while os.read(fd, 1 << 16):
        pass


def cpu_seconds(pid):
    """User + system CPU seconds a process has used so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU used during one run by the server processes named, and by the waited-for client."""

    def __init__(self, **pids):
        self.pids = pids
        self.before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self.client_before = children_cpu()

    def per_op(self, ops):
        used = {name: cpu_seconds(pid) - self.before[name] for name, pid in self.pids.items()}
        used["client"] = children_cpu() - self.client_before
        return {name: seconds / max(ops, 1) * 1e6 for name, seconds in used.items()}


def redis_benchmark(redis, concurrency, requests, command):
    meter = CpuMeter(redis=redis.proc.pid)
    out = run(["redis-benchmark", "-p", str(redis.port), "-c", str(concurrency), "-n", str(requests),
               "-r", "100000000", "--csv", *command])
    rows = [line for line in out.splitlines() if line.strip()]
    header = [h.strip('"') for h in rows[0].split(",")]
    values = [v.strip('"') for v in rows[-1].split(",")]
    row = dict(zip(header, values))
    return {"ops": float(row["rps"]), "p50": float(row["p50_latency_ms"]),
            "p99": float(row["p99_latency_ms"]), "cpu_us": meter.per_op(requests)}


def limit_commands(redis):
    sha = redis.cli("SCRIPT", "LOAD", LIMIT_SCRIPT.read_text()).strip()
    return {
        LIMIT: ["EVALSHA", sha, "2", "bench:rec:__rand_int__", "bench:fence:__rand_int__", "tok",
                "300000"],
        "SET NX EX": ["SET", "bench:set:__rand_int__", "tok", "NX", "EX", "300"],
    }


def bench(gate, redis, scenario, opts, extra=()):
    cmd = [str(BIN), "bench", "--target", gate.addr, "--scenario", scenario, "--json",
           "--concurrency", str(opts.concurrency), "--connections", str(opts.connections),
           "--duration", str(opts.duration), "--warmup", str(opts.warmup), *extra]
    meter = CpuMeter(gate=gate.proc.pid, redis=redis.proc.pid)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.duration + 120)
    if not proc.stdout.strip():
        raise RuntimeError(f"oncegate bench failed: {proc.stderr}")
    report = json.loads(proc.stdout)
    # CPU is counted over warm-up and measurement alike; so are the calls here.
    calls = report["throughput"]["rpcs_per_s"] * (opts.duration + opts.warmup)
    report["cpu_us"] = meter.per_op(calls)
    return report


# Signing's cost is each store's signed grant-complete row against its unsigned one: (unsigned
# row, signed row) per store.
SIGNING_PAIRS = {"Redis": ("gate on Redis", "gate on Redis, signed"),
                 "the embedded store": ("gate on embedded, --unsigned", "gate on embedded")}


def order(gates, i):
    """The (row, scenario) runs of round `i` (from 0): each store's unsigned (U) and signed (S)
    grant-complete runs first, four back to back, U S S U in rounds 1, 3, … and S U U S in rounds
    2, 4, …, so that in every round each row runs once before the other and once after it, and
    the two rows' mean places are the same (a drift of the machine across the four runs falls on
    both alike); then the other scenarios, row by row. (With one run of each per round, the signed
    run came second in rounds 1 and 3; over eleven such runs, a store's signed ÷ unsigned was
    higher in round 2, where it came first, than in rounds 1 and 3 on average, 18 times in 22:
    BENCHMARKS.md, "What was tried".)"""
    paired = []
    for pair in SIGNING_PAIRS.values():
        runs = [(row, "grant-complete") for row in pair]
        first = runs if i % 2 == 0 else runs[::-1]
        paired += first + first[::-1]
    return paired + [(row, scenario) for row, (_, scenarios) in gates.items()
                     for scenario in scenarios if (row, scenario) not in paired]


def rounds(redis, gates, python_gates, opts):
    """Every measurement once per round, rounds repeated: the noise of a shared machine falls on
    the limit and on the gate alike, instead of on whichever was measured at a bad moment.
    `gates` maps a row name to (gate, scenarios); `python_gates` are the unsigned and the signing
    gate the Python side goes through."""
    commands = limit_commands(redis)
    # Size each redis-benchmark run to about --duration seconds from a short calibration run.
    sizes = {name: max(20000, int(redis_benchmark(redis, opts.concurrency, 20000, c)["ops"]
                                  * opts.duration)) for name, c in commands.items()}
    lim = {name: [] for name in commands}
    results = {row: {s: [] for s in scenarios} for row, (_, scenarios) in gates.items()}
    python = []
    for i in range(opts.runs):
        print(f"round {i + 1} of {opts.runs}", flush=True)
        for name, command in commands.items():
            lim[name].append(redis_benchmark(redis, opts.concurrency, sizes[name], command))
            print(f"  limit {name}: {lim[name][-1]['ops']:.0f} ops/s", flush=True)
        redis.cli("FLUSHALL")
        for row, scenario in order(gates, i):
            results[row][scenario].append(bench(gates[row][0], redis, scenario, opts))
            tok = results[row][scenario][-1]["throughput"]["request_token_per_s"]
            print(f"  {row}, {scenario}: {tok:.0f} RequestToken/s", flush=True)
        if opts.python_seconds > 0 and Path(opts.python).exists():
            redis.cli("FLUSHALL")
            python.append(python_side(redis, *python_gates, opts))
            print("  Python: " + ", ".join(f"{c} {r['cycles_per_s']:.0f}/s"
                                           for c, r in python[-1].items()), flush=True)
    return lim, results, python


def python_side(redis, gate, signed_gate, opts):
    """scripts/bench_python.py in the bench's virtualenv: Powertools, the seeds' authorizer, the
    oncegate decorator (native core, signing gate, grpcio alone) and the bare stubs, on this Redis
    and the gates on it; with the gates' and Redis's CPU per cycle, and the machine's idle share."""
    out = run([opts.python, str(ROOT / "scripts" / "bench_python.py"), "--redis-url", redis.url(),
               "--gate", gate.addr, "--signed-gate", signed_gate.addr,
               "--gate-pid", str(gate.proc.pid), "--signed-gate-pid", str(signed_gate.proc.pid),
               "--redis-pid", str(redis.proc.pid),
               "--workers", str(opts.python_workers), "--seconds", str(opts.python_seconds)],
              timeout=opts.python_seconds * 14 + 300)
    return json.loads(out.strip().splitlines()[-1])


def fsync_latency(directory, writes=300):
    """Median seconds of one 600-byte write plus fdatasync in a preallocated file, in the directory
    the embedded store writes to: what one group commit of its write-ahead log waits for."""
    path = os.path.join(directory, "fsync-probe")
    size = 1 << 20
    with open(path, "wb") as f:
        f.truncate(size)
        os.fsync(f.fileno())
    fd = os.open(path, os.O_WRONLY)
    times = []
    try:
        for i in range(writes):
            start = time.perf_counter()
            os.pwrite(fd, b"x" * 600, (i * 600) % (size - 600))
            os.fdatasync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.remove(path)
    return statistics.median(times)


def memory(redis, opts, keyed, actions):
    """Bytes of Redis memory per completed action, receipt excluded (the receipts are empty)."""
    redis.cli("FLUSHALL")
    before = redis.used_memory()
    gate = Gate(redis_url=redis.url(), rust_log="warn")
    try:
        extra = ["--actions", str(actions), "--receipt-bytes", "0", "--duration", "300",
                 "--warmup", "0"] + (["--idempotency-keys"] if keyed else [])
        cmd = [str(BIN), "bench", "--target", gate.addr, "--scenario", "grant-complete", "--json",
               "--concurrency", "64", "--connections", str(opts.connections), *extra]
        report = json.loads(run(cmd, timeout=400))
    finally:
        gate.stop()
    keys = int(redis.cli("DBSIZE").strip())
    after = redis.used_memory()
    sample = [k for k in redis.cli(stdin="RANDOMKEY\n" * 1000).split() if k]
    usage = redis.cli(stdin="".join(f"MEMORY USAGE {k} SAMPLES 0\n" for k in sample)).split()
    usage = [int(u) for u in usage if u.isdigit()]
    return {"actions": actions, "keys": keys, "ok": report["ok"],
            "memory_usage_mean": statistics.mean(usage) if usage else 0,
            "memory_usage_max": max(usage) if usage else 0, "sampled": len(usage),
            "used_memory_delta_per_key": (after - before) / max(keys, 1),
            "key_example": sample[0] if sample else ""}


def median(rows, field):
    return statistics.median(r[field] for r in rows)


def median_of(reports, field):
    return statistics.median(r["throughput"][field] for r in reports)


def median_latency(reports, rpc, field):
    values = [r["latency_ms"][rpc][field] for r in reports if rpc in r["latency_ms"]]
    return statistics.median(values) if values else float("nan")


def machine():
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    version = lambda *cmd: run(list(cmd)).strip().splitlines()[0]
    commit = run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip()
    dirty = run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]).strip()
    return {"cores": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "rustc": version("rustc", "--version"), "redis": version("redis-server", "--version"),
            "commit": commit + (" (with uncommitted changes)" if dirty else "")
            + ("" if BIN == ROOT / "target" / "release" / "oncegate" else f", measured binary {BIN}")}


def cpu_cell(reports, names):
    return " / ".join(f"{statistics.median(r['cpu_us'][n] for r in reports):.0f}" for n in names)


CLIENT_US_GOAL, GOAL_POWERTOOLS_CLIENT_US = 120, 280
"""The Python client's CPU goal per cycle, and Powertools' client CPU per cycle on the machine the
goal was set on. The machines here differ by more than 3× in both, so the bench also prints the
client's CPU as a share of Powertools' client's, against the goal's share."""
CLIENT_SHARE_GOAL = CLIENT_US_GOAL / GOAL_POWERTOOLS_CLIENT_US


def verdict(ok: bool) -> str:
    """A target's verdict. It judges the unrounded value, and every target line prints its value
    with a digit more than the target has, so that a value just short of the line does not read
    as the line itself (0.849 against 0.85, 119.6 µs against 120)."""
    return "met" if ok else "MISSED"


def signing_lines(results):
    """Signing's cost: each store's signed grant-complete pairs/s ÷ its unsigned ones, by the
    rows' medians (the target's measure, over every run) and round by round (the mean of the
    signed row's two runs in the round ÷ the mean of the unsigned row's two; see `order`)."""
    lines = []
    for store, (unsigned, signed) in SIGNING_PAIRS.items():
        u, s = results[unsigned]["grant-complete"], results[signed]["grant-complete"]
        by_medians = median_of(s, "pairs_per_s") / median_of(u, "pairs_per_s")
        mean = lambda reports: statistics.mean(r["throughput"]["pairs_per_s"] for r in reports)
        per_round = [mean(s[k:k + 2]) / mean(u[k:k + 2]) for k in range(0, len(u), 2)]
        lines.append(
            f"- {store}: signed ÷ unsigned grant-complete pairs/s {by_medians:.3f} by the rows' "
            f"medians of {len(s)} runs each (goal ≥ 0.85: {verdict(by_medians >= 0.85)}); "
            f"round by round, the means of each round's four runs (U S S U or S U U S): "
            f"{', '.join(f'{r:.2f}' for r in per_round)} "
            f"(median {statistics.median(per_round):.2f})")
    return lines


def table(lim, results, python, mem, fsync, instructions, opts):
    limit = median(lim[LIMIT], "ops")
    out = ["| what | RequestToken/s | grant+complete pairs/s | RPCs/s | RequestToken p50 / p99 ms "
           "| RequestToken/s ÷ EVALSHA | RPCs/s ÷ EVALSHA | CPU µs per call: gate / load generator / Redis "
           "| checks |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, rows in lim.items():
        out.append(f"| limit: redis-benchmark {name} | {median(rows, 'ops'):,.0f} | — | — | "
                   f"{median(rows, 'p50'):.3f} / {median(rows, 'p99'):.3f} | "
                   f"{median(rows, 'ops') / limit:.2f} | — | — / {cpu_cell(rows, ['client', 'redis'])} | — |")
    for row, scenarios in results.items():
        on_redis = "Redis" in row
        names = ["gate", "client", "redis"] if on_redis else ["gate", "client"]
        for scenario, reports in scenarios.items():
            tok, pairs = median_of(reports, "request_token_per_s"), median_of(reports, "pairs_per_s")
            rpcs = median_of(reports, "rpcs_per_s")
            bad = sum(r["violations"] + r["checks"]["unexpected"] for r in reports)
            out.append(
                f"| {row}: {scenario} | {tok:,.0f} | {pairs:,.0f} | {rpcs:,.0f} | "
                f"{median_latency(reports, 'request_token', 'p50'):.3f} / "
                f"{median_latency(reports, 'request_token', 'p99'):.3f} | {tok / limit:.2f} | "
                f"{rpcs / limit:.2f} | {cpu_cell(reports, names)}{'' if on_redis else ' / —'} | "
                f"{'0 violations' if bad == 0 else f'{bad} FAILED'} |")
    gc_redis = results["gate on Redis"]["grant-complete"]
    gc_emb = results["gate on embedded"]["grant-complete"]
    cpu = lambda reports, name: statistics.median(r["cpu_us"][name] for r in reports)
    ratio = median_of(gc_redis, "rpcs_per_s") / limit
    gate_cpu, redis_cpu = cpu(gc_redis, "gate"), cpu(gc_redis, "redis")
    limit_redis_cpu = statistics.median(r["cpu_us"]["redis"] for r in lim[LIMIT])
    p99 = median_latency(gc_redis, "request_token", "p99")
    pairs = median_of(gc_emb, "pairs_per_s")
    bound = opts.concurrency / (2 * fsync)
    lines = [
        "",
        f"Targets at {opts.concurrency} concurrent callers (grant-complete, medians of this run):",
        "",
        "| target | measured | goal | |",
        "| --- | ---: | ---: | --- |",
        f"| gate on Redis: RPCs/s ÷ EVALSHA limit | {ratio:.3f} | ≥ 0.45 | {verdict(ratio >= 0.45)} |",
        f"| gate CPU per call (gate on Redis) | {gate_cpu:.1f} µs | ≤ 30 µs | {verdict(gate_cpu <= 30)} |",
        f"| Redis CPU per gate call (the limit's script: {limit_redis_cpu:.0f} µs) | {redis_cpu:.1f} µs "
        f"| ≤ 22 µs | {verdict(redis_cpu <= 22)} |",
        f"| RequestToken p99 (gate on Redis) | {p99:.2f} ms | < 3 ms | {verdict(p99 < 3)} |",
        f"| embedded store: durable grant+complete pairs/s | {pairs:,.1f} | ≥ 10,000 | "
        f"{verdict(pairs >= 10000)} |",
        "",
        f"- this disk: one 600-byte write + `fdatasync` takes {fsync * 1000:.2f} ms (median); every "
        f"grant and every Complete waits for one (group commit), so {opts.concurrency} callers can make "
        f"at most {opts.concurrency} / (2 × {fsync * 1000:.2f} ms) = {bound:,.0f} pairs/s on the embedded "
        f"store however little CPU it takes ({pairs / bound:.0%} of that here)",
    ]
    lines += signing_lines(results)
    for label, m in mem.items():
        lines.append(
            f"- Redis memory per completed action ({label}, {m['actions']:,} actions, {m['keys']:,} keys, "
            f"empty receipts): MEMORY USAGE mean {m['memory_usage_mean']:.1f} B over {m['sampled']} "
            f"sampled keys (max {m['memory_usage_max']}), used_memory delta {m['used_memory_delta_per_key']:.0f} "
            f"B per key (target ≤ 400: {verdict(m['memory_usage_mean'] <= 400)}); "
            f"key layout `{m['key_example']}`")
    lines += python_table(python, opts)
    lines += instructions_table(instructions)
    return "\n".join(out + lines)


INSTRUCTION_ROWS = {
    "powertools": "AWS Lambda Powertools `@idempotent_function` (its two commands)",
    "in-process": "the oncegate decorator, its gate in process, unsigned",
    "gate-unsigned": "a gate server, unsigned: `oncegate bench --scenario grant-complete --concurrency 1`",
    "gate-signed": "the same, signing (and sealing its chain every 50 ms)",
}


def redis_instructions(opts):
    """Redis's instructions per cycle under callgrind (scripts/bench_redis_instructions.py), or
    None when skipped or when valgrind is missing."""
    if opts.no_instructions or not shutil.which("valgrind"):
        return None
    python = opts.python if Path(opts.python).exists() else sys.executable
    only = [] if Path(opts.python).exists() else ["--only", "gate-unsigned", "--only", "gate-signed"]
    print("Redis instructions per cycle (callgrind):", flush=True)
    out = run([python, str(ROOT / "scripts" / "bench_redis_instructions.py"), "--bin", str(BIN),
               "--json", *only], timeout=1800)
    return json.loads(out)


def instructions_table(instructions):
    if not instructions:
        return ["", "Redis instructions per cycle: skipped (--no-instructions, or no valgrind)."]
    first = next(iter(instructions.values()))["instructions_per_cycle"]
    lines = ["", "Redis's own instructions per cycle, one sequential caller, Redis under callgrind "
             "(`scripts/bench_redis_instructions.py`: within about 2% on every run of the same "
             "build, where seconds move by a third; Redis's timer work and the gate's seals "
             "run by time, not by cycle; the kernel's share of Redis's socket calls is not in "
             "it):", "",
             "| contender | instructions per cycle | ÷ first row | FCALLs per cycle | commands run per "
             "cycle, the functions' included |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, row in instructions.items():
        calls = row["commands_per_cycle"]
        ran = sum(n for c, n in calls.items() if c != "fcall" and not c.startswith("config"))
        lines.append(f"| {INSTRUCTION_ROWS.get(name, name)} | {row['instructions_per_cycle']:,.0f} | "
                     f"{row['instructions_per_cycle'] / first:.2f} | {calls.get('fcall', 0):.2f} | "
                     f"{ran:.2f} |")
    if "gate-signed" in instructions and "gate-unsigned" in instructions:
        ratio = (instructions["gate-signed"]["instructions_per_cycle"]
                 / instructions["gate-unsigned"]["instructions_per_cycle"])
        lines += ["", f"- Redis instructions per grant-complete pair, signed ÷ unsigned: {ratio:.2f} "
                  f"(goal: Redis CPU per signed pair ≤ 1.2× unsigned: "
                  f"{verdict(ratio <= 1.2)} in instructions)"]
    return lines


PYTHON_ROWS = {
    "powertools": "AWS Lambda Powertools `@idempotent_function`, Redis persistence",
    "seed-authorizer": "the seeds' redis-py authorizer (check-then-set race included)",
    "oncegate-decorator": "oncegate Python decorator (native core), through the gate on Redis",
    "oncegate-decorator-signed": "the same, through the gate on Redis signing (`--signing-key`)",
    "oncegate-decorator-grpcio": "the same on grpcio alone (`ONCEGATE_PURE_PYTHON=1`)",
    "oncegate-decorator-in-process": "the same decorator, its gate in process (`oncegate.local` on "
                                     "the same Redis, `--unsigned`; the gate's CPU is the client's)",
    "oncegate-native-stubs": "the native core's stubs alone (RequestToken + Complete)",
    "oncegate-raw-stubs": "the generated grpcio stubs alone (RequestToken + Complete)",
}


def python_table(python, opts):
    if not python:
        return ["", f"Python comparison: skipped ({opts.python} not found; `make bench` creates it)."]
    med = lambda c, f: statistics.median(run[c][f] for run in python)
    lines = ["", f"Python, {opts.python_workers} worker processes, a full cycle around a no-op tool, "
             f"every cycle a new action, same Redis, medians of {len(python)} runs of "
             f"{opts.python_seconds:g} s; the gate servers with "
             f"`{opts.gate_args or 'no extra flags'}`:", "",
             "| contender | cycles/s | CPU µs per cycle: client / gate / Redis = all | machine idle |",
             "| --- | ---: | ---: | ---: |"]
    for contender, label in PYTHON_ROWS.items():
        if all(contender in run for run in python):
            parts = [med(contender, f"{name}_cpu_us_per_cycle") if all(
                f"{name}_cpu_us_per_cycle" in run[contender] for run in python) else 0.0
                for name in ("client", "gate", "redis")]
            gate = f"{parts[1]:,.0f}" if contender.startswith("oncegate-") else "—"
            if contender == "oncegate-decorator-in-process":
                gate = "(in client)"
            lines.append(f"| {label} | {med(contender, 'cycles_per_s'):,.0f} | "
                         f"{parts[0]:,.0f} / {gate} / {parts[2]:,.0f} = {sum(parts):,.0f} | "
                         f"{med(contender, 'machine_idle'):.0%} |")
    same_run = lambda f: statistics.median(f(run) for run in python)
    ratio = same_run(lambda run: run["oncegate-decorator"]["cycles_per_s"]
                     / run["powertools"]["cycles_per_s"])
    cpu = med("oncegate-decorator", "client_cpu_us_per_cycle")
    share = same_run(lambda run: run["oncegate-decorator"]["client_cpu_us_per_cycle"]
                     / run["powertools"]["client_cpu_us_per_cycle"])
    overhead = same_run(lambda run: run["oncegate-decorator"]["client_cpu_us_per_cycle"]
                        / run["oncegate-native-stubs"]["client_cpu_us_per_cycle"] - 1)
    lines += ["",
              f"- the decorator's cycles/s ÷ Powertools', same run: {ratio:.3f} (target ≥ 1.0: "
              f"{verdict(ratio >= 1.0)}); its client CPU per cycle: {cpu:.1f} µs (target ≤ "
              f"{CLIENT_US_GOAL}: {verdict(cpu <= CLIENT_US_GOAL)})",
              f"- its client CPU per cycle ÷ Powertools' client CPU per cycle, same run: "
              f"{share:.3f} (the {CLIENT_US_GOAL} µs goal was {CLIENT_SHARE_GOAL:.3f} of Powertools' "
              f"{GOAL_POWERTOOLS_CLIENT_US} on the machine it was set on; by that share: {verdict(share <= CLIENT_SHARE_GOAL)})",
              f"- what the guard adds to the native core's bare stubs, client CPU per cycle: "
              f"{overhead:+.0%} (in {opts.python_workers} processes; the < +10% goal is for one "
              f"process: scripts/bench_python_guard.py)"]
    if all("oncegate-decorator-in-process" in run for run in python):
        local = same_run(lambda run: run["oncegate-decorator-in-process"]["cycles_per_s"]
                         / run["powertools"]["cycles_per_s"])
        local_cpu = med("oncegate-decorator-in-process", "client_cpu_us_per_cycle")
        lines.append(f"- the decorator with its gate in process, cycles/s ÷ Powertools', same run: "
                     f"{local:.3f} (target ≥ 1.0: {verdict(local >= 1.0)}); its process's CPU per "
                     f"cycle, the gate's included: {local_cpu:.1f} µs")
    return lines


def write_benchmarks(text, path):
    block = f"{BEGIN}\n{text}\n{END}"
    if path.exists():
        current = path.read_text()
        if BEGIN in current and END in current:
            head, rest = current.split(BEGIN, 1)
            new = head + block + rest.split(END, 1)[1]
        else:
            new = current.rstrip() + "\n\n" + block + "\n"
    else:
        new = "# Benchmarks\n\n" + block + "\n"
    path.write_text(new)


def python_only(opts, began, load_before, info):
    """`--python-only`: the Python table alone, its rounds against one Redis and the two gates on
    it (unsigned and signing), printed with the conditions it was measured in."""
    with tempfile.TemporaryDirectory(prefix="oncegate-bench-") as tmp:
        redis = Redis(tmp)
        key = os.path.join(tmp, "signing-key.pem")
        run([str(BIN), "keys", "generate", "--out", key])
        gates = []
        try:
            extra = shlex.split(opts.gate_args)
            gates.append(Gate(redis_url=redis.url(), extra=extra))
            gates.append(Gate(redis_url=redis.url(), extra=["--signing-key", key, *extra]))
            python = []
            for i in range(opts.runs):
                redis.cli("FLUSHALL")
                python.append(python_side(redis, gates[0], gates[1], opts))
                print(f"round {i + 1} of {opts.runs}: " + ", ".join(
                    f"{c} {r['cycles_per_s']:.0f}/s" for c, r in python[-1].items()), flush=True)
        finally:
            for process in (*gates, redis):
                process.stop()
    load_after = os.getloadavg()
    command = shlex.join(["python3", "scripts/bench.py", *sys.argv[1:]])
    print("\n".join([
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))} in "
        f"{time.time() - began:.0f} s with `{command}`",
        f"- machine: {info['cores']} cores, {info['cpu']}; load average before / after: "
        f"{load_before[0]:.2f} / {load_after[0]:.2f}" + (f"; {opts.note}" if opts.note else ""),
        f"- {info['redis']}; oncegate {info['commit']} (release build)",
        *python_table(python, opts)]))


def main():
    global BIN
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=str(BIN),
                        help="the oncegate binary to measure (default: this checkout's release "
                             "build; another one for an A/B, named with --note)")
    parser.add_argument("--runs", type=int, default=3, help="runs per row; medians are quoted")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per gate run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--memory-actions", type=int, default=100_000)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--note", default="", help="conditions to record (e.g. 'machine busy')")
    parser.add_argument("--python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                        help="the bench virtualenv's python (Powertools, redis-py, the oncegate client)")
    parser.add_argument("--python-workers", type=int, default=8)
    parser.add_argument("--python-seconds", type=float, default=4.0,
                        help="seconds per contender per round; 0 skips the Python comparison")
    parser.add_argument("--gate-args", default="--serving-threads 2",
                        help="extra `oncegate serve` flags for the two gates on Redis the Python "
                             "side goes through (unsigned and signing); the default deals its "
                             "worker processes' connections to two threads")
    parser.add_argument("--no-instructions", action="store_true",
                        help="skip counting Redis's instructions per cycle under callgrind")
    parser.add_argument("--python-only", action="store_true",
                        help="only the Python comparison (Redis and the gates on it), printed, "
                             "BENCHMARKS.md left as it is")
    opts = parser.parse_args()
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (make deps installs it on Debian)")
    BIN = Path(opts.bin).resolve()
    if not BIN.exists():
        sys.exit(f"{BIN} not found: build it with cargo build --release")

    began, load_before = time.time(), os.getloadavg()
    info = machine()
    if opts.python_only:
        return python_only(opts, began, load_before, info)
    with tempfile.TemporaryDirectory(prefix="oncegate-bench-") as tmp:
        redis = Redis(tmp)
        key = os.path.join(tmp, "signing-key.pem")
        run([str(BIN), "keys", "generate", "--out", key])
        started = []
        try:
            def gate(*args, **kwargs):
                started.append(Gate(*args, **kwargs))
                return started[-1]

            # Rows: the default deployments (Redis unsigned, as without --signing-key; embedded
            # signed, with the key it generates), then each with signing the other way round.
            gates = {
                "gate on Redis": (gate(redis_url=redis.url()), SCENARIOS),
                "gate on embedded": (gate(data_dir=os.path.join(tmp, "embedded")), SCENARIOS),
                "gate on Redis, signed": (gate(redis_url=redis.url(), extra=["--signing-key", key]),
                                          ["grant-complete"]),
                "gate on embedded, --unsigned": (gate(data_dir=os.path.join(tmp, "unsigned"),
                                                      extra=["--unsigned"]), ["grant-complete"]),
            }
            # The Python side's gates: the same on Redis, with --gate-args (by default two
            # serving threads, for its worker processes' connection each).
            extra = shlex.split(opts.gate_args)
            python_gates = (gate(redis_url=redis.url(), extra=extra),
                            gate(redis_url=redis.url(), extra=["--signing-key", key, *extra]))
            fsync = fsync_latency(os.path.join(tmp, "embedded"))
            lim, results, python = rounds(redis, gates, python_gates, opts)
            for g in started:
                g.stop()
            started.clear()
            print("Redis memory per completed action:", flush=True)
            mem = {"fingerprint-keyed": memory(redis, opts, False, opts.memory_actions),
                   "idempotency-keyed, 3 key fields": memory(redis, opts, True,
                                                             max(opts.memory_actions // 5, 1000))}
        finally:
            for process in (*started, redis):
                process.stop()
    instructions = redis_instructions(opts)
    elapsed, load_after = time.time() - began, os.getloadavg()

    result = table(lim, results, python, mem, fsync, instructions, opts)
    command = "make bench  # = " + shlex.join(["python3", "scripts/bench.py", *sys.argv[1:]])
    header = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))} in {elapsed:.0f} s with:",
        "", "```sh", command, "```", "",
        f"- machine: {info['cores']} cores, {info['cpu']}, Linux {info['kernel']}; load generator, gate "
        "and Redis share the cores",
        f"- load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f}"
        + (f"; {opts.note}" if opts.note else ""),
        f"- {info['rustc']}; {info['redis']}; oncegate {info['commit']} (release build)",
        f"- {opts.concurrency} concurrent callers ({opts.connections} HTTP/2 connection(s)) and "
        f"redis-benchmark -c {opts.concurrency}; medians of {opts.runs} runs of {opts.duration:g} s "
        f"(gate runs after {opts.warmup:g} s warm-up), and of {2 * opts.runs} for each store's "
        "signed and unsigned grant-complete rows (four runs back to back per round, U S S U or "
        "S U U S); Redis without persistence (--save '' "
        "--appendonly no); gate logging at its default (info, audit events on, stderr discarded); "
        "the gate on Redis serves unsigned (no --signing-key), the gate on the embedded store signs "
        "(the key it generates); one row each the other way round",
        "- CPU µs per call: CPU time each process used during a run (warm-up included) divided by "
        "the calls made in it; the load generator is `oncegate bench` (or redis-benchmark for the "
        "limit)",
        "", "",
    ])
    text = header + result
    print("\n" + text)
    write_benchmarks(text, Path(opts.out))
    print(f"\nwritten to {opts.out}")


if __name__ == "__main__":
    main()
