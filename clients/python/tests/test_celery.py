"""The Celery adapter against the real gate: real ``celery worker`` processes (prefork pools) on the
test's own ``redis-server`` broker, a fake bank over HTTP that counts its calls.

The worker running a task is SIGKILLed (its whole process group) while the bank is answering that
task's call; the message, acknowledged late, is delivered again to another worker; the gate holds
it while the dead worker's lease lasts, then leaves it unresolved until a resolver asks the bank,
then replays the bank's receipt. Every invoice is paid exactly once. Called in-process
(``apply``), a task replays under its task id and refuses changed arguments.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from oncegate import Completed, Failed, Gate, Grant, KeyReusedError, Resolver, Unresolved
from oncegate.integrations.celery import GuardedTask, guarded_task

from conftest import RealGate

TESTS = Path(__file__).resolve().parent
PATIENCE = 90.0
CELERY = Path(sys.executable).parent / "celery"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """A ``redis-server`` of the test's own on a free loopback port: ``redis://127.0.0.1:<port>/0``."""
    port = free_port()
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None, "redis-server did not start"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


@dataclass
class Bank:
    """The fake bank: every transfer call, and the invoices whose call it holds (the caller gets no
    answer; the call counts: the money moved)."""

    hold: set[str]
    calls: list[dict[str, Any]] = field(default_factory=list)
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def paid(self, provider_key: str) -> dict[str, Any] | None:
        with self.lock:
            found = [c for c in self.calls if c["provider_key"] == provider_key]
        return found[0] if found else None


@contextmanager
def bank_server(bank: Bank) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            call = json.loads(self.rfile.read(int(self.headers["content-length"])))
            with bank.lock:
                call["transfer_id"] = f"tr-{len(bank.calls) + 1}"
                bank.calls.append(call)
            if call["invoice"] in bank.hold:
                bank.held.set()
                bank.release.wait(PATIENCE)
            body = json.dumps({"transfer_id": call["transfer_id"], "amount": call["amount"]}).encode()
            try:
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the caller was killed

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        bank.release.set()
        server.shutdown()
        server.server_close()


def start_worker(name: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``celery worker`` with a prefork pool of two, in a process group of its own (to kill it whole)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                str(CELERY),
                "-A",
                "celery_tasks",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "2",
                "--hostname",
                f"{name}@%h",
                "--loglevel",
                "INFO",
                "--without-mingle",
                "--without-gossip",
            ],
            cwd=TESTS,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(worker: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> None:
    try:
        os.killpg(worker.pid, sig)
    except ProcessLookupError:
        return
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def wait_for_retries(log: Path, task_id: str) -> list[str]:
    """The errors the task retried on in the worker's log, once it retried on an unresolved action."""
    deadline = time.monotonic() + PATIENCE
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        errors = re.findall(rf"\[{task_id}\] retry: Retry in [^:]*: (\w+)", text)
        if "LeaseExpiredUnresolvedError" in errors:
            return errors
        assert time.monotonic() < deadline, text
        time.sleep(0.1)


def test_a_worker_killed_mid_call_is_redelivered_and_every_invoice_is_paid_once(
    gate_target: str, real_gate: RealGate, tmp_path: Path
) -> None:
    invoices = [f"inv-{uuid.uuid4().hex[:8]}-{n}" for n in range(6)]
    bank = Bank(hold={invoices[0]})
    with redis_server(tmp_path) as broker, bank_server(bank) as bank_url:
        env = {
            **os.environ,
            "ONCEGATE_TEST_BROKER": broker,
            "ONCEGATE_TARGET": gate_target,
            "ONCEGATE_TEST_BANK": bank_url,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        }
        os.environ["ONCEGATE_TEST_BROKER"] = broker  # this process's client of the same app
        import celery_tasks

        celery_tasks.app.conf.update(broker_url=broker, result_backend=broker.rsplit("/", 1)[0] + "/1")
        first = start_worker("a", env, tmp_path / "a.log")
        second = None
        resolver = Resolver(f"unix:{real_gate.data_dir / 'admin.sock'}", agent_id="billing")

        @resolver.lookup("payments.transfer")
        def ask_the_bank(unresolved: Unresolved) -> Any:
            # The bank knows every transfer it made: no record means the killed worker never reached
            # it (killed between its grant and its call), and the redelivered task may run it.
            call = bank.paid(unresolved.provider_key)
            return (
                Completed({"transfer_id": call["transfer_id"], "amount": call["amount"]})
                if call
                else Failed()
            )

        resolving = threading.Thread(target=resolver.run, daemon=True)
        try:
            sent = [
                celery_tasks.transfer.apply_async(kwargs={"invoice": i, "amount": 100 + n, "to": "DE89"})
                for n, i in enumerate(invoices)
            ]
            assert bank.held.wait(PATIENCE), (tmp_path / "a.log").read_text()
            second = start_worker("b", env, tmp_path / "b.log")
            stop(first, signal.SIGKILL)  # mid-call: the bank moved the money, the worker never heard
            # The redelivered task retries itself: held while the dead worker's lease lasts, then
            # unresolved; only then does the resolver ask the bank.
            retried = wait_for_retries(tmp_path / "b.log", sent[0].id)
            resolving.start()
            outcomes = [result.get(timeout=PATIENCE) for result in sent]
            workers = [result.worker for result in sent]
        finally:
            resolver.stop()
            stop(first, signal.SIGKILL)
            if second is not None:
                stop(second)
    assert retried[0] == "InProgressError" and retried[-1] == "LeaseExpiredUnresolvedError", retried
    paid: dict[str, list[dict[str, Any]]] = {
        i: [c for c in bank.calls if c["invoice"] == i] for i in invoices
    }
    assert {i: len(calls) for i, calls in paid.items()} == {i: 1 for i in invoices}, "each invoice paid once"
    for invoice, outcome in zip(invoices, outcomes, strict=True):
        [call] = paid[invoice]
        assert outcome == {"transfer_id": call["transfer_id"], "amount": call["amount"]}
    assert paid[invoices[0]][0]["worker"].startswith("a@"), "the killed worker called the bank"
    assert workers[0].startswith("b@"), "another worker finished the redelivered task, by replaying"


def test_a_task_replays_under_its_task_id_and_refuses_changed_arguments(gate_target: str) -> None:
    app = Celery("billing-eager")
    paid: list[tuple[str, str]] = []

    @guarded_task(app, "payments.transfer", gate=lambda: Gate(gate_target))
    def transfer(invoice: str, amount: int, to: str, *, grant: Grant) -> dict[str, Any]:
        paid.append((invoice, grant.provider_key))
        return {"transfer_id": f"tr-{len(paid)}"}

    assert isinstance(transfer, GuardedTask) and transfer.acks_late and transfer.reject_on_worker_lost
    task_id = f"task-{uuid.uuid4().hex[:12]}"
    kwargs = {"invoice": "inv-1", "amount": 100, "to": "DE89"}
    first = transfer.apply(kwargs=kwargs, task_id=task_id).get()
    again = transfer.apply(kwargs=kwargs, task_id=task_id).get()
    other = transfer.apply(kwargs=kwargs, task_id=f"{task_id}-other").get()
    assert first == again == {"transfer_id": "tr-1"} and other == {"transfer_id": "tr-2"}
    with pytest.raises(KeyReusedError) as refused:
        transfer.apply(kwargs={**kwargs, "amount": 999}, task_id=task_id).get()
    assert refused.value.differing_fields == ("/amount",)
    assert len(paid) == 2 and paid[0][1] != paid[1][1]
