/**
 * The RPC layer: one HTTP/2 connection to one gate, and one method per worker RPC.
 *
 * It owns the transport (Connect speaking gRPC), the credential sent on every call, and the
 * conversion between the plain values of `models.ts` and the generated messages; a failed call
 * throws what `fromCallError` makes of its status. It knows nothing of the guard: waiting,
 * retrying and leases are `guard/`'s business, which builds on this class.
 */

import { create } from "@bufbuild/protobuf";
import { durationFromMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { createClient, type CallOptions, type Client, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type * as http2 from "node:http2";
import { connect } from "node:net";

import { addressFromEnv, parseAddress } from "./address.js";
import { fromCallError } from "./errors/status.js";
import { encodeParams } from "./fingerprint/params.js";
import {
  ActionGateService,
  ActionRefSchema,
  ReleaseReason,
  type ActionRef as ActionRefMessage,
} from "./gen/oncegate/v1/oncegate_pb.js";
import {
  actionRecordFrom,
  completionFrom,
  requestTokenResultFrom,
  type ActionRecord,
  type ActionRef,
  type Completion,
  type RequestTokenResult,
} from "./models.js";

/** One logical action: who does it, what, and with which arguments (Rust: `ActionSpec`). */
export interface ActionSpec {
  /** The agent's id. */
  agentId: string;
  /** The workflow-run id that survives restarts of the agent (not a per-call id). */
  runId: string;
  /** The action type or tool name, e.g. `"payments.transfer"`. */
  action: string;
  /** The action's arguments: an object (sent as compact JSON) or JSON text, sent as is. */
  params: object | string;
  /** Separates deliberate repeats (two real $10 transfers) from retries. */
  intentId?: string | undefined;
  /** Names the logical action; retries must then carry the same key fields. */
  idempotencyKey?: string | undefined;
  /** Names the asking worker, so that it gets its own token back when a reply is lost. */
  holder?: string | undefined;
  /** Lease length in milliseconds; the action policy's when unset. */
  leaseTtlMs?: number | undefined;
}

/** How a client reaches its gate. */
export interface GateOptions {
  /** Sent as `authorization: Bearer <key>` on every call. */
  apiKey?: string;
  /** Deadline of each call, in milliseconds (10 s by default). */
  timeoutMs?: number;
  /** TLS and other options of Node's `http2.connect` (use an `https://` address for TLS). */
  nodeOptions?: http2.SecureClientSessionOptions;
  /** A transport of your own (tests, proxies); the address and `nodeOptions` are then unused. */
  transport?: Transport;
}

/** The transport of `address` (see {@link GateRpc}'s constructor), and its sessions to close. */
export function openTransport(
  address: string,
  options: GateOptions,
): { transport: Transport; sessions: Http2SessionManager | undefined } {
  if (options.transport !== undefined) return { transport: options.transport, sessions: undefined };
  const read = parseAddress(address);
  let baseUrl = "http://localhost";
  let nodeOptions = options.nodeOptions;
  if (read.kind === "unix") {
    const { path } = read;
    nodeOptions = { ...nodeOptions, createConnection: () => connect(path) };
  } else {
    baseUrl = read.baseUrl;
  }
  const sessions = new Http2SessionManager(baseUrl, {}, nodeOptions);
  return { transport: createGrpcTransport({ baseUrl, sessionManager: sessions }), sessions };
}

/** The deadline and the credential sent with every unary call. */
export function callOptions(options: GateOptions): CallOptions {
  return {
    timeoutMs: options.timeoutMs ?? 10_000,
    headers: options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {},
  };
}

/**
 * The RPCs of one oncegate server, without the guard (`GateClient` adds it).
 *
 * Every method throws an `OncegateError` subclass named by the gate's error reason, or a
 * `TransportError` when the gate was not reached.
 */
export class GateRpc {
  /** The gate's address, as given. */
  readonly address: string;
  private readonly client: Client<typeof ActionGateService>;
  private readonly sessions: Http2SessionManager | undefined;
  private readonly callOptions: CallOptions;

  /**
   * @param address `host:port` or `http://host:port` (plaintext), `https://host:port` (TLS), or
   *   `unix:<path>` (a Unix socket, such as the gate's admin socket); another form throws a
   *   `TypeError` naming these. Without it, `ONCEGATE_TARGET`, else `127.0.0.1:50051`.
   */
  constructor(address: string | undefined = undefined, options: GateOptions = {}) {
    this.address = address ?? addressFromEnv();
    const { transport, sessions } = openTransport(this.address, options);
    this.sessions = sessions;
    this.client = createClient(ActionGateService, transport);
    this.callOptions = callOptions(options);
  }

  /** Closes the connection; calls made afterwards open a new one. */
  close(): void {
    this.sessions?.abort();
  }

  private async call<T>(rpc: (options: CallOptions) => Promise<T>): Promise<T> {
    try {
      return await rpc(this.callOptions);
    } catch (error) {
      throw fromCallError(error);
    }
  }

  /**
   * Asks for the one-shot token of one attempt of an action.
   *
   * @returns a grant (execute, then Complete or Release) or the completion of an action that
   *   already ran (do not execute).
   */
  async requestToken(spec: ActionSpec): Promise<RequestTokenResult> {
    const request = {
      scope: { agentId: spec.agentId, runId: spec.runId },
      action: spec.action,
      paramsJson: typeof spec.params === "string" ? spec.params : encodeParams(spec.params),
      intentId: spec.intentId ?? "",
      idempotencyKey: spec.idempotencyKey ?? "",
      holder: spec.holder ?? "",
      leaseTtl: spec.leaseTtlMs === undefined ? undefined : durationFromMs(spec.leaseTtlMs),
    };
    return requestTokenResultFrom(await this.call((options) => this.client.requestToken(request, options)));
  }

  /** Records that the attempt ran and what it returned; a repeat returns the stored completion. */
  async complete(action: ActionRef, token: string, receipt: Uint8Array): Promise<Completion> {
    const request = { action: ref(action), token, receipt };
    const response = await this.call((options) => this.client.complete(request, options));
    if (response.completion === undefined) throw new TypeError("Complete answered without a completion");
    return completionFrom(response.completion);
  }

  /**
   * Gives the token back after a definite failure, or when the action was not attempted. Never
   * after a timeout: reconcile with the provider first.
   *
   * @returns the released grant's fencing number (the next grant gets a higher one).
   */
  async release(
    action: ActionRef,
    token: string,
    reason: ReleaseReason = ReleaseReason.DEFINITE_FAILURE,
  ): Promise<number> {
    const request = { action: ref(action), token, reason };
    return Number((await this.call((options) => this.client.release(request, options))).fencing);
  }

  /** Moves the lease of a live token to `ttlMs` from now (store clock); returns the new expiry. */
  async extendLease(action: ActionRef, token: string, ttlMs: number): Promise<Date | undefined> {
    const request = { action: ref(action), token, ttl: durationFromMs(ttlMs) };
    const response = await this.call((options) => this.client.extendLease(request, options));
    return response.leaseExpiresAt === undefined ? undefined : timestampDate(response.leaseExpiresAt);
  }

  /** Reads the record of an action as it stands, for reconciliation. */
  async getAction(action: ActionRef): Promise<ActionRecord> {
    const request = { action: ref(action) };
    return actionRecordFrom(await this.call((options) => this.client.getAction(request, options)));
  }
}

function ref(action: ActionRef): ActionRefMessage {
  return create(ActionRefSchema, { scope: { ...action.scope }, key: action.key });
}
