#!/usr/bin/env python3
"""What Redis spends per call on the scripts' shared prelude: EVALSHA against FCALL.

Starts its own redis-server on a free loopback port, then runs `redis-benchmark -c 32` on five
empty calls and reads Redis' own time per call (`INFO commandstats`, usec_per_call):

- `EVALSHA return 1`: a script call and nothing else;
- `EVALSHA TIME; return 1`: plus the clock every transition reads;
- `EVALSHA prelude; return 1`: `prelude.lua` run whole, as an EVAL script runs it on every call
  (its constants and some thirty helper functions made again), plus the clock;
- `FCALL`: the same prelude as a Functions library (run once, when loaded) and a function that
  reads the clock: what a transition pays for it now (crates/store/src/redis/library.rs).

Rounds alternate the calls; medians are printed. Standard library only; the server is killed at
the end.
"""

import argparse
import re
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRELUDE = (ROOT / "crates" / "store" / "src" / "redis" / "prelude.lua").read_text()
CLOCK = "local t = redis.call('TIME')\nNOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100_000)
    opts = parser.parse_args()
    port = free_port()
    cli = lambda *args, stdin=None: subprocess.run(
        ["redis-cli", "-p", str(port), *args], input=stdin, check=True, capture_output=True,
        text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    if cli("PING") == "PONG":
                        break
                except subprocess.CalledProcessError:
                    time.sleep(0.05)
            # The prelude reads NOW, KEYS and ARGV as the library declares them.
            declared = "local KEYS, ARGV, NOW\n"
            calls = {
                "EVALSHA return 1": ["EVALSHA", cli("SCRIPT", "LOAD", "return 1"), "0"],
                "EVALSHA TIME; return 1": ["EVALSHA", cli("SCRIPT", "LOAD", declared + CLOCK + "return 1"), "0"],
                "EVALSHA prelude; return 1": ["EVALSHA", cli(
                    "SCRIPT", "LOAD", declared + PRELUDE + CLOCK + "return 1"), "0"],
            }
            library = ("#!lua name=bench_prelude\n" + declared + PRELUDE
                       + "redis.register_function('bench_prelude', function(keys, args)\n"
                       + CLOCK + "return 1 end)\n")
            cli("-x", "FUNCTION", "LOAD", "REPLACE", stdin=library)
            calls["FCALL (the prelude loaded once)"] = ["FCALL", "bench_prelude", "0"]
            found = {name: [] for name in calls}
            for _ in range(opts.rounds):
                for name, call in calls.items():
                    cli("CONFIG", "RESETSTAT")
                    subprocess.run(["redis-benchmark", "-p", str(port), "-c", "32", "-n",
                                    str(opts.requests), "-q", *call],
                                   check=True, capture_output=True)
                    stats = cli("INFO", "commandstats")
                    command = call[0].lower()
                    per_call = re.search(rf"cmdstat_{command}:.*usec_per_call=([0-9.]+)", stats)
                    found[name].append(float(per_call.group(1)))
        finally:
            server.kill()
    print(f"Redis µs per call (INFO commandstats usec_per_call), redis-benchmark -c 32 -n "
          f"{opts.requests}, median of {opts.rounds} rounds:")
    for name, values in found.items():
        print(f"  {name:38} {statistics.median(values):6.2f}   ({' / '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
