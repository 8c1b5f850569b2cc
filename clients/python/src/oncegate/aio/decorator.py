"""The decorator: a tool function whose every logical call runs at most once.

It owns turning a call into a guarded attempt (the call's arguments become the params through
:class:`~oncegate.guard.binding.Binding`, the control arguments and the ambient scope become the
request, the grant is handed to the function) and nothing of the protocol itself, which
:class:`~oncegate.aio.attempt.Attempt` follows (the call runs through
:class:`~oncegate.aio.runner.Runner`, which in the threaded client runs the common case on the
native core).

One source, two clients: ``oncegate/aio/decorator.py`` is written by hand, and
``generate_sync.py`` writes the threaded ``oncegate/guard/decorator.py`` from it with unasync.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from oncegate.aio.runner import Runner
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
    """Decorates a tool function so that each logical call of it runs at most once.

    The wrapper binds the call's arguments to the function's parameters (defaults included); every
    parameter except ``grant`` and the :data:`~oncegate.guard.CONTROL_ARGUMENTS` becomes a param,
    and the whole params object must be JSON-serialisable. ``agent_id``, ``run_id``,
    ``idempotency_key`` and ``intent_id`` may be passed as keywords even when the function does not
    declare them; the scope falls back to :func:`~oncegate.guard.scope`. A parameter named
    ``grant`` receives the :class:`~oncegate.models.Grant` (pass its ``provider_key`` on to the
    provider). The function may not take ``*args``: params are named. With :mod:`oncegate.aio` the
    function may be a coroutine function or a plain one; the wrapper is a coroutine function
    either way.

    The wrapper's signature is the function's without ``grant``, so frameworks that derive a tool
    schema from it never offer ``grant`` to the model. It returns the function's result, or on a
    replay the decoded stored receipt; it raises as :class:`Attempt` describes.

    Every parameter is part of the action's identity: keyword or positional, defaults included,
    each is a param, and unless the gate's policy for the action names ``key_fields``, every param
    counts. Without an idempotency key two calls that differ in any argument (a memo, a timestamp)
    are two actions; with one, the second is refused with ``KeyReusedError``. To leave an argument
    out, list the arguments that count in the gate's policy (``key_fields = ["/amount", "/to"]``,
    JSON Pointers into the params), so that every client fingerprints alike; an argument that must
    not reach the gate at all does not belong in the signature.

    ``key_fields_hint`` (the key fields you expect the gate's policy to use) makes the wrapper log
    a warning when the gate's fingerprint differs from the one computed locally with it.
    """
    guard_options = options or GuardOptions()

    def decorate(fn: Callable[..., Awaitable[T] | T]) -> Callable[..., Awaitable[T]]:
        binding = Binding(fn, name)
        runner = Runner(gate, name, guard_options, key_fields_hint)

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            return await runner.call(binding, args, kwargs)  # type: ignore[no-any-return]

        # Frameworks that build a tool schema from the signature (LangChain, CrewAI) must not
        # offer the model a `grant` argument: the gate supplies it.
        wrapper.__signature__ = binding.signature  # type: ignore[attr-defined]
        wrapper.__annotations__ = binding.annotations
        return wrapper

    return decorate
