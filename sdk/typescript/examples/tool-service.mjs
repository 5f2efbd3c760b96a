// An example tool service: serves the `greet` tool (examples/greet.yaml), or with CGLEDGER_TOOL=wait
// the `wait` tool (examples/wait.yaml), until interrupted.
//
//   CGLEDGER_CREDS=greet.creds node examples/tool-service.mjs
//
// Environment: CGLEDGER_NATS_URL (default nats://127.0.0.1:4222), CGLEDGER_PROJECT (default
// demo), CGLEDGER_TOOL (greet or wait; default greet), CGLEDGER_CREDS (a credential from
// `cgledger creds issue --role tool --tool <the tool>`: one credential serves one tool).
import { setTimeout as sleep } from "node:timers/promises";
import { ToolFailure, connect, partial, serveTool } from "@cgledger/client";

const handlers = {
  greet: async (call) => {
    const name = call.arguments.name;
    if (typeof name !== "string" || name === "") {
      // Reported failed / bad_request; the worker sees the code and message in the result card.
      throw new ToolFailure("bad_request", "name must be a non-empty string", { taxonomy_code: "I-REQ-001" });
    }
    // call.signal aborts on the worker's cancel and at the call's deadline: pass it to anything slow.
    await sleep(50, undefined, { signal: call.signal });
    return { greeting: `hello, ${name}` };
  },
  wait: async (call) => {
    const { ms, outcome = "success" } = call.arguments;
    if (!Number.isSafeInteger(ms) || ms < 0) throw new ToolFailure("bad_request", "ms must be a non-negative integer", { taxonomy_code: "I-REQ-001" });
    // Aborted by a cancel (reported canceled) or the deadline (reported timeout).
    await sleep(ms, undefined, { signal: call.signal });
    if (outcome === "failed") throw new ToolFailure("internal_error", `failed after ${ms} ms, as asked`, { taxonomy_code: "S-TOOL-ERROR" });
    if (outcome === "partial") return partial({ waited_ms: ms }, "PARTIAL", "a partial result, as asked");
    return { waited_ms: ms };
  },
};

const tool = process.env.CGLEDGER_TOOL ?? "greet";
if (!handlers[tool]) throw new Error(`CGLEDGER_TOOL must be one of ${Object.keys(handlers).join(", ")}, not ${tool}`);
const conn = await connect({
  servers: process.env.CGLEDGER_NATS_URL ?? "nats://127.0.0.1:4222",
  project: process.env.CGLEDGER_PROJECT ?? "demo",
  credsFile: process.env.CGLEDGER_CREDS,
  name: `${tool}-service`,
});

const service = await serveTool(conn, tool, handlers[tool], {
  concurrency: 4,
  onError: (err, where) => console.error(`${tool}: ${where}: ${err}`),
});
console.log(`${tool}: serving ${conn.project} (consumer ${service.consumer.consumer})`);

for (const sig of ["SIGINT", "SIGTERM"]) {
  process.once(sig, async () => {
    await service.stop();
    await conn.close();
    console.log(`${tool}: stopped`);
  });
}
