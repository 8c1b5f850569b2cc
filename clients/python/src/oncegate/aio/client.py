"""The oncegate client: the RPCs of :mod:`oncegate.aio.rpc` plus the guard's entry points.

:class:`Gate` is the one object users hold. It adds nothing of its own: the RPCs come from
:class:`~oncegate.aio.rpc.GateRpc`, and ``action``, ``run``, ``attempt`` and ``scope`` hand
over to the guard (:class:`~oncegate.aio.attempt.Attempt`,
:func:`~oncegate.aio.decorator.action`), giving it this client as its RPC layer. Nothing below
imports this module.

One source, two clients: ``oncegate/aio/client.py`` is written by hand, and ``generate_sync.py``
writes the threaded ``oncegate/client.py`` from it with unasync.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from oncegate.aio.attempt import Attempt
from oncegate.aio.decorator import action as guarded_action
from oncegate.aio.rpc import GateRpc
from oncegate.aio.runner import Runner
from oncegate.guard.context import scope as ambient_scope
from oncegate.guard.options import GuardOptions, Request, guard_options, json_decode, json_encode
from oncegate.models import Grant, Scope

__all__ = ["Gate"]

T = TypeVar("T")


class Gate(GateRpc):
    """A client of one oncegate server.

    Args:
        target: The gate's address in any of :data:`oncegate.address.FORMS`; without it
            ``ONCEGATE_TARGET``, else ``127.0.0.1:50051``.
        api_key: Sent as ``authorization: Bearer <key>`` on every call.
        credentials: TLS channel credentials; a plaintext channel when ``None``.
        timeout: Deadline of each call, in seconds.
        options: Extra gRPC channel options.

    Every method raises an :class:`~oncegate.errors.OncegateError` subclass named by the gate's
    error reason, or :class:`~oncegate.errors.TransportError` when the gate was not reached.

    The guard's entry points (:meth:`action`, :meth:`run`, :meth:`attempt`) take its options as
    keywords, each typed and documented in :class:`~oncegate.guard.GuardOptions` (``max_wait``,
    ``poll_interval``, ``retry_timeout``, ``lease_ttl``, ``heartbeat``, ``holder``, ``definite``,
    ``encode``, ``decode``; ``wait_timeout`` is the deprecated name of ``max_wait``), or all at
    once as ``options=GuardOptions(...)``, not both.

    The threaded :class:`oncegate.Gate` is thread-safe and a context manager that closes its
    channel. :class:`oncegate.aio.Gate`'s methods are coroutines (its ``attempt`` is entered with
    ``async with``); it opens its channel inside the first event loop that uses it and belongs to
    that loop; ``async with`` or ``await close()`` closes it.
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
    ) -> Attempt:
        """A guarded attempt of one action, as an ``async with`` block.

        Entering it asks for a token (waiting while another holder's attempt is in progress);
        the body then runs the action unless ``attempt.replayed``, and calls
        ``attempt.complete(result)``. See :class:`~oncegate.aio.attempt.Attempt` for what happens
        on exceptions, and :class:`~oncegate.guard.GuardOptions` for the options.
        """
        return Attempt(
            self,
            Request(action, dict(params), Scope(agent_id, run_id), intent_id, idempotency_key),
            guard_options(
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
            ),
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
    ) -> T:
        """Runs ``fn(grant)`` at most once for this action and returns its result.

        On a replay ``fn`` does not run and the stored receipt, decoded by the ``decode`` option,
        is returned instead. See :meth:`attempt` for the arguments.
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
        request = Request(action, dict(params), Scope(agent_id, run_id), intent_id, idempotency_key)
        return await Runner(self, action, resolved, key_fields_hint)(request, fn)  # type: ignore[no-any-return]

    def action(
        self,
        name: str,
        *,
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
    ) -> Callable[[Callable[..., Awaitable[T] | T]], Callable[..., Awaitable[T]]]:
        """Decorates a tool function so that each logical call runs at most once.

        The function's arguments (by name, defaults included) are the params, except
        ``agent_id``, ``run_id``, ``idempotency_key`` and ``intent_id``, which the caller may pass
        as keywords (or take from :meth:`scope`). A parameter named ``grant`` receives the
        :class:`~oncegate.models.Grant`. Every argument is part of the action's identity unless
        the gate's policy names ``key_fields`` (see :func:`oncegate.aio.decorator.action`). The
        options are :class:`~oncegate.guard.GuardOptions`'s.
        """
        return guarded_action(
            self,
            name,
            key_fields_hint=key_fields_hint,
            options=guard_options(
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
            ),
        )

    scope = staticmethod(ambient_scope)
    """Sets the scope that decorated actions use when a call does not name one (a context
    variable: it follows asyncio tasks, but a new thread starts without it): the guard's
    :func:`~oncegate.guard.scope` itself, entered on every call of a tool that uses it."""
