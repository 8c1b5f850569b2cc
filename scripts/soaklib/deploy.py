"""The deployments the soak runs on, on 127.0.0.1 only: Redis nodes, Sentinel, Cluster, gates.

* ``embedded``: one gate on the embedded store (its data directory survives SIGKILL + restart).
* ``sentinel``: a master with two replicas and three sentinels; three gates at durability level 1
  (``--durability``).
* ``cluster``: three masters with one replica each; three gates at durability level 1.
* ``postgres``: a primary and a synchronous standby; in ``soaklib/postgres.py``.

Redis runs as docs/deployment.md recommends for payments ("Durability levels"): ``appendonly yes``,
``appendfsync always``, ``min-replicas-to-write 1``, ``maxmemory-policy noeviction``. Every node
and gate keeps its port across restarts, so a restarted gate is reached at the same address and a
restarted Redis node finds its data (AOF) and, in a Cluster, its ``nodes.conf``. The shapes follow
``tests/integration/support/topology.rs``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from soaklib.procs import free_port, kill, redis_cmd, signal_proc, spawn, wait_until

MASTER_NAME = "oncegate-soak"
REDIS_SAFE = [
    "--appendonly", "yes", "--appendfsync", "always", "--save", "",
    "--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0",
    "--min-replicas-to-write", "1", "--min-replicas-max-lag", "10",
]


class RedisNode:
    """A ``redis-server`` on a fixed loopback port with its own directory."""

    def __init__(self, root: Path, name: str, extra: list[str]) -> None:
        self.name = name
        self.port = free_port()
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.extra = extra
        self.proc: subprocess.Popen[Any] | None = None
        self.paused = False

    def start(self, extra: list[str] | None = None) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), *self.extra, *(extra or [])]
        log = self.dir / "redis.log"
        with open(log, "a") as out:
            self.proc = spawn(args, stdout=out, stderr=subprocess.STDOUT)
        self.paused = False
        # Loading a large AOF on a busy machine takes a while (it answers LOADING meanwhile).
        if not wait_until(f"{self.name} answers", 60, lambda: redis_cmd(self.port, "PING") == "PONG"):
            tail = log.read_text(errors="replace").splitlines()[-8:]
            raise RuntimeError(f"{self.name} on port {self.port} did not start: " + " | ".join(tail))

    def kill(self) -> None:
        kill(self.proc)
        self.proc = None
        self.paused = False

    def pause(self) -> None:
        signal_proc(self.proc, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        signal_proc(self.proc, signal.SIGCONT)
        self.paused = False

    def role(self) -> str:
        reply = redis_cmd(self.port, "ROLE", timeout=1.0)
        return str(reply[0])


class Gate:
    """``oncegate serve`` on a fixed loopback port, with its metrics endpoint, logging to a file."""

    def __init__(self, binary: Path, root: Path, name: str, store_args: list[str], config: Path) -> None:
        self.binary = binary
        self.name = name
        self.port = free_port()
        self.metrics_port = free_port()
        self.store_args = store_args
        self.config = config
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen[Any] | None = None
        self.incarnation = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Starts the gate and waits for ``listening on``; a port still held by the previous
        incarnation is retried for a few seconds."""
        for _ in range(40):
            args = [str(self.binary), "serve", "--listen", self.target, "--config", str(self.config),
                    "--metrics-listen", f"127.0.0.1:{self.metrics_port}", "--drain-seconds", "1",
                    *self.store_args]
            env = dict(os.environ, RUST_LOG=os.environ.get("SOAK_GATE_LOG", "warn"))
            with open(self.log, "a") as log:
                proc = spawn(args, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
            ready, _, _ = select.select([proc.stdout], [], [], 15)
            line = proc.stdout.readline() if ready and proc.stdout else ""
            if line.startswith("listening on "):
                self.proc = proc
                self.incarnation += 1
                return
            kill(proc)
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} did not start; see {self.log}")

    def kill(self) -> None:
        kill(self.proc)
        self.proc = None


def _sentinel_conf(path: Path, port: int, master_port: int) -> None:
    path.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {path.parent}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
        f"sentinel failover-timeout {MASTER_NAME} 4000\n"
        f"sentinel parallel-syncs {MASTER_NAME} 2\n"
    )


