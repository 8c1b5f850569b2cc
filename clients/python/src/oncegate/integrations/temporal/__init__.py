"""Temporal: a worker interceptor that runs each side-effecting activity at most once.

::

    @activity.defn
    @side_effect("payments.transfer")
    async def transfer(invoice: Invoice) -> Receipt:
        grant = current_grant()
        return await bank.transfer(invoice, idempotency_key=grant.provider_key)

    worker = Worker(client, task_queue="billing", activities=[transfer],
                    interceptors=[OncegateInterceptor(gate)])

Temporal retries an activity whose worker died, timed out or missed a heartbeat; the interceptor
turns each retry of a guarded activity into a question to the gate. What each name means here:

- the scope: agent = the workflow id, run = the workflow's run id (``scope=`` changes it: e.g. the
  workflow id alone as the run, so that a reset workflow replays what its first run did);
- the key: the activity id (never the attempt number), so attempt 2 of an activity whose attempt
  1 completed replays attempt 1's result without running; under one activity id, changed input is
  refused (``IDEMPOTENCY_KEY_REUSED``);
- the params: the activity's arguments through the worker's payload converter (one argument that
  converts to a JSON object is the params, several are ``{"args": [...]}``);
- the lease: when the activity has a heartbeat timeout, the lease is that timeout and each
  ``activity.heartbeat()`` extends it (so the lease ends when Temporal gives up on the attempt);
  otherwise the guard's own heartbeat keeps it while the worker lives.

What the workflow sees (an ``ActivityError`` whose cause is an ``ApplicationError`` of these types,
its one detail a dict naming agent, run, key and provider key, never the token):

- ``OncegateKeyReused``, non-retryable, naming the fields that differ;
- ``OncegateInProgress``, retryable after the gate's delay (``next_retry_delay``);
- ``OncegateOutcomeUnknown``, non-retryable, naming the provider key: reconcile, then run the
  activity again under the same ``activity_id`` and it replays (``retry_unknown=True`` makes it
  retryable instead);
- ``OncegateUnresolved`` (an earlier attempt's lease ended with no outcome) and
  ``OncegatePendingApproval``, retryable after ``wait_delay``: a resolver, an operator or an
  approver settles it, and the next attempt replays or runs;
- a failure the activity marks definite (``options=GuardOptions(definite=...)``) releases the token
  and is raised as the activity raised it; any other refusal keeps its class name in the type.

This module owns the mapping between Temporal and the guard; the protocol is
:class:`~oncegate.aio.attempt.Attempt`'s, never a second one. It needs ``temporalio``
(``pip install 'oncegate[temporal]'``); the rest of the client does not import it.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import temporalio.activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from oncegate.aio.attempt import Attempt
from oncegate.aio.client import Gate
from oncegate.errors import DefiniteFailureError, OncegateError
from oncegate.guard.options import GuardOptions, Request
from oncegate.integrations.temporal.failures import application_error
from oncegate.integrations.temporal.payloads import encode_receipt, params_of, replace_options, replayed
from oncegate.models import Grant, Scope

__all__ = [
    "OncegateInterceptor",
    "activity_key",
    "current_grant",
    "side_effect",
    "workflow_scope",
]

F = TypeVar("F", bound=Callable[..., Any])

_ACTION = "__oncegate_action__"
_grant: contextvars.ContextVar[Grant | None] = contextvars.ContextVar("oncegate_temporal_grant", default=None)


def side_effect(action: str) -> Callable[[F], F]:
    """Marks an activity function as side-effecting: the interceptor guards it as ``action``."""

    def mark(fn: F) -> F:
        setattr(fn, _ACTION, action)
        return fn

    return mark


def current_grant() -> Grant:
    """The grant of the guarded activity running now: pass its ``provider_key`` to the provider."""
    grant = _grant.get()
    if grant is None:
        raise RuntimeError("oncegate: no guarded activity is running here (mark it with @side_effect)")
    return grant


def workflow_scope(info: temporalio.activity.Info) -> Scope:
    """The default scope: the workflow id as the agent, its run id as the run."""
    return Scope(info.workflow_id or info.activity_type, info.workflow_run_id or info.activity_id)


def activity_key(info: temporalio.activity.Info) -> str:
    """The default idempotency key: the activity id, the same on every attempt."""
    return info.activity_id


class OncegateInterceptor(Interceptor):
    """A worker interceptor guarding the activities marked with :func:`side_effect`, or named in
    ``activities`` (activity type → action name; a plain list uses the type as the action).

    Args:
        gate: The asyncio client (:class:`oncegate.aio.Gate`); a worker runs its activities'
            interceptors on its event loop.
        activities: Activity types to guard besides the marked ones.
        scope: The scope of an activity (default :func:`workflow_scope`).
        key: Its idempotency key (default :func:`activity_key`).
        options: The guard's options; ``max_wait`` is 0 unless given (Temporal waits, with the
            gate's delay, instead of a worker slot).
        retry_unknown: Make ``OncegateOutcomeUnknown`` retryable after the rest of the lease.
        wait_delay: The retry delay of ``OncegateUnresolved`` and ``OncegatePendingApproval``.
        key_fields_hint: As :func:`oncegate.aio.Gate.action`'s.
    """

    def __init__(
        self,
        gate: Gate,
        *,
        activities: Mapping[str, str] | Iterable[str] = (),
        scope: Callable[[temporalio.activity.Info], Scope] = workflow_scope,
        key: Callable[[temporalio.activity.Info], str] = activity_key,
        options: GuardOptions | None = None,
        retry_unknown: bool = False,
        wait_delay: timedelta = timedelta(seconds=30),
        key_fields_hint: Sequence[str] | None = None,
    ) -> None:
        self.gate = gate
        named = activities if isinstance(activities, Mapping) else {name: name for name in activities}
        self.activities: dict[str, str] = dict(named)
        self.scope = scope
        self.key = key
        self.options = options or GuardOptions(max_wait=0)
        self.retry_unknown = retry_unknown
        self.wait_delay = wait_delay
        self.key_fields_hint = key_fields_hint

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self)

    def action_of(self, fn: Callable[..., Any], info: temporalio.activity.Info) -> str | None:
        """The action an activity is guarded as, or ``None`` when it is not guarded."""
        return getattr(fn, _ACTION, None) or self.activities.get(info.activity_type)


class _Lease:
    """The lease of the attempt running now, extended on the activity's heartbeats (at most once a
    third of the lease: an activity may heartbeat far more often)."""

    def __init__(self, gate: Gate, attempt: Attempt, ttl: float) -> None:
        self._gate = gate
        self._attempt = attempt
        self._ttl = ttl
        self._last = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self.extended = 0
        """How many extensions the gate acknowledged."""

    def beat(self) -> None:
        if time.monotonic() - self._last < self._ttl / 3 or self._attempt.grant is None:
            return
        self._last = time.monotonic()
        task = asyncio.get_running_loop().create_task(self._extend())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _extend(self) -> None:
        action, grant = self._attempt.action, self._attempt.grant
        assert action is not None and grant is not None
        try:
            await self._gate.extend_lease(action, grant.token, self._ttl)
            self.extended += 1
        except OncegateError as err:
            temporalio.activity.logger.warning(
                "oncegate: extending the lease of %s failed: %s", action.key, err
            )

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class _Outbound(ActivityOutboundInterceptor):
    def __init__(self, next: ActivityOutboundInterceptor) -> None:
        super().__init__(next)
        self.lease: _Lease | None = None

    def heartbeat(self, *details: Any) -> None:
        self.next.heartbeat(*details)
        if self.lease is not None:
            self.lease.beat()


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, root: OncegateInterceptor) -> None:
        super().__init__(next)
        self._root = root
        self._outbound: _Outbound | None = None

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self._outbound = _Outbound(outbound)
        super().init(self._outbound)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = temporalio.activity.info()
        action = self._root.action_of(input.fn, info)
        if action is None:
            return await self.next.execute_activity(input)
        root = self._root
        converter = temporalio.activity.payload_converter()
        options = root.options
        if info.heartbeat_timeout:
            # Temporal's heartbeats say whether the attempt lives: the lease follows them.
            ttl = options.lease_ttl or max(1.0, info.heartbeat_timeout.total_seconds())
            options = replace_options(options, lease_ttl=ttl, heartbeat=False)
        options = replace_options(options, encode=lambda r: encode_receipt(converter, r), decode=bytes)
        request = Request(
            action, params_of(converter, input.args), root.scope(info), idempotency_key=root.key(info)
        )
        attempt = Attempt(root.gate, request, options, key_fields_hint=root.key_fields_hint)
        try:
            async with attempt:
                if attempt.replayed:
                    return replayed(converter, attempt, input.fn)
                assert attempt.grant is not None
                lease = None
                if info.heartbeat_timeout and self._outbound is not None:
                    lease = _Lease(root.gate, attempt, options.lease_ttl or 1.0)
                    self._outbound.lease = lease
                token = _grant.set(attempt.grant)
                try:
                    result = await self.next.execute_activity(input)
                finally:
                    _grant.reset(token)
                    if lease is not None:
                        self._outbound.lease = None  # type: ignore[union-attr]
                        await lease.stop()
                return await attempt.complete(result)
        except DefiniteFailureError:
            raise  # released: the action had no effect, and Temporal's retry policy decides
        except OncegateError as err:
            raise application_error(err, request, root.retry_unknown, root.wait_delay) from err
