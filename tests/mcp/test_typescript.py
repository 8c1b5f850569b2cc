"""The TypeScript MCP SDK's client (v2, `@modelcontextprotocol/client`, pinned in
tests/mcp/ts/package.json) in front of `oncegate mcp` over Streamable HTTP, on the stateless
2026-07-28 revision and on the handshake one: the same call twice is one execution, the second
answer the recorded result, replayed. Skipped when tests/mcp/ts has no node_modules (`npm ci`
there installs them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import World

TS = Path(__file__).with_name("ts")

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (TS / "node_modules/@modelcontextprotocol/client").is_dir(),
    reason="the TypeScript SDK is not installed (npm ci in tests/mcp/ts)",
)


@pytest.mark.parametrize("revision", ["2026-07-28", "legacy"])
def test_the_typescript_client_calls_once(world: World, revision: str) -> None:
    url = world.start_http_gateway("--run-id", "ts")
    done = subprocess.run(
        ["node", "call.mjs", url, revision], cwd=TS, capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["version"] == ("2026-07-28" if revision != "legacy" else "2025-11-25")
    first, again = answer["results"]
    assert not first.get("isError") and again["content"] == first["content"]
    assert "oncegate/replayed" not in first.get("_meta", {})
    assert again["_meta"]["oncegate/replayed"] is True
    assert len(world.effects()) == 1
