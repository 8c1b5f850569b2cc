"""The OpenAI Agents SDK adapter, driven through the real SDK by its own ``ScriptedModel`` (no
network, no API key) against the real gate: a retried tool call, and a run played again after a
restart, pay once; the run is the one in the SDK's run context, never the tool call id."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, ToolCallItem, ToolCallOutputItem
from agents.exceptions import UserError
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from oncegate import ActionState, Grant, KeyReusedError, fingerprint
from oncegate.aio import Gate
from oncegate.integrations.openai_agents import guarded_function_tool
from oncegate.models import ActionRef, Scope

from conftest import TRANSFER_KEY_FIELDS

INVOICE = {"invoice": "invoice-41", "amount": 4200, "to": "DE89370400440532013000"}
NO_TRACING = RunConfig(tracing_disabled=True)


@dataclass
class Workflow:
    """The application's run context: the workflow run survives retries and restarts."""

    run_id: str = field(default_factory=lambda: f"wf-{uuid.uuid4().hex[:12]}")


@dataclass
class Bank:
    transfers: list[dict[str, Any]] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)


def billing_agent(gate: Gate, bank: Bank, steps: list[Any]) -> Agent[Workflow]:
    @guarded_function_tool(gate, "payments.transfer")
    async def transfer(
        ctx: ToolContext[Workflow], invoice: str, amount: int, to: str, *, grant: Grant
    ) -> dict[str, Any]:
        """Pay an invoice by bank transfer."""
        bank.call_ids.append(ctx.tool_call_id)
        bank.transfers.append({"invoice": invoice, "amount": amount, "key": grant.provider_key})
        return {"transfer_id": f"tr-{len(bank.transfers)}", "amount": amount}

    assert set(transfer.params_json_schema["properties"]) == {"invoice", "amount", "to"}
    return Agent(name="billing-agent", model=ScriptedModel(steps), tools=[transfer])


def tool_outputs(result: Any) -> tuple[list[str], list[Any]]:
    call_ids = [item.raw_item.call_id for item in result.new_items if isinstance(item, ToolCallItem)]
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    return call_ids, outputs


def test_a_retried_call_and_a_replayed_run_pay_once(gate_target: str) -> None:
    bank, workflow = Bank(), Workflow()

    async def scenario() -> tuple[Any, Any]:
        async with Gate(gate_target) as gate:
            retried = billing_agent(
                gate,
                bank,
                [
                    [function_call("transfer", INVOICE, call_id="call-1")],
                    # The model calls the tool again: a new call id, the same arguments.
                    [function_call("transfer", INVOICE, call_id="call-2")],
                    [assistant_message("Invoice 41 is paid.")],
                ],
            )
            first = await Runner.run(retried, "Pay invoice 41", context=workflow, run_config=NO_TRACING)
            # The worker restarts and the workflow run is played again from the start.
            replayed = billing_agent(
                gate,
                bank,
                [[function_call("transfer", INVOICE, call_id="call-9")], [assistant_message("Paid.")]],
            )
            second = await Runner.run(replayed, "Pay invoice 41", context=workflow, run_config=NO_TRACING)
            key = fingerprint("payments.transfer", INVOICE, key_fields=TRANSFER_KEY_FIELDS)
            ref = ActionRef(Scope("billing-agent", workflow.run_id), key)
            assert (await gate.get_action(ref)).state is ActionState.COMPLETED
            return first, second

    first, second = asyncio.run(scenario())
    first_calls, first_outputs = tool_outputs(first)
    second_calls, second_outputs = tool_outputs(second)
    assert first_calls + second_calls == ["call-1", "call-2", "call-9"]
    assert len(bank.transfers) == 1 and bank.call_ids == ["call-1"]
    expected = {"transfer_id": "tr-1", "amount": 4200}
    assert [*first_outputs, *second_outputs] == [expected, expected, expected]
    assert first.final_output == "Invoice 41 is paid."


def test_another_workflow_run_is_another_action(gate_target: str) -> None:
    bank = Bank()

    async def scenario() -> None:
        async with Gate(gate_target) as gate:
            for workflow in (Workflow(), Workflow()):
                agent = billing_agent(
                    gate,
                    bank,
                    [[function_call("transfer", INVOICE, call_id="call-1")], [assistant_message("ok")]],
                )
                await Runner.run(agent, "Pay invoice 41", context=workflow, run_config=NO_TRACING)

    asyncio.run(scenario())
    assert len(bank.transfers) == 2
    assert bank.transfers[0]["key"] != bank.transfers[1]["key"]


def test_without_a_workflow_run_the_tool_raises(gate_target: str) -> None:
    bank = Bank()

    async def scenario() -> None:
        async with Gate(gate_target) as gate:
            agent = billing_agent(
                gate, bank, [[function_call("transfer", INVOICE, call_id="call-1")], [assistant_message("?")]]
            )
            with pytest.raises(UserError, match="no workflow run") as raised:
                await Runner.run(agent, "Pay invoice 41", context=None, run_config=NO_TRACING)
            assert isinstance(raised.value.__cause__, TypeError)

    asyncio.run(scenario())
    assert bank.transfers == []


def test_the_model_is_told_why_without_token_or_values(gate_target: str) -> None:
    bank, workflow = Bank(), Workflow()
    changed = {**INVOICE, "amount": 9900}

    async def scenario() -> Any:
        async with Gate(gate_target) as gate:

            @guarded_function_tool(gate, "payments.transfer")
            async def transfer(
                invoice: str, amount: int, to: str, idempotency_key: str, *, grant: Grant
            ) -> str:
                """Pay an invoice by bank transfer, once per invoice (the key)."""
                bank.transfers.append({"amount": amount, "key": grant.provider_key})
                return f"tr-{len(bank.transfers)}"

            steps = [
                [function_call("transfer", {**INVOICE, "idempotency_key": "invoice-41"}, call_id="call-1")],
                [function_call("transfer", {**changed, "idempotency_key": "invoice-41"}, call_id="call-2")],
                [assistant_message("Stopped: asking a person.")],
            ]
            agent = Agent(name="billing-agent", model=ScriptedModel(steps), tools=[transfer])
            return await Runner.run(agent, "Pay invoice 41", context=workflow, run_config=NO_TRACING)

    _, outputs = tool_outputs(asyncio.run(scenario()))
    assert outputs[0] == "tr-1" and len(bank.transfers) == 1
    assert "/amount" in outputs[1] and "Do not retry under a new idempotency key" in outputs[1]
    assert "9900" not in outputs[1] and bank.transfers[0]["key"] not in outputs[1]
    assert KeyReusedError.REASON == "IDEMPOTENCY_KEY_REUSED"
