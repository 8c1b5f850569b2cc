"""The Celery app of the Celery adapter's test: one guarded task paying through a fake bank (an HTTP
server the test runs), loaded by the test and by every ``celery worker`` it starts.

Its broker and result backend are the test's own ``redis-server`` (``ONCEGATE_TEST_BROKER``), with
a short visibility timeout so that a message whose worker was killed is delivered again within
seconds, not the hour Celery waits by default: sooner than the task's lease (8 s) ends, so that the
redelivered task first finds its action held.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from celery import Celery

from oncegate import Gate, Grant
from oncegate.guard import GuardOptions
from oncegate.integrations.celery import guarded_task

BROKER = os.environ.get("ONCEGATE_TEST_BROKER", "redis://127.0.0.1:1/0")

app = Celery("billing", broker=BROKER, backend=BROKER.rsplit("/", 1)[0] + "/1")
app.conf.update(
    broker_transport_options={
        "visibility_timeout": 3,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    worker_prefetch_multiplier=1,
    result_extended=True,  # the result names the worker that finished the task
    broker_connection_retry_on_startup=True,
)


def gate() -> Gate:
    return Gate(os.environ["ONCEGATE_TARGET"])


@guarded_task(
    app, "payments.transfer", gate=gate, options=GuardOptions(lease_ttl=8.0, max_wait=0), wait_delay=0.3
)
def transfer(invoice: str, amount: int, to: str, *, grant: Grant) -> dict[str, Any]:
    """Pays through the fake bank, naming this worker (the bank records who called)."""
    call = {
        "invoice": invoice,
        "amount": amount,
        "to": to,
        "provider_key": grant.provider_key,
        "worker": transfer.request.hostname,
    }
    request = urllib.request.Request(
        os.environ["ONCEGATE_TEST_BANK"] + "/transfers",
        data=json.dumps(call).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]
