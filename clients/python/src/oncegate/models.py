"""Plain values returned by the client, converted from the generated protobuf messages, and the
default receipt codec (JSON) that turns results into receipts and back."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from google.protobuf import timestamp_pb2

from oncegate._json import one_shot
from oncegate.v1 import oncegate_pb2 as pb

__all__ = [
    "ActionRecord",
    "ActionRef",
    "ActionState",
    "Approval",
    "Completed",
    "Completion",
    "CompletionSource",
    "Decision",
    "Failed",
    "Grant",
    "Lookup",
    "ReceiptFormat",
    "ReleaseReason",
    "RequestTokenResult",
    "Scope",
    "Settled",
    "Unknown",
    "Unresolved",
    "json_decode",
    "json_encode",
]


def json_encode(result: Any) -> bytes:
    """The default receipt encoder: compact JSON with sorted keys."""
    return _encode_receipt(result).encode("utf-8")


# One encoder for every receipt (json.dumps with options builds a new one each time).
_encode_receipt = one_shot(json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":")))


def json_decode(receipt: bytes) -> Any:
    """The default receipt decoder; an empty receipt decodes to ``None``."""
    return json.loads(receipt) if receipt else None


class _NamedEnum(enum.IntEnum):
    """An ``IntEnum`` that prints as its name (``GRANTED``), not its number: since Python 3.11
    ``str()`` and f-strings of an ``IntEnum`` give the number."""

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)


class Decision(_NamedEnum):
    """What the gate decided for a RequestToken that was not refused."""

    GRANTED = pb.DECISION_GRANTED
    """A token was granted: execute, then Complete or Release."""
    ALREADY_COMPLETED = pb.DECISION_ALREADY_COMPLETED
    """The action already completed: do not execute; the completion holds the receipt."""
    PENDING_APPROVAL = pb.DECISION_PENDING_APPROVAL
    """A rule holds the action for an operator's approval: do not execute; ask again later."""


class CompletionSource(_NamedEnum):
    """Who recorded a completion."""

    UNSPECIFIED = pb.COMPLETION_SOURCE_UNSPECIFIED
    WORKER = pb.COMPLETION_SOURCE_WORKER
    OPERATOR = pb.COMPLETION_SOURCE_OPERATOR


class ReceiptFormat(_NamedEnum):
    """How a stored receipt's bytes are to be read."""

    UNSPECIFIED = pb.RECEIPT_FORMAT_UNSPECIFIED
    """A worker's receipt, in its client's own encoding: the guard's ``decode`` reads it."""
    JSON = pb.RECEIPT_FORMAT_JSON
    """A JSON document (an operator's): replayed as the value it holds."""
    TEXT = pb.RECEIPT_FORMAT_TEXT
    """UTF-8 text (an operator's): replayed as a ``str``."""


class ReleaseReason(_NamedEnum):
    """Why a token is given back."""

    DEFINITE_FAILURE = pb.RELEASE_REASON_DEFINITE_FAILURE
    """The attempt ran and definitely had no effect."""
    NOT_ATTEMPTED = pb.RELEASE_REASON_NOT_ATTEMPTED
    """The action was not attempted at all."""


class ActionState(_NamedEnum):
    """The state of one action key."""

    UNSPECIFIED = pb.ACTION_STATE_UNSPECIFIED
    ABSENT = pb.ACTION_STATE_ABSENT
    AUTHORIZED = pb.ACTION_STATE_AUTHORIZED
    COMPLETED = pb.ACTION_STATE_COMPLETED
    EXPIRED = pb.ACTION_STATE_EXPIRED


@dataclass(frozen=True, init=False)
class Scope:
    """Who acts: the agent, and the workflow run that survives restarts of the agent."""

    agent_id: str
    run_id: str

    def __init__(self, agent_id: str, run_id: str) -> None:
        # What the generated __init__ does (a frozen dataclass's sets each field through
        # object.__setattr__) for a fraction of its cost: a guarded call makes one.
        self.__dict__.update(agent_id=agent_id, run_id=run_id)

    def to_proto(self) -> pb.Scope:
        """The protobuf form."""
        return pb.Scope(agent_id=self.agent_id, run_id=self.run_id)


