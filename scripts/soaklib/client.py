"""One soak client process: threads that run actions through the real Python guard.

Run by the soak as ``python -m soaklib.client '<json settings>'``; it stops by itself at the
deadline. Each thread loops: pick an action key (mostly from a window that slides with time, so
several threads and processes meet on the same keys, sometimes an old one, so completed actions
are asked again long after), open ``Gate.attempt`` on a random gate, and, unless replayed, call
the fake provider with the grant's provider key, then complete. The provider's answers drive the
guard down each of its paths: ``declined`` is a definite failure (the guard releases),
``ambiguous`` a timeout after the effect (the guard keeps the token: outcome unknown). Every RPC
is recorded by :class:`~soaklib.history.Recorder` on the gate's channel; the guard's verdict per
attempt is a ``guard`` event. The nemesis pauses this whole process (SIGSTOP) to model a worker
that stalls mid-action past its lease, heartbeat included.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from oncegate import Gate
from oncegate.errors import DefiniteFailureError, OncegateError
from oncegate.v1.oncegate_pb2_grpc import ActionGateServiceStub

from soaklib.history import History, Recorder, intercepted
from soaklib.provider import ProviderClient

AGENTS = 4
ACTIONS = ("soak.reconcile", "soak.regrant")
WINDOW_SECONDS = 2.0
KEYS_PER_WINDOW = 24


class Declined(DefiniteFailureError):
    """The provider declined: nothing happened, the token may be released."""


def recorded_gate(history: History, who: str, name: str, target: str, api_key: str) -> Gate:
    """A guard client whose every RPC goes through the history's recorder."""
    # Reconnect soon after a gate restarts: gRPC's default backoff grows to two minutes.
    options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
               ("grpc.max_reconnect_backoff_ms", 1000)]
    gate = Gate(target, api_key=api_key, timeout=5.0, options=options)
    # The client builds its channel itself; the soak wraps it so the client library stays as
    # shipped (and its guard unaware of the recording).
    gate._channel = intercepted(gate._channel, Recorder(history, who, name))  # noqa: SLF001
    gate._stub = ActionGateServiceStub(gate._channel)  # type: ignore[no-untyped-call]  # noqa: SLF001
    return gate


def pick_key(rng: random.Random, started: float, retention: float | None = None) -> int:
    """A key of the sliding window, or one asked long ago; with a ``retention``, never one whose
    window began more than half of it ago (its record may be purged: a new action, to the gate)."""
    window = int((time.time() - started) / WINDOW_SECONDS)
    if rng.random() < 0.1:
        oldest = 0 if not retention else max(0, window - int(retention / 2 / WINDOW_SECONDS))
        return rng.randrange(oldest * KEYS_PER_WINDOW, (window + 2) * KEYS_PER_WINDOW)
    return window * KEYS_PER_WINDOW + rng.randrange(0, 2 * KEYS_PER_WINDOW)


def action_for(n: int) -> tuple[str, str, str, dict[str, Any]]:
    """(agent, action, idempotency key, params) of key number ``n``: fixed per key, so only the
    deliberate variants below differ."""
    action = ACTIONS[n % 2]
    return f"soak-agent-{n % AGENTS}", action, f"{action}-{n}", {"amount": n % 997 + 1, "to": f"acct-{n % 13}"}


def worker(settings: dict[str, Any], index: int, history: History) -> None:
    rng = random.Random(f"{settings['seed']}-{settings['client']}-{index}")
    who = f"client-{settings['client']}/{index}"
    gates = [recorded_gate(history, who, name, target, settings["api_key"])
             for name, target in settings["gates"]]
    provider = ProviderClient(settings["provider_port"])
    while time.time() < settings["deadline"]:
        n = pick_key(rng, settings["started"], settings.get("retention"))
        agent, action, key, params = action_for(n)
        if rng.random() < 0.02:
            params = dict(params, amount=params["amount"] + 1)  # a changed request under a used key
        gate = rng.choice(gates)
        verdict = run_once(gate, provider, agent, action, key, params, rng)
        history.write(t="guard", time=time.time(), who=who, key=[agent, "run-1", key], verdict=verdict)
        time.sleep(rng.uniform(0, 0.05))
    provider.close()
    for gate in gates:
        gate.close()


def run_once(gate: Gate, provider: ProviderClient, agent: str, action: str, key: str,
             params: dict[str, Any], rng: random.Random) -> str:
    try:
        with gate.attempt(action, params, agent_id=agent, run_id="run-1", idempotency_key=key,
                          max_wait=3.0, poll_interval=0.25, retry_timeout=8.0) as attempt:
            if attempt.replayed:
                return "replayed"
            grant = attempt.grant
            assert grant is not None and attempt.action is not None
            # The work before the provider call: sometimes longer than the lease, which the
            # heartbeat (ExtendLease) must then keep alive.
            time.sleep(rng.uniform(2.0, 3.0) if rng.random() < 0.05 else rng.uniform(0, 0.5))
            answer = provider.call(op="execute", key=[agent, "run-1", key],
                                   provider_key=grant.provider_key, token=grant.token, fencing=grant.fencing)
            if answer["outcome"] == "declined":
                raise Declined("the provider declined")
            if answer["outcome"] == "ambiguous":
                raise TimeoutError("the provider did not answer in time")
            attempt.complete({"tx": answer["receipt"]})
            return "executed"
    except OncegateError as err:
        return type(err).__name__
    except TimeoutError:
        return "TimeoutError"


def main() -> None:
    settings = json.loads(sys.argv[1])
    # The guard's warnings (a heartbeat refused, a release that failed) are in the history already.
    logging.getLogger("oncegate").setLevel(logging.ERROR)
    history = History(Path(settings["history"]))
    threads = [threading.Thread(target=worker, args=(settings, i, history), daemon=True)
               for i in range(settings["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    history.close()


if __name__ == "__main__":
    main()
