"""Offline verification of the gate's signed grant statements, for the system that executes an action.

A grant carries ``statement``: a JWS (compact serialization, EdDSA over Ed25519, header ``typ``
``oncegate-grant+jwt``) that the gate signs with its key. The executor (a bank, a provider, a tool
server) checks it with the gate's public keys (its JWKS document: ``GET /.well-known/jwks.json`` on
the gate's metrics listener, or ``oncegate keys export``) against the params it is asked to act on,
and gets the fencing number to compare with the highest it has seen::

    from oncegate import PublicKeys, verify_grant

    keys = PublicKeys.from_jwks(jwks_text)
    grant = verify_grant(keys, statement, params, key_fields=["/amount", "/to"], audience="bank")
    if grant.fencing < highest_seen:  # a stale holder
        refuse()

Verification uses PyJWT (with ``cryptography``) for the signature and the audience; the fingerprint
is this package's own (:func:`oncegate.fingerprint`). No IO.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from oncegate.fingerprints import ParamsError, fingerprint

__all__ = ["GRANT_TYPE", "GrantClaims", "PublicKeys", "StatementError", "verify_grant"]

GRANT_TYPE = "oncegate-grant+jwt"
"""The JOSE ``typ`` of grant statements (receipts have another, so one is never taken for the other)."""


class StatementError(ValueError):
    """A statement that does not verify. ``kind`` is the name every oncegate client uses:
    ``malformed``, ``wrong_type``, ``unknown_key``, ``bad_signature``, ``expired``,
    ``wrong_audience``, ``fingerprint_mismatch`` or ``bad_params``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class GrantClaims:
    """What a verified grant statement says."""

    iss: str
    aud: str
    iat: int
    exp: int
    agent: str
    run: str
    action: str
    key: str
    intent: str
    fingerprint: str
    fencing: int
    """The grant's fencing number: refuse anything lower than the highest one seen."""
    provider_key: str


class PublicKeys:
    """The gate's public keys (Ed25519), by key id. A key not in the set is refused."""

    def __init__(self, keys: Mapping[str, Any]) -> None:
        self._keys = dict(keys)

    @classmethod
    def from_jwks(cls, document: str | Mapping[str, Any]) -> PublicKeys:
        """Reads a JWKS document (text or parsed); keys other than Ed25519 ``OKP`` keys are skipped."""
        parsed = json.loads(document) if isinstance(document, str) else document
        keys = {}
        for entry in parsed.get("keys", []):
            if entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
                continue
            jwk = jwt.PyJWK(dict(entry), algorithm="EdDSA")
            keys[entry.get("kid") or jwk.key_id] = jwk
        return cls(keys)

    @property
    def kids(self) -> list[str]:
        """The key ids in the set."""
        return sorted(self._keys)

    def _key(self, kid: str) -> Any:
        try:
            return self._keys[kid].key
        except KeyError:
            raise StatementError("unknown_key", f"no key has id {kid!r}") from None


def verify_grant(
    keys: PublicKeys,
    statement: str,
    params: Mapping[str, Any] | str,
    *,
    audience: str,
    key_fields: Sequence[str] | None = None,
    now: float | None = None,
) -> GrantClaims:
    """Verifies a grant statement: signed by one of ``keys``, of the grant type, not expired (at
    ``now``, Unix seconds; the clock when ``None``), meant for ``audience``, and ``params`` (a
    mapping, or the JSON text) has the fingerprint it vouches for under the policy's
    ``key_fields`` (``None``: every param counts).

    Raises:
        StatementError: with the refusal's ``kind``.
    """
    try:
        header = jwt.get_unverified_header(statement)
    except jwt.DecodeError as err:
        raise StatementError("malformed", str(err)) from None
    if header.get("alg") != "EdDSA" or header.get("typ") != GRANT_TYPE:
        raise StatementError("wrong_type", f"alg {header.get('alg')!r}, typ {header.get('typ')!r}")
    key = keys._key(str(header.get("kid", "")))
    try:
        claims = jwt.decode(
            statement,
            key,
            algorithms=["EdDSA"],
            audience=audience,
            # exp is checked below, at `now`; iat says when the gate signed, on its clock.
            options={"verify_exp": False, "verify_iat": False, "require": ["iss", "aud", "iat", "exp"]},
        )
    except jwt.InvalidSignatureError as err:
        raise StatementError("bad_signature", str(err)) from None
    except jwt.InvalidAudienceError as err:
        raise StatementError("wrong_audience", f"{err}; expected {audience!r}") from None
    except jwt.InvalidTokenError as err:
        raise StatementError("malformed", str(err)) from None
    try:
        grant = GrantClaims(**{name: claims[name] for name in GrantClaims.__dataclass_fields__})
    except (KeyError, TypeError) as err:
        raise StatementError("malformed", f"claims: {err}") from None
    at = time.time() if now is None else now
    if grant.exp <= at:
        raise StatementError("expired", f"expired at {grant.exp} (now {int(at)})")
    try:
        found = fingerprint(grant.action, params, grant.intent or None, key_fields)
    except ParamsError as err:
        raise StatementError("bad_params", str(err)) from None
    if found != grant.fingerprint:
        raise StatementError(
            "fingerprint_mismatch", f"params have fingerprint {found}, not the granted {grant.fingerprint}"
        )
    return grant
