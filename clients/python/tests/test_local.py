"""``oncegate.local``: the gate server itself inside this process, on the embedded store or on
Redis.

No gate binary here: every test starts the server through the native extension, so it shows what
an installed wheel gives without ``oncegate serve``. The answers and errors are the server's own
(the same code, its gate service called in process or through its listener), checked here on the
guard's main paths: the first call runs, a retry replays, changed arguments are refused, a restart
keeps what was completed, and many threads at once run an action once; on Redis, a second gate
in process and a gate server see the same records.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import oncegate
import oncegate.aio
from oncegate import InvalidRequestError, KeyReusedError, LocalGate, LocalServer, TransportError, native

SCOPE = {"agent_id": "billing-agent", "run_id": "run-local"}
TRANSFER = {"amount": 5000, "currency": "EUR", "to": "DE89370400440532013000"}


def test_a_guarded_action_runs_once_and_its_retry_gets_the_receipt(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    with oncegate.local(tmp_path / "data") as gate:
        assert isinstance(gate, LocalGate) and gate.server.running

        @gate.action("payments.transfer")
        def transfer(*, amount: int, currency: str, to: str, grant: oncegate.Grant) -> dict[str, Any]:
            ran.append({"amount": amount, "provider_key": grant.provider_key})
            return {"transfer_id": f"tr-{len(ran)}", "provider_key": grant.provider_key}

        with oncegate.scope(**SCOPE):
            first = transfer(**TRANSFER, idempotency_key="invoice-42")
            again = transfer(**TRANSFER, idempotency_key="invoice-42")
    assert first == again == {"transfer_id": "tr-1", "provider_key": ran[0]["provider_key"]}
    assert len(ran) == 1
    assert not gate.server.running


def test_changed_arguments_under_the_same_key_are_refused(tmp_path: Path) -> None:
    with oncegate.local(tmp_path) as gate:
        gate.run("payments.transfer", TRANSFER, lambda grant: "ok", idempotency_key="invoice-7", **SCOPE)
        ran: list[int] = []
        with pytest.raises(KeyReusedError):
            gate.run(
                "payments.transfer",
                {**TRANSFER, "amount": 5100},
                lambda grant: ran.append(1),
                idempotency_key="invoice-7",
                **SCOPE,
            )
        assert not ran


def test_what_was_completed_survives_a_restart_on_the_same_directory(tmp_path: Path) -> None:
    ran: list[int] = []

    def pay(grant: oncegate.Grant) -> dict[str, str]:
        ran.append(1)
        return {"transfer_id": "tr-9"}

    with oncegate.local(tmp_path) as gate:
        first = gate.run("payments.transfer", TRANSFER, pay, idempotency_key="invoice-9", **SCOPE)
    with oncegate.local(tmp_path) as gate:
        again = gate.run("payments.transfer", TRANSFER, pay, idempotency_key="invoice-9", **SCOPE)
    assert first == again == {"transfer_id": "tr-9"}
    assert ran == [1]


def test_many_threads_at_once_run_an_action_once(tmp_path: Path) -> None:
    ran: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(16)
    results: list[Any] = []

    def pay(grant: oncegate.Grant) -> str:
        with lock:
            ran.append(1)
        return "paid"

    with oncegate.local(tmp_path) as gate:

        def worker() -> None:
            start.wait()
            results.append(
                gate.run(
                    "payments.transfer",
                    TRANSFER,
                    pay,
                    idempotency_key="invoice-race",
                    lease_ttl=10,
                    max_wait=30,  # beyond the lease: the others wait for the winner's receipt
                    poll_interval=0.05,
                    **SCOPE,
                )
            )

        threads = [threading.Thread(target=worker) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == ["paid"] * 16
    assert ran == [1]


def test_it_signs_grants_by_default_and_takes_serves_flags(tmp_path: Path) -> None:
    with oncegate.local(tmp_path / "signed") as gate:
        signed = gate.request_token("payments.transfer", TRANSFER, **SCOPE)
    assert signed.decision == oncegate.Decision.GRANTED
    assert signed.grant is not None and signed.grant.statement.count(".") == 2
    with oncegate.local(tmp_path / "unsigned", flags=["--unsigned"]) as gate:
        unsigned = gate.request_token("payments.transfer", TRANSFER, **SCOPE)
    assert unsigned.grant is not None and unsigned.grant.statement == ""


def test_its_config_file_is_the_gates(tmp_path: Path) -> None:
    config = tmp_path / "oncegate.toml"
    config.write_text('strict = true\n\n[actions."payments.transfer"]\nkey_fields = ["/amount", "/to"]\n')
    with oncegate.local(tmp_path / "data", config=config) as gate:
        assert gate.request_token("payments.transfer", TRANSFER, **SCOPE).grant is not None
        with pytest.raises(InvalidRequestError, match="action"):
            gate.request_token("crm.delete_everything", {}, **SCOPE)


def test_a_directory_another_gate_holds_is_refused_and_free_again_after_stop(tmp_path: Path) -> None:
    server = LocalServer(tmp_path)
    with pytest.raises(OSError, match="cannot open the store"):
        LocalServer(tmp_path)
    server.stop()
    server.stop()  # idempotent
    with LocalServer(tmp_path) as again:
        assert again.running


def test_bad_flags_and_an_unreachable_redis_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--no-such-flag"):
        LocalServer(tmp_path, flags=["--no-such-flag"])
    with pytest.raises(OSError, match="cannot open the store"):
        LocalServer(tmp_path, flags=["--redis-url", f"redis://127.0.0.1:{_free_port()}"])
    with pytest.raises(TypeError, match="one per word"):
        LocalServer(tmp_path, flags="--unsigned")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad configuration"):
        LocalServer(tmp_path, config=tmp_path / "missing.toml")
    with pytest.raises(ValueError, match="log"):
        LocalServer(tmp_path, log="[not a filter")


def test_a_flag_given_again_overrides_its_own(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with LocalServer(
        tmp_path / "ignored", flags=["--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)]
    ) as s:
        assert s.target == f"127.0.0.1:{port}" and s.data_dir == tmp_path
        assert (tmp_path / "oncegate.redb").is_file() and not (tmp_path / "ignored").exists()


def test_the_environment_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process's ONCEGATE_* variables belong to whatever else it runs: none of them may move the
    # in-process gate onto Redis, another address or another directory.
    monkeypatch.setenv("ONCEGATE_REDIS_URL", "redis://127.0.0.1:1")
    monkeypatch.setenv("ONCEGATE_LISTEN", "0.0.0.0:1")
    monkeypatch.setenv("ONCEGATE_DATA_DIR", str(tmp_path / "elsewhere"))
    with oncegate.local(tmp_path / "data") as gate:
        assert gate.server.target.startswith("127.0.0.1:")
        assert gate.run("payments.transfer", TRANSFER, lambda grant: "ok", **SCOPE) == "ok"
    assert (tmp_path / "data").is_dir() and not (tmp_path / "elsewhere").exists()


def test_it_listens_on_loopback_and_on_its_admin_socket(tmp_path: Path) -> None:
    with LocalServer(tmp_path) as server:
        host, port = server.target.rsplit(":", 1)
        assert host == "127.0.0.1"
        with socket.create_connection((host, int(port)), timeout=5):
            pass
        assert server.admin_target is not None
        assert Path(server.admin_target.removeprefix("unix:")).parent == tmp_path
        # A second client on the same server, as a resolver or another thread pool would be.
        with oncegate.Gate(server.target) as other:
            assert other.request_token("payments.transfer", TRANSFER, **SCOPE).grant is not None
    with LocalServer(tmp_path, flags=["--no-admin-socket"]) as server:
        assert server.admin_target is None


def test_the_asyncio_client_has_one_too(tmp_path: Path) -> None:
    ran: list[int] = []

    async def main() -> tuple[Any, Any]:
        async with oncegate.aio.local(tmp_path) as gate:
            assert isinstance(gate, oncegate.aio.LocalGate)

            async def pay(grant: oncegate.Grant) -> str:
                ran.append(1)
                return "paid"

            first = await gate.run("payments.transfer", TRANSFER, pay, idempotency_key="invoice-a", **SCOPE)
            again = await gate.run("payments.transfer", TRANSFER, pay, idempotency_key="invoice-a", **SCOPE)
            return first, again

    assert asyncio.run(main()) == ("paid", "paid")
    assert ran == [1]


def test_its_log_lines_go_to_stderr_only_when_asked(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with oncegate.local(tmp_path / "quiet") as gate:
        gate.run("payments.transfer", TRANSFER, lambda grant: "ok", **SCOPE)
    assert "oncegate serving" not in capfd.readouterr().err
    # The first subscriber of the process wins: this is the one test that installs one.
    with oncegate.local(tmp_path / "loud", log="info") as gate:
        gate.run("payments.transfer", TRANSFER, lambda grant: "ok", **SCOPE)
    err = capfd.readouterr().err
    assert "oncegate serving" in err and "store=embedded" in err, err
    assert "payments.transfer" in err, err  # the audit line of the grant


def _stacks_of(pid: int) -> str:
    """The native stacks of every thread of ``pid`` (gdb's), or why there are none: what a hung
    child was waiting for."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no gdb on this machine to show the child's stacks)"
    shown = subprocess.run(
        [gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return shown.stdout + shown.stderr


def _exit_code(pid: int, *, within: float, hung: str) -> int:
    """The exit code of the forked child ``pid``; killed, and the test failed with ``hung``, when
    it has not exited ``within`` seconds."""
    deadline = time.monotonic() + within
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        stacks = _stacks_of(pid)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"{hung}\n{stacks}")
    return os.waitstatus_to_exitcode(done[1])


def test_a_forked_child_neither_stops_nor_waits_for_the_parents_gate(tmp_path: Path) -> None:
    # The child inherits the server without its threads: stopping it there must do nothing, and
    # dropping it must not wait for threads that do not exist (it would hang the child).
    server = LocalServer(tmp_path)
    try:
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                # No collection here: grpcio's objects left by earlier tests would be finalized in
                # a child whose gRPC threads are the parent's (grpcio does not survive a fork).
                gc.disable()
                server.stop()
                code = 0 if server.running else 2
                dropped = weakref.ref(server)
                del server  # the last reference: the native server is dropped here
                code = code if dropped() is None else 3
            finally:
                os._exit(code)
        assert _exit_code(pid, within=20, hung="the forked child hung on the parent's gate") == 0
        with oncegate.Gate(server.target) as gate:  # the parent's still serves
            assert gate.run("payments.transfer", TRANSFER, lambda grant: "ok", **SCOPE) == "ok"
    finally:
        server.stop()


@pytest.mark.skipif(
    not native.enabled(), reason="a grpcio channel is not usable in a forked child (grpcio's fork support)"
)
def test_a_forked_child_reaches_the_parents_gate_through_its_listener(tmp_path: Path) -> None:
    # The parent's channels call its gate in process; a child has none of the gate's threads, so
    # its channels, even one inherited from the parent, connect to the listener the parent serves.
    with oncegate.local(tmp_path) as gate:
        assert gate.run("payments.transfer", TRANSFER, lambda grant: "parent", **SCOPE) == "parent"
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                replayed = gate.run("payments.transfer", TRANSFER, lambda grant: "child", **SCOPE)
                with oncegate.Gate(gate.server.target) as fresh:
                    other = fresh.run(
                        "payments.transfer",
                        TRANSFER,
                        lambda grant: "child",
                        idempotency_key="in-child",
                        **SCOPE,
                    )
                code = 0 if (replayed, other) == ("parent", "child") else 2
            finally:
                os._exit(code)
        assert _exit_code(pid, within=30, hung="the forked child hung calling the parent's gate") == 0
        # What the child completed, the parent replays.
        again = gate.run(
            "payments.transfer", TRANSFER, lambda grant: "parent", idempotency_key="in-child", **SCOPE
        )
        assert again == "child"


def _connections_to(port: int) -> int:
    """Established TCP connections to or from ``port`` on this machine (IPv4 loopback)."""
    count = 0
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for line in table:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and port in (local_port, remote_port):  # 01: ESTABLISHED
                count += 1
    return count


@pytest.mark.skipif(not native.enabled(), reason="grpcio's channels go through the listener")
def test_its_calls_skip_the_socket_and_answer_as_the_listener(tmp_path: Path) -> None:
    with oncegate.local(tmp_path, flags=["--unsigned"]) as gate:
        port = int(gate.server.target.rsplit(":", 1)[1])
        ran: list[int] = []
        key = {"idempotency_key": "invoice-s", **SCOPE}
        first = gate.run("payments.transfer", TRANSFER, lambda grant: ran.append(1) or "ok", **key)
        again = gate.run("payments.transfer", TRANSFER, lambda grant: ran.append(1) or "ok", **key)
        with pytest.raises(KeyReusedError):
            gate.run("payments.transfer", {**TRANSFER, "amount": 1}, lambda grant: "no", **key)
        assert (first, again, ran) == ("ok", "ok", [1])
        assert _connections_to(port) == 0, "a native channel of this process connected to the listener"
        # A grpcio channel (here: one with gRPC options) still goes through the listener, and
        # reads the same records.
        with oncegate.Gate(gate.server.target, options=[("grpc.enable_retries", 0)]) as wire:
            assert wire.run("payments.transfer", TRANSFER, lambda grant: "no", **key) == "ok"
            assert _connections_to(port) > 0


def test_the_heartbeat_keeps_a_long_call_leased_in_process(tmp_path: Path) -> None:
    # The lease heartbeat's ExtendLease calls go in process too: a call that outlives its lease
    # three times over is still in progress for another caller, never expired.
    seen: list[Any] = []
    with oncegate.local(tmp_path, flags=["--unsigned"]) as gate:

        def slow(grant: oncegate.Grant) -> str:
            for _ in range(3):
                time.sleep(1.1)
                try:
                    gate.request_token("payments.transfer", TRANSFER, idempotency_key="slow", **SCOPE)
                except oncegate.OncegateError as error:
                    seen.append(type(error))
            return "done"

        assert (
            gate.run("payments.transfer", TRANSFER, slow, idempotency_key="slow", lease_ttl=1, **SCOPE)
            == "done"
        )
    assert seen == [oncegate.InProgressError] * 3


def test_a_call_after_stop_is_unavailable_until_a_gate_serves_there_again(tmp_path: Path) -> None:
    gate = oncegate.local(tmp_path)
    other = oncegate.Gate(gate.server.target)  # made while the gate serves: it calls in process
    assert other.run("payments.transfer", TRANSFER, lambda grant: "paid", **SCOPE) == "paid"
    gate.server.stop()
    with pytest.raises(TransportError) as refused:
        other.request_token("payments.transfer", TRANSFER, idempotency_key="after-stop", **SCOPE)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    gate.close()
    # A gate started again on the same address and directory answers the same channel.
    with LocalServer(tmp_path, flags=["--listen", gate.server.target]):
        assert other.run("payments.transfer", TRANSFER, lambda grant: "again", **SCOPE) == "paid"
    other.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``redis-server`` of this test's own on a free loopback port, nothing kept on disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (make deps installs it)")
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                    probe.sendall(b"PING\r\n")
                    if probe.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("redis-server did not answer within 10 s")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}", process
    finally:
        process.kill()
        process.wait()


def _wakeups(thread: str) -> int:
    """How many times the threads of this process named ``thread`` woke from a sleep (their
    voluntary context switches)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != thread:
                continue
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not native.enabled(), reason="grpcio's channels go through the listener")
def test_on_redis_a_blocking_call_runs_on_its_callers_thread_and_wakes_no_thread_of_the_gate(
    tmp_path: Path, redis_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    # A blocking caller runs the gate's handler itself, over a Redis connection of its own; an
    # asyncio call is a task on the gate's runtime, whose thread wakes for it. The answers are
    # the same either way (the tests above), so what shows the path is who wakes.
    url, _ = redis_server
    cycles = 150  # two calls each
    flags = ["--redis-url", url, "--unsigned", "--no-admin-socket", "--worker-threads", "1"]
    with oncegate.local(tmp_path, flags=flags) as gate:
        gate.run("payments.transfer", TRANSFER, lambda grant: "ok", **SCOPE)
        before = _wakeups("oncegate-local")
        for n in range(cycles):
            gate.run("payments.transfer", {**TRANSFER, "amount": n}, lambda grant: "ok", **SCOPE)
        direct = _wakeups("oncegate-local") - before

        async def as_tasks() -> int:
            async with oncegate.aio.Gate(gate.server.target) as tasks:
                before = _wakeups("oncegate-local")
                for n in range(cycles):
                    await tasks.run(
                        "payments.transfer", {**TRANSFER, "amount": -n - 1}, lambda grant: "ok", **SCOPE
                    )
                return _wakeups("oncegate-local") - before

        tasked = asyncio.run(as_tasks())
    # The gate's thread wakes for its own timers either way (a few times a second).
    assert tasked >= cycles, f"the gate's thread woke {tasked} times for {2 * cycles} asyncio calls"
    assert direct * 4 < tasked, f"blocking calls woke the gate's thread {direct} times, asyncio ones {tasked}"


def test_on_redis_two_gates_in_process_share_the_records(
    tmp_path: Path, redis_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, _ = redis_server
    ran: list[str] = []

    def pay(who: str) -> Any:
        def tool(grant: oncegate.Grant) -> dict[str, str]:
            ran.append(who)
            return {"transfer_id": f"tr-{who}"}

        return tool

    flags = ["--redis-url", url, "--unsigned"]
    with oncegate.local(tmp_path / "a", flags=flags) as a, oncegate.local(tmp_path / "b", flags=flags) as b:
        assert a.server.target != b.server.target
        first = a.run("payments.transfer", TRANSFER, pay("a"), idempotency_key="invoice-r", **SCOPE)
        again = b.run("payments.transfer", TRANSFER, pay("b"), idempotency_key="invoice-r", **SCOPE)
        with pytest.raises(KeyReusedError):
            b.run(
                "payments.transfer", {**TRANSFER, "amount": 1}, pay("b"), idempotency_key="invoice-r", **SCOPE
            )
    assert first == again == {"transfer_id": "tr-a"}
    assert ran == ["a"]
    # What they completed outlives both: a third gate on the same Redis replays it.
    with oncegate.local(tmp_path / "c", flags=flags) as c:
        assert c.run("payments.transfer", TRANSFER, pay("c"), idempotency_key="invoice-r", **SCOPE) == first
    assert ran == ["a"]


def test_on_redis_a_call_past_its_deadline_fails_and_the_gate_answers_again_after(
    tmp_path: Path, redis_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, redis = redis_server
    with oncegate.local(tmp_path, flags=["--redis-url", url, "--unsigned"], timeout=0.5) as gate:
        assert gate.request_token("payments.transfer", TRANSFER, **SCOPE).grant is not None
        redis.send_signal(signal.SIGSTOP)  # the store stops answering
        try:
            began = time.monotonic()
            with pytest.raises(TransportError) as late:
                gate.request_token("payments.transfer", TRANSFER, idempotency_key="late", **SCOPE)
            assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - began < 10
        finally:
            redis.send_signal(signal.SIGCONT)
        # The late call's FCALL may have run once Redis woke: its grant is then in progress.
        try:
            answered = gate.request_token("payments.transfer", TRANSFER, idempotency_key="late", **SCOPE)
            assert answered.grant is not None
        except oncegate.InProgressError:
            pass
