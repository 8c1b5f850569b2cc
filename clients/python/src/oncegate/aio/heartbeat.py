"""The asyncio lease heartbeat: a task that extends a grant's lease while the action runs.

It only extends: it never completes, releases or decides anything about the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from oncegate.errors import OncegateError

if TYPE_CHECKING:
    from oncegate.aio.rpc import GateRpc
    from oncegate.models import ActionRef

__all__ = ["Heartbeat"]

logger = logging.getLogger("oncegate")


class Heartbeat:
    """Extends a lease every third of its length until stopped."""

    def __init__(self, rpc: GateRpc, action: ActionRef, token: str, ttl: float) -> None:
        self._rpc = rpc
        self._action = action
        self._token = token
        self._ttl = ttl
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="oncegate-heartbeat")

    async def stop(self) -> None:
        """Stops extending, cancelling an extension in flight."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._ttl / 3)
            try:
                await self._rpc.extend_lease(self._action, self._token, self._ttl)
            except OncegateError as err:
                if not err.retryable:
                    logger.warning("oncegate: stopped extending the lease of %s: %s", self._action.key, err)
                    return
                logger.info(
                    "oncegate: extending the lease of %s failed, will retry: %s", self._action.key, err
                )
