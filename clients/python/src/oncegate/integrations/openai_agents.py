"""The OpenAI Agents SDK: a ``function_tool`` whose every logical call runs at most once.

::

    @guarded_function_tool(gate, "payments.transfer")
    async def transfer(amount: int, to: str, *, grant: Grant) -> dict:
        \"\"\"Pay an invoice.\"\"\"
        return await bank.transfer(amount, to, idempotency_key=grant.provider_key)

    agent = Agent(name="billing-agent", tools=[transfer])
    await Runner.run(agent, "Pay invoice 42", context=Workflow(run_id="wf-42"))

The run is the workflow run the application passes as the SDK's run context
(``Runner.run(..., context=...)``): its ``run_id`` (an attribute, or a key of a mapping). The
agent id is the context's ``agent_id`` when it has one, else the SDK agent's name. Never the
``tool_call_id``: the model gets a new one for every call, retried or not, and the run context is
the one thing that stays the same when a run is retried or restarted. ``scope=`` takes a function
of the tool context for anything else.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.tool_context import ToolContext

from oncegate.aio.attempt import Attempt
from oncegate.aio.client import Gate
from oncegate.errors import OncegateError
from oncegate.guard.binding import Binding
from oncegate.guard.options import GuardOptions, guard_options, json_decode, json_encode
from oncegate.integrations.messages import model_message
from oncegate.models import Scope

__all__ = ["context_scope", "guarded_function_tool"]


def _field(context: Any, name: str) -> Any:
    return context.get(name) if isinstance(context, dict) else getattr(context, name, None)


def context_scope(ctx: RunContextWrapper[Any]) -> Scope:
    """The scope of a tool call: ``run_id`` from the run context, ``agent_id`` from the run context
    or else the agent's name."""
    run_id = _field(ctx.context, "run_id")
    agent = getattr(ctx, "agent", None)
    agent_id = _field(ctx.context, "agent_id") or getattr(agent, "name", None)
    if not run_id or not agent_id:
        raise TypeError(
            "oncegate: no workflow run for this tool call: pass Runner.run(..., context=...) a "
            "context with a run_id (and an agent_id, or name the agent), or give scope="
        )
    return Scope(agent_id, run_id)


def _report(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """Tells the model why the gate stopped the call; anything else (a tool without a workflow
    run, params the gate refuses) is the developer's to see, so it propagates."""
    if isinstance(error, OncegateError):
        return model_message(error)
    raise error


def guarded_function_tool(
    gate: Gate,
    action: str,
    *,
    scope: Callable[[RunContextWrapper[Any]], Scope] = context_scope,
    key_fields_hint: Sequence[str] | None = None,
    options: GuardOptions | None = None,
    definite: tuple[type[BaseException], ...] = (),
    encode: Callable[[Any], bytes] = json_encode,
    decode: Callable[[bytes], Any] = json_decode,
    lease_ttl: float | None = None,
    max_wait: float | None = None,
    poll_interval: float = 1.0,
    retry_timeout: float = 30.0,
    heartbeat: bool = True,
    holder: str | None = None,
    wait_timeout: float | None = None,
) -> Callable[[Callable[..., Awaitable[Any] | Any]], FunctionTool]:
    """Turns a function into an Agents SDK ``FunctionTool`` guarded by ``gate`` as ``action``.

    The function's arguments (what the model supplies, validated by the SDK from the signature)
    are the params; a parameter named ``grant`` receives the :class:`~oncegate.models.Grant` and
    one named ``ctx`` the SDK's tool context, both hidden from the model. A declared
    ``idempotency_key`` or ``intent_id`` is filled by the model and names the action instead of
    being a param. The guard's options are the keywords of :class:`~oncegate.guard.GuardOptions`,
    or one ``options=GuardOptions(...)``. A replay returns the first call's result without running
    the function. When the guard stops a call, the model is told why
    (:func:`~oncegate.integrations.messages.model_message`: no token, key or values); a missing
    workflow run raises.
    """
    resolved = guard_options(
        options,
        definite=definite,
        encode=encode,
        decode=decode,
        lease_ttl=lease_ttl,
        max_wait=max_wait,
        poll_interval=poll_interval,
        retry_timeout=retry_timeout,
        heartbeat=heartbeat,
        holder=holder,
        wait_timeout=wait_timeout,
    )

    def decorate(fn: Callable[..., Awaitable[Any] | Any]) -> FunctionTool:
        binding = Binding(fn, action, injected=("ctx",))

        @functools.wraps(fn)
        async def tool(ctx: ToolContext[Any], /, *args: Any, **kwargs: Any) -> Any:
            call = binding.bind(args, kwargs, scope(ctx), injected={"ctx": ctx})
            attempt = Attempt(gate, call.request, resolved, key_fields_hint=key_fields_hint)
            return await attempt.run(call.invoke)

        context = inspect.Parameter(
            "ctx", inspect.Parameter.POSITIONAL_ONLY, annotation=RunContextWrapper[Any]
        )
        tool.__signature__ = binding.signature.replace(  # type: ignore[attr-defined]
            parameters=[context, *binding.signature.parameters.values()]
        )
        tool.__annotations__ = {"ctx": RunContextWrapper[Any], **binding.annotations}
        return function_tool(tool, name_override=fn.__name__, failure_error_function=_report)

    return decorate
