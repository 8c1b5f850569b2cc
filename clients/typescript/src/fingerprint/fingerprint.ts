/**
 * The gate's fingerprint of a request, offline: `v1-` + the hex SHA-256 of the RFC 8785 (JCS)
 * form of `{"action": …, "intent": <intent or null>, "params": <key fields>}`.
 *
 * JCS comes from `canonicalize` (by an author of RFC 8785): UTF-16 member order and ECMAScript
 * number formatting, which are what the RFC specifies. Params are read by `params.ts` first, so
 * whatever the gate refuses is refused here with the same {@link ParamsError} kind.
 */

import { createHash } from "node:crypto";

import canonicalize from "canonicalize";

import { encodeParams, parseParams, type JsonObject, type JsonValue } from "./params.js";

/** The version tag of the canonical form; a new canonical form gets a new tag. */
export const VERSION_TAG = "v1";

/** What, besides the action and params, goes into a fingerprint. */
export interface FingerprintOptions {
  /** The intent id; `undefined`, `null` and `""` all mean none. */
  intent?: string | null;
  /**
   * The action policy's key-field JSON Pointers (`["/amount", "/to"]`), or `undefined` when every
   * param counts (no policy names key fields).
   */
  keyFields?: readonly string[] | null;
}

const ARRAY_INDEX = /^(?:0|[1-9][0-9]*)$/;

/**
 * Looks up an RFC 6901 JSON Pointer as the gate does: `""` is the whole document, a pointer not
 * starting with `/` finds nothing, `~1` is `/` and `~0` is `~`, array indexes are decimal without
 * leading zeros.
 */
export function resolvePointer(document: JsonValue, pointer: string): { found: boolean; value: JsonValue } {
  if (pointer === "") return { found: true, value: document };
  if (!pointer.startsWith("/")) return { found: false, value: null };
  let target: JsonValue = document;
  for (const raw of pointer.split("/").slice(1)) {
    const token = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    if (Array.isArray(target)) {
      const item = ARRAY_INDEX.test(token) ? target[Number(token)] : undefined;
      if (item === undefined) return { found: false, value: null };
      target = item;
    } else if (target !== null && typeof target === "object") {
      if (!Object.hasOwn(target, token)) return { found: false, value: null };
      target = target[token] as JsonValue;
    } else {
      return { found: false, value: null };
    }
  }
  return { found: true, value: target };
}

/**
 * The `params` member of the canonical form: the whole object when every param counts, else an
 * object from each key-field pointer to the value it finds (`null` when absent).
 */
export function selectKeyFields(params: JsonObject, keyFields?: readonly string[] | null): JsonValue {
  if (keyFields === undefined || keyFields === null) return params;
  return Object.fromEntries(keyFields.map((pointer) => [pointer, resolvePointer(params, pointer).value]));
}

/** Params as the gate reads them: text parsed strictly, an object encoded first, then parsed. */
export function readParams(params: object | string): JsonObject {
  return parseParams(typeof params === "string" ? params : encodeParams(params));
}

/**
 * The RFC 8785 canonical JSON that the fingerprint hashes.
 *
 * @param params An object, or the params JSON text exactly as sent to the gate.
 * @throws {ParamsError} when the gate would refuse the params.
 */
export function canonicalForm(action: string, params: object | string, options: FingerprintOptions = {}): string {
  const document = {
    action,
    intent: options.intent || null,
    params: selectKeyFields(readParams(params), options.keyFields),
  };
  const canonical = canonicalize(document);
  if (canonical === undefined) throw new TypeError("the canonical form of a request is never undefined");
  return canonical;
}

/**
 * The gate's fingerprint of a request. Pass the action policy's key fields to reproduce the
 * fingerprint of an action that has a policy.
 *
 * ```ts
 * fingerprint("payments.transfer", { amount: 100, currency: "EUR", to: "DE89", memo: "x" },
 *             { keyFields: ["/amount", "/currency", "/to"] });   // "v1-…", as the gate computes it
 * ```
 *
 * @throws {ParamsError} when the gate would refuse the params.
 */
export function fingerprint(action: string, params: object | string, options: FingerprintOptions = {}): string {
  const digest = createHash("sha256").update(canonicalForm(action, params, options), "utf8").digest("hex");
  return `${VERSION_TAG}-${digest}`;
}
