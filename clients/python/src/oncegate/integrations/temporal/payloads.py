"""Between Temporal's payload converter and the gate: an activity's arguments as params, its result
as a receipt, and a replayed receipt back as the activity's return type.

Receipts are the JSON the converter writes, so a worker's receipt reads like an operator's or a
resolver's (they record JSON too) and every one replays through the same converter into the type
the activity declares. It does not call the gate; :mod:`oncegate.integrations.temporal` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import temporalio.activity
import temporalio.api.common.v1
import temporalio.converter

from oncegate.aio.attempt import Attempt
from oncegate.guard.options import GuardOptions
from oncegate.models import CompletionSource, ReceiptFormat

__all__ = ["encode_receipt", "params_of", "replace_options", "replayed"]

_JSON = b"json/plain"


def replace_options(options: GuardOptions, **changes: Any) -> GuardOptions:
    """``options`` with ``changes`` (GuardOptions keeps a deprecated keyword, so no dataclass
    ``replace``)."""
    fields = {
        name: getattr(options, name)
        for name in (
            "definite",
            "encode",
            "decode",
            "lease_ttl",
            "max_wait",
            "poll_interval",
            "retry_timeout",
            "heartbeat",
            "holder",
        )
    }
    fields.update(changes)
    return GuardOptions(**fields)


def params_of(converter: temporalio.converter.PayloadConverter, args: Sequence[Any]) -> dict[str, Any]:
    """The params of an activity's arguments, as the payload converter writes them."""
    values = [payload_value(payload) for payload in converter.to_payloads(list(args))]
    if len(values) == 1 and isinstance(values[0], dict):
        return values[0]
    return {"args": values}


def payload_value(payload: temporalio.api.common.v1.Payload) -> Any:
    encoding = payload.metadata.get("encoding", b"")
    if encoding == _JSON or encoding == b"json/protobuf":
        return json.loads(payload.data)
    if encoding == b"binary/null":
        return None
    what = encoding.decode() or "raw bytes"
    raise TypeError(f"oncegate: a guarded activity's arguments must convert to JSON, not {what}")


def encode_receipt(converter: temporalio.converter.PayloadConverter, result: Any) -> bytes:
    """The receipt of a result: the JSON the payload converter writes (readable by operators and
    resolvers, who record JSON too); empty for ``None``."""
    payload = converter.to_payload(result)
    encoding = payload.metadata.get("encoding", b"")
    if encoding == b"binary/null":
        return b""
    if encoding != _JSON:
        raise TypeError(
            f"oncegate: a guarded activity's result must convert to JSON, not {encoding.decode()}"
        )
    return bytes(payload.data)


def replayed(
    converter: temporalio.converter.PayloadConverter, attempt: Attempt, fn: Callable[..., Any]
) -> Any:
    """A replayed receipt as the activity's return type, through the payload converter (a worker's
    receipt is the converter's JSON; an operator's JSON or text is read the same way)."""
    completion = attempt.completion
    assert completion is not None
    if completion.source is CompletionSource.OPERATOR and completion.receipt_format is ReceiptFormat.TEXT:
        data = json.dumps(attempt.result).encode()
    else:
        data = completion.receipt
    if not data:
        return None
    payload = temporalio.api.common.v1.Payload(metadata={"encoding": _JSON}, data=data)
    definition = temporalio.activity._Definition.from_callable(fn)
    hint = definition.ret_type if definition is not None else None
    return converter.from_payload(payload, hint)
