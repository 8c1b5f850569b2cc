"""`oncegate mcp` against a gate server over gRPC with API keys (`oncegate serve`): several
gateways on one gate, an upstream killed mid-call and settled by an operator with `oncegate
admin`, and the gate's metrics counting gateway decisions like any other."""

from __future__ import annotations

import os
import signal

import anyio
import pytest
from conftest import AGENT_KEY, GATE_CONFIG, World, free_port
from mcp import Client
from test_gateway import content, meta, scrape

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("protocol")]


def gateway_to(gate: str, *extra: str) -> tuple[str, ...]:
    return ("--gate", gate, "--api-key", AGENT_KEY, "--agent-id", "support-bot", *extra)


async def test_two_clients_racing_through_two_gateways_execute_once(world: World) -> None:
    gate = world.start_gate(GATE_CONFIG)
    urls = [world.start_http_gateway(*gateway_to(gate, "--run-id", "run-1")) for _ in range(2)]
    results: list = [None, None]

    async def call(i: int) -> None:
        async with Client(urls[i]) as client:
            results[i] = await client.call_tool("create_ticket", {"title": "vpn down", "delay": 1.5})

    async with anyio.create_task_group() as tg:
        for i in range(2):
            tg.start_soon(call, i)
    assert len(world.effects()) == 1
    assert content(results[0]) == content(results[1])
    assert sorted(bool(meta(r).get("oncegate/replayed")) for r in results) == [False, True]


async def until_unresolved(world: World, gate: str) -> list[dict]:
    """Waits until the gate lists an unresolved action of support-bot (its lease has ended)."""
    while True:
        listed = world.admin(gate, "list-unresolved", "--agent", "support-bot")["actions"]
        if listed:
            return listed
        await anyio.sleep(0.2)


async def test_upstream_killed_mid_call_outcome_unknown_until_an_operator_resolves(world: World) -> None:
    # A lease long enough that the retries below meet it live (the gate says "in progress").
    gate = world.start_gate(GATE_CONFIG.replace("lease_ttl_seconds = 2", "lease_ttl_seconds = 6"))
    seen = gateway_to(gate, "--run-id", "run-9")
    # Another gateway of the fleet, which did not see the attempt die (it answers at once).
    elsewhere = gateway_to(gate, "--run-id", "run-9", "--in-progress-wait-seconds", "0")
    call = {"title": "replace disk", "delay": 30}
    async with world.stdio_client(*seen) as client, world.stdio_client(*elsewhere) as other:
        outcome: dict = {}

        async def slow() -> None:
            outcome["result"] = await client.call_tool("create_ticket", call)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            while not world.effects():
                await anyio.sleep(0.05)
            # The first upstream started is the first client's (each starts at initialize).
            os.kill(world.upstream_pids()[0], signal.SIGKILL)
        unknown = outcome["result"]
        assert unknown.is_error and meta(unknown)["oncegate/error"] == "OUTCOME_UNKNOWN"
        text = content(unknown)[0]["text"]
        assert "may or may not have happened" in text and "Do not retry" in text
        assert meta(unknown)["oncegate/provider_key"].startswith("og-")
        assert meta(unknown)["oncegate/provider_key"] in text

        # The gateway that saw the attempt die says so at once: the lease is live, but nobody
        # is running the tool. Nothing is executed.
        retry = await client.call_tool("create_ticket", call)
        assert retry.is_error and meta(retry)["oncegate/error"] == "OUTCOME_UNKNOWN"
        assert "forwarded by this gateway" in content(retry)[0]["text"]
        assert meta(retry)["oncegate/provider_key"] == meta(unknown)["oncegate/provider_key"]
        # Another gateway cannot tell a lost attempt from a running one: it says both.
        other_retry = await other.call_tool("create_ticket", call)
        assert meta(other_retry)["oncegate/error"] == "IDEMPOTENCY_IN_PROGRESS"
        other_text = content(other_retry)[0]["text"]
        assert "its outcome is unknown or it is still running" in other_text
        assert "do not re-run it" in other_text
        assert len(world.effects()) == 1

        # Once the lease ends, the gate itself says so to every gateway.
        listed = await until_unresolved(world, gate)
        assert len(listed) == 1 and listed[0]["run_id"] == "run-9"
        for gateway in (client, other):
            after = await gateway.call_tool("create_ticket", call)
            assert meta(after)["oncegate/error"] == "LEASE_EXPIRED_UNRESOLVED"
        assert len(world.effects()) == 1

        world.admin(gate, "resolve", "--agent", "support-bot", "--run", "run-9",
                    "--key", listed[0]["key"], "--outcome", "completed",
                    "--receipt", "ticket T-1 found in the help desk", "--note", "checked by hand")

        replayed = await client.call_tool("create_ticket", call)
        replayed_elsewhere = await other.call_tool("create_ticket", call)
    for result in (replayed, replayed_elsewhere):
        assert not result.is_error
        assert meta(result)["oncegate/replayed"] is True
        assert meta(result)["oncegate/recorded_by"] == "operator"
        assert "ticket T-1 found in the help desk" in content(result)[0]["text"]
    assert len(world.effects()) == 1


