"""Signed grant statements: the shared vectors (tests/vectors/statements.json, signed by PyJWT with
fixed test keys) verify or are refused with the same kind as in Rust and TypeScript, and a grant a
real signing gate hands out verifies against the params it was granted for."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from oncegate import PublicKeys, StatementError, verify_grant

VECTORS_FILE = Path(__file__).resolve().parents[3] / "tests" / "vectors" / "statements.json"
VECTORS = json.loads(VECTORS_FILE.read_text())
KEYS = PublicKeys.from_jwks(VECTORS["jwks"])


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["name"])
def test_every_shared_vector(case: dict) -> None:
    verify = lambda: verify_grant(  # noqa: E731
        KEYS,
        case["statement"],
        case["params_json"],
        audience=case["audience"],
        key_fields=case["key_fields"],
        now=VECTORS["now"],
    )
    if "error" in case:
        with pytest.raises(StatementError) as refused:
            verify()
        assert refused.value.kind == case["error"]
    else:
        assert verify().fencing == case["fencing"]


def test_the_vectors_cover_every_refusal() -> None:
    kinds = {c.get("error") for c in VECTORS["cases"]}
    assert {
        "unknown_key",
        "bad_signature",
        "expired",
        "wrong_audience",
        "fingerprint_mismatch",
        "wrong_type",
        "malformed",
    } <= kinds


def test_removing_a_key_refuses_what_it_signed() -> None:
    rotated = next(c for c in VECTORS["cases"] if c["name"].startswith("rotated"))
    only_active = PublicKeys.from_jwks({"keys": VECTORS["jwks"]["keys"][:1]})
    with pytest.raises(StatementError) as refused:
        verify_grant(
            only_active,
            rotated["statement"],
            rotated["params_json"],
            audience="fake-bank",
            key_fields=rotated["key_fields"],
            now=VECTORS["now"],
        )
    assert refused.value.kind == "unknown_key"


def test_a_real_gate_grant_verifies(signed_gate) -> None:  # type: ignore[no-untyped-def]
    gate, metrics = signed_gate
    jwks = urllib.request.urlopen(f"http://{metrics}/.well-known/jwks.json", timeout=5).read().decode()
    keys = PublicKeys.from_jwks(jwks)
    params = {"amount": 100, "to": "DE89"}
    result = gate.request_token("payments.transfer", params, agent_id="verify-agent", run_id="run-1")
    grant = result.grant
    assert grant is not None and grant.statement
    key_fields = ["/amount", "/currency", "/to"]  # the test policy's (conftest.POLICY)
    claims = verify_grant(keys, grant.statement, params, audience="payments.transfer", key_fields=key_fields)
    assert (claims.fencing, claims.provider_key) == (grant.fencing, grant.provider_key)
    with pytest.raises(StatementError) as refused:
        verify_grant(
            keys,
            grant.statement,
            {"amount": 900, "to": "DE89"},
            audience="payments.transfer",
            key_fields=key_fields,
        )
    assert refused.value.kind == "fingerprint_mismatch"
