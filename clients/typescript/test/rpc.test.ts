/**
 * The RPCs against the real gate binary (test/support/gate.ts): what each answer and each refusal
 * looks like once decoded, and the gate agreeing with the local fingerprint on the vectors.
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  ActionState,
  AlreadyCompletedError,
  Decision,
  fingerprint,
  GateClient,
  InProgressError,
  InvalidRequestError,
  KeyReusedError,
  LeaseExpiredUnresolvedError,
  TokenMismatchError,
  TokenUnknownError,
  TransportError,
  type ActionSpec,
} from "../src/index.js";
import { freshRunId, startGate, TRANSFER_KEY_FIELDS, type RunningGate } from "./support/gate.js";
import { CASES } from "./support/vectors.js";

const TRANSFER = { amount: 5000, currency: "EUR", to: "DE89370400440532013000", memo: "Invoice 42" };
const encoder = new TextEncoder();

let running: RunningGate;
let gate: GateClient;

before(async () => {
  running = await startGate();
  gate = new GateClient(running.address, { apiKey: "test-key" });
});

after(async () => {
  gate.close();
  await running.stop();
});

function spec(runId: string, extra: Partial<ActionSpec> = {}): ActionSpec {
  return { agentId: "billing-agent", runId, action: "payments.transfer", params: TRANSFER, ...extra };
}

describe("the gate agrees with the vectors", () => {
  const cases = CASES.filter(
    (c) =>
      c.key_fields === null ||
      (c.action === "payments.transfer" && [...c.key_fields].sort().join() === [...TRANSFER_KEY_FIELDS].sort().join()),
  );
  it("on every case its policy can reproduce", async () => {
    assert.ok(cases.length >= 100);
    for (const c of cases) {
      // A run of its own per case: equivalent cases share one action.
      const request = { ...spec(freshRunId()), action: c.action, params: c.params_json, intentId: c.intent ?? undefined };
      if (c.error !== undefined) {
        await assert.rejects(gate.requestToken(request), InvalidRequestError, c.name);
      } else {
        assert.equal((await gate.requestToken(request)).fingerprint, c.fingerprint, c.name);
      }
    }
  });
});

describe("the RPCs", () => {
  it("grant, complete, repeat the complete, replay", async () => {
    const runId = freshRunId();
    const first = await gate.requestToken(spec(runId));
    assert.equal(first.decision, Decision.GRANTED);
    assert.ok(first.grant !== undefined && !first.redelivered);
    assert.ok(first.grant.fencing > 10 ** 15, "a first grant's fencing is the store clock in µs");
    assert.match(first.grant.providerKey, /^og-[0-9a-f]{40}$/);
    assert.ok(first.grant.leaseExpiresAt! > new Date());
    assert.equal(first.fingerprint, fingerprint("payments.transfer", TRANSFER, { keyFields: TRANSFER_KEY_FIELDS }));
    assert.equal(first.action.key, first.fingerprint);
    assert.deepEqual(first.action.scope, { agentId: "billing-agent", runId });

    const receipt = encoder.encode('{"transfer_id":"tr-1"}');
    const completion = await gate.complete(first.action, first.grant.token, receipt);
    assert.deepEqual(completion.receipt, receipt);
    assert.equal(completion.fencing, first.grant.fencing);
    assert.deepEqual(await gate.complete(first.action, first.grant.token, encoder.encode("ignored")), completion);

    const replay = await gate.requestToken(spec(runId));
    assert.equal(replay.decision, Decision.ALREADY_COMPLETED);
    assert.equal(replay.grant, undefined);
    assert.deepEqual(replay.completion?.receipt, receipt);
    assert.equal(replay.completion?.token, first.grant.token);
    const record = await gate.getAction(first.action);
    assert.equal(record.state, ActionState.COMPLETED);
    assert.equal(record.fingerprint, first.fingerprint);
  });

  it("replay a rewritten memo, refuse a changed amount under the same key", async () => {
    const runId = freshRunId();
    const first = await gate.requestToken(spec(runId, { idempotencyKey: "invoice-42" }));
    assert.equal(first.action.key, "invoice-42");
    await gate.complete(first.action, first.grant!.token, encoder.encode("paid"));
    const rewritten = await gate.requestToken(
      spec(runId, { idempotencyKey: "invoice-42", params: { ...TRANSFER, memo: "Invoice #42 (corrected)" } }),
    );
    assert.equal(rewritten.decision, Decision.ALREADY_COMPLETED);
    const refused = await gate
      .requestToken(spec(runId, { idempotencyKey: "invoice-42", params: { ...TRANSFER, amount: 5100 } }))
      .then(() => undefined, (error: unknown) => error);
    assert.ok(refused instanceof KeyReusedError);
    assert.deepEqual(refused.differingFields, ["/amount"]);
    assert.ok(!refused.message.includes("5100") && !JSON.stringify(refused.metadata).includes("5100"));
  });

  it("tell a second holder to wait, and re-deliver to the first", async () => {
    const runId = freshRunId();
    const first = await gate.requestToken(spec(runId, { holder: "worker-a" }));
    const waiting = await gate.requestToken(spec(runId, { holder: "worker-b" })).catch((error: unknown) => error);
    assert.ok(waiting instanceof InProgressError);
    assert.ok(waiting.retryAfterMs! > 0 && waiting.retryAfterMs! <= 300_000);
    const again = await gate.requestToken(spec(runId, { holder: "worker-a" }));
    assert.ok(again.redelivered);
    // The same grant, its statement signed again: the same claims but the time of signing
    // (`iat`), which is a second later when the two calls straddle one.
    const { statement: firstStatement, ...firstGrant } = first.grant!;
    const { statement: againStatement, ...againGrant } = again.grant!;
    assert.deepEqual(againGrant, firstGrant);
    const claims = (statement: string) => {
      const payload = Buffer.from(statement.split(".")[1] ?? "", "base64url").toString();
      const { iat, ...rest } = JSON.parse(payload) as Record<string, unknown>;
      assert.equal(typeof iat, "number");
      return rest;
    };
    assert.deepEqual(claims(againStatement), claims(firstStatement));
  });

  it("leave an expired lease for reconciliation, and accept a late Complete", async () => {
    const runId = freshRunId();
    const first = await gate.requestToken(spec(runId, { params: { c: 3 }, action: "pay", leaseTtlMs: 1000 }));
    await sleep(1500);
    assert.equal((await gate.getAction(first.action)).state, ActionState.EXPIRED);
    const expired = await gate.requestToken(spec(runId, { params: { c: 3 }, action: "pay" })).catch((e: unknown) => e);
    assert.ok(expired instanceof LeaseExpiredUnresolvedError);
    assert.equal(expired.token, first.grant!.token);
    assert.equal(expired.fencing, first.grant!.fencing);
    assert.ok(expired.leaseExpiredAt instanceof Date);
    // What settling it needs, from the gate: the action and the provider key.
    assert.deepEqual(expired.action, first.action);
    assert.equal(expired.providerKey, first.grant!.providerKey);
    const record = await gate.getAction(first.action);
    assert.equal(record.providerKey, first.grant!.providerKey);
    assert.equal(record.token, "", "an agent's GetAction never shows a token");
    const late = await gate.complete(first.action, first.grant!.token, encoder.encode("late but real"));
    assert.equal(new TextDecoder().decode(late.receipt), "late but real");
  });

  it("refuse what is wrong, each with its class", async () => {
    const runId = freshRunId();
    const invalid = await gate.requestToken(spec(runId, { params: "[1]" })).catch((e: unknown) => e);
    assert.ok(invalid instanceof InvalidRequestError);
    assert.equal(invalid.field, "params_json");
    assert.ok(invalid.fieldViolations.length > 0);
    const granted = await gate.requestToken(spec(runId, { action: "pay", params: { d: 4 } }));
    await assert.rejects(gate.complete(granted.action, "not-a-token", new Uint8Array()), TokenMismatchError);
    await assert.rejects(
      gate.complete({ scope: granted.action.scope, key: "no-such-key" }, granted.grant!.token, new Uint8Array()),
      TokenUnknownError,
    );
    await gate.complete(granted.action, granted.grant!.token, encoder.encode("done"));
    await assert.rejects(gate.release(granted.action, granted.grant!.token), AlreadyCompletedError);
    await assert.rejects(gate.extendLease(granted.action, granted.grant!.token, 10_000), AlreadyCompletedError);
  });

  it("release keeps the fencing number, and the next grant gets a higher one", async () => {
    const runId = freshRunId();
    const first = await gate.requestToken(spec(runId, { action: "pay", params: { e: 5 } }));
    const extended = await gate.extendLease(first.action, first.grant!.token, 60_000);
    assert.ok(extended! > new Date(Date.now() + 50_000));
    assert.equal(await gate.release(first.action, first.grant!.token), first.grant!.fencing);
    const record = await gate.getAction(first.action);
    assert.equal(record.state, ActionState.ABSENT);
    const second = await gate.requestToken(spec(runId, { action: "pay", params: { e: 5 } }));
    assert.equal(second.grant?.fencing, first.grant!.fencing + 1);
  });

  it("report an unreachable gate as a retryable TransportError", async () => {
    const nowhere = new GateClient("127.0.0.1:1", { timeoutMs: 2_000 });
    try {
      const error = await nowhere.getAction({ scope: { agentId: "a", runId: "r" }, key: "k" }).catch((e: unknown) => e);
      assert.ok(error instanceof TransportError, String(error));
      assert.equal(error.retryable, true);
    } finally {
      nowhere.close();
    }
  });
});
