/**
 * The resolver against the real gate binary: a fake bank answers lookups by provider key; what it
 * knows is settled (the agent's retry replays the bank's receipt, or is granted again), what it
 * cannot answer (unknown, a lookup that throws or hangs past the timeout) stays unresolved for a
 * person; two resolvers racing for one grant settle it once.
 *
 * The gate has one principal, `ts-resolver` with the `resolver` role for the agents `resolved-*`
 * (agents still call without a credential: no principal has the agent role). A second resolver
 * connects over the gate's admin socket, as its local operator.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  CompletionSource,
  Decision,
  GateClient,
  Lookup,
  OutcomeUnknownError,
  ReceiptFormat,
  Resolver,
  type ActionSpec,
  type ResolverLogger,
  type Unresolved,
} from "../src/index.js";
import { freshRunId, gateBinary, POLICY, startGate, type RunningGate } from "./support/gate.js";

const RESOLVER_KEY = "ts-resolver-key-0123456789";
const RESOLVER_POLICY = `${POLICY}
[[principals]]
name = "ts-resolver"
role = "resolver"
agents = ["resolved-*"]
api_key_sha256 = "${createHash("sha256").update(RESOLVER_KEY).digest("hex")}"
`;
const PATIENCE_MS = 60_000;

let running: RunningGate;
let gate: GateClient;

before(async () => {
  running = await startGate(RESOLVER_POLICY);
  gate = new GateClient(running.address);
});

after(async () => {
  gate.close();
  await running.stop();
});

function transfer(agentId: string, runId: string, amount: number, extra: Partial<ActionSpec> = {}): ActionSpec {
  return { agentId, runId, action: "payments.transfer", params: { amount, currency: "EUR", to: "DE89" }, ...extra };
}

/** Grants one payment per amount with a 1 s lease, and lets every lease end: provider key → amount. */
async function lapse(agentId: string, runId: string, amounts: number[]): Promise<Map<string, number>> {
  const bank = new Map<string, number>();
  for (const amount of amounts) {
    // The worker's call to the bank times out: the outcome is unknown, and the lease runs out.
    const error = await gate
      .runOnce(
        transfer(agentId, runId, amount, { leaseTtlMs: 1_000 }),
        (grant) => {
          bank.set(grant.providerKey, amount);
          throw new Error("the bank did not answer in time");
        },
        { heartbeat: 60_000 },
      )
      .then(
        () => assert.fail("the attempt should not settle"),
        (thrown: unknown) => thrown,
      );
    assert.ok(error instanceof OutcomeUnknownError);
  }
  await sleep(1_200);
  return bank;
}

/** `oncegate admin list-unresolved` for one agent, over the admin socket. */
function unresolved(agentId: string): { params_json: string; fencing: string | number }[] {
  const shown = execFileSync(
    gateBinary(),
    ["admin", "list-unresolved", "--data-dir", running.dataDir, "--agent", agentId, "--json"],
    { encoding: "utf8" },
  );
  return (JSON.parse(shown) as { actions: { params_json: string; fencing: string | number }[] }).actions;
}

function amountsLeft(agentId: string): number[] {
  return unresolved(agentId)
    .map((u) => (JSON.parse(u.params_json) as { amount: number }).amount)
    .sort();
}

async function waitFor(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + PATIENCE_MS;
  while (!condition()) {
    assert.ok(Date.now() < deadline, `the resolver did not get there: ${what}`);
    await sleep(100);
  }
}

/** A logger that keeps what it is told. */
function recording(): ResolverLogger & { infos: string[]; warns: string[] } {
  const infos: string[] = [];
  const warns: string[] = [];
  return { infos, warns, info: (line) => infos.push(line), warn: (line) => warns.push(line) };
}

/** The start of what a resolver logs when it settled an action, and when another had. */
const RESOLVED = "oncegate resolver: resolved ";
const BY_OTHER = "oncegate resolver: settled by another: ";

const mustNotRun = () => {
  throw new Error("a settled action must not run again");
};

