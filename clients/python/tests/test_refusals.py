"""Each adapter's documented error handling against a refusal of each kind, through the real
framework and the real gate (see ``conftest.real_gate``: a hold on ``files.delete``, a rule that
forbids the agent ``mallory``, a budget of one ``sms.send`` an hour, key fields on
``payments.transfer``): held for approval, denied by a rule, declined by a person, over budget, key
reused, outcome unknown. LangGraph's ``ToolNode(handle_tool_errors=model_message)`` and the Agents
SDK adapter tell the model what happened and what to do; Pydantic AI raises from ``agent.run``, or
with ``refusals=model_message`` tells the model too. The tool never runs on a refusal."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import pytest
from agents import Agent as AgentsAgent
from agents import RunConfig, Runner, ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from oncegate import (
    BudgetExceededError,
    Gate,
    KeyReusedError,
    OutcomeUnknownError,
    PendingApprovalError,
    PolicyDeniedError,
)
from oncegate.aio import Gate as AsyncGate
from oncegate.integrations import langgraph as lg
from oncegate.integrations import openai_agents as oa
from oncegate.integrations import pydantic_ai as pa
from oncegate.integrations.messages import model_message

from conftest import RealGate


@dataclass
class Case:
    """One refusal: the action and agent that meet it, the calls that set it up (made through the
    adapter first), the arguments of the refused call, what the model must read, and the
    exception Pydantic AI raises."""

    name: str
    action: str
    agent: str
    args: dict[str, Any]
    says: list[str]
    raises: type[Exception]
    before: list[dict[str, Any]] = field(default_factory=list)
    fails: bool = False
    prepare: Callable[[RealGate, str, str], list[str]] | None = None


def decline(real_gate: RealGate, agent: str, run: str) -> list[str]:
    """Holds ``files.delete`` for ``agent``/``run``, then a person declines it; returns the
    approval id the model must be told."""
    with Gate(real_gate.target) as gate:
        held = gate.request_token("files.delete", {"path": "/tmp/report"}, agent_id=agent, run_id=run)
    assert held.approval is not None
    approval = held.approval.id
    real_gate.admin(
        "deny", "--agent", agent, "--run", run, "--key", held.action.key, "--id", approval, "--note", "no"
    )
    return [approval]


def hold(real_gate: RealGate, agent: str, run: str) -> list[str]:
    """The approval id a held ``files.delete`` gets (the same for every identical request)."""
    with Gate(real_gate.target) as gate:
        held = gate.request_token("files.delete", {"path": "/tmp/report"}, agent_id=agent, run_id=run)
    assert held.approval is not None
    return [held.approval.id]


CASES = [
    Case(
        "held for approval",
        "files.delete",
        "billing-agent",
        {"path": "/tmp/report"},
        ["Not executed yet", "held for a person's approval", "(deletes need approval)", "Wait for the decision"],
        PendingApprovalError,
        prepare=hold,
    ),
    Case(
        "denied by a rule",
        "payments.transfer",
        "mallory",
        {"amount": 10, "currency": "EUR", "to": "DE1"},
        ["Not executed", 'the rule "no-mallory"', "ask a person"],
        PolicyDeniedError,
    ),
    Case(
        "declined by a person",
        "files.delete",
        "billing-agent",
        {"path": "/tmp/report"},
        ["A person declined the approval", "Do not retry the same call"],
        PolicyDeniedError,
        prepare=decline,
    ),
    Case(
        "over budget",
        "sms.send",
        "sms-agent",
        {"to": "+4930222"},
        ['the budget "sms-per-hour" would be exceeded (1 of 1 used', "It frees up at ", "do not call again before then"],
        BudgetExceededError,
        before=[{"to": "+4930111"}],
    ),
    Case(
        "key reused",
        "payments.transfer",
        "billing-agent",
        {"amount": 20, "currency": "EUR", "to": "DE1", "idempotency_key": "invoice-9"},
        ["already used for a call with different arguments", "differing fields: /amount"],
        KeyReusedError,
        before=[{"amount": 10, "currency": "EUR", "to": "DE1", "idempotency_key": "invoice-9"}],
    ),
    Case(
        "outcome unknown",
        "payments.transfer",
        "billing-agent",
        {"amount": 30, "currency": "EUR", "to": "DE2"},
        ["The outcome of this call is unknown", "Do not retry it"],
        OutcomeUnknownError,
        fails=True,
    ),
]


class World:
    """What ran: every call the tool body made (a refusal makes none)."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.ran: list[dict[str, Any]] = []

    def act(self, **params: Any) -> dict[str, Any]:
        self.ran.append(params)
        if self.case.fails and len(self.ran) > len(self.case.before):
            raise TimeoutError("the provider did not answer")
        return {"done": len(self.ran)}


