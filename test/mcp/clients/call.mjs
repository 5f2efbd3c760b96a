// A one-file MCP client (the official TypeScript SDK's) for the README's
// quick start: it calls one tool through cgledger's /mcp front door and
// prints the answer.
//   node call.mjs URL TOOL [ARGUMENTS-JSON]   (bearer token in CGLEDGER_MCP_TOKEN)
// e.g. node call.mjs http://127.0.0.1:8080/mcp/demo/assistant everything_get-sum '{"a":2,"b":3}'
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, tool, args = "{}"] = process.argv.slice(2);
if (!url || !tool) {
  console.error("usage: node call.mjs URL TOOL [ARGUMENTS-JSON]   (bearer token in CGLEDGER_MCP_TOKEN)");
  process.exit(2);
}
const token = process.env.CGLEDGER_MCP_TOKEN;
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "cgledger-quick-start", version: "1.0.0" });
await client.connect(transport);
const res = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, {
  onprogress: (p) => console.error(`progress ${p.progress}${p.total ? "/" + p.total : ""}: ${p.message ?? ""}`),
  timeout: 300000,
});
for (const c of res.content) {
  console.log(c.type === "text" ? c.text : `[${c.type} ${c.mimeType ?? ""} ${c.data ? c.data.length + " base64 chars" : ""}]`);
}
console.log(JSON.stringify(res._meta));
await client.close();
process.exit(res.isError ? 1 : 0);
