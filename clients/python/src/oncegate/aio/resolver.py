"""The resolver: settles the actions whose lease ended with no outcome by asking the provider.

A :class:`Resolver` holds one lookup per action type (``payments.transfer`` → "ask the bank by
provider key"). :meth:`Resolver.run` follows the gate's ``WatchUnresolved`` stream (what is
unresolved now, then each lease that ends, within seconds), asks the action's lookup, and settles
with ``ResolveExpired`` and the fencing number it was sent, so that two resolvers never settle one
grant twice or differently (the second hears ``ALREADY_SETTLED`` or ``ALREADY_COMPLETED`` and
moves on). A lookup that returns :class:`~oncegate.models.Unknown`, raises or takes longer than
``lookup_timeout`` leaves the action for a person (it stays listed, counted and notified); it is
logged. A broken stream is reopened with backoff, and so is one whose settlement failed in a way
that may pass (``UNAVAILABLE``, a rate limit): only a reopened stream sends that action again.

The caller needs a principal with the ``resolver`` role (or ``operator``) for its agents.

One source, two clients: ``oncegate/aio/resolver.py`` is written by hand, and
``generate_sync.py`` writes the threaded ``oncegate/resolver.py`` from it with unasync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from oncegate import address
from oncegate.aio.channel import Channel, within
from oncegate.errors import from_rpc_error
from oncegate.models import Completed, Failed, Settled, Unknown, Unresolved
from oncegate.wire import resolve_request, watch_request

__all__ = ["Resolver"]

LOG = logging.getLogger("oncegate.resolver")
F = TypeVar("F", bound=Callable[..., Any])
SETTLED_BY_OTHER = ("ALREADY_SETTLED", "ALREADY_COMPLETED")


class Resolver(Channel):
    """Settles unresolved actions by asking the provider, one lookup per action type.

    Args:
        target: The gate's address in any of :data:`oncegate.address.FORMS` (``unix:<path>``: its
            admin socket, where the caller is its local operator); without it
            ``ONCEGATE_ADMIN_TARGET``, else ``127.0.0.1:50051``.
        api_key: A resolver principal's key, sent as ``authorization: Bearer <key>``.
        credentials: TLS channel credentials; a plaintext channel when ``None``.
        timeout: Deadline of each settlement call, in seconds.
        options: Extra gRPC channel options.
        agent_id: Watch only this agent (every agent the principal acts for when empty).
        lookup_timeout: How long a lookup may take before the action is left for a person.
        backoff: The first and the longest wait before reopening a broken stream, in seconds.
        note: Kept with every settlement.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 10.0,
        options: Sequence[tuple[str, Any]] = (),
        agent_id: str = "",
        lookup_timeout: float = 10.0,
        backoff: tuple[float, float] = (0.2, 30.0),
        note: str = "resolver: provider lookup by provider key",
    ) -> None:
        if target is None:
            target = address.from_environment(admin=True)
        super().__init__(target, api_key=api_key, credentials=credentials, timeout=timeout, options=options)
        self.agent_id = agent_id
        self.lookup_timeout = lookup_timeout
        self.backoff = backoff
        self.note = note
        self.lookups: dict[str, Callable[[Unresolved], Any]] = {}
        self._call: Any = None
        self._stopping = False
        self._reopen = False

    def lookup(self, action_name: str) -> Callable[[F], F]:
        """Registers the decorated function as the lookup of ``action_name``: it takes an
        :class:`~oncegate.models.Unresolved` and returns ``Completed(receipt)``, ``Failed()`` or
        ``Unknown()``."""

        def register(function: F) -> F:
            self.lookups[action_name] = function
            return function

        return register

    async def settle(self, unresolved: Unresolved) -> Settled:
        """Asks the action's lookup (within ``lookup_timeout``) and settles what it answers."""
        lookup = self.lookups.get(unresolved.action_name)
        if lookup is None:
            return self._left(unresolved, f"no lookup for action {unresolved.action_name!r}")
        try:
            answer = await within(self.lookup_timeout, lookup, unresolved)
        except TimeoutError:
            return self._left(unresolved, f"the lookup took over {self.lookup_timeout} s")
        except Exception as err:
            return self._left(unresolved, f"the lookup failed: {err!r}")
        if isinstance(answer, Unknown):
            return self._left(unresolved, "the provider cannot tell")
        if not isinstance(answer, (Completed, Failed)):
            return self._left(unresolved, f"the lookup returned {answer!r}, not Completed, Failed or Unknown")
        request = resolve_request(unresolved, answer, self.note)
        try:
            await self._admin().ResolveExpired(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            error = from_rpc_error(err)
            if error.reason in SETTLED_BY_OTHER:
                LOG.info("settled by another: %s (fencing %d)", unresolved.action, unresolved.fencing)
                return Settled.BY_OTHER
            if error.retryable:
                # The stream sends an action once: only a reopened one sends it again.
                self._reopen = True
                why = f"the settlement failed: {error}; reopening the stream to try again"
                return self._left(unresolved, why)
            return self._left(unresolved, f"the settlement failed: {error}")
        settled = Settled.FAILED if isinstance(answer, Failed) else Settled.COMPLETED
        LOG.info("resolved %s (fencing %d): %s", unresolved.action, unresolved.fencing, settled.value)
        return settled

    def _left(self, unresolved: Unresolved, why: str) -> Settled:
        LOG.warning("left for a person: %s (fencing %d): %s", unresolved.action, unresolved.fencing, why)
        return Settled.LEFT

    async def run(self) -> None:
        """Follows the unresolved actions and settles each, one at a time, until :meth:`stop`.
        A broken stream is reopened after a wait that doubles up to ``backoff[1]`` (and starts
        again at ``backoff[0]`` once a stream delivers); so is a stream whose settlement failed in
        a way that may pass (the gate or its store unavailable, a rate limit): the gate sends an
        action once, and a reopened stream sends every action still unresolved, that one too."""
        self._stopping = False
        wait = self.backoff[0]
        while not self._stopping:
            try:
                self._call = self._admin().WatchUnresolved(
                    watch_request(self.agent_id), metadata=self._metadata
                )
                async for message in self._call:
                    wait = self.backoff[0]
                    await self.settle(Unresolved.from_proto(message.action))
                    if self._reopen:
                        self._reopen = False
                        LOG.info("a settlement failed and may pass: reopening the unresolved stream")
                        self._call.cancel()
                        break
            except asyncio.CancelledError:  # async only
                return  # async only
            except grpc.RpcError as err:
                if self._stopping:
                    return
                LOG.warning("the unresolved stream broke (%s); reopening", from_rpc_error(err))
            if self._stopping:
                return
            await asyncio.sleep(wait)
            wait = min(wait * 2, self.backoff[1])

    def stop(self) -> None:
        """Ends :meth:`run` (from another thread, or another task of its loop)."""
        self._stopping = True
        if self._call is not None:
            self._call.cancel()
