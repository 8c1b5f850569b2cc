"""How the threaded guard runs a call of a decorated function or of :meth:`Gate.run`: the
common case as one call into the native core.

On a native channel (:mod:`oncegate.native`) such a call is one call of
``oncegate._native.Guard.run`` (``clients/python/native/src/guard.rs``): RequestToken, the
function run with its grant while a native heartbeat extends the lease, the result encoded by the
guard's encoder, Complete, and the result returned, with no model of the answers, no
:class:`~oncegate.guard.attempt.Attempt` and no Python heartbeat made on the way. Anything else is
handed to an :class:`~oncegate.guard.attempt.Attempt` with what happened so far, and it carries on
exactly as if it had made those calls itself:

- the gate did not grant (a replay, an approval to wait for): its answer is the attempt's first;
- RequestToken failed: its error is the attempt's first call's (waiting or retrying as it says);
- the function raised: the attempt settles it as a ``with`` block left with that exception;
- the result could not be encoded, or Complete failed: as :meth:`Attempt.complete` after that step.

Every call goes through the ``Attempt`` alone on grpcio (TLS, channel options,
``ONCEGATE_PURE_PYTHON=1``), with a ``key_fields_hint`` (it needs the answer's fingerprint), and
on a gate whose worker RPCs are not :class:`~oncegate.rpc.GateRpc`'s own (a subclass or a test
double that overrides them when the function is decorated). The asyncio decorator's twin is
:mod:`oncegate.aio.runner`; :meth:`Gate.attempt`, a ``with`` block, is always an ``Attempt``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from oncegate import native
from oncegate.errors import OncegateError
from oncegate.fingerprints import encode_params
from oncegate.guard import protocol
from oncegate.guard.attempt import Attempt
from oncegate.guard.binding import Binding, BoundCall
from oncegate.guard.heartbeat import keep_extending
from oncegate.guard.options import GuardOptions, Request
from oncegate.rpc import GateRpc
from oncegate.wire import nanoseconds

if TYPE_CHECKING:
    from oncegate.models import Grant, Scope

__all__ = ["Runner"]

# How a native call ended: the first item of what Guard.run answers (guard.rs's `ended`).
_DONE, _ANSWERED, _ASK_FAILED, _RAISED, _UNENCODED = 0, 1, 2, 3, 4

_WORKER_RPCS = ("request_token", "complete", "release", "extend_lease")


class Runner:
    """Runs the calls of one action (a decorated function's, or :meth:`Gate.run`'s) through
    ``gate`` with ``options``."""

    __slots__ = ("_gate", "_key_fields_hint", "_native", "_options")

    def __init__(
        self,
        gate: GateRpc,
        action: str,
        options: GuardOptions,
        key_fields_hint: Sequence[str] | None,
    ) -> None:
        self._gate = gate
        self._options = options
        self._key_fields_hint = key_fields_hint
        self._native: Any = None
        if key_fields_hint is None and native.enabled() and _own_rpcs(gate):
            lease_ttl = options.lease_ttl
            self._native = native.guard(
                action,
                None if lease_ttl is None else nanoseconds(lease_ttl),
                options.heartbeat,
                gate._metadata,
                options.encode,
                functools.partial(_extension_failed, gate),
            )

    def call(self, binding: Binding, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Runs one call of a decorated function (``binding``'s, with ``args`` and ``kwargs``) at
        most once, as :meth:`Attempt.run` does; the native loop calls the function itself with
        its keywords, and the request is made only when the call is handed over."""
        channel = getattr(self._gate, "_native", None)
        if self._native is None or channel is None or not binding.plain:
            call = binding.bind(args, kwargs)
            return self(call.request, call.invoke)
        params, scope, intent_id, idempotency_key, arguments = binding.parts(args, kwargs)
        holder = self._options.holder or protocol.default_holder()
        ended = self._natively(
            channel,
            params,
            scope,
            intent_id,
            idempotency_key,
            holder,
            binding.fn,
            arguments,
            binding.takes_grant,
        )
        if ended[0] == _DONE:
            return ended[1]
        call = BoundCall(binding, Request(binding.name, params, scope, intent_id, idempotency_key), arguments)
        return self._hand_over(call.request, call.invoke, holder, ended)

    def __call__(self, request: Request, invoke: Callable[[Grant], Any]) -> Any:
        """Runs ``invoke(grant)`` at most once for ``request`` and returns its result, or the
        decoded stored receipt on a replay, as :meth:`Attempt.run` does."""
        channel = getattr(self._gate, "_native", None)
        if self._native is None or channel is None:
            return self._attempt(request).run(invoke)
        holder = self._options.holder or protocol.default_holder()
        ended = self._natively(
            channel,
            request.params,
            request.scope,
            request.intent_id,
            request.idempotency_key,
            holder,
            invoke,
            None,
            True,
        )
        if ended[0] == _DONE:
            return ended[1]
        return self._hand_over(request, invoke, holder, ended)

    def _natively(
        self,
        channel: Any,
        params: dict[str, Any],
        scope: Scope,
        intent_id: str | None,
        idempotency_key: str | None,
        holder: str,
        function: Callable[..., Any],
        arguments: dict[str, Any] | None,
        takes_grant: bool,
    ) -> tuple[Any, ...]:
        """One native call (see the module's docstring): how it ended, as guard.rs answers."""
        ended: tuple[Any, ...] = self._native.run(
            channel,
            self._gate.timeout,
            encode_params(params),
            scope.agent_id,
            scope.run_id,
            intent_id or "",
            idempotency_key or "",
            holder,
            function,
            arguments,
            takes_grant,
        )
        return ended

    def _attempt(self, request: Request) -> Attempt:
        return Attempt(self._gate, request, self._options, key_fields_hint=self._key_fields_hint)

    def _hand_over(
        self, request: Request, invoke: Callable[[Grant], Any], holder: str, ended: tuple[Any, ...]
    ) -> Any:
        """Carries on through an :class:`Attempt` from where the native call stopped."""
        attempt = self._attempt(request)
        attempt.holder = holder
        how = ended[0]
        if how == _ANSWERED:
            attempt._first = native.request_token_result(ended[1])
            return attempt.run(invoke)
        if how == _ASK_FAILED:
            attempt._first = _raised(self._gate, ended[1])
            return attempt.run(invoke)
        answer = native.request_token_result(ended[1])
        made: Grant | None = ended[2]
        attempt.action, attempt.fingerprint = answer.action, answer.fingerprint
        attempt.grant = made if made is not None else answer.grant
        if how == _RAISED:
            error: BaseException = ended[3]
            try:
                raise error
            except BaseException as exc:
                # What leaving `with attempt:` with it does: release, or raise the unknown outcome.
                attempt.__exit__(type(exc), exc, exc.__traceback__)
                raise
        attempt._settled = True
        result = ended[3]
        if how == _UNENCODED:
            assert attempt.action is not None and attempt.grant is not None
            cause: Exception = ended[4]
            raise attempt._bound(
                protocol.encode_failed(request, attempt.action, attempt.grant, result, cause)
            ) from cause
        failed = _raised(self._gate, ended[5])
        if not isinstance(failed, OncegateError):
            raise failed
        return attempt._acknowledged(result, ended[4], failed)


def _raised(gate: GateRpc, err: BaseException) -> BaseException:
    """What the RPC layer raises for a call that failed with ``err`` on the native channel."""
    if not isinstance(err, grpc.RpcError):
        return err
    error = gate._failure(err)
    error.__cause__ = err
    error.__suppress_context__ = True
    return error


def _extension_failed(gate: GateRpc, key: str, err: BaseException) -> bool:
    """The native heartbeat's question after a failed extension: the Python heartbeat's answer,
    of the error the RPC layer would have raised."""
    return keep_extending(key, _raised(gate, err))


def _own_rpcs(gate: GateRpc) -> bool:
    """Whether ``gate``'s worker RPCs are :class:`GateRpc`'s own, which the native loop makes
    itself (it would bypass an override)."""
    if not isinstance(gate, GateRpc):
        return False
    overridden = vars(gate) if hasattr(gate, "__dict__") else {}
    return all(
        getattr(type(gate), name) is getattr(GateRpc, name) and name not in overridden
        for name in _WORKER_RPCS
    )
