"""How the asyncio guard runs a call of a decorated function or of :meth:`Gate.run`: an
:class:`~oncegate.aio.attempt.Attempt` around it.

The threaded twin, :mod:`oncegate.guard.runner`, runs the common case (a grant, the function, a
Complete) as one call into the native core and hands anything else to its ``Attempt``; an event
loop's calls go through the ``Attempt`` alone. Both are written by hand (the decorator and the
client, generated from the asyncio ones, import whichever is their own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from oncegate.aio.attempt import Attempt
from oncegate.guard.binding import Binding
from oncegate.guard.options import GuardOptions, Request

if TYPE_CHECKING:
    from oncegate.aio.rpc import GateRpc
    from oncegate.models import Grant

__all__ = ["Runner"]


class Runner:
    """Runs the calls of one action (a decorated function's, or :meth:`Gate.run`'s) through
    ``gate`` with ``options``."""

    __slots__ = ("_gate", "_key_fields_hint", "_options")

    def __init__(
        self,
        gate: GateRpc,
        action: str,
        options: GuardOptions,
        key_fields_hint: Sequence[str] | None,
    ) -> None:
        del action  # the threaded runner's native loop names it in its requests
        self._gate = gate
        self._options = options
        self._key_fields_hint = key_fields_hint

    async def call(self, binding: Binding, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Runs one call of a decorated function (``binding``'s, with ``args`` and ``kwargs``) at
        most once, as :meth:`Attempt.run` does."""
        call = binding.bind(args, kwargs)
        return await self(call.request, call.invoke)

    async def __call__(self, request: Request, invoke: Callable[[Grant], Any]) -> Any:
        """Runs ``invoke(grant)`` at most once for ``request``, as :meth:`Attempt.run` does."""
        attempt = Attempt(self._gate, request, self._options, key_fields_hint=self._key_fields_hint)
        return await attempt.run(invoke)
