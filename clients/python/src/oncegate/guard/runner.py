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
from oncegate.guard.binding import BoundCall
from oncegate.guard.heartbeat import keep_extending
from oncegate.guard.options import GuardOptions, Request
from oncegate.rpc import GateRpc
from oncegate.wire import nanoseconds

if TYPE_CHECKING:
    from oncegate.models import Grant

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

    def __call__(
        self, request: Request, invoke: Callable[[Grant], Any], call: BoundCall | None = None
    ) -> Any:
        """Runs ``invoke(grant)`` at most once for ``request`` and returns its result, or the
        decoded stored receipt on a replay, as :meth:`Attempt.run` does. ``call``, the decorated
        function's call that ``invoke`` belongs to, lets the native loop call the function itself."""
        channel = getattr(self._gate, "_native", None)
        if self._native is None or channel is None:
            return self._attempt(request).run(invoke)
        scope = request.scope
        holder = self._options.holder or protocol.default_holder()
        if call is not None and call.binding.plain:
            function, arguments, takes_grant = call.binding.fn, call.arguments, call.binding.takes_grant
        else:
            function, arguments, takes_grant = invoke, None, True
        ended = self._native.run(
            channel,
            self._gate.timeout,
            encode_params(request.params),
            scope.agent_id,
            scope.run_id,
            request.intent_id or "",
            request.idempotency_key or "",
            holder,
            function,
            arguments,
            takes_grant,
        )
        if ended[0] == _DONE:
            return ended[1]
        return self._hand_over(request, invoke, holder, ended)

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
