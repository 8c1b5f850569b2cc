/**
 * Offline verification of the gate's signed grant statements, for the system that executes an
 * action: a JWS (compact, EdDSA over Ed25519, header `typ` `oncegate-grant+jwt`) checked with the
 * gate's public keys (its JWKS: `GET /.well-known/jwks.json` on the metrics listener, or
 * `oncegate keys export`) against the params the executor is asked to act on. Returns the claims;
 * refuse a `fencing` lower than the highest one seen. Signature and audience by `jose`; the
 * fingerprint is this package's own. No IO.
 */

import { compactVerify, createLocalJWKSet, decodeProtectedHeader, errors, type JSONWebKeySet } from "jose";

import { fingerprint } from "./fingerprint/fingerprint.js";
import { ParamsError } from "./fingerprint/params.js";

/** The JOSE `typ` of grant statements. */
export const GRANT_TYPE = "oncegate-grant+jwt";

/** The refusal kinds, shared with the Rust and Python verifiers and the vectors. */
export type StatementErrorKind =
  | "malformed"
  | "wrong_type"
  | "unknown_key"
  | "bad_signature"
  | "expired"
  | "wrong_audience"
  | "fingerprint_mismatch"
  | "bad_params";

/** A statement that does not verify. */
export class StatementError extends Error {
  constructor(
    readonly kind: StatementErrorKind,
    message: string,
  ) {
    super(`${kind}: ${message}`);
    this.name = "StatementError";
  }
}

/** What a verified grant statement says. */
export interface GrantClaims {
  iss: string;
  aud: string;
  iat: number;
  exp: number;
  agent: string;
  run: string;
  action: string;
  key: string;
  intent: string;
  fingerprint: string;
  /** The grant's fencing number: refuse anything lower than the highest one seen. */
  fencing: number;
  provider_key: string;
}

/** What the executor checks a statement against. */
export interface GrantCheck {
  /** The audience the executor answers to. */
  audience: string;
  /** The action policy's key fields; every param counts when unset. */
  keyFields?: string[] | null;
  /** Now, Unix seconds; the clock when unset. */
  now?: number;
}

/**
 * Verifies a grant statement: signed by a key of `jwks`, of the grant type, not expired, meant for
 * `check.audience`, and `params` (an object or the JSON text) has the fingerprint it vouches for.
 * Throws a {@link StatementError} naming the refusal.
 */
export async function verifyGrant(
  jwks: JSONWebKeySet,
  statement: string,
  params: object | string,
  check: GrantCheck,
): Promise<GrantClaims> {
  let header;
  try {
    header = decodeProtectedHeader(statement);
  } catch (e) {
    throw new StatementError("malformed", String(e));
  }
  if (header.alg !== "EdDSA" || header.typ !== GRANT_TYPE) {
    throw new StatementError("wrong_type", `alg ${String(header.alg)}, typ ${String(header.typ)}`);
  }
  if (!jwks.keys.some((k) => k.kid === header.kid)) {
    throw new StatementError("unknown_key", `no key has id ${String(header.kid)}`);
  }
  let payload: Uint8Array;
  try {
    ({ payload } = await compactVerify(statement, createLocalJWKSet(jwks), { algorithms: ["EdDSA"] }));
  } catch (e) {
    if (e instanceof errors.JWSSignatureVerificationFailed) throw new StatementError("bad_signature", e.message);
    throw new StatementError("malformed", String(e));
  }
  let claims: GrantClaims;
  try {
    claims = JSON.parse(new TextDecoder().decode(payload)) as GrantClaims;
  } catch (e) {
    throw new StatementError("malformed", `claims: ${String(e)}`);
  }
  const now = check.now ?? Date.now() / 1000;
  if (claims.exp <= now) throw new StatementError("expired", `expired at ${claims.exp}`);
  if (claims.aud !== check.audience) {
    throw new StatementError("wrong_audience", `audience is ${claims.aud}, not ${check.audience}`);
  }
  let found: string;
  try {
    found = fingerprint(claims.action, params, { intent: claims.intent, keyFields: check.keyFields ?? undefined });
  } catch (e) {
    if (e instanceof ParamsError) throw new StatementError("bad_params", e.message);
    throw e;
  }
  if (found !== claims.fingerprint) {
    throw new StatementError("fingerprint_mismatch", `params have ${found}, not the granted ${claims.fingerprint}`);
  }
  return claims;
}
