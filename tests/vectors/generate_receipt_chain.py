#!/usr/bin/env python3
"""Writes ``receipt_chain.json``: a receipt chain whose digests and head statements are made from
the text of docs/CONTRACT.md §4.x alone (not with oncegate's code), so that the Rust verifier is
checked against the definition a third party would implement.

Run it after changing the chain's definition::

    python tests/vectors/generate_receipt_chain.py

The digest of entry n: lowercase hex SHA-256 of the RFC 8785 (JCS) form of the entry's nine
fields and ``prev`` (entry n-1's digest, ``""`` for entry 1). For these values (strings without
control characters, integers below 2^53) JCS is ``json.dumps(sort_keys=True,
separators=(",", ":"), ensure_ascii=False)``. Heads are signed with the cryptography package's
Ed25519 (test key 1: the seed is 32 bytes of 1), as JWS compact with header
``{"alg":"EdDSA","kid":<RFC 7638 thumbprint>,"typ":"oncegate-receipt+jwt"}``.

File format (keep it stable)::

    {"version": 1, "jwks": {...}, "batches": [sizes of the sealed runs],
     "entries": [{"core": {9 fields}, "prev", "digest", "statement" ('' unless a head)}]}
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

OUTPUT = Path(__file__).resolve().parent / "receipt_chain.json"
RECEIPT_TYPE = "oncegate-receipt+jwt"
BATCHES = [1, 3, 2]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jcs(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def compact(value: object) -> bytes:
    """serde_json's output for the same fields in the same order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def core(seq: int) -> dict:
    receipt = f"receipt {seq} \u00e9".encode()
    return {
        "seq": seq,
        "agent": "billing-agent",
        "run": "run-7-\u00e9t\u00e9",
        "key": f"invoice-{seq}",
        "fingerprint": f"v1-{seq:064x}",
        "receipt_digest": hashlib.sha256(receipt).hexdigest(),
        "fencing": 1_700_000_000_000_000 + seq,
        "source": "operator" if seq == 3 else "worker",
        "completed_at": 1_800_000_000_000 + 1_234 * seq,
    }


def digest(entry: dict, prev: str) -> str:
    return hashlib.sha256(jcs({**entry, "prev": prev})).hexdigest()


def main() -> None:
    key = Ed25519PrivateKey.from_private_bytes(bytes([1]) * 32)
    x = b64(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    kid = b64(hashlib.sha256(compact({"crv": "Ed25519", "kty": "OKP", "x": x})).digest())
    header = compact({"alg": "EdDSA", "kid": kid, "typ": RECEIPT_TYPE})
    entries, prev, seq = [], "", 0
    for size in BATCHES:
        covers = []
        for i in range(size):
            seq += 1
            c = core(seq)
            d = digest(c, prev)
            statement = ""
            if i == size - 1:
                claims = {"iss": "oncegate", "iat": c["completed_at"] // 1000, **c, "prev": prev,
                          "covers": covers}
                signing_input = b64(header) + "." + b64(compact(claims))
                statement = signing_input + "." + b64(key.sign(signing_input.encode()))
            else:
                covers = covers + [d]
            entries.append({"core": c, "prev": prev, "digest": d, "statement": statement})
            prev = d
    doc = {
        "version": 1,
        "jwks": {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA",
                           "use": "sig"}]},
        "batches": BATCHES,
        "entries": entries,
    }
    OUTPUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
