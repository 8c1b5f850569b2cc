/** Where things are, from the compiled test files (dist/test/support/). */

import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

function packageDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "buf.gen.yaml"))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error("clients/typescript not found above the test files");
    dir = parent;
  }
  return dir;
}

/** clients/typescript. */
export const PACKAGE_DIR = packageDir();
/** The repository root. */
export const REPO_ROOT = resolve(PACKAGE_DIR, "..", "..");
/** The fingerprint vectors shared by the Rust, Python and TypeScript implementations. */
export const VECTORS = join(REPO_ROOT, "tests", "vectors", "fingerprints.json");
