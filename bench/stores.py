"""The gate against the limit, on both stores: the `stores` and `signing` scenarios of `make bench`
(and the store half of `all`).

The limit is redis-benchmark on the bench's own Redis: an EVALSHA of limit.lua (the least one
grant can cost in Redis) and a plain SET NX EX, at the gate's callers' concurrency. The gate rows
are `oncegate bench` runs against gates on that Redis and on the embedded store, each with its
default signing (Redis unsigned, embedded signed), each the other way round, and each with the
rules and budgets of authorization.toml. Also this disk's fdatasync (the embedded store's floor)
and Redis's memory per completed action. Owns the rows, their order and their tables; the
processes and meters are harness.py's, the Python rows python_side.py's.
"""

import os
import statistics
import time

from harness import (ROOT, CpuMeter, Gate, median_of, run, signing_key, timed_load,
                     verdict)

SCENARIOS = ["grant-complete", "replay", "contended", "mix"]
LIMIT = "EVALSHA (SET NX PX + INCR)"
AUTHORIZATION = ROOT / "bench" / "authorization.toml"

SIGNING_PAIRS = {"Redis": ("gate on Redis", "gate on Redis, signed"),
                 "the embedded store": ("gate on embedded, --unsigned", "gate on embedded")}
"""Each store's unsigned and signed grant-complete rows, compared by `signing_lines`."""


def redis_benchmark(redis, concurrency, requests, command) -> dict:
    meter = CpuMeter(redis=redis.proc.pid)
    out = run(["redis-benchmark", "-p", str(redis.port), "-c", str(concurrency), "-n",
               str(requests), "-r", "100000000", "--csv", *command])
    rows = [line for line in out.splitlines() if line.strip()]
    header = [h.strip('"') for h in rows[0].split(",")]
    values = [v.strip('"') for v in rows[-1].split(",")]
    row = dict(zip(header, values))
    return {"ops": float(row["rps"]), "p50": float(row["p50_latency_ms"]),
            "p99": float(row["p99_latency_ms"]), "cpu_us": meter.per_op(requests)}


def limit_commands(redis) -> dict:
    sha = redis.cli("SCRIPT", "LOAD", (ROOT / "bench" / "limit.lua").read_text()).strip()
    return {
        LIMIT: ["EVALSHA", sha, "2", "bench:rec:__rand_int__", "bench:fence:__rand_int__", "tok",
                "300000"],
        "SET NX EX": ["SET", "bench:set:__rand_int__", "tok", "NX", "EX", "300"],
    }


def store_gates(start, binary, redis, tmp, signing_only=False) -> dict:
    """Row name → (gate, scenarios). `start(**kwargs)` starts a Gate and keeps it for stopping.
    The default deployments (Redis unsigned, as without --signing-key; embedded signed, with the
    key it generates) run every scenario; the rest grant-complete."""
    key = signing_key(binary, tmp)
    data = lambda name: os.path.join(tmp, name)
    gates = {
        "gate on Redis": (start(redis_url=redis.url()), SCENARIOS),
        "gate on embedded": (start(data_dir=data("embedded")), SCENARIOS),
        "gate on Redis, signed": (start(redis_url=redis.url(), extra=["--signing-key", key]),
                                  ["grant-complete"]),
        "gate on embedded, --unsigned": (start(data_dir=data("unsigned"), extra=["--unsigned"]),
                                         ["grant-complete"]),
    }
    if signing_only:
        return {row: (gate, ["grant-complete"]) for row, (gate, _) in gates.items()}
    rules = ["--config", str(AUTHORIZATION)]
    gates["gate on Redis, rules + budgets"] = (start(redis_url=redis.url(), extra=rules),
                                               ["grant-complete"])
    gates["gate on embedded, rules + budgets"] = (start(data_dir=data("rules"), extra=rules),
                                                  ["grant-complete"])
    return gates


