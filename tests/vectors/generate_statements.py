#!/usr/bin/env python3
"""Writes ``statements.json``: signed grant statements that the Rust, Python and TypeScript
verifiers all check, and that the Rust signer must reproduce byte for byte.

Run it after changing a case or the statement format::

    python tests/vectors/generate_statements.py

Statements are signed here with PyJWT (``cryptography`` underneath), not with oncegate's own
signer, with fixed test keys: the Ed25519 seed of test key ``n`` is 32 bytes of ``n`` (keys 1 and 2
are published, key 2 as a retired key; key 3 is not: it stands for a removed key). Ed25519 is
deterministic, so the file is the same on every run.

File format (read by every client's tests; keep it stable)::

    {"version": 1, "now": <Unix seconds to verify at>, "jwks": {<the published keys>},
     "cases": [{"name", "statement", "params_json", "key_fields" (null: every param),
                "audience", and either "fencing" (valid) or "error" (the refusal's kind),
                and for statements the Rust signer must reproduce: "seed", "claims"}]}
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "statements.json"
try:
    from oncegate.fingerprints import fingerprint
except ImportError:
    sys.path.insert(0, str(HERE.parent.parent / "clients" / "python" / "src"))
    from oncegate.fingerprints import fingerprint

NOW = 1_800_000_000
FIELDS = ["/amount", "/currency", "/to"]
PARAMS = '{"amount":4200,"currency":"EUR","to":"DE89370400440532013000","memo":"Invoice 41"}'
GRANT_TYPE = "oncegate-grant+jwt"


def key(n: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes([n]) * 32)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk(n: int) -> dict[str, str]:
    """Test key ``n``'s public JWK, its kid the RFC 7638 thumbprint."""
    x = b64(key(n).public_key().public_bytes_raw())
    thumbprint = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    kid = b64(hashlib.sha256(thumbprint.encode()).digest())
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"}


def claims(**changes: Any) -> dict[str, Any]:
    """Grant claims in the order the gate writes them."""
    out: dict[str, Any] = {
        "iss": "oncegate",
        "aud": "fake-bank",
        "iat": NOW - 60,
        "exp": NOW + 240,
        "agent": "billing-agent",
        "run": "run-7",
        "action": "payments.transfer",
        "key": "invoice-41",
        "intent": "",
        "fingerprint": "",
        "fencing": 1_764_000_000_000_001,
        "provider_key": "og-0123456789abcdef0123456789abcdef01234567",
    }
    out.update(changes)
    if not out["fingerprint"]:
        out["fingerprint"] = fingerprint(out["action"], PARAMS, out["intent"] or None, FIELDS)
    return out


def sign(seed: int, payload: dict[str, Any], typ: str = GRANT_TYPE) -> str:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return jwt.api_jws.PyJWS().encode(body, key(seed), algorithm="EdDSA", headers={"kid": jwk(seed)["kid"], "typ": typ})


CASES: list[dict[str, Any]] = []


def case(name: str, statement: str, *, params: str = PARAMS, key_fields: list[str] | None = FIELDS,
         audience: str = "fake-bank", fencing: int | None = None, error: str | None = None,
         reproduce: tuple[int, dict[str, Any]] | None = None) -> None:
    entry: dict[str, Any] = {"name": name, "statement": statement, "params_json": params,
                             "key_fields": key_fields, "audience": audience}
    if error is None:
        entry["fencing"] = fencing
    else:
        entry["error"] = error
    if reproduce is not None:
        entry["seed"], entry["claims"] = reproduce
    CASES.append(entry)


def build() -> None:
    good = claims()
    case("valid", sign(1, good), fencing=good["fencing"], reproduce=(1, good))
    case("valid, memo rewritten (not a key field)", sign(1, good),
         params='{"memo":"Invoice #41 (corrected)","to":"DE89370400440532013000","currency":"EUR","amount":4200.0}',
         fencing=good["fencing"])
    with_intent = claims(intent="invoice-41#2", fencing=7)
    case("valid, with an intent", sign(1, with_intent), fencing=7, reproduce=(1, with_intent))
    case("rotated: signed by the retired key, still published", sign(2, good), fencing=good["fencing"],
         reproduce=(2, good))
    case("removed key: signed by a key no longer published", sign(3, good), error="unknown_key")
    case("amount changed", sign(1, good), params='{"amount":4300,"currency":"EUR","to":"DE89370400440532013000"}',
         error="fingerprint_mismatch")
    case("key fields not the policy's", sign(1, good), key_fields=None, error="fingerprint_mismatch")
    case("wrong audience", sign(1, good), audience="other-bank", error="wrong_audience")
    expired = claims(exp=NOW)
    case("expired", sign(1, expired), error="expired", reproduce=(1, expired))
    header, _, signature = sign(1, good).split(".")
    forged = b64(json.dumps(claims(fencing=good["fencing"] + 1), separators=(",", ":")).encode())
    case("tampered: fencing raised, signature kept", f"{header}.{forged}.{signature}", error="bad_signature")
    case("a receipt is not a grant", sign(1, good, typ="oncegate-receipt+jwt"), error="wrong_type")
    case("not a JWS", "not-a-statement", error="malformed")
    case("unsigned gate: empty statement", "", error="malformed")


def main() -> None:
    build()
    document = {"version": 1, "now": NOW, "jwks": {"keys": [jwk(1), jwk(2)]}, "cases": CASES}
    OUTPUT.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(CASES)} cases to {OUTPUT}")


if __name__ == "__main__":
    main()
