/**
 * The TypeScript snippets of the repository's README and of its guides under docs/ run as
 * written: each is type-checked against the built client (imported as "oncegate", the package's
 * own name), compiled, run against the real gate with `ONCEGATE_TARGET` set (and
 * `ONCEGATE_ADMIN_TARGET`, its admin socket, for the resolvers' page), and must print on its
 * last line what the comment of its `console.log(...) // expected` line says.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { after, before, describe, it } from "node:test";

import ts from "typescript";

import { startGate, type RunningGate } from "./support/gate.js";
import { PACKAGE_DIR, REPO_ROOT } from "./support/paths.js";

/** README.md and every Markdown file under docs/. */
function pages(): string[] {
  const found = [join(REPO_ROOT, "README.md")];
  const walk = (dir: string) => {
    for (const name of readdirSync(dir).sort()) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else if (name.endsWith(".md")) found.push(path);
    }
  };
  walk(join(REPO_ROOT, "docs"));
  return found;
}

/** Every `ts` block, named by its page. */
function snippets(): { name: string; code: string }[] {
  return pages().flatMap((page) =>
    [...readFileSync(page, "utf8").matchAll(/```ts\n([\s\S]*?)```/g)].map((m, i) => ({
      name: `${relative(REPO_ROOT, page)} #${i + 1}`,
      code: m[1]!,
    })),
  );
}

function expectedOutput(code: string): string {
  const lines = code.split("\n").filter((l) => l.trimStart().startsWith("console.log(") && l.includes("// "));
  assert.equal(lines.length, 1, "one console.log line with its expected output in a comment");
  return lines[0]!.split("// ").slice(1).join("// ").trim();
}

/** Type-checks and compiles `file`; throws with the compiler's messages when it does not check. */
function compile(file: string): void {
  const program = ts.createProgram([file], {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    lib: ["lib.es2022.d.ts"],
    types: ["node"],
    strict: true,
    noUncheckedIndexedAccess: true,
    skipLibCheck: true,
    noEmitOnError: true,
  });
  const diagnostics = ts.getPreEmitDiagnostics(program);
  const text = ts.formatDiagnostics(diagnostics, {
    getCanonicalFileName: (f) => f,
    getCurrentDirectory: () => PACKAGE_DIR,
    getNewLine: () => "\n",
  });
  assert.equal(diagnostics.length, 0, text);
  assert.equal(program.emit().emitSkipped, false);
}

// Inside the package, so that "oncegate" resolves to the package itself (its exports: dist/src).
const WORKDIR = join(PACKAGE_DIR, "dist", "docs-snippets");
let running: RunningGate;

before(async () => {
  running = await startGate();
  mkdirSync(WORKDIR, { recursive: true });
});

after(async () => {
  await running.stop();
  rmSync(WORKDIR, { recursive: true, force: true });
});

describe("the docs' TypeScript snippets", () => {
  const found = snippets();

  it("are there, and every one can run against a gate", () => {
    assert.ok(found.length >= 2, `${found.length} snippets`);
    for (const { name, code } of found) assert.ok(code.includes("ONCEGATE_TARGET"), name);
  });

  for (const [i, { name, code }] of found.entries()) {
    it(`${name} runs and prints what it says`, () => {
      const file = join(WORKDIR, `snippet-${i}.ts`);
      writeFileSync(file, code);
      compile(file);
      const done = spawnSync(process.execPath, [file.replace(/\.ts$/, ".js")], {
        env: {
          ...process.env,
          ONCEGATE_TARGET: running.address,
          ONCEGATE_ADMIN_TARGET: `unix:${join(running.dataDir, "admin.sock")}`,
        },
        encoding: "utf8",
        timeout: 60_000,
      });
      assert.equal(done.status, 0, done.stderr);
      const lines = done.stdout.trim().split("\n");
      assert.equal(lines[lines.length - 1], expectedOutput(code));
    });
  }
});
