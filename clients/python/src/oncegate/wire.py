"""The worker RPCs' request messages, built from plain values, the metadata every call sends and the
options a ``grpc`` channel is opened with.

Shared by both clients' RPC layers (:mod:`oncegate.rpc`, :mod:`oncegate.aio.rpc`) and their
channels; no IO. :data:`Seconds` is how a duration is given to any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from google.protobuf import duration_pb2

from oncegate.fingerprints import encode_params
from oncegate.models import ActionRef, Completed, Failed, ReleaseReason, Scope, Unresolved, json_encode
from oncegate.v1 import oncegate_pb2 as pb

__all__ = [
    "Seconds",
    "call_metadata",
    "channel_options",
    "complete_request",
    "extend_lease_request",
    "get_action_request",
    "nanoseconds",
    "release_request",
    "request_token_request",
    "resolve_request",
    "watch_request",
]

Seconds = float | timedelta
"""A duration: seconds, or a :class:`~datetime.timedelta`."""


def call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata of every call: ``authorization: Bearer <key>`` when there is a key."""
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def channel_options(target: str, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options``, plus an ``:authority`` of ``localhost`` for a ``unix:`` target (the gate's
    admin socket) that sets none: gRPC would send the socket's path, which the gate's HTTP/2
    server refuses."""
    chosen = list(options)
    if target.startswith("unix:") and not any(name == "grpc.default_authority" for name, _ in chosen):
        chosen.append(("grpc.default_authority", "localhost"))
    return chosen


def request_token_request(
    action: str,
    params: Mapping[str, Any] | str,
    *,
    agent_id: str,
    run_id: str,
    intent_id: str | None,
    idempotency_key: str | None,
    holder: str | None,
    lease_ttl: Seconds | None,
) -> pb.RequestTokenRequest:
    """The RequestToken message."""
    request = pb.RequestTokenRequest(
        scope=Scope(agent_id, run_id).to_proto(),
        action=action,
        params_json=params if isinstance(params, str) else encode_params(params),
        intent_id=intent_id or "",
        idempotency_key=idempotency_key or "",
        holder=holder or "",
    )
    if lease_ttl is not None:
        request.lease_ttl.CopyFrom(_duration(lease_ttl))
    return request


def complete_request(action: ActionRef, token: str, receipt: bytes) -> pb.CompleteRequest:
    """The Complete message."""
    return pb.CompleteRequest(action=action.to_proto(), token=token, receipt=receipt)


def release_request(action: ActionRef, token: str, reason: ReleaseReason) -> pb.ReleaseRequest:
    """The Release message."""
    # The generated stub types enum fields as their wrapper class; any of its ints is accepted.
    return pb.ReleaseRequest(action=action.to_proto(), token=token, reason=int(reason))  # type: ignore[arg-type]


def extend_lease_request(action: ActionRef, token: str, ttl: Seconds) -> pb.ExtendLeaseRequest:
    """The ExtendLease message."""
    return pb.ExtendLeaseRequest(action=action.to_proto(), token=token, ttl=_duration(ttl))


def get_action_request(action: ActionRef) -> pb.GetActionRequest:
    """The GetAction message."""
    return pb.GetActionRequest(action=action.to_proto())


def watch_request(agent_id: str) -> pb.WatchUnresolvedRequest:
    """A resolver's WatchUnresolved (every agent the principal acts for when ``agent_id`` is empty)."""
    return pb.WatchUnresolvedRequest(agent_id=agent_id)


def resolve_request(
    unresolved: Unresolved, answer: Completed | Failed, note: str
) -> pb.ResolveExpiredRequest:
    """A resolver's ResolveExpired: settles only the grant it was sent (``expected_fencing``)."""
    request = pb.ResolveExpiredRequest(
        action=unresolved.action.to_proto(), note=note, expected_fencing=unresolved.fencing
    )
    if isinstance(answer, Failed):
        request.resolution = pb.RESOLUTION_FAILED
    elif answer.text:
        request.resolution = pb.RESOLUTION_COMPLETED
        request.receipt = str(answer.receipt).encode("utf-8")
        request.receipt_format = pb.RECEIPT_FORMAT_TEXT
    else:
        request.resolution = pb.RESOLUTION_COMPLETED
        request.receipt = json_encode(answer.receipt)
        request.receipt_format = pb.RECEIPT_FORMAT_JSON
    return request


def nanoseconds(value: Seconds) -> int:
    """``value`` in whole nanoseconds, as :func:`_duration` reads it (a ``timedelta`` exactly, seconds
    rounded): how the native core's plain-value calls take a duration."""
    if isinstance(value, timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000_000 + value.microseconds * 1_000
    return round(value * 1e9)


def _duration(value: Seconds) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    if isinstance(value, timedelta):
        duration.FromTimedelta(value)
    else:
        duration.FromNanoseconds(round(value * 1e9))
    return duration
