"""Pydantic AI: a ``Tool`` whose every logical call runs at most once.

::

    @dataclass
    class Deps:
        run_id: str          # the workflow run, the same when the run is retried or restarted
        bank: Bank

    async def transfer(ctx: RunContext[Deps], amount: int, to: str, *, grant: Grant) -> dict:
        \"\"\"Pay an invoice.\"\"\"
        return await ctx.deps.bank.transfer(amount, to, idempotency_key=grant.provider_key)

    tools = [guarded_tool(gate, "payments.transfer", transfer)]
    agent = Agent(model, name="billing-agent", deps_type=Deps, tools=tools)

The run is the workflow run from the agent run's dependencies (``ctx.deps.run_id``, an attribute or
a mapping key), else from :func:`oncegate.guard.scope` (a context variable the caller sets around
``agent.run``). The agent id is ``ctx.deps.agent_id``, else the agent's name, else the ambient
scope's. Not ``ctx.tool_call_id`` (new for every call the model makes), and not ``ctx.run_id``
unless you pass ``Agent.run(run_id=...)`` yourself (``scope=`` then): by default it is a fresh id
for every ``agent.run``, so a restarted run would run the tool again.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic_ai import RunContext, Tool

from oncegate.aio.attempt import Attempt
from oncegate.aio.client import Gate
from oncegate.errors import OncegateError
from oncegate.guard.binding import Binding
from oncegate.guard.context import current_scope
from oncegate.guard.options import GuardOptions, guard_options, json_decode, json_encode
from oncegate.models import Scope

__all__ = ["deps_scope", "guarded_tool"]


def _field(deps: Any, name: str) -> Any:
    return deps.get(name) if isinstance(deps, dict) else getattr(deps, name, None)


def deps_scope(ctx: RunContext[Any]) -> Scope:
    """The scope of a tool call: the run's dependencies first, then the ambient scope."""
    ambient = current_scope()
    run_id = _field(ctx.deps, "run_id") or (ambient.run_id if ambient else None)
    agent = getattr(ctx, "agent", None)
    agent_id = (
        _field(ctx.deps, "agent_id")
        or getattr(agent, "name", None)
        or (ambient.agent_id if ambient else None)
    )
    if not run_id or not agent_id:
        raise TypeError(
            "oncegate: no workflow run for this tool call: give the agent deps with a run_id (and an "
            "agent_id, or name the agent), call agent.run inside gate.scope(...), or pass scope="
        )
    return Scope(agent_id, run_id)


def guarded_tool(
    gate: Gate,
    action: str,
    function: Callable[..., Awaitable[Any] | Any],
    *,
    scope: Callable[[RunContext[Any]], Scope] = deps_scope,
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
    refusals: Callable[[OncegateError], Any] | None = None,
) -> Tool[Any]:
    """A Pydantic AI ``Tool`` running ``function`` at most once per logical call, guarded by
    ``gate`` as ``action``.

    ``function`` may take the ``RunContext`` first (``ctx``), as Pydantic AI tools do; its other
    arguments are the params the model supplies, and a parameter named ``grant`` receives the
    :class:`~oncegate.models.Grant`, hidden from the model. The guard's options are the keywords of
    :class:`~oncegate.guard.GuardOptions`, or one ``options=GuardOptions(...)``.

    When the gate stops the call, the error propagates from ``agent.run``; with
    ``refusals=model_message`` (:func:`oncegate.integrations.messages.model_message`) the model is
    told instead, as the tool's result: held for approval, denied, over budget, key reused, outcome
    unknown, each with what to do. Any other exception propagates either way.
    """
    binding = Binding(function, action, injected=("ctx",))
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

    @functools.wraps(function)
    async def tool(ctx: RunContext[Any], /, **kwargs: Any) -> Any:
        call = binding.bind((), kwargs, scope(ctx), injected={"ctx": ctx})
        attempt = Attempt(gate, call.request, resolved, key_fields_hint=key_fields_hint)
        if refusals is None:
            return await attempt.run(call.invoke)
        try:
            return await attempt.run(call.invoke)
        except OncegateError as refusal:
            return refusals(refusal)

    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY, annotation=RunContext[Any])
    parameters = [context, *binding.signature.parameters.values()]
    tool.__signature__ = binding.signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    tool.__annotations__ = {"ctx": RunContext[Any], **binding.annotations}
    return Tool(tool, takes_ctx=True, name=function.__name__)
