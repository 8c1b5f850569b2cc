"""oncegate on an event loop: the asyncio client (over the native core, or ``grpc.aio``) with the
same guard.

Quick start::

    from oncegate.aio import Gate

    gate = Gate("localhost:50051")

    @gate.action("payments.transfer")
    async def transfer(amount: int, currency: str, to: str, *, grant) -> dict:
        return await provider.transfer(amount, currency, to, idempotency_key=grant.provider_key)

    with gate.scope(agent_id="billing-agent", run_id="run-7"):
        receipt = await transfer(5000, "EUR", "DE89...", idempotency_key="invoice-42")

Everything but the awaiting is the threaded client's: the values (:mod:`oncegate.models`), the
errors (:mod:`oncegate.errors`), the options (:class:`~oncegate.GuardOptions`) and the protocol
(:mod:`oncegate.guard`, whose decisions both clients share through
:mod:`oncegate.guard.protocol`). The modules, bottom up: ``channel`` (the native core's or a
``grpc.aio`` channel), ``rpc`` (the five RPCs), ``heartbeat`` (a task), ``attempt``,
``decorator``, ``client``. All but ``channel`` and ``heartbeat`` are the one source of both
clients: ``generate_sync.py`` writes the threaded ``oncegate.rpc``, ``oncegate.guard.attempt``,
``oncegate.guard.decorator`` and ``oncegate.client`` from them with unasync.
"""

from oncegate.aio.attempt import Attempt
from oncegate.aio.client import Gate
from oncegate.aio.local_gate import LocalGate, local
from oncegate.aio.resolver import Resolver
from oncegate.aio.rpc import GateRpc

__all__ = ["Attempt", "Gate", "GateRpc", "LocalGate", "Resolver", "local"]
