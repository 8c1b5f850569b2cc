"""One guarded attempt on an event loop: ask for a token, let the body run the action, settle.

The asyncio twin of :class:`oncegate.guard.Attempt`, with the same protocol and the same decisions
(:mod:`oncegate.guard.protocol`): a replay returns the stored receipt without running anything; a
grant runs the body while a heartbeat task extends the lease; success Completes (retried until
acknowledged); a definite failure Releases; anything else never Releases and raises
:class:`~oncegate.errors.OutcomeUnknownError`; in progress elsewhere waits within ``max_wait``;
a reused key stops. Cancelling the task that runs the body (``asyncio.CancelledError``, a
``BaseException``) keeps the token, as ``KeyboardInterrupt`` does in the threaded guard.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from oncegate.aio.heartbeat import Heartbeat
from oncegate.errors import InProgressError, LeaseExpiredUnresolvedError, OncegateError, OutcomeUnknownError
from oncegate.guard import protocol
from oncegate.guard.backoff import Backoff
from oncegate.guard.hint import check_key_fields_hint
from oncegate.guard.options import GuardOptions, Request
from oncegate.models import ActionRef, Completion, Decision, Grant, ReleaseReason, RequestTokenResult

if TYPE_CHECKING:
    from oncegate.aio.rpc import GateRpc

__all__ = ["Attempt"]

T = TypeVar("T")


class Attempt:
    """One guarded attempt of one action, used as an ``async with`` block.

    Example::

        async with gate.attempt("payments.transfer", params, agent_id="a", run_id="r") as attempt:
            if not attempt.replayed:
                await attempt.complete(await provider.pay(**params, key=attempt.grant.provider_key))
            receipt = attempt.result

    Entering asks the gate for a token; leaving settles the attempt exactly as the threaded
    :class:`oncegate.guard.Attempt` does.
    """

    def __init__(
        self,
        gate: GateRpc,
        request: Request,
        options: GuardOptions,
        *,
        key_fields_hint: Sequence[str] | None = None,
    ) -> None:
        self._gate = gate
        self._request = request
        self._options = options
        self._key_fields_hint = key_fields_hint
        self._heartbeat: Heartbeat | None = None
        self._settled = False
        self.holder = options.holder or protocol.default_holder()
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

    async def __aenter__(self) -> Attempt:
        answer = await self._ask()
        self.action = answer.action
        self.fingerprint = answer.fingerprint
        if self._key_fields_hint is not None:
            check_key_fields_hint(self._request, self._key_fields_hint, answer.fingerprint)
        if answer.decision is Decision.PENDING_APPROVAL:
            self._settled = True
            raise protocol.pending_approval(self._request, answer)
        if answer.decision is Decision.ALREADY_COMPLETED:
            assert answer.completion is not None
            self.completion = answer.completion
            self.result = protocol.decode_replay(
                self._options, self._request, answer.action, answer.completion
            )
            self._settled = True
            return self
        assert answer.grant is not None
        self.grant = answer.grant
        ttl = protocol.lease_seconds(self._options, answer.grant)
        if self._options.heartbeat and ttl is not None:
            self._heartbeat = Heartbeat(self._gate, answer.action, answer.grant.token, ttl)
            self._heartbeat.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stop_heartbeat()
        if self._settled:
            return
        self._settled = True
        action, grant = self._granted()
        settled = protocol.settlement(exc, self._options.definite)
        if settled == "no_result":
            raise self._bound(protocol.no_result(self._request, action, grant))
        assert exc is not None
        if settled == "interrupted":
            protocol.log_interrupted(self._request, action, grant, exc)
            return
        if settled == "release":
            try:
                await self._release(ReleaseReason.DEFINITE_FAILURE)
            except OncegateError as err:
                protocol.log_release_failed(action, err)
            return
        raise self._bound(protocol.unknown_outcome(self._request, action, grant, exc)) from exc

    async def complete(self, result: T) -> T:
        """Records the action's result as its receipt and returns ``result``; retries transient
        failures until acknowledged or ``retry_timeout`` passes (then
        :class:`~oncegate.errors.CompleteUnacknowledgedError`)."""
        action, grant = self._granted()
        await self._stop_heartbeat()
        self._settled = True
        try:
            receipt = self._options.encode(result)
        except Exception as err:
            raise self._bound(protocol.encode_failed(self._request, action, grant, result, err)) from err
        backoff = Backoff(self._options.retry_timeout)
        while True:
            try:
                self.completion = await self._gate.complete(action, grant.token, receipt)
                break
            except OncegateError as err:
                if not err.retryable:
                    raise
                delay = backoff.next_delay(err.retry_after)
                if delay is None:
                    raise self._bound(
                        protocol.not_acknowledged(self._request, action, grant, result, receipt, err)
                    ) from err
                await asyncio.sleep(delay)
        self.result = result
        return result

    async def skip(self) -> None:
        """Gives the token back without running the action (``RELEASE_REASON_NOT_ATTEMPTED``)."""
        self._granted()
        await self._stop_heartbeat()
        self._settled = True
        await self._release(ReleaseReason.NOT_ATTEMPTED)

    async def run(self, fn: Callable[[Grant], Awaitable[T] | T]) -> T:
        """Enters the attempt, runs ``fn(grant)`` (awaited when it returns an awaitable) unless
        replayed, completes with its result, and returns it (or the decoded stored receipt)."""
        async with self:
            if self.grant is None:
                return self.result  # type: ignore[no-any-return]
            result = fn(self.grant)
            if inspect.isawaitable(result):
                result = await result
            return await self.complete(result)  # type: ignore[arg-type]

    async def _ask(self) -> RequestTokenResult:
        request = self._request
        wait_deadline = time.monotonic() + self._options.max_wait
        backoff = Backoff(self._options.retry_timeout)
        while True:
            try:
                return await self._gate.request_token(
                    request.action,
                    request.params,
                    agent_id=request.scope.agent_id,
                    run_id=request.scope.run_id,
                    intent_id=request.intent_id,
                    idempotency_key=request.idempotency_key,
                    holder=self.holder,
                    lease_ttl=self._options.lease_ttl,
                )
            except InProgressError as err:
                remaining = wait_deadline - time.monotonic()
                if remaining <= 0:
                    raise
                if err.retry_after is not None and err.retry_after > remaining:
                    # The lease outlasts the wait: fail now rather than at the end of it.
                    raise protocol.in_progress_beyond_wait(request, err, self._options.max_wait) from err
                await asyncio.sleep(protocol.in_progress_pause(self._options, err, remaining))
            except LeaseExpiredUnresolvedError as err:
                err.bind(self._gate, self._options.encode)
                raise
            except OncegateError as err:
                delay = backoff.next_delay(err.retry_after) if err.retryable else None
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    async def _release(self, reason: ReleaseReason) -> None:
        action, grant = self._granted()
        backoff = Backoff(self._options.retry_timeout)
        while True:
            try:
                await self._gate.release(action, grant.token, reason)
                return
            except OncegateError as err:
                delay = backoff.next_delay(err.retry_after) if err.retryable else None
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    def _bound(self, err: OutcomeUnknownError) -> OutcomeUnknownError:
        """``err``, able to settle its grant through this attempt's gate and encoder."""
        err.bind(self._gate, self._options.encode)
        return err

    def _granted(self) -> tuple[ActionRef, Grant]:
        if self.action is None or self.grant is None:
            raise RuntimeError("the attempt holds no grant (not entered, or a replay)")
        return self.action, self.grant

    async def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            await self._heartbeat.stop()
            self._heartbeat = None
