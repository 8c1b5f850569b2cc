import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_GRANTED: _ClassVar[Decision]
    DECISION_ALREADY_COMPLETED: _ClassVar[Decision]
    DECISION_PENDING_APPROVAL: _ClassVar[Decision]

class CompletionSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPLETION_SOURCE_UNSPECIFIED: _ClassVar[CompletionSource]
    COMPLETION_SOURCE_WORKER: _ClassVar[CompletionSource]
    COMPLETION_SOURCE_OPERATOR: _ClassVar[CompletionSource]

class ReceiptFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECEIPT_FORMAT_UNSPECIFIED: _ClassVar[ReceiptFormat]
    RECEIPT_FORMAT_JSON: _ClassVar[ReceiptFormat]
    RECEIPT_FORMAT_TEXT: _ClassVar[ReceiptFormat]

class ReleaseReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_REASON_UNSPECIFIED: _ClassVar[ReleaseReason]
    RELEASE_REASON_DEFINITE_FAILURE: _ClassVar[ReleaseReason]
    RELEASE_REASON_NOT_ATTEMPTED: _ClassVar[ReleaseReason]

class ActionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_STATE_UNSPECIFIED: _ClassVar[ActionState]
    ACTION_STATE_ABSENT: _ClassVar[ActionState]
    ACTION_STATE_AUTHORIZED: _ClassVar[ActionState]
    ACTION_STATE_COMPLETED: _ClassVar[ActionState]
    ACTION_STATE_EXPIRED: _ClassVar[ActionState]

class ApprovalState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATE_UNSPECIFIED: _ClassVar[ApprovalState]
    APPROVAL_STATE_PENDING: _ClassVar[ApprovalState]
    APPROVAL_STATE_APPROVED: _ClassVar[ApprovalState]
    APPROVAL_STATE_DENIED: _ClassVar[ApprovalState]
    APPROVAL_STATE_USED: _ClassVar[ApprovalState]

class Resolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOLUTION_UNSPECIFIED: _ClassVar[Resolution]
    RESOLUTION_COMPLETED: _ClassVar[Resolution]
    RESOLUTION_FAILED: _ClassVar[Resolution]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    IDEMPOTENCY_KEY_REUSED: _ClassVar[ErrorReason]
    IDEMPOTENCY_IN_PROGRESS: _ClassVar[ErrorReason]
    LEASE_EXPIRED_UNRESOLVED: _ClassVar[ErrorReason]
    TOKEN_MISMATCH: _ClassVar[ErrorReason]
    TOKEN_UNKNOWN: _ClassVar[ErrorReason]
    COMPLETED_BY_OTHER: _ClassVar[ErrorReason]
    ALREADY_COMPLETED: _ClassVar[ErrorReason]
    LEASE_NOT_EXPIRED: _ClassVar[ErrorReason]
    INVALID_REQUEST: _ClassVar[ErrorReason]
    UNAUTHENTICATED: _ClassVar[ErrorReason]
    FORBIDDEN_SCOPE: _ClassVar[ErrorReason]
    RATE_LIMITED: _ClassVar[ErrorReason]
    STORE_UNAVAILABLE: _ClassVar[ErrorReason]
    INTERNAL: _ClassVar[ErrorReason]
    POLICY_DENIED: _ClassVar[ErrorReason]
    BUDGET_EXCEEDED: _ClassVar[ErrorReason]
    APPROVAL_NOT_PENDING: _ClassVar[ErrorReason]
    ALREADY_SETTLED: _ClassVar[ErrorReason]
DECISION_UNSPECIFIED: Decision
DECISION_GRANTED: Decision
DECISION_ALREADY_COMPLETED: Decision
DECISION_PENDING_APPROVAL: Decision
COMPLETION_SOURCE_UNSPECIFIED: CompletionSource
COMPLETION_SOURCE_WORKER: CompletionSource
COMPLETION_SOURCE_OPERATOR: CompletionSource
RECEIPT_FORMAT_UNSPECIFIED: ReceiptFormat
RECEIPT_FORMAT_JSON: ReceiptFormat
RECEIPT_FORMAT_TEXT: ReceiptFormat
RELEASE_REASON_UNSPECIFIED: ReleaseReason
RELEASE_REASON_DEFINITE_FAILURE: ReleaseReason
RELEASE_REASON_NOT_ATTEMPTED: ReleaseReason
ACTION_STATE_UNSPECIFIED: ActionState
ACTION_STATE_ABSENT: ActionState
ACTION_STATE_AUTHORIZED: ActionState
ACTION_STATE_COMPLETED: ActionState
ACTION_STATE_EXPIRED: ActionState
APPROVAL_STATE_UNSPECIFIED: ApprovalState
APPROVAL_STATE_PENDING: ApprovalState
APPROVAL_STATE_APPROVED: ApprovalState
APPROVAL_STATE_DENIED: ApprovalState
APPROVAL_STATE_USED: ApprovalState
RESOLUTION_UNSPECIFIED: Resolution
RESOLUTION_COMPLETED: Resolution
RESOLUTION_FAILED: Resolution
ERROR_REASON_UNSPECIFIED: ErrorReason
IDEMPOTENCY_KEY_REUSED: ErrorReason
IDEMPOTENCY_IN_PROGRESS: ErrorReason
LEASE_EXPIRED_UNRESOLVED: ErrorReason
TOKEN_MISMATCH: ErrorReason
TOKEN_UNKNOWN: ErrorReason
COMPLETED_BY_OTHER: ErrorReason
ALREADY_COMPLETED: ErrorReason
LEASE_NOT_EXPIRED: ErrorReason
INVALID_REQUEST: ErrorReason
UNAUTHENTICATED: ErrorReason
FORBIDDEN_SCOPE: ErrorReason
RATE_LIMITED: ErrorReason
STORE_UNAVAILABLE: ErrorReason
INTERNAL: ErrorReason
POLICY_DENIED: ErrorReason
BUDGET_EXCEEDED: ErrorReason
APPROVAL_NOT_PENDING: ErrorReason
ALREADY_SETTLED: ErrorReason

