/**
 * What the guard could not settle, and how a guarded function says how it failed.
 *
 * The names are the Rust guard's: a function throws `Failure.definite(cause)` (Rust
 * `Failure::Definite`) when the action definitely had no effect, and anything else is ambiguous
 * (`Failure::Ambiguous`). The guard then throws one of the `GuardError` classes, whose `kind` is
 * the Rust `GuardError` variant; its `Gate` variant is the gate's own error class
 * (`KeyReusedError`...), thrown as it is. This module does not decide when they are thrown.
 */

import { CompletionSource, ReceiptFormat, type ActionRef, type Approval, type Completion, type Grant } from "../models.js";
import { OncegateError } from "./gate.js";

/** How a guarded function failed (Rust: `Failure`). */
export class Failure extends Error {
  override name = "Failure";

  private constructor(
    /** `Definite`: the action had no effect, release the token. `Ambiguous`: nobody knows. */
    readonly kind: "Definite" | "Ambiguous",
    cause: unknown,
  ) {
    super(`${kind.toLowerCase()} failure: ${describe(cause)}`, { cause });
  }

  /** The action definitely had no effect (the provider declined it, or it was never attempted). */
  static definite(cause: unknown): Failure {
    return new Failure("Definite", cause);
  }

  /** The outcome is unknown (a timeout, a crash mid-call); the default for anything thrown. */
  static ambiguous(cause: unknown): Failure {
    return new Failure("Ambiguous", cause);
  }
}

/**
 * A rule holds the action for an operator's approval (`DECISION_PENDING_APPROVAL`; Rust
 * `GuardError::PendingApproval`): nothing ran, and it is not a grant. Once an operator approves
 * `approval.id`, the same request (same key fields) is granted once.
 */
export class PendingApprovalError extends OncegateError {
  override name = "PendingApprovalError";

  constructor(
    message: string,
    /** The held action. */
    readonly action: ActionRef,
    /** The approval to wait for. */
    readonly approval: Approval,
  ) {
    super(message);
  }

  /** The approval's id. */
  get approvalId(): string {
    return this.approval.id;
  }
}

/**
 * A replayed receipt this client cannot decode (Rust: `ClientError::ReceiptUndecodable`; Python:
 * `ReceiptDecodeError`). The action is *not* run again.
 *
 * A receipt is decoded by its format: an operator's JSON receipt as the value it holds, an
 * operator's text receipt as a string, a worker's (`ReceiptFormat.UNSPECIFIED`) by the guard's
 * `decode` (JSON by default). The message names the action (agent, run, key) and who wrote the
 * receipt (a worker, or the operator by name, and the format). A worker's receipt that fails was
 * usually completed by hand with raw bytes, or by a client with another encoder: pass a `decode`
 * that reads it. `cause` is the decoder's error.
 */
export class ReceiptDecodeError extends OncegateError {
  override name = "ReceiptDecodeError";

  constructor(
    message: string,
    /** The completed action. */
    readonly action: ActionRef,
    /** What is stored. */
    readonly completion: Completion,
    cause: unknown,
  ) {
    super(message, { cause });
  }

  /** The stored receipt, as the gate returned it. */
  get receipt(): Uint8Array {
    return this.completion.receipt;
  }

  /** Who wrote the receipt: `"worker"` or `"operator"`. */
  get writer(): "worker" | "operator" {
    return this.completion.source === CompletionSource.OPERATOR ? "operator" : "worker";
  }

  /** The operator principal who wrote it; empty for a worker's receipt. */
  get operator(): string {
    return this.completion.operator;
  }

  /** The format its writer stated (`UNSPECIFIED`: a worker's, in its client's own encoding). */
  get receiptFormat(): ReceiptFormat {
    return this.completion.receiptFormat;
  }
}

/** The Rust `GuardError` variants the guard throws as its own classes. */
export type GuardErrorKind = "Failed" | "ReleaseFailed" | "OutcomeUnknown" | "CompleteUnacknowledged";

/** An attempt the guard ran under a grant and could not settle cleanly. */
export abstract class GuardError extends OncegateError {
  /** The Rust `GuardError` variant this class stands for. */
  abstract readonly kind: GuardErrorKind;

  constructor(
    message: string,
    /** The action, to Complete or Release. */
    readonly action: ActionRef,
    /** The grant the function ran under. */
    readonly grant: Grant,
    cause: unknown,
  ) {
    super(message, { cause });
  }

  /** The token to Complete or Release with. */
  get token(): string {
    return this.grant.token;
  }

  /** The fencing number of the grant. */
  get fencing(): number {
    return this.grant.fencing;
  }

  /** The key the provider was given, to look the action up there. */
  get providerKey(): string {
    return this.grant.providerKey;
  }
}

/** The function failed definitely and its token was released; `cause` is its error. */
export class FailedError extends GuardError {
  override name = "FailedError";
  readonly kind = "Failed";
}

/**
 * The function failed definitely, but the Release was not acknowledged: the lease will expire
 * and the action will need reconciling. `cause` is the function's error.
 */
export class ReleaseFailedError extends GuardError {
  override name = "ReleaseFailedError";
  readonly kind = "ReleaseFailed";

  constructor(
    message: string,
    action: ActionRef,
    grant: Grant,
    cause: unknown,
    /** Why the release failed. */
    readonly releaseError: OncegateError,
  ) {
    super(message, action, grant, cause);
  }
}

/**
 * The action may or may not have taken effect, so the guard did not release its token.
 *
 * Reconcile: ask the provider with `providerKey` whether it happened, then
 * `gate.complete(action, token, receipt)` if it did, or `gate.release(action, token)` if it did
 * not. Until then the gate refuses to run the action again. `cause` is what the function threw.
 */
export class OutcomeUnknownError extends GuardError {
  override name = "OutcomeUnknownError";
  readonly kind: "OutcomeUnknown" | "CompleteUnacknowledged" = "OutcomeUnknown";
}

/**
 * The action ran and returned, but the gate never acknowledged its Complete. Retry
 * `gate.complete(action, token, receipt)`; never run the action again. `cause` is the last
 * Complete error (or the encoder's, when `receipt` is `undefined`).
 */
export class CompleteUnacknowledgedError extends OutcomeUnknownError {
  override name = "CompleteUnacknowledgedError";
  override readonly kind = "CompleteUnacknowledged";

  constructor(
    message: string,
    action: ActionRef,
    grant: Grant,
    cause: unknown,
    /** What the function returned. */
    readonly result: unknown,
    /** Its encoded form, to Complete with; `undefined` when it could not be encoded. */
    readonly receipt: Uint8Array | undefined,
  ) {
    super(message, action, grant, cause);
  }
}

/** A short description of a thrown value, for messages. */
export function describe(value: unknown): string {
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  return String(value);
}
