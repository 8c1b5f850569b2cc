/**
 * Signed grant statements against the shared vectors (tests/vectors/statements.json), as the Rust
 * and Python verifiers check them, and a live gate's statements against its own published keys.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { GateClient, StatementError, verifyGrant } from "../src/index.js";
import { freshRunId, gateBinary, startGate, TRANSFER_KEY_FIELDS, type RunningGate } from "./support/gate.js";
import { VECTORS } from "./support/paths.js";

interface Case {
  name: string;
  statement: string;
  params_json: string;
  key_fields: string[] | null;
  audience: string;
  fencing?: number;
  error?: string;
}
const DOC = JSON.parse(readFileSync(join(VECTORS, "..", "statements.json"), "utf8")) as {
  now: number;
  jwks: { keys: Record<string, string>[] };
  cases: Case[];
};

describe("the shared statement vectors", () => {
  for (const c of DOC.cases) {
    it(c.name, async () => {
      const verify = () =>
        verifyGrant(DOC.jwks, c.statement, c.params_json, { audience: c.audience, keyFields: c.key_fields, now: DOC.now });
      if (c.error === undefined) {
        assert.equal((await verify()).fencing, c.fencing);
      } else {
        await assert.rejects(verify, (e: unknown) => e instanceof StatementError && e.kind === c.error);
      }
    });
  }

  it("refuse what a removed key signed", async () => {
    const rotated = DOC.cases.find((c) => c.name.startsWith("rotated"))!;
    const onlyActive = { keys: DOC.jwks.keys.slice(0, 1) };
    await assert.rejects(
      verifyGrant(onlyActive, rotated.statement, rotated.params_json, { audience: "fake-bank", keyFields: rotated.key_fields, now: DOC.now }),
      (e: unknown) => e instanceof StatementError && e.kind === "unknown_key",
    );
  });
});

describe("a live gate's grant statements", () => {
  let running: RunningGate;
  let gate: GateClient;
  const TRANSFER = { amount: 5000, currency: "EUR", to: "DE89370400440532013000", memo: "Invoice 42" };

  before(async () => {
    running = await startGate();
    gate = new GateClient(running.address);
  });

  after(async () => {
    gate.close();
    await running.stop();
  });

  it("verify with the keys the gate publishes, for the granted params only", async () => {
    const answer = await gate.requestToken({
      agentId: "billing-agent",
      runId: freshRunId(),
      action: "payments.transfer",
      params: TRANSFER,
    });
    const grant = answer.grant!;
    assert.notEqual(grant.statement, "", "the embedded gate signs with the key it generated");
    // `oncegate keys export` prints the JWKS the gate serves on its metrics listener.
    const jwks = JSON.parse(execFileSync(gateBinary(), ["keys", "export", "--data-dir", running.dataDir], { encoding: "utf8" }));
    const check = { audience: "payments.transfer", keyFields: TRANSFER_KEY_FIELDS };
    const claims = await verifyGrant(jwks, grant.statement, { ...TRANSFER, memo: "rewritten" }, check);
    assert.equal(claims.fencing, grant.fencing);
    assert.equal(claims.provider_key, grant.providerKey);
    assert.equal(claims.agent, "billing-agent");
    assert.equal(claims.fingerprint, answer.fingerprint);
    await assert.rejects(
      verifyGrant(jwks, grant.statement, { ...TRANSFER, amount: 900000 }, check),
      (e: unknown) => e instanceof StatementError && e.kind === "fingerprint_mismatch",
    );
    await assert.rejects(
      verifyGrant(jwks, grant.statement, TRANSFER, { ...check, audience: "another-bank" }),
      (e: unknown) => e instanceof StatementError && e.kind === "wrong_audience",
    );
  });
});
