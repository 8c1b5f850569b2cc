"""The history: JSON lines, one event each, written by every soak process to its own file.

Event shapes (``t`` names the kind; times are Unix seconds from the machine's one clock, the
clock Redis ``TIME`` and the embedded store read too):

* ``op``: one gate RPC as the client saw it: ``rpc``, ``who``, ``gate``, ``start``, ``end``,
  ``req`` (the request in the proto JSON mapping, field names as in the proto), then ``ok`` and
  either ``reply`` or ``error`` (``code``, ``reason``, ``metadata``, ``message``).
* ``provider``: one call of the fake provider's ``execute``: ``time``, ``key`` (agent, run,
  action key), ``provider_key``, ``token``, ``fencing``, ``outcome`` (ok, declined, ambiguous),
  ``effect`` (true when this call performed the effect; false when the provider key had it done).
* ``nemesis``: one fault: ``kind``, ``target``, ``start``, ``end``, ``detail``.
* ``final_unresolved``: the operator's ListUnresolved at the end: ``time``, ``complete``, ``keys``.
* ``metrics``: a gate's ``oncegate_double_executions_total`` at the end, per label set.
* ``guard``: what the guard told the client (replayed, executed, or the exception's class).

:class:`Recorder` is a gRPC client interceptor: every RPC made through a channel it wraps, by the
guard or by the operator, becomes one ``op`` event, without the client library knowing.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from oncegate.errors import from_rpc_error


class History:
    """An append-only JSON-lines file; thread-safe, one line per event, flushed per line."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, **event: Any) -> None:
        line = json.dumps(event, sort_keys=True, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _to_dict(message: Any) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


class Recorder(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Writes every unary call on the channel it wraps as an ``op`` event."""

    def __init__(self, history: History, who: str, gate: str) -> None:
        self.history = history
        self.who = who
        self.gate = gate

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        start = time.time()
        outcome = continuation(details, request)
        err = outcome.exception()
        end = time.time()
        event: dict[str, Any] = {
            "t": "op", "rpc": details.method.rsplit("/", 1)[-1], "who": self.who, "gate": self.gate,
            "start": start, "end": end, "req": _to_dict(request), "ok": err is None,
        }
        if err is None:
            event["reply"] = _to_dict(outcome.result())
        else:
            decoded = from_rpc_error(err)
            event["error"] = {
                "code": decoded.code.name if decoded.code is not None else None,
                "reason": decoded.reason,
                "metadata": dict(decoded.metadata),
                "message": decoded.message[:300],
            }
        self.history.write(**event)
        return outcome


def intercepted(channel: grpc.Channel, recorder: Recorder) -> grpc.Channel:
    return grpc.intercept_channel(channel, recorder)


def merge(sources: list[Path], target: Path) -> int:
    """Merges per-process files into one, ordered by each event's start (or time); returns the
    number of events."""
    events = []
    for source in sources:
        with open(source, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line cut short by a killed writer
    events.sort(key=lambda e: e.get("start", e.get("time", 0.0)))
    with open(target, "w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
    return len(events)