def expect(case: Case, text: str, extra: list[str]) -> None:
    for fragment in [*case.says, *extra]:
        assert fragment in text, f"{case.name}: {fragment!r} not in {text!r}"
    assert "Traceback" not in text and "token" not in text.lower()


def run_id() -> str:
    return f"wf-{uuid.uuid4().hex[:12]}"


def agent_for(case: Case) -> str:
    # A fresh agent per budget test, so the hour's one send is this test's.
    return f"{case.agent}-{uuid.uuid4().hex[:6]}" if case.action == "sms.send" else case.agent


# --- LangGraph: ToolNode(handle_tool_errors=model_message), as the guide writes it -------------


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def langgraph_tool(gate: AsyncGate, case: Case, world: World, agent: str) -> Any:
    if case.action == "payments.transfer":

        async def transfer(amount: int, currency: str, to: str, idempotency_key: str = "") -> dict[str, Any]:
            """Pay."""
            return world.act(amount=amount, currency=currency, to=to)

        return lg.guarded_tool(gate, case.action, agent_id=agent)(transfer)
    if case.action == "sms.send":

        async def send(to: str) -> dict[str, Any]:
            """Send a text."""
            return world.act(to=to)

        return lg.guarded_tool(gate, case.action, agent_id=agent)(send)

    async def delete(path: str) -> dict[str, Any]:
        """Delete a file."""
        return world.act(path=path)

    return lg.guarded_tool(gate, case.action, agent_id=agent)(delete)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_langgraph_tells_the_model(real_gate: RealGate, case: Case) -> None:
    world, run, agent = World(case), run_id(), agent_for(case)
    extra = case.prepare(real_gate, agent, run) if case.prepare else []

    async def scenario() -> list[str]:
        async with AsyncGate(real_gate.target) as gate:
            tool = langgraph_tool(gate, case, world, agent)
            calls = [*case.before, case.args]
            model = GenericFakeChatModel(
                messages=iter(
                    [
                        *(
                            AIMessage(content="", tool_calls=[{"name": tool.name, "args": args, "id": f"call-{i}"}])
                            for i, args in enumerate(calls)
                        ),
                        AIMessage(content="Done."),
                    ]
                )
            )

            async def agent_node(state: State) -> dict[str, Any]:
                return {"messages": [await model.ainvoke(state["messages"])]}

            builder = StateGraph(State)
            builder.add_node("agent", agent_node)
            builder.add_node("tools", ToolNode([tool], handle_tool_errors=model_message))
            builder.add_edge(START, "agent")
            builder.add_conditional_edges("agent", tools_condition)
            builder.add_edge("tools", "agent")
            graph = builder.compile()
            state = await graph.ainvoke(
                {"messages": [("user", "go")]}, {"configurable": {"thread_id": run}}
            )
            return [m.content for m in state["messages"] if isinstance(m, ToolMessage)]

    answers = asyncio.run(scenario())
    assert len(answers) == len(case.before) + 1
    expect(case, answers[-1], extra)
    assert len(world.ran) == len(case.before) + (1 if case.fails else 0)


def test_langgraph_lets_other_failures_reach_the_retry_policy() -> None:
    """The annotation LangGraph reads: only the gate's refusals become words."""
    from langgraph.prebuilt.tool_node import _infer_handled_types

    from oncegate import OncegateError

    assert _infer_handled_types(model_message) == (OncegateError,)


# --- The OpenAI Agents SDK: the adapter's failure_error_function --------------------------------


@dataclass
class Workflow:
    run_id: str


