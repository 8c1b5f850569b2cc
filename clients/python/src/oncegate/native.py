"""The native core: the worker RPCs over ``oncegate._native`` (Rust, h2) instead of grpcio.

grpcio's cost per call is most of a guarded cycle's CPU; the native core does the same unary call
for a fraction of it. The stubs here (:class:`Stub`, :class:`AioStub`) are called as the generated
grpcio stubs are (``stub.RequestToken(request, timeout=..., metadata=...)``, the request
serialized and the answer parsed here with the generated messages), and the RPC layer calls the
guard's hot RPCs (RequestToken, Complete, Release, ExtendLease) through their plain-value methods
instead (``stub.request_token(...)``): the native core builds the request and reads the answer
with the Rust messages, and the models are made here of the plain values it returns, with no
protobuf object in Python. A failed call raises :class:`NativeRpcError`, a ``grpc.RpcError`` that
answers ``code()``, ``details()`` and ``trailing_metadata()`` as grpcio's does, so
:func:`oncegate.errors.from_rpc_error` reads both alike.

The channels (:mod:`oncegate.channel`, :mod:`oncegate.aio.channel`) choose with
:func:`endpoint`. A channel goes through grpcio when ``ONCEGATE_PURE_PYTHON=1`` is set or the
package was installed without its native core (``clients/python/pure``), when it has TLS
credentials or gRPC channel options (the native core speaks plaintext HTTP/2 and knows none of
grpcio's options), or when its target is not ``host:port`` (a ``unix:`` socket, a grpcio resolver
scheme). The operator API (a resolver's calls, its stream) always goes through grpcio."""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import grpc

from oncegate import address
from oncegate.models import (
    ActionRef,
    Approval,
    Completion,
    CompletionSource,
    Decision,
    Grant,
    ReceiptFormat,
    RequestTokenResult,
    Scope,
    json_encode,
)
from oncegate.v1 import oncegate_pb2 as pb

__all__ = [
    "PURE_PYTHON",
    "AioStub",
    "NativeRpcError",
    "Stub",
    "enabled",
    "endpoint",
    "guard",
    "local_server",
    "open_channel",
]

_T = TypeVar("_T")

PURE_PYTHON = "ONCEGATE_PURE_PYTHON"
"""The environment variable that, set to ``1``, sends every call through grpcio."""

_native: Any = None
if os.environ.get(PURE_PYTHON) != "1":
    try:
        _native = importlib.import_module("oncegate._native")
    except ModuleNotFoundError as err:
        if err.name != "oncegate._native":
            raise
        # The package installed without its native core (clients/python/pure, which needs no
        # Rust toolchain): every channel goes through grpcio, as with ONCEGATE_PURE_PYTHON=1.
    except ImportError as err:  # the extension is there but does not load: a broken install
        raise ImportError(
            f"oncegate: the native core (oncegate._native) does not load: {err}. Install the package "
            f"again, or set {PURE_PYTHON}=1 to use grpcio alone."
        ) from err
if _native is not None:
    # A forked child inherits the parent's runtimes and connections without their threads.
    os.register_at_fork(after_in_child=_native.forked)
    # At exit, the native core's threads stop calling Python before the interpreter finalizes
    # (one that asks for the GIL then would abort the process).
    atexit.register(_native.exiting)

_forks_followed = False
"""Whether :func:`local_server` registered the extension's fork hook (only needed when the
channels' import did not: under ``ONCEGATE_PURE_PYTHON``)."""

_SERVICE = "/oncegate.v1.ActionGateService/"

