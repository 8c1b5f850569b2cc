/**
 * The real gate binary, started by the tests: `$ONCEGATE_BIN` (default target/debug/oncegate)
 * as `oncegate serve --listen 127.0.0.1:0` on the embedded store in a temporary directory, with
 * the `payments.transfer` policy. It is ready once it prints `listening on ADDR`.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync, createWriteStream, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { REPO_ROOT } from "./paths.js";

export const TRANSFER_KEY_FIELDS = ["/amount", "/currency", "/to"];

export const POLICY = `strict = false

[defaults]
lease_ttl_seconds = 300
retention_seconds = 86400
sliding = true
on_expiry = "reconcile"

[actions."payments.transfer"]
key_fields = ["/amount", "/currency", "/to"]
`;

const STARTUP_TIMEOUT_MS = 60_000;

/** A gate process and its address. */
export interface RunningGate {
  /** `127.0.0.1:PORT`. */
  readonly address: string;
  /** Its data directory (the embedded store, and the signing key it generated). */
  readonly dataDir: string;
  /** Stops the process and removes its directory. */
  stop(): Promise<void>;
  /** Kills the process (SIGKILL, as a crash would) and starts it again on the same address, data
   * directory and policy. */
  restart(): Promise<void>;
}

/** The gate binary the tests run. */
export function gateBinary(): string {
  const binary = process.env["ONCEGATE_BIN"] ?? join(REPO_ROOT, "target", "debug", "oncegate");
  if (!existsSync(binary)) {
    throw new Error(`no gate binary at ${binary}: build it (cargo build --bin oncegate) or set ONCEGATE_BIN`);
  }
  return binary;
}

/** Starts a gate with `policy` (and `files` beside it, by name: the rules it names) and resolves
 * once it listens. */
export async function startGate(policy: string = POLICY, files: Record<string, string> = {}): Promise<RunningGate> {
  const workdir = mkdtempSync(join(tmpdir(), "oncegate-ts-"));
  const config = join(workdir, "policy.toml");
  writeFileSync(config, policy);
  for (const [name, text] of Object.entries(files)) writeFileSync(join(workdir, name), text);
  const logPath = join(workdir, "gate.log");
  const dataDir = join(workdir, "data");
  const launch = (listen: string) => {
    const started = spawn(gateBinary(), ["serve", "--listen", listen, "--data-dir", dataDir, "--config", config], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    started.stderr.pipe(createWriteStream(logPath, { flags: "a" }));
    return started;
  };
  let child = launch("127.0.0.1:0");
  const stop = async () => {
    await terminate(child);
    rmSync(workdir, { recursive: true, force: true });
  };
  try {
    const address = await listeningAddress(child, () => readFileSync(logPath, "utf8"));
    const restart = async () => {
      const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
      child.kill("SIGKILL");
      await exited;
      child = launch(address);
      await listeningAddress(child, () => readFileSync(logPath, "utf8"));
    };
    return { address, dataDir, stop, restart };
  } catch (error) {
    await stop();
    throw error;
  }
}

function listeningAddress(child: ChildProcess, log: () => string): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`the gate did not print "listening on" within ${STARTUP_TIMEOUT_MS} ms:\n${log()}`));
    }, STARTUP_TIMEOUT_MS);
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (line) => {
      const match = /^listening on (\S+)$/.exec(line);
      if (match?.[1] !== undefined) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the gate exited with ${code} before listening:\n${log()}`));
    });
  });
}

async function terminate(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

let counter = 0;

/** A fresh run id, so that tests sharing one gate never share an action. */
export function freshRunId(): string {
  counter += 1;
  return `run-${process.pid}-${Date.now().toString(36)}-${counter}`;
}
