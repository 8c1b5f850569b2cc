/**
 * What the gate answers with: the root {@link OncegateError} and one class per `ErrorReason`.
 *
 * Each class's `REASON` is read from the generated `ErrorReason` enum's descriptor, so a reason
 * named here is one the proto defines, spelled as the gate sends it. The getters read the
 * `ErrorInfo` metadata the reason carries. Decoding a status is `status.ts`'s business; the
 * guard's own errors live in `guard.ts`.
 */

import { Code } from "@connectrpc/connect";

import { ErrorReason, ErrorReasonSchema } from "../gen/oncegate/v1/oncegate_pb.js";
import type { ActionRef } from "../models.js";

/** The `ErrorInfo.domain` of every gate error. */
export const DOMAIN = "oncegate";

/** The name the gate puts in `ErrorInfo.reason` for `reason` (the proto enum value's name). */
export function reasonName(reason: ErrorReason): string {
  const value = ErrorReasonSchema.value[reason];
  if (value === undefined) throw new RangeError(`no ErrorReason value ${reason}`);
  return value.name;
}

/** One `google.rpc.BadRequest` field violation. */
export interface FieldViolation {
  field: string;
  description: string;
}

/** What a failed call carried besides its message. */
export interface ErrorDetails {
  /** The `ErrorInfo` reason, when the status carried an oncegate `ErrorInfo`. */
  reason?: string | undefined;
  /** The gRPC status code. */
  code?: Code | undefined;
  /** The `ErrorInfo` metadata: every dynamic value of the error. */
  metadata?: Readonly<Record<string, string>>;
  /** Milliseconds to wait before the same request may succeed (`RetryInfo`), when given. */
  retryAfterMs?: number | undefined;
  /** The `BadRequest` field violations, if any. */
  fieldViolations?: readonly FieldViolation[];
  /** The error this one wraps. */
  cause?: unknown;
}

/**
 * The root of every oncegate error: a gate call that did not succeed, or (in `guard.ts`) an
 * attempt the guard could not settle.
 */
export class OncegateError extends Error {
  /** The reason this class stands for; `undefined` for the classes no reason names. */
  static readonly REASON: string | undefined = undefined;
  /** Whether repeating the same request later may succeed. */
  protected static readonly RETRYABLE: boolean = false;

  override name = "OncegateError";
  /** The `ErrorInfo` reason (`IDEMPOTENCY_KEY_REUSED`...), or `undefined` without one. */
  readonly reason: string | undefined;
  /** The gRPC status code, when a call failed. */
  readonly code: Code | undefined;
  /** The `ErrorInfo` metadata. */
  readonly metadata: Readonly<Record<string, string>>;
  /**
   * Milliseconds to wait before retrying, when the gate said (`RetryInfo`, else the
   * `retry_after_ms` metadata). Every client says retry delays in milliseconds with the unit in
   * the name (Python `retry_after_ms`; Rust: a `Duration`).
   */
  readonly retryAfterMs: number | undefined;
  /** The `BadRequest` field violations. */
  readonly fieldViolations: readonly FieldViolation[];

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    const own = this.constructor as typeof OncegateError;
    this.reason = details.reason ?? own.REASON;
    this.code = details.code;
    this.metadata = { ...details.metadata };
    this.retryAfterMs = details.retryAfterMs;
    this.fieldViolations = [...(details.fieldViolations ?? [])];
  }

  /** Whether repeating the same request later may succeed. */
  get retryable(): boolean {
    return (this.constructor as unknown as { RETRYABLE: boolean }).RETRYABLE;
  }
}

/**
 * The idempotency key names a stored request whose key fields differ. Never retry, and never mint
 * a new key on your own: the request changed, find out why.
 */
export class KeyReusedError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.IDEMPOTENCY_KEY_REUSED);
  override name = "KeyReusedError";

  /** The key-field JSON Pointers (`/amount`), or `action` / `intent_id`, that differ. */
  get differingFields(): string[] {
    return (this.metadata["differing_fields"] ?? "").split(",").filter((name) => name !== "");
  }
}

/** Another holder's lease on the action is live. Retry the same request after `retryAfterMs`. */
export class InProgressError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.IDEMPOTENCY_IN_PROGRESS);
  protected static override readonly RETRYABLE = true;
  override name = "InProgressError";
}

/**
 * A grant's lease ended without Complete or Release. Reconcile with the provider (provider key),
 * then Complete or Release with `token`.
 */
export class LeaseExpiredUnresolvedError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.LEASE_EXPIRED_UNRESOLVED);
  override name = "LeaseExpiredUnresolvedError";

  /** The action, as the gate names it (to Complete or Release with); `undefined` from a gate too old to say. */
  get action(): ActionRef | undefined {
    const key = this.metadata["key"];
    if (!key) return undefined;
    return { scope: { agentId: this.metadata["agent_id"] ?? "", runId: this.metadata["run_id"] ?? "" }, key };
  }

  /** The token of the unresolved grant. */
  get token(): string {
    return this.metadata["token"] ?? "";
  }

  /** The key the provider was given: ask it whether the action happened. */
  get providerKey(): string {
    return this.metadata["provider_key"] ?? "";
  }

  /** The fencing number of the unresolved grant. */
  get fencing(): number | undefined {
    return parseInteger(this.metadata["fencing"]);
  }

  /** When the lease ended. */
  get leaseExpiredAt(): Date | undefined {
    return parseTime(this.metadata["lease_expired_at"]);
  }
}

