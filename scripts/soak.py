#!/usr/bin/env python3
"""`make soak`: the gate under a nemesis, checked from the recorded history (Jepsen-style).

For each deployment asked for (``embedded``, ``sentinel``, ``cluster``; see
``soaklib/deploy.py``; ``postgres``, see ``soaklib/postgres.py``), on 127.0.0.1 only: start it, start the fake provider and client processes
that run the real Python guard, let the seeded nemesis inject faults until the duration has passed,
heal everything, wait for every lease to end, take the operator's final ``ListUnresolved``, scrape
each gate's double-execution counter, stop every process, merge the history (JSON lines, in
``--out``) and run the checker (``soaklib/checker.py``) on it. Prints one summary per deployment
and exits 1 when any rule was broken. Every process it starts dies with it, interrupted or not.

Needs the Python client (``clients/python``) importable: run it with the venv ``make`` builds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soaklib import checker  # noqa: E402
from soaklib.summary import summary  # noqa: E402
from soaklib.deploy import Cluster, Deployment, Embedded, Sentinel  # noqa: E402
from soaklib.history import History, merge  # noqa: E402
from soaklib.nemesis import Nemesis  # noqa: E402
from soaklib.operator import Operator  # noqa: E402
from soaklib.postgres import Postgres  # noqa: E402
from soaklib.procs import kill, kill_all, spawn  # noqa: E402
from soaklib.provider import Provider  # noqa: E402
from soaklib.resolver import Resolvers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LEASE_SECONDS = 2.0
DEPLOYMENTS: dict[str, type[Deployment]] = {d.name: d for d in (Embedded, Sentinel, Cluster, Postgres)}
SIZE_SAMPLE_SECONDS = 10.0


def hash_key(binary: Path, key: str) -> str:
    out = subprocess.run([str(binary), "hash-key"], input=key, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def config_toml(binary: Path, worker_key: str, ops_key: str, resolver_key: str,
                retention: float | None = None) -> str:
    retention_line = f"retention_seconds = {retention}" if retention else ""
    return f"""
[defaults]
lease_ttl_seconds = {LEASE_SECONDS}
{retention_line}

[actions."soak.reconcile"]
on_expiry = "reconcile"

[actions."soak.regrant"]
on_expiry = "regrant"

[[principals]]
name = "soak-worker"
role = "agent"
agents = ["soak-agent-*"]
api_key_sha256 = "{hash_key(binary, worker_key)}"

[[principals]]
name = "soak-operator"
role = "operator"
api_key_sha256 = "{hash_key(binary, ops_key)}"

