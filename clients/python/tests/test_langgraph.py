"""The LangGraph adapter, driven through a real ``StateGraph`` with ``ToolNode``, a checkpointer and
LangChain's own fake chat model (no network, no API key) against the real gate: a tools node retried
by its ``RetryPolicy``, and a failed graph resumed from its checkpoint, pay once; the run is the
graph's thread."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy

from oncegate import Grant
from oncegate.aio import Gate
from oncegate.integrations.langgraph import guarded_tool

INVOICE = {"invoice": "invoice-41", "amount": 4200, "to": "DE89370400440532013000"}


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class World:
    """The side effects, counted: a bank behind the guard, an unguarded mailer beside it."""

    def __init__(self, mail_failures: list[BaseException]) -> None:
        self.transfers: list[str] = []
        self.mail_attempts = 0
        self.mails_sent = 0
        self.mail_failures = mail_failures


def build_graph(gate: Gate, world: World, *, retry: bool) -> Any:
    @guarded_tool(gate, "payments.transfer", agent_id="billing-agent")
    async def transfer(invoice: str, amount: int, to: str, *, grant: Grant) -> dict[str, Any]:
        """Pay an invoice by bank transfer."""
        world.transfers.append(grant.provider_key)
        return {"transfer_id": f"tr-{len(world.transfers)}"}

    async def notify(invoice: str) -> str:
        """Tell accounting that an invoice is paid (not guarded: it may be sent twice)."""
        world.mail_attempts += 1
        await asyncio.sleep(0.2)  # the transfer beside it finishes first
        if world.mail_failures:
            raise world.mail_failures.pop(0)
        world.mails_sent += 1
        return "sent"

    assert set(transfer.args) == {"invoice", "amount", "to"}
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "transfer", "args": INVOICE, "id": "call-1"},
                        {"name": "notify", "args": {"invoice": "invoice-41"}, "id": "call-2"},
                    ],
                ),
                AIMessage(content="Invoice 41 is paid."),
            ]
        )
    )

    async def agent(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    policy = RetryPolicy(max_attempts=3, initial_interval=0.05, retry_on=ConnectionError) if retry else None
    tools = ToolNode([transfer, StructuredTool.from_function(coroutine=notify)], handle_tool_errors=False)
    builder.add_node("tools", tools, retry_policy=policy)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"wf-{uuid.uuid4().hex[:12]}"}}


def tool_results(state: dict[str, Any]) -> list[str]:
    return [message.content for message in state["messages"] if isinstance(message, ToolMessage)]


def test_a_retried_tools_node_pays_once(gate_target: str) -> None:
    world = World(mail_failures=[ConnectionError("mail server down")])

    async def scenario() -> dict[str, Any]:
        async with Gate(gate_target) as gate:
            graph = build_graph(gate, world, retry=True)
            return await graph.ainvoke({"messages": [("user", "Pay invoice 41")]}, thread())

    final = asyncio.run(scenario())
    # The node ran twice: the unguarded mailer tried twice, the guarded transfer paid once.
    assert world.mail_attempts == 2 and world.mails_sent == 1
    assert len(world.transfers) == 1
    assert tool_results(final) == ['{"transfer_id": "tr-1"}', "sent"]
    assert final["messages"][-1].content == "Invoice 41 is paid."


def test_a_resumed_graph_replays_instead_of_paying_again(gate_target: str) -> None:
    world = World(mail_failures=[RuntimeError("worker killed mid-step")])
    config = thread()

    async def scenario() -> dict[str, Any]:
        async with Gate(gate_target) as gate:
            graph = build_graph(gate, world, retry=False)
            with pytest.raises(RuntimeError, match="worker killed"):
                await graph.ainvoke({"messages": [("user", "Pay invoice 41")]}, config)
            assert len(world.transfers) == 1
            # Resume the thread from its last checkpoint: the tools node runs again.
            resumed = await graph.ainvoke(None, config)
            # Another thread is another workflow run: it pays.
            other = build_graph(gate, world, retry=False)
            await other.ainvoke({"messages": [("user", "Pay invoice 41")]}, thread())
            return resumed

    resumed = asyncio.run(scenario())
    assert world.mail_attempts == 3 and world.mails_sent == 2
    assert len(world.transfers) == 2 and world.transfers[0] != world.transfers[1]
    assert tool_results(resumed) == ['{"transfer_id": "tr-1"}', "sent"]


def test_without_a_thread_the_tool_refuses_to_act(gate_target: str) -> None:
    world = World(mail_failures=[])

    async def scenario() -> None:
        async with Gate(gate_target) as gate:

            @guarded_tool(gate, "payments.transfer", agent_id="billing-agent")
            async def transfer(invoice: str, amount: int, to: str, *, grant: Grant) -> str:
                """Pay."""
                world.transfers.append(grant.provider_key)
                return "paid"

            builder = StateGraph(State)
            builder.add_node("tools", ToolNode([transfer], handle_tool_errors=False))
            builder.add_edge(START, "tools")
            graph = builder.compile()
            call = AIMessage(content="", tool_calls=[{"name": "transfer", "args": INVOICE, "id": "call-1"}])
            with pytest.raises(TypeError, match="no thread"):
                await graph.ainvoke({"messages": [call]})

    asyncio.run(scenario())
    assert world.transfers == []
