/**
 * The resolver: settles the actions whose lease ended with no outcome by asking the provider.
 *
 * A {@link Resolver} holds one lookup per action type (`payments.transfer` → "ask the bank by
 * provider key"). {@link Resolver.run} follows the gate's `WatchUnresolved` stream (what is
 * unresolved now, then each lease that ends, within seconds), asks the action's lookup, and
 * settles with `ResolveExpired` and the fencing number it was sent, so that two resolvers never
 * settle one grant twice or differently (the second hears `ALREADY_SETTLED` or
 * `ALREADY_COMPLETED`, and moves on). A lookup that answers {@link Lookup.unknown}, throws or
 * takes longer than `lookupTimeoutMs` leaves the action for a person (it stays listed, counted and
 * notified); it is logged. A broken stream is reopened with backoff.
 *
 * The resolver's principal needs the `resolver` role (or `operator`) for the agents it settles.
 * The same shape as the Rust `oncegate_client::Resolver` and the Python `oncegate.Resolver`.
 */

import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { createClient, type CallOptions, type Client } from "@connectrpc/connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import { setTimeout as sleep } from "node:timers/promises";

import { fromCallError } from "./errors/status.js";
import { reasonName } from "./errors/gate.js";
import {
  ActionRefSchema,
  ErrorReason,
  GateAdminService,
  ReceiptFormat,
  ResolveExpiredRequestSchema,
  Resolution,
  type UnresolvedAction,
} from "./gen/oncegate/v1/oncegate_pb.js";
import type { ActionRef } from "./models.js";
import { addressFromEnv } from "./address.js";
import { callOptions, openTransport, type GateOptions } from "./rpc.js";

/** What the provider says about one action (Rust: `Lookup`; Python: `Completed`, `Failed`, `Unknown`). */
export type Lookup =
  /** It happened: settle as completed with this receipt (what the agent's retry replays). */
  | { readonly kind: "Completed"; readonly receipt: Uint8Array; readonly format: ReceiptFormat.JSON | ReceiptFormat.TEXT }
  /** It definitely did not happen: settle as failed (the action may be granted again). */
  | { readonly kind: "Failed" }
  /** The provider cannot tell: leave it for a person. */
  | { readonly kind: "Unknown" };

/** The answers a lookup returns. */
export const Lookup = {
  /** Completed, with a JSON receipt: `value` as `JSON.stringify` writes it. */
  json(value: unknown): Lookup {
    const text = JSON.stringify(value);
    if (text === undefined) throw new TypeError("a JSON receipt needs a JSON value");
    return { kind: "Completed", receipt: new TextEncoder().encode(text), format: ReceiptFormat.JSON };
  },
  /** Completed, with a text receipt (replayed as a `string`). */
  text(text: string): Lookup {
    return { kind: "Completed", receipt: new TextEncoder().encode(text), format: ReceiptFormat.TEXT };
  },
  /** It definitely did not happen. */
  failed: { kind: "Failed" } as Lookup,
  /** The provider cannot tell. */
  unknown: { kind: "Unknown" } as Lookup,
} as const;

/** An action whose lease ended with no outcome, as the gate sent it: what a lookup needs. */
export interface Unresolved {
  /** The action, as the gate names it. */
  readonly action: ActionRef;
  /** Its action type (`payments.transfer`); empty for records older gates wrote. */
  readonly actionName: string;
  /** The params its latest grant was asked with (a JSON object as text). */
  readonly paramsJson: string;
  /** The params, parsed (an empty object when none were kept). */
  readonly params: Record<string, unknown>;
  /** The key the provider was given: look the request up by it. */
  readonly providerKey: string;
  /** The unsettled grant's fencing number (the settlement is conditional on it). */
  readonly fencing: number;
  /** The unsettled grant's token. */
  readonly token: string;
  /** When its lease ended (store clock). */
  readonly leaseExpiredAt: Date | undefined;
  /** The holder named at grant time, if any. */
  readonly holder: string;
}

/** Reads the gate's entry. */
export function unresolvedFrom(message: UnresolvedAction): Unresolved {
  const scope = message.action?.scope;
  let params: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(message.paramsJson);
    if (parsed !== null && typeof parsed === "object" && !Array.isArray(parsed)) {
      params = parsed as Record<string, unknown>;
    }
  } catch {
    // none kept (an older record), or not an object: an empty object, as the other clients read it
  }
  return {
    action: { scope: { agentId: scope?.agentId ?? "", runId: scope?.runId ?? "" }, key: message.action?.key ?? "" },
    actionName: message.actionName,
    paramsJson: message.paramsJson,
    params,
    providerKey: message.providerKey,
    fencing: Number(message.fencing),
    token: message.token,
    leaseExpiredAt: message.leaseExpiredAt === undefined ? undefined : timestampDate(message.leaseExpiredAt),
    holder: message.holder,
  };
}

