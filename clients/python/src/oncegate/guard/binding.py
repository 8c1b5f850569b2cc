"""A tool function's call as a gate request: which arguments are params, which steer the gate, and
how the function is called back with its grant.

Shared by the threaded decorator (:mod:`oncegate.guard.decorator`) and the asyncio one
(:mod:`oncegate.aio.decorator`), and by the framework adapters (:mod:`oncegate.integrations`); it
does not call the gate.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oncegate.guard.context import resolve_scope
from oncegate.guard.options import Request
from oncegate.models import Scope

if TYPE_CHECKING:
    from oncegate.models import Grant

__all__ = ["CONTROL_ARGUMENTS", "Binding", "BoundCall"]

CONTROL_ARGUMENTS = ("agent_id", "run_id", "idempotency_key", "intent_id")
"""Arguments of a decorated function that steer the gate and are not params."""


class BoundCall:
    """One call of a guarded function: its request, and how to run the function with a grant."""

    def __init__(self, binding: Binding, request: Request, arguments: dict[str, Any]) -> None:
        self.binding = binding
        self.request = request
        self.arguments = arguments
        """The bound arguments, with the injected ones (a framework's context): the function's
        keywords when the binding is ``plain``. Read, never changed: it may be the caller's own
        keywords."""

    def invoke(self, grant: Grant) -> Any:
        """Calls the function with the bound arguments and ``grant`` (when it takes one); returns
        what it returns (a coroutine, for a coroutine function)."""
        if self.binding.plain:
            # Every parameter can be passed by name: the common case, without walking the signature.
            if self.binding.takes_grant:
                return self.binding.fn(**self.arguments, grant=grant)
            return self.binding.fn(**self.arguments)
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for parameter in self.binding.parameters.values():
            if parameter.name == "grant":
                argument: Any = grant
            elif parameter.name in self.arguments:
                argument = self.arguments[parameter.name]
            else:
                continue
            if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                positional.append(argument)
            elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
                keywords.update(argument)
            else:
                keywords[parameter.name] = argument
        return self.binding.fn(*positional, **keywords)


class Binding:
    """How calls of ``fn`` become requests for the action ``name``.

    Every parameter except ``grant``, the ``injected`` ones and the :data:`CONTROL_ARGUMENTS`
    becomes a param (defaults included); ``agent_id``, ``run_id``, ``idempotency_key`` and
    ``intent_id`` may be passed as keywords even when ``fn`` does not declare them. ``injected``
    names parameters a framework fills (its run context, ``ctx``): given to :meth:`bind`, passed
    to ``fn``, never params. ``signature`` is ``fn``'s without ``grant`` and the injected
    parameters, for frameworks that derive a tool schema from it.
    """

    def __init__(self, fn: Callable[..., Any], name: str, injected: tuple[str, ...] = ()) -> None:
        signature = inspect.signature(fn)
        self.parameters = signature.parameters
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in self.parameters.values()):
            raise TypeError(f"{fn.__qualname__}: a guarded action cannot take *args; params are named")
        self.fn = fn
        self.name = name
        self.injected = tuple(name for name in injected if name in self.parameters)
        hidden = {"grant", *self.injected}
        self.signature = signature.replace(
            parameters=[p for p in self.parameters.values() if p.name not in hidden]
        )
        self.annotations = {k: v for k, v in fn.__annotations__.items() if k not in hidden}
        self.takes_grant = "grant" in self.parameters
        self.plain = all(
            p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            for p in self.parameters.values()
        )
        """Every parameter can be passed by name (no positional-only ones, no ``**kwargs``): calls
        are bound without :meth:`inspect.Signature.bind`."""
        visible = [p for p in self.parameters.values() if p.name not in hidden]
        self._positional = tuple(p.name for p in visible if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self._defaults = {p.name: p.default for p in visible if p.default is not inspect.Parameter.empty}
        self._order = tuple(p.name for p in visible)
        self._names = frozenset(self._order)
        self._control = frozenset(name for name in CONTROL_ARGUMENTS if name not in self.parameters)
        """The control arguments a call may pass without ``fn`` declaring them."""
        self._var_keyword = next(
            (p.name for p in self.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )
        self._params_are_arguments = self._var_keyword is None and not any(
            name in CONTROL_ARGUMENTS for name in self._order
        )
        """Every bound argument is a param: no ``**kwargs`` to spread, no declared control argument."""

    def bind(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        scope: Scope | None = None,
        injected: dict[str, Any] | None = None,
    ) -> BoundCall:
        """The request of one call. Its scope is the call's ``agent_id``/``run_id``, else
        ``scope``, else the ambient :func:`~oncegate.guard.scope`; ``injected`` holds the values
        of the injected parameters."""
        params, call_scope, intent_id, idempotency_key, arguments = self.parts(args, kwargs, scope, injected)
        return BoundCall(self, Request(self.name, params, call_scope, intent_id, idempotency_key), arguments)

    def parts(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        scope: Scope | None = None,
        injected: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], Scope, str | None, str | None, dict[str, Any]]:
        """What :meth:`bind` makes its request and call of: the params, the scope, the intent id,
        the idempotency key and the function's arguments (all the threaded guard's native loop
        needs, which makes the request only when it hands a call over)."""
        control: dict[str, Any] = {}
        if not self._control.isdisjoint(kwargs):
            kwargs = dict(kwargs)
            for key in CONTROL_ARGUMENTS:
                if key in kwargs and key in self._control:
                    control[key] = kwargs.pop(key)
        bound = self._bind_plain(args, kwargs)
        if bound is None:
            signature_bound = self.signature.bind(*args, **kwargs)
            signature_bound.apply_defaults()
            bound = signature_bound.arguments
        if self._params_are_arguments:
            params = dict(bound)
        else:
            params = {}
            for param_name, value in bound.items():
                pairs = value.items() if param_name == self._var_keyword else [(param_name, value)]
                for key, item in pairs:
                    (control if key in CONTROL_ARGUMENTS else params)[key] = item
        agent_id = control.get("agent_id") or (scope.agent_id if scope else None)
        run_id = control.get("run_id") or (scope.run_id if scope else None)
        arguments = bound
        if self.injected:
            arguments = dict(bound)
            arguments.update((name, (injected or {})[name]) for name in self.injected)
        return (
            params,
            resolve_scope(self.fn.__qualname__, agent_id, run_id),
            control.get("intent_id"),
            control.get("idempotency_key"),
            arguments,
        )

    def _bind_plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The arguments of a call of a plain signature, defaults applied, as
        :meth:`inspect.Signature.bind` would bind them; ``None`` when the signature is not plain or
        the call does not fit it (the signature then binds it, or says why it does not). It may
        be ``kwargs`` itself, which is then read and not changed."""
        if not self.plain or len(args) > len(self._positional):
            return None
        if not args and len(kwargs) == len(self._order) and tuple(kwargs) == self._order:
            return kwargs  # every parameter by name, in order: the common call of a tool
        bound = dict(zip(self._positional, args, strict=False))  # fewer args than positional names
        for name, value in kwargs.items():
            if name in bound or name not in self._names:
                return None
            bound[name] = value
        for name, default in self._defaults.items():
            bound.setdefault(name, default)
        if len(bound) != len(self._names):
            return None
        if tuple(bound) == self._order:
            return bound
        return {name: bound[name] for name in self._order}
