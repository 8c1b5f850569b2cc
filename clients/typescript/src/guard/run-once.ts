/**
 * The guard: runs one side-effecting action at most once, and never guesses about an outcome it
 * does not know. The protocol of the Rust (`run_once`) and Python guards:
 *
 * 1. RequestToken, naming this attempt as the holder (a lost grant reply is re-delivered).
 * 2. Already completed: return the stored receipt; the function does not run.
 * 3. Granted: run the function with the grant (token, fencing, provider key) while a heartbeat
 *    extends the lease.
 * 4. Success: Complete with the encoded result, retried until acknowledged or `completeDeadline`
 *    passes (then `CompleteUnacknowledgedError`).
 * 5. `Failure.definite(cause)` (or an error `definite` accepts): Release, then `FailedError`
 *    (`ReleaseFailedError` when the release is not acknowledged).
 * 6. Anything else thrown (a timeout, `Failure.ambiguous`): never Release; `OutcomeUnknownError`,
 *    to be reconciled with the provider through the provider key.
 * 7. In progress elsewhere: wait as `RetryInfo` says, within `maxWait`, then the gate's error; a
 *    lease that outlasts what is left of `maxWait` fails at once (it may be the caller's own).
 * 8. Key reused (and every other refusal): thrown as it is; never retried under a new key.
 */

import { randomUUID } from "node:crypto";
import { hostname } from "node:os";

import { InProgressError, OncegateError } from "../errors/gate.js";
import {
  CompleteUnacknowledgedError,
  describe,
  FailedError,
  Failure,
  OutcomeUnknownError,
  PendingApprovalError,
  ReceiptDecodeError,
  ReleaseFailedError,
} from "../errors/guard.js";
import {
  CompletionSource,
  Decision,
  ReceiptFormat,
  ReleaseReason,
  type ActionRef,
  type Completion,
  type Grant,
  type RequestTokenResult,
} from "../models.js";
import type { ActionSpec, GateRpc } from "../rpc.js";
import { Backoff } from "./backoff.js";
import { Heartbeat } from "./heartbeat.js";
import { resolveOptions, type GuardOptions, type ResolvedGuardOptions } from "./options.js";

/** What the guard did (Rust: `Outcome`). */
export type Outcome<T> =
  | {
      /** The function ran and its receipt was recorded. */
      readonly kind: "Executed";
      /** What the function returned. */
      readonly result: T;
      /** Its receipt, now stored. */
      readonly receipt: Uint8Array;
      /** The grant it ran under. */
      readonly grant: Grant;
      readonly action: ActionRef;
      /** The stored completion. */
      readonly completion: Completion;
    }
  | {
      /** The action had already completed: nothing ran. */
      readonly kind: "Replayed";
      /**
       * The stored receipt, decoded by its format: an operator's JSON as the value, an operator's
       * text as a string, a worker's by `decode` (JSON by default).
       */
      readonly result: T;
      readonly receipt: Uint8Array;
      readonly action: ActionRef;
      /** The original completion. */
      readonly completion: Completion;
    };

/** The function the guard runs: it gets the grant and returns the action's result. */
export type GuardedWork<T> = (grant: Grant) => T | Promise<T>;

function defaultHolder(): string {
  return `ts:${hostname().slice(0, 64)}:${process.pid}:${randomUUID().replaceAll("-", "")}`;
}

/** Runs `work` at most once for `spec` (see the module comment for the protocol). */
export async function runOnce<T>(
  rpc: GateRpc,
  spec: ActionSpec,
  work: GuardedWork<T>,
  guardOptions: GuardOptions = {},
): Promise<Outcome<T>> {
  const options = resolveOptions(guardOptions);
  // A holder makes RequestToken safe to retry: a lost grant reply is re-delivered.
  const held: ActionSpec = { ...spec, holder: spec.holder || defaultHolder() };
  const answer = await acquire(rpc, held, options);
  const { action } = answer;
  if (answer.decision === Decision.PENDING_APPROVAL && answer.approval !== undefined) {
    const { id, reason } = answer.approval;
    throw new PendingApprovalError(
      `${spec.action} waits for an operator's approval ${id} (${reason}); ask again once it is approved`,
      action,
      answer.approval,
    );
  }
  if (answer.grant === undefined) {
    if (answer.completion === undefined) throw new TypeError("RequestToken answered neither grant nor completion");
    const { completion } = answer;
    const result = decodeReplay(spec, action, completion, options) as T;
    return { kind: "Replayed", result, receipt: completion.receipt, action, completion };
  }
  const grant = answer.grant;
  const heartbeat = startHeartbeat(rpc, action, grant, held, options);
  let result: T;
  try {
    result = await work(grant);
  } catch (thrown) {
    heartbeat.stop();
    throw await settleFailure(rpc, spec, action, grant, thrown, options);
  }
  heartbeat.stop();
  return finish(rpc, spec, action, grant, result, options);
}

