"""`oncegate mcp` with the in-process gate on the embedded store, driven by the Python MCP client
over stdio and over Streamable HTTP, in front of a real upstream that records each execution."""

from __future__ import annotations

import logging
import urllib.request

import anyio
import pytest
from conftest import BIN, RawHttp, World, free_port
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("protocol")]


def dump(result) -> dict:
    return result.model_dump(by_alias=True, exclude_none=True)


def content(result) -> list:
    return dump(result)["content"]


def meta(result) -> dict:
    return dump(result).get("_meta", {})


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_twice_and_after_a_restart_one_execution(world: World, transport: str) -> None:
    args = ("--run-id", "run-7")
    results = []
    for _gateway_run in range(2):
        if transport == "stdio":
            client = world.stdio_client(*args)
        else:
            client = Client(world.start_http_gateway(*args))
        async with client:
            results.append(await client.call_tool("create_ticket", {"title": "printer jam"}))
            if len(results) == 1:
                results.append(await client.call_tool("create_ticket", {"title": "printer jam"}))
        world.stop_http_gateways()
    assert len(world.effects()) == 1
    first, second, after_restart = results
    assert not first.is_error and "T-1" in str(content(first))
    assert content(second) == content(first) == content(after_restart)
    assert "oncegate/replayed" not in meta(first)
    assert meta(second)["oncegate/replayed"] is True
    assert meta(after_restart)["oncegate/replayed"] is True


@pytest.mark.parametrize("key_name", ["oncegate/idempotency_key", "idempotencyKey"])
async def test_changed_arguments_under_one_key_are_refused(world: World, key_name: str) -> None:
    async with world.stdio_client() as client:
        done = await client.call_tool(
            "create_ticket", {"title": "refund", "priority": 1}, meta={key_name: "ticket-42"}
        )
        changed = await client.call_tool(
            "create_ticket", {"title": "refund", "priority": 3}, meta={key_name: "ticket-42"}
        )
    assert not done.is_error
    assert changed.is_error
    text = content(changed)[0]["text"]
    assert "/priority" in text and "Do not retry under a new idempotency key" in text
    assert meta(changed)["oncegate/error"] == "IDEMPOTENCY_KEY_REUSED"
    assert meta(changed)["oncegate/differing_fields"] == ["/priority"]
    assert len(world.effects()) == 1


async def test_the_session_is_the_run_without_run_id(world: World) -> None:
    for _session in range(2):
        async with world.stdio_client() as client:
            await client.call_tool("create_ticket", {"title": "per session"})
            again = await client.call_tool("create_ticket", {"title": "per session"})
            assert meta(again)["oncegate/replayed"] is True
    # Two sessions are two runs: the gateway cannot know they belong to one agent run.
    assert len(world.effects()) == 2
    async with world.stdio_client() as client:
        r1 = await client.call_tool("create_ticket", {"title": "x"}, meta={"oncegate/run_id": "r"})
        r2 = await client.call_tool("create_ticket", {"title": "x"}, meta={"oncegate/run_id": "r"})
    assert meta(r2)["oncegate/replayed"] is True and content(r1) == content(r2)
    assert len(world.effects()) == 3


async def test_a_tool_error_is_recorded_unless_the_tool_says_errors_are_definite(world: World) -> None:
    async with world.stdio_client("--run-id", "r") as client:
        declined = await client.call_tool("charge_card", {"amount": 500})
        again = await client.call_tool("charge_card", {"amount": 500})
    assert declined.is_error and again.is_error
    assert content(again) == content(declined) and meta(again)["oncegate/replayed"] is True
    assert len(world.effects()) == 1
    world.write_config('[mcp.tools."charge_card"]\non_error = "release"\n')
    async with world.stdio_client("--run-id", "r2") as client:
        await client.call_tool("charge_card", {"amount": 500})
        again = await client.call_tool("charge_card", {"amount": 500})
    assert again.is_error and "oncegate/replayed" not in meta(again)
    assert len(world.effects()) == 3


async def test_an_upstream_refusal_releases_the_token(world: World) -> None:
    port = free_port()
    async with world.stdio_client("--run-id", "r", "--metrics-listen", f"127.0.0.1:{port}") as client:
        for _attempt in range(2):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("reserve_seat", {"seat": "Z9"})
            assert refused.value.code == -32602 and "no such seat" in refused.value.message
        # Released, not left in progress: the same call reaches the upstream each time.
        assert world.refused_seats() == ["Z9", "Z9"]
        ok = await client.call_tool("reserve_seat", {"seat": "A1"})
        metrics = scrape(port)
    assert not ok.is_error and len(world.effects()) == 1
    # Released as never attempted (the guard's release reason for an upstream refusal).
    assert 'oncegate_releases_total{reason="not_attempted"} 2' in metrics
    assert 'oncegate_releases_total{reason="definite_failure"} 0' in metrics


