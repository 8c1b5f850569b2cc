// The TypeScript MCP SDK's client (v2) in front of `oncegate mcp`, for tests/mcp/test_typescript.py:
// connects to the URL given, at the revision given ("2026-07-28" pinned, or "legacy"), calls
// `create_ticket` twice with the same arguments, and prints the negotiated version and both
// results as one JSON line.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, revision] = process.argv.slice(2);
const mode = revision === "legacy" ? "legacy" : { pin: revision };
const client = new Client(
  { name: "oncegate-ts-test", version: "1.0.0" },
  { versionNegotiation: { mode } },
);
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const results = [];
for (let i = 0; i < 2; i++) {
  results.push(await client.callTool({ name: "create_ticket", arguments: { title: "from TypeScript" } }));
}
console.log(JSON.stringify({ version: client.getNegotiatedProtocolVersion(), results }));
await client.close();
