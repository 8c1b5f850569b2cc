"""The gateway hands the gate each `tools/call`'s arguments exactly as the client sent them:
a literal a double cannot hold is refused naming its JSON Pointer, not rounded and
run; and every shared fingerprint vector (tests/vectors/fingerprints.json) is refused or
fingerprinted through the gateway as through the gRPC API, in process and with `--gate`. The SDK
cannot send such literals (a Python float rounds them first): raw JSON-RPC messages, as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import RawHttp, World

ROOT = Path(__file__).parents[2]
VECTORS = json.loads((ROOT / "tests/vectors/fingerprints.json").read_text())["cases"]


def reason(result: dict) -> str | None:
    return result.get("_meta", {}).get("oncegate/error")


def text(result: dict) -> str:
    return result["content"][0]["text"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_literal_a_double_cannot_hold_is_refused_where_it_is(world: World, transport: str) -> None:
    if transport == "stdio":
        stdio = world.raw_stdio("--run-id", "r")

        def call(arguments: str) -> dict:
            return stdio.call("schedule_payment", arguments)["result"]
    else:
        http = RawHttp(world.start_http_gateway("--run-id", "r"))

        def call(arguments: str) -> dict:
            status, answer = http.call("schedule_payment", arguments)
            assert status == 200 and answer is not None, status
            return answer["result"]

    for arguments, pointer, literal in [
        ('{"amount": 111, "seconds": 0.100000000000000001}', "/seconds", "0.100000000000000001"),
        ('{"amount": 111, "seconds": 1e-400}', "/seconds", "1e-400"),
        ('{"amount": 9007199254740993, "seconds": 1}', "/amount", "2^53"),
        # Beyond the double range: rmcp cannot parse it at all, the gate still judges the text.
        ('{"amount": 111, "seconds": 1e400}', "/seconds", "2^53"),
    ]:
        refused = call(arguments)
        assert refused["isError"] and reason(refused) == "INVALID_REQUEST", refused
        assert f"at {pointer}" in text(refused) and literal in text(refused), text(refused)
    assert world.effects() == []
    # One fingerprint per amount: 0.1 after the refused 0.100000000000000001 is a new action,
    # run once; the same call again (its members reordered) is its replay.
    first = call('{"amount": 111, "seconds": 0.1}')
    again = call('{"seconds":0.1,"amount":111}')
    assert not first.get("isError") and "oncegate/replayed" not in first.get("_meta", {})
    assert again["_meta"]["oncegate/replayed"] is True and again["content"] == first["content"]
    assert world.effects() == [{"kind": "payment", "amount": 111, "seconds": 0.1}]


def vector_groups() -> list[tuple[str, list[str] | None, list[dict]]]:
    """The vectors an MCP call can carry, by (action, key fields): one gateway configuration each.
    An intent cannot be sent through MCP, so the two vectors with one are left out."""
    groups: dict[str, tuple[str, list[str] | None, list[dict]]] = {}
    for case in VECTORS:
        if case["intent"]:
            continue
        name = json.dumps([case["action"], case["key_fields"]])
        groups.setdefault(name, (case["action"], case["key_fields"], []))[2].append(case)
    return list(groups.values())


def group_config(action: str, key_fields: list[str] | None) -> str:
    # The tool is the action, gated whatever the upstream (which does not know it) says.
    config = f"[mcp.tools.{json.dumps(action)}]\ngate = true\n"
    if key_fields is not None:
        config += f"key_fields = {json.dumps(key_fields)}\n"
    return config


def grpc_refusal(world: World, gate: str, case: dict) -> str:
    """The description the gRPC API gives for the case's params (`oncegate call request-token`)."""
    code, answer = world.cli(
        "call", "request-token", "--server", gate, "--agent", "mcp", "--run", "grpc-check",
        "--action", case["action"], "--params", case["params_json"],
    )
    assert code != 0 and answer["error"]["reason"] == "INVALID_REQUEST", answer
    return answer["error"]["message"].split(": ", 1)[1]


@pytest.mark.parametrize("mode", ["in_process", "remote"])
def test_the_shared_vectors_are_refused_and_fingerprinted_as_over_grpc(world: World, mode: str) -> None:
    checked = 0
    upstream = world.start_http_upstream()
    for index, (action, key_fields, cases) in enumerate(vector_groups()):
        run = f"vectors-{index}"
        world.write_config(group_config(action, key_fields))
        data_dir = f"data-{index}"
        if mode == "remote":
            gate = world.start_gate(world.config.read_text(), data_dir=data_dir)
            url = world.start_http_gateway("--gate", gate, "--run-id", run, upstream=upstream)
        else:
            url = world.start_http_gateway("--run-id", run, data_dir=data_dir, upstream=upstream)
        # Over HTTP, as some vectors hold line breaks a stdio message cannot carry.
        session = RawHttp(url)
        sent = [(run, case, *session.call(action, case["params_json"])) for case in cases]
        assert session.delete() == 200
        world.stop_http_gateways()
        if mode == "in_process":
            # The gateway's own store, read by a gate server once the gateway is gone.
            gate = world.start_gate(world.config.read_text(), data_dir=data_dir)
        for run, case, status, answer in sent:
            check(world, gate, run, case, status, answer)
            checked += 1
        world.stop_gates()
    assert checked == len(VECTORS) - 2


def check(world: World, gate: str, run: str, case: dict, status: int, answer: dict | None) -> None:
    name = case["name"]
    error = case.get("error")
    if error is None:
        # Granted and recorded under the vector's fingerprint.
        assert status == 200 and answer is not None and "result" in answer, (name, status, answer)
        assert reason(answer["result"]) is None, (name, answer)
        code, view = world.cli(
            "call", "get", "--server", gate, "--agent", "mcp", "--run", run, "--key", case["fingerprint"]
        )
        assert code == 0 and view["state"] == "ACTION_STATE_COMPLETED", (name, view)
        return
    expected = grpc_refusal(world, gate, case)
    if error == "syntax" and (answer is None or "result" not in answer):
        # Not JSON, so the message that carries it is no JSON-RPC message: refused before the
        # gate. (Text that still frames as JSON, a lone surrogate, reaches the gate, below.)
        assert status >= 400 or answer is None or "error" in answer, (name, status, answer)
        return
    assert status == 200 and answer is not None and "result" in answer, (name, status, answer)
    result = answer["result"]
    assert result["isError"] and reason(result) == "INVALID_REQUEST", (name, result)
    assert expected in text(result), (name, expected, text(result))
    if error in ("unsafe_number", "inexact_number"):
        assert re.search(r"at (/\S*|the top level)", expected), (name, expected)