def agents_tool(gate: AsyncGate, case: Case, world: World) -> Any:
    if case.action == "payments.transfer":

        @oa.guarded_function_tool(gate, case.action)
        async def transfer(
            ctx: ToolContext[Workflow], amount: int, currency: str, to: str, idempotency_key: str = ""
        ) -> dict[str, Any]:
            """Pay."""
            return world.act(amount=amount, currency=currency, to=to)

        return transfer
    if case.action == "sms.send":

        @oa.guarded_function_tool(gate, case.action)
        async def send(ctx: ToolContext[Workflow], to: str) -> dict[str, Any]:
            """Send a text."""
            return world.act(to=to)

        return send

    @oa.guarded_function_tool(gate, case.action)
    async def delete(ctx: ToolContext[Workflow], path: str) -> dict[str, Any]:
        """Delete a file."""
        return world.act(path=path)

    return delete


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_agents_sdk_tells_the_model(real_gate: RealGate, case: Case) -> None:
    world, run, agent = World(case), run_id(), agent_for(case)
    extra = case.prepare(real_gate, agent, run) if case.prepare else []

    async def scenario() -> list[Any]:
        async with AsyncGate(real_gate.target) as gate:
            tool = agents_tool(gate, case, world)
            calls = [*case.before, case.args]
            steps: list[Any] = [[function_call(tool.name, args, call_id=f"call-{i}")] for i, args in enumerate(calls)]
            model = ScriptedModel([*steps, [assistant_message("Done.")]])
            sdk_agent = AgentsAgent(name=agent, model=model, tools=[tool])
            result = await Runner.run(
                sdk_agent, "go", context=Workflow(run), run_config=RunConfig(tracing_disabled=True)
            )
            return [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]

    outputs = asyncio.run(scenario())
    assert len(outputs) == len(case.before) + 1
    expect(case, str(outputs[-1]), extra)
    assert len(world.ran) == len(case.before) + (1 if case.fails else 0)


# --- Pydantic AI: raised from agent.run, or told with refusals=model_message --------------------


@dataclass
class Deps:
    run_id: str
    agent_id: str


def pydantic_tool(gate: AsyncGate, case: Case, world: World, refusals: Any) -> Any:
    if case.action == "payments.transfer":

        async def transfer(
            ctx: RunContext[Deps], amount: int, currency: str, to: str, idempotency_key: str = ""
        ) -> dict[str, Any]:
            """Pay."""
            return world.act(amount=amount, currency=currency, to=to)

        return pa.guarded_tool(gate, case.action, transfer, refusals=refusals)
    if case.action == "sms.send":

        async def send(ctx: RunContext[Deps], to: str) -> dict[str, Any]:
            """Send a text."""
            return world.act(to=to)

        return pa.guarded_tool(gate, case.action, send, refusals=refusals)

    async def delete(ctx: RunContext[Deps], path: str) -> dict[str, Any]:
        """Delete a file."""
        return world.act(path=path)

    return pa.guarded_tool(gate, case.action, delete, refusals=refusals)


def scripted(name: str, calls: list[dict[str, Any]]) -> FunctionModel:
    made = 0

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal made
        made += 1
        if made <= len(calls):
            return ModelResponse(parts=[ToolCallPart(name, calls[made - 1], tool_call_id=f"call-{made}")])
        return ModelResponse(parts=[TextPart("Done.")])

    return FunctionModel(respond)


@pytest.mark.parametrize("told", [False, True], ids=["raised", "told"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_pydantic_ai_raises_or_tells_the_model(real_gate: RealGate, case: Case, told: bool) -> None:
    world, run, agent = World(case), run_id(), agent_for(case)
    extra = case.prepare(real_gate, agent, run) if case.prepare else []

    async def scenario() -> list[Any]:
        async with AsyncGate(real_gate.target) as gate:
            tool = pydantic_tool(gate, case, world, model_message if told else None)
            model = scripted(tool.name, [*case.before, case.args])
            pyd_agent = PydanticAgent(model, name=agent, deps_type=Deps, tools=[tool])
            result = await pyd_agent.run("go", deps=Deps(run, agent))
            return [
                part.content
                for m in result.all_messages()
                for part in m.parts
                if isinstance(part, ToolReturnPart)
            ]

    if told:
        returns = asyncio.run(scenario())
        assert len(returns) == len(case.before) + 1
        expect(case, str(returns[-1]), extra)
    else:
        with pytest.raises(case.raises):
            asyncio.run(scenario())
    assert len(world.ran) == len(case.before) + (1 if case.fails else 0)
