/**
 * A Vercel AI SDK agent whose payment tool runs at most once, whatever the model and the process
 * do: `tool({ execute })` wrapped by oncegate's guard, driven by the SDK's own mock model (no
 * network, no API key) against a real gate.
 *
 *   node dist/ai-sdk-tool.js --spawn ../../target/debug/oncegate   # starts and stops a gate
 *   node dist/ai-sdk-tool.js --target 127.0.0.1:50051              # or uses yours
 *   ONCEGATE_TARGET=127.0.0.1:50051 node dist/ai-sdk-tool.js       # the same, from the environment
 *
 * It exits 1 if the bank was ever asked to pay twice.
 */

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { generateText, stepCountIs, tool, type ToolExecutionOptions } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { GateClient, modelMessage, type Grant } from "oncegate";
import { z } from "zod";

/** What the application passes to every tool through `experimental_context`. */
interface RunContext {
  /** The workflow run: the same across retries, restarts and re-played conversations. */
  runId: string;
}

/** A fake bank that honours idempotency keys, as real payment providers do. */
class Bank {
  readonly transfers: Array<{ id: string; amount: number; providerKey: string }> = [];
  calls = 0;

  transfer(amount: number, providerKey: string): { id: string; amount: number } {
    this.calls += 1;
    const known = this.transfers.find((transfer) => transfer.providerKey === providerKey);
    if (known !== undefined) return { id: known.id, amount: known.amount };
    const id = `tr-${String(this.transfers.length + 1).padStart(4, "0")}`;
    this.transfers.push({ id, amount, providerKey });
    console.log(`   bank   paid ${(amount / 100).toFixed(2)} EUR as ${id}`);
    return { id, amount };
  }
}

/**
 * Wraps a tool's `execute` so that each logical call runs at most once: the gate names the action
 * by the workflow run (from the run context, never `toolCallId`, which is new on every retry) and
 * the tool's input, and a retry gets the first call's result back without running anything. When
 * the gate stops the call (held for approval, denied, over budget, key reused, outcome unknown),
 * the model is told what happened and what to do (`modelMessage`); any other error is thrown.
 */
function runsOnce<INPUT extends object, OUTPUT>(
  gate: GateClient,
  action: string,
  agentId: string,
  execute: (input: INPUT, grant: Grant) => Promise<OUTPUT> | OUTPUT,
) {
  return async (input: INPUT, options: ToolExecutionOptions): Promise<OUTPUT | { notExecuted: string }> => {
    const { runId } = options.experimental_context as RunContext;
    let outcome;
    try {
      outcome = await gate.runOnce({ agentId, runId, action, params: input }, (grant) => execute(input, grant));
    } catch (error) {
      const told = modelMessage(error);
      if (told === undefined) throw error;
      console.log(`   gate   ${options.toolCallId}: not executed; the model is told: ${told}`);
      return { notExecuted: told };
    }
    console.log(
      outcome.kind === "Executed"
        ? `   gate   ${options.toolCallId}: granted (fencing ${outcome.grant.fencing}); the tool ran`
        : `   gate   ${options.toolCallId}: ALREADY_COMPLETED, replayed the receipt; the tool did not run`,
    );
    return outcome.result;
  };
}

function toolCallStep(toolCallId: string, input: object) {
  return {
    content: [{ type: "tool-call" as const, toolCallId, toolName: "transfer", input: JSON.stringify(input) }],
    finishReason: { unified: "tool-calls" as const, raw: "tool_calls" },
    usage: USAGE,
    warnings: [],
  };
}

function textStep(text: string) {
  return { content: [{ type: "text" as const, text }], finishReason: { unified: "stop" as const, raw: "stop" }, usage: USAGE, warnings: [] };
}

const USAGE = {
  inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 5, text: 5, reasoning: 0 },
};

