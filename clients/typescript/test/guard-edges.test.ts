/**
 * The guard's edges that a healthy gate never shows, against an in-memory gate (Connect's router
 * transport) that answers with real statuses and ErrorInfo details: a Complete that is never
 * acknowledged, a Release refused, a gate unavailable for a moment, the heartbeat's calls.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createRouterTransport, type ServiceImpl } from "@connectrpc/connect";

import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { ActionGateService, CompletionSchema, Decision } from "../src/gen/oncegate/v1/oncegate_pb.js";
import {
  CompleteUnacknowledgedError,
  Failure,
  GateClient,
  PendingApprovalError,
  ReleaseFailedError,
  StoreUnavailableError,
  TokenMismatchError,
} from "../src/index.js";

type Impl = Partial<ServiceImpl<typeof ActionGateService>>;

function refusal(code: Code, reason: string): ConnectError {
  return new ConnectError(reason.toLowerCase(), code, undefined, [
    { desc: ErrorInfoSchema, value: { reason, domain: "oncegate", metadata: {} } },
  ]);
}

const unavailable = () => refusal(Code.Unavailable, "STORE_UNAVAILABLE");

/** A gate that grants every request, with `impl` overriding any RPC, and counts calls. */
function fakeGate(impl: Impl) {
  const calls: string[] = [];
  const base: Impl = {
    requestToken: (request) => ({
      decision: Decision.GRANTED,
      action: { scope: request.scope, key: "k" },
      fingerprint: "v1-x",
      grant: { token: "t", fencing: 1n, providerKey: "og-1", leaseExpiresAt: timestampFromMs(Date.now() + 60_000) },
    }),
    complete: (request) => ({ completion: create(CompletionSchema, { receipt: request.receipt, fencing: 1n, token: "t" }) }),
    release: () => ({ fencing: 1n }),
    extendLease: () => ({ leaseExpiresAt: timestampFromMs(Date.now() + 60_000) }),
  };
  const merged = { ...base, ...impl };
  const counted = Object.fromEntries(
    Object.entries(merged).map(([name, fn]) => [
      name,
      (...args: unknown[]) => {
        calls.push(name);
        return (fn as (...a: unknown[]) => unknown)(...args);
      },
    ]),
  ) as Impl;
  const transport = createRouterTransport(({ service }) => service(ActionGateService, counted));
  return { gate: new GateClient("fake", { transport }), calls };
}

const SPEC = { agentId: "a", runId: "r", action: "pay", params: { n: 1 } };

