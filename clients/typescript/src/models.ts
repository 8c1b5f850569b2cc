/**
 * Plain values returned by the client, converted from the generated messages: `number`s for
 * fencing (a counter that never nears 2^53) and `Date`s for timestamps, instead of `bigint`s and
 * `Timestamp` messages. The enums are the generated ones.
 */

import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

import {
  ActionState,
  CompletionSource,
  Decision,
  ReceiptFormat,
  type ActionRef as ActionRefMessage,
  type Approval as ApprovalMessage,
  type Completion as CompletionMessage,
  type GetActionResponse,
  type Grant as GrantMessage,
  type RequestTokenResponse,
} from "./gen/oncegate/v1/oncegate_pb.js";

export {
  ActionState,
  CompletionSource,
  Decision,
  ReceiptFormat,
  ReleaseReason,
} from "./gen/oncegate/v1/oncegate_pb.js";

/** Who acts: the agent, and the workflow run that survives restarts of the agent. */
export interface Scope {
  readonly agentId: string;
  readonly runId: string;
}

/** Names one action of one scope: the idempotency key when one was given, else the fingerprint. */
export interface ActionRef {
  readonly scope: Scope;
  readonly key: string;
}

/** The one-shot authorization of one attempt. */
export interface Grant {
  /** Opaque; pass it to Complete, Release and ExtendLease. */
  readonly token: string;
  /** Grows with every grant of the action; downstream systems can reject stale holders. */
  readonly fencing: number;
  /** When the lease ends unless extended, completed or released (the gate's store clock). */
  readonly leaseExpiresAt: Date | undefined;
  /** Pass it to the downstream provider as *its* idempotency key. */
  readonly providerKey: string;
  /** Replicas that confirmed the grant (Redis `WAIT`); 0 without a durability level. */
  readonly replicasAcknowledged: number;
  /** The signed grant statement for the executor (`verifyGrant`); empty when the gate does not sign. */
  readonly statement: string;
}

/** The recorded outcome of an action, replayed on every later request. */
export interface Completion {
  readonly receipt: Uint8Array;
  readonly completedAt: Date | undefined;
  readonly fencing: number;
  /** The token that completed the action; empty for operator completions. */
  readonly token: string;
  /** Who recorded it: a worker (Complete) or an operator. */
  readonly source: CompletionSource;
  /** The operator principal who recorded it; empty for a worker's completion. */
  readonly operator: string;
  /**
   * How `receipt` is to be read: an operator says `JSON` or `TEXT`; a worker's is `UNSPECIFIED`,
   * in its client's own encoding (the guard's `decode`).
   */
  readonly receiptFormat: ReceiptFormat;
}

/** An action held for an operator's approval (`DECISION_PENDING_APPROVAL`). */
export interface Approval {
  /** The approval's id, for the operator (`oncegate admin approve`). */
  readonly id: string;
  /** When it lapses unless used. */
  readonly expiresAt: Date | undefined;
  /** The id of the policy that held the action. */
  readonly policyId: string;
  /** Why it needs a human (the policy's `@hold` text). */
  readonly reason: string;
}

/** The answer to RequestToken: a grant, the completion of an action that already ran, or the
 * approval a held action waits for. */
export interface RequestTokenResult {
  readonly decision: Decision;
  readonly action: ActionRef;
  readonly fingerprint: string;
  /** Set when `decision` is `Decision.GRANTED`. */
  readonly grant: Grant | undefined;
  /** Set when `decision` is `Decision.ALREADY_COMPLETED`. */
  readonly completion: Completion | undefined;
  /** True when `grant` is the token handed to this holder before (its reply was lost). */
  readonly redelivered: boolean;
  /** Set when `decision` is `Decision.PENDING_APPROVAL`. */
  readonly approval?: Approval | undefined;
}

/** The record of one action as it stands, for reconciliation. */
export interface ActionRecord {
  readonly state: ActionState;
  readonly fencing: number;
  readonly fingerprint: string;
  readonly leaseExpiresAt: Date | undefined;
  readonly completion: Completion | undefined;
  readonly holder: string;
  /** The token of an unsettled (AUTHORIZED or EXPIRED) action: operators only, empty for agents. */
  readonly token: string;
  /** The action's provider key: ask the provider with it when reconciling. */
  readonly providerKey: string;
}

function time(stamp: Timestamp | undefined): Date | undefined {
  return stamp === undefined ? undefined : timestampDate(stamp);
}

/** The plain form of an `ActionRef` message. */
export function actionRefFrom(message: ActionRefMessage | undefined): ActionRef {
  return {
    scope: { agentId: message?.scope?.agentId ?? "", runId: message?.scope?.runId ?? "" },
    key: message?.key ?? "",
  };
}

/** The plain form of a `Grant` message. */
export function grantFrom(message: GrantMessage): Grant {
  return {
    token: message.token,
    fencing: Number(message.fencing),
    leaseExpiresAt: time(message.leaseExpiresAt),
    providerKey: message.providerKey,
    replicasAcknowledged: message.replicasAcknowledged,
    statement: message.statement,
  };
}

/** The plain form of a `Completion` message. */
export function completionFrom(message: CompletionMessage): Completion {
  return {
    receipt: message.receipt,
    completedAt: time(message.completedAt),
    fencing: Number(message.fencing),
    token: message.token,
    source: message.source,
    operator: message.operator,
    receiptFormat: message.receiptFormat,
  };
}

/** The plain form of a `RequestTokenResponse`. */
export function requestTokenResultFrom(message: RequestTokenResponse): RequestTokenResult {
  return {
    decision: message.decision,
    action: actionRefFrom(message.action),
    fingerprint: message.fingerprint,
    grant: message.grant === undefined ? undefined : grantFrom(message.grant),
    completion: message.completion === undefined ? undefined : completionFrom(message.completion),
    redelivered: message.redelivered,
    approval: message.approval === undefined ? undefined : approvalFrom(message.approval),
  };
}

/** The plain form of an `Approval` message. */
export function approvalFrom(message: ApprovalMessage): Approval {
  return {
    id: message.id,
    expiresAt: time(message.expiresAt),
    policyId: message.policyId,
    reason: message.reason,
  };
}

/** The plain form of a `GetActionResponse`. */
export function actionRecordFrom(message: GetActionResponse): ActionRecord {
  return {
    state: message.state,
    fencing: Number(message.fencing),
    fingerprint: message.fingerprint,
    leaseExpiresAt: time(message.leaseExpiresAt),
    completion: message.completion === undefined ? undefined : completionFrom(message.completion),
    holder: message.holder,
    token: message.token,
    providerKey: message.providerKey,
  };
}
