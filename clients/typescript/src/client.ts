/**
 * The client users hold: the RPCs of `rpc.ts` plus the guard's entry point. It adds nothing of
 * its own: `runOnce` hands over to `guard/run-once.ts`, giving it this client as its RPC layer.
 */

import { runOnce, type GuardedWork, type Outcome } from "./guard/run-once.js";
import type { GuardOptions } from "./guard/options.js";
import { GateRpc, type ActionSpec } from "./rpc.js";

/**
 * A client of one oncegate server (Rust: `GateClient`).
 *
 * ```ts
 * const gate = new GateClient("127.0.0.1:50051", { apiKey });
 * const outcome = await gate.runOnce(
 *   { agentId: "billing-agent", runId, action: "payments.transfer", params, idempotencyKey: "invoice-42" },
 *   (grant) => bank.transfer(params, { idempotencyKey: grant.providerKey }),
 * );
 * outcome.result; // the transfer, fresh (outcome.kind "Executed") or replayed ("Replayed")
 * ```
 */
export class GateClient extends GateRpc {
  /**
   * Runs `work` at most once for `spec` and returns what happened: `Executed` with its result,
   * or `Replayed` with the stored receipt decoded, without running `work`.
   *
   * Throws the gate's error when it refuses (`KeyReusedError`, `InProgressError` after
   * `maxWait`...), `FailedError` after `Failure.definite(...)` (the token is released), and
   * `OutcomeUnknownError` after anything else (the token is kept: reconcile).
   */
  runOnce<T>(spec: ActionSpec, work: GuardedWork<T>, options?: GuardOptions): Promise<Outcome<T>> {
    return runOnce(this, spec, work, options);
  }
}