describe("the resolver", () => {
  it("reopens its stream when the gate crashes and comes back", async () => {
    const agentId = `resolved-${freshRunId()}`;
    const runId = "run-1";
    const logger = recording();
    const resolver = new Resolver(running.address, {
      apiKey: RESOLVER_KEY,
      agentId,
      backoffMs: [50, 500],
      logger,
    });
    resolver.lookup("payments.transfer", () => Lookup.json({ tx: "found" }));
    const worker = resolver.run();
    await lapse(agentId, runId, [1]);
    await waitFor(() => amountsLeft(agentId).length === 0, "the first payment settled");

    // The gate is killed and restarted on the same address and data: the stream broke, and the
    // resolver reopens it, so a lease that ends afterwards is settled too.
    await running.restart();
    await lapse(agentId, runId, [2]);
    await waitFor(() => amountsLeft(agentId).length === 0, "the second payment settled, after the restart");
    resolver.stop();
    await worker;
    resolver.close();
    const replay = await gate.runOnce(transfer(agentId, runId, 2), mustNotRun);
    assert.equal(replay.kind, "Replayed");
    assert.deepEqual(replay.result, { tx: "found" });
  });

  it("settles what the bank knows and leaves the rest for a person", async () => {
    const agentId = `resolved-${freshRunId()}`;
    const runId = "run-1";
    const bank = await lapse(agentId, runId, [1, 2, 3, 4, 5]);
    assert.deepEqual(amountsLeft(agentId), [1, 2, 3, 4, 5]);
    const looked: number[] = [];
    const logger = recording();
    const resolver = new Resolver(running.address, { apiKey: RESOLVER_KEY, agentId, lookupTimeoutMs: 500, logger });
    resolver.lookup("payments.transfer", async (u: Unresolved, { signal }) => {
      const amount = bank.get(u.providerKey);
      assert.ok(amount !== undefined, `the bank never saw ${u.providerKey}`);
      assert.equal(u.params["amount"], amount);
      assert.equal(JSON.parse(u.paramsJson).amount, amount);
      assert.ok(u.fencing > 0 && u.token !== "" && u.leaseExpiredAt instanceof Date);
      assert.deepEqual(u.action.scope, { agentId, runId });
      looked.push(amount);
      if (amount === 1) return Lookup.json({ tx: "tx_1" }); // it was paid
      if (amount === 2) return Lookup.failed; // it never reached the bank
      if (amount === 3) return Lookup.unknown; // the bank cannot tell
      if (amount === 4) throw new Error("the bank answered 503");
      await sleep(2_000, undefined, { signal }); // past the timeout: the signal aborts it, and it throws
      return Lookup.json({ tx: "late" });
    });
    const worker = resolver.run();
    // An entry may come more than once (the listing, then a scan): count the payments looked up.
    const leftWhy = ["the provider cannot tell", "the lookup failed: Error: the bank answered 503", "the lookup took over 500 ms"];
    const logged = (why: string) => logger.warns.some((line) => line.includes("left for a person") && line.includes(why));
    await waitFor(
      () => new Set(looked).size === 5 && leftWhy.every(logged) && amountsLeft(agentId).length === 3,
      "five lookups, three left",
    );
    resolver.stop();
    await worker;
    resolver.close();

    assert.deepEqual([...new Set(looked)].sort(), [1, 2, 3, 4, 5]);
    assert.deepEqual(amountsLeft(agentId), [3, 4, 5], "what the bank could not answer stays for a person");
    // The agent's retry replays the bank's receipt: the resolver's completion, a JSON value.
    const replay = await gate.runOnce(transfer(agentId, runId, 1), mustNotRun);
    assert.equal(replay.kind, "Replayed");
    assert.deepEqual(replay.result, { tx: "tx_1" });
    assert.equal(replay.completion.source, CompletionSource.OPERATOR);
    assert.equal(replay.completion.operator, "ts-resolver");
    assert.equal(replay.completion.receiptFormat, ReceiptFormat.JSON);
    // The payment that never happened may be granted again, with a higher fencing number.
    const again = await gate.requestToken(transfer(agentId, runId, 2));
    assert.equal(again.decision, Decision.GRANTED);
    // Each action left is logged with why.
    for (const why of leftWhy) assert.ok(logged(why), `${why} in ${logger.warns}`);
    assert.equal(logger.infos.filter((line) => line.includes(RESOLVED)).length, 2, `${logger.infos}`);
  });

  it("settles a grant once when two resolvers race for it, with different answers", async () => {
    const agentId = `resolved-${freshRunId()}`;
    const runId = "run-1";
    await lapse(agentId, runId, [7]);
    // Both are asked before either answers: each waits for the other's lookup.
    const asked: Unresolved[] = [];
    const lookupAs = (tx: string) => async (u: Unresolved, { signal }: { signal: AbortSignal }) => {
      asked.push(u);
      while (asked.length < 2 && !signal.aborted) await sleep(20);
      return Lookup.text(tx);
    };
    const loggers = [recording(), recording()];
    const resolvers = [
      new Resolver(running.address, { apiKey: RESOLVER_KEY, agentId, logger: loggers[0]! }),
      new Resolver(`unix:${join(running.dataDir, "admin.sock")}`, { agentId, logger: loggers[1]! }),
    ];
    resolvers[0]!.lookup("payments.transfer", lookupAs("tx_A"));
    resolvers[1]!.lookup("payments.transfer", lookupAs("tx_B"));
    const workers = resolvers.map((resolver) => resolver.run());
    const told = (pattern: string) => loggers.flatMap((logger) => logger.infos).filter((line) => line.includes(pattern));
    await waitFor(() => told(RESOLVED).length + told(BY_OTHER).length === 2, "both answered");
    for (const resolver of resolvers) resolver.stop();
    await Promise.all(workers);

    assert.equal(asked.length, 2);
    assert.equal(asked[0]!.fencing, asked[1]!.fencing);
    assert.equal(told(RESOLVED).length, 1, "settled once");
    assert.equal(told(BY_OTHER).length, 1, "the other is told");
    assert.deepEqual(
      loggers.flatMap((logger) => logger.warns),
      [],
    );
    // The replay is the winner's answer, and the winner is the one that said it settled.
    const winner = loggers[0]!.infos.some((line) => line.includes(RESOLVED)) ? 0 : 1;
    const replay = await gate.runOnce(transfer(agentId, runId, 7), mustNotRun);
    assert.equal(replay.result, winner === 0 ? "tx_A" : "tx_B");
    assert.equal(replay.completion.operator, winner === 0 ? "ts-resolver" : "local-operator");
    assert.deepEqual(amountsLeft(agentId), []);
    // Settling the same grant again is told, not an error.
    assert.deepEqual(await resolvers[0]!.settle(asked[0]!), { kind: "ByOther" });
    for (const resolver of resolvers) resolver.close();
  });

  it("settles one action on demand, and says what became of it", async () => {
    const agentId = `resolved-${freshRunId()}`;
    const runId = "run-1";
    await lapse(agentId, runId, [8, 9]);
    const logger = recording();
    const resolver = new Resolver(running.address, { apiKey: RESOLVER_KEY, agentId, logger });
    const seen: Unresolved[] = [];
    resolver.lookup("payments.transfer", (u) => {
      seen.push(u);
      return Lookup.unknown;
    });
    const worker = resolver.run();
    await waitFor(() => seen.length === 2, "both listed");
    resolver.stop();
    await worker;
    const [eight, nine] = [...seen].sort((a, b) => Number(a.params["amount"]) - Number(b.params["amount"]));
    // No lookup for the action type: left.
    const other = new Resolver(running.address, { apiKey: RESOLVER_KEY, logger });
    assert.deepEqual(await other.settle(eight!), { kind: "Left", why: 'no lookup for action "payments.transfer"' });
    other.lookup("payments.transfer", () => Lookup.failed);
    assert.deepEqual(await other.settle(eight!), { kind: "Failed" });
    assert.deepEqual(await other.settle(eight!), { kind: "ByOther" });
    // A resolver for other agents is refused by the gate: the settlement failed, left.
    const outsider = { ...nine!, action: { ...nine!.action, scope: { agentId: "billing", runId } } };
    const refused = await other.settle(outsider);
    assert.equal(refused.kind, "Left");
    assert.match(refused.kind === "Left" ? refused.why : "", /the settlement failed/);
    assert.deepEqual(amountsLeft(agentId), [9]);
    other.close();
    resolver.close();
  });
});