/** What became of one unresolved action (Rust: `Settled`; Python: `Settled`). */
export type Settled =
  /** Settled as completed with the lookup's receipt. */
  | { readonly kind: "Completed" }
  /** Settled as failed. */
  | { readonly kind: "Failed" }
  /** Another resolver or an operator settled it first (or a newer grant replaced it). */
  | { readonly kind: "ByOther" }
  /**
   * Left for a person, and why: no lookup for the action, the provider cannot tell, the lookup
   * threw or timed out, the settlement failed, or this resolver is settling it already.
   */
  | { readonly kind: "Left"; readonly why: string };

/** A lookup: asks the provider about `unresolved`; `signal` aborts when the lookup timed out or the resolver stops. */
export type LookupFn = (unresolved: Unresolved, options: { signal: AbortSignal }) => Lookup | Promise<Lookup>;

/** Where the resolver says what it did (`console` by default). */
export interface ResolverLogger {
  info(message: string): void;
  warn(message: string): void;
}

/** How a resolver reaches its gate and settles (milliseconds throughout). */
export interface ResolverOptions extends GateOptions {
  /** Watch only this agent (every agent the principal acts for when unset). */
  agentId?: string;
  /** How long a lookup may take before the action is left for a person (10 s by default). */
  lookupTimeoutMs?: number;
  /** The first and the longest wait before reopening a broken stream (200 ms and 30 s by default). */
  backoffMs?: readonly [number, number];
  /** Kept with every settlement. */
  note?: string;
  /** Where to log; `console` by default. */
  logger?: ResolverLogger;
}

const SETTLED_BY_OTHER = new Set([reasonName(ErrorReason.ALREADY_SETTLED), reasonName(ErrorReason.ALREADY_COMPLETED)]);

/**
 * Settles unresolved actions by asking the provider, one lookup per action type.
 *
 * ```ts
 * const resolver = new Resolver("127.0.0.1:50051", { apiKey: RESOLVER_KEY });
 * resolver.lookup("payments.transfer", async (u) => {
 *   const payment = await bank.findByIdempotencyKey(u.providerKey);
 *   if (payment === undefined) return Lookup.unknown;
 *   return payment.status === "paid" ? Lookup.json({ transferId: payment.id }) : Lookup.failed;
 * });
 * await resolver.run(); // until resolver.stop()
 * ```
 */
export class Resolver {
  /** The gate's address, as given. */
  readonly address: string;
  /** The registered lookups, by action type. */
  readonly lookups = new Map<string, LookupFn>();
  private readonly client: Client<typeof GateAdminService>;
  private readonly sessions: Http2SessionManager | undefined;
  private readonly callOptions: CallOptions;
  private readonly agentId: string;
  private readonly lookupTimeoutMs: number;
  private readonly backoffMs: readonly [number, number];
  private readonly note: string;
  private readonly logger: ResolverLogger;
  /** The grants being settled here (agent, run, key, fencing), so that a repeat is not looked up twice at once. */
  private readonly busy = new Set<string>();
  private readonly pending = new Set<Promise<Settled>>();
  private stopping: AbortController | undefined;

  /**
   * @param address `host:port`, `http(s)://host:port` or `unix:<path>` (the gate's admin socket,
   *   where the caller is its local operator); without it `ONCEGATE_ADMIN_TARGET`, else
   *   `127.0.0.1:50051`.
   */
  constructor(address: string | undefined = undefined, options: ResolverOptions = {}) {
    this.address = address ?? addressFromEnv(true);
    const { transport, sessions } = openTransport(this.address, options);
    this.sessions = sessions;
    this.client = createClient(GateAdminService, transport);
    this.callOptions = callOptions(options);
    this.agentId = options.agentId ?? "";
    this.lookupTimeoutMs = options.lookupTimeoutMs ?? 10_000;
    const [first, longest] = options.backoffMs ?? [200, 30_000];
    this.backoffMs = [first, Math.max(first, longest)];
    this.note = options.note ?? "resolver: provider lookup by provider key";
    this.logger = options.logger ?? console;
  }

  /**
   * Registers the lookup of `actionName`: asked for each of its unresolved actions; it answers
   * `Lookup.json(receipt)`, `Lookup.text(receipt)`, `Lookup.failed` or `Lookup.unknown`.
   */
  lookup(actionName: string, lookup: LookupFn): this {
    this.lookups.set(actionName, lookup);
    return this;
  }

  /**
   * Asks the action's lookup (within `lookupTimeoutMs`) and settles what it answers; never
   * throws. An action already being settled by this resolver is skipped.
   */
  async settle(unresolved: Unresolved): Promise<Settled> {
    const { agentId, runId } = unresolved.action.scope;
    const id = JSON.stringify([agentId, runId, unresolved.action.key, unresolved.fencing]);
    const what =
      `agent ${JSON.stringify(agentId)} run ${JSON.stringify(runId)} key ${JSON.stringify(unresolved.action.key)} ` +
      `(fencing ${unresolved.fencing}, action ${JSON.stringify(unresolved.actionName)})`;
    if (this.busy.has(id)) return { kind: "Left", why: "already being settled here" };
    this.busy.add(id);
    let settled: Settled;
    try {
      settled = await this.settleOnce(unresolved);
    } finally {
      this.busy.delete(id);
    }
    if (settled.kind === "Left") {
      this.logger.warn(`oncegate resolver: left for a person: ${what}: ${settled.why}`);
    } else if (settled.kind === "ByOther") {
      this.logger.info(`oncegate resolver: settled by another: ${what}`);
    } else {
      this.logger.info(`oncegate resolver: resolved ${what}: ${settled.kind.toLowerCase()}`);
    }
    return settled;
  }

