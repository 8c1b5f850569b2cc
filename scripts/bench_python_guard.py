"""Where the Python guard's cost goes, in one process: client CPU per cycle (RequestToken +
Complete around a no-op) through the bare grpcio stubs, the native core's bare stubs
(`oncegate.native.Stub`, with the generated messages), its plain-value calls
(`Stub.request_token`, `Stub.complete`: what the RPC layer calls on it), the RPC layer
(`oncegate.rpc.GateRpc`) and the decorator, against a running gate: `decorator` enters its scope on
every call (as `make bench`'s cycle does), `in-run` is the same decorated call with its scope set
once (as an agent's run sets it, and as the stubs build theirs once). The RPC layer and the
decorator run on the native core, or on grpcio with ONCEGATE_PURE_PYTHON=1 (then the native and
plain rows are skipped). An A/B aid for BENCHMARKS.md's Python section; `make bench` is the
reproducible comparison.

    target/release/oncegate serve --listen 127.0.0.1:50999 --data-dir /tmp/ab --unsigned &
    .venv-bench/bin/python scripts/bench_python_guard.py --target 127.0.0.1:50999 --rounds 3

Prints one line per layer and round: client CPU and wall time per cycle. `--profile` prints the
decorator's cProfile instead. Instructions per cycle, which the machine's other work does not move:

    for n in 200 1200; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      .venv-bench/bin/python scripts/bench_python_guard.py --target 127.0.0.1:50999 \
      --only decorator --rounds 1 --cycles $n 2>&1 | grep Collected; done
    # (second - first) / 1000 = instructions per cycle
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from typing import Any, Callable

import grpc

from oncegate import Gate, native
from oncegate.rpc import GateRpc
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.v1 import oncegate_pb2_grpc as pb_grpc

RUN = f"run-{os.getpid()}"


def stubs(target: str, native_core: bool = False) -> Callable[[str], None]:
    if native_core:
        stub = native.Stub(native.open_channel(f"http://{target}", 10.0))
    else:
        stub = pb_grpc.ActionGateServiceStub(grpc.insecure_channel(target))
    scope = pb.Scope(agent_id="bench-agent", run_id=RUN)

    def cycle(key: str) -> None:
        params = json.dumps({"order_id": key, "amount": 100})
        resp = stub.RequestToken(pb.RequestTokenRequest(scope=scope, action="bench.noop", params_json=params))
        stub.Complete(pb.CompleteRequest(action=resp.action, token=resp.grant.token, receipt=b'{"ok":true}'))

    return cycle


def plain(target: str) -> Callable[[str], None]:
    """The native core's plain-value calls alone (what the RPC layer calls on it): no protobuf
    object in Python, no error translation, no guard."""
    stub = native.Stub(native.open_channel(f"http://{target}", 10.0))
    call = {"timeout": 10.0, "metadata": ()}

    def cycle(key: str) -> None:
        params = json.dumps({"order_id": key, "amount": 100})
        answer = stub.request_token("bench.noop", params, "bench-agent", RUN, "", "", "", None, **call)
        assert answer.grant is not None
        stub.complete(answer.action, answer.grant.token, b'{"ok":true}', **call)

    return cycle


def rpc_layer(target: str) -> Callable[[str], None]:
    rpc = GateRpc(target)

    def cycle(key: str) -> None:
        answer = rpc.request_token("bench.noop", {"order_id": key, "amount": 100}, agent_id="bench-agent", run_id=RUN)
        assert answer.grant is not None
        rpc.complete(answer.action, answer.grant.token, b'{"ok":true}')

    return cycle


def decorator(target: str) -> Callable[[str], None]:
    gate = Gate(target)

    @gate.action("bench.noop")
    def tool(order_id: str, amount: int, *, grant: Any) -> dict[str, bool]:
        return {"ok": True}

    def cycle(key: str) -> None:
        with gate.scope(agent_id="bench-agent", run_id=RUN):
            tool(order_id=key, amount=100)

    return cycle


def decorator_in_run(target: str) -> Callable[[str], None]:
    """The decorator with its scope set once, as an agent's run sets it (and as the stubs build
    their scope once): the guarded call alone."""
    gate = Gate(target)

    @gate.action("bench.noop")
    def tool(order_id: str, amount: int, *, grant: Any) -> dict[str, bool]:
        return {"ok": True}

    # Entered for the rest of the process: the other layers name their scope themselves.
    gate.scope(agent_id="bench-agent", run_id=RUN).__enter__()

    def cycle(key: str) -> None:
        tool(order_id=key, amount=100)

    return cycle


LAYERS = {
    "grpcio": stubs,
    "native": lambda target: stubs(target, native_core=True),
    "plain": plain,
    "rpc": rpc_layer,
    "decorator": decorator,
    "in-run": decorator_in_run,
}


def measure(name: str, cycle: Callable[[str], None], cycles: int, round_: int) -> None:
    for i in range(200):  # warm-up: connection, caches
        cycle(f"{name}-{round_}-warm-{i}")
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(cycles):
        cycle(f"{name}-{round_}-{i}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"round {round_} {name:9} client CPU {cpu / cycles * 1e6:6.0f} µs/cycle, wall {wall / cycles * 1e6:6.0f} µs/cycle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="127.0.0.1:50051", help="the gate (host:port)")
    parser.add_argument("--cycles", type=int, default=3000, help="cycles per layer and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--profile", action="store_true", help="cProfile the decorator instead")
    parser.add_argument(
        "--only",
        choices=sorted(LAYERS),
        help="run this layer alone (for instruction counts under valgrind --tool=callgrind: the "
        "difference between two runs of different --cycles is the layer's cost)",
    )
    args = parser.parse_args()
    cycles = {
        name: make(args.target)
        for name, make in LAYERS.items()
        if (name not in ("native", "plain") or native.enabled()) and args.only in (None, name)
    }
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        measure("decorator", cycles["decorator"], args.cycles, 0)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    for round_ in range(args.rounds):
        for name, cycle in cycles.items():
            measure(name, cycle, args.cycles, round_)


if __name__ == "__main__":
    main()