_RESPONSES: dict[str, Callable[[bytes], Any]] = {
    "RequestToken": pb.RequestTokenResponse.FromString,
    "Complete": pb.CompleteResponse.FromString,
    "Release": pb.ReleaseResponse.FromString,
    "ExtendLease": pb.ExtendLeaseResponse.FromString,
    "GetAction": pb.GetActionResponse.FromString,
}
"""The worker RPCs (every RPC of :class:`~oncegate.rpc.GateRpc`) and how to read their answers."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}



def enabled() -> bool:
    """Whether calls may go through the native core (it is installed and ``ONCEGATE_PURE_PYTHON``
    is not ``1``)."""
    return _native is not None


def endpoint(target: str, credentials: grpc.ChannelCredentials | None, options: Sequence[Any]) -> str | None:
    """The ``http://`` address the native core connects to for a channel to ``target``, or
    ``None`` when that channel goes through grpcio (see the module's docstring for when)."""
    if _native is None or credentials is not None or options:
        return None
    try:
        read = address.parse(target)
    except ValueError:
        return None
    if read.kind == "resolver" and read.target.startswith("dns:///"):
        try:  # grpcio's DNS resolver on one host:port: the same connection, made natively
            read = address.parse(read.target[len("dns:///") :])
        except ValueError:
            return None
    return f"http://{read.target}" if read.kind == "tcp" else None


class NativeRpcError(grpc.RpcError):
    """A native call that failed, read as grpcio's failed call: its status ``code()``, its
    ``details()`` (the status message) and its ``trailing_metadata()`` (the rich status as
    ``grpc-status-details-bin``, when the server sent one)."""

    def __init__(self, code: int, message: str, details: bytes) -> None:
        super().__init__(message)
        self._code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
        self._message = message
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return (("grpc-status-details-bin", self._details),) if self._details else ()

    def __str__(self) -> str:
        return f"{self._code.name}: {self._message}"


def local_server(flags: Sequence[str], log: str | None) -> Any:
    """The gate server in this process (``oncegate._native.LocalServer``, for
    :mod:`oncegate.local_gate`), started with ``oncegate serve``'s ``flags``. Loaded whatever
    ``ONCEGATE_PURE_PYTHON`` says: it is the gate itself, not a transport (its clients may still
    call it through grpcio)."""
    global _forks_followed
    try:
        from oncegate import _native as extension
    except ImportError as err:
        raise ImportError(
            f"oncegate.local needs the native extension (oncegate._native), which is missing: {err}. "
            "Install the package with its native core (the oncegate wheel, or pip install ./clients/python), "
            "or run a gate with `oncegate serve` and connect with Gate(target)."
        ) from err
    if _native is None and not _forks_followed:
        # Under ONCEGATE_PURE_PYTHON the import above did not register them: a forked child must
        # know that the server (its threads) is the parent's, and exiting must be announced.
        os.register_at_fork(after_in_child=extension.forked)
        atexit.register(extension.exiting)
        _forks_followed = True
    return extension.LocalServer(list(flags), log)


def guard(
    action: str,
    lease_ttl: int | None,
    heartbeat: bool,
    metadata: Sequence[tuple[str, str]],
    encode: Callable[[Any], bytes],
    heartbeat_failed: Callable[[str, BaseException], bool],
) -> Any:
    """The native guard loop of one decorated function (``oncegate._native.Guard``, for
    :mod:`oncegate.guard.runner`): ``lease_ttl`` in nanoseconds, ``heartbeat_failed(key, error)``
    whether to keep extending a lease after a failed extension. Its grants are :class:`Grant`
    models made as this module makes them."""
    return _native.Guard(
        action,
        lease_ttl,
        heartbeat,
        list(metadata),
        encode,
        encode is json_encode,
        Grant,
        _EPOCH,
        heartbeat_failed,
    )


def open_channel(uri: str, timeout: float) -> Any:
    """A native channel to ``uri`` (connected on its first call; ``timeout`` bounds connecting)."""
    return _native.Channel(uri, timeout, NativeRpcError)


class _Unary:
    """One worker RPC over a native channel, blocking (the GIL released while it waits)."""

    __slots__ = ("_channel", "_parse", "_path")

    def __init__(self, channel: Any, name: str) -> None:
        self._channel = channel
        self._path = _SERVICE + name
        self._parse = _RESPONSES[name]

    def __call__(
        self, request: Any, timeout: float | None = None, metadata: Sequence[tuple[str, str]] | None = None
    ) -> Any:
        answer = self._channel.call(self._path, request.SerializeToString(), timeout, metadata or ())
        return self._parse(answer)


class _AioUnary(_Unary):
    """One worker RPC over a native channel, awaited: the native core's thread answers through
    the running loop's ``call_soon_threadsafe``."""

    __slots__ = ()

    async def __call__(  # type: ignore[override]
        self, request: Any, timeout: float | None = None, metadata: Sequence[tuple[str, str]] | None = None
    ) -> Any:
        answer = await _started(
            self._channel.start, (self._path, request.SerializeToString()), timeout, metadata
        )
        return self._parse(answer)


async def _started(
    start: Callable[..., Any],
    fields: tuple[Any, ...],
    timeout: float | None,
    metadata: Sequence[tuple[str, str]] | None,
) -> Any:
    """What ``start(*fields, timeout, metadata, done)`` answers through ``done``, awaited;
    cancelling the awaiting task drops the call."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    done = functools.partial(loop.call_soon_threadsafe, _settle, future)
    call = start(*fields, timeout, metadata or (), done)
    try:
        return await future
    except asyncio.CancelledError:
        call.cancel()
        raise


def _settle(future: asyncio.Future[bytes], answer: bytes | BaseException) -> None:
    if future.done():  # cancelled while the answer was on its way
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)


class Stub:
    """The worker RPCs over one native channel, each called as the grpcio stub's is, and the hot
    ones with plain values (:meth:`request_token`, :meth:`complete`, :meth:`release`,
    :meth:`extend_lease`), answered with the models."""

    RequestToken: Callable[..., Any]
    Complete: Callable[..., Any]
    Release: Callable[..., Any]
    ExtendLease: Callable[..., Any]
    GetAction: Callable[..., Any]

    _method: type[_Unary] = _Unary

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        for name in _RESPONSES:
            setattr(self, name, self._method(channel, name))

    def request_token(
        self,
        action: str,
        params_json: str,
        agent_id: str,
        run_id: str,
        intent_id: str,
        idempotency_key: str,
        holder: str,
        lease_ttl: int | None,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> RequestTokenResult:
        """RequestToken (empty strings are unset fields; ``lease_ttl`` in nanoseconds)."""
        return request_token_result(
            _native.request_token(
                self._channel,
                action,
                params_json,
                agent_id,
                run_id,
                intent_id,
                idempotency_key,
                holder,
                lease_ttl,
                timeout,
                metadata,
            )
        )

    def complete(
        self,
        action: ActionRef,
        token: str,
        receipt: bytes,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> Completion:
        """Complete: the stored completion."""
        scope = action.scope
        return _completion(
            _native.complete(
                self._channel, scope.agent_id, scope.run_id, action.key, token, receipt, timeout, metadata
            )
        )

    def release(
        self,
        action: ActionRef,
        token: str,
        reason: int,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> int:
        """Release: the released grant's fencing."""
        scope = action.scope
        fencing: int = _native.release(
            self._channel, scope.agent_id, scope.run_id, action.key, token, reason, timeout, metadata
        )
        return fencing

    def extend_lease(
        self,
        action: ActionRef,
        token: str,
        ttl: int,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> datetime:
        """ExtendLease by ``ttl`` nanoseconds: the new lease end."""
        scope = action.scope
        stamp = _native.extend_lease(
            self._channel, scope.agent_id, scope.run_id, action.key, token, ttl, timeout, metadata
        )
        return _EPOCH if stamp is None else _time(stamp)


class AioStub(Stub):
    """:class:`Stub` for an event loop: each call returns an awaitable."""

    RequestToken: Callable[..., Awaitable[Any]]
    Complete: Callable[..., Awaitable[Any]]
    Release: Callable[..., Awaitable[Any]]
    ExtendLease: Callable[..., Awaitable[Any]]
    GetAction: Callable[..., Awaitable[Any]]

    _method = _AioUnary

    async def request_token(  # type: ignore[override]
        self,
        action: str,
        params_json: str,
        agent_id: str,
        run_id: str,
        intent_id: str,
        idempotency_key: str,
        holder: str,
        lease_ttl: int | None,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> RequestTokenResult:
        fields = (
            self._channel,
            action,
            params_json,
            agent_id,
            run_id,
            intent_id,
            idempotency_key,
            holder,
            lease_ttl,
        )
        return request_token_result(await _started(_native.request_token, fields, timeout, metadata))

    async def complete(  # type: ignore[override]
        self,
        action: ActionRef,
        token: str,
        receipt: bytes,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> Completion:
        scope = action.scope
        fields = (self._channel, scope.agent_id, scope.run_id, action.key, token, receipt)
        return _completion(await _started(_native.complete, fields, timeout, metadata))

    async def release(  # type: ignore[override]
        self,
        action: ActionRef,
        token: str,
        reason: int,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> int:
        scope = action.scope
        fields = (self._channel, scope.agent_id, scope.run_id, action.key, token, reason)
        fencing: int = await _started(_native.release, fields, timeout, metadata)
        return fencing

    async def extend_lease(  # type: ignore[override]
        self,
        action: ActionRef,
        token: str,
        ttl: int,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> datetime:
        scope = action.scope
        fields = (self._channel, scope.agent_id, scope.run_id, action.key, token, ttl)
        stamp = await _started(_native.extend_lease, fields, timeout, metadata)
        return _EPOCH if stamp is None else _time(stamp)


# The models of the plain values the native core answers with (see clients/python/native/src/
# worker.rs for their order), as the models' from_proto makes them of the messages.

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _time(stamp: tuple[int, int] | None) -> datetime | None:
    """A Timestamp's ``(seconds, nanos)`` as an aware UTC datetime, as the models read it."""
    if stamp is None:
        return None
    return _EPOCH + timedelta(0, stamp[0], stamp[1] // 1000)  # positional: half the cost of keywords


# Each enum's members by number: a lookup, where calling the enum goes through its metaclass's
# Python code. A number the enum does not know still raises as the call does.
_DECISIONS: dict[int, Decision] = {int(member): member for member in Decision}
_SOURCES: dict[int, CompletionSource] = {int(member): member for member in CompletionSource}
_FORMATS: dict[int, ReceiptFormat] = {int(member): member for member in ReceiptFormat}


def _made(cls: type[_T], fields: dict[str, Any]) -> _T:
    """The frozen dataclass ``cls`` with ``fields`` (each of its fields), equal to what its
    ``__init__`` makes, for a fraction of the cost: that ``__init__`` sets each field through
    ``object.__setattr__``, about half of a model's cost here. The models made this way have no
    ``__post_init__`` and no field defaults that are computed; tests/test_native.py checks that
    each one equals the one its ``__init__`` makes."""
    made = _new(cls)
    made.__dict__.update(fields)
    return made


_new = object.__new__


def _completion(fields: tuple[Any, ...]) -> Completion:
    receipt, completed_at, fencing, token, source, operator, receipt_format = fields
    return _made(
        Completion,
        {
            "receipt": receipt,
            "completed_at": _time(completed_at),
            "fencing": fencing,
            "token": token,
            "source": _SOURCES[source] if source in _SOURCES else CompletionSource(source),
            "operator": operator,
            "receipt_format": _FORMATS[receipt_format]
            if receipt_format in _FORMATS
            else ReceiptFormat(receipt_format),
        },
    )


def request_token_result(fields: tuple[Any, ...]) -> RequestTokenResult:
    decision, agent_id, run_id, key, fingerprint, grant, completion, redelivered, approval = fields
    scope = _made(Scope, {"agent_id": agent_id, "run_id": run_id})
    return _made(
        RequestTokenResult,
        {
            "decision": _DECISIONS[decision] if decision in _DECISIONS else Decision(decision),
            "action": _made(ActionRef, {"scope": scope, "key": key}),
            "fingerprint": fingerprint,
            "grant": None
            if grant is None
            else _made(
                Grant,
                {
                    "token": grant[0],
                    "fencing": grant[1],
                    "lease_expires_at": _time(grant[2]),
                    "provider_key": grant[3],
                    "statement": grant[4],
                },
            ),
            "completion": None if completion is None else _completion(completion),
            "redelivered": redelivered,
            "approval": None
            if approval is None
            else Approval(approval[0], _time(approval[1]), approval[2], approval[3]),
        },
    )
