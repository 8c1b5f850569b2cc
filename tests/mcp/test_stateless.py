"""What the stateless protocol revision (2026-07-28) changes for the gateway, shown with the SDK's
real client and server: either revision toward the client in front of either kind of upstream (one
of 2026-07-28 and one that only knows the `initialize` handshake), and two gateway replicas behind
a round-robin HTTP proxy without sticky sessions (written here) serving one client: every call is
answered by whichever replica gets it, duplicates are one action through the gate, and a retry
after an unknown outcome is told the truth by either replica."""

from __future__ import annotations

import http.client
import itertools
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from conftest import AGENT_KEY, BIN, GATE_CONFIG, World
from mcp import Client, StdioServerParameters
from test_fleet import until_unresolved
from test_gateway import content, meta

pytestmark = pytest.mark.anyio

# Hop-by-hop headers a proxy does not pass on (RFC 9110), and the length it sets itself.
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


class RoundRobin:
    """An HTTP reverse proxy sending each request to the next backend in turn, whatever it
    carries (no session affinity). It keeps, per request, the backend and the MCP routing
    headers it saw."""

    def __init__(self, backends: list[str]) -> None:
        self.turns = itertools.cycle(range(len(backends)))
        self.backends = [urlsplit(b) for b in backends]
        self.seen: list[dict] = []
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.forward("POST")

            def do_GET(self) -> None:
                self.forward("GET")

            def do_DELETE(self) -> None:
                self.forward("DELETE")

            def forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    turn = next(proxy.turns)
                    proxy.seen.append({
                        "backend": turn,
                        "method": method,
                        **{name: self.headers.get(name) for name in (
                            "MCP-Protocol-Version", "Mcp-Method", "Mcp-Name", "Mcp-Session-Id")},
                    })
                backend = proxy.backends[turn]
                upstream = http.client.HTTPConnection(backend.hostname, backend.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP | {"host"}}
                upstream.request(method, backend.path, body=body, headers=headers)
                answer = upstream.getresponse()
                # The stateless answer (JSON or an SSE stream) ends with the request.
                data = answer.read()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mcp"

    def calls(self) -> list[dict]:
        """The `tools/call` requests, in order."""
        return [s for s in self.seen if s["Mcp-Method"] == "tools/call"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replicas(world: World) -> Iterator[tuple[str, RoundRobin]]:
    """A gate server, two gateway replicas on it, a round-robin proxy in front: (gate, proxy)."""
    gate = world.start_gate(GATE_CONFIG.replace("lease_ttl_seconds = 2", "lease_ttl_seconds = 6"))
    replicas = [
        world.start_http_gateway(
            "--gate", gate, "--api-key", AGENT_KEY, "--agent-id", "support-bot",
            "--in-progress-wait-seconds", "0", "--call-timeout-seconds", "2",
            data_dir=f"replica-{i}",
        )
        for i in range(2)
    ]
    proxy = RoundRobin(replicas)
    yield gate, proxy
    proxy.close()


def stdio_params(world: World, upstream: str, *extra: str) -> StdioServerParameters:
    args = world.gateway_args("--run-id", "r", *extra)
    if upstream == "handshake-only":
        args.append("--handshake-only")
    return StdioServerParameters(command=BIN, args=args, env=world.env())


async def from_both(client: Client, proxy: RoundRobin, call: dict) -> list[tuple[int, object]]:
    """Calls `create_ticket` again until each replica has answered at least once (the proxy takes
    turns over every request, not only calls): (replica, answer) for each call."""
    answers = []
    for _ in range(8):
        answer = await client.call_tool("create_ticket", call)
        answers.append((proxy.calls()[-1]["backend"], answer))
        if {backend for backend, _ in answers} == {0, 1}:
            return answers
    raise AssertionError(f"one replica answered every call: {proxy.seen}")


@pytest.mark.parametrize("upstream", ["2026-07-28", "handshake-only"])
@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_either_revision_in_front_of_either_upstream(world: World, mode: str, upstream: str) -> None:
    async with Client(stdio_params(world, upstream), mode=mode) as client:
        assert client.protocol_version == ("2026-07-28" if mode != "legacy" else "2025-11-25")
        listed = {tool.name for tool in (await client.list_tools()).tools}
        first = await client.call_tool("create_ticket", {"title": "disk full"})
        again = await client.call_tool("create_ticket", {"title": "disk full"})
        searched = await client.call_tool("search_tickets", {"query": "disk"})
    assert {"create_ticket", "search_tickets"} <= listed
    assert not first.is_error and content(again) == content(first)
    assert meta(again)["oncegate/replayed"] is True
    assert not searched.is_error and "oncegate/replayed" not in meta(searched)
    assert [e["kind"] for e in world.effects()] == ["ticket", "search"]


async def test_two_replicas_without_affinity_serve_one_client(
    world: World, replicas: tuple[str, RoundRobin]
) -> None:
    _gate, proxy = replicas
    async with Client(proxy.url, mode="2026-07-28") as client:
        results = [await client.call_tool("create_ticket", {"title": "vpn down"}) for _ in range(4)]
    calls = proxy.calls()
    # Each replica answered calls; nothing named a session; every request named its version,
    # and each call its method and tool (what a load balancer may route on).
    assert {c["backend"] for c in calls} == {0, 1}, proxy.seen
    assert all(s["Mcp-Session-Id"] is None for s in proxy.seen)
    assert all(s["MCP-Protocol-Version"] == "2026-07-28" for s in proxy.seen if s["method"] == "POST")
    assert all(c["Mcp-Name"] == "create_ticket" for c in calls) and len(calls) == 4
    assert len(world.effects()) == 1
    assert all(content(r) == content(results[0]) and not r.is_error for r in results)
    assert [bool(meta(r).get("oncegate/replayed")) for r in results] == [False, True, True, True]


async def test_after_an_unknown_outcome_either_replica_tells_the_truth(
    world: World, replicas: tuple[str, RoundRobin]
) -> None:
    gate, proxy = replicas
    # Longer than the replicas' call timeout (2 s): the outcome of the first call is unknown.
    call = {"title": "replace disk", "delay": 4}
    async with Client(proxy.url, mode="2026-07-28") as client:
        unknown = await client.call_tool("create_ticket", call)
        lost_by = proxy.calls()[-1]["backend"]
        assert meta(unknown)["oncegate/error"] == "OUTCOME_UNKNOWN", content(unknown)
        # While the lease lives: the replica that lost the attempt says so at once; the other
        # cannot tell a lost attempt from a running one, and says both. Neither runs it.
        for backend, retry in await from_both(client, proxy, call):
            if backend == lost_by:
                assert meta(retry)["oncegate/error"] == "OUTCOME_UNKNOWN"
                assert "forwarded by this gateway" in content(retry)[0]["text"]
            else:
                assert meta(retry)["oncegate/error"] == "IDEMPOTENCY_IN_PROGRESS"
                assert "its outcome is unknown or it is still running" in content(retry)[0]["text"]
        # Once the lease ends, both say it is unresolved; once an operator settles it, both replay.
        listed = await until_unresolved(world, gate)
        for _backend, after in await from_both(client, proxy, call):
            assert meta(after)["oncegate/error"] == "LEASE_EXPIRED_UNRESOLVED"
        world.admin(gate, "resolve", "--agent", "support-bot", "--run", listed[0]["run_id"],
                    "--key", listed[0]["key"], "--outcome", "completed", "--receipt", "T-1 exists")
        for _backend, settled in await from_both(client, proxy, call):
            assert meta(settled)["oncegate/replayed"] is True
    # The upstream ran the first attempt (late); nothing ran again.
    assert len(world.effects()) == 1
