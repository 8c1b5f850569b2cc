# The native core's interface (clients/python/native/src): the extension module oncegate._native.
# Only oncegate.native uses it (LocalServer on behalf of oncegate.local_gate).

from collections.abc import Callable, Sequence

class Channel:
    """A channel to one gate at an ``http://host:port`` address, connected on the first call."""

    def __init__(
        self, uri: str, connect_timeout: float, error: Callable[[int, str, bytes], BaseException]
    ) -> None: ...
    def call(
        self, path: str, request: bytes, timeout: float | None, metadata: Sequence[tuple[str, str]]
    ) -> bytes:
        """One unary call, blocking with the GIL released; raises ``error(code, message, details)``."""
    def start(
        self,
        path: str,
        request: bytes,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
        done: Callable[[bytes | BaseException], object],
    ) -> Call:
        """The same call in the background: ``done`` gets the answer, on the native core's thread."""
    def close(self) -> None:
        """Drops the connections; later calls raise ``ValueError``."""

class Call:
    def cancel(self) -> None:
        """Drops the call; its ``done`` is not called afterwards."""

def forked() -> None:
    """To call in a forked child: the next call starts new runtimes and connections."""

def exiting() -> None:
    """To call at exit (``atexit``): the native core's threads stop calling Python, and those
    already calling it finish first."""

class LocalServer:
    """The gate server of ``oncegate serve`` in this process, on its own runtime: ``flags`` are
    ``oncegate serve``'s (no environment fallbacks), ``log`` a ``RUST_LOG`` filter or ``None``.
    Raises ``ValueError`` for bad flags or configuration, ``OSError`` when the store cannot be
    opened or an address bound."""

    address: str
    admin_socket: str | None
    data_dir: str
    running: bool
    def __init__(self, flags: Sequence[str], log: str | None = None) -> None: ...
    def stop(self) -> None:
        """Drains the calls in flight and closes the store; idempotent."""
