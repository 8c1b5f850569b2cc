"""The asyncio oncegate client: the awaited RPCs of :mod:`oncegate.aio.rpc` plus the guard's
entry points, with the names and arguments of the threaded :class:`oncegate.Gate`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from oncegate.aio.attempt import Attempt
from oncegate.aio.decorator import action as guarded_action
from oncegate.aio.rpc import GateRpc
from oncegate.guard.context import scope as ambient_scope
from oncegate.guard.options import GuardOptions, Request
from oncegate.models import Grant, Scope

__all__ = ["Gate"]

T = TypeVar("T")


class Gate(GateRpc):
    """An asyncio client of one oncegate server; see :class:`oncegate.Gate` for the arguments.

    Every method is a coroutine (or returns an ``async with`` block) and raises what the threaded
    client raises. Create it anywhere; it opens its channel inside the first event loop that uses
    it, and belongs to that loop.
    """

    def attempt(
        self,
        action: str,
        params: Mapping[str, Any],
        *,
        agent_id: str,
        run_id: str,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        key_fields_hint: Sequence[str] | None = None,
        **options: Any,
    ) -> Attempt:
        """A guarded attempt of one action, as an ``async with`` block (see
        :class:`~oncegate.aio.attempt.Attempt`, and :class:`~oncegate.guard.GuardOptions` for
        ``options``)."""
        return Attempt(
            self,
            Request(action, dict(params), Scope(agent_id, run_id), intent_id, idempotency_key),
            GuardOptions(**options),
            key_fields_hint=key_fields_hint,
        )

    async def run(
        self,
        action: str,
        params: Mapping[str, Any],
        fn: Callable[[Grant], Awaitable[T] | T],
        *,
        agent_id: str,
        run_id: str,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        key_fields_hint: Sequence[str] | None = None,
        **options: Any,
    ) -> T:
        """Runs ``fn(grant)`` at most once for this action and returns its result, or on a replay
        the decoded stored receipt without running ``fn``."""
        attempt = self.attempt(
            action,
            params,
            agent_id=agent_id,
            run_id=run_id,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            key_fields_hint=key_fields_hint,
            **options,
        )
        return await attempt.run(fn)

    def action(
        self, name: str, *, key_fields_hint: Sequence[str] | None = None, **options: Any
    ) -> Callable[[Callable[..., Awaitable[T] | T]], Callable[..., Awaitable[T]]]:
        """Decorates a tool function so that each logical call runs at most once (see
        :meth:`oncegate.Gate.action`); the decorated function is a coroutine function."""
        return guarded_action(self, name, key_fields_hint=key_fields_hint, options=GuardOptions(**options))

    @staticmethod
    def scope(agent_id: str, run_id: str) -> AbstractContextManager[Scope]:
        """Sets the scope that decorated actions use when a call does not name one (a context
        variable: it follows the task and the tasks it creates)."""
        return ambient_scope(agent_id, run_id)