async def test_gateway_decisions_are_counted_at_the_gate_and_in_process(world: World) -> None:
    port = free_port()
    gate = world.start_gate(GATE_CONFIG, "--metrics-listen", f"127.0.0.1:{port}")
    async with world.stdio_client(*gateway_to(gate, "--run-id", "r")) as client:
        for _ in range(2):
            await client.call_tool("create_ticket", {"title": "counted"})
    text = scrape(port)
    assert 'oncegate_attempts_total{action="create_ticket",decision="granted",mode="enforce"} 1' in text
    assert 'oncegate_attempts_total{action="create_ticket",decision="replayed",mode="enforce"} 1' in text

    # In process: a tool named in [mcp] has its own policy, hence its own label (DAR per tool).
    world.write_config('[mcp.tools."charge_card"]\naction = "payments.charge"\n')
    port = free_port()
    async with world.stdio_client("--run-id", "r", "--metrics-listen", f"127.0.0.1:{port}") as client:
        for _ in range(2):
            await client.call_tool("charge_card", {"amount": 5})
        text = scrape(port)
    assert 'oncegate_attempts_total{action="payments.charge",decision="granted",mode="enforce"} 1' in text
    assert 'oncegate_attempts_total{action="payments.charge",decision="replayed",mode="enforce"} 1' in text


async def test_a_wrong_api_key_executes_nothing(world: World) -> None:
    gate = world.start_gate(GATE_CONFIG)
    args = ("--gate", gate, "--api-key", "wrong", "--agent-id", "support-bot")
    async with world.stdio_client(*args) as client:
        refused = await client.call_tool("create_ticket", {"title": "nope"})
        # Not gated: passes through even though the gate refuses everything.
        read = await client.call_tool("count_tickets", {})
    assert refused.is_error and "unauthenticated" in content(refused)[0]["text"]
    assert not read.is_error
    assert world.effects() == []


async def test_the_in_progress_wait_runs_out_while_another_gateway_holds_the_lease(world: World) -> None:
    gate = world.start_gate(GATE_CONFIG)
    holder = world.start_http_gateway(*gateway_to(gate, "--run-id", "run-3"))
    impatient = world.start_http_gateway(
        *gateway_to(gate, "--run-id", "run-3", "--in-progress-wait-seconds", "1")
    )
    # Longer than the 2 s lease of create_ticket: the holder's heartbeat keeps it over gRPC.
    call = {"title": "migrate mailbox", "delay": 8}
    outcome: dict = {}

    async def hold() -> None:
        async with Client(holder) as client:
            outcome["result"] = await client.call_tool("create_ticket", call)

    async with Client(impatient) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            while not world.effects():
                await anyio.sleep(0.05)
            waited = await client.call_tool("create_ticket", call)
            # Past the lease, still in progress (extended), not an attempt left unresolved.
            await anyio.sleep(2.5)
            still = await client.call_tool("create_ticket", call)
            assert "result" not in outcome
        assert meta(still)["oncegate/error"] == "IDEMPOTENCY_IN_PROGRESS"
        assert waited.is_error and meta(waited)["oncegate/error"] == "IDEMPOTENCY_IN_PROGRESS"
        text = content(waited)[0]["text"]
        assert "had not finished after 1 s" in text
        assert "its outcome is unknown or it is still running" in text
        assert meta(waited)["oncegate/provider_key"] in text
        # Once the holder has finished, the same call gets its result.
        later = await client.call_tool("create_ticket", call)
    held = outcome["result"]
    assert not held.is_error and content(later) == content(held)
    assert meta(later)["oncegate/replayed"] is True
    assert len(world.effects()) == 1



async def test_an_unreachable_gate_fails_at_once_logged_and_counted(world: World) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    # An hour of in-progress wait: were an unreachable gate waited out, this test would not end.
    args = ("--gate", closed, "--agent-id", "support-bot", "--in-progress-wait-seconds", "3600",
            "--metrics-listen", f"127.0.0.1:{port}")
    log = world.dir / "gateway.log"
    with log.open("w", encoding="utf-8") as errlog:
        async with world.stdio_client(*args, errlog=errlog) as client:
            refused = [
                await client.call_tool("create_ticket", {"title": f"nobody home {n}"}) for n in range(2)
            ]
            read = await client.call_tool("count_tickets", {})
            listed = await client.list_tools()
            metrics = scrape(port)
    for result in refused:
        assert result.is_error and meta(result)["oncegate/error"] == "GATE_UNAVAILABLE"
        text = content(result)[0]["text"]
        assert "Nothing was done" in text and "unavailable" in text
    assert "oncegate_mcp_gate_unavailable_total 2" in metrics
    assert log.read_text().count("the gate is unavailable: the call was not forwarded") == 2
    assert not read.is_error and "0 executions" in content(read)[0]["text"]
    assert "create_ticket" in [tool.name for tool in listed.tools]
    assert world.effects() == []
