"""Fixtures of the MCP gateway tests: the `oncegate` binary ($ONCEGATE_BIN), gateways over stdio
and Streamable HTTP, a gRPC gate with API keys, the upstream's effects file, and raw JSON-RPC
sessions (over stdio and Streamable HTTP) for what the SDK cannot send: number literals a Python
float would round before they leave the client."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = os.environ.get("ONCEGATE_BIN", str(Path(__file__).parents[2] / "target/debug/oncegate"))
UPSTREAM = str(Path(__file__).with_name("upstream_server.py"))
AGENT_KEY = "agent-key-0123456789abcdef0123456789abcdef"
OPERATOR_KEY = "operator-key-0123456789abcdef0123456789abcdef"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


PROTOCOLS = ["2026-07-28", "legacy"]
"""The protocol revisions the gateway speaks to a client, as the SDK's `Client(mode=...)` names
them: the stateless 2026-07-28 (no handshake; each request carries its version) and the newest
with the `initialize` handshake (2025-11-25, the SDK's `legacy`)."""


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on each revision: every SDK `Client` it makes without a `mode` uses this one."""
    made = Client.__init__

    def init(self, *args, mode: str = request.param, **options) -> None:
        made(self, *args, mode=mode, **options)

    monkeypatch.setattr(Client, "__init__", init)
    return request.param


def free_port() -> int:
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

    def gateway_args(
        self, *extra: str, data_dir: str = "gateway-data", upstream: str | None = None
    ) -> list[str]:
        args = ["mcp", *extra]
        if "--gate" not in extra:
            args += ["--data-dir", str(self.dir / data_dir)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        if upstream is not None:
            return [*args, "--upstream-url", upstream]
        return [*args, "--upstream-command", sys.executable, UPSTREAM]

    def start_http_upstream(self) -> str:
        """Starts the upstream on Streamable HTTP (once for many sessions); returns its URL."""
        port = free_port()
        process = subprocess.Popen([sys.executable, UPSTREAM, "--http", str(port)], env=self.env())
        self.processes.insert(0, process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return f"http://127.0.0.1:{port}/mcp"
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the upstream did not start")

    def stdio_client(self, *extra: str, errlog: TextIO | None = None, **options) -> Client:
        """An MCP client that starts the gateway as its stdio server (the `command`/`args` form);
        the gateway's standard error goes to `errlog` when given."""
        params = StdioServerParameters(command=BIN, args=self.gateway_args(*extra), env=self.env())
        if errlog is not None:
            return Client(stdio_client(params, errlog=errlog), **options)
        return Client(params, **options)

    def start_http_gateway(
        self, *extra: str, data_dir: str = "gateway-data", upstream: str | None = None
    ) -> str:
        """Starts a gateway on Streamable HTTP (upstream: a child process, or `upstream`'s URL);
        returns its URL."""
        args = self.gateway_args("--listen", "127.0.0.1:0", *extra, data_dir=data_dir, upstream=upstream)
        process = subprocess.Popen(
            [BIN, *args],
            stdout=subprocess.PIPE,
            text=True,
            env=self.env(),
        )
        self.processes.append(process)
        return f"http://{_listening(process, 'oncegate mcp')}/mcp"

    def stop_http_gateways(self) -> None:
        while self.processes and self.processes[-1].args[1] == "mcp":
            _stop(self.processes.pop())

    def stop_gates(self) -> None:
        for process in [p for p in self.processes if p.args[1] == "serve"]:
            _stop(process)
            self.processes.remove(process)

    def start_gate(self, config: str, *extra: str, data_dir: str = "gate-data") -> str:
        """Starts `oncegate serve` (embedded store in `data_dir`) with `config`; returns its URL."""
        path = self.dir / "gate.toml"
        path.write_text(config)
        process = subprocess.Popen(
            [BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(self.dir / data_dir),
             "--config", str(path), *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=self.env(),
        )
        self.processes.insert(0, process)
        return f"http://{_listening(process, 'oncegate serve')}"

    def cli(self, *args: str) -> tuple[int, dict]:
        """`oncegate ARGS --json`: the exit code and the JSON document (an error's too)."""
        done = subprocess.run(
            [BIN, *args, "--json"], capture_output=True, text=True, timeout=30, check=False
        )
        return done.returncode, json.loads(done.stdout)

    def raw_stdio(self, *extra: str) -> RawStdio:
        """A gateway on stdio, driven by raw JSON-RPC lines (its standard error in a file)."""
        log = open(self.dir / f"gateway-{len(self.processes)}.log", "w", encoding="utf-8")  # noqa: SIM115
        process = subprocess.Popen(
            [BIN, *self.gateway_args(*extra)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env(),
        )
        self.processes.append(process)
        return RawStdio(process, Path(log.name))

    def admin(self, gate: str, *args: str) -> dict:
        """`oncegate admin --json` as the operator."""
        done = subprocess.run(
            [BIN, "admin", "--server", gate, "--api-key", OPERATOR_KEY, "--json", *args],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)


INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "raw-json-rpc", "version": "1"},
}


def tools_call(request_id: int, tool: str, arguments: str | None) -> str:
    """A `tools/call` line whose arguments are `arguments` verbatim (JSON text, or absent)."""
    params = f'{{"name":{json.dumps(tool)}' + (f',"arguments":{arguments}' if arguments is not None else "")
    return f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":{params}}}}}'


class RawStdio:
    """One MCP session over a gateway's stdio, one JSON-RPC message per line, sent as written."""

    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self.process, self.log, self.next_id = process, log, 100
        self.request("initialize", INITIALIZE)
        self.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def send(self, line: str) -> None:
        assert self.process.stdin is not None and "\n" not in line
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def answer(self, request_id: int) -> dict:
        """Reads messages until the answer to `request_id`."""
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"the gateway exited: {self.log.read_text()}")
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        self.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        return self.answer(self.next_id)

    def call(self, tool: str, arguments: str | None) -> dict:
        """`tools/call` with `arguments` as written; the JSON-RPC answer."""
        self.next_id += 1
        self.send(tools_call(self.next_id, tool, arguments))
        return self.answer(self.next_id)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


