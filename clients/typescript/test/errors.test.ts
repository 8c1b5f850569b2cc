/** Errors: one class per ErrorReason, named from the proto, and statuses decoded into them. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import * as oncegate from "../src/index.js";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { ErrorReasonSchema } from "../src/gen/oncegate/v1/oncegate_pb.js";
import {
  BY_REASON,
  ErrorReason,
  fromCallError,
  BudgetExceededError,
  InProgressError,
  InvalidRequestError,
  KeyReusedError,
  LeaseExpiredUnresolvedError,
  OncegateError,
  PolicyDeniedError,
  TransportError,
} from "../src/index.js";

function gateStatus(code: Code, reason: string, metadata: Record<string, string>, extra: ConnectError["details"] = []) {
  return new ConnectError("refused", code, undefined, [
    { desc: ErrorInfoSchema, value: { reason, domain: "oncegate", metadata } },
    ...(extra as never[]),
  ]);
}

describe("the classes by reason", () => {
  it("cover every ErrorReason value but UNSPECIFIED, by its proto name", () => {
    const names = ErrorReasonSchema.values.filter((v) => v.number !== 0).map((v) => v.name);
    assert.deepEqual([...BY_REASON.keys()].sort(), [...names].sort());
    for (const [reason, cls] of BY_REASON) {
      if (cls !== OncegateError) assert.equal(cls.REASON, reason);
    }
    assert.equal(KeyReusedError.REASON, "IDEMPOTENCY_KEY_REUSED");
    assert.equal(oncegate.reasonName(ErrorReason.STORE_UNAVAILABLE), "STORE_UNAVAILABLE");
  });

  it("are one hierarchy whose names end in Error", () => {
    const classes = Object.entries(oncegate as Record<string, unknown>).filter(
      (entry): entry is [string, typeof Error] =>
        typeof entry[1] === "function" && (entry[1] as typeof Error).prototype instanceof Error,
    );
    for (const [name, cls] of classes) {
      // The offline checks' errors (fingerprint, verifyGrant) are not the gate's.
      if (name === "ParamsError" || name === "StatementError" || name === "Failure") continue;
      assert.ok(name.endsWith("Error"), name);
      assert.ok((cls as unknown) === OncegateError || cls.prototype instanceof OncegateError, name);
      if (name !== "GuardError") assert.equal(new (cls as new (m: string) => Error)("x").name, name);
    }
    assert.ok(classes.length >= 19);
  });
});

describe("fromCallError", () => {
  it("reads differing fields, never values", () => {
    const error = fromCallError(gateStatus(Code.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED", { differing_fields: "/amount,/to" }));
    assert.ok(error instanceof KeyReusedError);
    assert.deepEqual(error.differingFields, ["/amount", "/to"]);
    assert.equal(error.code, Code.FailedPrecondition);
    assert.equal(error.retryable, false);
  });

  it("reads the retry delay from RetryInfo, else from the metadata", () => {
    const withInfo = fromCallError(
      gateStatus(Code.Aborted, "IDEMPOTENCY_IN_PROGRESS", { retry_after_ms: "9000" }, [
        { desc: RetryInfoSchema, value: { retryDelay: durationFromMs(1500) } },
      ] as never),
    );
    assert.ok(withInfo instanceof InProgressError);
    assert.equal(withInfo.retryAfterMs, 1500);
    assert.equal(withInfo.retryable, true);
    const metadataOnly = fromCallError(gateStatus(Code.Aborted, "IDEMPOTENCY_IN_PROGRESS", { retry_after_ms: "250" }));
    assert.equal(metadataOnly.retryAfterMs, 250);
  });

  it("reads token, fencing and expiry of an unresolved lease", () => {
    const error = fromCallError(
      gateStatus(Code.FailedPrecondition, "LEASE_EXPIRED_UNRESOLVED", {
        token: "abc",
        fencing: "3",
        lease_expired_at: "2026-11-30T12:00:00.123456789Z",
        agent_id: "billing-agent",
        run_id: "run-7",
        key: "invoice-1001",
        provider_key: "og-123",
      }),
    );
    assert.ok(error instanceof LeaseExpiredUnresolvedError);
    assert.equal(error.token, "abc");
    assert.equal(error.providerKey, "og-123");
    assert.deepEqual(error.action, { scope: { agentId: "billing-agent", runId: "run-7" }, key: "invoice-1001" });
    assert.equal(error.fencing, 3);
    assert.equal(error.leaseExpiredAt?.toISOString(), "2026-11-30T12:00:00.123Z");
  });

  it("reads BadRequest field violations", () => {
    const error = fromCallError(
      gateStatus(Code.InvalidArgument, "INVALID_REQUEST", { field: "params_json" }, [
        { desc: BadRequestSchema, value: { fieldViolations: [{ field: "params_json", description: "not an object" }] } },
      ] as never),
    );
    assert.ok(error instanceof InvalidRequestError);
    assert.equal(error.field, "params_json");
    assert.deepEqual(error.fieldViolations, [{ field: "params_json", description: "not an object" }]);
  });

  it("reads the authorization refusals: the deciding policy, the budget and when it frees up", () => {
    const denied = fromCallError(
      gateStatus(Code.PermissionDenied, "POLICY_DENIED", { policy_id: "no-intern", approval_id: "" }),
    );
    assert.ok(denied instanceof PolicyDeniedError);
    assert.equal(denied.policyId, "no-intern");
    assert.equal(denied.retryable, false);
    const over = fromCallError(
      gateStatus(Code.ResourceExhausted, "BUDGET_EXCEEDED", {
        budget: "eur-per-day",
        used: "9950.00",
        limit: "10000.00",
        requested: "100.00",
        retry_at: "2026-12-03T14:05:00Z",
        retry_after_ms: "5000",
      }),
    );
    assert.ok(over instanceof BudgetExceededError);
    assert.equal(over.budget, "eur-per-day");
    assert.deepEqual([over.used, over.limit, over.requested], ["9950.00", "10000.00", "100.00"]);
    assert.equal(over.retryAt?.toISOString(), "2026-12-03T14:05:00.000Z");
    assert.equal(over.retryAfterMs, 5000);
    const alone = fromCallError(
      gateStatus(Code.ResourceExhausted, "BUDGET_EXCEEDED", { budget: "eur-per-day", requested: "11.00" }),
    );
    assert.ok(alone instanceof BudgetExceededError);
    assert.equal(alone.retryAt, undefined);
    assert.equal(alone.retryAfterMs, undefined);
  });

  it("gives the root class, with its reason, to the reasons without one", () => {
    const error = fromCallError(gateStatus(Code.Internal, "INTERNAL", {}));
    assert.equal(error.constructor, OncegateError);
    assert.equal(error.reason, "INTERNAL");
    assert.equal(error.retryable, false);
  });

  it("makes a status without an oncegate ErrorInfo a TransportError", () => {
    const unreachable = fromCallError(new ConnectError("connection refused", Code.Unavailable));
    assert.ok(unreachable instanceof TransportError);
    assert.equal(unreachable.reason, undefined);
    assert.equal(unreachable.retryable, true);
    const foreign = fromCallError(
      new ConnectError("no", Code.PermissionDenied, undefined, [
        { desc: ErrorInfoSchema, value: { reason: "FORBIDDEN_SCOPE", domain: "proxy.example", metadata: {} } },
      ]),
    );
    assert.ok(foreign instanceof TransportError);
    assert.equal(foreign.retryable, false);
  });
});
