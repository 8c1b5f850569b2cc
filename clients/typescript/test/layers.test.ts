/**
 * The package's layers: every import inside src/ points down, never up or sideways (as the Python
 * client's tests/test_layers.py checks its own). Read from the TypeScript sources, type-only
 * imports included: a cycle drawn only for the type checker is still a cycle for a reader.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join, posix } from "node:path";
import { describe, it } from "node:test";

import { PACKAGE_DIR } from "./support/paths.js";

const SRC = join(PACKAGE_DIR, "src");

/** Bottom first; a module may import modules of lower layers only (the stubs import each other). */
const LAYERS: string[][] = [
  ["gen/google/rpc/error_details_pb", "gen/oncegate/v1/oncegate_pb"],
  ["address", "fingerprint/params"],
  ["fingerprint/fingerprint", "models"],
  ["errors/gate", "verify"],
  ["errors/guard", "errors/status"],
  ["errors/message"],
  ["errors/index"],
  ["rpc"],
  ["guard/options", "guard/backoff"],
  ["guard/heartbeat"],
  ["guard/run-once"],
  ["client", "resolver"],
  ["temporal/failures"],
  ["temporal/interceptor"],
  ["index", "temporal/index"],
];
const RANK = new Map(LAYERS.flatMap((layer, rank) => layer.map((module): [string, number] => [module, rank])));

const MODULES = readdirSync(SRC, { recursive: true, encoding: "utf8" })
  .filter((file) => file.endsWith(".ts"))
  .map((file) => file.replaceAll("\\", "/").replace(/\.ts$/, ""))
  .sort();

/** The src/ modules that `source` (the text of `module`) imports. */
function imports(module: string, source: string): string[] {
  const found: string[] = [];
  for (const match of source.matchAll(/(?:import|export)\s[^;]*?from\s+"(\.{1,2}\/[^"]+)"/g)) {
    found.push(posix.normalize(posix.join(posix.dirname(module), match[1]!)).replace(/\.js$/, ""));
  }
  return found;
}

function upward(module: string, imported: string[]): string[] {
  const rank = RANK.get(module)!;
  if (rank === 0) return imported.filter((name) => RANK.get(name) !== 0);
  return imported.filter((name) => (RANK.get(name) ?? LAYERS.length) >= rank).sort();
}

describe("layers", () => {
  it("place every module", () => {
    assert.deepEqual(MODULES, [...RANK.keys()].sort());
  });

  for (const module of MODULES) {
    it(`${module} imports only lower layers`, () => {
      assert.deepEqual(upward(module, imports(module, readFileSync(join(SRC, `${module}.ts`), "utf8"))), []);
    });
  }

  it("see an upward import", () => {
    assert.deepEqual(upward("rpc", imports("rpc", 'import { GateClient } from "./client.js";')), ["client"]);
    assert.deepEqual(upward("errors/gate", imports("errors/gate", 'import type { X } from "../rpc.js";')), ["rpc"]);
    assert.deepEqual(upward("guard/run-once", imports("guard/run-once", 'import { Backoff } from "./backoff.js";')), []);
  });

});
