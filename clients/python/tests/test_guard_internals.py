"""What the guard does per call, kept cheap (it is paid on every guarded call) without changing what it means: heartbeats
share one thread, plain signatures bind without ``inspect``, holders need no system call, and
timestamps convert exactly as protobuf converts them."""

from __future__ import annotations

import inspect
import os
import re
import threading
import time
from datetime import timezone
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from oncegate import ActionState, Gate, Grant, Scope
from oncegate.guard import protocol
from oncegate.guard.binding import Binding
from oncegate.models import _time

from fake_gate import FakeGate


def heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("oncegate-heartbeat")]


def test_concurrent_long_actions_share_one_heartbeat_thread(
    fake_gate: Gate, fake: FakeGate, run_id: str
) -> None:
    states: dict[int, ActionState] = {}
    start = threading.Barrier(6)

    def worker(n: int) -> None:
        def long_work(grant: Grant) -> str:
            start.wait()
            time.sleep(1.5)
            states[n] = fake_gate.get_action(attempt.action).state  # type: ignore[arg-type]
            assert len(heartbeat_threads()) == 1
            return "done"

        attempt = fake_gate.attempt("pay", {"n": n}, lease_ttl=0.6, agent_id="a", run_id=run_id)
        assert attempt.run(long_work) == "done"

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    # Every lease was kept alive past twice its length, by the one scheduler thread.
    assert states == {n: ActionState.AUTHORIZED for n in range(6)}
    assert fake.calls["ExtendLease"] >= 6 * 2
    assert len(heartbeat_threads()) == 1


def test_a_stopped_heartbeat_extends_no_more(fake_gate: Gate, fake: FakeGate, run_id: str) -> None:
    for n in range(50):
        fake_gate.run("pay", {"n": n}, lambda grant, n=n: n, lease_ttl=0.3, agent_id="a", run_id=run_id)
    time.sleep(0.5)
    assert fake.calls["ExtendLease"] == 0
    assert len(heartbeat_threads()) == 1


def test_holders_are_unique_per_attempt_and_name_the_process() -> None:
    holders = {protocol.default_holder() for _ in range(10_000)}
    assert len(holders) == 10_000
    assert all(h.startswith("py:") and f":{os.getpid()}:" in h for h in holders)


def tool(order_id: str, amount: int = 100, *, currency: str = "EUR", grant: Any = None) -> None:
    """A plain signature: every parameter can be passed by name."""


def positional_only(order_id: str, /, amount: int, grant: Any = None) -> None:
    """Not plain: bound by inspect."""


def with_kwargs(order_id: str, grant: Any = None, **extra: Any) -> None:
    """Not plain: bound by inspect."""


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("o-1",), {}),
    (("o-1", 5), {}),
    ((), {"order_id": "o-1", "amount": 5, "currency": "USD"}),
    (("o-1",), {"currency": "USD"}),
    (("o-1",), {"amount": 7}),
    ((), {"amount": 7, "order_id": "o-1"}),
    # Calls that do not fit: the signature says why.
    ((), {}),
    (("o-1", 5, "USD"), {}),
    (("o-1",), {"order_id": "o-2"}),
    (("o-1",), {"colour": "red"}),
    (("o-1",), {"grant": "mine"}),
]


@pytest.mark.parametrize("fn", [tool, positional_only, with_kwargs])
@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_binding_agrees_with_inspect(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    binding = Binding(fn, "pay")
    try:
        expected = binding.signature.bind(*args, **kwargs)
    except TypeError as err:
        with pytest.raises(TypeError, match=re.escape(str(err))):
            binding.bind(args, kwargs, scope=_scope())
        return
    expected.apply_defaults()
    arguments = dict(expected.arguments)
    params: dict[str, Any] = {}
    for name, value in arguments.items():
        if binding.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            params.update(value)
        else:
            params[name] = value
    call = binding.bind(args, kwargs, scope=_scope())
    assert call.request.params == params
    assert list(call.request.params) == list(params), "in the signature's order"


def _scope() -> Scope:
    return Scope("a", "r")


def test_plain_binding_calls_back_with_the_grant() -> None:
    seen: dict[str, Any] = {}

    def pay(order_id: str, amount: int = 1, *, grant: Any) -> str:
        seen.update(order_id=order_id, amount=amount, grant=grant)
        return "paid"

    call = Binding(pay, "pay").bind(("o-9",), {"agent_id": "a", "run_id": "r"})
    assert call.request.params == {"order_id": "o-9", "amount": 1}
    assert call.request.scope.agent_id == "a"
    assert call.invoke("the-grant") == "paid"  # type: ignore[arg-type]
    assert seen == {"order_id": "o-9", "amount": 1, "grant": "the-grant"}


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [
        (0, 0),
        (1_796_054_826, 0),
        (1_796_054_826, 999_999_999),
        (1_796_054_826, 1_500),
        (253_402_300_799, 999),
    ],
)
def test_timestamps_convert_as_protobuf_does(seconds: int, nanos: int) -> None:
    class Holder:
        def __init__(self) -> None:
            self.at = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)

        def HasField(self, field: str) -> bool:  # protobuf's name
            return True

    assert _time(Holder(), "at") == Holder().at.ToDatetime(tzinfo=timezone.utc)
