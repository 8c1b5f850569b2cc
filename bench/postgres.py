#!/usr/bin/env python3
"""The gate on PostgreSQL beside its limit, on this machine: a server of its own (``initdb`` on a
free loopback port, never the machine's), then, at the same concurrency on that server,

* the limit: ``pgbench`` running ``postgres_pair.sql`` (the statements one grant-complete pair
  makes the server run, pipelined as the store sends them, nothing else);
* the gate: ``oncegate serve --postgres-url`` loaded by ``oncegate bench --scenario
  grant-complete``;

alternating, ``--runs`` rounds; medians of pairs/s, the gate ÷ the limit (target ≥ 0.5), and the
server's CPU per pair (user + system of the postmaster and its live backends, from ``/proc``,
plus what its exited backends left in the postmaster's children's time), the gate's and the load
generator's too. ``--rss-seconds N`` instead loads the gate for N seconds and samples its RSS
(``VmRSS``) every ``--rss-every`` seconds with the tables' sizes: flat or not.

Standard library only; every process it starts is killed at the end. As root, PostgreSQL runs as
the ``postgres`` user (it refuses root). Does not own: the other stores' rows (``make bench``'s
scenarios), the store's statements (``crates/store/src/postgres/``, which the SQL file follows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIR_SQL = Path(__file__).resolve().parent / "postgres_pair.sql"
DATABASE = "oncegate"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bindir() -> Path:
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def as_server_user(args: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return args
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", *args]


def ticks(pid: int) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) of ``pid`` in clock ticks, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster and its live children (each backend calls setsid(), so not
    its process group), plus what its reaped children used."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(entry.name) == postmaster:
                total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            elif int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    return ticks(pid)[0] / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Server:
    """A PostgreSQL server of the bench's own: fsync on, synchronous_commit on, no standby."""

    def __init__(self, tmp: Path, max_connections: int) -> None:
        self.port = free_port()
        self.dir = tmp / "pg"
        self.dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        subprocess.run(as_server_user([str(bindir() / "initdb"), "--auth=trust", "--username=postgres",
                                       "--encoding=UTF8", "--locale=C", "--no-instructions",
                                       "-D", str(self.data)]),
                       check=True, capture_output=True, cwd="/")
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
                       f"fsync = on\nsynchronous_commit = on\nmax_connections = {max_connections}\n"
                       "shared_buffers = 128MB\n")
        log = open(self.dir / "server.log", "w", encoding="utf-8")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(as_server_user([str(bindir() / "postgres"), "-D", str(self.data),
                                                     "-p", str(self.port)]),
                                     stdout=subprocess.DEVNULL, stderr=log, cwd="/", start_new_session=True)
        log.close()
        deadline = time.time() + 60
        while subprocess.run([str(bindir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                             check=False).returncode != 0:
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"postgres did not start: {(self.dir / 'server.log').read_text()[-2000:]}")
            time.sleep(0.1)
        self.sql(f"CREATE DATABASE {DATABASE}")

    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def sql(self, query: str, db: str = "postgres") -> str:
        out = subprocess.run([str(bindir() / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                              "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
                              "-c", query], capture_output=True, text=True, check=True)
        return out.stdout.strip()

    def cpu(self) -> float:
        return server_cpu(self.proc.pid)

    def table_sizes(self) -> dict[str, int]:
        rows = self.sql("SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = 'r' "
                        "AND relname LIKE 'oncegate%' ORDER BY 1", db=DATABASE)
        return {name: int(size) for name, _, size in (r.rpartition("|") for r in rows.splitlines())}

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Gate:
    """``oncegate serve`` on the server, on 127.0.0.1:0."""

    def __init__(self, binary: Path, url: str, pool: int, extra: list[str]) -> None:
        args = [str(binary), "serve", "--listen", "127.0.0.1:0", "--no-admin-socket",
                "--postgres-url", url, "--postgres-pool-size", str(pool), *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env=dict(os.environ, RUST_LOG="warn"))
        line = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"oncegate did not start: {line!r}")
        self.addr = line.removeprefix("listening on ")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def pgbench(server: Server, opts: argparse.Namespace) -> dict:
    """The limit: pairs/s and the server's CPU µs per pair over one run (warm-up excluded)."""
    base = [str(bindir() / "pgbench"), "-n", "-M", "prepared", "-h", "127.0.0.1", "-p", str(server.port),
            "-U", "postgres", "-c", str(opts.concurrency), "-j", str(min(opts.concurrency, 2)),
            "-f", str(PAIR_SQL), DATABASE]
    if opts.warmup:
        subprocess.run([*base[:1], *base[1:], "-T", str(int(opts.warmup))], check=True, capture_output=True)
    cpu = server.cpu()
    out = subprocess.run([*base, "-T", str(int(opts.duration))], check=True, capture_output=True, text=True)
    used = server.cpu() - cpu
    pairs = next(float(line.split("=")[1].split()[0]) for line in out.stdout.splitlines()
                 if line.startswith("tps ="))
    return {"pairs_per_s": pairs, "server_us": used / max(pairs * opts.duration, 1) * 1e6}


def gate_run(binary: Path, gate: Gate, server: Server, opts: argparse.Namespace) -> dict:
    """The gate: ``oncegate bench --scenario grant-complete``; pairs/s, CPU µs per pair."""
    cmd = [str(binary), "bench", "--target", gate.addr, "--scenario", "grant-complete", "--json",
           "--concurrency", str(opts.concurrency), "--connections", str(opts.connections),
           "--duration", str(opts.duration), "--warmup", str(opts.warmup)]
    cpu = (server.cpu(), process_cpu(gate.proc.pid))
    before = os.times()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.duration + opts.warmup + 120)
    after = os.times()
    if not proc.stdout.strip():
        raise RuntimeError(f"oncegate bench failed: {proc.stderr}")
    report = json.loads(proc.stdout)
    pairs = report["throughput"]["pairs_per_s"]
    # CPU over warm-up and measurement alike, so the pairs counted are over both too.
    n = max(pairs * (opts.duration + opts.warmup), 1)
    client = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return {"pairs_per_s": pairs, "server_us": (server.cpu() - cpu[0]) / n * 1e6,
            "gate_us": (process_cpu(gate.proc.pid) - cpu[1]) / n * 1e6, "client_us": client / n * 1e6,
            "checks": report.get("checks"), "report": report}


