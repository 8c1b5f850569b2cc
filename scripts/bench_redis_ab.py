#!/usr/bin/env python3
"""Two oncegate binaries, A and B, on one Redis: what each costs Redis per grant-complete pair.

Starts its own redis-server on a free loopback port, then, in alternating rounds, a gate of each
binary on it (one at a time, a data directory of its own) loaded by that binary's
`oncegate bench --scenario grant-complete` after a 1-s warm-up run. Per round and binary it prints
pairs/s, Redis's and the gate's CPU µs per pair (/proc), and Redis's commands per pair by command
(`INFO commandstats`, which counts the commands a function runs too), then the medians and B ÷ A.

Usage: scripts/bench_redis_ab.py A B [--rounds 4] [--seconds 5] [--concurrency 8]
       [--connections 8] [-- extra `oncegate serve` flags, e.g. --unsigned]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {port}")
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--connections", type=int, default=8)
    argv = sys.argv[1:]
    serve = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    opts.serve = serve
    load = ["--scenario", "grant-complete", "--concurrency", str(opts.concurrency),
            "--connections", str(opts.connections), "--warmup", "0"]
    results: dict[str, list[dict]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="oncegate-redis-ab-") as tmp:
        port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        cli = lambda *args: subprocess.run(["redis-cli", "-p", str(port), *args],
                                           capture_output=True, text=True, check=True).stdout
        try:
            wait_port(port, redis)
            for round_ in range(opts.rounds):
                for name in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
                    binary = opts.a if name == "A" else opts.b
                    gate_port = free_port()
                    gate = subprocess.Popen(
                        [binary, "serve", "--listen", f"127.0.0.1:{gate_port}", "--redis-url",
                         f"redis://127.0.0.1:{port}", "--no-admin-socket", "--data-dir",
                         os.path.join(tmp, f"{name}{round_}"), *opts.serve],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    try:
                        wait_port(gate_port, gate)
                        target = ["--target", f"127.0.0.1:{gate_port}"]
                        subprocess.run([binary, "bench", *target, *load, "--duration", "1"],
                                       check=True, capture_output=True)
                        cli("CONFIG", "RESETSTAT")
                        redis_before, gate_before = cpu_seconds(redis.pid), cpu_seconds(gate.pid)
                        out = subprocess.run(
                            [binary, "bench", *target, *load, "--duration", str(opts.seconds),
                             "--json"], check=True, capture_output=True, text=True).stdout
                        redis_used = cpu_seconds(redis.pid) - redis_before
                        gate_used = cpu_seconds(gate.pid) - gate_before
                        calls = {m.group(1): int(m.group(2)) for m in re.finditer(
                            r"^cmdstat_([\w|]+):calls=(\d+)", cli("INFO", "commandstats"), re.M)}
                    finally:
                        gate.kill()
                        gate.wait()
                    pairs = json.loads(out)["throughput"]["pairs_per_s"] * opts.seconds
                    row = {"pairs_per_s": pairs / opts.seconds,
                           "redis_us_per_pair": redis_used / pairs * 1e6,
                           "gate_us_per_pair": gate_used / pairs * 1e6,
                           **{f"{c}_per_pair": n / pairs for c, n in calls.items()
                              if not c.startswith(("config", "info"))}}
                    results[name].append(row)
                    print(round_ + 1, name, json.dumps({k: round(v, 2) for k, v in row.items()}),
                          flush=True)
        finally:
            redis.kill()
    print("\nmedians:")
    for key in sorted(set(results["A"][0]) & set(results["B"][0])):
        a = statistics.median(r.get(key, 0) for r in results["A"])
        b = statistics.median(r.get(key, 0) for r in results["B"])
        print(f"  {key:<24} A {a:>10,.2f}   B {b:>10,.2f}   B ÷ A {b / a if a else float('nan'):.3f}")


if __name__ == "__main__":
    main()
