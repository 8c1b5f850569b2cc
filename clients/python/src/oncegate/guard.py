"""The guard: runs one action at most once, and never guesses about an outcome it does not know.

The protocol, for one attempt:

1. RequestToken. A replay (``ALREADY_COMPLETED``) returns the stored receipt and runs nothing.
   ``IDEMPOTENCY_IN_PROGRESS`` waits (at most ``wait_timeout``) and asks again.
   ``IDEMPOTENCY_KEY_REUSED`` is raised and never retried under a new key.
2. On a grant, run the action with the grant (token, fencing, provider key) while a background
   thread extends the lease.
3. Success: Complete with the encoded result, retrying on transient errors until acknowledged or
   ``retry_timeout`` passes (then :class:`~oncegate.errors.CompletionUnrecorded`).
4. A definite failure (:class:`~oncegate.errors.DefiniteFailure`, or a class listed in
   ``definite``): Release, then re-raise.
5. Anything else (a timeout, any unmarked exception): never Release; raise
   :class:`~oncegate.errors.OutcomeUnknown`, chaining the cause, so that the outcome is
   reconciled with the provider before anyone runs the action again.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from oncegate.errors import (
    CompletionUnrecorded,
    DefiniteFailure,
    InProgress,
    OncegateError,
    OutcomeUnknown,
)
from oncegate.fingerprints import ParamsError, fingerprint
from oncegate.models import (
    ActionRef,
    Completion,
    Decision,
    Grant,
    ReleaseReason,
    RequestTokenResult,
    Scope,
)

if TYPE_CHECKING:
    from oncegate.client import Gate

__all__ = [
    "CONTROL_ARGUMENTS",
    "Attempt",
    "GuardOptions",
    "Request",
    "action",
    "current_scope",
    "json_decode",
    "json_encode",
    "scope",
]

T = TypeVar("T")

logger = logging.getLogger("oncegate")

CONTROL_ARGUMENTS = ("agent_id", "run_id", "idempotency_key", "intent_id")
"""Arguments of a decorated function that steer the gate and are not params."""

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


def json_encode(result: Any) -> bytes:
    """The default receipt encoder: compact JSON with sorted keys."""
    return json.dumps(result, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def json_decode(receipt: bytes) -> Any:
    """The default receipt decoder; an empty receipt decodes to ``None``."""
    return json.loads(receipt) if receipt else None


@dataclass(frozen=True)
class GuardOptions:
    """How a guarded attempt behaves.

    Attributes:
        definite: Exception classes that mean the action definitely had no effect (besides
            :class:`~oncegate.errors.DefiniteFailure`): the token is released and the exception
            re-raised.
        encode: Turns the function's result into the receipt bytes.
        decode: Turns a replayed receipt back into a result.
        lease_ttl: Lease length in seconds; the gate's policy when ``None``.
        wait_timeout: How long to wait, in seconds, while another holder's attempt is in progress,
            before raising :class:`~oncegate.errors.InProgress`.
        poll_interval: Longest pause between two asks while waiting; the pause is shorter when
            the gate's ``RetryInfo`` says so.
        retry_timeout: How long to keep retrying a call that failed transiently (the store or the
            network unavailable), in seconds.
        heartbeat: Extend the lease in the background while the action runs.
        holder: The name this attempt gives the gate; unique per attempt by default, so a lost
            grant reply is re-delivered to this attempt and to no one else.
    """

    definite: tuple[type[BaseException], ...] = ()
    encode: Callable[[Any], bytes] = json_encode
    decode: Callable[[bytes], Any] = json_decode
    lease_ttl: float | None = None
    wait_timeout: float = 30.0
    poll_interval: float = 1.0
    retry_timeout: float = 30.0
    heartbeat: bool = True
    holder: str | None = None


@dataclass(frozen=True)
class Request:
    """What a guarded attempt asks the gate for."""

    action: str
    params: dict[str, Any]
    scope: Scope
    intent_id: str | None = None
    idempotency_key: str | None = None


class _Backoff:
    """Exponential backoff with jitter within a time budget."""

    def __init__(self, budget: float, first: float = 0.05, cap: float = 2.0) -> None:
        self._deadline = time.monotonic() + budget
        self._delay = first
        self._cap = cap

    def sleep(self, hint: float | None = None) -> bool:
        """Sleeps before the next try (``hint`` seconds when the gate said); ``False`` when the
        budget is spent."""
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return False
        delay = hint if hint is not None else random.uniform(self._delay / 2, self._delay)
        self._delay = min(self._delay * 2, self._cap)
        time.sleep(min(delay, remaining))
        return True


class _Heartbeat:
    """Extends a lease every third of its length until stopped."""

    def __init__(self, gate: Gate, action: ActionRef, token: str, ttl: float) -> None:
        self._gate = gate
        self._action = action
        self._token = token
        self._ttl = ttl
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oncegate-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops extending; an extension already in flight is left to finish on its own."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._ttl / 3):
            try:
                self._gate.extend_lease(self._action, self._token, self._ttl)
            except OncegateError as err:
                if self._stopped.is_set():
                    return
                if not err.retryable:
                    logger.warning("oncegate: stopped extending the lease of %s: %s", self._action.key, err)
                    return
                logger.info(
                    "oncegate: extending the lease of %s failed, will retry: %s", self._action.key, err
                )


def _default_holder() -> str:
    return f"py:{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex}"


class Attempt:
    """One guarded attempt of one action, used as a context manager.

    Entering asks the gate for a token. Then either ``replayed`` is true, ``result`` is the decoded
    stored receipt and the action must not run; or ``grant`` is set, the lease is extended in the
    background, and the body runs the action and calls :meth:`complete` (or :meth:`skip`).

    Leaving the block settles the attempt: an exception marked definite releases the token and
    propagates; any other exception, or a block that ended without :meth:`complete` or
    :meth:`skip`, raises :class:`~oncegate.errors.OutcomeUnknown` and leaves the token unreleased.
    ``KeyboardInterrupt`` and other non-``Exception`` errors propagate unchanged, also without
    a release.

    Example::

        with gate.attempt("payments.transfer", params, agent_id="a", run_id="r") as attempt:
            if not attempt.replayed:
                attempt.complete(provider.pay(**params, key=attempt.grant.provider_key))
            receipt = attempt.result
    """

    def __init__(
        self,
        gate: Gate,
        request: Request,
        options: GuardOptions,
        *,
        key_fields_hint: Sequence[str] | None = None,
    ) -> None:
        self._gate = gate
        self._request = request
        self._options = options
        self._key_fields_hint = key_fields_hint
        self._heartbeat: _Heartbeat | None = None
        self._settled = False
        self.holder = options.holder or _default_holder()
        self.action: ActionRef | None = None
        """The action reference, set once the gate answered."""
        self.fingerprint: str | None = None
        """The gate's fingerprint of the request."""
        self.grant: Grant | None = None
        """The grant, when the gate granted a token."""
        self.completion: Completion | None = None
        """The stored completion, on a replay or after :meth:`complete`."""
        self.result: Any = None
        """The decoded receipt on a replay, or the value passed to :meth:`complete`."""

    @property
    def replayed(self) -> bool:
        """True when the action had already completed and must not run."""
        return self.grant is None and self.completion is not None

    def __enter__(self) -> Attempt:
        answer = self._ask()
        self.action = answer.action
        self.fingerprint = answer.fingerprint
        self._check_hint(answer.fingerprint)
        if answer.decision is Decision.ALREADY_COMPLETED:
            assert answer.completion is not None
            self.completion = answer.completion
            self.result = self._options.decode(answer.completion.receipt)
            self._settled = True
            return self
        assert answer.grant is not None
        self.grant = answer.grant
        ttl = self._lease_seconds(answer.grant)
        if self._options.heartbeat and ttl is not None:
            self._heartbeat = _Heartbeat(self._gate, answer.action, answer.grant.token, ttl)
            self._heartbeat.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop_heartbeat()
        if self._settled:
            return
        self._settled = True
        action, grant = self._granted()
        if exc is None:
            raise OutcomeUnknown(
                f"{self._request.action} ({action.key}): the guarded block ended without complete() "
                f"or skip(), so the gate cannot know whether the action ran. {_reconcile_hint(grant)}",
                action=action,
                grant=grant,
            )
        if not isinstance(exc, Exception):
            logger.warning(
                "oncegate: %s (%s) interrupted by %s; the token stays unreleased. %s",
                self._request.action,
                action.key,
                type(exc).__name__,
                _reconcile_hint(grant),
            )
            return
        if _is_definite(exc, self._options.definite):
            try:
                self._release(ReleaseReason.DEFINITE_FAILURE)
            except OncegateError as err:
                logger.warning(
                    "oncegate: could not release %s after a definite failure (%s); it will need "
                    "reconciling once its lease ends",
                    action.key,
                    err,
                )
            return
        raise OutcomeUnknown(
            f"{self._request.action} ({action.key}): the outcome is unknown after "
            f"{type(exc).__name__}: {exc}. {_reconcile_hint(grant)}",
            action=action,
            grant=grant,
        ) from exc

    def complete(self, result: T) -> T:
        """Records the action's result as its receipt and returns ``result``.

        Retries transient failures until the gate acknowledges or ``retry_timeout`` passes.

        Raises:
            CompletionUnrecorded: the gate never acknowledged (or the result could not be
                encoded); it carries the result and the receipt to complete with later.
            OncegateError: the gate refused, e.g. :class:`~oncegate.errors.CompletedByOther`
                when another token already completed the action.
        """
        action, grant = self._granted()
        self._stop_heartbeat()
        self._settled = True
        try:
            receipt = self._options.encode(result)
        except Exception as err:
            raise CompletionUnrecorded(
                f"{self._request.action} ({action.key}) ran, but its result could not be encoded "
                f"as a receipt: {err}",
                action=action,
                grant=grant,
                result=result,
                receipt=None,
            ) from err
        backoff = _Backoff(self._options.retry_timeout)
        while True:
            try:
                self.completion = self._gate.complete(action, grant.token, receipt)
                break
            except OncegateError as err:
                if not err.retryable:
                    raise
                if not backoff.sleep(err.retry_after):
                    raise CompletionUnrecorded(
                        f"{self._request.action} ({action.key}) ran, but the gate did not "
                        f"acknowledge its completion: {err}. Retry gate.complete() with this "
                        "exception's action, token and receipt.",
                        action=action,
                        grant=grant,
                        result=result,
                        receipt=receipt,
                    ) from err
        self.result = result
        return result

    def skip(self) -> None:
        """Gives the token back without running the action (``RELEASE_REASON_NOT_ATTEMPTED``)."""
        self._granted()
        self._stop_heartbeat()
        self._settled = True
        self._release(ReleaseReason.NOT_ATTEMPTED)

    def run(self, fn: Callable[[Grant], T]) -> T:
        """Enters the attempt, runs ``fn(grant)`` unless replayed, completes with its result, and
        returns the result (or the decoded stored receipt on a replay)."""
        with self:
            if self.grant is None:
                return self.result  # type: ignore[no-any-return]
            return self.complete(fn(self.grant))

    def _ask(self) -> RequestTokenResult:
        request = self._request
        wait_deadline = time.monotonic() + self._options.wait_timeout
        backoff = _Backoff(self._options.retry_timeout)
        while True:
            try:
                return self._gate.request_token(
                    request.action,
                    request.params,
                    agent_id=request.scope.agent_id,
                    run_id=request.scope.run_id,
                    intent_id=request.intent_id,
                    idempotency_key=request.idempotency_key,
                    holder=self.holder,
                    lease_ttl=self._options.lease_ttl,
                )
            except InProgress as err:
                remaining = wait_deadline - time.monotonic()
                if remaining <= 0:
                    raise
                pause = self._options.poll_interval
                if err.retry_after is not None:
                    pause = min(pause, err.retry_after)
                time.sleep(max(0.01, min(pause, remaining)))
            except OncegateError as err:
                if not err.retryable or not backoff.sleep(err.retry_after):
                    raise

    def _release(self, reason: ReleaseReason) -> None:
        action, grant = self._granted()
        backoff = _Backoff(self._options.retry_timeout)
        while True:
            try:
                self._gate.release(action, grant.token, reason)
                return
            except OncegateError as err:
                if not err.retryable or not backoff.sleep(err.retry_after):
                    raise

    def _granted(self) -> tuple[ActionRef, Grant]:
        if self.action is None or self.grant is None:
            raise RuntimeError("the attempt holds no grant (not entered, or a replay)")
        return self.action, self.grant

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def _lease_seconds(self, grant: Grant) -> float | None:
        if self._options.lease_ttl is not None:
            return self._options.lease_ttl
        if grant.lease_expires_at is None:
            return None
        return max(1.0, (grant.lease_expires_at - datetime.now(timezone.utc)).total_seconds())

    def _check_hint(self, server_fingerprint: str) -> None:
        if self._key_fields_hint is None:
            return
        request = self._request
        try:
            local = fingerprint(request.action, request.params, request.intent_id, self._key_fields_hint)
        except ParamsError as err:
            local = f"(not computable: {err})"
        if local != server_fingerprint:
            logger.warning(
                "oncegate: the gate fingerprinted %s as %s, but key_fields_hint %s gives %s; the "
                "gate's policy for this action differs from the hint",
                request.action,
                server_fingerprint,
                list(self._key_fields_hint),
                local,
            )


