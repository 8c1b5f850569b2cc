/**
 * A gate's address in every form (`src/address.ts`), against the real gate binary: `host:port`,
 * `http://host:port` and the admin socket as `unix:` and `unix://` reach it; `https://` dials TLS;
 * any other form is refused with the forms it wants, the sentence the CLI and the other clients
 * print.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { ActionState, GateClient, parseAddress, Resolver } from "../src/index.js";
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
});