  private async settleOnce(unresolved: Unresolved): Promise<Settled> {
    const lookup = this.lookups.get(unresolved.actionName);
    if (lookup === undefined) return { kind: "Left", why: `no lookup for action ${JSON.stringify(unresolved.actionName)}` };
    let answer: Lookup;
    try {
      answer = await this.within(lookup, unresolved);
    } catch (error) {
      if (error instanceof LookupTimeout) return { kind: "Left", why: error.message };
      if (this.stopping?.signal.aborted) return { kind: "Left", why: "the resolver stopped during the lookup" };
      return { kind: "Left", why: `the lookup failed: ${describe(error)}` };
    }
    if (answer?.kind === "Unknown") return { kind: "Left", why: "the provider cannot tell" };
    if (answer?.kind !== "Completed" && answer?.kind !== "Failed") {
      return { kind: "Left", why: `the lookup returned ${describe(answer)}, not a Lookup` };
    }
    const request = create(ResolveExpiredRequestSchema, {
      action: create(ActionRefSchema, { scope: { ...unresolved.action.scope }, key: unresolved.action.key }),
      resolution: answer.kind === "Completed" ? Resolution.COMPLETED : Resolution.FAILED,
      receipt: answer.kind === "Completed" ? answer.receipt : new Uint8Array(),
      receiptFormat: answer.kind === "Completed" ? answer.format : ReceiptFormat.UNSPECIFIED,
      note: this.note,
      expectedFencing: BigInt(unresolved.fencing),
    });
    try {
      await this.client.resolveExpired(request, this.callOptions);
    } catch (thrown) {
      const error = fromCallError(thrown);
      if (error.reason !== undefined && SETTLED_BY_OTHER.has(error.reason)) return { kind: "ByOther" };
      return { kind: "Left", why: `the settlement failed: ${error.message}` };
    }
    return { kind: answer.kind };
  }

  /** Runs `lookup`, throwing `LookupTimeout` after `lookupTimeoutMs` (its signal aborts then). */
  private async within(lookup: LookupFn, unresolved: Unresolved): Promise<Lookup> {
    const abort = new AbortController();
    const stopped = this.stopping?.signal;
    const signal = stopped === undefined ? abort.signal : AbortSignal.any([abort.signal, stopped]);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(new LookupTimeout(`the lookup took over ${this.lookupTimeoutMs} ms`));
        abort.abort();
      }, this.lookupTimeoutMs);
    });
    try {
      return await Promise.race([Promise.resolve().then(() => lookup(unresolved, { signal })), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Follows the unresolved actions and settles each, on its own (a slow lookup does not hold up
   * the others), until {@link stop} or `signal`; resolves once the settlements under way are
   * done. A broken stream is reopened after a wait that doubles up to `backoffMs[1]` (and starts
   * again at `backoffMs[0]` once a stream delivers).
   */
  async run(signal?: AbortSignal): Promise<void> {
    const stopping = new AbortController();
    this.stopping = stopping;
    const onAbort = () => stopping.abort();
    signal?.addEventListener("abort", onAbort, { once: true });
    if (signal?.aborted) stopping.abort();
    let wait = this.backoffMs[0];
    try {
      while (!stopping.signal.aborted) {
        try {
          const stream = this.client.watchUnresolved(
            { agentId: this.agentId },
            { headers: this.callOptions.headers, signal: stopping.signal },
          );
          for await (const message of stream) {
            wait = this.backoffMs[0];
            if (message.action === undefined) continue;
            const settling = this.settle(unresolvedFrom(message.action));
            this.pending.add(settling);
            void settling.finally(() => this.pending.delete(settling));
          }
          if (!stopping.signal.aborted) this.logger.info("oncegate resolver: the gate ended the unresolved stream; reopening");
        } catch (error) {
          if (stopping.signal.aborted) break;
          this.logger.warn(`oncegate resolver: the unresolved stream broke (${fromCallError(error).message}); reopening`);
        }
        if (stopping.signal.aborted) break;
        await sleep(wait, undefined, { signal: stopping.signal }).catch(() => undefined);
        wait = Math.min(wait * 2, this.backoffMs[1]);
      }
    } finally {
      signal?.removeEventListener("abort", onAbort);
      await Promise.allSettled([...this.pending]);
      if (this.stopping === stopping) this.stopping = undefined;
    }
  }

  /** Ends {@link run} (its lookups under way see their signal abort, and are left for a person). */
  stop(): void {
    this.stopping?.abort();
  }

  /** Closes the connection; calls made afterwards open a new one. */
  close(): void {
    this.sessions?.abort();
  }
}

class LookupTimeout extends Error {}

function describe(value: unknown): string {
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
