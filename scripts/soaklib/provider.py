"""The fake provider: the downstream system the guarded actions act on (a bank, say).

It honours the provider key, as a real provider honours an idempotency key: the first call with a
key performs the effect and every later call with that key returns the same receipt without
performing it again. Every call that reaches it is an *execution* of the action by a worker and is
recorded (``provider`` events, with the token and fencing it came with), effect or not: the
checker counts executions per action key by token, so a second worker the gate let through shows
even though the provider key kept the effect single.

Outcomes: ``declined`` (no effect; a definite failure the guard releases), ``ambiguous`` (the
effect is performed, then the caller sees a timeout: the nemesis turns this on for a while), or
``ok``. ``lookup`` answers the operator's question "did this action happen, and what was its
receipt?". ``lookup_provider_key`` answers a resolver's question, by provider key as a real
provider's lookup by idempotency key: ``completed`` with the receipt, ``failed`` (never seen), or
``unknown`` for a fixed, seeded share of provider keys (``unknown_rate``: the provider cannot tell);
each answer is recorded (``lookup`` events). Served over loopback TCP, one JSON object per line
each way.
"""

from __future__ import annotations

import json
import random
import socket
import socketserver
import threading
import time
from typing import Any

from soaklib.history import History


class Provider:
    """The provider's state and its TCP server (a background thread; it starts no process)."""

    def __init__(self, history: History, seed: int, decline_rate: float = 0.05, unknown_rate: float = 0.2) -> None:
        self.history = history
        self.seed = seed
        self.rng = random.Random(seed)
        self.decline_rate = decline_rate
        self.unknown_rate = unknown_rate
        self.ambiguous = False
        self.lock = threading.Lock()
        self.effects: dict[str, str] = {}  # provider key -> receipt
        self.by_action: dict[tuple[str, ...], str] = {}  # action key -> provider key
        self.seq = 0
        provider = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    reply = provider.dispatch(json.loads(line))
                    self.wfile.write((json.dumps(reply) + "\n").encode())

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever, which never ran otherwise
            self.server.shutdown()
        self.server.server_close()

    def dispatch(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["op"] == "execute":
            return self.execute(tuple(msg["key"]), msg["provider_key"], msg["token"], msg["fencing"])
        if msg["op"] == "lookup":
            return self.lookup(tuple(msg["key"]))
        if msg["op"] == "lookup_provider_key":
            return self.lookup_provider_key(msg["provider_key"])
        return {"error": "unknown op"}

    def execute(self, key: tuple[str, ...], provider_key: str, token: str, fencing: int) -> dict[str, Any]:
        with self.lock:
            ambiguous = self.ambiguous
            done = provider_key in self.effects
            declined = not done and self.rng.random() < self.decline_rate
            if declined:
                outcome, effect, receipt = "declined", False, None
            else:
                effect = not done
                if effect:
                    self.seq += 1
                    self.effects[provider_key] = f"tx-{self.seq}"
                    self.by_action[key] = provider_key
                receipt = self.effects[provider_key]
                outcome = "ambiguous" if ambiguous else "ok"
            self.history.write(t="provider", time=time.time(), key=list(key), provider_key=provider_key,
                               token=token, fencing=fencing, outcome=outcome, effect=effect, receipt=receipt)
        if outcome == "ambiguous":
            time.sleep(0.3)  # the caller's deadline passes: it never learns the result
        return {"outcome": outcome, "receipt": receipt}

    def lookup(self, key: tuple[str, ...]) -> dict[str, Any]:
        with self.lock:
            pk = self.by_action.get(key)
            return {"performed": pk is not None, "receipt": self.effects.get(pk) if pk else None}

    def cannot_tell(self, provider_key: str) -> bool:
        """Whether the provider cannot answer lookups of this key: the same answer every time."""
        return random.Random(f"{self.seed}-{provider_key}").random() < self.unknown_rate

    def lookup_provider_key(self, provider_key: str) -> dict[str, Any]:
        with self.lock:
            if self.cannot_tell(provider_key):
                answer, receipt = "unknown", None
            elif provider_key in self.effects:
                answer, receipt = "completed", self.effects[provider_key]
            else:
                answer, receipt = "failed", None
            self.history.write(t="lookup", time=time.time(), provider_key=provider_key, answer=answer,
                               receipt=receipt)
        return {"answer": answer, "receipt": receipt}


class ProviderClient:
    """One connection to the provider (use one per thread)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.reader = self.sock.makefile("rb")

    def call(self, **msg: Any) -> dict[str, Any]:
        self.sock.sendall((json.dumps(msg) + "\n").encode())
        line = self.reader.readline()
        if not line:
            raise ConnectionError("the provider closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        self.sock.close()
