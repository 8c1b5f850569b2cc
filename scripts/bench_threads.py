#!/usr/bin/env python3
"""Where a grant-complete pair's CPU goes, thread by thread (BENCHMARKS.md, "What was tried"): the
gate on a fresh embedded store (or, with `--redis`, on a fresh
`redis-server` of its own), signed or `--unsigned`, loaded by `oncegate bench` at 32 callers; each
thread's time on a CPU and time runnable but waiting for one, from /proc/<pid>/task/*/schedstat
over the middle of the run, per pair, summed by thread name (the gate's Tokio workers, the store's
writer, the signing thread) and for the load generator and Redis; and the gate's context switches
per pair.

    scripts/bench_threads.py target/release/oncegate --rounds 3
    scripts/bench_threads.py target/release/oncegate --rounds 3 --redis
    scripts/bench_threads.py OTHER_BUILD --rounds 3 --modes signed --env SOME_VAR=1

Rounds alternate the modes; one JSON line per run."""
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B


def threads(pid):
    """(thread id, name) → (ns on a CPU, ns waiting for one)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            run, wait = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
        except FileNotFoundError:  # the thread ended
            continue
        out[(tid, name)] = (int(run), int(wait))
    return out


def switches(pid):
    """The context switches of every thread of `pid` so far, voluntary or not."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            lines = Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
        except FileNotFoundError:  # the thread ended
            continue
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)
    return total


def per_pair(before, after, seconds, pairs, prefix="", tid=None):
    """µs on a CPU and µs waiting per pair, over the threads whose name starts with `prefix` (or
    over the thread `tid` alone)."""
    run = wait = 0
    for key, (r, w) in after.items():
        if key[0] == tid if tid else key[1].startswith(prefix):
            r0, w0 = before.get(key, (0, 0))
            run, wait = run + r - r0, wait + w - w0
    scale = 1e3 * seconds * pairs
    return round(run / scale, 1), round(wait / scale, 1)


def measure(binary, mode, env, tmp, key, redis, o):
    extra = ["--signing-key", key] if mode == "signed" else ["--unsigned"]
    os.environ.update(env)  # the gate inherits them
    B.BIN = binary
    store = dict(redis_url=redis.url()) if redis else dict(data_dir=tempfile.mkdtemp(dir=tmp))
    gate = B.Gate(**store, extra=["--no-admin-socket", *extra])
    for name in env:
        del os.environ[name]
    try:
        load = subprocess.Popen(
            [binary, "bench", "--target", gate.addr, "--scenario", "grant-complete",
             "--concurrency", "32", "--duration", str(o.duration), "--warmup", "1", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # Sample the middle of the measured window: after the warm-up, before the end.
        time.sleep(1 + o.duration * 0.15)
        r0 = threads(redis.proc.pid) if redis else {}
        g0, l0, s0 = threads(gate.proc.pid), threads(load.pid), switches(gate.proc.pid)
        t0 = time.monotonic()
        time.sleep(o.duration * 0.7)
        g1, l1, s1 = threads(gate.proc.pid), threads(load.pid), switches(gate.proc.pid)
        r1, seconds = threads(redis.proc.pid) if redis else {}, time.monotonic() - t0
        pairs = json.loads(load.communicate()[0])["throughput"]["pairs_per_s"]
    finally:
        gate.stop()
    return {"mode": mode, "env": env, "store": "redis" if redis else "embedded",
            "pairs_per_s": round(pairs),
            "workers_us": per_pair(g0, g1, seconds, pairs, "tokio-rt-worker"),
            "writer_us": per_pair(g0, g1, seconds, pairs, "oncegate-embedd"),
            # A gate beside its Redis on 2 CPUs runs its calls on its main thread (one worker).
            "main_us": per_pair(g0, g1, seconds, pairs, tid=str(gate.proc.pid)),
            "signer_us": per_pair(g0, g1, seconds, pairs, "oncegate-signer"),
            "gate_us": per_pair(g0, g1, seconds, pairs),
            "load_us": per_pair(l0, l1, seconds, pairs),
            "redis_us": per_pair(r0, r1, seconds, pairs),
            "gate_switches_per_pair": round((s1 - s0) / (seconds * pairs), 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("binary")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0, help="measured seconds per run")
    p.add_argument("--modes", default="unsigned,signed", help="comma-separated: unsigned, signed")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the gate (repeatable)")
    p.add_argument("--redis", action="store_true",
                   help="the gate on a redis-server of its own (fresh, no persistence) instead of "
                        "the embedded store")
    o = p.parse_args()
    env = dict(kv.split("=", 1) for kv in o.env)
    with tempfile.TemporaryDirectory(prefix="threads-") as tmp:
        key = os.path.join(tmp, "key.pem")
        B.run([o.binary, "keys", "generate", "--out", key])
        redis = B.Redis(tmp) if o.redis else None
        try:
            for _ in range(o.rounds):
                for mode in o.modes.split(","):
                    # Each figure is (µs on a CPU, µs waiting for one) per grant-complete pair.
                    print(json.dumps(measure(o.binary, mode, env, tmp, key, redis, o)), flush=True)
        finally:
            if redis:
                redis.stop()


main()
