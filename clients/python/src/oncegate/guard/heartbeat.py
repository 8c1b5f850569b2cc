"""The lease heartbeat: extends a grant's lease while the action runs.

It only extends: it never completes, releases or decides anything about the outcome.

One scheduler thread per process serves every heartbeat (a heap of due times), and a small pool
runs the extensions, so that a guarded call starts no thread of its own: most actions finish long
before their first extension is due, and then the heartbeat costs a heap entry.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from oncegate.errors import OncegateError

if TYPE_CHECKING:
    from oncegate.models import ActionRef
    from oncegate.rpc import GateRpc

__all__ = ["Heartbeat", "keep_extending"]

logger = logging.getLogger("oncegate")

# Extensions that may run at once (each is one ExtendLease call, bounded by the call's deadline): a
# slow or unreachable gate delays the other leases' extensions only past this many.
_EXTENDERS = 4


class Heartbeat:
    """Extends a lease every third of its length until stopped."""

    def __init__(self, rpc: GateRpc, action: ActionRef, token: str, ttl: float) -> None:
        self._rpc = rpc
        self._action = action
        self._token = token
        self._ttl = ttl
        self.stopped = False

    @property
    def interval(self) -> float:
        return self._ttl / 3

    def start(self) -> None:
        _scheduler().schedule(self, self._ttl / 3)

    def stop(self) -> None:
        """Stops extending; an extension already in flight is left to finish on its own."""
        if not self.stopped:
            self.stopped = True
            _scheduler().forget()

    def beat(self) -> bool:
        """Extends the lease once; whether to keep extending it."""
        try:
            self._rpc.extend_lease(self._action, self._token, self._ttl)
        except OncegateError as err:
            return not self.stopped and keep_extending(self._action.key, err)
        return True


def keep_extending(key: str, err: BaseException) -> bool:
    """Whether to keep extending the lease of the action ``key`` after an extension failed with
    ``err`` (logged either way): a retryable error, yes. Also the native guard loop's decision
    (:mod:`oncegate.guard.runner`), which hands it the error its channel raised."""
    if not isinstance(err, OncegateError):
        logger.warning("oncegate: stopped extending the lease of %s: %s: %s", key, type(err).__name__, err)
        return False
    if not err.retryable:
        logger.warning("oncegate: stopped extending the lease of %s: %s", key, err)
        return False
    logger.info("oncegate: extending the lease of %s failed, will retry: %s", key, err)
    return True


class _Scheduler:
    """Runs every heartbeat of the process: one thread waits for the next due one and hands it to
    the pool; a heartbeat that should go on is scheduled again when its extension returns."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Heartbeat]] = []
        self._order = itertools.count()
        self._stale = 0
        # Scheduling and forgetting take the lock alone (a C context manager, cheaper than the
        # condition's); only the scheduler thread waits on the condition.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pool: ThreadPoolExecutor | None = None
        self._thread = threading.Thread(target=self._run, name="oncegate-heartbeat", daemon=True)
        self._thread.start()

    def schedule(self, heartbeat: Heartbeat, delay: float) -> None:
        entry = (time.monotonic() + delay, next(self._order), heartbeat)
        with self._lock:
            heapq.heappush(self._due, entry)
            if self._due[0] is entry:
                self._wake.notify()

    def forget(self) -> None:
        """One more stopped heartbeat waits in the heap; past half of it, they are swept."""
        with self._lock:
            self._stale += 1
            if self._stale > 64 and self._stale * 2 > len(self._due):
                self._due = [e for e in self._due if not e[2].stopped]
                heapq.heapify(self._due)
                self._stale = 0

    def _next(self) -> Heartbeat:
        """The next heartbeat due. A stopped one is dropped only when it comes due (or swept): were
        it dropped on waking, the next schedule would find the heap empty and wake this thread
        again, once per guarded call."""
        with self._wake:
            while True:
                if not self._due:
                    self._wake.wait()
                    continue
                delay = self._due[0][0] - time.monotonic()
                if delay > 0:
                    self._wake.wait(delay)
                    continue
                heartbeat = heapq.heappop(self._due)[2]
                if not heartbeat.stopped:
                    return heartbeat
                self._stale = max(self._stale - 1, 0)

    def _run(self) -> None:
        while True:
            heartbeat = self._next()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_EXTENDERS, thread_name_prefix="oncegate-extend")
            self._pool.submit(self._beat, heartbeat)

    def _beat(self, heartbeat: Heartbeat) -> None:
        if heartbeat.stopped:
            return
        if heartbeat.beat() and not heartbeat.stopped:
            self.schedule(heartbeat, heartbeat.interval)


_lock = threading.Lock()
_current: tuple[int, _Scheduler] | None = None


def _scheduler() -> _Scheduler:
    """The process's scheduler, started on first use (again in a forked child: threads do not
    survive a fork)."""
    global _current
    pid = os.getpid()
    current = _current
    if current is not None and current[0] == pid:
        return current[1]
    with _lock:
        if _current is None or _current[0] != pid:
            _current = (pid, _Scheduler())
        return _current[1]
