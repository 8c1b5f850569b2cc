/**
 * The lease heartbeat: extends a grant's lease in the background while the guarded function
 * runs. It only extends; it never completes, releases or decides anything.
 */

import { setTimeout as sleep } from "node:timers/promises";

import type { ActionRef } from "../models.js";
import type { GateRpc } from "../rpc.js";

/** Extends a lease every `periodMs` until stopped, and stops by itself on a refusal. */
export class Heartbeat {
  private readonly stopped = new AbortController();
  private readonly running: Promise<void>;

  constructor(rpc: GateRpc, action: ActionRef, token: string, leaseMs: number, periodMs: number) {
    this.running = this.run(rpc, action, token, leaseMs, periodMs);
  }

  private async run(rpc: GateRpc, action: ActionRef, token: string, leaseMs: number, periodMs: number) {
    const { signal } = this.stopped;
    while (!signal.aborted) {
      try {
        await sleep(periodMs, undefined, { signal, ref: false });
        await rpc.extendLease(action, token, leaseMs);
      } catch (error) {
        if (signal.aborted) return;
        // A refusal (the lease already ended, the action completed) ends the heartbeat; a
        // transient failure is tried again next period.
        if (!(error as { retryable?: boolean }).retryable) return;
      }
    }
  }

  /** Stops extending; an extension in flight finishes on its own. */
  stop(): void {
    this.stopped.abort();
  }

  /** Resolves once the loop has ended (for tests). */
  finished(): Promise<void> {
    return this.running;
  }
}
