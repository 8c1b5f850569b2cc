"""What a guarded attempt asks for (:class:`Request`) and how it behaves (:class:`GuardOptions`).

The option names follow the Rust guard's ``GuardOptions`` where both have the same thing
(``max_wait``, ``poll_interval``); ``wait_timeout``, the earlier name of ``max_wait``, is still
accepted with a :class:`DeprecationWarning` until the release after the first one (none is out
yet; the README's table of deprecated names lists it). The entry points (``Gate.action``,
``run``, ``attempt``, in both clients, and the framework adapters) take the same options as typed
keywords, or all at once as ``options=GuardOptions(...)``; :func:`guard_options` turns either into
one :class:`GuardOptions`. This module holds values only: the guard's behaviour lives in
:mod:`oncegate.guard.attempt`.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oncegate.models import Scope, json_decode, json_encode

__all__ = ["DEFAULT_MAX_WAIT", "GuardOptions", "Request", "guard_options", "json_decode", "json_encode"]

DEFAULT_MAX_WAIT = 30.0
"""Seconds a guarded attempt waits, by default, while another holder's attempt is in progress."""


@dataclass(frozen=True, init=False)
class GuardOptions:
    """How a guarded attempt behaves.

    Attributes:
        definite: Exception classes that mean the action definitely had no effect (besides
            :class:`~oncegate.errors.DefiniteFailureError`): the token is released and the
            exception re-raised.
        encode: Turns the function's result into the receipt bytes.
        decode: Turns a replayed receipt back into a result.
        lease_ttl: Lease length in seconds; the gate's policy when ``None``.
        max_wait: How long to wait, in seconds, while another holder's attempt is in progress,
            before raising :class:`~oncegate.errors.InProgressError`; 30 s when ``None``. It was
            called ``wait_timeout``, still accepted (deprecated; not with ``max_wait``).
        poll_interval: Longest pause between two asks while waiting; the pause is shorter when
            the gate's ``RetryInfo`` says so.
        retry_timeout: How long to keep retrying a call that failed transiently (the store or the
            network unavailable), in seconds.
        heartbeat: Extend the lease in the background while the action runs.
        holder: The name this attempt gives the gate; unique per attempt by default, so a lost
            grant reply is re-delivered to this attempt and to no one else.
    """

    definite: tuple[type[BaseException], ...]
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]
    lease_ttl: float | None
    max_wait: float
    poll_interval: float
    retry_timeout: float
    heartbeat: bool
    holder: str | None

    def __init__(
        self,
        definite: tuple[type[BaseException], ...] = (),
        encode: Callable[[Any], bytes] = json_encode,
        decode: Callable[[bytes], Any] = json_decode,
        lease_ttl: float | None = None,
        max_wait: float | None = None,
        poll_interval: float = 1.0,
        retry_timeout: float = 30.0,
        heartbeat: bool = True,
        holder: str | None = None,
        *,
        wait_timeout: float | None = None,
    ) -> None:
        if wait_timeout is not None:
            if max_wait is not None:
                raise TypeError("pass max_wait, or its deprecated name wait_timeout, not both")
            _deprecated_wait_timeout()
            max_wait = wait_timeout
        if max_wait is None:
            max_wait = DEFAULT_MAX_WAIT
        # A frozen dataclass is initialised through object.__setattr__, as its generated
        # __init__ would; this one exists only to accept the deprecated keyword.
        for name, value in (
            ("definite", definite),
            ("encode", encode),
            ("decode", decode),
            ("lease_ttl", lease_ttl),
            ("max_wait", max_wait),
            ("poll_interval", poll_interval),
            ("retry_timeout", retry_timeout),
            ("heartbeat", heartbeat),
            ("holder", holder),
        ):
            object.__setattr__(self, name, value)

    @property
    def wait_timeout(self) -> float:
        """Deprecated: the earlier name of :attr:`max_wait`."""
        _deprecated_wait_timeout()
        return self.max_wait


_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(GuardOptions.__init__).parameters.items()
    if name != "self"
}
"""Each option keyword and its default: what an entry point's keyword holds when the caller left it."""


def guard_options(options: GuardOptions | None, **keywords: Any) -> GuardOptions:
    """The options of one entry point: ``options`` when given, else those the option keywords
    (every field of :class:`GuardOptions`, and ``wait_timeout``) make.

    An entry point passes all its option keywords; giving ``options=`` together with a keyword
    that is not at its default is a :class:`TypeError` (which of the two should win?), as is a
    name that is not an option.
    """
    unknown = sorted(set(keywords) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown guard options {unknown}; the options are {sorted(_DEFAULTS)}")
    if options is None:
        return GuardOptions(**keywords)
    if not isinstance(options, GuardOptions):
        raise TypeError(f"options= takes a GuardOptions, not {type(options).__name__}")
    given = sorted(name for name, value in keywords.items() if value != _DEFAULTS[name])
    if given:
        raise TypeError(f"pass options=GuardOptions(...) or the option keywords {given}, not both")
    return options


@dataclass(frozen=True, init=False)
class Request:
    """What a guarded attempt asks the gate for."""

    action: str
    params: dict[str, Any]
    scope: Scope
    intent_id: str | None = None
    idempotency_key: str | None = None

    def __init__(
        self,
        action: str,
        params: dict[str, Any],
        scope: Scope,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        # What the generated __init__ does (a frozen dataclass's sets each field through
        # object.__setattr__) for a fraction of its cost: every guarded call makes one.
        self.__dict__.update(
            action=action, params=params, scope=scope, intent_id=intent_id, idempotency_key=idempotency_key
        )


def _deprecated_wait_timeout() -> None:
    warnings.warn(
        "GuardOptions: wait_timeout is deprecated, use max_wait (the Rust guard's name); "
        "wait_timeout goes in the release after the first one",
        DeprecationWarning,
        stacklevel=_caller_outside_package(),
    )


def _caller_outside_package() -> int:
    """The ``stacklevel`` of the first frame outside this package, so that the warning names the
    user's line (and shows under Python's default filters when that line is in ``__main__``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    level = 2  # 1 is the function that calls warnings.warn; 2 its caller
    frame = sys._getframe(2)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back
        level += 1
    return level
