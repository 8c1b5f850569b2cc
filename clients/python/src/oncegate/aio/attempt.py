"""One guarded attempt: ask for a token, let the body run the action, settle what happened.

:class:`Attempt` follows the protocol described in :mod:`oncegate.guard`, over the RPC layer
(:class:`~oncegate.aio.rpc.GateRpc`) and nothing above it, with the decisions of
:mod:`oncegate.guard.protocol`: a replay returns the stored receipt without running anything; a
grant runs the body while the heartbeat extends the lease; success Completes (retried until
acknowledged); a definite failure Releases; anything else never Releases and raises
:class:`~oncegate.errors.OutcomeUnknownError`; in progress elsewhere waits within ``max_wait``; a
reused key stops. The decorator and the client only build attempts.

One source, two clients: ``oncegate/aio/attempt.py`` is written by hand, and ``generate_sync.py``
writes the threaded ``oncegate/guard/attempt.py`` from it with unasync (``tests/test_generated.py``
fails when they differ).
"""

from __future__ import annotations

import asyncio
import inspect  # async only
from collections.abc import Awaitable, Callable, Sequence
from time import monotonic
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

    Entering asks the gate for a token. Then either ``replayed`` is true, ``result`` is the decoded
    stored receipt and the action must not run; or ``grant`` is set, the lease is extended in the
    background, and the body runs the action and calls :meth:`complete` (or :meth:`skip`).

    Leaving the block settles the attempt: an exception marked definite releases the token and
    propagates; any other exception, or a block that ended without :meth:`complete` or
    :meth:`skip`, raises :class:`~oncegate.errors.OutcomeUnknownError` and leaves the token
    unreleased. ``KeyboardInterrupt``, ``asyncio.CancelledError`` and other non-``Exception``
    errors propagate unchanged, also without a release.

    Example::

        async with gate.attempt("payments.transfer", params, agent_id="a", run_id="r") as attempt:
            if not attempt.replayed:
                await attempt.complete(await provider.pay(**params, key=attempt.grant.provider_key))
            receipt = attempt.result
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
        self._first: RequestTokenResult | BaseException | None = None
        """The first RequestToken's answer or error, when the threaded guard's native loop
        (:mod:`oncegate.guard.runner`) asked already and hands the attempt over: taken as the
        first call's outcome instead of asking again."""
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
        """Records the action's result as its receipt and returns ``result``.

        Retries transient failures until the gate acknowledges or ``retry_timeout`` passes.

        Raises:
            CompleteUnacknowledgedError: the gate never acknowledged (or the result could not be
                encoded); it carries the result and the receipt to complete with later.
            OncegateError: the gate refused, e.g. :class:`~oncegate.errors.CompletedByOtherError`
                when another token already completed the action.
        """
        action, grant = self._granted()
        await self._stop_heartbeat()
        self._settled = True
        try:
            receipt = self._options.encode(result)
        except Exception as err:
            raise self._bound(protocol.encode_failed(self._request, action, grant, result, err)) from err
        return await self._acknowledged(result, receipt)

    async def _acknowledged(self, result: T, receipt: bytes, failed: OncegateError | None = None) -> T:
        """Completes with ``receipt`` until the gate acknowledges (see :meth:`complete`), and
        returns ``result``. ``failed`` is the first Complete's error when the threaded guard's
        native loop made that call: the retries carry on from it."""
        action, grant = self._granted()
        started = monotonic()
        backoff: Backoff | None = None  # made on the first failure: most calls never need one
        while True:
            try:
                if failed is not None:
                    first, failed = failed, None
                    raise first
                self.completion = await self._gate.complete(action, grant.token, receipt)
                break
            except OncegateError as err:
                if not err.retryable:
                    raise
                backoff = backoff or Backoff(self._options.retry_timeout, start=started)
                delay = backoff.next_delay(protocol.retry_seconds(err))
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
        """Enters the attempt, runs ``fn(grant)`` unless replayed, completes with its result, and
        returns the result (or the decoded stored receipt on a replay). With :mod:`oncegate.aio`,
        ``fn`` may also be a coroutine function: what it returns is awaited."""
        async with self:
            if self.grant is None:
                return self.result  # type: ignore[no-any-return]
            result = fn(self.grant)
            if inspect.isawaitable(result):  # async only
                result = await result  # async only
            return await self.complete(result)  # type: ignore[arg-type]

    async def _ask(self) -> RequestTokenResult:
        request = self._request
        started = monotonic()
        wait_deadline = started + self._options.max_wait
        backoff: Backoff | None = None  # made on the first failure: most calls never need one
        first, self._first = self._first, None
        while True:
            try:
                if first is not None:
                    answer, first = first, None
                    if isinstance(answer, BaseException):
                        raise answer
                    return answer
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
                remaining = wait_deadline - monotonic()
                if remaining <= 0:
                    raise
                wait = protocol.retry_seconds(err)
                if wait is not None and wait > remaining:
                    # The lease outlasts the wait: fail now rather than at the end of it.
                    raise protocol.in_progress_beyond_wait(request, err, self._options.max_wait) from err
                await asyncio.sleep(protocol.in_progress_pause(self._options, err, remaining))
            except LeaseExpiredUnresolvedError as err:
                err.bind(self._gate, self._options.encode)
                raise
            except OncegateError as err:
                if not err.retryable:
                    raise
                backoff = backoff or Backoff(self._options.retry_timeout, start=started)
                delay = backoff.next_delay(protocol.retry_seconds(err))
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
                delay = backoff.next_delay(protocol.retry_seconds(err)) if err.retryable else None
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