@dataclass(frozen=True)
class ActionRef:
    """Names one action of one scope: the idempotency key when one was given, else the fingerprint."""

    scope: Scope
    key: str

    @classmethod
    def from_proto(cls, message: pb.ActionRef) -> ActionRef:
        """Converts the protobuf form."""
        return cls(Scope(message.scope.agent_id, message.scope.run_id), message.key)

    def to_proto(self) -> pb.ActionRef:
        """The protobuf form."""
        return pb.ActionRef(scope=self.scope.to_proto(), key=self.key)


@dataclass(frozen=True)
class Grant:
    """The one-shot authorization for one attempt.

    Attributes:
        token: Opaque; pass it to Complete, Release and ExtendLease.
        fencing: Grows with every grant of the action; downstream systems can reject stale holders.
        lease_expires_at: When the lease ends unless extended, completed or released (store clock).
        provider_key: Pass it to the downstream provider as *its* idempotency key.
        statement: The signed grant statement: hand it to the executor with the params, which
            checks it with :func:`oncegate.verify_grant`. Empty when the gate does not sign.
    """

    token: str
    fencing: int
    lease_expires_at: datetime | None
    provider_key: str
    statement: str = ""

    @classmethod
    def from_proto(cls, message: pb.Grant) -> Grant:
        """Converts the protobuf form."""
        return cls(
            token=message.token,
            fencing=message.fencing,
            lease_expires_at=_time(message, "lease_expires_at"),
            provider_key=message.provider_key,
            statement=message.statement,
        )


@dataclass(frozen=True)
class Completion:
    """The recorded outcome of an action, replayed on every later request.

    Attributes:
        receipt: The stored receipt, as its writer wrote it.
        source: Who recorded it: a worker (``Complete``) or an operator.
        operator: The operator principal who recorded it (empty for a worker's).
        receipt_format: How ``receipt`` is to be read: an operator says ``JSON`` or ``TEXT``; a
            worker's is ``UNSPECIFIED``, in its client's own encoding.
    """

    receipt: bytes
    completed_at: datetime | None
    fencing: int
    token: str
    source: CompletionSource
    operator: str = ""
    receipt_format: ReceiptFormat = ReceiptFormat.UNSPECIFIED

    @classmethod
    def from_proto(cls, message: pb.Completion) -> Completion:
        """Converts the protobuf form."""
        return cls(
            receipt=message.receipt,
            completed_at=_time(message, "completed_at"),
            fencing=message.fencing,
            token=message.token,
            source=CompletionSource(message.source),
            operator=message.operator,
            receipt_format=ReceiptFormat(message.receipt_format),
        )


@dataclass(frozen=True)
class Approval:
    """An action held for an operator's approval (``DECISION_PENDING_APPROVAL``)."""

    id: str
    expires_at: datetime | None
    policy_id: str
    reason: str

    @classmethod
    def from_proto(cls, message: pb.Approval) -> Approval:
        """Converts the protobuf form."""
        return cls(
            id=message.id,
            expires_at=_time(message, "expires_at"),
            policy_id=message.policy_id,
            reason=message.reason,
        )


@dataclass(frozen=True)
class RequestTokenResult:
    """The answer to RequestToken: a grant, the completion of an action that already ran, or an
    approval the action waits for."""

    decision: Decision
    action: ActionRef
    fingerprint: str
    grant: Grant | None
    completion: Completion | None
    redelivered: bool
    approval: Approval | None = None

    @classmethod
    def from_proto(cls, message: pb.RequestTokenResponse) -> RequestTokenResult:
        """Converts the protobuf form."""
        return cls(
            decision=Decision(message.decision),
            action=ActionRef.from_proto(message.action),
            fingerprint=message.fingerprint,
            grant=Grant.from_proto(message.grant) if message.HasField("grant") else None,
            completion=Completion.from_proto(message.completion) if message.HasField("completion") else None,
            redelivered=message.redelivered,
            approval=Approval.from_proto(message.approval) if message.HasField("approval") else None,
        )


