"""The local fingerprint against the shared vectors and hand-checked canonical forms."""

from __future__ import annotations

import doctest
import json
from collections import defaultdict
from typing import Any

import pytest

import oncegate.fingerprints
from oncegate import ParamsError, canonical_form, fingerprint, parse_params

from conftest import VECTORS

DOCUMENT = json.loads(VECTORS.read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DOCUMENT["cases"]


def test_vectors_file_shape() -> None:
    assert DOCUMENT["version"] == 1
    assert len(CASES) >= 60
    names = [case["name"] for case in CASES]
    assert len(names) == len(set(names))
    errors = {case["error"] for case in CASES if "error" in case}
    assert errors == {
        "duplicate_member",
        "unsafe_number",
        "inexact_number",
        "not_an_object",
        "syntax",
        "too_deep",
    }


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_vector(case: dict[str, Any]) -> None:
    args = (case["action"], case["params_json"], case["intent"], case["key_fields"])
    if "error" in case:
        with pytest.raises(ParamsError) as raised:
            fingerprint(*args)
        assert raised.value.kind == case["error"]
    else:
        assert canonical_form(*args) == case["canonical"]
        assert fingerprint(*args) == case["fingerprint"]


def test_equivalence_groups_share_one_fingerprint() -> None:
    groups: dict[str, set[str]] = defaultdict(set)
    for case in CASES:
        if case["name"].startswith("eq:"):
            groups[case["name"].split(" / ")[0]].add(case["fingerprint"])
    assert len(groups) >= 10
    assert all(len(fingerprints) == 1 for fingerprints in groups.values()), groups
    assert len({next(iter(fps)) for fps in groups.values()}) == len(groups), "groups must differ"


def test_rust_examples() -> None:
    assert (
        canonical_form("pay", {"amount": 5}, key_fields=["/amount", "/to/iban"])
        == '{"action":"pay","intent":null,"params":{"/amount":5,"/to/iban":null}}'
    )
    assert (
        canonical_form("pay", '{"b":[1,2.5,-0],"a":"é"}')
        == '{"action":"pay","intent":null,"params":{"a":"é","b":[1,2.5,0]}}'
    )


def test_format() -> None:
    value = fingerprint("pay", {"amount": 1})
    assert value.startswith("v1-") and len(value) == 67 and value[3:] == value[3:].lower()


def test_mapping_and_text_agree() -> None:
    params = {"to": {"iban": "DE89", "name": "Zoë"}, "amount": 2**53, "rate": 0.1, "ok": True, "memo": None}
    assert fingerprint("pay", params) == fingerprint("pay", json.dumps(params))
    assert fingerprint("pay", params, "i-1") != fingerprint("pay", params)


def test_mapping_values_the_gate_refuses() -> None:
    with pytest.raises(ParamsError) as raised:
        fingerprint("pay", {"amount": 2**53 + 1})
    assert raised.value.kind == "unsafe_number"
    with pytest.raises(ParamsError) as raised:
        fingerprint("pay", {"amount": float("nan")})
    assert raised.value.kind == "unsafe_number"
    with pytest.raises(ParamsError) as raised:
        fingerprint("pay", {1: "a", "1": "b"})  # type: ignore[dict-item]
    assert raised.value.kind == "duplicate_member"


def test_size_limit() -> None:
    with pytest.raises(ParamsError) as raised:
        parse_params(json.dumps({"memo": "x" * 70_000}))
    assert raised.value.kind == "too_large"
    assert parse_params('{"a":1}', max_depth=1) == {"a": 1}


def test_doctests() -> None:
    assert doctest.testmod(oncegate.fingerprints).failed == 0


def test_decimals_are_sent_as_their_double_or_refused() -> None:
    from decimal import Decimal

    from oncegate.fingerprints import encode_params

    assert encode_params({"amount": Decimal("0.1")}) == '{"amount":0.1}'
    assert fingerprint("pay", {"amount": Decimal("0.1")}) == fingerprint("pay", {"amount": 0.1})
    with pytest.raises(ParamsError) as raised:
        encode_params({"amount": Decimal("0.100000000000000001")})
    assert raised.value.kind == "inexact_number"
    assert "at /amount," in str(raised.value)
    with pytest.raises(ParamsError) as raised:
        encode_params({"legs": [{"amount": Decimal("1")}, {"a/b": Decimal("0.30000000000000001")}]})
    assert "at /legs/1/a~1b," in str(raised.value)


def test_an_inexact_literal_is_named_by_its_pointer() -> None:
    with pytest.raises(ParamsError) as raised:
        fingerprint("pay", '{"to":"x","legs":[{"amount":0.30000000000000001}]}')
    assert raised.value.kind == "inexact_number"
    assert "/legs/0/amount" in str(raised.value)
