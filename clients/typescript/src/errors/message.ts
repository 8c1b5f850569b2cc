/**
 * What a model may be told when the guard stops a tool call: the gate's answer in words, what
 * happened and what to do next, without the token, the provider key or any param value (a model's
 * context is no place for credentials). The same words as the Python adapters'
 * `model_message` and the MCP gateway's answers, refusal by refusal. Decides nothing.
 */

import { describe, FailedError, OutcomeUnknownError, PendingApprovalError, ReleaseFailedError } from "./guard.js";
import {
  BudgetExceededError,
  InProgressError,
  KeyReusedError,
  LeaseExpiredUnresolvedError,
  OncegateError,
  PolicyDeniedError,
  RateLimitedError,
  StoreUnavailableError,
  TransportError,
} from "./gate.js";

const NOT_AROUND = "Do not retry it under another idempotency key or with other arguments to get around this";

/**
 * A tool result for the model that says why the gate stopped the call, and what to do now; for
 * an error that is not the gate's, `undefined` (rethrow it: it is the developer's to see).
 *
 * ```ts
 * execute: async (input, options) => {
 *   try { return await runsOnce(input, options); }
 *   catch (error) { return { notExecuted: modelMessage(error) ?? rethrow(error) }; }
 * }
 * ```
 */
export function modelMessage(error: unknown): string | undefined {
  if (error instanceof PendingApprovalError) {
    const reason = error.approval.reason ? ` (${error.approval.reason})` : "";
    return (
      `Not executed yet: this call is held for a person's approval${reason}; its approval id is ` +
      `${error.approvalId}. Nothing ran. Wait for the decision, then call again with the same ` +
      `arguments: once approved it runs once; if declined, it will not run. ${NOT_AROUND}.`
    );
  }
  if (error instanceof PolicyDeniedError) {
    if (error.approvalId) {
      return (
        `Not executed. A person declined the approval this call needed (approval ${error.approvalId}); ` +
        "the tool did not run. Do not retry the same call: ask the user what they want instead."
      );
    }
    const rule = error.policyId ? `the rule "${error.policyId}"` : "no rule permits it";
    return `Not executed: the gate's rules forbid this call (${rule}); nothing ran. ${NOT_AROUND}; ask a person if it is needed.`;
  }
  if (error instanceof BudgetExceededError) return budget(error);
  if (error instanceof KeyReusedError) {
    const fields = error.differingFields.join(", ") || "unknown";
    return (
      "Not executed. This idempotency key was already used for a call with different arguments " +
      `(differing fields: ${fields}); that earlier call stands. Do not retry under a new idempotency ` +
      "key to get around this: if a second, different action is really wanted, confirm it with the user first."
    );
  }
  if (error instanceof OutcomeUnknownError || error instanceof ReleaseFailedError) {
    return (
      "The outcome of this call is unknown: the action may or may not have happened. Do not retry it, " +
      "under this or any other idempotency key, until it has been reconciled with the provider; a retry " +
      "before then is refused, and after it the retry returns the recorded result."
    );
  }
  if (error instanceof LeaseExpiredUnresolvedError) {
    return (
      "Not executed. An earlier attempt of this call ended with an unknown outcome and has not been " +
      "reconciled: it may have happened. Do not retry it, under this or any other idempotency key, " +
      "until it has been reconciled with the provider."
    );
  }
  if (error instanceof InProgressError) {
    return (
      "Not executed here: another attempt of the same call is still running. Wait for its result " +
      "instead of calling it again; calling later with the same arguments returns it once it is recorded."
    );
  }
  if (error instanceof FailedError) return `The action failed and had no effect: ${describe(error.cause)}`;
  if (error instanceof RateLimitedError) {
    return `Not executed: too many calls right now; nothing ran. Call again ${after(error.retryAfterMs)}.`;
  }
  if (error instanceof StoreUnavailableError || error instanceof TransportError) {
    return (
      "Not executed: the gate that makes sure this action runs at most once is unavailable; nothing " +
      "was done. Call again later with the same arguments."
    );
  }
  if (error instanceof OncegateError) return `Not executed: the gate refused this call (${error.reason ?? error.name}).`;
  return undefined;
}

function budget(error: BudgetExceededError): string {
  const what =
    `the budget "${error.budget}" would be exceeded (${error.used} of ${error.limit} used, and ` +
    `this call needs ${error.requested})`;
  const at = error.retryAt;
  if (at === undefined) {
    return `Not executed: ${what}; this call alone is above the limit, so waiting will not help and nothing ran. ${NOT_AROUND}; ask a person.`;
  }
  return (
    `Not executed: ${what}; nothing ran. It frees up at ${at.toISOString()} (${after(error.retryAfterMs)}): ` +
    `do not call again before then. ${NOT_AROUND}.`
  );
}

/** When to call again, exactly as the gate said it: in milliseconds, said in seconds. */
function after(ms: number | undefined): string {
  if (ms === undefined) return "later";
  const seconds = Math.floor(ms / 1000);
  const millis = ms % 1000;
  return millis ? `in ${seconds}.${String(millis).padStart(3, "0")} s` : `in ${seconds} s`;
}
