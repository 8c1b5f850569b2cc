"""Mapping gRPC statuses with rich details to exceptions by reason."""

from __future__ import annotations

import ast
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc
import pytest

import oncegate.errors
from oncegate import (
    BudgetExceededError,
    CompletedByOther,
    InProgress,
    KeyReused,
    LeaseExpiredUnresolved,
    OncegateError,
    RateLimited,
    StoreUnavailable,
    TransportError,
)
from oncegate.errors import from_rpc_error
from oncegate.errors.status import BY_REASON
from oncegate.v1.oncegate_pb2 import ErrorReason

from fake_gate import Abort


class FailedCall(grpc.RpcError):
    """What a failed unary call raises: an RpcError that is also a grpc.Call."""

    def __init__(self, status: grpc.Status) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    def trailing_metadata(self) -> tuple[Any, ...]:
        return tuple(self._status.trailing_metadata)


def error_for(abort: Abort) -> OncegateError:
    return from_rpc_error(FailedCall(abort.status()))


def test_key_reused_names_the_differing_fields() -> None:
    error = error_for(
        Abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "IDEMPOTENCY_KEY_REUSED",
            "reused",
            {"differing_fields": "/amount,/to/iban,intent_id"},
        )
    )
    assert isinstance(error, KeyReused)
    assert error.differing_fields == ("/amount", "/to/iban", "intent_id")
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION and not error.retryable
    assert str(error) == "IDEMPOTENCY_KEY_REUSED: reused"


def test_in_progress_prefers_retry_info() -> None:
    error = error_for(
        Abort(
            grpc.StatusCode.ABORTED,
            "IDEMPOTENCY_IN_PROGRESS",
            "busy",
            {"retry_after_ms": "9000"},
            retry_delay=1.5,
        )
    )
    assert isinstance(error, InProgress) and error.retryable
    assert error.retry_after_ms == 1500
    error = error_for(
        Abort(grpc.StatusCode.ABORTED, "IDEMPOTENCY_IN_PROGRESS", "busy", {"retry_after_ms": "250"})
    )
    assert error.retry_after_ms == 250


def test_retry_after_in_seconds_is_a_deprecated_alias() -> None:
    error = error_for(Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED", "slow down", retry_delay=2.5))
    with pytest.warns(DeprecationWarning, match="retry_after_ms"):
        assert error.retry_after == pytest.approx(2.5)
    with pytest.warns(DeprecationWarning, match="retry_after_ms"):
        made = RateLimited("slow down", retry_after=0.75)
    assert made.retry_after_ms == 750
    with pytest.raises(TypeError, match="not both"):
        RateLimited("slow down", retry_after=1.0, retry_after_ms=1000)
    assert TransportError("no gate").retry_after_ms is None


def test_a_budget_refusal_carries_its_amounts_and_when_it_frees_up() -> None:
    message = (
        'budget "eur-per-day" would be exceeded: 9950.00 of 10000.00 used in the last 1 d, and this '
        "action needs 100.00; nothing was recorded; it frees up at 2026-12-03T14:05:00Z (in 23 h 59 min)"
    )
    error = error_for(
        Abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "BUDGET_EXCEEDED",
            message,
            {
                "budget": "eur-per-day",
                "used": "9950.00",
                "limit": "10000.00",
                "requested": "100.00",
                "retry_at": "2026-12-03T14:05:00Z",
                "retry_after_ms": "86340000",
            },
            retry_delay=86340.0,
        )
    )
    assert isinstance(error, BudgetExceededError) and not error.retryable
    assert (error.budget, error.used, error.limit, error.requested) == (
        "eur-per-day",
        "9950.00",
        "10000.00",
        "100.00",
    )
    assert error.retry_at == datetime(2026, 12, 3, 14, 5, tzinfo=timezone.utc)
    assert error.retry_after_ms == 86_340_000
    assert str(error) == f"BUDGET_EXCEEDED: {message}"
    alone = error_for(
        Abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "BUDGET_EXCEEDED",
            "too big",
            {"budget": "eur-per-day", "used": "0.00", "limit": "10.00", "requested": "11.00"},
        )
    )
    assert isinstance(alone, BudgetExceededError)
    assert alone.retry_at is None and alone.retry_after_ms is None and alone.requested == "11.00"