[[principals]]
name = "soak-resolver"
role = "resolver"
agents = ["soak-agent-*"]
api_key_sha256 = "{hash_key(binary, resolver_key)}"
"""


def scrape_double_executions(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    series = {}
    for line in text.splitlines():
        if line.startswith("oncegate_double_executions_total"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def sample_table_sizes(deployment: Postgres, history: History) -> None:
    """One ``table_sizes`` event: every table's ``pg_total_relation_size`` on the primary (skipped
    while the primary does not answer)."""
    try:
        sizes = deployment.table_sizes()
    except OSError:
        return
    history.write(t="table_sizes", time=time.time(), sizes=sizes)


def run_deployment(kind: str, args: argparse.Namespace, out: Path) -> int:
    """Runs one deployment's soak; returns the number of violations."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()
    work = out / "work"  # data of the run's processes; under --out, so a killed run's is removed next time
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    seed = args.seed
    rng = random.Random(f"{seed}-{kind}")
    worker_key, ops_key, resolver_key = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(16)
    config = work / "oncegate.toml"
    config.write_text(config_toml(args.binary, worker_key, ops_key, resolver_key, args.retention))
    # One replica per shard; one synchronous standby.
    durability = min(args.durability, 1) if kind in ("cluster", "postgres") else args.durability
    deployment: Deployment = DEPLOYMENTS[kind](args.binary, work, config, durability)
    history = History(out / "history-soak.jsonl")
    provider = Provider(history, seed)
    clients: list[subprocess.Popen[bytes]] = []
    operator = None
    resolvers = None
    finished = False
    try:
        deployment.start()
        provider.start()
        gates = [(g.name, g.target) for g in deployment.gates]
        started = time.time()
        deadline = started + args.duration
        history.write(t="run", time=started, deployment=kind, seed=seed, duration=args.duration,
                      gates=gates, lease_seconds=LEASE_SECONDS, durability=durability,
                      regrant_actions=["soak.regrant"], resolver=args.resolver)
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent))
        for i in range(args.clients):
            settings = {"client": i, "seed": seed, "gates": gates, "api_key": worker_key,
                        "provider_port": provider.port, "deadline": deadline, "started": started,
                        "threads": args.threads, "history": str(out / f"history-client-{i}.jsonl"),
                        "retention": args.retention}
            clients.append(spawn([sys.executable, "-m", "soaklib.client", json.dumps(settings)], env=env))
        operator = Operator(history, gates, ops_key, provider.port)
        nemesis = Nemesis(deployment, clients, provider, operator, history, rng, LEASE_SECONDS)
        nemesis.kinds = [k for k in nemesis.kinds if k not in args.skip_faults]
        if args.resolver:  # the resolvers settle what the provider can tell; the operator only lists
            nemesis.kinds.remove("reconcile")
            resolvers = Resolvers(history, gates, resolver_key, provider.port)
            resolvers.start()
        print(f"[{kind}] running {args.duration:.0f}s, seed {seed}, {len(gates)} gate(s), "
              f"{args.clients}x{args.threads} clients", flush=True)
        closing = deadline - 3.0
        sampled = 0.0
        while time.time() < closing:
            time.sleep(min(rng.uniform(0.5, 3.0), max(0.0, closing - time.time())))
            if isinstance(deployment, Postgres) and time.time() - sampled >= SIZE_SAMPLE_SECONDS:
                sampled = time.time()
                sample_table_sizes(deployment, history)
            if time.time() < closing:
                nemesis.step()
        # The run ends in an ambiguous window, so outcomes are unknown at the end and the final
        # listing has actions it must find.
        nemesis.step("ambiguous")
        nemesis.heal()
        for client in clients:
            try:
                client.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill(client)
        # Every lease ends (no heartbeat is left), then the operator lists what is unresolved.
        time.sleep(LEASE_SECONDS + 1.0)
        if resolvers is not None:  # until only what the provider cannot tell is left (or 30 s)
            operator.settled_by_resolvers(provider.cannot_tell, time.time() + 30)
            resolvers.stop()
        operator.final_listing(time.time() + 60)
        if isinstance(deployment, Postgres):
            sample_table_sizes(deployment, history)
        for gate in deployment.gates:
            history.write(t="metrics", time=time.time(), gate=gate.name, incarnation=gate.incarnation,
                          double_executions=scrape_double_executions(gate.metrics_port))
        finished = True
    finally:
        if resolvers is not None:
            resolvers.stop()
        if operator is not None:
            operator.close()
        for client in clients:
            kill(client)
        deployment.stop()
        provider.stop()
        history.close()
        for log in work.glob("gate-*.log"):  # the gates' own logs stay beside the history
            shutil.copy(log, out / log.name)
        if finished:  # a run that broke keeps its processes' data and logs for a look
            shutil.rmtree(work, ignore_errors=True)
    total = merge(sorted(out.glob("history-*.jsonl")), out / "history.jsonl")
    events = checker.load(out / "history.jsonl")
    report = checker.check(events)
    print(summary(events, report, title=f"{kind}: {total} events, history {out / 'history.jsonl'}"))
    return len(report.violations)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployments", default="embedded,sentinel,cluster,postgres",
                        help="comma-separated: embedded, sentinel, cluster, postgres")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds per deployment (default 300)")
    parser.add_argument("--seed", type=int, default=None, help="nemesis and workload seed (default: random)")
    parser.add_argument("--clients", type=int, default=3, help="client processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per client process")
    parser.add_argument("--out", type=Path, default=ROOT / "target" / "soak", help="where histories go")
    parser.add_argument("--durability", type=int, default=1,
                        help="the gates' --durability-replicas on Sentinel (2 replicas; default 1) and "
                             "on PostgreSQL (1 synchronous standby); the Cluster (1 replica per master) "
                             "takes at most 1")
    parser.add_argument("--retention", type=float, default=None,
                        help="the policies' retention_seconds (default: the gate's); clients then ask "
                             "again only keys younger than half of it, so purged records are never "
                             "asked for (what lets the tables' sizes settle in a long soak)")
    parser.add_argument("--skip-faults", default="", type=lambda v: {k for k in v.split(",") if k},
                        help="comma-separated fault kinds the nemesis must not use")
    parser.add_argument("--resolver", action="store_true",
                        help="resolvers (one per gate, the Python client's) settle expired leases by "
                             "asking the provider by provider key, instead of the operator's rounds")
    parser.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "oncegate")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)
    if not args.binary.exists():
        parser.error(f"{args.binary} does not exist: cargo build --release --bin oncegate")
    kinds = [k.strip() for k in args.deployments.split(",") if k.strip()]
    for kind in kinds:
        if kind not in DEPLOYMENTS:
            parser.error(f"unknown deployment {kind!r}")

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    violations = 0
    try:
        for kind in kinds:
            violations += run_deployment(kind, args, args.out / kind)
    except KeyboardInterrupt as interruption:
        print(f"soak: interrupted ({interruption}); every process it started is stopped", file=sys.stderr)
        return 130
    finally:
        kill_all()
    print(f"soak: seed {args.seed}, {args.duration:.0f}s per deployment, {violations} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
