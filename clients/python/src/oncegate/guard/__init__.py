"""The guard: runs one action at most once, and never guesses about an outcome it does not know.

The protocol, for one attempt:

1. RequestToken. A replay (``ALREADY_COMPLETED``) returns the stored receipt and runs nothing.
   ``IDEMPOTENCY_IN_PROGRESS`` waits (at most ``max_wait``) and asks again.
   ``IDEMPOTENCY_KEY_REUSED`` is raised and never retried under a new key.
2. On a grant, run the action with the grant (token, fencing, provider key) while a background
   thread extends the lease.
3. Success: Complete with the encoded result, retrying on transient errors until acknowledged or
   ``retry_timeout`` passes (then :class:`~oncegate.errors.CompleteUnacknowledgedError`).
4. A definite failure (:class:`~oncegate.errors.DefiniteFailureError`, or a class listed in
   ``definite``): Release, then re-raise.
5. Anything else (a timeout, any unmarked exception): never Release; raise
   :class:`~oncegate.errors.OutcomeUnknownError`, chaining the cause, so that the outcome is
   reconciled with the provider before anyone runs the action again.

The guard uses the RPC layer (:class:`~oncegate.rpc.GateRpc`) and nothing above it;
:class:`~oncegate.Gate` builds its ``action``, ``run`` and ``attempt`` on this package. Its modules,
each using only those listed before it: ``options`` (:class:`GuardOptions`, :class:`Request`),
``context`` (the ambient :func:`scope`), ``backoff``, ``heartbeat`` (the lease kept alive),
``hint`` (the ``key_fields_hint`` check), ``protocol`` (the decisions, without IO), ``binding``
(a call's arguments as a request), ``attempt`` (:class:`Attempt`: the protocol) and ``decorator``
(:func:`action`). ``attempt`` and ``decorator``, like :mod:`oncegate.client`, are generated from
their :mod:`oncegate.aio` twins by ``generate_sync.py`` (unasync): one source for both clients.
"""

from oncegate.guard.attempt import Attempt
from oncegate.guard.binding import CONTROL_ARGUMENTS
from oncegate.guard.context import current_scope, scope
from oncegate.guard.decorator import action
from oncegate.guard.options import GuardOptions, Request, json_decode, json_encode

__all__ = [
    "CONTROL_ARGUMENTS",
    "Attempt",
    "GuardOptions",
    "Request",
    "action",
    "current_scope",
    "json_decode",
    "json_encode",
    "scope",
]
