#!/usr/bin/env node
// Regenerates the committed stubs under src/gen/ from ../../proto (and google/rpc/error_details
// from google-proto-files) with `buf generate` and protoc-gen-es, both pinned in package.json and
// run from node_modules: no system `protoc`. `npm run generate` after changing the proto;
// test/stubs.test.ts fails when the committed stubs differ from what this makes.

import { execFileSync } from "node:child_process";
import { readdirSync, rmSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

/** The package directory (clients/typescript). */
export const PACKAGE_DIR = dirname(dirname(fileURLToPath(import.meta.url)));

/** Where the stubs go, relative to an output base. */
export const GENERATED_DIR = join("src", "gen");

/** Every file under `dir`, as paths relative to it, sorted. */
export function listFiles(dir) {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => relative(dir, join(entry.parentPath ?? entry.path, entry.name)))
    .sort();
}

/** Runs buf generate with buf.gen.yaml into `base`/src/gen; returns the files written there. */
export function generate(base) {
  const buf = join(PACKAGE_DIR, "node_modules", ".bin", "buf");
  execFileSync(buf, ["generate", "--template", "buf.gen.yaml", "--output", base], {
    cwd: PACKAGE_DIR,
    stdio: ["ignore", "inherit", "inherit"],
  });
  return listFiles(join(base, GENERATED_DIR));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  rmSync(join(PACKAGE_DIR, GENERATED_DIR), { recursive: true, force: true });
  for (const file of generate(PACKAGE_DIR)) console.log(`wrote ${join(GENERATED_DIR, file)}`);
}
