"""An in-memory ActionGateService for the client's unit tests.

It follows the gate's state table (grant, replay, in progress, key reused, expired, release,
complete) and answers errors the way the gate does (one ``ErrorInfo`` in the rich status, plus
``RetryInfo`` or ``BadRequest``), so the guard's protocol can be tested without the Rust server.
It can also inject failures: transient ``STORE_UNAVAILABLE`` answers, and replies lost after the
state changed. The integration tests check the same behaviour against the real gate.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import duration_pb2, timestamp_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from oncegate.fingerprints import ParamsError, fingerprint, parse_params, select_key_fields
from oncegate.v1 import oncegate_pb2 as pb
from oncegate.v1 import oncegate_pb2_grpc as pb_grpc


class Abort(Exception):
    """An error answer: gRPC code, ErrorInfo reason and details."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str | None,
        message: str,
        metadata: Mapping[str, str] | None = None,
        retry_delay: float | None = None,
        violation: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.metadata, self.retry_delay, self.violation = dict(metadata or {}), retry_delay, violation

    def status(self) -> grpc.Status:
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        if self.reason is not None:
            status.details.add().Pack(
                error_details_pb2.ErrorInfo(reason=self.reason, domain="oncegate", metadata=self.metadata)
            )
        if self.retry_delay is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(int(self.retry_delay * 1e9))
            status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        if self.violation is not None:
            bad = error_details_pb2.BadRequest()
            bad.field_violations.add(field=self.violation[0], description=self.violation[1])
            status.details.add().Pack(bad)
        return rpc_status.to_status(status)


@dataclass
class Record:
    """One action key's record."""

    fingerprint: str
    fields: dict[str, str]
    fencing: int = 0
    state: pb.ActionState = pb.ACTION_STATE_ABSENT
    token: str = ""
    holder: str = ""
    lease_until: float = 0.0
    granted_tokens: set[str] = field(default_factory=set)
    completion: pb.Completion | None = None


