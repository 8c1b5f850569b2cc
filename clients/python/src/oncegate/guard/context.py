"""The ambient scope: the ``agent_id`` and ``run_id`` decorated actions use when a call names none.

It owns one context variable and nothing else; the decorator reads it through
:func:`resolve_scope`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from oncegate.models import Scope

__all__ = ["current_scope", "resolve_scope", "scope"]

_current_scope: ContextVar[Scope | None] = ContextVar("oncegate_scope", default=None)


@contextmanager
def scope(agent_id: str, run_id: str) -> Iterator[Scope]:
    """Sets the scope that decorated actions use when a call does not name one.

    The scope is a context variable: it follows asyncio tasks, but a new thread starts without
    it (use :func:`contextvars.copy_context` to carry it over).
    """
    value = Scope(agent_id, run_id)
    token = _current_scope.set(value)
    try:
        yield value
    finally:
        _current_scope.reset(token)


def current_scope() -> Scope | None:
    """The scope set by the innermost :func:`scope`, if any."""
    return _current_scope.get()


def resolve_scope(caller: str, agent_id: str | None, run_id: str | None) -> Scope:
    """The scope of one call: its own ``agent_id`` and ``run_id`` where given, else the ambient
    scope's; a :class:`TypeError` naming ``caller`` when neither gives both."""
    ambient = _current_scope.get()
    agent_id = agent_id or (ambient.agent_id if ambient else None)
    run_id = run_id or (ambient.run_id if ambient else None)
    if not agent_id or not run_id:
        raise TypeError(f"{caller}: no scope: pass agent_id= and run_id=, or call inside gate.scope(...)")
    return Scope(agent_id, run_id)
