"""Fixtures of the MCP gateway tests: the `oncegate` binary ($ONCEGATE_BIN), gateways over stdio
and Streamable HTTP, a gRPC gate with API keys, and the upstream's effects file."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

BIN = os.environ.get("ONCEGATE_BIN", str(Path(__file__).parents[2] / "target/debug/oncegate"))
UPSTREAM = str(Path(__file__).with_name("upstream_server.py"))
AGENT_KEY = "agent-key-0123456789abcdef0123456789abcdef"
OPERATOR_KEY = "operator-key-0123456789abcdef0123456789abcdef"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _listening(process: subprocess.Popen[str], what: str) -> str:
    """Reads standard output until `listening on ADDR`; returns ADDR."""
    deadline = time.monotonic() + 30
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"{what} exited with {process.wait()}")
        found = re.search(r"listening on (\S+)", line)
        if found:
            return found.group(1)
    raise AssertionError(f"{what} did not start")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class World:
    """One test's files: the upstream's effects, its pids, the gateway's store and config."""

    dir: Path
    config: Path | None = None
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def effects_file(self) -> Path:
        return self.dir / "effects.jsonl"

    def effects(self) -> list[dict]:
        if not self.effects_file.exists():
            return []
        return [json.loads(line) for line in self.effects_file.read_text().splitlines()]

    def refused_seats(self) -> list[str]:
        path = Path(str(self.effects_file) + ".refused")
        return path.read_text().splitlines() if path.exists() else []

    def upstream_pids(self) -> list[int]:
        path = self.dir / "upstream.pids"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "EFFECTS_FILE": str(self.effects_file),
            "PID_FILE": str(self.dir / "upstream.pids"),
            "RUST_LOG": "warn,oncegate::audit=info",
        }

    def write_config(self, text: str) -> Path:
        self.config = self.dir / "oncegate.toml"
        self.config.write_text(text)
        return self.config

    def gateway_args(self, *extra: str, data_dir: str = "gateway-data") -> list[str]:
        args = ["mcp", *extra]
        if "--gate" not in extra:
            args += ["--data-dir", str(self.dir / data_dir)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        return [*args, "--upstream-command", sys.executable, UPSTREAM]

    def stdio_client(self, *extra: str, **options) -> Client:
        """An MCP client that starts the gateway as its stdio server (the `command`/`args` form)."""
        params = StdioServerParameters(command=BIN, args=self.gateway_args(*extra), env=self.env())
        return Client(params, **options)

    def start_http_gateway(self, *extra: str) -> str:
        """Starts a gateway on Streamable HTTP; returns its URL."""
        process = subprocess.Popen(
            [BIN, *self.gateway_args("--listen", "127.0.0.1:0", *extra)],
            stdout=subprocess.PIPE,
            text=True,
            env=self.env(),
        )
        self.processes.append(process)
        return f"http://{_listening(process, 'oncegate mcp')}/mcp"

    def stop_http_gateways(self) -> None:
        while self.processes and self.processes[-1].args[1] == "mcp":
            _stop(self.processes.pop())

    def start_gate(self, config: str, *extra: str) -> str:
        """Starts `oncegate serve` (embedded store) with `config`; returns its URL."""
        path = self.dir / "gate.toml"
        path.write_text(config)
        process = subprocess.Popen(
            [BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(self.dir / "gate-data"),
             "--config", str(path), *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=self.env(),
        )
        self.processes.insert(0, process)
        return f"http://{_listening(process, 'oncegate serve')}"

    def admin(self, gate: str, *args: str) -> dict:
        """`oncegate admin --json` as the operator."""
        done = subprocess.run(
            [BIN, "admin", "--server", gate, "--api-key", OPERATOR_KEY, "--json", *args],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    for process in reversed(w.processes):
        _stop(process)


GATE_CONFIG = f"""
[actions."create_ticket"]
lease_ttl_seconds = 2

[[principals]]
name = "support-gateways"
role = "agent"
agents = ["support-*"]
api_key_sha256 = "{sha256(AGENT_KEY)}"

[[principals]]
name = "oncall"
role = "operator"
api_key_sha256 = "{sha256(OPERATOR_KEY)}"
"""


def _stdio_upstream_params(self: World) -> StdioServerParameters:
    """The upstream itself, for comparing what the gateway passes through with the original."""
    return StdioServerParameters(command=sys.executable, args=[UPSTREAM], env=self.env())


World.stdio_upstream_params = _stdio_upstream_params  # type: ignore[attr-defined]
