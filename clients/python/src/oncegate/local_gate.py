"""The gate in this process: :func:`local` runs the gate server ``oncegate serve`` runs, on its
embedded store under ``data_dir`` (or, given the Redis flags, on Redis beside any other gates on
it), inside the Python process, and returns a :class:`LocalGate`, a :class:`~oncegate.Gate`
connected to it. For tests, single-process apps, and workers that want the gate's promise without
a server to call: no server to start, and nothing to compile (the server is part of the wheel's
native extension).

Quick start::

    import oncegate

    with oncegate.local("./oncegate-data") as gate:

        @gate.action("payments.transfer")
        def transfer(*, amount: int, to: str, grant) -> dict:
            return provider.transfer(amount, to, idempotency_key=grant.provider_key)

The gate is the real one (the same code, the same answers, errors, signing, audit and rules), so
it keeps its promise the same way: what it completed survives the process, and a second
:func:`local` on the same directory after a restart replays it. The worker calls of this process's
native channels to it (the :class:`LocalGate`'s, and any other client's made with its
:attr:`LocalServer.target`) skip the socket: they call its gate service directly, the same service
its listener serves. It listens on loopback TCP (``127.0.0.1`` and a free port) and on its admin
socket in ``data_dir``, as ``make run``'s gate does, so a grpcio channel, another process, a
:class:`~oncegate.Resolver` or ``oncegate admin`` can reach it too. One process at a time may open
a data directory.

A gate in the worker's process enforces its rules, budgets and approvals there: where they must
hold against the agent, or the signing key must stay out of its reach, run ``oncegate serve``
apart instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from oncegate import native
from oncegate.client import Gate

__all__ = ["LocalGate", "LocalServer", "local"]


class LocalServer:
    """A gate server running in this process, on the embedded store under ``data_dir`` or on Redis.

    Args:
        data_dir: The store's directory (created if missing), as ``oncegate serve --data-dir``.
        config: The gate's config file (TOML: policies, limits, principals, authorization), as
            ``--config``.
        flags: More of ``oncegate serve``'s flags, as on its command line (``["--unsigned"]``,
            ``["--listen", "127.0.0.1:50051"]``, ``["--console-listen", "127.0.0.1:7480"]``);
            ``oncegate serve --help`` lists them; one given here overrides ``data_dir`` and the
            default ``--listen``. The environment's ``ONCEGATE_*`` variables are not read. With
            ``--redis-url`` (or the Sentinel and Cluster flags) the store is that Redis, shared
            with every other gate on it, and ``data_dir`` holds only the admin socket.
        log: Where the gate's log lines go: ``None`` (the default) keeps them quiet; a filter in
            ``RUST_LOG``'s syntax (``"info"``, ``"warn,oncegate::audit=info"``) writes them to
            standard error, unless the process already has a tracing subscriber.

    Raises:
        ValueError: a bad flag or configuration (the message is ``oncegate serve``'s).
        OSError: the store cannot be opened (another process holds ``data_dir``, or Redis does not
            answer) or an address cannot be bound.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        config: str | os.PathLike[str] | None = None,
        flags: Sequence[str] = (),
        log: str | None = None,
    ) -> None:
        if isinstance(flags, str):
            raise TypeError("flags: a sequence of strings, one per word (['--unsigned']), not one string")
        argv = ["--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
        if config is not None:
            argv += ["--config", str(config)]
        argv += [str(flag) for flag in flags]
        self._server = native.local_server(argv, log)
        self.data_dir = Path(self._server.data_dir)
        """The store's directory (``data_dir``, or the ``--data-dir`` of ``flags``)."""

    @property
    def target(self) -> str:
        """``host:port`` of the gate's gRPC listener, for :class:`~oncegate.Gate` and friends."""
        return str(self._server.address)

    @property
    def admin_target(self) -> str | None:
        """``unix:`` target of the admin socket (the operator API, as ``local-operator``), or
        ``None`` with ``--no-admin-socket``."""
        path = self._server.admin_socket
        return None if path is None else f"unix:{path}"

    @property
    def running(self) -> bool:
        """Whether it still serves."""
        return bool(self._server.running)

    def stop(self) -> None:
        """Stops serving: refuses new calls, waits for those in flight (``--drain-seconds``), and
        closes the store. Idempotent; the data directory may then be opened again."""
        self._server.stop()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalServer({str(self.data_dir)!r}, target={self.target!r}, {state})"


class LocalGate(Gate):
    """A :class:`~oncegate.Gate` whose gate runs in this process (:attr:`server`); closing it
    stops the gate too. Made by :func:`local`; every :class:`~oncegate.Gate` method works as on
    a gate server."""

    server: LocalServer

    def __init__(self, server: LocalServer, *, api_key: str | None = None, timeout: float = 10.0) -> None:
        self.server = server
        super().__init__(server.target, api_key=api_key, timeout=timeout)

    def close(self) -> None:
        """Closes the channel, then stops the gate (:meth:`LocalServer.stop`)."""
        try:
            super().close()
        finally:
            self.server.stop()


def local(
    data_dir: str | os.PathLike[str],
    *,
    config: str | os.PathLike[str] | None = None,
    flags: Sequence[str] = (),
    log: str | None = None,
    api_key: str | None = None,
    timeout: float = 10.0,
) -> LocalGate:
    """Starts a gate in this process on the embedded store under ``data_dir`` (or on Redis, given
    the Redis flags in ``flags``) and returns a :class:`LocalGate` connected to it; ``with`` it, or
    call ``close()``, to stop it.

    ``config``, ``flags`` and ``log`` are :class:`LocalServer`'s; ``api_key`` and ``timeout`` the
    client's (an ``api_key`` is needed when ``config`` has ``[[principals]]``).
    """
    return LocalGate(
        LocalServer(data_dir, config=config, flags=flags, log=log), api_key=api_key, timeout=timeout
    )