def _is_definite(exc: Exception, definite: tuple[type[BaseException], ...]) -> bool:
    if isinstance(exc, DefiniteFailure):
        return True
    if isinstance(exc, OutcomeUnknown):
        # An unknown outcome (from a guard nested in the function) only became an OncegateError
        # when the exceptions got one root: `definite=(OncegateError,)` must not release after it.
        definite = tuple(cls for cls in definite if cls is not OncegateError)
    return isinstance(exc, definite)


def _reconcile_hint(grant: Grant) -> str:
    return (
        f"Reconcile with the provider using provider key {grant.provider_key!r}, then complete or "
        f"release token {grant.token!r} (fencing {grant.fencing})."
    )


def action(
    gate: Gate,
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
    scope falls back to :func:`scope`. A parameter named ``grant`` receives the
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
                _resolve_scope(fn, control.get("agent_id"), control.get("run_id")),
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


def _resolve_scope(fn: Callable[..., Any], agent_id: str | None, run_id: str | None) -> Scope:
    ambient = _current_scope.get()
    agent_id = agent_id or (ambient.agent_id if ambient else None)
    run_id = run_id or (ambient.run_id if ambient else None)
    if not agent_id or not run_id:
        raise TypeError(
            f"{fn.__qualname__}: no scope: pass agent_id= and run_id=, or call inside gate.scope(...)"
        )
    return Scope(agent_id, run_id)
