/**
 * How a guarded attempt behaves: {@link GuardOptions}, with the Rust guard's names
 * (`max_wait`, `complete_deadline`, `heartbeat`, `poll_interval`) in camelCase and milliseconds.
 * Values only: the behaviour lives in `run-once.ts`.
 */

/** Bounds of the guard's waiting and retrying, and how results become receipts. */
export interface GuardOptions {
  /**
   * How long to wait in total, in ms, for an attempt in progress elsewhere (or a briefly
   * unavailable gate) before giving up with the gate's error. 30 s. A live lease that outlasts
   * what is left of it (`RetryInfo`) fails at once: it may be the caller's own earlier attempt.
   */
  maxWait?: number;
  /** How long to keep retrying an unacknowledged Complete (and a Release), in ms. 30 s. */
  completeDeadline?: number;
  /**
   * Heartbeat period in ms; by default a third of the lease, at least 1 s. `false`: no background
   * heartbeat, for a caller that extends the lease itself (the Temporal interceptor extends it on
   * the activity's own heartbeats, so that the lease lives exactly as long as Temporal's attempt).
   */
  heartbeat?: number | false;
  /**
   * Longest pause between two asks while another attempt is in progress, in ms; `RetryInfo` says
   * when the other lease ends at the latest, and the other attempt usually completes well before.
   * 500 ms.
   */
  pollInterval?: number;
  /**
   * Errors (besides `Failure.definite(...)`) that mean the action definitely had no effect, e.g.
   * `(error) => error instanceof CardDeclined`: the token is released.
   */
  definite?: (error: unknown) => boolean;
  /** Turns the function's result into the receipt; compact JSON by default. */
  encode?: (result: unknown) => Uint8Array;
  /** Turns a replayed receipt back into a result; JSON by default (an empty receipt is `undefined`). */
  decode?: (receipt: Uint8Array) => unknown;
}

/** The options with every default filled in. */
export type ResolvedGuardOptions = Required<Omit<GuardOptions, "heartbeat" | "definite">> &
  Pick<GuardOptions, "heartbeat" | "definite">;

/** The default receipt encoder: compact JSON; `undefined` is an empty receipt. */
export function jsonEncode(result: unknown): Uint8Array {
  const text = JSON.stringify(result) as string | undefined;
  return new TextEncoder().encode(text ?? "");
}

/** The default receipt decoder; an empty receipt decodes to `undefined`. */
export function jsonDecode(receipt: Uint8Array): unknown {
  return receipt.length === 0 ? undefined : JSON.parse(new TextDecoder().decode(receipt));
}

/** Fills in the defaults (the Rust guard's). */
export function resolveOptions(options: GuardOptions = {}): ResolvedGuardOptions {
  return {
    maxWait: options.maxWait ?? 30_000,
    completeDeadline: options.completeDeadline ?? 30_000,
    heartbeat: options.heartbeat,
    pollInterval: options.pollInterval ?? 500,
    definite: options.definite,
    encode: options.encode ?? jsonEncode,
    decode: options.decode ?? jsonDecode,
  };
}
