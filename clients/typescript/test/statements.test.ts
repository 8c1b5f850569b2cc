/** Signed grant statements against the shared vectors (tests/vectors/statements.json), as the Rust and Python verifiers check them. */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import { StatementError, verifyGrant } from "../src/index.js";
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
