"""The activities the Temporal adapter's tests guard, and a worker process to kill mid-activity.

Shared by ``test_temporal.py`` and the worker it starts (``python temporal_activities.py``): a
bank transfer that writes each call of the fake bank into a ledger file (one JSON line per call,
read back by the test and by its resolver's lookup), then returns a typed receipt.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from oncegate.aio import Gate
from oncegate.guard import GuardOptions
from oncegate.integrations.temporal import OncegateInterceptor, current_grant, side_effect
from oncegate.integrations.temporal.testing import run_activity


@dataclass(frozen=True)
class Invoice:
    amount: int
    currency: str
    to: str


@dataclass(frozen=True)
class Receipt:
    transfer_id: str
    amount: int


def bank_calls(ledger: Path) -> list[dict[str, object]]:
    """Every call the fake bank received, in order."""
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]


def pay(ledger: Path, invoice: Invoice) -> Receipt:
    """The fake bank: records the call under the grant's provider key, returns its receipt."""
    calls = len(bank_calls(ledger)) + 1
    receipt = Receipt(transfer_id=f"tr-{calls}", amount=invoice.amount)
    entry = {
        "provider_key": current_grant().provider_key,
        "transfer_id": receipt.transfer_id,
        "amount": invoice.amount,
    }
    with ledger.open("a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")
    return receipt


async def worker_that_hangs(target: str, ledger: Path, workflow_id: str, run_id: str) -> None:
    """Attempt 1 of ``pay-1``: calls the bank, says so on stdout, then hangs until killed (its
    lease kept alive by the guard's heartbeat for as long as the process lives)."""

    @activity.defn(name="transfer")
    @side_effect("payments.transfer")
    async def transfer(invoice: Invoice) -> Receipt:
        pay(ledger, invoice)
        print("called the bank", flush=True)
        await asyncio.sleep(3600)
        raise AssertionError("killed before this")

    env = ActivityEnvironment()
    env.info = replace(
        env.info, activity_id="pay-1", attempt=1, workflow_id=workflow_id, workflow_run_id=run_id
    )
    async with Gate(target) as gate:
        interceptor = OncegateInterceptor(gate, options=GuardOptions(lease_ttl=2.0, max_wait=0))
        await run_activity(env, [interceptor], transfer, Invoice(4200, "EUR", "DE89"))


if __name__ == "__main__":
    asyncio.run(worker_that_hangs(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