/** The token was never granted for this action (or was released). */
export class TokenMismatchError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.TOKEN_MISMATCH);
  override name = "TokenMismatchError";
}

/** The action has no record. */
export class TokenUnknownError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.TOKEN_UNKNOWN);
  override name = "TokenUnknownError";
}

/** Another token or an operator completed the action: it may have run twice. */
export class CompletedByOtherError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.COMPLETED_BY_OTHER);
  override name = "CompletedByOtherError";

  /** The fencing number of the completion that won. */
  get fencing(): number | undefined {
    return parseInteger(this.metadata["fencing"]);
  }

  /** When that completion was recorded. */
  get completedAt(): Date | undefined {
    return parseTime(this.metadata["completed_at"]);
  }
}

/** Release or ExtendLease of an action that already completed. */
export class AlreadyCompletedError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.ALREADY_COMPLETED);
  override name = "AlreadyCompletedError";
}

/** The request is malformed; `fieldViolations` say where. */
export class InvalidRequestError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.INVALID_REQUEST);
  override name = "InvalidRequestError";

  /** The request field at fault (a proto field path). */
  get field(): string {
    return this.metadata["field"] ?? "";
  }
}

/** The credential is missing or no principal holds it. */
export class UnauthenticatedError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.UNAUTHENTICATED);
  override name = "UnauthenticatedError";
}

/** The credential may not act in this scope. */
export class ForbiddenScopeError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.FORBIDDEN_SCOPE);
  override name = "ForbiddenScopeError";

  /** The principal the credential belongs to. */
  get principal(): string {
    return this.metadata["principal"] ?? "";
  }
}

/** The principal's rate limit is spent; retry after `retryAfterMs`. */
export class RateLimitedError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.RATE_LIMITED);
  protected static override readonly RETRYABLE = true;
  override name = "RateLimitedError";
}

/** The gate's store is unreachable; nothing was granted. Retry with backoff. */
export class StoreUnavailableError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.STORE_UNAVAILABLE);
  protected static override readonly RETRYABLE = true;
  override name = "StoreUnavailableError";
}

const RETRYABLE_CODES: ReadonlySet<Code> = new Set([
  Code.Unavailable,
  Code.DeadlineExceeded,
  Code.ResourceExhausted,
  Code.Aborted,
  Code.Internal,
  Code.Unknown,
]);

/**
 * An authorization policy forbids the action (or none permits it), or an operator denied its
 * approval. Nothing was recorded. Do not retry.
 */
export class PolicyDeniedError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.POLICY_DENIED);
  override name = "PolicyDeniedError";

  /** The deciding policy's id (empty when no policy permits the action). */
  get policyId(): string {
    return this.metadata["policy_id"] ?? "";
  }

  /** The denied approval's id, when an operator denied it. */
  get approvalId(): string {
    return this.metadata["approval_id"] ?? "";
  }
}

/**
 * A budget or velocity cap would be exceeded by this action. Nothing was recorded.
 *
 * The message is the gate's, as a person reads it: `budget "eur-per-day" would be exceeded:
 * 9950.00 of 10000.00 used in the last 1 d, and this action needs 100.00; nothing was recorded; it
 * frees up at 2026-12-03T14:05:00Z (in 23 h 59 min)`. The getters carry the same for programs: the
 * amounts as the gate writes them, decimal text in the budget's units (exact; a `number` would
 * round), `retryAt` and `retryAfterMs` (both `undefined` when the action alone is above the limit).
 */
export class BudgetExceededError extends OncegateError {
  static override readonly REASON = reasonName(ErrorReason.BUDGET_EXCEEDED);
  override name = "BudgetExceededError";

  /** The budget's name. */
  get budget(): string {
    return this.metadata["budget"] ?? "";
  }

  /** What the budget's window holds already, in its units (`"9950.00"`; grants for a velocity cap). */
  get used(): string {
    return this.metadata["used"] ?? "";
  }

  /** The budget's limit over its window, in its units. */
  get limit(): string {
    return this.metadata["limit"] ?? "";
  }

  /** What this action would add, in the budget's units. */
  get requested(): string {
    return this.metadata["requested"] ?? "";
  }

  /** When enough of the window frees up (the gate's store clock); `undefined` when the action alone is above the limit. */
  get retryAt(): Date | undefined {
    return parseTime(this.metadata["retry_at"]);
  }
}

/**
 * A status without an oncegate `ErrorInfo`: the gate was not reached, or did not answer in time.
 * `reason` is `undefined`; `retryable` follows the status code.
 */
export class TransportError extends OncegateError {
  override name = "TransportError";

  override get retryable(): boolean {
    return this.code !== undefined && RETRYABLE_CODES.has(this.code);
  }
}

/** An integer metadata value; `undefined` when absent or not an integer. */
export function parseInteger(value: string | undefined): number | undefined {
  if (value === undefined || !/^-?[0-9]+$/.test(value)) return undefined;
  return Number(value);
}

/** An RFC 3339 metadata value; `undefined` when absent or unreadable. */
export function parseTime(value: string | undefined): Date | undefined {
  if (!value) return undefined;
  const time = new Date(value);
  return Number.isNaN(time.getTime()) ? undefined : time;
}
