"""The threaded client's channel to one gate: opened when the client is made, closed by
:meth:`Channel.close` or by leaving a ``with`` block.

It owns the gRPC channel, its stub, and the deadline and metadata every call carries; the calls
are :class:`~oncegate.rpc.GateRpc`'s, which builds on it. This is what differs in kind between
threads and an event loop, so it is written by hand for each (:mod:`oncegate.aio.channel`): a
``grpc`` channel is thread-safe and serves every thread of the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub, GateAdminServiceStub
from oncegate.wire import call_metadata

__all__ = ["Channel", "channel_options", "within"]


def channel_options(target: str, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options``, plus an ``:authority`` of ``localhost`` for a ``unix:`` target (the gate's
    admin socket) that sets none: gRPC would send the socket's path, which the gate's HTTP/2
    server refuses."""
    chosen = list(options)
    if target.startswith("unix:") and not any(name == "grpc.default_authority" for name, _ in chosen):
        chosen.append(("grpc.default_authority", "localhost"))
    return chosen


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
    """One gRPC channel to one gate (see :class:`~oncegate.rpc.GateRpc` for the arguments)."""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 10.0,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = target
        self.timeout = timeout
        if credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=channel_options(target, options))
        else:
            self._channel = grpc.insecure_channel(target, options=channel_options(target, options))
        self._stub = ActionGateServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._admin_stub = GateAdminServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = call_metadata(api_key)

    def _open(self) -> ActionGateServiceStub:
        """The stub to call through (the channel is open from the start)."""
        return self._stub

    def _admin(self) -> GateAdminServiceStub:
        """The operator API's stub (a resolver's), on the same channel."""
        return self._admin_stub

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
