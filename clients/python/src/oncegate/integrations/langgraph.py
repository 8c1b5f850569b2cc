"""LangGraph: a LangChain tool for ``ToolNode`` whose every logical call runs at most once.

::

    @guarded_tool(gate, "payments.transfer", agent_id="billing-agent")
    async def transfer(amount: int, to: str, *, grant: Grant) -> dict:
        \"\"\"Pay an invoice.\"\"\"
        return await bank.transfer(amount, to, idempotency_key=grant.provider_key)

    builder.add_node("tools", ToolNode([transfer]))
    graph = builder.compile(checkpointer=checkpointer)
    await graph.ainvoke(inputs, {"configurable": {"thread_id": "wf-42"}})

The run is the graph's thread (``config["configurable"]["thread_id"]``): the checkpointer resumes a
thread, and a node retried by its ``RetryPolicy`` or re-run when a failed graph is resumed
(``graph.ainvoke(None, config)``) runs again under the same thread, so the tool replays instead of
acting twice. Not the ``tool_call_id`` (new for every call the model makes), and not the
checkpoint id (new at every step). ``scope=`` takes a function of the ``RunnableConfig`` for
anything else.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

from oncegate.aio.attempt import Attempt
from oncegate.aio.client import Gate
from oncegate.guard.binding import Binding
from oncegate.guard.options import GuardOptions, guard_options, json_decode, json_encode
from oncegate.models import Scope

__all__ = ["guarded_tool", "thread_scope"]


def thread_scope(agent_id: str) -> Callable[[RunnableConfig], Scope]:
    """The scope of a tool call: ``agent_id``, and the graph's thread as the run."""

    def scope(config: RunnableConfig) -> Scope:
        thread_id = (config.get("configurable") or {}).get("thread_id")
        if not thread_id:
            raise TypeError(
                "oncegate: no thread for this tool call: invoke the graph with "
                '{"configurable": {"thread_id": ...}} (a checkpointer needs it too), or pass scope='
            )
        return Scope(agent_id, str(thread_id))

    return scope


def guarded_tool(
    gate: Gate,
    action: str,
    *,
    agent_id: str | None = None,
    scope: Callable[[RunnableConfig], Scope] | None = None,
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
) -> Callable[[Callable[..., Awaitable[Any] | Any]], BaseTool]:
    """Turns a function into a LangChain tool (for ``ToolNode`` or ``create_react_agent``) guarded
    by ``gate`` as ``action``, in the scope ``agent_id`` + the graph's thread (or ``scope=``).

    The function's arguments are the params (the tool's schema, from its signature and
    docstring); a parameter named ``grant`` receives the :class:`~oncegate.models.Grant` and one
    named ``config`` the ``RunnableConfig``, both hidden from the model. The guard's options are
    the keywords of :class:`~oncegate.guard.GuardOptions`, or one ``options=GuardOptions(...)``.
    The tool is asynchronous: run the graph with ``ainvoke``/``astream``.
    """
    if scope is None:
        if agent_id is None:
            raise TypeError("guarded_tool: pass agent_id= (or scope=)")
        scope = thread_scope(agent_id)
    read_scope = scope
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

    def decorate(fn: Callable[..., Awaitable[Any] | Any]) -> BaseTool:
        binding = Binding(fn, action, injected=("config",))

        @functools.wraps(fn)
        async def tool(*, config: RunnableConfig, **kwargs: Any) -> Any:
            call = binding.bind((), kwargs, read_scope(config), injected={"config": config})
            attempt = Attempt(gate, call.request, resolved, key_fields_hint=key_fields_hint)
            return await attempt.run(call.invoke)

        config = inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=RunnableConfig)
        shown = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in binding.signature.parameters.values()
        ]
        tool.__signature__ = binding.signature.replace(parameters=[*shown, config])  # type: ignore[attr-defined]
        tool.__annotations__ = {**binding.annotations, "config": RunnableConfig}
        return StructuredTool.from_function(coroutine=tool, name=fn.__name__, description=inspect.getdoc(fn))

    return decorate