def pairs(opts: argparse.Namespace, binary: Path, tmp: Path) -> list[str]:
    server = Server(tmp, max_connections=opts.concurrency + opts.pool + 20)
    gate = None
    try:
        gate = Gate(binary, server.url(), opts.pool, opts.gate_args)  # migrates: the table pgbench writes
        limits, gates = [], []
        for i in range(opts.runs):
            steps = [lambda: limits.append(pgbench(server, opts)),
                     lambda: gates.append(gate_run(binary, gate, server, opts))]
            for step in steps if i % 2 == 0 else steps[::-1]:
                step()
        sizes = server.table_sizes()
    finally:
        if gate is not None:
            gate.stop()
        server.stop()
    med = lambda rows, field: statistics.median(r[field] for r in rows)  # noqa: E731
    each = lambda rows: ", ".join(f"{r['pairs_per_s']:,.0f}" for r in rows)  # noqa: E731
    limit, ours = med(limits, "pairs_per_s"), med(gates, "pairs_per_s")
    ratio = ours / limit
    return [
        f"PostgreSQL {opts.version} on 127.0.0.1 (fsync on, synchronous_commit on, no standby), "
        f"{opts.concurrency} callers, {opts.runs} rounds of {opts.duration:.0f}s after {opts.warmup:.0f}s, medians:",
        "",
        "| what | grant+complete pairs/s | server CPU µs per pair | gate CPU µs per pair | load generator CPU µs per pair |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| the limit: pgbench, bench/postgres_pair.sql | {limit:,.0f} | {med(limits, 'server_us'):,.0f} | | |",
        f"| the gate on PostgreSQL (pool {opts.pool}) | {ours:,.0f} | {med(gates, 'server_us'):,.0f} | "
        f"{med(gates, 'gate_us'):,.0f} | {med(gates, 'client_us'):,.0f} |",
        "",
        f"gate ÷ limit: {ratio:.2f} (target ≥ 0.5: {'met' if ratio >= 0.5 else 'MISSED'}); "
        f"every run: limit {each(limits)}; gate {each(gates)}; "
        f"the gate's checks: {', '.join(str(r['checks']) for r in gates)}",
        "table sizes at the end (KiB): " + ", ".join(f"{k} {v // 1024:,}" for k, v in sizes.items()),
    ]


