"""The asyncio decorator: a tool coroutine whose every logical call runs at most once.

The asyncio twin of :func:`oncegate.guard.action`: the call's arguments become the params through
the same :class:`~oncegate.guard.binding.Binding`, and :class:`~oncegate.aio.attempt.Attempt`
follows the protocol. The decorated function may be a coroutine function or a plain one; the
wrapper is a coroutine function either way.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from oncegate.aio.attempt import Attempt
from oncegate.guard.binding import Binding
from oncegate.guard.options import GuardOptions

if TYPE_CHECKING:
    from oncegate.aio.rpc import GateRpc

__all__ = ["action"]

T = TypeVar("T")


def action(
    gate: GateRpc,
    name: str,
    *,
    key_fields_hint: Sequence[str] | None = None,
    options: GuardOptions | None = None,
) -> Callable[[Callable[..., Awaitable[T] | T]], Callable[..., Awaitable[T]]]:
    """Decorates a tool function so that each logical call of it runs at most once, on an event
    loop. See :func:`oncegate.guard.action` for the arguments; the wrapper's signature hides
    ``grant`` as the threaded one does."""
    guard_options = options or GuardOptions()

    def decorate(fn: Callable[..., Awaitable[T] | T]) -> Callable[..., Awaitable[T]]:
        binding = Binding(fn, name)

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            call = binding.bind(args, kwargs)
            attempt = Attempt(gate, call.request, guard_options, key_fields_hint=key_fields_hint)
            return await attempt.run(call.invoke)

        wrapper.__signature__ = binding.signature  # type: ignore[attr-defined]
        wrapper.__annotations__ = binding.annotations
        return wrapper

    return decorate
