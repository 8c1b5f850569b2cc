"""The soak's PostgreSQL deployment, on 127.0.0.1 only: a primary and a synchronous standby from
the Debian binaries (``pg_config --bindir``), and three gates on the multi-host URL.

* ``postgres``: ``initdb`` for the primary, ``pg_basebackup -R`` for the standby,
  ``synchronous_standby_names = '*'`` and ``synchronous_commit = on`` on both (so a promoted
  standby keeps asking for a synchronous standby: it takes no commit until the next one is
  there), ``fsync = on``. The gates use ``postgresql://...@127.0.0.1:A,127.0.0.1:B/oncegate?
  target_session_attrs=read-write`` at durability level 1, so they follow a promoted standby
  without a restart.

:meth:`Postgres.failover` is the nemesis's ``failover`` here: the primary's processes SIGKILLed
at once (the postmaster and its children, as a machine that dies), ``pg_ctl promote`` on the standby, then a
new standby rebuilt with ``pg_basebackup`` from the new primary in the old one's place (same
port, fresh data directory: the old primary's unreplicated tail is thrown away), so that the soak
goes on with more failovers. :meth:`Postgres.table_sizes` samples ``pg_total_relation_size`` of
every table of the gate's database.

As root, every PostgreSQL program runs as the ``postgres`` user (the server refuses root). Does
not own: the gates' processes (:class:`soaklib.deploy.Gate`), the faults' schedule
(:mod:`soaklib.nemesis`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any

from soaklib.deploy import Deployment, Gate
from soaklib.procs import free_port, kill, spawn, wait_until

DATABASE = "oncegate"
SUPERUSER = "postgres"
SETTINGS = [
    "listen_addresses = '127.0.0.1'",
    "unix_socket_directories = ''",
    "fsync = on",
    "synchronous_commit = on",
    "synchronous_standby_names = '*'",
    "wal_level = replica",
    "max_wal_senders = 10",
    "hot_standby = on",
    "wal_log_hints = on",
    "max_connections = 200",
    "shared_buffers = 32MB",
    "logging_collector = off",
]


@cache
def bindir() -> Path:
    """Where the PostgreSQL programs are (``pg_config --bindir``)."""
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def as_server_user(args: list[str]) -> list[str]:
    """``args`` run as the ``postgres`` user when the soak runs as root (the death signal set
    again after the user changes, which clears it)."""
    if os.geteuid() != 0:
        return args
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
            "--pdeathsig", "KILL", "--", *args]


def run_tool(name: str, *args: str, timeout: float = 120) -> str:
    """Runs a PostgreSQL program to its end as the server's user; its output, or RuntimeError."""
    proc = spawn(as_server_user([str(bindir() / name), *args]), stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True, cwd="/")
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise RuntimeError(f"{name} {' '.join(args)}: no end in {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} exited {proc.returncode}: {out.strip()}")
    return out


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def owned_dir(path: Path) -> Path:
    """A directory the server's user owns."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
    return path


class PgNode:
    """One PostgreSQL server on a fixed loopback port (kept across rebuilds), signalled as a whole
    (the postmaster and its children)."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.dir = owned_dir((root / name).resolve())  # the tools run in /
        self.data = self.dir / "data"
        self.proc: subprocess.Popen[Any] | None = None
        self.paused = False

    def init_primary(self) -> None:
        run_tool("initdb", "--auth=trust", "--username", SUPERUSER, "--encoding=UTF8", "--locale=C",
                 "--no-instructions", "-D", str(self.data))
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# oncegate soak\n" + "\n".join(SETTINGS) + "\n")

    def init_standby_of(self, primary: PgNode) -> None:
        """A fresh data directory: a base backup of ``primary`` that follows it (``-R``)."""
        shutil.rmtree(self.data, ignore_errors=True)
        run_tool("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", SUPERUSER,
                 "-D", str(self.data), "-R", "-X", "stream", "-c", "fast")

    def start(self) -> None:
        log = open(self.dir / "server.log", "a", encoding="utf-8")  # noqa: SIM115 - the child holds it
        with log:
            self.proc = spawn(as_server_user([str(bindir() / "postgres"), "-D", str(self.data),
                                              "-p", str(self.port)]),
                              stdout=subprocess.DEVNULL, stderr=log, cwd="/", start_new_session=True)
        self.paused = False
        # Until it answers or exits (recovery from a crash replays WAL first).
        wait_until(f"{self.name} accepts connections", 60,
                   lambda: self.ready() or self.proc is None or self.proc.poll() is not None)
        if not self.ready():
            tail = (self.dir / "server.log").read_text(errors="replace").splitlines()[-8:]
            raise RuntimeError(f"{self.name} on port {self.port} did not start: " + " | ".join(tail))

    def ready(self) -> bool:
        """Running and accepting connections."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        return subprocess.run([str(bindir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                              check=False).returncode == 0

    def _signal_all(self, sig: int) -> None:
        """``sig`` to the postmaster, then to each of its children: every backend calls setsid(),
        so the process group holds the postmaster alone (stopped or killed first, it forks no
        new child meanwhile)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in [self.proc.pid, *children(self.proc.pid)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Every process of the server at once (a machine that dies), the postmaster reaped."""
        self._signal_all(signal.SIGCONT)
        self._signal_all(signal.SIGKILL)
        kill(self.proc)
        self.proc = None
        self.paused = False

    def pause(self) -> None:
        self._signal_all(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)
        self.paused = False

    def promote(self) -> None:
        run_tool("pg_ctl", "promote", "-w", "-t", "60", "-D", str(self.data))

    def sql(self, query: str, db: str = "postgres", timeout: float = 5.0, options: str = "") -> str:
        """``query`` through ``psql`` (``options``: the session's settings, ``-c name=value``):
        its rows, unaligned, tuples only; raises OSError."""
        try:
            out = subprocess.run(
                [str(bindir() / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                 "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-d", db, "-c", query],
                capture_output=True, text=True, timeout=timeout, check=False,
                env=dict(os.environ, PGOPTIONS=options))
        except subprocess.TimeoutExpired as err:
            raise OSError(f"{self.name}: psql timed out") from err
        if out.returncode != 0:
            raise OSError(f"{self.name}: {out.stderr.strip()}")
        return out.stdout.strip()

    def is_primary(self) -> bool:
        return self.sql("SELECT pg_is_in_recovery()", timeout=2.0) == "f"


class Postgres(Deployment):
    name = "postgres"

    def __init__(self, binary: Path, root: Path, config: Path, durability: int = 1) -> None:
        super().__init__(binary, root, config, durability)
        self.pg = [PgNode(root, "pg-0"), PgNode(root, "pg-1")]
        self.nodes = self.pg  # type: ignore[assignment]  # what the nemesis pauses and heals
        self.primary = 0
        self.failovers = 0

    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.pg)
        return f"postgresql://{SUPERUSER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def start(self) -> None:
        primary, standby = self.pg
        primary.init_primary()
        primary.start()
        # Before any standby: a commit would wait for one (synchronous_standby_names).
        primary.sql(f"CREATE DATABASE {DATABASE}", options="-c synchronous_commit=local")
        standby.init_standby_of(primary)
        standby.start()
        if not wait_until("the standby is synchronous", 60, self.healthy, interval=0.2):
            raise RuntimeError("the standby did not become synchronous")
        store = ["--postgres-url", self.url(), "--durability-replicas", str(self.durability)]
        self.gates = [Gate(self.binary, self.root, f"gate-{i}", store, self.config) for i in range(3)]
        for gate in self.gates:
            gate.start()

    def healthy(self) -> bool:
        """The primary takes writes and a synchronous standby streams from it."""
        primary, standby = self.pg[self.primary], self.pg[1 - self.primary]
        if any(n.proc is None or n.paused for n in self.pg) or not standby.ready():
            return False
        row = primary.sql("SELECT pg_is_in_recovery(), (SELECT count(*) FROM pg_stat_replication "
                          "WHERE state = 'streaming' AND sync_state = 'sync')", timeout=2.0)
        return row == "f|1"

    def failover(self) -> tuple[str, str]:
        """SIGKILL the primary, promote the standby, rebuild a standby in the old primary's place."""
        old, new = self.pg[self.primary], self.pg[1 - self.primary]
        if new.paused:
            new.resume()
        old.kill()
        began = time.time()
        new.promote()
        promoted = time.time() - began
        self.primary = 1 - self.primary
        old.init_standby_of(new)
        old.start()
        self.failovers += 1
        return old.name, (f"promoted {new.name} in {promoted:.1f}s, {old.name} rebuilt as its standby "
                          f"in {time.time() - began - promoted:.1f}s")

    def table_sizes(self) -> dict[str, int]:
        """``pg_total_relation_size`` of every table of the gate's database, on the primary."""
        rows = self.pg[self.primary].sql(
            "SELECT n.nspname || '.' || c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%' "
            "ORDER BY 1", db=DATABASE, timeout=5.0)
        sizes = {}
        for line in rows.splitlines():
            name, _, size = line.rpartition("|")
            sizes[name] = int(size)
        return sizes
