"""docs/agents/mcp.md's examples run as written: the MCP client's configuration (its `command` and
`args`, with a temporary data directory, the page's `[mcp]` table as the config file and this
suite's upstream in place of `python -m ticket_tools`), and the Streamable HTTP command (through
`sh`, with free ports in place of 8080, 50051 and 9000 and a real gate that knows the agent's key).
The gated tool runs once however often it is called; the tool the table passes through runs each
time."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import AGENT_KEY, BIN, GATE_CONFIG, UPSTREAM, World, _listening, free_port
from mcp import Client, StdioServerParameters
from test_gateway import content, meta

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("protocol")]

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "agents" / "mcp.md").read_text(encoding="utf-8")


def block(lang: str, starting: str = "") -> str:
    found = [b for b in re.findall(rf"```{lang}\n(.*?)```", PAGE, flags=re.DOTALL) if b.startswith(starting)]
    assert len(found) == 1, found
    return found[0]


async def gated_once_search_passed_through(client: Client, world: World) -> None:
    first = await client.call_tool("create_ticket", {"title": "printer jam"})
    again = await client.call_tool("create_ticket", {"title": "printer jam"})
    assert not first.is_error and content(again) == content(first)
    assert meta(again)["oncegate/replayed"] is True
    for _ in range(2):
        searched = await client.call_tool("search_tickets", {"query": "printer"})
        assert not searched.is_error and "oncegate/replayed" not in meta(searched)
    assert [e["kind"] for e in world.effects()] == ["ticket", "search", "search"]


async def test_the_client_configuration_runs_as_written(world: World) -> None:
    server = json.loads(block("json"))["mcpServers"]["tickets"]
    assert server["command"] == "oncegate"
    args = list(server["args"])
    args[args.index("--data-dir") + 1] = str(world.dir / "gateway-data")
    args[args.index("--config") + 1] = str(world.write_config(block("toml", "[mcp]")))
    upstream = args.index("--upstream-command")
    assert args[upstream + 1:] == ["python", "-m", "ticket_tools"]
    args[upstream + 1:] = [sys.executable, UPSTREAM]
    params = StdioServerParameters(command=BIN, args=args, env=world.env())
    async with Client(params) as client:
        await gated_once_search_passed_through(client, world)


async def test_the_streamable_http_command_runs_as_written(world: World) -> None:
    (world.dir / "mcp.toml").write_text(block("toml", "[mcp]"))
    gate = world.start_gate(block("toml", "[mcp]") + GATE_CONFIG)
    upstream_port = free_port()
    world.processes.append(subprocess.Popen(
        [sys.executable, UPSTREAM, "--http", str(upstream_port)], env=world.env()))
    wait_for_port(upstream_port)
    command = block("sh", "ONCEGATE_API_KEY=")
    command = "\n".join(line for line in command.splitlines() if not line.startswith("#"))
    assert command.startswith("ONCEGATE_API_KEY=$AGENT_KEY oncegate mcp ")
    command = (command.replace(" oncegate mcp ", " exec oncegate mcp ", 1)  # sh leaves with it
               .replace("127.0.0.1:8080", "127.0.0.1:0")
               .replace("http://127.0.0.1:50051", gate)
               .replace("127.0.0.1:9000", f"127.0.0.1:{upstream_port}"))
    path = f"{Path(BIN).parent}:{os.environ.get('PATH', '')}"
    gateway = subprocess.Popen(
        ["sh", "-c", command], cwd=world.dir, stdout=subprocess.PIPE, text=True,
        env={**world.env(), "AGENT_KEY": AGENT_KEY, "PATH": path})
    world.processes.append(gateway)
    async with Client(f"http://{_listening(gateway, 'oncegate mcp')}/mcp") as client:
        await gated_once_search_passed_through(client, world)


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")
