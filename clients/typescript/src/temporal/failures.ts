/**
 * What a Temporal workflow sees when the gate stops an activity: the gate's refusal or an unknown
 * outcome as an `ApplicationFailure` whose type, retryability and `nextRetryDelay` say what to
 * do, and whose one detail (plain strings and numbers, which every payload converter carries)
 * names the action: agent, run, key, and the provider key where the outcome is unknown, never the
 * token. The same types as the Python interceptor's (`oncegate.integrations.temporal`).
 *
 * It decides nothing about the protocol; `interceptor.ts` calls it on the guard's errors.
 */

import { ApplicationFailure } from "@temporalio/common";

import { InProgressError, KeyReusedError, LeaseExpiredUnresolvedError, OncegateError } from "../errors/gate.js";
import { OutcomeUnknownError, PendingApprovalError } from "../errors/guard.js";
import type { ActionSpec } from "../rpc.js";

/** The `ApplicationFailure` types the interceptor throws. */
export const FailureType = {
  KeyReused: "OncegateKeyReused",
  InProgress: "OncegateInProgress",
  OutcomeUnknown: "OncegateOutcomeUnknown",
  Unresolved: "OncegateUnresolved",
  PendingApproval: "OncegatePendingApproval",
} as const;

/** How the interceptor maps what it cannot retry itself. */
export interface FailureOptions {
  /** Make `OncegateOutcomeUnknown` retryable after the rest of the lease (non-retryable by default). */
  retryUnknown: boolean;
  /** The retry delay of `OncegateUnresolved` and `OncegatePendingApproval`, in ms. */
  waitDelayMs: number;
}

/** The `ApplicationFailure` for a refusal or an unknown outcome of `spec`. */
export function applicationFailure(error: OncegateError, spec: ActionSpec, options: FailureOptions): ApplicationFailure {
  const key = spec.idempotencyKey ?? "";
  const where = `${spec.action} (agent ${JSON.stringify(spec.agentId)}, run ${JSON.stringify(spec.runId)}, key ${JSON.stringify(key)})`;
  const detail: Record<string, unknown> = {
    reason: error.reason ?? error.name,
    action: spec.action,
    agentId: spec.agentId,
    runId: spec.runId,
    key,
  };
  const failure = (message: string, type: string, nonRetryable: boolean, nextRetryDelay?: number) =>
    ApplicationFailure.create({
      message: `${where}: ${message}`,
      type,
      nonRetryable,
      details: [detail],
      cause: error,
      ...(nextRetryDelay === undefined ? {} : { nextRetryDelay }),
    });
  if (error instanceof KeyReusedError) {
    detail["differingFields"] = error.differingFields;
    const fields = error.differingFields.join(", ") || "params";
    return failure(
      `this activity id was already used with other input (${fields} differ); a retry cannot change an ` +
        "activity's input: fix the workflow, never mint a new key",
      FailureType.KeyReused,
      true,
    );
  }
  if (error instanceof InProgressError) {
    detail["retryAfterMs"] = error.retryAfterMs;
    return failure(
      `another attempt holds the lease; retry after ${error.retryAfterMs} ms`,
      FailureType.InProgress,
      false,
      error.retryAfterMs,
    );
  }
  if (error instanceof OutcomeUnknownError) {
    detail["providerKey"] = error.providerKey;
    detail["fencing"] = error.fencing;
    const leaseEnd = error.grant.leaseExpiresAt?.getTime();
    const rest = options.retryUnknown && leaseEnd !== undefined ? Math.max(0, leaseEnd - Date.now()) : undefined;
    return failure(
      `the outcome is unknown (the action may have happened); reconcile with the provider using provider key ` +
        `${error.providerKey}, then run this activity again under the same activity id`,
      FailureType.OutcomeUnknown,
      !options.retryUnknown,
      rest,
    );
  }
  if (error instanceof LeaseExpiredUnresolvedError) {
    detail["providerKey"] = error.providerKey;
    detail["fencing"] = error.fencing;
    return failure(
      "an earlier attempt's lease ended with no outcome; a resolver or an operator settles it with the provider " +
        `(provider key ${error.providerKey}), and a later attempt replays it`,
      FailureType.Unresolved,
      false,
      options.waitDelayMs,
    );
  }
  if (error instanceof PendingApprovalError) {
    detail["approvalId"] = error.approvalId;
    return failure(
      `waits for an operator's approval ${error.approvalId}`,
      FailureType.PendingApproval,
      false,
      options.waitDelayMs,
    );
  }
  return failure(
    error.message,
    `Oncegate${error.constructor.name.replace(/Error$/, "")}`,
    !error.retryable,
    error.retryAfterMs,
  );
}
