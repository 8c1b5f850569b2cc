"""The nemesis: faults on a seeded random schedule, each recorded with when it began and ended.

Kinds (each deployment takes those that apply to it):

* ``kill-gate``: SIGKILL a gate, restart it on the same port (and data directory) 0.2-2 s later.
* ``pause-redis``: SIGSTOP a Redis data node for 0.5-4 s, then SIGCONT (longer than Sentinel's
  ``down-after-milliseconds`` or the Cluster's node timeout, sometimes: a failover under it).
* ``failover`` (Sentinel): SIGKILL the master, wait for the sentinels to promote a replica, restart
  the old master (it rejoins as a replica). On PostgreSQL: SIGKILL the primary's processes,
  ``pg_ctl promote`` the synchronous standby, rebuild a standby from it in the old primary's place
  (:meth:`soaklib.postgres.Postgres.failover`).
* ``pause-postgres``: SIGSTOP every process of the primary or of the standby for 0.5-4 s, then
  SIGCONT (a paused standby holds every commit: the replication is synchronous).
* ``restart-node`` (Cluster): SIGKILL a node, restart it 0.5-4 s later from its AOF and nodes.conf.
* ``pause-client``: SIGSTOP a client process (its heartbeats too) past the lease, then SIGCONT.
* ``ambiguous``: for 1-4 s the provider performs each effect and then times out.
* ``reconcile``: an operator round (ListUnresolved, ask the provider, ResolveExpired).

A fault's window ends when it is healed and the store is whole again (bounded wait), so the
availability per window includes the recovery. Everything runs in the main thread (it restarts
processes; see :mod:`soaklib.procs`).
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from typing import Any

from soaklib.deploy import Cluster, Deployment, Sentinel
from soaklib.history import History
from soaklib.operator import Operator
from soaklib.postgres import Postgres
from soaklib.procs import signal_proc, wait_until
from soaklib.provider import Provider

COMMON = ["kill-gate", "pause-client", "ambiguous", "reconcile"]


class Nemesis:
    def __init__(self, deployment: Deployment, clients: list[subprocess.Popen[Any]], provider: Provider,
                 operator: Operator, history: History, rng: random.Random, lease_seconds: float) -> None:
        self.d = deployment
        self.clients = clients
        self.provider = provider
        self.operator = operator
        self.history = history
        self.rng = rng
        self.lease = lease_seconds
        self.kinds = list(COMMON)
        if isinstance(deployment, Sentinel):
            self.kinds += ["pause-redis", "failover"]
        if isinstance(deployment, Cluster):
            self.kinds += ["pause-redis", "restart-node"]
        if isinstance(deployment, Postgres):
            self.kinds += ["pause-postgres", "failover"]
        self.counts: dict[str, int] = {}

    def step(self, kind: str | None = None) -> None:
        """One fault (``kind``, else a random one): applied, healed, recorded."""
        kind = kind or self.rng.choice(self.kinds)
        start = time.time()
        target, detail = getattr(self, "_" + kind.replace("-", "_"))()
        self._wait_whole()
        self.history.write(t="nemesis", kind=kind, target=target, start=start, end=time.time(), detail=detail)
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def _wait_whole(self) -> None:
        wait_until("the store is whole", 30, self.d.healthy, interval=0.2)

    def _kill_gate(self) -> tuple[str, str]:
        gate = self.rng.choice(self.d.gates)
        gate.kill()
        down = self.rng.uniform(0.2, 2.0)
        time.sleep(down)
        gate.start()
        return gate.name, f"down {down:.1f}s"

    def _pause_redis(self) -> tuple[str, str]:
        return self._pause_node()

    def _pause_postgres(self) -> tuple[str, str]:
        assert isinstance(self.d, Postgres)
        primary = self.d.nodes[self.d.primary]
        target, detail = self._pause_node()
        return target, f"{'primary' if target == primary.name else 'standby'} {detail}"

    def _pause_node(self) -> tuple[str, str]:
        node = self.rng.choice(self.d.nodes)
        paused = self.rng.uniform(0.5, 4.0)
        node.pause()
        time.sleep(paused)
        node.resume()
        return node.name, f"paused {paused:.1f}s"

    def _failover(self) -> tuple[str, str]:
        if isinstance(self.d, Postgres):
            return self.d.failover()
        assert isinstance(self.d, Sentinel)
        port = self.d.master_port()
        if port is None:
            return "none", "no master known"
        node = self.d.node(port)
        node.kill()
        promoted = wait_until("a replica is promoted", 20, lambda: self.d.master_port() not in (None, port))
        new_master = self.d.master_port()
        # The old master comes back from its AOF as a replica of the new one.
        node.start(["--replicaof", "127.0.0.1", str(new_master)] if new_master and new_master != port else [])
        return node.name, f"promoted={promoted} new master port {new_master}"

    def _restart_node(self) -> tuple[str, str]:
        node = self.rng.choice(self.d.nodes)
        role = "?"
        try:
            role = node.role()
        except OSError:
            pass
        node.kill()
        down = self.rng.uniform(0.5, 4.0)
        time.sleep(down)
        node.start()
        return node.name, f"{role} down {down:.1f}s"

    def _pause_client(self) -> tuple[str, str]:
        index = self.rng.randrange(len(self.clients))
        paused = self.lease + self.rng.uniform(0.5, 3.0)
        signal_proc(self.clients[index], signal.SIGSTOP)
        time.sleep(paused)
        signal_proc(self.clients[index], signal.SIGCONT)
        return f"client-{index}", f"paused {paused:.1f}s"

    def _ambiguous(self) -> tuple[str, str]:
        window = self.rng.uniform(1.0, 4.0)
        self.provider.ambiguous = True
        time.sleep(window)
        self.provider.ambiguous = False
        return "provider", f"ambiguous {window:.1f}s"

    def _reconcile(self) -> tuple[str, str]:
        gate = self.rng.randrange(len(self.d.gates))
        counts = self.operator.reconcile(gate)
        return self.d.gates[gate].name, " ".join(f"{k}={v}" for k, v in counts.items())

    def heal(self) -> None:
        """Resumes and restarts everything (end of the run, or after an error)."""
        self.provider.ambiguous = False
        for client in self.clients:
            signal_proc(client, signal.SIGCONT)
        for node in self.d.nodes:
            if node.paused:
                node.resume()
            if node.proc is None or node.proc.poll() is not None:
                node.start()
        for gate in self.d.gates:
            if gate.proc is None or gate.proc.poll() is not None:
                gate.start()
        self._wait_whole()