class RawHttp:
    """One MCP session over a gateway's Streamable HTTP endpoint: each message POSTed as written."""

    HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    def __init__(self, url: str) -> None:
        self.url, self.next_id, self.session = url, 100, ""
        status, headers, _ = self.post(json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}
        ))
        assert status == 200, status
        self.session = headers["mcp-session-id"]
        status, _, _ = self.post('{"jsonrpc":"2.0","method":"notifications/initialized"}')
        assert status == 202, status

    def _send(self, method: str, body: str | None) -> tuple[int, dict[str, str], str]:
        headers = dict(self.HEADERS)
        if self.session:
            headers |= {"Mcp-Session-Id": self.session, "MCP-Protocol-Version": "2025-06-18"}
        request = urllib.request.Request(
            self.url, data=None if body is None else body.encode(), headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, got, text = response.status, response.headers, response.read().decode()
        except urllib.error.HTTPError as refused:
            status, got, text = refused.code, refused.headers, refused.read().decode()
        return status, {k.lower(): v for k, v in got.items()}, text

    def post(self, body: str) -> tuple[int, dict[str, str], str]:
        return self._send("POST", body)

    def call(self, tool: str, arguments: str | None) -> tuple[int, dict | None]:
        """`tools/call` with `arguments` as written: the HTTP status and the JSON-RPC answer (from
        the event stream; `None` when the body holds none)."""
        self.next_id += 1
        status, _, text = self.post(tools_call(self.next_id, tool, arguments))
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                message = json.loads(line[5:])
                if message.get("id") == self.next_id:
                    return status, message
        return status, None

    def delete(self) -> int:
        """Ends the session (HTTP DELETE); the status."""
        return self._send("DELETE", None)[0]


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
