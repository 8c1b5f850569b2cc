"""A guarded activity under Temporal's server-less test tooling, through its worker interceptors.

``temporalio.testing.ActivityEnvironment`` runs an activity in an activity context (its ``info``,
``heartbeat``, payload converter) but calls no interceptor; :func:`run_activity` builds the chain
the way a worker does (``intercept_activity``, ``init`` with the outbound chain, then
``execute_activity``) inside that context, so a test can drive attempt 1, 2, 3 of one activity by
changing ``env.info``::

    env = ActivityEnvironment()
    env.info = replace(env.info, activity_id="pay-41", attempt=2)
    receipt = await run_activity(env, [OncegateInterceptor(gate)], transfer, invoice)

It owns only that harness (and reads the activity context through ``temporalio.activity``'s
private ``_Context``, as the test environment itself does); the guard is the interceptor's.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import temporalio.activity
from temporalio.testing import ActivityEnvironment
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

__all__ = ["run_activity"]


class _Worker(ActivityInboundInterceptor):
    """The innermost inbound interceptor, as the worker's own: calls the activity function (a
    plain one on a thread, its heartbeats handed to the event loop as the worker hands them)."""

    def __init__(self) -> None:  # the end of the chain: there is no next
        pass

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        temporalio.activity._Context.current().heartbeat = outbound.heartbeat

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if inspect.iscoroutinefunction(input.fn):
            return await input.fn(*input.args)
        context = temporalio.activity._Context.current()
        loop = asyncio.get_running_loop()
        on_loop = context.heartbeat
        assert on_loop is not None
        context.heartbeat = lambda *details: loop.call_soon_threadsafe(on_loop, *details)
        try:
            return await asyncio.to_thread(input.fn, *input.args)
        finally:
            context.heartbeat = on_loop


class _Environment(ActivityOutboundInterceptor):
    """The outermost outbound interceptor: the environment's ``info`` and ``on_heartbeat``."""

    def __init__(self, info: Callable[[], temporalio.activity.Info], heartbeat: Callable[..., None]) -> None:
        self._info = info
        self._heartbeat = heartbeat

    def info(self) -> temporalio.activity.Info:
        return self._info()

    def heartbeat(self, *details: Any) -> None:
        self._heartbeat(*details)


async def run_activity(
    env: ActivityEnvironment, interceptors: Sequence[Interceptor], fn: Callable[..., Any], *args: Any
) -> Any:
    """Runs the activity ``fn(*args)`` in ``env`` through ``interceptors`` (the first outermost,
    as in ``Worker(interceptors=...)``); returns its result or raises what the chain raised."""

    async def chain() -> Any:
        context = temporalio.activity._Context.current()
        assert context.heartbeat is not None
        outbound = _Environment(context.info, context.heartbeat)
        inbound: ActivityInboundInterceptor = _Worker()
        for interceptor in reversed(list(interceptors)):
            inbound = interceptor.intercept_activity(inbound)
        inbound.init(outbound)
        return await inbound.execute_activity(
            ExecuteActivityInput(fn=fn, args=list(args), executor=None, headers={})
        )

    return await env.run(chain)