async def test_read_only_tools_resources_prompts_and_unknown_tools_pass_through(world: World) -> None:
    # The direct client speaks the revision the gated one does (the fixture's).
    direct = Client(world.stdio_upstream_params())
    async with world.stdio_client("--run-id", "r") as gated, direct:
        assert dump(await gated.list_tools()) == dump(await direct.list_tools())
        assert dump(await gated.list_resources()) == dump(await direct.list_resources())
        assert dump(await gated.read_resource("tickets://summary")) == dump(
            await direct.read_resource("tickets://summary")
        )
        assert dump(await gated.list_prompts()) == dump(await direct.list_prompts())
        assert dump(await gated.get_prompt("triage", {"ticket": "T-9"})) == dump(
            await direct.get_prompt("triage", {"ticket": "T-9"})
        )
        first = await gated.call_tool("count_tickets", {})
        second = await gated.call_tool("count_tickets", {})
        # Read-only: executed each time (its answers are numbered), never replayed.
        assert "read 1" in str(content(first)) and "read 2" in str(content(second))
        assert "oncegate/replayed" not in meta(second)
        unknown_gated = await gated.call_tool("no_such_tool", {"x": 1})
        unknown_direct = await direct.call_tool("no_such_tool", {"x": 1})
        assert dump(unknown_gated) == dump(unknown_direct) and unknown_gated.is_error
    assert world.effects() == []


async def test_a_tool_can_be_passed_through_by_the_config_file(world: World) -> None:
    world.write_config('[mcp.tools."create_ticket"]\ngate = false\n')
    async with world.stdio_client("--run-id", "r") as client:
        await client.call_tool("create_ticket", {"title": "t"})
        again = await client.call_tool("create_ticket", {"title": "t"})
    assert "oncegate/replayed" not in meta(again)
    assert len(world.effects()) == 2


async def test_an_upstream_over_streamable_http(world: World) -> None:
    url = world.start_http_upstream()
    args = ["mcp", "--data-dir", str(world.dir / "d"), "--run-id", "r", "--upstream-url", url]
    params = StdioServerParameters(command=BIN, args=args, env=world.env())
    async with Client(params) as client:
        first = await client.call_tool("create_ticket", {"title": "over http"})
        again = await client.call_tool("create_ticket", {"title": "over http"})
    assert content(first) == content(again) and meta(again)["oncegate/replayed"] is True
    assert len(world.effects()) == 1


async def until_executed(world: World, count: int = 1) -> None:
    """Waits until the upstream has started `count` executions (its effect is written first)."""
    while len(world.effects()) < count:
        await anyio.sleep(0.05)


async def test_a_call_outlasting_its_lease_is_kept_alive_and_recorded_once(world: World) -> None:
    world.write_config('[actions."create_ticket"]\nlease_ttl_seconds = 2\n')
    call = {"title": "slow export", "delay": 6}
    async with world.stdio_client("--run-id", "r", "--in-progress-wait-seconds", "0") as client:
        outcome: dict = {}

        async def slow() -> None:
            outcome["result"] = await client.call_tool("create_ticket", call)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await until_executed(world)
            # Past the 2 s lease the tool still runs: the heartbeat has kept the lease, so the
            # same call is in progress, not an attempt whose lease ended unresolved.
            await anyio.sleep(3.5)
            probe = await client.call_tool("create_ticket", call)
            assert probe.is_error and meta(probe)["oncegate/error"] == "IDEMPOTENCY_IN_PROGRESS"
        done = outcome["result"]
        assert not done.is_error and "T-1" in str(content(done))
        # Recorded as completed: the retry replays without calling the upstream.
        retry = await client.call_tool("create_ticket", call)
    assert meta(retry)["oncegate/replayed"] is True and content(retry) == content(done)
    assert len(world.effects()) == 1