/**
 * A replayed receipt, decoded by its format: an operator's JSON as the value, an operator's text as
 * a string, a worker's by the guard's `decode`. One that cannot be read is a `ReceiptDecodeError`
 * naming the action and who wrote it, never the decoder's bare error (and never a reason to run
 * the action again).
 */
function decodeReplay(
  spec: ActionSpec,
  action: ActionRef,
  completion: Completion,
  options: ResolvedGuardOptions,
): unknown {
  const { receipt, receiptFormat } = completion;
  try {
    if (receiptFormat === ReceiptFormat.JSON) return JSON.parse(UTF8.decode(receipt));
    if (receiptFormat === ReceiptFormat.TEXT) return UTF8.decode(receipt);
    return options.decode(receipt);
  } catch (error) {
    const { agentId, runId } = action.scope;
    throw new ReceiptDecodeError(
      `${spec.action} (agent ${JSON.stringify(agentId)}, run ${JSON.stringify(runId)}, key ${JSON.stringify(action.key)}) ` +
        `already completed, but its receipt (${receipt.length} bytes, written by ${receiptWriter(completion)}) ` +
        `cannot be decoded: ${describe(error)}. The action was not run again. ${decodeHint(completion)}`,
      action,
      completion,
      error,
    );
  }
}

/** Who wrote a receipt and in what, as a person reads it: `operator "ops-alice" as text`. */
function receiptWriter(completion: Completion): string {
  if (completion.source !== CompletionSource.OPERATOR) {
    return `a worker (fencing ${completion.fencing}) in its client's own encoding`;
  }
  const what =
    completion.receiptFormat === ReceiptFormat.JSON
      ? "as JSON"
      : completion.receiptFormat === ReceiptFormat.TEXT
        ? "as text"
        : "with no format stated";
  return `operator ${JSON.stringify(completion.operator)} ${what}`;
}

/** Strict UTF-8: a malformed text receipt is an error, not replacement characters. */
const UTF8 = new TextDecoder("utf-8", { fatal: true });

function decodeHint(completion: Completion): string {
  if (completion.receiptFormat !== ReceiptFormat.UNSPECIFIED) {
    return (
      "The gate checks an operator's receipt against its format when it is recorded, so the stored receipt " +
      "is not what was recorded: report it (error.receipt holds it)."
    );
  }
  if (completion.source === CompletionSource.OPERATOR) return "Pass a decode that reads it (error.receipt holds it).";
  return (
    "The guard's decoder (JSON unless decode says otherwise) cannot read what the worker's client wrote: it was " +
    "probably completed with raw bytes (complete(action, token, bytes)) or by a client with another encoder. " +
    "Pass a decode that reads it (error.receipt holds it)."
  );
}

/**
 * RequestToken, waiting out IN_PROGRESS and brief unavailability within `maxWait`. A live lease
 * that outlasts what is left of the wait fails at once: waiting could only end in the same error.
 */
async function acquire(rpc: GateRpc, spec: ActionSpec, options: ResolvedGuardOptions): Promise<RequestTokenResult> {
  const backoff = new Backoff(Date.now() + options.maxWait);
  for (;;) {
    try {
      return await rpc.requestToken(spec);
    } catch (error) {
      if (!(error instanceof OncegateError) || !error.retryable) throw error;
      if (error instanceof InProgressError && error.retryAfterMs !== undefined && error.retryAfterMs > backoff.left()) {
        throw beyondWait(spec, error, options.maxWait);
      }
      const hint =
        error instanceof InProgressError
          ? Math.min(options.pollInterval, error.retryAfterMs ?? options.pollInterval)
          : error.retryAfterMs;
      if (!(await backoff.wait(hint))) throw error;
    }
  }
}

