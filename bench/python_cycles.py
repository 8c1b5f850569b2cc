"""The Python rows of `make bench`: what a Python agent pays per guarded action, beside its peers.

Runs in the bench's own virtualenv (`.venv-bench`: the oncegate client, Powertools with its Redis
persistence layer, redis-py), against a Redis and gates on that Redis that python_side.py
started. Each contender runs the same full cycle around a no-op tool in `--workers` processes
for `--seconds`, every cycle a new action (nothing is replayed):

- `powertools`: AWS Lambda Powertools' `@idempotent_function` with `RedisCachePersistenceLayer`;
- `seed-authorizer`: the seeds' redis-py authorizer (EXISTS, EXISTS, SETEX, the tool, SETEX,
  DEL; its check-then-set race left as the seed wrote it);
- `oncegate-decorator`: `@gate.action(...)` of the oncegate client, through the gate (`--gate`,
  at its defaults), on the client's native core (`oncegate._native`);
- `oncegate-decorator-serving-threads`: the same through a gate with `--serving-threads 2`
  (`--threads-gate`; skipped without it);
- `oncegate-decorator-signed`: the same through a gate that signs grants and receipts
  (`--signed-gate`; skipped without it);
- `oncegate-decorator-grpcio`: the same on grpcio alone (`ONCEGATE_PURE_PYTHON=1`);
- `oncegate-decorator-in-process`: the same decorator with the gate in each worker process
  (`oncegate.local` on the same Redis, `--unsigned`): the gate's code runs in the worker and its
  calls skip the socket, so the gate's CPU is the client's here;
- `oncegate-native-stubs`: the native core's stubs alone (`oncegate.native.Stub`), RequestToken +
  Complete, through the gate; what the guard adds on top of this is the guard's overhead;
- `oncegate-raw-stubs`: the generated grpcio stubs alone, RequestToken + Complete.

Prints one JSON object: per contender, cycles/s (all workers together) and client CPU µs per
cycle (user + system of the worker processes, divided by their cycles). Given the servers' process
ids (`--gate-pid`, `--signed-gate-pid`, `--threads-gate-pid`, `--redis-pid`), also their CPU µs per
cycle, and the share of the machine's CPU time that was idle, both over the measured seconds only
(the workers start them together, after their warm-up): where a cycle's CPU goes, and whether the
machine was busy. instructions.py imports its cycles to count Redis's instructions per cycle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import resource
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from harness import cpu_seconds  # beside this file: a process's CPU from /proc

CONTENDERS = [
    "powertools",
    "seed-authorizer",
    "oncegate-decorator",
    "oncegate-decorator-serving-threads",
    "oncegate-decorator-signed",
    "oncegate-decorator-grpcio",
    "oncegate-decorator-in-process",
    "oncegate-native-stubs",
    "oncegate-raw-stubs",
]


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_ticks() -> tuple[int, int]:
    """(idle, all) clock ticks of every CPU so far, from /proc/stat (idle counts iowait)."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def powertools_cycle(redis_url: str):
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent_function,
    )
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    import warnings

    # Outside Lambda there is no remaining-time to read; Powertools warns on every call.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
    host, port = redis_url.removeprefix("redis://").split(":")
    store = RedisCachePersistenceLayer(host=host, port=int(port), ssl=False)
    config = IdempotencyConfig(expires_after_seconds=86400)

    @idempotent_function(data_keyword_argument="order", persistence_store=store, config=config)
    def tool(order: dict) -> dict:
        return {"ok": True}

    def cycle(n: int) -> None:
        tool(order={"id": f"{os.getpid()}-{n}", "amount": 100})

    return cycle


def seed_cycle(redis_url: str):
    import redis

    storage = redis.Redis.from_url(redis_url)

    def cycle(n: int) -> None:
        params = {"id": f"{os.getpid()}-{n}", "amount": 100}
        fingerprint = hashlib.sha256(
            f"noop:{json.dumps(params, sort_keys=True)}".encode()
        ).hexdigest()
        key = f"agent:run:{fingerprint}"
        if storage.exists(f"completed:{key}"):
            return
        if not storage.exists(f"authorized:{key}"):
            storage.setex(f"authorized:{key}", 300, str(uuid.uuid4()))
        result = {"success": True}
        if result["success"]:
            storage.setex(f"completed:{key}", 86400, "done")
            storage.delete(f"authorized:{key}")

    return cycle


def decorator_cycle(gate_addr: str):
    from oncegate import Gate

    return decorated_cycle(Gate(gate_addr))


def decorated_cycle(gate: Any):
    """The decorator's cycle, every row's: a new action around the no-op tool, through ``gate``."""

    @gate.action("bench.noop")
    def tool(order_id: str, amount: int, *, grant: Any) -> dict:
        return {"ok": True}

    def cycle(n: int) -> None:
        with gate.scope(agent_id="bench-agent", run_id=f"run-{os.getpid()}"):
            tool(order_id=f"{os.getpid()}-{n}", amount=100)

    return cycle


SCRATCH: str | None = None
"""A directory for the gates in process, made by :func:`measure` before the workers fork and
removed after they ended (a worker leaves through ``os._exit`` and removes nothing itself)."""


def in_process_cycle(redis_url: str):
    import oncegate

    data_dir = tempfile.mkdtemp(prefix="gate-", dir=SCRATCH)
    flags = ["--redis-url", redis_url, "--unsigned", "--no-admin-socket", "--worker-threads", "1"]
    return decorated_cycle(oncegate.local(data_dir, flags=flags))