class SessionRequest(_message.Message):
    __slots__ = ("id", "timeout", "request_token", "complete")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout: _duration_pb2.Duration
    request_token: RequestTokenRequest
    complete: CompleteRequest
    def __init__(self, id: _Optional[int] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request_token: _Optional[_Union[RequestTokenRequest, _Mapping]] = ..., complete: _Optional[_Union[CompleteRequest, _Mapping]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("id", "request_token", "complete", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    request_token: RequestTokenResponse
    complete: CompleteResponse
    error: SessionError
    def __init__(self, id: _Optional[int] = ..., request_token: _Optional[_Union[RequestTokenResponse, _Mapping]] = ..., complete: _Optional[_Union[CompleteResponse, _Mapping]] = ..., error: _Optional[_Union[SessionError, _Mapping]] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("code", "message", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    details: bytes
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., details: _Optional[bytes] = ...) -> None: ...

class Scope(_message.Message):
    __slots__ = ("agent_id", "run_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    run_id: str
    def __init__(self, agent_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class ActionRef(_message.Message):
    __slots__ = ("scope", "key")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    key: str
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., key: _Optional[str] = ...) -> None: ...

class RequestTokenRequest(_message.Message):
    __slots__ = ("scope", "action", "params_json", "intent_id", "idempotency_key", "holder", "lease_ttl")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    action: str
    params_json: str
    intent_id: str
    idempotency_key: str
    holder: str
    lease_ttl: _duration_pb2.Duration
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., action: _Optional[str] = ..., params_json: _Optional[str] = ..., intent_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., holder: _Optional[str] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RequestTokenResponse(_message.Message):
    __slots__ = ("decision", "action", "fingerprint", "grant", "completion", "redelivered", "approval")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    action: ActionRef
    fingerprint: str
    grant: Grant
    completion: Completion
    redelivered: bool
    approval: Approval
    def __init__(self, decision: _Optional[_Union[Decision, str]] = ..., action: _Optional[_Union[ActionRef, _Mapping]] = ..., fingerprint: _Optional[str] = ..., grant: _Optional[_Union[Grant, _Mapping]] = ..., completion: _Optional[_Union[Completion, _Mapping]] = ..., redelivered: _Optional[bool] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("id", "expires_at", "policy_id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    expires_at: _timestamp_pb2.Timestamp
    policy_id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., policy_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("token", "fencing", "lease_expires_at", "provider_key", "replicas_acknowledged", "statement")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_KEY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    token: str
    fencing: int
    lease_expires_at: _timestamp_pb2.Timestamp
    provider_key: str
    replicas_acknowledged: int
    statement: str
    def __init__(self, token: _Optional[str] = ..., fencing: _Optional[int] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., provider_key: _Optional[str] = ..., replicas_acknowledged: _Optional[int] = ..., statement: _Optional[str] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("receipt", "completed_at", "fencing", "token", "source", "note", "operator", "seq", "statement", "receipt_format")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    receipt: bytes
    completed_at: _timestamp_pb2.Timestamp
    fencing: int
    token: str
    source: CompletionSource
    note: str
    operator: str
    seq: int
    statement: str
    receipt_format: ReceiptFormat
    def __init__(self, receipt: _Optional[bytes] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fencing: _Optional[int] = ..., token: _Optional[str] = ..., source: _Optional[_Union[CompletionSource, str]] = ..., note: _Optional[str] = ..., operator: _Optional[str] = ..., seq: _Optional[int] = ..., statement: _Optional[str] = ..., receipt_format: _Optional[_Union[ReceiptFormat, str]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("action", "token", "receipt")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    token: str
    receipt: bytes
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., token: _Optional[str] = ..., receipt: _Optional[bytes] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("completion",)
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    completion: Completion
    def __init__(self, completion: _Optional[_Union[Completion, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("action", "token", "reason")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    token: str
    reason: ReleaseReason
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., token: _Optional[str] = ..., reason: _Optional[_Union[ReleaseReason, str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("fencing",)
    FENCING_FIELD_NUMBER: _ClassVar[int]
    fencing: int
    def __init__(self, fencing: _Optional[int] = ...) -> None: ...

class ExtendLeaseRequest(_message.Message):
    __slots__ = ("action", "token", "ttl")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    token: str
    ttl: _duration_pb2.Duration
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., token: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ExtendLeaseResponse(_message.Message):
    __slots__ = ("lease_expires_at",)
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at: _timestamp_pb2.Timestamp
    def __init__(self, lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetActionRequest(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ...) -> None: ...

class GetActionResponse(_message.Message):
    __slots__ = ("state", "fencing", "fingerprint", "lease_expires_at", "completion", "holder", "token", "provider_key", "action_name", "params_json")
    STATE_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_KEY_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    state: ActionState
    fencing: int
    fingerprint: str
    lease_expires_at: _timestamp_pb2.Timestamp
    completion: Completion
    holder: str
    token: str
    provider_key: str
    action_name: str
    params_json: str
    def __init__(self, state: _Optional[_Union[ActionState, str]] = ..., fencing: _Optional[int] = ..., fingerprint: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completion: _Optional[_Union[Completion, _Mapping]] = ..., holder: _Optional[str] = ..., token: _Optional[str] = ..., provider_key: _Optional[str] = ..., action_name: _Optional[str] = ..., params_json: _Optional[str] = ...) -> None: ...

class WatchUnresolvedRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class WatchUnresolvedResponse(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: UnresolvedAction
    def __init__(self, action: _Optional[_Union[UnresolvedAction, _Mapping]] = ...) -> None: ...

class CreateConsoleLoginRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateConsoleLoginResponse(_message.Message):
    __slots__ = ("code", "expires_in", "principal")
    CODE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    code: str
    expires_in: _duration_pb2.Duration
    principal: str
    def __init__(self, code: _Optional[str] = ..., expires_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., principal: _Optional[str] = ...) -> None: ...

class ListUndeliverableEventsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class UndeliverableEvent(_message.Message):
    __slots__ = ("id", "webhook", "event_type", "attempts", "last_error", "created_at", "given_up_at", "body")
    ID_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    GIVEN_UP_AT_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    id: str
    webhook: str
    event_type: str
    attempts: int
    last_error: str
    created_at: _timestamp_pb2.Timestamp
    given_up_at: _timestamp_pb2.Timestamp
    body: str
    def __init__(self, id: _Optional[str] = ..., webhook: _Optional[str] = ..., event_type: _Optional[str] = ..., attempts: _Optional[int] = ..., last_error: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., given_up_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., body: _Optional[str] = ...) -> None: ...

class ListUndeliverableEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token", "pending", "undeliverable")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    UNDELIVERABLE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[UndeliverableEvent]
    next_page_token: str
    pending: int
    undeliverable: int
    def __init__(self, events: _Optional[_Iterable[_Union[UndeliverableEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., pending: _Optional[int] = ..., undeliverable: _Optional[int] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("action", "approval_id", "approve", "note")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    approval_id: str
    approve: bool
    note: str
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., approval_id: _Optional[str] = ..., approve: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...

class ApprovalEntry(_message.Message):
    __slots__ = ("action", "approval", "state", "action_name", "fingerprint", "created_at", "operator", "note", "params_json")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    approval: Approval
    state: ApprovalState
    action_name: str
    fingerprint: str
    created_at: _timestamp_pb2.Timestamp
    operator: str
    note: str
    params_json: str
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ..., state: _Optional[_Union[ApprovalState, str]] = ..., action_name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., operator: _Optional[str] = ..., note: _Optional[str] = ..., params_json: _Optional[str] = ...) -> None: ...

class DecideApprovalResponse(_message.Message):
    __slots__ = ("approval",)
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    approval: ApprovalEntry
    def __init__(self, approval: _Optional[_Union[ApprovalEntry, _Mapping]] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("agent_id", "page_size", "page_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    page_size: int
    page_token: str
    def __init__(self, agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[ApprovalEntry]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[ApprovalEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetBudgetsRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class BudgetUsage(_message.Message):
    __slots__ = ("budget", "action_name", "group", "used", "limit", "window", "next_release_at")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    NEXT_RELEASE_AT_FIELD_NUMBER: _ClassVar[int]
    budget: str
    action_name: str
    group: str
    used: str
    limit: str
    window: _duration_pb2.Duration
    next_release_at: _timestamp_pb2.Timestamp
    def __init__(self, budget: _Optional[str] = ..., action_name: _Optional[str] = ..., group: _Optional[str] = ..., used: _Optional[str] = ..., limit: _Optional[str] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., next_release_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetBudgetsResponse(_message.Message):
    __slots__ = ("budgets",)
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[BudgetUsage]
    def __init__(self, budgets: _Optional[_Iterable[_Union[BudgetUsage, _Mapping]]] = ...) -> None: ...

class RecordExternalCompletionRequest(_message.Message):
    __slots__ = ("action", "receipt", "note", "action_name", "params_json", "intent_id", "receipt_format")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    receipt: bytes
    note: str
    action_name: str
    params_json: str
    intent_id: str
    receipt_format: ReceiptFormat
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., receipt: _Optional[bytes] = ..., note: _Optional[str] = ..., action_name: _Optional[str] = ..., params_json: _Optional[str] = ..., intent_id: _Optional[str] = ..., receipt_format: _Optional[_Union[ReceiptFormat, str]] = ...) -> None: ...

class RecordExternalCompletionResponse(_message.Message):
    __slots__ = ("completion", "recorded")
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    completion: Completion
    recorded: bool
    def __init__(self, completion: _Optional[_Union[Completion, _Mapping]] = ..., recorded: _Optional[bool] = ...) -> None: ...

class ResolveExpiredRequest(_message.Message):
    __slots__ = ("action", "resolution", "receipt", "note", "receipt_format", "expected_fencing")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FENCING_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    resolution: Resolution
    receipt: bytes
    note: str
    receipt_format: ReceiptFormat
    expected_fencing: int
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., resolution: _Optional[_Union[Resolution, str]] = ..., receipt: _Optional[bytes] = ..., note: _Optional[str] = ..., receipt_format: _Optional[_Union[ReceiptFormat, str]] = ..., expected_fencing: _Optional[int] = ...) -> None: ...

class ResolveExpiredResponse(_message.Message):
    __slots__ = ("fencing", "completion")
    FENCING_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    fencing: int
    completion: Completion
    def __init__(self, fencing: _Optional[int] = ..., completion: _Optional[_Union[Completion, _Mapping]] = ...) -> None: ...

class ListUnresolvedRequest(_message.Message):
    __slots__ = ("agent_id", "page_size", "page_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    page_size: int
    page_token: str
    def __init__(self, agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class UnresolvedAction(_message.Message):
    __slots__ = ("action", "fencing", "lease_expired_at", "holder", "fingerprint", "token", "provider_key", "action_name", "params_json")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRED_AT_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_KEY_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    action: ActionRef
    fencing: int
    lease_expired_at: _timestamp_pb2.Timestamp
    holder: str
    fingerprint: str
    token: str
    provider_key: str
    action_name: str
    params_json: str
    def __init__(self, action: _Optional[_Union[ActionRef, _Mapping]] = ..., fencing: _Optional[int] = ..., lease_expired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., holder: _Optional[str] = ..., fingerprint: _Optional[str] = ..., token: _Optional[str] = ..., provider_key: _Optional[str] = ..., action_name: _Optional[str] = ..., params_json: _Optional[str] = ...) -> None: ...

class ListUnresolvedResponse(_message.Message):
    __slots__ = ("actions", "next_page_token")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[UnresolvedAction]
    next_page_token: str
    def __init__(self, actions: _Optional[_Iterable[_Union[UnresolvedAction, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ExportReceiptsRequest(_message.Message):
    __slots__ = ("agent_id", "after_seq", "page_size")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    after_seq: int
    page_size: int
    def __init__(self, agent_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class ReceiptEntry(_message.Message):
    __slots__ = ("seq", "action", "fingerprint", "receipt_digest", "fencing", "source", "completed_at", "statement")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    action: ActionRef
    fingerprint: str
    receipt_digest: str
    fencing: int
    source: CompletionSource
    completed_at: _timestamp_pb2.Timestamp
    statement: str
    def __init__(self, seq: _Optional[int] = ..., action: _Optional[_Union[ActionRef, _Mapping]] = ..., fingerprint: _Optional[str] = ..., receipt_digest: _Optional[str] = ..., fencing: _Optional[int] = ..., source: _Optional[_Union[CompletionSource, str]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., statement: _Optional[str] = ...) -> None: ...

class ExportReceiptsResponse(_message.Message):
    __slots__ = ("entries", "next_after_seq", "jwks")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    JWKS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ReceiptEntry]
    next_after_seq: int
    jwks: str
    def __init__(self, entries: _Optional[_Iterable[_Union[ReceiptEntry, _Mapping]]] = ..., next_after_seq: _Optional[int] = ..., jwks: _Optional[str] = ...) -> None: ...
