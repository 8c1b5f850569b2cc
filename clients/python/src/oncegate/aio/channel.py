"""The asyncio client's channel to one gate, opened on first use inside the event loop that uses
it, closed by ``await close()`` or by leaving an ``async with`` block.

It owns the channel, its stub, and the deadline and metadata every call carries; the calls are
:class:`~oncegate.aio.rpc.GateRpc`'s, which builds on it. The worker RPCs go through the native
core (:mod:`oncegate.native`) unless it does not serve this channel (TLS, gRPC options, a
``unix:`` target, ``ONCEGATE_PURE_PYTHON=1``), and then through a ``grpc.aio`` channel; the
operator API (a resolver's) always through a ``grpc.aio`` channel. A ``grpc.aio`` channel belongs
to one loop, and so, to behave alike on both, does this one: a client must not be shared between
loops (each ``asyncio.run`` needs its own). This is what differs in kind between an event loop and
threads, so it is written by hand for each (:mod:`oncegate.channel`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from oncegate import address, native
from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub, GateAdminServiceStub
from oncegate.wire import call_metadata, channel_options

__all__ = ["Channel", "channel_options", "within"]


_T = TypeVar("_T")


async def within(seconds: float, function: Callable[[_T], Any], value: _T) -> Any:
    """``function(value)``, awaited when it returns an awaitable, within ``seconds``
    (:class:`TimeoutError` past them). A resolver's lookup runs this way; the threaded twin
    (:func:`oncegate.channel.within`) runs it on a thread."""
    result = function(value)
    if inspect.isawaitable(result):
        return await asyncio.wait_for(result, seconds)
    return result


_Self = TypeVar("_Self", bound="Channel")


class Channel:
    """One channel to one gate (see :class:`~oncegate.aio.rpc.GateRpc` for the arguments)."""

    def __init__(
        self,
        target: str | None = None,
        *,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 10.0,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if target is None:
            target = address.from_environment()
        self.target = target
        self.timeout = timeout
        read = address.parse(target)
        self._grpc_target = read.target
        self._credentials = address.credentials(read, credentials)
        self._options = channel_options(read.target, options)
        self._native_uri = native.endpoint(target, credentials, options)
        self._native: Any = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: ActionGateServiceStub | native.AioStub | None = None
        self._admin_stub: GateAdminServiceStub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._metadata = call_metadata(api_key)

    def _open(self) -> ActionGateServiceStub | native.AioStub:
        """The stub to call the worker RPCs through, on a channel of the running loop (opened on
        first use)."""
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            if self._loop is not None and self._loop is not loop and not self._loop.is_closed():
                raise RuntimeError(
                    "oncegate.aio: this client's channel belongs to another event loop; "
                    "create one client per loop"
                )
            self._channel = self._admin_stub = None
            if self._native_uri is not None:
                self._native = native.open_channel(self._native_uri, self.timeout)
                self._stub = native.AioStub(self._native)
            else:
                self._stub = ActionGateServiceStub(self._grpc())  # type: ignore[no-untyped-call]
            self._loop = loop
        return self._stub

    def _grpc(self) -> grpc.aio.Channel:
        """The ``grpc.aio`` channel of the running loop, opened on first use."""
        if self._channel is None:
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(self._grpc_target, self._credentials, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self._grpc_target, options=self._options)
        return self._channel

    def _admin(self) -> GateAdminServiceStub:
        """The operator API's stub (a resolver's), on the ``grpc.aio`` channel."""
        self._open()
        if self._admin_stub is None:
            self._admin_stub = GateAdminServiceStub(self._grpc())  # type: ignore[no-untyped-call]
        return self._admin_stub

    async def close(self) -> None:
        """Closes the channel (a later call opens a new one)."""
        if self._native is not None:
            self._native.close()
        if self._channel is not None:
            await self._channel.close()
        self._native = self._channel = self._stub = self._admin_stub = self._loop = None

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