def _stamp(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


class FakeGate(pb_grpc.ActionGateServiceServicer):
    """The servicer. ``key_fields`` maps action names to their policy's JSON Pointers."""

    def __init__(self, key_fields: Mapping[str, list[str]] | None = None, lease_ttl: float = 300.0) -> None:
        self.key_fields = dict(key_fields or {})
        self.lease_ttl = lease_ttl
        self.records: dict[tuple[str, str, str], Record] = {}
        self.calls: Counter[str] = Counter()
        self.fail_next: Counter[str] = Counter()
        """Method name → how many calls to answer with STORE_UNAVAILABLE before applying them."""
        self.lose_reply: Counter[str] = Counter()
        """Method name → how many calls to apply and then answer UNAVAILABLE (a lost reply)."""
        self.metadata: list[dict[str, str]] = []
        self._lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------------

    def _serve(self, name: str, context: grpc.ServicerContext, handler: Any) -> Any:
        with self._lock:
            self.calls[name] += 1
            self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
            try:
                if self.fail_next[name] > 0:
                    self.fail_next[name] -= 1
                    raise Abort(grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", "store down (injected)")
                reply = handler()
                if self.lose_reply[name] > 0:
                    self.lose_reply[name] -= 1
                    raise Abort(grpc.StatusCode.UNAVAILABLE, None, "connection reset (injected)")
                return reply
            except Abort as abort:
                failure = abort
        context.abort_with_status(failure.status())

    def _record(self, ref: pb.ActionRef) -> tuple[tuple[str, str, str], Record | None]:
        key = (ref.scope.agent_id, ref.scope.run_id, ref.key)
        return key, self.records.get(key)

    @staticmethod
    def _expired(record: Record) -> bool:
        return record.state == pb.ACTION_STATE_AUTHORIZED and time.time() >= record.lease_until

    # -- RPCs -------------------------------------------------------------------------------

    def RequestToken(self, request: pb.RequestTokenRequest, context: grpc.ServicerContext) -> Any:
        return self._serve("RequestToken", context, lambda: self._request_token(request))

    def _request_token(self, request: pb.RequestTokenRequest) -> pb.RequestTokenResponse:
        try:
            params = parse_params(request.params_json)
        except ParamsError as err:
            raise Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUEST",
                str(err),
                {"field": "params_json"},
                violation=("params_json", str(err)),
            ) from None
        key_fields = self.key_fields.get(request.action)
        fp = fingerprint(request.action, params, request.intent_id, key_fields)
        selection = select_key_fields(params, key_fields)
        fields = {"action": request.action, "intent_id": request.intent_id}
        for name, value in selection.items():
            pointer = name if key_fields is not None else "/" + name.replace("~", "~0").replace("/", "~1")
            fields[pointer] = json.dumps(value, sort_keys=True)
        scope = request.scope
        ref = pb.ActionRef(scope=scope, key=request.idempotency_key or fp)
        _, record = self._record(ref)
        if record is not None and record.fingerprint != fp and record.state != pb.ACTION_STATE_ABSENT:
            differing = sorted(
                n for n in set(record.fields) | set(fields) if record.fields.get(n) != fields.get(n)
            )
            raise Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "IDEMPOTENCY_KEY_REUSED",
                "the idempotency key was used for a request with other key fields",
                {"differing_fields": ",".join(differing)},
            )
        response = pb.RequestTokenResponse(action=ref, fingerprint=fp)
        if record is not None and record.completion is not None:
            response.decision = pb.DECISION_ALREADY_COMPLETED
            response.completion.CopyFrom(record.completion)
            return response
        if record is not None and record.state == pb.ACTION_STATE_AUTHORIZED:
            if self._expired(record):
                raise Abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "LEASE_EXPIRED_UNRESOLVED",
                    "lease expired",
                    {
                        "token": record.token,
                        "fencing": str(record.fencing),
                        "lease_expired_at": _stamp(record.lease_until).ToJsonString(),
                    },
                )
            if request.holder and request.holder == record.holder:
                response.redelivered = True
            else:
                left = record.lease_until - time.time()
                raise Abort(
                    grpc.StatusCode.ABORTED,
                    "IDEMPOTENCY_IN_PROGRESS",
                    "another holder is running it",
                    {"retry_after_ms": str(int(left * 1000))},
                    retry_delay=left,
                )
        else:
            ttl = request.lease_ttl.ToNanoseconds() / 1e9 if request.HasField("lease_ttl") else self.lease_ttl
            record = record if record is not None else Record(fp, fields)
            record.fingerprint, record.fields = fp, fields
            record.fencing += 1
            record.state = pb.ACTION_STATE_AUTHORIZED
            record.token = uuid.uuid4().hex
            record.granted_tokens.add(record.token)
            record.holder = request.holder
            record.lease_until = time.time() + ttl
            self.records[(scope.agent_id, scope.run_id, ref.key)] = record
        response.decision = pb.DECISION_GRANTED
        digest = hashlib.sha256(f"{scope.agent_id}\0{scope.run_id}\0{ref.key}".encode()).hexdigest()
        response.grant.CopyFrom(
            pb.Grant(
                token=record.token,
                fencing=record.fencing,
                lease_expires_at=_stamp(record.lease_until),
                provider_key=f"og-{digest[:32]}",
            )
        )
        return response

    def Complete(self, request: pb.CompleteRequest, context: grpc.ServicerContext) -> Any:
        return self._serve("Complete", context, lambda: self._complete(request))

    def _complete(self, request: pb.CompleteRequest) -> pb.CompleteResponse:
        _, record = self._record(request.action)
        if record is None:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "TOKEN_UNKNOWN", "no record")
        if request.token not in record.granted_tokens:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "TOKEN_MISMATCH", "token never granted")
        if record.completion is not None:
            if record.completion.token == request.token:
                return pb.CompleteResponse(completion=record.completion)
            raise Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "COMPLETED_BY_OTHER",
                "completed by another token",
                {
                    "fencing": str(record.fencing),
                    "completed_at": record.completion.completed_at.ToJsonString(),
                },
            )
        record.state = pb.ACTION_STATE_COMPLETED
        record.completion = pb.Completion(
            receipt=request.receipt,
            completed_at=_stamp(time.time()),
            fencing=record.fencing,
            token=request.token,
            source=pb.COMPLETION_SOURCE_WORKER,
        )
        return pb.CompleteResponse(completion=record.completion)

    def Release(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> Any:
        return self._serve("Release", context, lambda: self._release(request))

    def _release(self, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        if request.reason == pb.RELEASE_REASON_UNSPECIFIED:
            raise Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUEST",
                "a release must say why",
                {"field": "reason"},
                violation=("reason", "must be set"),
            )
        record = self._live(request.action, request.token)
        record.state = pb.ACTION_STATE_ABSENT
        record.token = ""
        return pb.ReleaseResponse(fencing=record.fencing)

    def ExtendLease(self, request: pb.ExtendLeaseRequest, context: grpc.ServicerContext) -> Any:
        return self._serve("ExtendLease", context, lambda: self._extend(request))

    def _extend(self, request: pb.ExtendLeaseRequest) -> pb.ExtendLeaseResponse:
        record = self._live(request.action, request.token)
        record.lease_until = time.time() + request.ttl.ToNanoseconds() / 1e9
        return pb.ExtendLeaseResponse(lease_expires_at=_stamp(record.lease_until))

    def _live(self, ref: pb.ActionRef, token: str) -> Record:
        _, record = self._record(ref)
        if record is None:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "TOKEN_UNKNOWN", "no record")
        if record.state == pb.ACTION_STATE_COMPLETED:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_COMPLETED", "already completed")
        if record.state != pb.ACTION_STATE_AUTHORIZED or record.token != token:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "TOKEN_MISMATCH", "not the live token")
        return record

    def GetAction(self, request: pb.GetActionRequest, context: grpc.ServicerContext) -> Any:
        return self._serve("GetAction", context, lambda: self._get(request))

    def _get(self, request: pb.GetActionRequest) -> pb.GetActionResponse:
        _, record = self._record(request.action)
        if record is None:
            return pb.GetActionResponse(state=pb.ACTION_STATE_ABSENT)
        response = pb.GetActionResponse(
            state=pb.ACTION_STATE_EXPIRED if self._expired(record) else record.state,
            fencing=record.fencing,
            fingerprint=record.fingerprint,
            holder=record.holder,
        )
        if record.state == pb.ACTION_STATE_AUTHORIZED:
            response.lease_expires_at.CopyFrom(_stamp(record.lease_until))
        if record.completion is not None:
            response.completion.CopyFrom(record.completion)
        return response


@contextmanager
def serve(gate: FakeGate) -> Iterator[str]:
    """Serves ``gate`` on a free loopback port; yields its ``host:port``."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_ActionGateServiceServicer_to_server(gate, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