async def test_key_fields_decide_what_a_retry_must_repeat(world: World) -> None:
    world.write_config('[mcp.tools."transfer"]\nkey_fields = ["/to", "/amount"]\n')
    key = {"oncegate/idempotency_key": "pay-1"}
    async with world.stdio_client("--run-id", "r") as client:
        sent = await client.call_tool("transfer", {"to": "alice", "amount": 30, "memo": "rent"}, meta=key)
        # Only the memo differs, and it is not a key field: the same transfer, replayed.
        memo = await client.call_tool(
            "transfer", {"to": "alice", "amount": 30, "memo": "rent for May"}, meta=key
        )
        # The amount is a key field: another transfer under the same key, refused.
        amount = await client.call_tool("transfer", {"to": "alice", "amount": 31, "memo": "rent"}, meta=key)
        # Without an idempotency key the key fields make the fingerprint: the memo still does not count.
        bob = await client.call_tool("transfer", {"to": "bob", "amount": 5, "memo": "a"})
        bob_again = await client.call_tool("transfer", {"to": "bob", "amount": 5, "memo": "b"})
    assert not sent.is_error and "30 to alice" in content(sent)[0]["text"]
    assert meta(memo)["oncegate/replayed"] is True and content(memo) == content(sent)
    assert amount.is_error and meta(amount)["oncegate/error"] == "IDEMPOTENCY_KEY_REUSED"
    assert meta(amount)["oncegate/differing_fields"] == ["/amount"]
    assert "/amount" in content(amount)[0]["text"]
    assert meta(bob_again)["oncegate/replayed"] is True and content(bob_again) == content(bob)
    assert [(e["to"], e["amount"], e["memo"]) for e in world.effects()] == [
        ("alice", 30, "rent"),
        ("bob", 5, "a"),
    ]


async def test_past_the_call_timeout_the_outcome_is_unknown_and_the_lease_kept(world: World) -> None:
    world.write_config('[actions."create_ticket"]\nlease_ttl_seconds = 1\n')
    args = ("--run-id", "r", "--call-timeout-seconds", "1")
    call = {"title": "stuck", "delay": 8}
    async with world.stdio_client(*args) as client:
        unknown = await client.call_tool("create_ticket", call)
        assert unknown.is_error and meta(unknown)["oncegate/error"] == "OUTCOME_UNKNOWN"
        text = content(unknown)[0]["text"]
        assert "did not answer within 1 s" in text and "may or may not have happened" in text
        assert meta(unknown)["oncegate/provider_key"] in text
        # Not released. The gateway that lost the attempt answers a retry with the unknown
        # outcome (not "in progress", not after a wait), and once the lease ends the gate
        # refuses it as unresolved: it never executes again.
        retry = await client.call_tool("create_ticket", call)
        assert meta(retry)["oncegate/error"] in ("OUTCOME_UNKNOWN", "LEASE_EXPIRED_UNRESOLVED")
        while meta(retry)["oncegate/error"] == "OUTCOME_UNKNOWN":
            assert "did not answer within 1 s" in content(retry)[0]["text"]
            await anyio.sleep(0.2)
            retry = await client.call_tool("create_ticket", call)
    assert retry.is_error and meta(retry)["oncegate/error"] == "LEASE_EXPIRED_UNRESOLVED"
    assert len(world.effects()) == 1


async def test_a_result_too_large_to_keep_is_returned_once_then_replayed_as_a_note(world: World) -> None:
    world.write_config("[limits]\nmax_receipt_bytes = 2048\n")
    title = "long " * 800
    async with world.stdio_client("--run-id", "r") as client:
        first = await client.call_tool("create_ticket", {"title": title})
        again = await client.call_tool("create_ticket", {"title": title})
    assert not first.is_error and title in str(content(first))
    assert meta(again)["oncegate/replayed"] is True
    assert "larger than the gate keeps" in content(again)[0]["text"]
    assert len(world.effects()) == 1


async def test_closing_an_http_session_is_answered_as_the_spec_and_the_sdk_expect(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    url = world.start_http_gateway("--run-id", "r")
    with caplog.at_level(logging.DEBUG, logger="mcp.client.streamable_http"):
        # Sessions are of the revisions with the handshake (2026-07-28 has none).
        async with Client(url, mode="legacy") as client:
            await client.call_tool("create_ticket", {"title": "then close"})
    # The SDK ends its session with DELETE and warns unless it hears 200 or 204.
    assert "Received session ID" in caplog.text, "the SDK's log is captured"
    assert "Session termination failed" not in caplog.text
    session = RawHttp(url)
    assert session.delete() == 200
    # Ended: the session is gone, for DELETE as for every other request naming it.
    assert session.delete() == 404
    status, _ = session.call("create_ticket", '{"title":"after the end"}')
    assert status == 404
    assert len(world.effects()) == 1
