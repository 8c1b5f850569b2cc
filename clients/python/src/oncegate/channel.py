"""The threaded client's channel to one gate: made with the client (it connects on the first
call), closed by :meth:`Channel.close` or by leaving a ``with`` block.

It owns the channel, its stub, and the deadline and metadata every call carries; the calls are
:class:`~oncegate.rpc.GateRpc`'s, which builds on it. The worker RPCs go through the native core
(:mod:`oncegate.native`) unless it does not serve this channel (TLS, gRPC options, a ``unix:``
target, ``ONCEGATE_PURE_PYTHON=1``), and then through a ``grpc`` channel; the operator API (a
resolver's) always through a ``grpc`` channel, opened when first needed. This is what differs in
kind between threads and an event loop, so it is written by hand for each
(:mod:`oncegate.aio.channel`): either channel is thread-safe and serves every thread of the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from oncegate import address, native
from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub, GateAdminServiceStub
from oncegate.wire import call_metadata, channel_options

__all__ = ["Channel", "channel_options", "within"]


_T = TypeVar("_T")


def within(seconds: float, function: Callable[[_T], Any], value: _T) -> Any:
    """``function(value)`` on a daemon thread, within ``seconds`` (:class:`TimeoutError` past them;
    the thread is left to finish on its own). A resolver's lookup runs this way; the asyncio twin
    (:func:`oncegate.aio.channel.within`) awaits it instead."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function(value)
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=run, name="oncegate-lookup", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


_Self = TypeVar("_Self", bound="Channel")


class Channel:
    """One channel to one gate (see :class:`~oncegate.rpc.GateRpc` for the arguments)."""

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
        self._metadata = call_metadata(api_key)
        self._channel: grpc.Channel | None = None
        self._admin_stub: GateAdminServiceStub | None = None
        uri = native.endpoint(target, credentials, options)
        self._native = native.open_channel(uri, timeout) if uri is not None else None
        self._stub: ActionGateServiceStub | native.Stub = (
            native.Stub(self._native) if self._native is not None else ActionGateServiceStub(self._grpc())  # type: ignore[no-untyped-call]
        )

    def _grpc(self) -> grpc.Channel:
        """The ``grpc`` channel, opened on first use."""
        if self._channel is None:
            if self._credentials is not None:
                self._channel = grpc.secure_channel(self._grpc_target, self._credentials, options=self._options)
            else:
                self._channel = grpc.insecure_channel(self._grpc_target, options=self._options)
        return self._channel

    def _open(self) -> ActionGateServiceStub | native.Stub:
        """The stub to call the worker RPCs through (the channel is open from the start)."""
        return self._stub

    def _admin(self) -> GateAdminServiceStub:
        """The operator API's stub (a resolver's), on the ``grpc`` channel."""
        if self._admin_stub is None:
            self._admin_stub = GateAdminServiceStub(self._grpc())  # type: ignore[no-untyped-call]
        return self._admin_stub

    def close(self) -> None:
        """Closes the channel."""
        if self._native is not None:
            self._native.close()
        if self._channel is not None:
            self._channel.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
