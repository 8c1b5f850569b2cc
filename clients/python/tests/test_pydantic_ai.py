"""The Pydantic AI adapter, driven through a real ``Agent`` by its own ``FunctionModel`` and
``TestModel`` (no network, no API key) against the real gate: a retried tool call, and a run played
again, pay once; the run comes from the run's dependencies or the ambient scope."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from oncegate import Grant
from oncegate.aio import Gate
from oncegate.integrations.pydantic_ai import guarded_tool

INVOICE = {"invoice": "invoice-41", "amount": 4200, "to": "DE89370400440532013000"}


@dataclass
class Deps:
    """The run's dependencies: the workflow run, and the bank."""

    run_id: str | None = field(default_factory=lambda: f"wf-{uuid.uuid4().hex[:12]}")
    transfers: list[tuple[str | None, str]] = field(default_factory=list)


async def transfer(
    ctx: RunContext[Deps], invoice: str, amount: int, to: str, *, grant: Grant
) -> dict[str, Any]:
    """Pay an invoice by bank transfer."""
    ctx.deps.transfers.append((ctx.tool_call_id, grant.provider_key))
    return {"transfer_id": f"tr-{len(ctx.deps.transfers)}", "amount": amount}


def retrying_model(calls: int) -> FunctionModel:
    """A model that calls the tool ``calls`` times (a new tool call id each time), then answers."""
    made = 0

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal made
        made += 1
        if made <= calls:
            return ModelResponse(parts=[ToolCallPart("transfer", INVOICE, tool_call_id=f"call-{made}")])
        return ModelResponse(parts=[TextPart("Invoice 41 is paid.")])

    return FunctionModel(respond)


def returns(result: Any) -> list[Any]:
    return [
        part.content for m in result.all_messages() for part in m.parts if isinstance(part, ToolReturnPart)
    ]


def test_a_retried_call_and_a_replayed_run_pay_once(gate_target: str) -> None:
    deps = Deps()

    async def scenario() -> tuple[Any, Any]:
        async with Gate(gate_target) as gate:
            tool = guarded_tool(gate, "payments.transfer", transfer)
            agent = Agent(retrying_model(2), name="billing-agent", deps_type=Deps, tools=[tool])
            assert set(
                agent._function_toolset.tools["transfer"].tool_def.parameters_json_schema["properties"]
            ) == {
                "invoice",
                "amount",
                "to",
            }
            first = await agent.run("Pay invoice 41", deps=deps)
            again = Agent(retrying_model(1), name="billing-agent", deps_type=Deps, tools=[tool])
            second = await again.run("Pay invoice 41", deps=deps)
            return first, second

    first, second = asyncio.run(scenario())
    assert deps.transfers[0][0] == "call-1" and len(deps.transfers) == 1
    expected = {"transfer_id": "tr-1", "amount": 4200}
    assert returns(first) == [expected, expected] and returns(second) == [expected]
    assert first.output == "Invoice 41 is paid."


def test_the_ambient_scope_names_the_run_with_test_model(gate_target: str) -> None:
    deps_a, deps_b = Deps(run_id=None), Deps(run_id=None)

    async def scenario() -> None:
        async with Gate(gate_target) as gate:
            tool = guarded_tool(gate, "payments.transfer", transfer)
            agent = Agent(TestModel(), name="billing-agent", deps_type=Deps, tools=[tool])
            run_id = f"wf-{uuid.uuid4().hex[:12]}"
            with gate.scope(agent_id="billing-agent", run_id=run_id):
                await agent.run("Pay invoice 41", deps=deps_a)
                await agent.run("Pay invoice 41", deps=deps_a)
            with gate.scope(agent_id="billing-agent", run_id=f"{run_id}-next"):
                await agent.run("Pay invoice 41", deps=deps_b)

    asyncio.run(scenario())
    assert len(deps_a.transfers) == 1 and len(deps_b.transfers) == 1
    assert deps_a.transfers[0][1] != deps_b.transfers[0][1]


def test_without_a_run_the_tool_refuses_to_act(gate_target: str) -> None:
    deps = Deps(run_id=None)

    async def scenario() -> None:
        async with Gate(gate_target) as gate:
            agent = Agent(
                retrying_model(1),
                name="billing-agent",
                deps_type=Deps,
                tools=[guarded_tool(gate, "payments.transfer", transfer)],
            )
            with pytest.raises(TypeError, match="no workflow run"):
                await agent.run("Pay invoice 41", deps=deps)

    asyncio.run(scenario())
    assert deps.transfers == []
