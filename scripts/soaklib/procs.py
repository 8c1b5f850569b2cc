"""Processes the soak starts, and the one way it starts them: every child dies with the soak.

Each child is started through ``setpriv --pdeathsig KILL`` (util-linux: it sets
``PR_SET_PDEATHSIG`` and execs the command, so the kernel kills the child if the soak dies, even by
SIGKILL) and registered, so that :func:`kill_all` (run on every exit path) kills what is left. Not
``preexec_fn``: Python code between fork and exec can deadlock in a process with threads (gRPC's
among them), and did. Children are only ever started from the main thread: the death signal
follows the thread that forked, and the main thread lives as long as the soak. Also here: a free loopback
port, and a minimal RESP client for asking Redis and Sentinel nodes questions.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from typing import Any

_CHILDREN: list[subprocess.Popen[Any]] = []
_LOCK = threading.Lock()
_PORTS = random.SystemRandom()  # not the soak's seed: ports must differ between concurrent runs


def spawn(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Starts a child that dies with the soak (main thread only, see the module doc)."""
    assert threading.current_thread() is threading.main_thread(), "spawn from the main thread"
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", *args], **kwargs)
    with _LOCK:
        _CHILDREN.append(proc)
    return proc


def signal_proc(proc: subprocess.Popen[Any] | None, sig: int) -> None:
    """Sends ``sig`` to a child of ours that may already have exited."""
    if proc is not None and proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def kill(proc: subprocess.Popen[Any] | None) -> None:
    """SIGKILLs a child (resuming it first does not matter: SIGKILL ends stopped processes) and reaps it."""
    if proc is None:
        return
    signal_proc(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def kill_all() -> None:
    """Kills every child the soak started that is still running."""
    with _LOCK:
        children = list(_CHILDREN)
        _CHILDREN.clear()
    for proc in children:
        kill(proc)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 below the kernel's ephemeral range.

    Servers here are restarted on the same port; a port from the ephemeral range (what binding
    port 0 gives) can meanwhile become the local port of some outgoing connection, and the restart
    would then fail to bind.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = _PORTS.randrange(min(10000, low - 1000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class RespError(Exception):
    """An error reply from Redis."""


def redis_cmd(port: int, *args: str, timeout: float = 2.0) -> Any:
    """One command to ``127.0.0.1:port`` over RESP; raises OSError or RespError."""
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload.encode())
        reader = sock.makefile("rb")
        return _read_reply(reader)


def _read_reply(reader: Any) -> Any:
    line = reader.readline()
    if not line:
        raise OSError("connection closed")
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RespError(rest)
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = reader.read(n + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(reader) for _ in range(n)]
    raise OSError(f"unexpected RESP reply {line!r}")


def wait_until(what: str, limit: float, check: Any, interval: float = 0.1) -> bool:
    """Polls ``check()`` (exceptions count as false) until true or ``limit`` seconds pass."""
    deadline = time.monotonic() + limit
    while True:
        try:
            if check():
                return True
        except (OSError, RespError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