def rss(opts: argparse.Namespace, binary: Path, tmp: Path) -> list[str]:
    """The gate's RSS under grant-complete load for ``--rss-seconds``."""
    server = Server(tmp, max_connections=opts.pool + 20)
    gate = load = None
    samples: list[tuple[float, int, dict[str, int]]] = []
    try:
        gate = Gate(binary, server.url(), opts.pool, opts.gate_args)
        load = subprocess.Popen([str(binary), "bench", "--target", gate.addr, "--scenario", "grant-complete",
                                 "--json", "--concurrency", str(opts.concurrency), "--connections",
                                 str(opts.connections), "--duration", str(opts.rss_seconds), "--warmup", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        began = time.time()
        while load.poll() is None:
            samples.append((time.time() - began, rss_kib(gate.proc.pid), server.table_sizes()))
            time.sleep(opts.rss_every)
        out, err = load.communicate()
        report = json.loads(out) if out.strip() else {"error": err[-500:]}
    finally:
        if load is not None and load.poll() is None:
            load.kill()
        if gate is not None:
            gate.stop()
        server.stop()
    marks = sorted({0, len(samples) // 4, len(samples) // 2, 3 * len(samples) // 4, len(samples) - 1})
    rss_values = [s[1] for s in samples]
    quarter = samples[len(samples) // 4][1]
    lines = [f"the gate on PostgreSQL {opts.version}, grant-complete for {opts.rss_seconds:.0f}s at "
             f"{opts.concurrency} callers ({report.get('throughput', {}).get('pairs_per_s', 0):,.0f} pairs/s, "
             f"checks {report.get('checks')}); RSS (VmRSS) every {opts.rss_every:.0f}s, {len(samples)} samples:",
             "", "| at | gate RSS MiB | " + " | ".join(f"{t} KiB" for t in sorted(samples[-1][2])) + " |",
             "| ---: | ---: |" + " ---: |" * len(samples[-1][2])]
    for i in marks:
        at, kib, sizes = samples[i]
        lines.append(f"| {at:.0f}s | {kib / 1024:.1f} | " + " | ".join(f"{v // 1024:,}" for _, v in sorted(sizes.items())) + " |")
    lines += ["", f"RSS from the first quarter on: {quarter / 1024:.1f} MiB → {rss_values[-1] / 1024:.1f} MiB "
              f"(max {max(rss_values) / 1024:.1f} MiB); "
              f"{'flat (within 10%)' if rss_values[-1] <= quarter * 1.1 else 'GROWING'}"]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", type=Path, default=ROOT / "target" / "release" / "oncegate")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--pool", type=int, default=32, help="the gate's --postgres-pool-size")
    parser.add_argument("--gate-args", type=lambda v: v.split(), default=[], help="more flags for the gate")
    parser.add_argument("--rss-seconds", type=float, default=0.0,
                        help="instead of the pairs: load the gate this long and sample its RSS (600 for the 10 minutes)")
    parser.add_argument("--rss-every", type=float, default=10.0)
    opts = parser.parse_args()
    if not opts.bin.exists():
        parser.error(f"{opts.bin} does not exist: cargo build --release --bin oncegate")
    opts.version = subprocess.run([str(bindir() / "postgres"), "--version"], capture_output=True,
                                  text=True, check=True).stdout.split()[2]
    with tempfile.TemporaryDirectory(prefix="oncegate-bench-pg-") as tmp:
        os.chmod(tmp, 0o755)
        lines = (rss if opts.rss_seconds else pairs)(opts, opts.bin, Path(tmp))
    print(f"$ {' '.join(sys.argv)}  (binary {opts.bin})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
