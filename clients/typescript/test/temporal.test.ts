/**
 * The Temporal interceptor (`oncegate/temporal`) against the real gate: `MockActivityEnvironment`
 * of `@temporalio/testing` drives attempts 1, 2, 3... of one activity through the interceptor, as
 * Temporal's retries would. A completed attempt is replayed; a worker process SIGKILLed
 * mid-activity leaves the retry held until its lease ends, then unresolved until a resolver
 * settles it, then replayed; a heartbeating activity longer than its lease keeps it; changed input
 * under one activity id is refused non-retryably; an unknown outcome fails non-retryably naming
 * the provider key. Failures cross Temporal's default failure converter.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { heartbeat } from "@temporalio/activity";
import { ApplicationFailure, defaultFailureConverter, defaultPayloadConverter } from "@temporalio/common";
import { MockActivityEnvironment } from "@temporalio/testing";

import { ActionState, GateClient, Lookup, Resolver } from "../src/index.js";
import { currentGrant, oncegateInterceptor, type OncegateInterceptorOptions } from "../src/temporal/index.js";
import { freshRunId, startGate, type RunningGate } from "./support/gate.js";
import { attemptInfo, bankCalls, pay, type Invoice } from "./support/temporal-bank.js";

const INVOICE: Invoice = { amount: 4200, currency: "EUR", to: "DE89" };
const GUARDED: OncegateInterceptorOptions = { activities: { transfer: "payments.transfer" } };
const PATIENCE_MS = 60_000;

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

function ledgerFile(): string {
  return join(mkdtempSync(join(tmpdir(), "oncegate-temporal-")), "bank.jsonl");
}

async function attempt<T>(
  workflowId: string,
  n: number,
  activity: (invoice: Invoice) => Promise<T>,
  invoice: Invoice = INVOICE,
  options: Partial<OncegateInterceptorOptions> = {},
  heartbeatTimeoutMs?: number,
): Promise<T> {
  const interceptor = oncegateInterceptor(gate, { ...GUARDED, ...options });
  const env = new MockActivityEnvironment(attemptInfo(workflowId, n, heartbeatTimeoutMs), { interceptors: [interceptor] });
  return env.run(activity, invoice);
}

async function failureOf(run: Promise<unknown>): Promise<ApplicationFailure> {
  try {
    await run;
  } catch (error) {
    assert.ok(error instanceof ApplicationFailure, `an ApplicationFailure, not ${String(error)}`);
    return error;
  }
  assert.fail("the attempt did not fail");
}

/**
 * `failure` as the worker sends it (the default failure converter's proto, whose retry delay the
 * server reads) and as the workflow decodes it.
 */
function assertCrossesTheConverter(failure: ApplicationFailure): void {
  const encoded = defaultFailureConverter.errorToFailure(failure, defaultPayloadConverter);
  const delay = encoded.applicationFailureInfo?.nextRetryDelay;
  const sentMs = delay ? Number(delay.seconds ?? 0) * 1000 + Math.round((delay.nanos ?? 0) / 1e6) : 0;
  assert.equal(sentMs, Number(failure.nextRetryDelay ?? 0));
  const decoded = defaultFailureConverter.failureToError(encoded, defaultPayloadConverter);
  assert.ok(decoded instanceof ApplicationFailure);
  assert.equal(decoded.type, failure.type);
  assert.equal(decoded.nonRetryable, failure.nonRetryable);
  assert.deepEqual(decoded.details, failure.details);
  assert.equal(decoded.message, failure.message);
}

