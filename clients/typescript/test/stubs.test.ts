/** The committed stubs are exactly what `npm run generate` makes of proto/ today. */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE_DIR } from "./support/paths.js";

interface Generator {
  GENERATED_DIR: string;
  generate(base: string): string[];
  listFiles(dir: string): string[];
}

test("the committed stubs match the proto", async () => {
  const generator = (await import(join(PACKAGE_DIR, "scripts", "generate.mjs"))) as Generator;
  const base = mkdtempSync(join(tmpdir(), "oncegate-stubs-"));
  try {
    const fresh = generator.generate(base);
    const committedDir = join(PACKAGE_DIR, generator.GENERATED_DIR);
    assert.deepEqual(generator.listFiles(committedDir), fresh, "stub files differ: run npm run generate");
    assert.ok(fresh.includes(join("oncegate", "v1", "oncegate_pb.ts")));
    const stale = fresh.filter(
      (file) =>
        !readFileSync(join(base, generator.GENERATED_DIR, file)).equals(readFileSync(join(committedDir, file))),
    );
    assert.deepEqual(stale, [], "stale stubs: run npm run generate");
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
});
