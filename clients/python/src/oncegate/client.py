"""The synchronous oncegate client: the RPCs of :mod:`oncegate.rpc` plus the guard's entry points.

:class:`Gate` is the one object users hold. It adds nothing of its own: the RPCs come from
:class:`~oncegate.rpc.GateRpc`, and ``action``, ``run``, ``attempt`` and ``scope`` hand over to
:mod:`oncegate.guard`, giving it this client as its RPC layer. Nothing below imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from oncegate import guard
from oncegate.models import Grant, Scope
from oncegate.rpc import GateRpc

__all__ = ["Gate"]

T = TypeVar("T")


class Gate(GateRpc):
    """A client of one oncegate server.

    Args:
        target: ``host:port`` of the gate.
        api_key: Sent as ``authorization: Bearer <key>`` on every call.
        credentials: TLS channel credentials; a plaintext channel when ``None``.
        timeout: Deadline of each call, in seconds.
        options: Extra gRPC channel options.

    Every method raises an :class:`~oncegate.errors.OncegateError` subclass named by the gate's
    error reason, or :class:`~oncegate.errors.TransportError` when the gate was not reached. A
    ``Gate`` is thread-safe and can be used as a context manager that closes its channel.
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
    ) -> guard.Attempt:
        """A guarded attempt of one action, as a context manager.

        Entering it asks for a token (waiting while another holder's attempt is in progress);
        the body then runs the action unless ``attempt.replayed``, and calls
        ``attempt.complete(result)``. See :class:`~oncegate.guard.Attempt` for what happens on
        exceptions, and :class:`~oncegate.guard.GuardOptions` for ``options``.
        """
        return guard.Attempt(
            self,
            guard.Request(action, dict(params), Scope(agent_id, run_id), intent_id, idempotency_key),
            guard.GuardOptions(**options),
            key_fields_hint=key_fields_hint,
        )

    def run(
        self,
        action: str,
        params: Mapping[str, Any],
        fn: Callable[[Grant], T],
        *,
        agent_id: str,
        run_id: str,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        key_fields_hint: Sequence[str] | None = None,
        **options: Any,
    ) -> T:
        """Runs ``fn(grant)`` at most once for this action and returns its result.

        On a replay ``fn`` does not run and the stored receipt, decoded by the ``decode`` option,
        is returned instead. See :meth:`attempt` for the arguments.
        """
        return self.attempt(
            action,
            params,
            agent_id=agent_id,
            run_id=run_id,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            key_fields_hint=key_fields_hint,
            **options,
        ).run(fn)

    def action(
        self, name: str, *, key_fields_hint: Sequence[str] | None = None, **options: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorates a tool function so that each logical call runs at most once.

        The function's arguments (by name, defaults included) are the params, except
        ``agent_id``, ``run_id``, ``idempotency_key`` and ``intent_id``, which the caller may pass
        as keywords (or take from :meth:`scope`). A parameter named ``grant`` receives the
        :class:`~oncegate.models.Grant`. Every argument is part of the action's identity unless
        the gate's policy names ``key_fields`` (see :func:`oncegate.guard.action`, which also
        details ``options``: ``max_wait``, ``poll_interval``, ``retry_timeout``, ``lease_ttl``,
        ``heartbeat``, ``holder``, ``definite``, ``encode``, ``decode``).
        """
        return guard.action(
            self, name, key_fields_hint=key_fields_hint, options=guard.GuardOptions(**options)
        )

    @staticmethod
    def scope(agent_id: str, run_id: str) -> AbstractContextManager[Scope]:
        """Sets the scope that decorated actions use when a call does not name one."""
        return guard.scope(agent_id, run_id)
