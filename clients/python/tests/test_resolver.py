"""The resolver (threaded and asyncio) against the real gate: a fake bank answers lookups by
provider key; what it knows is settled (the agent's retry replays the bank's receipt, or is
granted again), what it cannot answer stays unresolved for a person.

The resolver connects over the gate's admin socket, as its local operator (the session's gate has
no principals; the ``resolver`` role's own scope is tested in the Rust suite,
``tests/integration/resolvers.rs``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

from oncegate import (
    Completed,
    Decision,
    Failed,
    Gate,
    Resolver,
    Settled,
    Unknown,
    Unresolved,
)
from oncegate.aio import Resolver as AsyncResolver
from oncegate.models import ActionRef, Scope

from conftest import RealGate

PATIENCE = 60.0


def lapse(gate: Gate, agent: str, amounts: list[int]) -> dict[str, int]:
    """Grants one payment per amount with a 1 s lease and lets every lease end: provider key → amount."""
    bank = {}
    for amount in amounts:
        result = gate.request_token(
            "payments.transfer",
            {"amount": amount, "currency": "EUR", "to": "DE89"},
            agent_id=agent,
            run_id="run-1",
            lease_ttl=1.0,
        )
        bank[result.grant.provider_key] = amount
    time.sleep(1.2)
    return bank


def unresolved(real_gate: RealGate, agent: str) -> list[dict[str, Any]]:
    listed = json.loads(real_gate.admin("list-unresolved", "--agent", agent, "--json"))
    return list(listed["actions"])


def settle_with(real_gate: RealGate, bank: dict[str, int]) -> tuple[list[int], Any]:
    """A lookup over the fake bank: 1 was paid, 2 never reached it, 3 it cannot tell, 4 raises,
    5 hangs past the timeout. Returns the amounts looked up (filled as lookups run) and the lookup."""
    looked: list[int] = []

    def lookup(u: Unresolved) -> Any:
        amount = bank[u.provider_key]
        assert u.params["amount"] == amount and u.fencing > 0
        looked.append(amount)
        if amount == 1:
            return Completed({"tx": "tx_1"})
        if amount == 2:
            return Failed()
        if amount == 3:
            return Unknown()
        if amount == 4:
            raise ConnectionError("the bank answered 503")
        time.sleep(2)
        return Completed({"tx": "late"})

    return looked, lookup


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, "the resolver did not get there"
        time.sleep(0.1)


def check_after(gate: Gate, real_gate: RealGate, agent: str) -> None:
    left = sorted(json.loads(u["params_json"])["amount"] for u in unresolved(real_gate, agent))
    assert left == [3, 4, 5], "what the bank could not answer stays for a person"
    paid = gate.request_token(
        "payments.transfer", {"amount": 1, "currency": "EUR", "to": "DE89"}, agent_id=agent, run_id="run-1"
    )
    assert paid.decision == Decision.ALREADY_COMPLETED
    assert json.loads(paid.completion.receipt) == {"tx": "tx_1"}
    again = gate.request_token(
        "payments.transfer", {"amount": 2, "currency": "EUR", "to": "DE89"}, agent_id=agent, run_id="run-1"
    )
    assert again.decision == Decision.GRANTED


def test_the_threaded_resolver_settles_what_the_bank_knows(gate: Gate, real_gate: RealGate) -> None:
    agent = f"resolver-{uuid.uuid4().hex[:8]}"
    bank = lapse(gate, agent, [1, 2, 3, 4, 5])
    looked, lookup = settle_with(real_gate, bank)
    resolver = Resolver(f"unix:{real_gate.data_dir / 'admin.sock'}", agent_id=agent, lookup_timeout=0.5)
    resolver.lookup("payments.transfer")(lookup)
    worker = threading.Thread(target=resolver.run, daemon=True)
    worker.start()
    wait_for(lambda: len(looked) == 5 and len(unresolved(real_gate, agent)) == 3)
    resolver.stop()
    worker.join(PATIENCE)
    assert not worker.is_alive(), "stop() ends run()"
    resolver.close()
    check_after(gate, real_gate, agent)


def test_a_second_settlement_of_one_grant_is_told(gate: Gate, real_gate: RealGate) -> None:
    agent = f"resolver-{uuid.uuid4().hex[:8]}"
    lapse(gate, agent, [1])
    (listed,) = unresolved(real_gate, agent)
    resolver = Resolver(f"unix:{real_gate.data_dir / 'admin.sock'}")
    resolver.lookup("payments.transfer")(lambda u: Completed("tx_1", text=True))
    pending = Unresolved(
        action=ActionRef(Scope(listed["agent_id"], listed["run_id"]), listed["key"]),
        action_name="payments.transfer",
        params_json=listed["params_json"],
        provider_key=listed["provider_key"],
        fencing=int(listed["fencing"]),
        token=listed["token"],
        lease_expired_at=None,
        holder="",
    )
    assert resolver.settle(pending) == Settled.COMPLETED
    assert resolver.settle(pending) == Settled.BY_OTHER
    resolver.close()


def test_the_asyncio_resolver_settles_what_the_bank_knows(gate: Gate, real_gate: RealGate) -> None:
    agent = f"resolver-{uuid.uuid4().hex[:8]}"
    bank = lapse(gate, agent, [1, 2, 3, 4, 5])
    looked, lookup = settle_with(real_gate, bank)

    async def main() -> None:
        resolver = AsyncResolver(
            f"unix:{real_gate.data_dir / 'admin.sock'}", agent_id=agent, lookup_timeout=0.5
        )

        @resolver.lookup("payments.transfer")
        async def ask(u: Unresolved) -> Any:
            if bank[u.provider_key] == 5:
                looked.append(5)
                await asyncio.sleep(2)
            return lookup(u)

        running = asyncio.create_task(resolver.run())
        deadline = time.monotonic() + PATIENCE
        while not (len(looked) == 5 and len(unresolved(real_gate, agent)) == 3):
            assert time.monotonic() < deadline, "the resolver did not get there"
            await asyncio.sleep(0.1)
        resolver.stop()
        await asyncio.wait_for(running, PATIENCE)
        await resolver.close()

    asyncio.run(main())
    check_after(gate, real_gate, agent)
