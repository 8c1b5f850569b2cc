"""Pauses between retries of a call that failed transiently: exponential, jittered, within a budget.

It decides how long to sleep, never whether an error is worth retrying: the caller does.
"""

from __future__ import annotations

import random
import time

__all__ = ["Backoff"]


class Backoff:
    """Exponential backoff with jitter within a time budget."""

    def __init__(
        self, budget: float, first: float = 0.05, cap: float = 2.0, start: float | None = None
    ) -> None:
        """``start`` is when the budget began (``time.monotonic()``), now when ``None``: a caller
        that makes its backoff only on the first failure passes when its first try began."""
        self._deadline = (time.monotonic() if start is None else start) + budget
        self._delay = first
        self._cap = cap

    def next_delay(self, hint: float | None = None) -> float | None:
        """The pause before the next try (``hint`` seconds when the gate said, never past the
        budget); ``None`` when the budget is spent. The caller sleeps it: ``time.sleep`` in the threaded
        guard, ``asyncio.sleep`` on an event loop."""
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return None
        delay = hint if hint is not None else random.uniform(self._delay / 2, self._delay)
        self._delay = min(self._delay * 2, self._cap)
        return min(delay, remaining)
