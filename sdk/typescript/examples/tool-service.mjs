// An example tool service: serves the `greet` tool (examples/greet.yaml) until interrupted.
//
//   CGLEDGER_CREDS=greet.creds node examples/tool-service.mjs
//
// Environment: CGLEDGER_NATS_URL (default nats://127.0.0.1:4222), CGLEDGER_PROJECT (default
// demo), CGLEDGER_CREDS (a credential from `cgledger creds issue --role tool --tool greet`).
import { ToolFailure, connect, serveTool } from "@cgledger/client";

const conn = await connect({
  servers: process.env.CGLEDGER_NATS_URL ?? "nats://127.0.0.1:4222",
  project: process.env.CGLEDGER_PROJECT ?? "demo",
  credsFile: process.env.CGLEDGER_CREDS,
  name: "greet-service",
});

const service = await serveTool(
  conn,
  "greet",
  async (call) => {
    const name = call.arguments.name;
    if (typeof name !== "string" || name === "") {
      // Reported failed / bad_request; the worker sees the code and message in the result card.
      throw new ToolFailure("bad_request", "name must be a non-empty string", { taxonomy_code: "I-REQ-001" });
    }
    // call.signal aborts on the worker's cancel and at the call's deadline: pass it to anything slow.
    await new Promise((resolve) => setTimeout(resolve, 50));
    call.signal.throwIfAborted();
    return { greeting: `hello, ${name}` };
  },
  { concurrency: 4, onError: (err, where) => console.error(`greet: ${where}: ${err}`) },
);
console.log(`greet: serving ${conn.project} (consumer ${service.consumer.consumer})`);

for (const sig of ["SIGINT", "SIGTERM"]) {
  process.once(sig, async () => {
    await service.stop();
    await conn.close();
    console.log("greet: stopped");
  });
}