@dataclass(frozen=True)
class ActionRecord:
    """The record of one action as it stands, for reconciliation."""

    state: ActionState
    fencing: int
    fingerprint: str
    lease_expires_at: datetime | None
    completion: Completion | None
    holder: str
    token: str = ""
    """The token of an unsettled (AUTHORIZED or EXPIRED) action; the gate shows it to operators
    only, so it is empty for an agent's credential."""
    provider_key: str = ""
    """The action's provider key: ask the provider with it when reconciling."""

    @classmethod
    def from_proto(cls, message: pb.GetActionResponse) -> ActionRecord:
        """Converts the protobuf form."""
        return cls(
            state=ActionState(message.state),
            fencing=message.fencing,
            fingerprint=message.fingerprint,
            lease_expires_at=_time(message, "lease_expires_at"),
            completion=Completion.from_proto(message.completion) if message.HasField("completion") else None,
            holder=message.holder,
            token=message.token,
            provider_key=message.provider_key,
        )


@dataclass(frozen=True)
class Unresolved:
    """An action whose lease ended with no outcome, as a resolver receives it: what a provider
    lookup needs."""

    action: ActionRef
    action_name: str
    """Its action type (``payments.transfer``); empty for records older gates wrote."""
    params_json: str
    """The params its latest grant was asked with (JSON text)."""
    provider_key: str
    """The key the provider was given: look the request up by it."""
    fencing: int
    """The unsettled grant's fencing number (the settlement is conditional on it)."""
    token: str
    lease_expired_at: datetime | None
    holder: str

    @property
    def params(self) -> dict[str, Any]:
        """The params, parsed (empty when none were kept)."""
        return json.loads(self.params_json) if self.params_json else {}

    @classmethod
    def from_proto(cls, message: pb.UnresolvedAction) -> Unresolved:
        """Converts the protobuf form."""
        return cls(
            action=ActionRef.from_proto(message.action),
            action_name=message.action_name,
            params_json=message.params_json,
            provider_key=message.provider_key,
            fencing=message.fencing,
            token=message.token,
            lease_expired_at=_time(message, "lease_expired_at"),
            holder=message.holder,
        )


@dataclass(frozen=True)
class Completed:
    """A lookup's answer: it happened. ``receipt`` is what the agent's retry replays: a JSON value,
    or text with ``text=True``."""

    receipt: Any
    text: bool = False


@dataclass(frozen=True)
class Failed:
    """A lookup's answer: it definitely did not happen (the action may be granted again)."""


@dataclass(frozen=True)
class Unknown:
    """A lookup's answer: the provider cannot tell; the action is left for a person."""


Lookup = Completed | Failed | Unknown
"""What a resolver's lookup returns."""


class Settled(enum.Enum):
    """What a resolver made of one unresolved action."""

    COMPLETED = "completed"
    FAILED = "failed"
    BY_OTHER = "by_other"
    """Another resolver or an operator settled it first (or a newer grant replaced it)."""
    LEFT = "left"
    """Left for a person: no lookup, Unknown, the lookup raised or timed out, or the settlement
    failed (logged)."""


def _time(message: object, field: str) -> datetime | None:
    """An aware UTC datetime from a Timestamp field, or ``None`` when it is unset."""
    if not message.HasField(field):  # type: ignore[attr-defined]
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, field)
    # What Timestamp.ToDatetime(tzinfo=timezone.utc) returns, at a fraction of its cost
    # (timedelta's arguments positional: half the cost of keywords).
    return _EPOCH + timedelta(0, stamp.seconds, stamp.nanos // 1000)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