describe("runOnce at the edges", () => {
  it("throws PendingApprovalError for a held action and never runs it", async () => {
    const { gate, calls } = fakeGate({
      requestToken: (request) => ({
        decision: Decision.PENDING_APPROVAL,
        action: { scope: request.scope, key: "k" },
        fingerprint: "v1-x",
        approval: { id: "ap-1", policyId: "deletes", reason: "deletes need approval" },
      }),
    });
    let ran = false;
    const error = await gate
      .runOnce(SPEC, () => {
        ran = true;
      })
      .catch((e: unknown) => e);
    assert.ok(error instanceof PendingApprovalError, String(error));
    assert.equal(error.approvalId, "ap-1");
    assert.equal(error.approval.reason, "deletes need approval");
    assert.equal(ran, false);
    assert.deepEqual(calls, ["requestToken"]);
  });

  it("retries an unacknowledged Complete until the gate acknowledges it", async () => {
    let failures = 2;
    const { gate, calls } = fakeGate({
      complete: (request) => {
        if (failures-- > 0) throw unavailable();
        return { completion: create(CompletionSchema, { receipt: request.receipt, fencing: 1n }) };
      },
    });
    const outcome = await gate.runOnce(SPEC, () => "paid");
    assert.equal(outcome.kind, "Executed");
    assert.equal(calls.filter((c) => c === "complete").length, 3);
  });

  it("gives up after completeDeadline with CompleteUnacknowledgedError, never releasing", async () => {
    const { gate, calls } = fakeGate({
      complete: () => {
        throw unavailable();
      },
    });
    const error = await gate.runOnce(SPEC, () => ({ id: "tr-1" }), { completeDeadline: 300 }).catch((e: unknown) => e);
    assert.ok(error instanceof CompleteUnacknowledgedError, String(error));
    assert.equal(error.kind, "CompleteUnacknowledged");
    assert.deepEqual(error.result, { id: "tr-1" });
    assert.equal(new TextDecoder().decode(error.receipt), '{"id":"tr-1"}');
    assert.ok(error.cause instanceof StoreUnavailableError);
    assert.equal(error.token, "t");
    assert.ok(calls.filter((c) => c === "complete").length >= 2);
    assert.ok(!calls.includes("release"));
  });

  it("reports a refused Complete as unacknowledged, with the refusal as its cause", async () => {
    const { gate } = fakeGate({
      complete: () => {
        throw refusal(Code.FailedPrecondition, "COMPLETED_BY_OTHER");
      },
    });
    const error = await gate.runOnce(SPEC, () => "paid").catch((e: unknown) => e);
    assert.ok(error instanceof CompleteUnacknowledgedError);
    assert.equal((error.cause as { reason?: string }).reason, "COMPLETED_BY_OTHER");
  });

  it("reports a result it cannot encode without calling Complete", async () => {
    const { gate, calls } = fakeGate({});
    const error = await gate.runOnce(SPEC, () => ({ big: 1n })).catch((e: unknown) => e);
    assert.ok(error instanceof CompleteUnacknowledgedError);
    assert.equal(error.receipt, undefined);
    assert.ok(!calls.includes("complete") && !calls.includes("release"));
  });

  it("reports a refused Release after a definite failure as ReleaseFailedError", async () => {
    const { gate } = fakeGate({
      release: () => {
        throw refusal(Code.FailedPrecondition, "TOKEN_MISMATCH");
      },
    });
    const cause = new Error("declined");
    const error = await gate
      .runOnce(SPEC, () => {
        throw Failure.definite(cause);
      })
      .catch((e: unknown) => e);
    assert.ok(error instanceof ReleaseFailedError);
    assert.equal(error.kind, "ReleaseFailed");
    assert.equal(error.cause, cause);
    assert.ok(error.releaseError instanceof TokenMismatchError);
  });

  it("waits out a briefly unavailable gate before asking again, within maxWait", async () => {
    let failures = 2;
    const { gate, calls } = fakeGate({
      requestToken: (request) => {
        if (failures-- > 0) throw unavailable();
        return {
          decision: Decision.ALREADY_COMPLETED,
          action: { scope: request.scope, key: "k" },
          completion: { receipt: new TextEncoder().encode('"stored"'), fencing: 1n },
        };
      },
    });
    const outcome = await gate.runOnce(SPEC, () => assert.fail("must not run"));
    assert.equal(outcome.kind, "Replayed");
    assert.equal(outcome.result, "stored");
    assert.equal(calls.filter((c) => c === "requestToken").length, 3);
    const never = fakeGate({
      requestToken: () => {
        throw unavailable();
      },
    });
    await assert.rejects(never.gate.runOnce(SPEC, () => "x", { maxWait: 200 }), StoreUnavailableError);
  });

  it("names this attempt as the holder, a fresh one per attempt", async () => {
    const holders: string[] = [];
    const { gate } = fakeGate({
      requestToken: (request) => {
        holders.push(request.holder);
        throw refusal(Code.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED");
      },
    });
    await gate.runOnce(SPEC, () => "x").catch(() => undefined);
    await gate.runOnce(SPEC, () => "x").catch(() => undefined);
    await gate.runOnce({ ...SPEC, holder: "worker-7" }, () => "x").catch(() => undefined);
    assert.equal(holders.length, 3);
    assert.match(holders[0]!, /^ts:/);
    assert.notEqual(holders[0], holders[1]);
    assert.equal(holders[2], "worker-7");
  });

  it("extends the lease while the function runs, and stops when it returns", async () => {
    const ttls: bigint[] = [];
    const { gate, calls } = fakeGate({
      extendLease: (request) => {
        ttls.push(request.ttl!.seconds);
        return { leaseExpiresAt: timestampFromMs(Date.now() + 60_000) };
      },
    });
    await gate.runOnce({ ...SPEC, leaseTtlMs: 3_000 }, () => sleep(350).then(() => "done"), { heartbeat: 100 });
    const during = calls.filter((c) => c === "extendLease").length;
    assert.ok(during >= 2, `${during} extensions`);
    assert.ok(ttls.every((ttl) => ttl === 3n));
    await sleep(300);
    assert.equal(calls.filter((c) => c === "extendLease").length, during);
  });
});