def test_lease_expired_unresolved_metadata() -> None:
    error = error_for(
        Abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "LEASE_EXPIRED_UNRESOLVED",
            "expired",
            {"token": "tok-1", "fencing": "3", "lease_expired_at": "2026-10-17T10:00:00.123456789Z"},
        )
    )
    assert isinstance(error, LeaseExpiredUnresolved)
    assert (error.token, error.fencing) == ("tok-1", 3)
    assert error.lease_expired_at == datetime(2026, 10, 17, 10, 0, 0, 123456, tzinfo=timezone.utc)


def test_completed_by_other_metadata() -> None:
    error = error_for(
        Abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "COMPLETED_BY_OTHER",
            "other",
            {"fencing": "2", "completed_at": "2026-10-17T10:00:00Z"},
        )
    )
    assert isinstance(error, CompletedByOther) and error.fencing == 2
    assert error.completed_at == datetime(2026, 10, 17, 10, tzinfo=timezone.utc)


def test_transient_reasons() -> None:
    assert isinstance(
        error_for(Abort(grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", "down")), StoreUnavailable
    )
    limited = error_for(
        Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED", "slow down", retry_delay=2.0)
    )
    assert isinstance(limited, RateLimited) and limited.retryable and limited.retry_after_ms == 2000


def test_unknown_reason_keeps_the_reason() -> None:
    error = error_for(Abort(grpc.StatusCode.FAILED_PRECONDITION, "SOMETHING_NEW", "new", {"k": "v"}))
    assert type(error) is OncegateError
    assert error.reason == "SOMETHING_NEW" and error.metadata == {"k": "v"}


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True),
        (grpc.StatusCode.UNIMPLEMENTED, False),
        (grpc.StatusCode.UNAUTHENTICATED, False),
    ],
)
def test_statuses_without_error_info_are_transport_errors(code: grpc.StatusCode, retryable: bool) -> None:
    error = error_for(Abort(code, None, "no details"))
    assert isinstance(error, TransportError)
    assert error.reason is None and error.code is code and error.retryable is retryable


def test_error_info_of_another_domain_is_ignored() -> None:
    status = Abort(grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", "proxy").status()
    foreign = grpc.Status()
    foreign.code, foreign.details = status.code, status.details
    foreign.trailing_metadata = tuple(
        (key, value.replace(b"oncegate", b"envoyxyz") if isinstance(value, bytes) else value)
        for key, value in status.trailing_metadata
    )
    assert isinstance(from_rpc_error(FailedCall(foreign)), TransportError)


REASON_NAMES = frozenset(ErrorReason.keys())
REASONS = sorted(REASON_NAMES - {"ERROR_REASON_UNSPECIFIED"})


def test_every_error_reason_of_the_proto_has_a_class() -> None:
    assert set(BY_REASON) == set(REASONS)
    for reason, cls in BY_REASON.items():
        assert cls is OncegateError or reason == cls.REASON
    # The generic class serves exactly the reasons a client cannot act on (see errors/status.py).
    assert {reason for reason, cls in BY_REASON.items() if cls is OncegateError} == {
        "LEASE_NOT_EXPIRED",
        "APPROVAL_NOT_PENDING",
        "ALREADY_SETTLED",
        "INTERNAL",
    }


@pytest.mark.parametrize("reason", REASONS)
def test_each_reason_decodes_to_its_class(reason: str) -> None:
    error = error_for(Abort(grpc.StatusCode.FAILED_PRECONDITION, reason, "refused"))
    assert type(error) is BY_REASON[reason]
    assert error.reason == reason and str(error) == f"{reason}: refused"


def test_reasons_are_read_from_the_proto_not_typed_by_hand() -> None:
    typed = [
        (path.name, node.value)
        for path in sorted(Path(oncegate.errors.__file__).parent.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in REASON_NAMES
    ]
    assert typed == []
    specific = [cls for cls in BY_REASON.values() if cls is not OncegateError]
    assert all(cls.REASON is not None and cls.REASON in REASON_NAMES for cls in specific)