/** Complete, retrying transient failures until acknowledged or `completeDeadline` passes. */
async function finish<T>(
  rpc: GateRpc,
  spec: ActionSpec,
  action: ActionRef,
  grant: Grant,
  result: T,
  options: ResolvedGuardOptions,
): Promise<Outcome<T>> {
  let receipt: Uint8Array;
  try {
    receipt = options.encode(result);
  } catch (error) {
    throw new CompleteUnacknowledgedError(
      `${spec.action} (${action.key}) ran, but its result could not be encoded as a receipt: ${describe(error)}`,
      action,
      grant,
      error,
      result,
      undefined,
    );
  }
  const backoff = new Backoff(Date.now() + options.completeDeadline);
  for (;;) {
    try {
      const completion = await rpc.complete(action, grant.token, receipt);
      return { kind: "Executed", result, receipt, grant, action, completion };
    } catch (error) {
      const retry = error instanceof OncegateError && error.retryable;
      if (!retry || !(await backoff.wait(error.retryAfterMs))) {
        throw new CompleteUnacknowledgedError(
          `${spec.action} (${action.key}) ran, but the gate did not acknowledge its Complete: ` +
            `${describe(error)}. Retry complete() with this error's action, token and receipt; never run it again.`,
          action,
          grant,
          error,
          result,
          receipt,
        );
      }
    }
  }
}

/** The error to throw for what the function threw: released after a definite failure, else kept. */
async function settleFailure(
  rpc: GateRpc,
  spec: ActionSpec,
  action: ActionRef,
  grant: Grant,
  thrown: unknown,
  options: ResolvedGuardOptions,
): Promise<OncegateError> {
  const cause = thrown instanceof Failure ? thrown.cause : thrown;
  if (!isDefinite(thrown, options)) {
    return new OutcomeUnknownError(
      `${spec.action} (${action.key}): the outcome is unknown after ${describe(cause)}. ` + reconcileHint(grant),
      action,
      grant,
      cause,
    );
  }
  const backoff = new Backoff(Date.now() + options.completeDeadline);
  for (;;) {
    try {
      await rpc.release(action, grant.token, ReleaseReason.DEFINITE_FAILURE);
      return new FailedError(
        `${spec.action} (${action.key}) failed definitely and its token was released: ${describe(cause)}`,
        action,
        grant,
        cause,
      );
    } catch (error) {
      if (!(error instanceof OncegateError)) throw error;
      if (!error.retryable || !(await backoff.wait(error.retryAfterMs))) {
        return new ReleaseFailedError(
          `${spec.action} (${action.key}) failed definitely (${describe(cause)}), but releasing its token ` +
            `failed (${describe(error)}); it will need reconciling once its lease ends`,
          action,
          grant,
          cause,
          error,
        );
      }
    }
  }
}

function isDefinite(thrown: unknown, options: ResolvedGuardOptions): boolean {
  if (thrown instanceof Failure) return thrown.kind === "Definite";
  // An unknown outcome from a guard nested in the function is never a definite failure.
  if (thrown instanceof OutcomeUnknownError) return false;
  return options.definite?.(thrown) ?? false;
}

function startHeartbeat(
  rpc: GateRpc,
  action: ActionRef,
  grant: Grant,
  spec: ActionSpec,
  options: ResolvedGuardOptions,
): Pick<Heartbeat, "stop"> {
  if (options.heartbeat === false) return { stop() {} };
  const granted = grant.leaseExpiresAt === undefined ? 0 : grant.leaseExpiresAt.getTime() - Date.now();
  const lease = Math.max(spec.leaseTtlMs ?? granted, 1_000);
  const period = options.heartbeat ?? Math.max(lease / 3, 1_000);
  return new Heartbeat(rpc, action, grant.token, lease, period);
}

/** The error when the live lease outlasts the wait, saying why it may be the caller's own doing. */
function beyondWait(spec: ActionSpec, error: InProgressError, maxWait: number): InProgressError {
  const left = Math.round((error.retryAfterMs ?? 0) / 1000);
  return new InProgressError(
    `${spec.action}: another attempt holds a live lease for ${left} s more, beyond what is left of maxWait ` +
      `(${maxWait / 1000} s), so the guard did not wait. The live lease may be this caller's own earlier attempt ` +
      "(one that threw OutcomeUnknownError, timed out or crashed): reconcile it with the provider using its " +
      "provider key, then complete or release its token (operators: `oncegate admin get` shows it). Otherwise " +
      "another worker is running it: retry later, or raise maxWait above the lease to wait for it.",
    {
      reason: error.reason,
      code: error.code,
      metadata: error.metadata,
      retryAfterMs: error.retryAfterMs,
      fieldViolations: error.fieldViolations,
      cause: error,
    },
  );
}

function reconcileHint(grant: Grant): string {
  return (
    `The token was not released: reconcile with the provider using provider key ${grant.providerKey}, ` +
    `then complete or release token ${grant.token} (fencing ${grant.fencing}).`
  );
}

