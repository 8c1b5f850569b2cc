/**
 * Pauses between retries of a call that failed transiently: exponential, jittered, within a
 * deadline. It decides how long to wait, never whether an error is worth retrying.
 */

import { setTimeout as sleep } from "node:timers/promises";

/** Exponential backoff with jitter until a deadline (`Date.now()` milliseconds). */
export class Backoff {
  private delay: number;

  constructor(
    private readonly deadline: number,
    first = 50,
    private readonly cap = 2_000,
  ) {
    this.delay = first;
  }

  /** Milliseconds left before the deadline (0 when past). */
  left(): number {
    return Math.max(0, this.deadline - Date.now());
  }

  /**
   * Waits before the next try (`hintMs` when the gate said how long, else the next backoff step),
   * never past the deadline; `false`, without waiting, once the deadline has passed.
   */
  async wait(hintMs?: number): Promise<boolean> {
    const left = this.left();
    if (left <= 0) return false;
    const step = hintMs ?? this.delay / 2 + Math.random() * (this.delay / 2);
    this.delay = Math.min(this.delay * 2, this.cap);
    await sleep(Math.min(Math.max(step, 10), left));
    return true;
  }
}
