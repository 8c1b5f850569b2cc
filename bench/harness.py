"""What every bench scenario starts and reads: its own redis-server, gates, `oncegate bench` runs,
the CPU the processes used, the machine it ran on, and the results block of BENCHMARKS.md.

Owns the processes (each one started here on a free loopback port, never 6379, and killed by its
scenario) and the meters. Does not decide what to measure or how to print it: the scenarios do
(stores.py, python_side.py, instructions.py, ab.py). Python standard library only, so that the
bench's driver runs on the system's python3 and python_cycles.py in the bench's virtualenv can
import it alike.
"""

import json
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "dist"
"""The Cargo profile `make bench` builds and measures: the one the Docker image and `make dist`
ship (Cargo.toml)."""
DEFAULT_BIN = ROOT / "target" / PROFILE / "oncegate"
BEGIN, END = "<!-- bench:begin (written by make bench) -->", "<!-- bench:end -->"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=300, **kw) -> str:
    """`cmd`'s standard output; raises when it fails."""
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout,
                          **kw).stdout


class Redis:
    """redis-server on a free loopback port, without persistence, in the directory `tmp`."""

    def __init__(self, tmp, wrapper=()):
        """`wrapper`: a command to start it under (valgrind's, for the instruction counts)."""
        self.port = free_port()
        self.proc = subprocess.Popen(
            [*wrapper, "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(tmp), "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if self.cli("PING").strip() == "PONG":
                    return
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def cli(self, *args, stdin=None) -> str:
        return run(["redis-cli", "-p", str(self.port), *args], input=stdin)

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def used_memory(self) -> int:
        info = self.cli("INFO", "memory")
        return int(re.search(r"used_memory:(\d+)", info).group(1))

    def commands(self) -> dict:
        """Calls by command since the last `CONFIG RESETSTAT` (a function's commands included)."""
        return {m.group(1): int(m.group(2)) for m in re.finditer(
            r"^cmdstat_([\w|]+):calls=(\d+)", self.cli("INFO", "commandstats"), re.M)}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Gate:
    """`oncegate serve` of `binary` on 127.0.0.1:0, on Redis or on the embedded store in a fresh
    directory."""

    def __init__(self, binary, redis_url=None, data_dir=None, extra=(), log="discard",
                 rust_log="info", wrapper=()):
        """`log`: where its standard error goes, "discard" (/dev/null, as `make bench` runs it) or
        "pipe" (a pipe this process reads and drops, as a log collector would). `wrapper`: a
        command it runs under, which must exec it (same process id)."""
        self.binary = str(binary)
        args = [*wrapper, self.binary, "serve", "--listen", "127.0.0.1:0"]
        args += ["--redis-url", redis_url] if redis_url else ["--data-dir", str(data_dir)]
        args += list(extra)
        stderr = {"discard": subprocess.DEVNULL, "pipe": subprocess.PIPE}[log]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                     env=dict(os.environ, RUST_LOG=rust_log))
        if log == "pipe":
            threading.Thread(target=drain, args=(self.proc.stderr.fileno(),), daemon=True).start()
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"oncegate did not start: {line!r}")
        self.addr = line.removeprefix("listening on ")

    def load(self, scenario="grant-complete", *args, timeout=700) -> dict:
        """`oncegate bench` of the same binary against this gate: its JSON report."""
        return json.loads(run([self.binary, "bench", "--target", self.addr, "--scenario", scenario,
                               "--json", *map(str, args)], timeout=timeout))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def drain(fd) -> None:
    """Reads `fd` until its end, dropping what it reads."""
    while os.read(fd, 1 << 16):
        pass


def signing_key(binary, tmp) -> str:
    """A new signing key file in `tmp`, made by `oncegate keys generate`."""
    key = os.path.join(tmp, "signing-key.pem")
    if not os.path.exists(key):
        run([str(binary), "keys", "generate", "--out", key])
    return key


def cpu_seconds(pid) -> float:
    """User + system CPU seconds a process has used so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU used during one run by the server processes named, and by the waited-for client."""

    def __init__(self, **pids):
        self.pids = pids
        self.before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self.client_before = children_cpu()

    def per_op(self, ops) -> dict:
        """µs of CPU per operation, by process name ("client": the load generator)."""
        used = {name: cpu_seconds(pid) - self.before[name] for name, pid in self.pids.items()}
        used["client"] = children_cpu() - self.client_before
        return {name: seconds / max(ops, 1) * 1e6 for name, seconds in used.items()}


def timed_load(gate, redis, scenario, opts, extra=()) -> dict:
    """One `oncegate bench` run of `opts.duration` s after `opts.warmup` s at `opts.concurrency`
    callers on `opts.connections` connections: its report, with the CPU µs per call of the gate,
    Redis (when given) and the load generator under "cpu_us"."""
    pids = {"gate": gate.proc.pid, **({"redis": redis.proc.pid} if redis else {})}
    meter = CpuMeter(**pids)
    report = gate.load(scenario, "--concurrency", opts.concurrency, "--connections",
                       opts.connections, "--duration", opts.duration, "--warmup", opts.warmup,
                       *extra, timeout=opts.duration + opts.warmup + 120)
    # CPU is counted over warm-up and measurement alike; so are the calls here.
    calls = report["throughput"]["rpcs_per_s"] * (opts.duration + opts.warmup)
    report["cpu_us"] = meter.per_op(calls)
    return report


def median_of(reports, field) -> float:
    return statistics.median(r["throughput"][field] for r in reports)


def profile_of(binary) -> str:
    """The Cargo profile a binary under target/ was built with (its directory's name)."""
    path = Path(binary).resolve()
    if path.parent.parent == ROOT / "target" or path.parent.parent.name == "target":
        return {"debug": "dev"}.get(path.parent.name, path.parent.name)
    return "unknown (not under a target directory)"


def machine(binary) -> dict:
    """The machine, the toolchain, the commit and the binary measured."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    version = lambda *cmd: run(list(cmd)).strip().splitlines()[0]
    commit = run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip()
    dirty = run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]).strip()
    try:
        shown = Path(binary).resolve().relative_to(ROOT)
    except ValueError:
        shown = Path(binary).resolve()
    return {"cores": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "rustc": version("rustc", "--version"), "redis": version("redis-server", "--version"),
            "commit": commit + (" (with uncommitted changes)" if dirty else ""),
            "build": f"profile `{profile_of(binary)}`, `{shown}`"}


def verdict(ok: bool) -> str:
    """A target's verdict. It judges the unrounded value, and every target line prints its value
    with a digit more than the target has, so that a value just short of the line does not read
    as the line itself (0.849 against 0.85, 119.6 µs against 120)."""
    return "met" if ok else "MISSED"


def write_benchmarks(text, path) -> None:
    """`text` between BENCHMARKS.md's markers (appended with them when they are missing)."""
    block = f"{BEGIN}\n{text}\n{END}"
    if path.exists():
        current = path.read_text()
        if BEGIN in current and END in current:
            head, rest = current.split(BEGIN, 1)
            new = head + block + rest.split(END, 1)[1]
        else:
            new = current.rstrip() + "\n\n" + block + "\n"
    else:
        new = "# Benchmarks\n\n" + block + "\n"
    path.write_text(new)
