/**
 * The fake bank of the Temporal interceptor's tests, and a worker process to kill mid-activity:
 * `node dist/test/support/temporal-bank.js <gate> <ledger> <workflow id>` runs attempt 1 of
 * activity `pay-1` through the interceptor under `MockActivityEnvironment`, calls the bank (a
 * ledger file, one JSON line per call), says so on stdout, then hangs until killed.
 */

import { appendFileSync, existsSync, readFileSync } from "node:fs";

import { MockActivityEnvironment } from "@temporalio/testing";

import { GateClient } from "../../src/index.js";
import { currentGrant, oncegateInterceptor } from "../../src/temporal/index.js";

export interface Invoice {
  amount: number;
  currency: string;
  to: string;
}

export interface BankCall {
  providerKey: string;
  transferId: string;
  amount: number;
}

/** Every call the fake bank received, in order. */
export function bankCalls(ledger: string): BankCall[] {
  if (!existsSync(ledger)) return [];
  return readFileSync(ledger, "utf8")
    .split("\n")
    .filter((line) => line.length > 0)
    .map((line) => JSON.parse(line) as BankCall);
}

/** The fake bank: records the call under the grant's provider key, returns its receipt. */
export function pay(ledger: string, invoice: Invoice): { transferId: string; amount: number } {
  const transferId = `tr-${bankCalls(ledger).length + 1}`;
  const call: BankCall = { providerKey: currentGrant().providerKey, transferId, amount: invoice.amount };
  appendFileSync(ledger, `${JSON.stringify(call)}\n`);
  return { transferId, amount: invoice.amount };
}

/** Activity info of attempt `attempt` of `pay-1` in `workflowId`'s run `run-1`. */
export function attemptInfo(workflowId: string, attempt: number, heartbeatTimeoutMs?: number) {
  return {
    activityId: "pay-1",
    activityType: "transfer",
    attempt,
    workflowExecution: { workflowId, runId: "run-1" },
    heartbeatTimeoutMs,
  };
}

async function hangAfterPaying(address: string, ledger: string, workflowId: string): Promise<void> {
  const gate = new GateClient(address);
  const interceptor = oncegateInterceptor(gate, {
    activities: { transfer: "payments.transfer" },
    leaseTtlMs: 2_000,
  });
  const env = new MockActivityEnvironment(attemptInfo(workflowId, 1), { interceptors: [interceptor] });
  await env.run(async (invoice: Invoice) => {
    pay(ledger, invoice);
    process.stdout.write("called the bank\n");
    await new Promise(() => {}); // until killed
  }, { amount: 4200, currency: "EUR", to: "DE89" });
}

if (process.argv[1]?.endsWith("temporal-bank.js") && process.argv.length === 5) {
  const [address, ledger, workflowId] = process.argv.slice(2) as [string, string, string];
  await hangAfterPaying(address, ledger, workflowId);
}
