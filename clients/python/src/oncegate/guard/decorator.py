"""The decorator: a tool function whose every logical call runs at most once.

It owns turning a call into a guarded attempt (the call's arguments become the params, the
control arguments and the ambient scope become the request, the grant is handed to the function)
and nothing of the protocol itself, which :class:`~oncegate.guard.attempt.Attempt` follows.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from oncegate.guard.attempt import Attempt
from oncegate.guard.context import resolve_scope
from oncegate.guard.options import GuardOptions, Request

if TYPE_CHECKING:
    from oncegate.models import Grant
    from oncegate.rpc import GateRpc

__all__ = ["CONTROL_ARGUMENTS", "action"]

T = TypeVar("T")

CONTROL_ARGUMENTS = ("agent_id", "run_id", "idempotency_key", "intent_id")
"""Arguments of a decorated function that steer the gate and are not params."""


def action(
    gate: GateRpc,
    name: str,
    *,
    key_fields_hint: Sequence[str] | None = None,
    options: GuardOptions | None = None,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorates a tool function so that each logical call of it runs at most once.

    The wrapper binds the call's arguments to the function's parameters (defaults included); every
    parameter except ``grant`` and the :data:`CONTROL_ARGUMENTS` becomes a param, and the whole
    params object must be JSON-serialisable. ``agent_id``, ``run_id``, ``idempotency_key`` and
    ``intent_id`` may be passed as keywords even when the function does not declare them; the
    scope falls back to :func:`~oncegate.guard.scope`. A parameter named ``grant`` receives the
    :class:`~oncegate.models.Grant` (pass its ``provider_key`` on to the provider). The function
    may not take ``*args``: params are named.

    The wrapper's signature is the function's without ``grant``, so frameworks that derive a tool
    schema from it never offer ``grant`` to the model. It returns the function's result, or on a
    replay the decoded stored receipt; it raises as :class:`Attempt` describes.

    ``key_fields_hint`` (the key fields you expect the gate's policy to use) makes the wrapper log
    a warning when the gate's fingerprint differs from the one computed locally with it.
    """
    guard_options = options or GuardOptions()

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        signature = inspect.signature(fn)
        parameters = signature.parameters
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values()):
            raise TypeError(f"{fn.__qualname__}: a guarded action cannot take *args; params are named")
        bindable = signature.replace(parameters=[p for p in parameters.values() if p.name != "grant"])

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            control = {
                key: kwargs.pop(key) for key in CONTROL_ARGUMENTS if key in kwargs and key not in parameters
            }
            bound = bindable.bind(*args, **kwargs)
            bound.apply_defaults()
            params: dict[str, Any] = {}
            for param_name, value in bound.arguments.items():
                pairs = (
                    value.items()
                    if parameters[param_name].kind is inspect.Parameter.VAR_KEYWORD
                    else [(param_name, value)]
                )
                for key, item in pairs:
                    (control if key in CONTROL_ARGUMENTS else params)[key] = item
            request = Request(
                name,
                params,
                resolve_scope(fn.__qualname__, control.get("agent_id"), control.get("run_id")),
                control.get("intent_id"),
                control.get("idempotency_key"),
            )

            def call(grant: Grant) -> T:
                positional: list[Any] = []
                keywords: dict[str, Any] = {}
                for parameter in parameters.values():
                    if parameter.name == "grant":
                        argument: Any = grant
                    elif parameter.name in bound.arguments:
                        argument = bound.arguments[parameter.name]
                    else:
                        continue
                    if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                        positional.append(argument)
                    elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
                        keywords.update(argument)
                    else:
                        keywords[parameter.name] = argument
                return fn(*positional, **keywords)

            return Attempt(gate, request, guard_options, key_fields_hint=key_fields_hint).run(call)

        # Frameworks that build a tool schema from the signature (LangChain, CrewAI) must not
        # offer the model a `grant` argument: the gate supplies it.
        wrapper.__signature__ = bindable  # type: ignore[attr-defined]
        wrapper.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "grant"}
        return wrapper

    return decorate
