/**
 * A gate's address in every form (`src/address.ts`), against the real gate binary: `host:port`,
 * `http://host:port` and the admin socket as `unix:` and `unix://` reach it; `https://` dials TLS;
 * any other form is refused with the forms it wants, the sentence the CLI and the other clients
 * print.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { ActionState, addressFromEnv, GateClient, parseAddress, Resolver } from "../src/index.js";
import { freshRunId, startGate, type RunningGate } from "./support/gate.js";

const FORMS = "give host:port, http://host:port, https://host:port (TLS) or unix:<path> (a gate's admin socket)";

let running: RunningGate;

before(async () => {
  running = await startGate();
});

after(async () => {
  await running.stop();
});

describe("a gate's address", () => {
  it("reaches the gate in every form", async () => {
    const socket = join(running.dataDir, "admin.sock");
    for (const address of [
      running.address,
      `http://${running.address}`,
      `HTTP://${running.address}/`,
      `unix:${socket}`,
      `unix://${socket}`,
    ]) {
      const gate = new GateClient(address);
      try {
        const record = await gate.getAction({ scope: { agentId: "address-agent", runId: freshRunId() }, key: "k" });
        assert.equal(record.state, ActionState.ABSENT, address);
      } finally {
        gate.close();
      }
    }
  });

  it("reads https as TLS", () => {
    assert.deepEqual(parseAddress("https://gate.example:443"), { kind: "tcp", baseUrl: "https://gate.example:443" });
  });

  it("refuses another form with the forms it wants, in the client and the resolver", () => {
    for (const given of ["grpc://127.0.0.1:1", "127.0.0.1", "http://127.0.0.1", "unix:", "h:99999"]) {
      const refusal = { name: "TypeError", message: `${JSON.stringify(given)} is not a gate address: ${FORMS}` };
      assert.throws(() => new GateClient(given), refusal);
      assert.throws(() => new Resolver(given), refusal);
    }
  });

  it("comes from ONCEGATE_TARGET (workers) and ONCEGATE_ADMIN_TARGET (operators) when not given", async () => {
    const saved = { ...process.env };
    try {
      process.env["ONCEGATE_TARGET"] = running.address;
      process.env["ONCEGATE_ADMIN_TARGET"] = `unix:${join(running.dataDir, "admin.sock")}`;
      const gate = new GateClient();
      const resolver = new Resolver();
      try {
        assert.equal(gate.address, running.address);
        assert.equal(resolver.address, process.env["ONCEGATE_ADMIN_TARGET"]);
        const record = await gate.getAction({ scope: { agentId: "address-agent", runId: freshRunId() }, key: "k" });
        assert.equal(record.state, ActionState.ABSENT);
      } finally {
        gate.close();
        resolver.close();
      }
    } finally {
      process.env = saved;
    }
    assert.equal(addressFromEnv(false, {}), "127.0.0.1:50051");
    assert.equal(addressFromEnv(true, { ONCEGATE_TARGET: "w:1" }), "127.0.0.1:50051");
  });

  it("reads the earlier names with a warning naming the new one", async () => {
    const warned: string[] = [];
    const listener = (warning: Error) => warned.push(warning.message);
    process.on("warning", listener);
    try {
      assert.equal(addressFromEnv(false, { ONCEGATE_SERVER: "s:1" }), "s:1");
      assert.equal(addressFromEnv(false, { ONCEGATE_GATE: "g:1" }), "g:1");
      assert.equal(addressFromEnv(true, { ONCEGATE_SERVER: "s:2" }), "s:2");
      assert.equal(addressFromEnv(false, { ONCEGATE_TARGET: "t:1", ONCEGATE_SERVER: "s:1" }), "t:1");
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.off("warning", listener);
    }
    assert.deepEqual(warned, [
      "ONCEGATE_SERVER is deprecated: set ONCEGATE_TARGET instead",
      "ONCEGATE_GATE is deprecated: set ONCEGATE_TARGET instead",
      "ONCEGATE_SERVER is deprecated: set ONCEGATE_ADMIN_TARGET instead",
    ]);
  });
});
