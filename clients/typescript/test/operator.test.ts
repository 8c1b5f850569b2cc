/**
 * What an operator writes, and a budget's refusal, against the real gate binary: an action left
 * unresolved and settled by the gate's local operator (`oncegate admin resolve` over the admin
 * socket in its data directory) replays as the text or the JSON value the operator said it is; a
 * receipt this client cannot decode is a `ReceiptDecodeError` naming the action and who wrote it;
 * a budget refusal carries used, limit, requested, when it frees up, and the gate's sentence.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  ActionState,
  BudgetExceededError,
  CompletionSource,
  Decision,
  GateClient,
  OncegateError,
  OutcomeUnknownError,
  ReceiptDecodeError,
  ReceiptFormat,
  type ActionRef,
  type ActionSpec,
} from "../src/index.js";
import { freshRunId, gateBinary, POLICY, startGate, type RunningGate } from "./support/gate.js";

const BUDGET_POLICY = `${POLICY}
[[budgets]]
name = "eur-per-day"
actions = ["payments.refund"]
window_seconds = 86400
limit = "100.00"
sum = "/amount"
decimals = 2
`;

let running: RunningGate;
let gate: GateClient;

before(async () => {
  running = await startGate(BUDGET_POLICY);
  gate = new GateClient(running.address);
});

after(async () => {
  gate.close();
  await running.stop();
});

const AGENT = "reconciled-agent";

function spec(runId: string, n: number, extra: Partial<ActionSpec> = {}): ActionSpec {
  return { agentId: AGENT, runId, action: "pay", params: { n }, ...extra };
}

const timesOut = () => {
  throw new Error("the provider did not answer");
};

const mustNotRun = () => {
  throw new Error("a completed action must not run");
};

/** An attempt whose outcome is unknown and whose lease has ended: an operator's to settle. */
async function leftUnresolved(runId: string, n: number): Promise<ActionRef> {
  const error = await gate.runOnce(spec(runId, n, { leaseTtlMs: 1_000 }), timesOut, { heartbeat: 60_000 }).then(
    () => assert.fail("the attempt should not settle"),
    (thrown: unknown) => thrown,
  );
  assert.ok(error instanceof OutcomeUnknownError);
  const deadline = Date.now() + 30_000;
  while ((await gate.getAction(error.action)).state !== ActionState.EXPIRED) {
    assert.ok(Date.now() < deadline, "the lease did not end");
    await sleep(100);
  }
  return error.action;
}

/** The operator found the action happened: `oncegate admin resolve --outcome completed`. */
function resolve(action: ActionRef, receipt: string, ...options: string[]): string {
  const { agentId, runId } = action.scope;
  return execFileSync(
    gateBinary(),
    [
      "admin",
      "resolve",
      ...["--data-dir", running.dataDir, "--agent", agentId, "--run", runId, "--key", action.key],
      ...["--outcome", "completed", "--receipt", receipt, ...options],
    ],
    { encoding: "utf8" },
  );
}

describe("receipts an operator writes", () => {
  it("replays an operator's text receipt as text", async () => {
    const runId = freshRunId();
    const action = await leftUnresolved(runId, 1);
    // Text that would parse as JSON: the operator's word, not the bytes, says what it is.
    const shown = resolve(action, "12345", "--receipt-format", "text");
    assert.match(shown, /receipt_format\s+text/);
    const replay = await gate.runOnce(spec(runId, 1), mustNotRun);
    assert.equal(replay.kind, "Replayed");
    assert.equal(replay.result, "12345");
    // A decode for the workers' receipts does not apply to an operator's text.
    const decoded = await gate.runOnce(spec(runId, 1), mustNotRun, { decode: () => "not this" });
    assert.equal(decoded.result, "12345");
    const { completion } = replay;
    assert.equal(completion.receiptFormat, ReceiptFormat.TEXT);
    assert.equal(completion.source, CompletionSource.OPERATOR);
    assert.equal(completion.operator, "local-operator");
  });

  it("replays an operator's JSON receipt as the value", async () => {
    const runId = freshRunId();
    const action = await leftUnresolved(runId, 2);
    // No --receipt-format: the CLI says JSON because it parses as JSON.
    const shown = resolve(action, '{"transfer_id": "tr-op-2", "amount": 50}');
    assert.match(shown, /receipt_format\s+json/);
    const replay = await gate.runOnce(spec(runId, 2), mustNotRun);
    assert.deepEqual(replay.result, { transfer_id: "tr-op-2", amount: 50 });
    const answer = await gate.requestToken(spec(runId, 2));
    assert.equal(answer.decision, Decision.ALREADY_COMPLETED);
    assert.equal(answer.completion?.receiptFormat, ReceiptFormat.JSON);
  });

  it("throws ReceiptDecodeError, naming the action and its writer, for a receipt it cannot decode", async () => {
    const runId = freshRunId();
    const granted = await gate.requestToken(spec(runId, 3));
    assert.ok(granted.grant !== undefined);
    // A worker completes by hand with raw bytes, which the guard's JSON decoder rejects.
    await gate.complete(granted.action, granted.grant.token, new TextEncoder().encode("raw-42"));
    const error = await gate.runOnce(spec(runId, 3), mustNotRun).then(
      () => assert.fail("the replay should not decode"),
      (thrown: unknown) => thrown,
    );
    assert.ok(error instanceof ReceiptDecodeError && error instanceof OncegateError);
    assert.ok(!(error instanceof SyntaxError) && error.cause instanceof SyntaxError);
    assert.equal(error.writer, "worker");
    assert.equal(error.operator, "");
    assert.equal(error.receiptFormat, ReceiptFormat.UNSPECIFIED);
    assert.deepEqual(error.action, granted.action);
    assert.equal(new TextDecoder().decode(error.receipt), "raw-42");
    for (const part of [`agent "${AGENT}"`, `run "${runId}"`, `key "${granted.action.key}"`, "written by a worker"]) {
      assert.ok(error.message.includes(part), `${part} in ${error.message}`);
    }
    assert.match(error.message, /raw bytes/);
    assert.match(error.message, /not run again/);
  });
});

describe("a budget's refusal", () => {
  it("says used, limit, requested and when it frees up, as the gate does", async () => {
    const runId = freshRunId();
    const refund = (amount: number, key: string): ActionSpec => ({
      agentId: `budget-${runId}`,
      runId,
      action: "payments.refund",
      params: { amount },
      idempotencyKey: key,
    });
    const first = await gate.requestToken(refund(99.5, "refund-1"));
    assert.equal(first.decision, Decision.GRANTED);
    const error = await gate.requestToken(refund(1, "refund-2")).then(
      () => assert.fail("the budget should refuse"),
      (thrown: unknown) => thrown,
    );
    assert.ok(error instanceof BudgetExceededError);
    assert.equal(error.budget, "eur-per-day");
    assert.equal(error.used, "99.50");
    assert.equal(error.limit, "100.00");
    assert.equal(error.requested, "1.00");
    assert.ok(error.retryAfterMs !== undefined && error.retryAfterMs > 86_000_000, `${error.retryAfterMs}`);
    assert.ok(error.retryAt !== undefined && error.retryAt.getTime() > Date.now());
    assert.ok(!error.retryable);
    assert.ok(
      error.message.startsWith(
        'budget "eur-per-day" would be exceeded: 99.50 of 100.00 used in the last 1 d, and this action needs 1.00; ' +
          `nothing was recorded; it frees up at ${error.retryAt.toISOString()} (in `,
      ),
      error.message,
    );
  });
});