def order(gates, i) -> list:
    """The (row, scenario) runs of round `i` (from 0): each store's unsigned (U) and signed (S)
    grant-complete runs first, four back to back, U S S U in rounds 1, 3, … and S U U S in rounds
    2, 4, …, so that in every round each row runs once before the other and once after it, and
    the two rows' mean places are the same: a drift of the machine across the four runs falls on
    both alike (with one run of each per round, the row that ran second looked slower). Then the
    other rows, row by row."""
    paired = []
    for pair in SIGNING_PAIRS.values():
        runs = [(row, "grant-complete") for row in pair]
        first = runs if i % 2 == 0 else runs[::-1]
        paired += first + first[::-1]
    return paired + [(row, scenario) for row, (_, scenarios) in gates.items()
                     for scenario in scenarios if (row, scenario) not in paired]


def rounds(redis, gates, opts, limit=True, each_round=None):
    """Every measurement once per round, rounds repeated: the noise of a shared machine falls on
    the limit and on the gate alike, instead of on whichever was measured at a bad moment.
    `each_round(i)` runs at the end of each round (the Python rows, in `all`). Returns the limit's
    runs by command (empty without `limit`) and the gate's reports by row and scenario."""
    commands = limit_commands(redis) if limit else {}
    # Size each redis-benchmark run to about --duration seconds from a short calibration run.
    sizes = {name: max(20000, int(redis_benchmark(redis, opts.concurrency, 20000, c)["ops"]
                                  * opts.duration)) for name, c in commands.items()}
    lim = {name: [] for name in commands}
    results = {row: {s: [] for s in scenarios} for row, (_, scenarios) in gates.items()}
    for i in range(opts.runs):
        print(f"round {i + 1} of {opts.runs}", flush=True)
        for name, command in commands.items():
            lim[name].append(redis_benchmark(redis, opts.concurrency, sizes[name], command))
            print(f"  limit {name}: {lim[name][-1]['ops']:.0f} ops/s", flush=True)
        redis.cli("FLUSHALL")
        for row, scenario in order(gates, i):
            gate = gates[row][0]
            on_redis = redis if "Redis" in row else None
            results[row][scenario].append(timed_load(gate, on_redis, scenario, opts))
            tok = results[row][scenario][-1]["throughput"]["request_token_per_s"]
            print(f"  {row}, {scenario}: {tok:.0f} RequestToken/s", flush=True)
        if each_round:
            each_round(i)
    return lim, results


def fsync_latency(directory, writes=300) -> float:
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


def memory(binary, redis, opts, keyed, actions) -> dict:
    """Bytes of Redis memory per completed action, receipt excluded (the receipts are empty)."""
    redis.cli("FLUSHALL")
    before = redis.used_memory()
    gate = Gate(binary, redis_url=redis.url(), rust_log="warn")
    try:
        report = gate.load("grant-complete", "--concurrency", 64, "--connections",
                           opts.connections, "--actions", actions, "--receipt-bytes", 0,
                           "--duration", 300, "--warmup", 0,
                           *(["--idempotency-keys"] if keyed else []), timeout=400)
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


def median_latency(reports, rpc, field) -> float:
    values = [r["latency_ms"][rpc][field] for r in reports if rpc in r["latency_ms"]]
    return statistics.median(values) if values else float("nan")


def cpu_cell(reports, names) -> str:
    return " / ".join(f"{statistics.median(r['cpu_us'][n] for r in reports):.0f}" for n in names)


def rows_table(lim, results) -> list:
    """One line per limit command and per gate row and scenario, medians; the ratios to the
    EVALSHA limit when it was measured."""
    limit = statistics.median(r["ops"] for r in lim[LIMIT]) if lim else None
    ratio = lambda value: f"{value / limit:.2f}" if limit else "—"
    out = ["| what | RequestToken/s | grant+complete pairs/s | RPCs/s | RequestToken p50 / p99 ms "
           "| RequestToken/s ÷ EVALSHA | RPCs/s ÷ EVALSHA | CPU µs per call: gate / load "
           "generator / Redis | checks |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, rows in lim.items():
        ops = statistics.median(r["ops"] for r in rows)
        p50, p99 = (statistics.median(r[f] for r in rows) for f in ("p50", "p99"))
        out.append(f"| limit: redis-benchmark {name} | {ops:,.0f} | — | — | {p50:.3f} / {p99:.3f} "
                   f"| {ratio(ops)} | — | — / {cpu_cell(rows, ['client', 'redis'])} | — |")
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
                f"{median_latency(reports, 'request_token', 'p99'):.3f} | {ratio(tok)} | "
                f"{ratio(rpcs)} | {cpu_cell(reports, names)}{'' if on_redis else ' / —'} | "
                f"{'0 violations' if bad == 0 else f'{bad} FAILED'} |")
    return out


