/**
 * The guard against the real gate binary: replay without running, release after a definite
 * failure only, an unknown outcome kept for reconciliation, waiting within a bound, a reused key
 * stopping, a heartbeat keeping a long action alive.
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  ActionState,
  FailedError,
  Failure,
  GateClient,
  InProgressError,
  KeyReusedError,
  LeaseExpiredUnresolvedError,
  OutcomeUnknownError,
  type ActionSpec,
  type Grant,
} from "../src/index.js";
import { freshRunId, startGate, type RunningGate } from "./support/gate.js";

const TRANSFER = { amount: 5000, currency: "EUR", to: "DE89370400440532013000", memo: "Invoice 42" };

let running: RunningGate;
let gate: GateClient;

before(async () => {
  running = await startGate();
  gate = new GateClient(running.address);
});

after(async () => {
  gate.close();
  await running.stop();
});

function spec(runId: string, extra: Partial<ActionSpec> = {}): ActionSpec {
  return { agentId: "billing-agent", runId, action: "payments.transfer", params: TRANSFER, ...extra };
}

describe("runOnce", () => {
  it("runs once, then replays the stored receipt without running", async () => {
    const runId = freshRunId();
    const grants: Grant[] = [];
    const pay = async (grant: Grant) => {
      grants.push(grant);
      return { transferId: `tr-${grants.length}`, providerKey: grant.providerKey };
    };
    const first = await gate.runOnce(spec(runId), pay);
    assert.equal(first.kind, "Executed");
    assert.deepEqual(first.result, { transferId: "tr-1", providerKey: grants[0]!.providerKey });
    const retry = await gate.runOnce(spec(runId, { params: { ...TRANSFER, memo: "rewritten" } }), pay);
    assert.equal(retry.kind, "Replayed");
    assert.deepEqual(retry.result, first.result);
    assert.deepEqual(retry.receipt, first.receipt);
    assert.equal(grants.length, 1);
    assert.ok(grants[0]!.fencing > 10 ** 15, "a first grant's fencing is the store clock in µs");
  });

  it("releases after a definite failure, so the next attempt runs with a higher fencing", async () => {
    const runId = freshRunId();
    const fencings: number[] = [];
    const declined = await gate
      .runOnce(spec(runId), (grant) => {
        fencings.push(grant.fencing);
        throw Failure.definite(new Error("card declined"));
      })
      .catch((error: unknown) => error);
    assert.ok(declined instanceof FailedError, String(declined));
    assert.equal((declined.cause as Error).message, "card declined");
    assert.equal((await gate.getAction(declined.action)).state, ActionState.ABSENT);
    const paid = await gate.runOnce(spec(runId), (grant) => {
      fencings.push(grant.fencing);
      return "paid";
    });
    assert.equal(paid.result, "paid");
    assert.equal(fencings.length, 2);
    assert.equal(fencings[1], fencings[0]! + 1);
  });

  it("releases after an error the definite option accepts", async () => {
    class Declined extends Error {}
    const runId = freshRunId();
    const error = await gate
      .runOnce(spec(runId), () => Promise.reject(new Declined("no funds")), {
        definite: (thrown) => thrown instanceof Declined,
      })
      .catch((e: unknown) => e);
    assert.ok(error instanceof FailedError && error.cause instanceof Declined);
    assert.equal((await gate.getAction(error.action)).state, ActionState.ABSENT);
  });

  it("never releases after an unknown outcome, and replays once it is reconciled", async () => {
    const runId = freshRunId();
    const timeout = new Error("the bank did not answer in 30 s");
    const unknown = await gate
      .runOnce(spec(runId), async () => {
        throw timeout;
      })
      .catch((error: unknown) => error);
    assert.ok(unknown instanceof OutcomeUnknownError, String(unknown));
    assert.equal(unknown.kind, "OutcomeUnknown");
    assert.equal(unknown.cause, timeout);
    assert.ok(unknown.fencing > 0);
    assert.match(unknown.providerKey, /^og-/);
    assert.match(unknown.message, new RegExp(unknown.providerKey));
    const record = await gate.getAction(unknown.action);
    assert.equal(record.state, ActionState.AUTHORIZED);
    assert.equal(record.fencing, unknown.fencing);
    // Nobody runs it again while the outcome is unknown.
    let ran = false;
    await assert.rejects(
      gate.runOnce(spec(runId), () => (ran = true), { maxWait: 0 }),
      InProgressError,
    );
    assert.equal(ran, false);
    // Reconciled with the bank: it happened.
    await gate.complete(unknown.action, unknown.token, new TextEncoder().encode('"tr-reconciled"'));
    const replay = await gate.runOnce(spec(runId), () => "twice");
    assert.equal(replay.kind, "Replayed");
    assert.equal(replay.result, "tr-reconciled");
  });

  it("an ambiguous Failure is an unknown outcome too", async () => {
    const error = await gate
      .runOnce(spec(freshRunId()), () => {
        throw Failure.ambiguous("socket closed");
      })
      .catch((e: unknown) => e);
    assert.ok(error instanceof OutcomeUnknownError);
    assert.equal(error.cause, "socket closed");
  });

  it("waits for an attempt in progress elsewhere, then replays its receipt", async () => {
    const runId = freshRunId();
    let started!: () => void;
    const startedPromise = new Promise<void>((resolve) => (started = resolve));
    // Its lease (5 s) ends within the waiter's maxWait (20 s): the waiter waits for it.
    const first = gate.runOnce(spec(runId, { leaseTtlMs: 5_000 }), async () => {
      started();
      await sleep(1_000);
      return "first";
    });
    await startedPromise;
    let secondRan = false;
    const second = await gate.runOnce(spec(runId), () => ((secondRan = true), "second"), {
      maxWait: 20_000,
      pollInterval: 100,
    });
    assert.equal((await first).kind, "Executed");
    assert.equal(second.kind, "Replayed");
    assert.equal(second.result, "first");
    assert.equal(secondRan, false);
  });

  it("gives up waiting after maxWait with the gate's InProgressError", async () => {
    const runId = freshRunId();
    // The other lease (1.5 s) ends within maxWait at first; the wait then runs out before it does.
    await gate.requestToken({ ...spec(runId), holder: "someone-else", leaseTtlMs: 1_500 });
    const error = await gate
      .runOnce(spec(runId), () => assert.fail("must not run"), { maxWait: 600, pollInterval: 100 })
      .catch((e: unknown) => e);
    assert.ok(error instanceof InProgressError);
  });

  it("fails at once when the live lease outlasts maxWait, saying it may be the caller's own", async () => {
    const runId = freshRunId();
    const unknown = await gate
      .runOnce(spec(runId), () => {
        throw new Error("timeout");
      })
      .catch((e: unknown) => e);
    assert.ok(unknown instanceof OutcomeUnknownError);
    const error = await gate.runOnce(spec(runId), () => assert.fail("must not run")).catch((e: unknown) => e);
    assert.ok(error instanceof InProgressError);
    assert.ok((error.retryAfterMs ?? 0) > 30_000, String(error.retryAfterMs));
    assert.match(error.message, /beyond what is left of maxWait \(30 s\)/);
    assert.match(error.message, /may be this caller's own earlier attempt/);
    await gate.release(unknown.action, unknown.token);
  });

  it("stops at a reused key, without running and without a new key", async () => {
    const runId = freshRunId();
    await gate.runOnce(spec(runId, { idempotencyKey: "invoice-42" }), () => "paid");
    let ran = false;
    const error = await gate
      .runOnce(spec(runId, { idempotencyKey: "invoice-42", params: { ...TRANSFER, amount: 5100 } }), () => (ran = true))
      .catch((e: unknown) => e);
    assert.ok(error instanceof KeyReusedError);
    assert.deepEqual(error.differingFields, ["/amount"]);
    assert.equal(ran, false);
  });

  it("stops at a lease that expired unresolved", async () => {
    const runId = freshRunId();
    await gate.requestToken({ ...spec(runId), leaseTtlMs: 1000 });
    await sleep(1300);
    await assert.rejects(
      gate.runOnce(spec(runId), () => assert.fail("must not run")),
      LeaseExpiredUnresolvedError,
    );
  });

  it("keeps a long action authorized with its heartbeat", async () => {
    const runId = freshRunId();
    const states: ActionState[] = [];
    const outcome = await gate.runOnce(spec(runId, { action: "pay", params: { long: true }, leaseTtlMs: 2_000 }), async () => {
      await sleep(3_000);
      const probe = await gate.requestToken(spec(runId, { action: "pay", params: { long: true } })).catch((e) => e);
      states.push(probe instanceof InProgressError ? ActionState.AUTHORIZED : ActionState.UNSPECIFIED);
      return "done";
    });
    assert.equal(outcome.result, "done");
    assert.deepEqual(states, [ActionState.AUTHORIZED]);
    assert.equal((await gate.getAction(outcome.action)).state, ActionState.COMPLETED);
  });
});