class Deployment:
    """Gates over one store; ``nodes`` are the Redis data nodes (none for the embedded store)."""

    name = ""

    def __init__(self, binary: Path, root: Path, config: Path, durability: int = 1) -> None:
        self.binary = binary
        self.root = root
        self.config = config
        self.durability = durability
        self.nodes: list[RedisNode] = []
        self.gates: list[Gate] = []
        self.sentinels: list[RedisNode] = []

    def start(self) -> None:
        raise NotImplementedError

    def healthy(self) -> bool:
        """Whether the store side is whole again (used to close a fault's window)."""
        return True

    def stop(self) -> None:
        for proc_owner in [*self.gates, *self.nodes, *self.sentinels]:
            proc_owner.kill()


class Embedded(Deployment):
    name = "embedded"

    def start(self) -> None:
        data = self.root / "gate-data"
        self.gates = [Gate(self.binary, self.root, "gate-0", ["--data-dir", str(data)], self.config)]
        self.gates[0].start()


class Sentinel(Deployment):
    name = "sentinel"

    def start(self) -> None:
        master = RedisNode(self.root, "redis-0", REDIS_SAFE)
        master.start()
        self.nodes = [master]
        for i in (1, 2):
            node = RedisNode(self.root, f"redis-{i}", REDIS_SAFE)
            node.start(["--replicaof", "127.0.0.1", str(master.port)])
            self.nodes.append(node)
        for i in range(3):
            node = RedisNode(self.root, f"sentinel-{i}", [])
            conf = node.dir / "sentinel.conf"
            _sentinel_conf(conf, node.port, master.port)
            node.proc = spawn(["redis-server", str(conf), "--sentinel"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if not wait_until("a sentinel answers", 15, lambda p=node.port: redis_cmd(p, "PING") == "PONG"):
                raise RuntimeError("a sentinel did not start")
            self.sentinels.append(node)
        if not wait_until("the sentinels see everything", 30, self._sentinels_ready):
            raise RuntimeError("the sentinels did not see the deployment")
        store = ["--redis-sentinels", ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels),
                 "--redis-sentinel-master", MASTER_NAME, "--durability-replicas", str(self.durability)]
        self.gates = [Gate(self.binary, self.root, f"gate-{i}", store, self.config) for i in range(3)]
        for gate in self.gates:
            gate.start()

    def _sentinels_ready(self) -> bool:
        for s in self.sentinels:
            replicas = redis_cmd(s.port, "SENTINEL", "REPLICAS", MASTER_NAME)
            peers = redis_cmd(s.port, "SENTINEL", "SENTINELS", MASTER_NAME)
            if len(replicas) != 2 or len(peers) != 2:
                return False
        return True

    def master_port(self) -> int | None:
        for s in self.sentinels:
            try:
                reply = redis_cmd(s.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME, timeout=1.0)
                return int(reply[1])
            except Exception:  # noqa: BLE001 - any sentinel that answers will do
                continue
        return None

    def node(self, port: int) -> RedisNode:
        return next(n for n in self.nodes if n.port == port)

    def healthy(self) -> bool:
        port = self.master_port()
        if port is None:
            return False
        info = redis_cmd(port, "INFO", "replication", timeout=1.0)
        return "role:master" in info and info.count("state=online") >= 1 and all(
            n.proc is not None and not n.paused for n in self.nodes)


class Cluster(Deployment):
    name = "cluster"

    def start(self) -> None:
        for i in range(6):
            bus = free_port()
            node = RedisNode(self.root, f"redis-{i}", [
                *REDIS_SAFE, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(bus), "--cluster-node-timeout", "2000"])
            node.start()
            self.nodes.append(node)
        out = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
             "--cluster-replicas", "1", "--cluster-yes"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
        if not wait_until("the cluster is formed", 30, self.healthy):
            raise RuntimeError("the cluster did not form")
        store = ["--redis-cluster-nodes", ",".join(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--durability-replicas", str(self.durability)]
        self.gates = [Gate(self.binary, self.root, f"gate-{i}", store, self.config) for i in range(3)]
        for gate in self.gates:
            gate.start()

    def healthy(self) -> bool:
        masters = 0
        for node in self.nodes:
            if node.proc is None or node.paused:
                return False
            if "cluster_state:ok" not in redis_cmd(node.port, "CLUSTER", "INFO", timeout=1.0):
                return False
            info = redis_cmd(node.port, "INFO", "replication", timeout=1.0)
            if "role:master" in info:
                masters += 1
                if "state=online" not in info:
                    return False
        return masters == 3