/** A mock model that plays `steps` in order, one per model call. */
function scriptedModel(steps: ReturnType<typeof toolCallStep | typeof textStep>[]) {
  let next = 0;
  return new MockLanguageModelV3({
    doGenerate: async () => {
      const step = steps[next++];
      if (step === undefined) throw new Error("the script ran out of steps");
      return step;
    },
  });
}

async function story(gate: GateClient): Promise<boolean> {
  const bank = new Bank();
  const transfer = tool({
    description: "Pay an invoice by bank transfer",
    inputSchema: z.object({ invoice: z.string(), amount: z.number().int(), to: z.string() }),
    execute: runsOnce(gate, "payments.transfer", "billing-agent", (input: { amount: number }, grant) =>
      // The bank dedups too: it gets the gate's provider key as its own idempotency key.
      bank.transfer(input.amount, grant.providerKey),
    ),
  });
  const context: RunContext = { runId: `run-${Date.now().toString(36)}` };
  const invoice = { invoice: "invoice-41", amount: 4200, to: "DE89370400440532013000" };
  console.log(`An AI SDK agent pays invoice 41 (workflow run ${context.runId})\n`);

  console.log("1. The model calls the tool, then calls it again (a new toolCallId, the same input)");
  const first = await generateText({
    model: scriptedModel([toolCallStep("call-1", invoice), toolCallStep("call-2", invoice), textStep("Invoice 41 is paid.")]),
    tools: { transfer },
    prompt: "Pay invoice 41: 42.00 EUR to DE89370400440532013000.",
    stopWhen: stepCountIs(5),
    experimental_context: context,
  });
  const results = first.steps.flatMap((step) => step.toolResults.map((result) => JSON.stringify(result.output)));
  console.log(`   agent  tool results the model saw: ${results.join(", ")}`);

  console.log("\n2. The worker restarts and the run is played again from the start");
  await generateText({
    model: scriptedModel([toolCallStep("call-7", invoice), textStep("Invoice 41 is paid.")]),
    tools: { transfer },
    prompt: "Pay invoice 41: 42.00 EUR to DE89370400440532013000.",
    stopWhen: stepCountIs(5),
    experimental_context: context,
  });

  const once = bank.calls === 1 && new Set(results).size === 1;
  console.log(`\n${bank.calls} bank call${bank.calls === 1 ? "" : "s"} for 3 tool calls; ${once ? "nothing paid twice." : "PAID TWICE."}`);
  return once;
}

/** Starts `binary` on a free port with the embedded store in a temporary directory. */
async function spawnGate(binary: string): Promise<{ address: string; stop: () => void }> {
  const dataDir = mkdtempSync(join(tmpdir(), "oncegate-example-"));
  const child = spawn(binary, ["serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir], {
    stdio: ["ignore", "pipe", "inherit"],
    env: { ...process.env, RUST_LOG: "warn" },
  });
  const address = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout }).on("line", (line) => {
      const match = /^listening on (\S+)$/.exec(line);
      if (match?.[1]) resolve(match[1]);
    });
    child.once("exit", (code) => reject(new Error(`the gate exited with ${code}`)));
  });
  return {
    address,
    stop: () => {
      child.kill("SIGTERM");
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

async function main(argv: string[]): Promise<number> {
  const [flag, value] = argv;
  const fromEnv = flag === undefined && process.env["ONCEGATE_TARGET"] !== undefined;
  if (!fromEnv && ((flag !== "--spawn" && flag !== "--target") || !value)) {
    console.error("usage: ai-sdk-tool.js --spawn PATH/TO/oncegate | --target ADDRESS (or ONCEGATE_TARGET set)");
    return 64;
  }
  const spawned = flag === "--spawn" ? await spawnGate(value!) : undefined;
  // No flag: the client reads ONCEGATE_TARGET.
  const gate = new GateClient(spawned?.address ?? value);
  try {
    return (await story(gate)) ? 0 : 1;
  } finally {
    gate.close();
    spawned?.stop();
  }
}

process.exitCode = await main(process.argv.slice(2));