def raw_cycle(gate_addr: str, native: bool = False):
    import grpc

    from oncegate import native as transport
    from oncegate.v1 import oncegate_pb2 as pb
    from oncegate.v1 import oncegate_pb2_grpc as pb_grpc

    if native:
        stub = transport.Stub(transport.open_channel(f"http://{gate_addr}", 10.0))
    else:
        stub = pb_grpc.ActionGateServiceStub(grpc.insecure_channel(gate_addr))
    scope = pb.Scope(agent_id="bench-agent", run_id=f"run-{os.getpid()}")

    def cycle(n: int) -> None:
        params = json.dumps({"order_id": f"{os.getpid()}-{n}", "amount": 100})
        resp = stub.RequestToken(
            pb.RequestTokenRequest(scope=scope, action="bench.noop", params_json=params)
        )
        stub.Complete(
            pb.CompleteRequest(action=resp.action, token=resp.grant.token, receipt=b'{"ok":true}')
        )

    return cycle


def worker(contender: str, redis_url: str, gate_addr: str, seconds: float, start, out) -> None:
    try:
        if contender == "oncegate-decorator-grpcio":
            os.environ["ONCEGATE_PURE_PYTHON"] = "1"  # before oncegate is imported
        out.put(run_worker(contender, redis_url, gate_addr, seconds, start))
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which fails
        import traceback

        start.abort()  # nobody waits for a worker that will not come
        out.put(("error", "".join(traceback.format_exception(error))))


def run_worker(contender: str, redis_url: str, gate_addr: str, seconds: float, start) -> tuple:
    make = {
        "powertools": lambda: powertools_cycle(redis_url),
        "seed-authorizer": lambda: seed_cycle(redis_url),
        "oncegate-decorator": lambda: decorator_cycle(gate_addr),
        "oncegate-decorator-serving-threads": lambda: decorator_cycle(gate_addr),
        "oncegate-decorator-signed": lambda: decorator_cycle(gate_addr),
        "oncegate-decorator-grpcio": lambda: decorator_cycle(gate_addr),
        "oncegate-decorator-in-process": lambda: in_process_cycle(redis_url),
        "oncegate-native-stubs": lambda: raw_cycle(gate_addr, native=True),
        "oncegate-raw-stubs": lambda: raw_cycle(gate_addr),
    }[contender]
    cycle = make()
    for n in range(20):  # warm-up: connections, imports, caches
        cycle(-1 - n)
    start.wait()  # every worker warm, and the parent reading the servers' CPU
    start_cpu, began, n = cpu(), time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        cycle(n)
        n += 1
    return (n, time.perf_counter() - began, cpu() - start_cpu)


GATE_OF = {
    "oncegate-decorator-signed": "signed_gate",
    "oncegate-decorator-serving-threads": "threads_gate",
}
"""The rows that go through another gate than `--gate`: the option that names it."""


def measure(contender: str, args) -> dict:
    which = GATE_OF.get(contender, "gate")
    gate = getattr(args, which)
    servers = {"redis": args.redis_pid}
    # The gate server idles while Powertools and the seed run, and while the gates in process do.
    if contender.startswith("oncegate-") and contender != "oncegate-decorator-in-process":
        servers["gate"] = getattr(args, f"{which}_pid")
    servers = {name: pid for name, pid in servers.items() if pid}
    global SCRATCH
    scratch = tempfile.TemporaryDirectory(prefix="oncegate-bench-local-")
    SCRATCH = scratch.name
    out = multiprocessing.Queue()
    start = multiprocessing.Barrier(args.workers + 1)
    procs = [
        multiprocessing.Process(
            target=worker, args=(contender, args.redis_url, gate, args.seconds, start, out)
        )
        for _ in range(args.workers)
    ]
    for p in procs:
        p.start()
    try:
        start.wait(timeout=120)
    except threading.BrokenBarrierError:
        pass  # a worker failed before it was warm: its error is in `out`
    before = {name: cpu_seconds(pid) for name, pid in servers.items()}
    idle_before, all_before = machine_ticks()
    results = [out.get(timeout=args.seconds + 120) for _ in procs]
    idle_after, all_after = machine_ticks()
    used = {name: cpu_seconds(pid) - before[name] for name, pid in servers.items()}
    for p in procs:
        p.join()
    scratch.cleanup()
    for result in results:
        if result[0] == "error":
            raise RuntimeError(f"{contender} worker failed:\n{result[1]}")
    cycles = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    cpu_s = sum(r[2] for r in results)
    report = {
        "cycles_per_s": cycles / elapsed,
        "client_cpu_us_per_cycle": cpu_s / cycles * 1e6,
        "cycles": cycles,
        "machine_idle": (idle_after - idle_before) / max(1, all_after - all_before),
    }
    for name, seconds in used.items():
        report[f"{name}_cpu_us_per_cycle"] = seconds / cycles * 1e6
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--gate", required=True, help="host:port of a gate on that Redis")
    parser.add_argument("--signed-gate", help="host:port of a signing gate on that Redis")
    parser.add_argument("--threads-gate", help="host:port of a gate with --serving-threads 2")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", choices=CONTENDERS, action="append")
    parser.add_argument("--gate-pid", type=int, help="the gate's process, to read its CPU")
    parser.add_argument("--signed-gate-pid", type=int, help="the signing gate's process")
    parser.add_argument("--threads-gate-pid", type=int, help="the --serving-threads 2 gate's process")
    parser.add_argument("--redis-pid", type=int, help="redis-server's process")
    args = parser.parse_args()
    chosen = [c for c in (args.only or CONTENDERS) if getattr(args, GATE_OF.get(c, "gate"))]
    print(json.dumps({c: measure(c, args) for c in chosen}))


if __name__ == "__main__":
    main()
