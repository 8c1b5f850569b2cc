"""The ambient scope: the ``agent_id`` and ``run_id`` decorated actions use when a call names none.

It owns one context variable and nothing else; the decorator reads it through
:func:`resolve_scope`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ContextDecorator
from contextvars import ContextVar, Token

from oncegate.models import Scope

__all__ = ["current_scope", "resolve_scope", "scope"]

_current_scope: ContextVar[Scope | None] = ContextVar("oncegate_scope", default=None)


def scope(agent_id: str, run_id: str) -> AbstractContextManager[Scope]:
    """Sets the scope that decorated actions use when a call does not name one.

    The scope is a context variable: it follows asyncio tasks, but a new thread starts without
    it (use :func:`contextvars.copy_context` to carry it over). Like a
    :func:`~contextlib.contextmanager`, what it returns also decorates a function.
    """
    return _Scoped(Scope(agent_id, run_id))


class _Scoped(ContextDecorator):
    """:func:`scope`'s context manager: a class rather than a generator, a guarded cycle's
    cheapest way in and out."""

    __slots__ = ("_token", "_value")

    def __init__(self, value: Scope) -> None:
        self._value = value
        self._token: Token[Scope | None] | None = None

    def _recreate_cm(self) -> _Scoped:
        # Each call of a decorated function gets its own manager (and token), as a
        # contextmanager's does.
        return _Scoped(self._value)

    def __enter__(self) -> Scope:
        if self._token is not None:
            raise RuntimeError("oncegate.scope(...) is entered once; call scope() again")
        self._token = _current_scope.set(self._value)
        return self._value

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        assert self._token is not None
        _current_scope.reset(self._token)


def current_scope() -> Scope | None:
    """The scope set by the innermost :func:`scope`, if any."""
    return _current_scope.get()


def resolve_scope(caller: str, agent_id: str | None, run_id: str | None) -> Scope:
    """The scope of one call: its own ``agent_id`` and ``run_id`` where given, else the ambient
    scope's; a :class:`TypeError` naming ``caller`` when neither gives both."""
    ambient = _current_scope.get()
    if not agent_id and not run_id and ambient is not None and ambient.agent_id and ambient.run_id:
        return ambient  # a frozen value: the ambient one itself, not a copy
    agent_id = agent_id or (ambient.agent_id if ambient else None)
    run_id = run_id or (ambient.run_id if ambient else None)
    if not agent_id or not run_id:
        raise TypeError(f"{caller}: no scope: pass agent_id= and run_id=, or call inside gate.scope(...)")
    return Scope(agent_id, run_id)
