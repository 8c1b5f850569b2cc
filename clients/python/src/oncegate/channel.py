"""The threaded client's channel to one gate: opened when the client is made, closed by
:meth:`Channel.close` or by leaving a ``with`` block.

It owns the gRPC channel, its stub, and the deadline and metadata every call carries; the calls
are :class:`~oncegate.rpc.GateRpc`'s, which builds on it. This is what differs in kind between
threads and an event loop, so it is written by hand for each (:mod:`oncegate.aio.channel`): a
``grpc`` channel is thread-safe and serves every thread of the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import grpc

from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub
from oncegate.wire import call_metadata

__all__ = ["Channel"]

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
            self._channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.insecure_channel(target, options=list(options))
        self._stub = ActionGateServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = call_metadata(api_key)

    def _open(self) -> ActionGateServiceStub:
        """The stub to call through (the channel is open from the start)."""
        return self._stub

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