describe("oncegateInterceptor", () => {
  it("replays a completed attempt without running it", async () => {
    const ledger = ledgerFile();
    const workflow = `wf-${freshRunId()}`;
    const transfer = async (invoice: Invoice) => pay(ledger, invoice);
    const results = [];
    for (const n of [1, 2, 3]) results.push(await attempt(workflow, n, transfer));
    assert.deepEqual(results, Array(3).fill({ transferId: "tr-1", amount: 4200 }));
    assert.equal(bankCalls(ledger).length, 1);
  });

  it("refuses changed input under one activity id, non-retryably", async () => {
    const ledger = ledgerFile();
    const workflow = `wf-${freshRunId()}`;
    const transfer = async (invoice: Invoice) => pay(ledger, invoice);
    await attempt(workflow, 1, transfer);
    const failure = await failureOf(attempt(workflow, 2, transfer, { ...INVOICE, amount: 9900 }));
    assert.equal(failure.type, "OncegateKeyReused");
    assert.equal(failure.nonRetryable, true);
    assert.match(failure.message, /\/amount/);
    assert.deepEqual((failure.details![0] as { differingFields: string[] }).differingFields, ["/amount"]);
    assert.equal(bankCalls(ledger).length, 1);
    assertCrossesTheConverter(failure);
  });

  it("fails an unknown outcome non-retryably, naming the provider key", async () => {
    const workflow = `wf-${freshRunId()}`;
    const keys: string[] = [];
    const transfer = async (): Promise<never> => {
      keys.push(currentGrant().providerKey);
      throw new Error("the bank did not answer");
    };
    const failure = await failureOf(attempt(workflow, 1, transfer));
    assert.equal(failure.type, "OncegateOutcomeUnknown");
    assert.equal(failure.nonRetryable, true);
    assert.ok(failure.message.includes(keys[0]!));
    const detail = failure.details![0] as Record<string, unknown>;
    assert.equal(detail["providerKey"], keys[0]);
    assert.equal(detail["token"], undefined, "never the token");
    assertCrossesTheConverter(failure);
    const retrying = await failureOf(attempt(`${workflow}-b`, 1, transfer, INVOICE, { retryUnknown: true }));
    assert.equal(retrying.nonRetryable, false);
    assert.ok(Number(retrying.nextRetryDelay) > 0);
  });

  it("holds the retry of a killed worker until its lease ends, then replays what a resolver settled", async () => {
    const ledger = ledgerFile();
    const workflow = `wf-${freshRunId()}`;
    const worker = spawn(process.execPath, [join(import.meta.dirname, "support", "temporal-bank.js"), running.address, ledger, workflow], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    const [line] = await Promise.race([
      createInterface({ input: worker.stdout! })[Symbol.asyncIterator]().next().then((r) => [r.value as string]),
      sleep(PATIENCE_MS).then(() => ["timed out"]),
    ]);
    const exited = new Promise((resolve) => worker.once("exit", resolve));
    worker.kill("SIGKILL"); // mid-activity: the bank was called, the gate never heard
    await exited;
    assert.equal(line, "called the bank");
    const [call] = bankCalls(ledger);

    const resolver = new Resolver(`unix:${join(running.dataDir, "admin.sock")}`, { agentId: workflow });
    resolver.lookup("payments.transfer", (u) => {
      const paid = bankCalls(ledger).find((c) => c.providerKey === u.providerKey);
      return paid ? Lookup.json({ transferId: paid.transferId, amount: paid.amount }) : Lookup.unknown;
    });
    let resolving: Promise<void> | undefined;
    const transfer = async (invoice: Invoice) => pay(ledger, invoice);
    const seen: ApplicationFailure[] = [];
    const deadline = Date.now() + PATIENCE_MS;
    let result: unknown;
    try {
      for (let n = 2; ; n++) {
        assert.ok(Date.now() < deadline, `${seen.map((f) => f.type)}`);
        try {
          result = await attempt(workflow, n, transfer, INVOICE, { waitDelayMs: 200 });
          break;
        } catch (error) {
          assert.ok(error instanceof ApplicationFailure, String(error));
          seen.push(error);
          if (error.type === "OncegateUnresolved" && resolving === undefined) resolving = resolver.run();
          // What Temporal does with a retryable failure: wait its delay, then the next attempt.
          assert.equal(error.nonRetryable, false);
          await sleep(Number(error.nextRetryDelay));
        }
      }
    } finally {
      resolver.stop();
      await resolving;
      resolver.close();
    }
    const kinds = seen.map((f) => f.type);
    const held = kinds.indexOf("OncegateUnresolved");
    assert.ok(held >= 1, `${kinds}`);
    assert.deepEqual(new Set(kinds.slice(0, held)), new Set(["OncegateInProgress"]));
    assert.deepEqual(new Set(kinds.slice(held)), new Set(["OncegateUnresolved"]));
    assert.ok(Number(seen[0]!.nextRetryDelay) <= 2_000, "held for what is left of the lease");
    assert.equal((seen[held]!.details![0] as { providerKey: string }).providerKey, call!.providerKey);
    assert.deepEqual(result, { transferId: "tr-1", amount: 4200 }, "replayed from the resolver's receipt");
    assert.equal(bankCalls(ledger).length, 1);
    assertCrossesTheConverter(seen[0]!);
  });

  for (const heartbeats of [true, false]) {
    it(`keeps the lease of an activity longer than it ${heartbeats ? "while it heartbeats" : "only while it heartbeats"}`, async () => {
      const workflow = `wf-${freshRunId()}`;
      const lease = 1_000;
      const states: ActionState[] = [];
      const transfer = async (invoice: Invoice) => {
        const started = Date.now();
        while (Date.now() - started < 3.5 * lease) {
          if (heartbeats) heartbeat();
          await sleep(lease / 10);
        }
        const record = await gate.getAction({ scope: { agentId: workflow, runId: "run-1" }, key: "pay-1" });
        states.push(record.state);
        return { transferId: "tr-1", amount: invoice.amount };
      };
      assert.deepEqual(await attempt(workflow, 1, transfer, INVOICE, {}, lease), { transferId: "tr-1", amount: 4200 });
      assert.deepEqual(states, [heartbeats ? ActionState.AUTHORIZED : ActionState.EXPIRED]);
    });
  }

  it("runs activities it does not guard as they are", async () => {
    const workflow = `wf-${freshRunId()}`;
    const interceptor = oncegateInterceptor(gate, { activities: ["somethingElse"] });
    const env = new MockActivityEnvironment(attemptInfo(workflow, 1), { interceptors: [interceptor] });
    const result = await env.run(async () => {
      assert.throws(() => currentGrant(), /no guarded activity/);
      return "ran";
    });
    assert.equal(result, "ran");
  });
});
