/**
 * `modelMessage` against a refusal of each kind from the real gate (a hold, a rule that forbids an
 * agent, a budget of one send an hour, key fields on `payments.transfer`): what the model is told
 * and what to do, and the guarded work never run on a refusal. An error that is not the gate's is
 * left to the developer (`undefined`).
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, before, describe, it } from "node:test";

import { GateClient, modelMessage, type ActionSpec } from "../src/index.js";
import { freshRunId, gateBinary, POLICY, startGate, type RunningGate } from "./support/gate.js";

const RULES = `@id("all") permit(principal, action, resource);
@id("no-mallory") forbid(principal == Agent::"mallory", action, resource);
@id("deletes") @hold("deletes need approval")
permit(principal, action == Action::"files.delete", resource);
`;

const POLICY_WITH_RULES = `${POLICY}
[authorization]
policies = ["rules.cedar"]

[[budgets]]
name = "sms-per-hour"
actions = ["sms.send"]
window_seconds = 3600
limit = 1
`;

let running: RunningGate;
let gate: GateClient;

before(async () => {
  running = await startGate(POLICY_WITH_RULES, { "rules.cedar": RULES });
  gate = new GateClient(running.address);
});

after(async () => {
  gate.close();
  await running.stop();
});

/** Runs `spec` through the guard and returns what the model would be told; counts the runs. */
async function told(spec: ActionSpec, ran: { count: number }, fail = false): Promise<string> {
  try {
    await gate.runOnce(spec, () => {
      ran.count += 1;
      if (fail) throw new Error("the provider did not answer");
      return { done: true };
    });
  } catch (error) {
    const message = modelMessage(error);
    assert.ok(message !== undefined, `not the gate's: ${String(error)}`);
    assert.doesNotMatch(message, /token/i);
    return message;
  }
  assert.fail("the gate did not refuse");
}

describe("modelMessage tells the model what happened and what to do", () => {
  it("held for approval: wait, with the approval id", async () => {
    const runId = freshRunId();
    const spec = { agentId: "billing-agent", runId, action: "files.delete", params: { path: "/tmp/r" } };
    const held = await gate.requestToken(spec);
    const ran = { count: 0 };
    const message = await told(spec, ran);
    assert.match(message, /^Not executed yet: this call is held for a person's approval \(deletes need approval\)/);
    assert.ok(message.includes(`approval id is ${held.approval!.id}`), message);
    assert.ok(message.includes("Wait for the decision"), message);
    assert.equal(ran.count, 0);
  });

  it("declined by a person: do not retry, with the approval id", async () => {
    const runId = freshRunId();
    const spec = { agentId: "billing-agent", runId, action: "files.delete", params: { path: "/tmp/r" } };
    const held = await gate.requestToken(spec);
    const id = held.approval!.id;
    execFileSync(gateBinary(), [
      "admin",
      "deny",
      "--agent",
      "billing-agent",
      "--run",
      runId,
      "--key",
      held.action.key,
      "--id",
      id,
      "--data-dir",
      running.dataDir,
    ]);
    const ran = { count: 0 };
    const message = await told(spec, ran);
    assert.ok(message.startsWith(`Not executed. A person declined the approval this call needed (approval ${id})`), message);
    assert.ok(message.includes("Do not retry the same call"), message);
    assert.equal(ran.count, 0);
  });

  it("denied by a rule: names the rule", async () => {
    const ran = { count: 0 };
    const message = await told(
      { agentId: "mallory", runId: freshRunId(), action: "payments.transfer", params: { amount: 1, currency: "EUR", to: "DE1" } },
      ran,
    );
    assert.ok(message.includes('forbid this call (the rule "no-mallory")'), message);
    assert.equal(ran.count, 0);
  });

  it("over budget: when it frees up", async () => {
    const agentId = `sms-${freshRunId()}`;
    const runId = freshRunId();
    const ran = { count: 0 };
    await gate.runOnce({ agentId, runId, action: "sms.send", params: { to: "1" } }, () => ran.count++);
    const message = await told({ agentId, runId, action: "sms.send", params: { to: "2" } }, ran);
    assert.match(message, /the budget "sms-per-hour" would be exceeded \(1 of 1 used, and this call needs 1\)/);
    assert.match(message, /It frees up at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(in \d+(\.\d{3})? s\): do not call again/);
    assert.equal(ran.count, 1);
  });

  it("key reused: the differing fields", async () => {
    const runId = freshRunId();
    const ran = { count: 0 };
    const base = { agentId: "billing-agent", runId, action: "payments.transfer", idempotencyKey: "invoice-9" };
    await gate.runOnce({ ...base, params: { amount: 10, currency: "EUR", to: "DE1" } }, () => ran.count++);
    const message = await told({ ...base, params: { amount: 20, currency: "EUR", to: "DE1" } }, ran);
    assert.ok(message.includes("differing fields: /amount"), message);
    assert.equal(ran.count, 1);
  });

  it("outcome unknown: do not retry", async () => {
    const ran = { count: 0 };
    const spec = {
      agentId: "billing-agent",
      runId: freshRunId(),
      action: "payments.transfer",
      params: { amount: 30, currency: "EUR", to: "DE2" },
    };
    const message = await told(spec, ran, true);
    assert.ok(message.startsWith("The outcome of this call is unknown"), message);
    assert.ok(message.includes("Do not retry it"), message);
    assert.equal(ran.count, 1);
  });

  it("leaves an error that is not the gate's to the developer", () => {
    assert.equal(modelMessage(new TypeError("a bug")), undefined);
  });
});
