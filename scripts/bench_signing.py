#!/usr/bin/env python3
"""What signing costs (BENCHMARKS.md, "What was tried"): grant-complete at 32 callers, signed and
unsigned, Redis and embedded,
for two oncegate binaries (before, after) interleaved in one window; gate and Redis CPU per call
as make bench counts them (scripts/bench.py's meters). Then RSS and on-disk bytes after filling
the embedded store. Usage: scripts/bench_signing.py BEFORE AFTER [--duration 6] [--rounds 2] [--fill 150000]
[--only "redis unsigned"] [--after-args "--worker-threads 1"] (the after gate's extra flags)"""
import argparse, json, os, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B

def gate(binary, **kw):
    B.BIN = binary
    return B.Gate(**kw)

def rss_kb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def du(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())

def main():
    p = argparse.ArgumentParser()
    p.add_argument("before"); p.add_argument("after")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--fill", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--only", action="append", default=[], help="run only these rows (repeatable)")
    p.add_argument("--after-args", default="", help="extra `oncegate serve` flags for AFTER")
    o = p.parse_args()
    bins = {"before": o.before, "after": o.after}
    out = []
    with tempfile.TemporaryDirectory(prefix="sign25-") as tmp:
        redis = B.Redis(tmp)
        key = os.path.join(tmp, "key.pem")
        B.run([o.after, "keys", "generate", "--out", key])
        try:
            for r in range(o.rounds):
                for row, kw in [
                    ("redis unsigned", dict(redis_url=redis.url(), extra=["--unsigned"])),
                    ("redis signed", dict(redis_url=redis.url(), extra=["--signing-key", key])),
                    ("embedded unsigned", dict(extra=["--unsigned"])),
                    ("embedded signed", dict(extra=["--signing-key", key])),
                ]:
                    if o.only and row not in o.only:
                        continue
                    for name, binary in bins.items():
                        kw2 = dict(kw)
                        if name == "after" and o.after_args:
                            kw2["extra"] = [*kw2["extra"], *o.after_args.split()]
                        if "redis_url" not in kw2:
                            kw2["data_dir"] = os.path.join(tmp, f"{name}-{row}-{r}".replace(" ", "-"))
                        g = gate(binary, **kw2)
                        B.BIN = binary
                        rep = B.bench(g, redis, "grant-complete", o)
                        g.stop()
                        res = {"round": r, "row": row, "bin": name,
                               "pairs_per_s": rep["throughput"]["rpcs_per_s"] / 2,
                               "gate_us": rep["cpu_us"]["gate"], "redis_us": rep["cpu_us"]["redis"]}
                        print(json.dumps(res), flush=True)
                        out.append(res)
            if o.fill:
                for name, binary in bins.items():
                    d = os.path.join(tmp, f"fill-{name}")
                    g = gate(binary, data_dir=d, extra=["--signing-key", key])
                    B.BIN = binary
                    t = time.time()
                    B.run([binary, "bench", "--target", g.addr, "--scenario", "grant-complete",
                           "--concurrency", "32", "--duration", "55", "--warmup", "0",
                           "--actions", str(o.fill), "--json"], timeout=120)
                    res = {"fill": o.fill, "bin": name, "seconds": round(time.time() - t, 1),
                           "rss_mb": rss_kb(g.proc.pid) / 1024}
                    g.stop()
                    res["disk_bytes"] = du(d)
                    res["redb_bytes"] = Path(d, "oncegate.redb").stat().st_size
                    # Reopened: what a restarted gate holds.
                    print(json.dumps(res), flush=True)
                    out.append(res)
        finally:
            redis.stop()
    print(json.dumps(out))

main()
