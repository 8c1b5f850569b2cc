"""The guard's options are typed: every entry point names each option as a keyword with its type
and default (what ``help()`` and a type checker read), takes them all at once as
``options=GuardOptions(...)``, and refuses an unknown option or both forms at once."""

from __future__ import annotations

import asyncio
import inspect
import pydoc
from collections.abc import Callable
from typing import Any

import pytest

import oncegate
import oncegate.aio
from oncegate import Gate, GuardOptions, InProgressError
from oncegate.guard.options import guard_options
from oncegate.integrations import langgraph, openai_agents, pydantic_ai

from fake_gate import FakeGate

OPTIONS = {
    name: parameter
    for name, parameter in inspect.signature(GuardOptions.__init__).parameters.items()
    if name != "self"
}
"""GuardOptions' fields (and the deprecated ``wait_timeout``): what every entry point must name."""

ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "Gate.action": oncegate.Gate.action,
    "Gate.run": oncegate.Gate.run,
    "Gate.attempt": oncegate.Gate.attempt,
    "aio.Gate.action": oncegate.aio.Gate.action,
    "aio.Gate.run": oncegate.aio.Gate.run,
    "aio.Gate.attempt": oncegate.aio.Gate.attempt,
    "openai_agents.guarded_function_tool": openai_agents.guarded_function_tool,
    "langgraph.guarded_tool": langgraph.guarded_tool,
    "pydantic_ai.guarded_tool": pydantic_ai.guarded_tool,
}


def test_guard_options_has_the_documented_fields() -> None:
    assert list(OPTIONS) == [
        "definite",
        "encode",
        "decode",
        "lease_ttl",
        "max_wait",
        "poll_interval",
        "retry_timeout",
        "heartbeat",
        "holder",
        "wait_timeout",
    ]


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_entry_point_names_every_option_with_its_type_and_default(name: str) -> None:
    parameters = inspect.signature(ENTRY_POINTS[name]).parameters
    assert not [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD], "no **options"
    assert parameters["options"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["options"].default is None
    assert parameters["options"].annotation == "GuardOptions | None"
    for option, expected in OPTIONS.items():
        parameter = parameters[option]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, option
        assert (parameter.annotation, parameter.default) == (expected.annotation, expected.default), option


@pytest.mark.parametrize("entry", [oncegate.Gate.action, oncegate.aio.Gate.run, pydantic_ai.guarded_tool])
def test_help_shows_every_option(entry: Callable[..., Any]) -> None:
    shown = pydoc.render_doc(entry, renderer=pydoc.plaintext)
    for option, parameter in OPTIONS.items():
        assert f"{option}: {parameter.annotation!r} = " in shown, option


def test_an_unknown_option_is_a_type_error(fake_gate: Gate) -> None:
    with pytest.raises(TypeError, match="max_wiat"):
        fake_gate.action("pay", max_wiat=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="max_wiat"):
        oncegate.aio.Gate("127.0.0.1:1").attempt("pay", {}, agent_id="a", run_id="r", max_wiat=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="max_wiat"):
        pydantic_ai.guarded_tool(oncegate.aio.Gate("127.0.0.1:1"), "pay", lambda: None, max_wiat=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"unknown guard options \['max_wiat'\]"):
        guard_options(None, max_wiat=5)


def test_options_or_keywords_not_both() -> None:
    preset = GuardOptions(max_wait=2.0)
    assert guard_options(preset) is preset
    assert guard_options(preset, max_wait=None, heartbeat=True) is preset  # the keywords at their defaults
    assert guard_options(None, max_wait=2.0, heartbeat=False) == GuardOptions(max_wait=2.0, heartbeat=False)
    with pytest.raises(TypeError, match=r"not both") as refused:
        oncegate.Gate("127.0.0.1:1").action("pay", options=preset, heartbeat=False)
    assert "heartbeat" in str(refused.value)
    with pytest.raises(TypeError, match="takes a GuardOptions, not dict"):
        guard_options({"max_wait": 2.0})  # type: ignore[arg-type]


def test_options_object_reaches_the_guard(
    fake_gate: Gate, fake: FakeGate, fake_target: str, run_id: str
) -> None:
    # Another holder's lease outlasts max_wait: the guard says so at once, naming the max_wait it used.
    scope = {"agent_id": "billing-agent", "run_id": run_id}
    fake_gate.request_token("pay", {"a": 1}, holder="other", **scope)
    quick = GuardOptions(max_wait=0.3, poll_interval=0.05)
    with pytest.raises(InProgressError, match=r"max_wait \(0\.3 s\)"):
        fake_gate.run("pay", {"a": 1}, lambda grant: None, options=quick, **scope)

    @fake_gate.action("pay", options=quick)
    def pay(a: int, grant: Any) -> None:
        raise AssertionError("another holder has the lease")

    with pytest.raises(InProgressError, match=r"max_wait \(0\.3 s\)"):
        pay(1, **scope)

    async def on_a_loop() -> None:
        async with oncegate.aio.Gate(fake_target, api_key="test-key", timeout=5.0) as gate:
            with pytest.raises(InProgressError, match=r"max_wait \(0\.7 s\)"):
                await gate.run("pay", {"a": 1}, lambda grant: None, max_wait=0.7, **scope)

    asyncio.run(on_a_loop())