def targets(lim, results, fsync, opts) -> list:
    """The gate's targets at `opts.concurrency` callers, and what this disk allows the embedded
    store."""
    limit = statistics.median(r["ops"] for r in lim[LIMIT])
    gc_redis = results["gate on Redis"]["grant-complete"]
    gc_emb = results["gate on embedded"]["grant-complete"]
    cpu = lambda reports, name: statistics.median(r["cpu_us"][name] for r in reports)
    ratio = median_of(gc_redis, "rpcs_per_s") / limit
    gate_cpu, redis_cpu = cpu(gc_redis, "gate"), cpu(gc_redis, "redis")
    limit_redis_cpu = cpu(lim[LIMIT], "redis")
    p99 = median_latency(gc_redis, "request_token", "p99")
    pairs = median_of(gc_emb, "pairs_per_s")
    bound = opts.concurrency / (2 * fsync)
    return [
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


def divide(a, b) -> float:
    """a ÷ b, NaN when b is 0 (a run too short for its first pair to end)."""
    return a / b if b else float("nan")


def signing_lines(results) -> list:
    """Each store's signed grant-complete pairs/s ÷ its unsigned ones, by the rows' medians (over
    every run) and round by round (the mean of the signed row's two runs in the round ÷ the mean
    of the unsigned row's two; see `order`)."""
    lines = []
    for store, (unsigned, signed) in SIGNING_PAIRS.items():
        u, s = results[unsigned]["grant-complete"], results[signed]["grant-complete"]
        by_medians = divide(median_of(s, "pairs_per_s"), median_of(u, "pairs_per_s"))
        mean = lambda reports: statistics.mean(r["throughput"]["pairs_per_s"] for r in reports)
        per_round = [divide(mean(s[k:k + 2]), mean(u[k:k + 2])) for k in range(0, len(u), 2)]
        lines.append(
            f"- {store}: signed ÷ unsigned grant-complete pairs/s {by_medians:.3f} by the rows' "
            f"medians of {len(s)} runs each (target ≥ 0.85: {verdict(by_medians >= 0.85)}); "
            f"round by round, the means of each round's four runs (U S S U or S U U S): "
            f"{', '.join(f'{r:.2f}' for r in per_round)} "
            f"(median {statistics.median(per_round):.2f})")
    return lines


def authorization_lines(results) -> list:
    """What the rules and budgets cost each store: the rows' grant-complete pairs/s ÷ the plain
    row's (the plain row of each store's default signing)."""
    lines = []
    for store, plain in (("Redis", "gate on Redis"), ("the embedded store", "gate on embedded")):
        rules = f"{plain}, rules + budgets"
        if rules in results:
            ratio = divide(median_of(results[rules]["grant-complete"], "pairs_per_s"),
                           median_of(results[plain]["grant-complete"], "pairs_per_s"))
            lines.append(f"- {store}: grant-complete pairs/s with three Cedar policies and two "
                         f"budgets (bench/authorization.toml) ÷ without: {ratio:.3f}")
    return lines


def memory_lines(mem) -> list:
    return [
        f"- Redis memory per completed action ({label}, {m['actions']:,} actions, {m['keys']:,} keys, "
        f"empty receipts): MEMORY USAGE mean {m['memory_usage_mean']:.1f} B over {m['sampled']} "
        f"sampled keys (max {m['memory_usage_max']}), used_memory delta {m['used_memory_delta_per_key']:.0f} "
        f"B per key (target ≤ 400: {verdict(m['memory_usage_mean'] <= 400)}); "
        f"key layout `{m['key_example']}`"
        for label, m in mem.items()]


def measure_memory(binary, redis, opts) -> dict:
    print("Redis memory per completed action:", flush=True)
    return {"fingerprint-keyed": memory(binary, redis, opts, False, opts.memory_actions),
            "idempotency-keyed, 3 key fields": memory(binary, redis, opts, True,
                                                      max(opts.memory_actions // 5, 1000))}
