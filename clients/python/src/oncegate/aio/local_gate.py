"""The gate in this process, for an event loop: :func:`local` is :func:`oncegate.local` with an
:class:`oncegate.aio.Gate` connected to it. The server is the same (:class:`oncegate.LocalServer`);
it runs on threads of its own, so the loop is never blocked by the gate's work.

Quick start::

    import oncegate.aio

    async with oncegate.aio.local("./oncegate-data") as gate:
        ...
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from oncegate.aio.client import Gate
from oncegate.local_gate import LocalServer

__all__ = ["LocalGate", "local"]


class LocalGate(Gate):
    """An :class:`oncegate.aio.Gate` whose gate runs in this process (:attr:`server`); closing it
    stops the gate too."""

    server: LocalServer

    def __init__(self, server: LocalServer, *, api_key: str | None = None, timeout: float = 10.0) -> None:
        self.server = server
        super().__init__(server.target, api_key=api_key, timeout=timeout)

    async def close(self) -> None:
        """Closes the channel, then stops the gate (its drain runs on a worker thread)."""
        try:
            await super().close()
        finally:
            await asyncio.to_thread(self.server.stop)


def local(
    data_dir: str | os.PathLike[str],
    *,
    config: str | os.PathLike[str] | None = None,
    flags: Sequence[str] = (),
    log: str | None = None,
    api_key: str | None = None,
    timeout: float = 10.0,
) -> LocalGate:
    """:func:`oncegate.local` for an event loop: starts the gate (opening the store takes a few
    milliseconds, on the calling thread) and returns an :class:`LocalGate`; ``async with`` it, or
    ``await close()``, to stop it."""
    return LocalGate(
        LocalServer(data_dir, config=config, flags=flags, log=log), api_key=api_key, timeout=timeout
    )
