"""Approvals asked in the chat: a gated tool call the gate holds for approval is asked
of the person in the session through `elicitation/create` when their client supports it. Accepted:
the gateway approves and the call runs once; declined or cancelled: the gate records a denial and
nothing runs. A client without elicitation gets the approval id. Over stdio and Streamable HTTP,
on the in-process gate and on a gate server with the gateway's own approver key."""

from __future__ import annotations

from pathlib import Path

import mcp.types as types
import pytest
from conftest import AGENT_KEY, GATE_CONFIG, World, sha256
from mcp import Client
from test_gateway import content, meta

pytestmark = pytest.mark.anyio

APPROVER_KEY = "approver-key-0123456789abcdef0123456789abcdef"

RULES = """
@id("all") permit(principal, action, resource);
@id("large-transfers") @hold("transfers above 100 need the user's approval")
permit(principal, action == Action::"transfer", resource)
  when { context.params has amount && context.params.amount > 100 };
"""


def write_rules(world: World) -> Path:
    path = world.dir / "rules.cedar"
    path.write_text(RULES)
    return path


def in_process_config(world: World) -> None:
    world.write_config(f'[authorization]\npolicies = ["{write_rules(world)}"]\n')


class Person:
    """The elicitation callback: answers `action` with `note`, and keeps what it was asked."""

    def __init__(self, action: str, note: str = "") -> None:
        self.action, self.note, self.asked = action, note, []

    async def __call__(self, _context, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        answer = {"note": self.note} if self.action == "accept" else None
        return types.ElicitResult(action=self.action, content=answer)


def client(world: World, transport: str, person: Person | None, *extra: str, log=None) -> Client:
    options = {"elicitation_callback": person} if person is not None else {}
    if transport == "stdio":
        return world.stdio_client("--run-id", "chat-1", *extra, errlog=log, **options)
    return Client(world.start_http_gateway("--run-id", "chat-1", *extra), **options)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_accepted_in_the_chat_the_call_runs_once(world: World, transport: str) -> None:
    in_process_config(world)
    person = Person("accept", "ok, it is the invoice we agreed")
    async with client(world, transport, person) as session:
        first = await session.call_tool("transfer", {"to": "DE89", "amount": 250})
        again = await session.call_tool("transfer", {"to": "DE89", "amount": 250})
    # Asked once, with the tool, the arguments as sent, the policy and its reason.
    assert len(person.asked) == 1
    asked = person.asked[0]
    for shown in ("transfer", '"amount":250', "large-transfers", "need the user's approval"):
        assert shown in asked, asked
    assert not first.is_error, content(first)
    assert len(world.effects()) == 1
    assert meta(again)["oncegate/replayed"] is True and content(again) == content(first)


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("answer", ["decline", "cancel"])
async def test_declined_or_cancelled_nothing_runs(world: World, transport: str, answer: str) -> None:
    in_process_config(world)
    person = Person(answer)
    async with client(world, transport, person) as session:
        refused = await session.call_tool("transfer", {"to": "DE89", "amount": 300})
        # The gate recorded a denial: the same call is refused, and not asked again.
        again = await session.call_tool("transfer", {"to": "DE89", "amount": 300})
    assert refused.is_error and meta(refused)["oncegate/error"] == "APPROVAL_DENIED"
    said = {"decline": "declined", "cancel": "cancelled"}[answer]
    assert f"The user {said} the approval" in content(refused)[0]["text"]
    assert again.is_error and "denied" in content(again)[0]["text"]
    assert len(person.asked) == 1
    assert world.effects() == []


async def test_the_answer_is_in_the_audit_line(world: World) -> None:
    in_process_config(world)
    log_path = world.dir / "gateway.log"
    with open(log_path, "w", encoding="utf-8") as log:
        async with client(world, "stdio", Person("accept", "approved by Dana"), log=log) as session:
            await session.call_tool("transfer", {"to": "DE89", "amount": 150})
    lines = log_path.read_text().splitlines()
    answered = [line for line in lines if "mcp_approval_answered" in line]
    assert answered and "accepted" in answered[0] and "approved by Dana" in answered[0], lines
    decided = [line for line in lines if "decide_approval" in line and "approved" in line]
    assert any("accepted by the user in the MCP session" in line for line in decided), lines


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_client_without_elicitation_gets_the_approval_id(world: World, transport: str) -> None:
    in_process_config(world)
    async with client(world, transport, None) as session:
        held = await session.call_tool("transfer", {"to": "DE89", "amount": 500})
    assert held.is_error and "pending approval" in content(held)[0]["text"]
    assert world.effects() == []


async def test_small_transfers_are_not_asked(world: World) -> None:
    in_process_config(world)
    person = Person("decline")
    async with client(world, "stdio", person) as session:
        done = await session.call_tool("transfer", {"to": "DE89", "amount": 20})
    assert not done.is_error and person.asked == [] and len(world.effects()) == 1


GATE_WITH_APPROVER = GATE_CONFIG + f"""
[[principals]]
name = "chat-approvals"
role = "approver"
api_key_sha256 = "{sha256(APPROVER_KEY)}"
"""


async def test_through_a_gate_server_the_gateway_decides_as_its_approver(world: World) -> None:
    rules = write_rules(world)
    gate = world.start_gate(GATE_WITH_APPROVER + f'\n[authorization]\npolicies = ["{rules}"]\n')
    person = Person("accept", "fine")
    url = world.start_http_gateway(
        "--gate", gate, "--api-key", AGENT_KEY, "--approver-api-key", APPROVER_KEY,
        "--agent-id", "support-bot", "--run-id", "chat-2",
    )
    async with Client(url, elicitation_callback=person) as session:
        first = await session.call_tool("transfer", {"to": "DE89", "amount": 400})
        again = await session.call_tool("transfer", {"to": "DE89", "amount": 400})
    assert not first.is_error, content(first)
    assert len(person.asked) == 1 and len(world.effects()) == 1
    assert meta(again)["oncegate/replayed"] is True
    # Without the approver key, the same gateway cannot decide: it answers with the approval id.
    url = world.start_http_gateway(
        "--gate", gate, "--api-key", AGENT_KEY, "--agent-id", "support-bot", "--run-id", "chat-3",
    )
    unasked = Person("accept")
    async with Client(url, elicitation_callback=unasked) as session:
        held = await session.call_tool("transfer", {"to": "DE89", "amount": 400})
    assert held.is_error and "pending approval" in content(held)[0]["text"]
    assert unasked.asked == [] and len(world.effects()) == 1
