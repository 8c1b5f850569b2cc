"""Fixtures: an in-memory fake gate for unit tests, and the real gate binary for integration tests.

The real gate is started from ``$ONCEGATE_BIN`` (default ``target/debug/oncegate`` under the
repository root) as ``oncegate serve --listen 127.0.0.1:<port> --data-dir <tmp> --config <policy>``
and is ready once its gRPC health check says SERVING. Its local operator (:meth:`RealGate.admin`)
is ``oncegate admin ... --data-dir <tmp>/data``, over the admin socket in the data directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from oncegate import Gate

from fake_gate import FakeGate, serve

REPO_ROOT = Path(__file__).resolve().parents[3]
VECTORS = REPO_ROOT / "tests" / "vectors" / "fingerprints.json"
TRANSFER_KEY_FIELDS = ["/amount", "/currency", "/to"]
POLICY = """\
strict = false

[defaults]
lease_ttl_seconds = 300
retention_seconds = 86400
sliding = true
on_expiry = "reconcile"

[actions."payments.transfer"]
key_fields = ["/amount", "/currency", "/to"]

[authorization]
policies = ["rules.cedar"]

[[budgets]]
name = "sms-per-hour"
actions = ["sms.send"]
window_seconds = 3600
limit = 1
"""
RULES = """\
@id("all") permit(principal, action, resource);
@id("no-mallory") forbid(principal == Agent::"mallory", action, resource);
@id("deletes") @hold("deletes need approval")
permit(principal, action == Action::"files.delete", resource);
"""
STARTUP_TIMEOUT = 60.0


@pytest.fixture
def fake() -> FakeGate:
    """A fake gate with the ``payments.transfer`` policy."""
    return FakeGate(key_fields={"payments.transfer": TRANSFER_KEY_FIELDS})


@pytest.fixture
def fake_gate(fake: FakeGate) -> Iterator[Gate]:
    """A client of :func:`fake`, served on a free port."""
    with serve(fake) as target, Gate(target, api_key="test-key", timeout=5.0) as gate:
        yield gate


@pytest.fixture
def fake_target(fake: FakeGate) -> Iterator[str]:
    """:func:`fake`, served on a free port; yields ``host:port`` (for the asyncio client)."""
    with serve(fake) as target:
        yield target


@pytest.fixture
def run_id() -> str:
    """A fresh run id, so that tests sharing one gate never share an action."""
    return f"run-{uuid.uuid4().hex[:12]}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="session")
def gate_target(gate_addresses: tuple[str, str]) -> str:
    """The real gate's ``host:port``."""
    return gate_addresses[0]


@dataclass(frozen=True)
class RealGate:
    """The real gate process of a session: where it listens, and what its operator needs."""

    target: str
    metrics: str
    binary: Path
    data_dir: Path

    def admin(self, *args: str) -> str:
        """Runs ``oncegate admin <args>`` as this gate's local operator, over the admin socket in
        its data directory (``unix:<data-dir>/admin.sock``); returns what it printed."""
        done = subprocess.run(
            [str(self.binary), "admin", *args, "--data-dir", str(self.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"oncegate admin {' '.join(args)}: {done.stderr}"
        return done.stdout


@pytest.fixture(scope="session")
def gate_addresses(real_gate: RealGate) -> tuple[str, str]:
    """The real gate's ``host:port`` and that of its metrics listener (which serves
    ``/.well-known/jwks.json``)."""
    return real_gate.target, real_gate.metrics


@pytest.fixture(scope="session")
def real_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealGate]:
    """Starts the real gate binary with the ``payments.transfer`` policy, the authorization rules
    (``RULES``) and a budget of one ``sms.send`` per hour (embedded store, so it signs with a key
    generated into its data directory)."""
    binary = Path(os.environ.get("ONCEGATE_BIN", REPO_ROOT / "target" / "debug" / "oncegate"))
    if not binary.is_file():
        pytest.fail(f"no gate binary at {binary}: build it (cargo build) or set ONCEGATE_BIN")
    workdir = tmp_path_factory.mktemp("gate")
    config = workdir / "policy.toml"
    config.write_text(POLICY, encoding="utf-8")
    (workdir / "rules.cedar").write_text(RULES, encoding="utf-8")
    target = f"127.0.0.1:{_free_port()}"
    metrics = f"127.0.0.1:{_free_port()}"
    log_path = workdir / "gate.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(binary),
                "serve",
                "--listen",
                target,
                "--data-dir",
                str(workdir / "data"),
                "--config",
                str(config),
                "--metrics-listen",
                metrics,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _serving(target):
            if process.poll() is not None:
                pytest.fail(
                    f"the gate exited with {process.returncode}:\n{log_path.read_text(errors='replace')}"
                )
            if time.monotonic() > deadline:
                log_text = log_path.read_text(errors="replace")
                pytest.fail(f"the gate did not report SERVING within {STARTUP_TIMEOUT}s:\n{log_text}")
            time.sleep(0.1)
        yield RealGate(target, metrics, binary, workdir / "data")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def signed_gate(gate_addresses: tuple[str, str]) -> Iterator[tuple[Gate, str]]:
    """A client of the real (signing) gate, and its metrics listener's ``host:port``."""
    with Gate(gate_addresses[0], api_key="test-key", timeout=10.0) as client:
        yield client, gate_addresses[1]


@pytest.fixture
def gate(gate_target: str) -> Iterator[Gate]:
    """A client of the real gate."""
    with Gate(gate_target, api_key="test-key", timeout=10.0) as client:
        yield client
