"""Celery: a task whose every delivery runs the action at most once.

::

    @guarded_task(app, "payments.transfer", gate=lambda: Gate(os.environ["ONCEGATE_TARGET"]))
    def transfer(invoice: str, amount: int, to: str, *, grant: Grant) -> dict:
        return bank.transfer(amount, to, idempotency_key=grant.provider_key)

The task acknowledges its message late and rejects it when its worker is lost (``acks_late``,
``reject_on_worker_lost``), so a task whose worker died is delivered again, to this worker or
another; the gate makes that redelivery safe. What each name means here:

- the scope: agent = ``agent_id`` (by default the app's name, else the task's name), run = the
  chain's root task id (a task alone is its own root);
- the key: the task id, the same on every delivery and every ``retry``;
- the params: the task's arguments, by parameter name (as the guard's decorator binds them); a
  parameter named ``grant`` receives the :class:`~oncegate.models.Grant`, never from the caller.

What the caller's ``AsyncResult`` sees: a replay returns the first delivery's result; in progress
elsewhere, the task retries itself after the gate's delay (``self.retry``, the same task id); an
earlier delivery's lease that ended with no outcome, or an operator's approval still pending,
retries after ``wait_delay`` until a resolver, an operator or an approver settles it; changed
arguments under one task id fail with :class:`~oncegate.errors.KeyReusedError` naming the fields;
an unknown outcome fails with :class:`~oncegate.errors.OutcomeUnknownError` naming the provider key
(``retry_unknown=True`` retries it instead, until settled). Retries of these kinds are unbounded
(``max_retries=None``): bound them with the task's ``expires`` or a time limit.

This module owns the mapping between Celery and the guard; the protocol is
:class:`~oncegate.guard.Attempt`'s. It needs ``celery`` (``pip install 'oncegate[celery]'``, which
brings ``redis`` for a Redis broker); the rest of the client does not import it.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery, Task

from oncegate.client import Gate
from oncegate.errors import (
    InProgressError,
    LeaseExpiredUnresolvedError,
    OutcomeUnknownError,
    PendingApprovalError,
)
from oncegate.guard import Attempt
from oncegate.guard.binding import Binding
from oncegate.guard.options import GuardOptions, Request
from oncegate.models import Scope

__all__ = ["GuardedTask", "guarded_task", "task_scope"]


class GuardedTask(Task):  # type: ignore[misc]
    """The base of a guarded task: acknowledged after it ran, and delivered again when its worker
    was lost (a SIGKILL, an OOM), which the gate then makes harmless."""

    acks_late = True
    reject_on_worker_lost = True


def task_scope(task: Task, agent_id: str) -> Scope:
    """The default scope: ``agent_id`` and the chain's root task id as the run."""
    request = task.request
    return Scope(agent_id, request.root_id or request.id)


class _GateOfProcess:
    """The gate client of this process: made on first use, again in a forked child (a gRPC
    channel does not survive a fork, and a prefork pool forks after the app is imported)."""

    def __init__(self, gate: Gate | Callable[[], Gate]) -> None:
        self._make = gate if callable(gate) and not isinstance(gate, Gate) else None
        self._given = gate if isinstance(gate, Gate) else None
        self._made: tuple[int, Gate] | None = None

    def __call__(self) -> Gate:
        if self._given is not None:
            return self._given
        assert self._make is not None
        if self._made is None or self._made[0] != os.getpid():
            self._made = (os.getpid(), self._make())
        return self._made[1]


def guarded_task(
    app: Celery,
    action: str,
    *,
    gate: Gate | Callable[[], Gate],
    agent_id: str | None = None,
    scope: Callable[[Task, str], Scope] = task_scope,
    key: Callable[[Task], str] = lambda task: str(task.request.id),
    options: GuardOptions | None = None,
    retry_unknown: bool = False,
    wait_delay: float = 30.0,
    key_fields_hint: Sequence[str] | None = None,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Task]:
    """A decorator making ``fn`` a task of ``app`` (``app.task(base=GuardedTask, ...)``) that runs
    the action ``action`` at most once per task id.

    Args:
        gate: The threaded client, or a function making it (made once per worker process: pass a
            function to a prefork worker, whose children must not share their parent's channel).
        agent_id: The agent; the app's name by default, else the task's name.
        scope: The scope of a delivery (default :func:`task_scope`).
        key: Its idempotency key (default: the task id).
        options: The guard's options; ``max_wait`` is 0 unless given (the task retries itself with
            the gate's delay instead of holding a worker).
        retry_unknown: Retry an unknown outcome (after ``wait_delay``) instead of failing.
        wait_delay: Seconds before retrying an unresolved or held action.
        task_options: Passed on to ``app.task`` (``name``, ``queue``, ``time_limit``...).
    """
    gate_of_process = _GateOfProcess(gate)
    guard_options = options or GuardOptions(max_wait=0)

    def decorate(fn: Callable[..., Any]) -> Task:
        binding = Binding(fn, action)

        @functools.wraps(fn)
        def run(self: Task, *args: Any, **kwargs: Any) -> Any:
            agent = agent_id or (app.main if app.main and app.main != "__main__" else self.name)
            call = binding.bind(args, kwargs, scope(self, agent))
            request = Request(action, call.request.params, call.request.scope, idempotency_key=key(self))
            attempt = Attempt(gate_of_process(), request, guard_options, key_fields_hint=key_fields_hint)
            try:
                return attempt.run(call.invoke)
            except InProgressError as err:
                delay = wait_delay if err.retry_after_ms is None else err.retry_after_ms / 1000
                raise self.retry(exc=err, countdown=delay, max_retries=None) from err
            except (LeaseExpiredUnresolvedError, PendingApprovalError) as err:
                raise self.retry(exc=err, countdown=wait_delay, max_retries=None) from err
            except OutcomeUnknownError as err:
                if retry_unknown:
                    raise self.retry(exc=err, countdown=wait_delay, max_retries=None) from err
                raise

        # Celery checks a call's arguments against this signature: the caller never passes grant.
        parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
        run.__signature__ = binding.signature.replace(  # type: ignore[attr-defined]
            parameters=[*parameters, *binding.signature.parameters.values()]
        )
        defaults = {"base": GuardedTask, "bind": True, "name": f"{fn.__module__}.{fn.__qualname__}"}
        return app.task(**{**defaults, **task_options})(run)  # type: ignore[no-any-return]

    return decorate
