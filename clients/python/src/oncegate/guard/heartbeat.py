"""The lease heartbeat: a background thread that extends a grant's lease while the action runs.

It only extends: it never completes, releases or decides anything about the outcome.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from oncegate.errors import OncegateError

if TYPE_CHECKING:
    from oncegate.models import ActionRef
    from oncegate.rpc import GateRpc

__all__ = ["Heartbeat"]

logger = logging.getLogger("oncegate")


class Heartbeat:
    """Extends a lease every third of its length until stopped."""

    def __init__(self, rpc: GateRpc, action: ActionRef, token: str, ttl: float) -> None:
        self._rpc = rpc
        self._action = action
        self._token = token
        self._ttl = ttl
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oncegate-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops extending; an extension already in flight is left to finish on its own."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._ttl / 3):
            try:
                self._rpc.extend_lease(self._action, self._token, self._ttl)
            except OncegateError as err:
                if self._stopped.is_set():
                    return
                if not err.retryable:
                    logger.warning("oncegate: stopped extending the lease of %s: %s", self._action.key, err)
                    return
                logger.info(
                    "oncegate: extending the lease of %s failed, will retry: %s", self._action.key, err
                )
