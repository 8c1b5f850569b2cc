"""The native core: the worker RPCs over ``oncegate._native`` (Rust, h2) instead of grpcio.

grpcio's cost per call is most of a guarded cycle's CPU; the native core does the same unary call
for a fraction of it. It moves bytes only: the requests are serialized and the responses parsed
here, with the generated messages, and a failed call raises :class:`NativeRpcError`, a
``grpc.RpcError`` that answers ``code()``, ``details()`` and ``trailing_metadata()`` as grpcio's
does, so :func:`oncegate.errors.from_rpc_error` reads both alike.

The stubs here (:class:`Stub`, :class:`AioStub`) are called as the generated grpcio stubs are
(``stub.RequestToken(request, timeout=..., metadata=...)``), so the RPC layer does not know which
one it calls through: the channels (:mod:`oncegate.channel`, :mod:`oncegate.aio.channel`) choose,
with :func:`endpoint`. A channel goes through grpcio when ``ONCEGATE_PURE_PYTHON=1`` is set, when
it has TLS credentials or gRPC channel options (the native core speaks plaintext HTTP/2 and knows
none of grpcio's options), or when its target is not ``host:port`` (a ``unix:`` socket, a grpcio
resolver scheme). The operator API (a resolver's calls, its stream) always goes through grpcio.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from oncegate.v1 import oncegate_pb2 as pb

__all__ = [
    "PURE_PYTHON",
    "AioStub",
    "NativeRpcError",
    "Stub",
    "enabled",
    "endpoint",
    "local_server",
    "open_channel",
]

PURE_PYTHON = "ONCEGATE_PURE_PYTHON"
"""The environment variable that, set to ``1``, sends every call through grpcio."""

if os.environ.get(PURE_PYTHON) == "1":
    _native: Any = None
else:
    try:
        from oncegate import _native
    except ImportError as err:  # a source tree used without building it, or a broken install
        raise ImportError(
            f"oncegate: the native core (oncegate._native) is missing: {err}. Install the package "
            f"(pip install builds it), or set {PURE_PYTHON}=1 to use grpcio alone."
        ) from err
    # A forked child inherits the parent's runtimes and connections without their threads.
    os.register_at_fork(after_in_child=_native.forked)

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

# host:port, [v6]:port, with grpcio's optional dns:/// prefix.
_HOST_PORT = re.compile(r"^(?:dns:///)?(?P<address>(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):\d+)$")


def enabled() -> bool:
    """Whether calls may go through the native core (``ONCEGATE_PURE_PYTHON`` is not ``1``)."""
    return _native is not None


def endpoint(target: str, credentials: grpc.ChannelCredentials | None, options: Sequence[Any]) -> str | None:
    """The ``http://`` address the native core connects to for a channel to ``target``, or
    ``None`` when that channel goes through grpcio (see the module's docstring for when)."""
    if _native is None or credentials is not None or options:
        return None
    match = _HOST_PORT.match(target)
    return f"http://{match['address']}" if match else None


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
    try:
        from oncegate import _native as extension
    except ImportError as err:
        raise ImportError(
            f"oncegate.local needs the native extension (oncegate._native), which is missing: {err}. "
            "Install the oncegate wheel, or run a gate with `oncegate serve` and connect with Gate(target)."
        ) from err
    return extension.LocalServer(list(flags), log)


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
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        done = functools.partial(loop.call_soon_threadsafe, _settle, future)
        call = self._channel.start(self._path, request.SerializeToString(), timeout, metadata or (), done)
        try:
            answer = await future
        except asyncio.CancelledError:
            call.cancel()
            raise
        return self._parse(answer)


def _settle(future: asyncio.Future[bytes], answer: bytes | BaseException) -> None:
    if future.done():  # cancelled while the answer was on its way
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)


class Stub:
    """The worker RPCs over one native channel, each called as the grpcio stub's is."""

    RequestToken: Callable[..., Any]
    Complete: Callable[..., Any]
    Release: Callable[..., Any]
    ExtendLease: Callable[..., Any]
    GetAction: Callable[..., Any]

    _method: type[_Unary] = _Unary

    def __init__(self, channel: Any) -> None:
        for name in _RESPONSES:
            setattr(self, name, self._method(channel, name))


class AioStub(Stub):
    """:class:`Stub` for an event loop: each call returns an awaitable."""

    RequestToken: Callable[..., Awaitable[Any]]
    Complete: Callable[..., Awaitable[Any]]
    Release: Callable[..., Awaitable[Any]]
    ExtendLease: Callable[..., Awaitable[Any]]
    GetAction: Callable[..., Awaitable[Any]]

    _method = _AioUnary
