// An example worker: dispatches one `greet` call as agent `bob`, waits for its result, prints
// it and consumes it.
//
//   CGLEDGER_CREDS=bob.creds node examples/worker.mjs world
//
// Environment: CGLEDGER_NATS_URL (default nats://127.0.0.1:4222), CGLEDGER_PROJECT (default
// demo), CGLEDGER_CREDS (a credential from `cgledger creds issue --role worker --agent bob`),
// CGLEDGER_AGENT (default bob). Run it twice with the same CGLEDGER_TURN and CGLEDGER_CALL and
// the second run gets the first run's result: dispatch is idempotent on the call identity.
import { randomUUID } from "node:crypto";
import { LedgerError, Worker, connect } from "@cgledger/client";

const conn = await connect({
  servers: process.env.CGLEDGER_NATS_URL ?? "nats://127.0.0.1:4222",
  project: process.env.CGLEDGER_PROJECT ?? "demo",
  credsFile: process.env.CGLEDGER_CREDS,
  name: "example-worker",
});
const worker = new Worker(conn, { agentId: process.env.CGLEDGER_AGENT ?? "bob" });
const call = { turnId: process.env.CGLEDGER_TURN ?? `turn-${randomUUID()}`, callId: process.env.CGLEDGER_CALL ?? "call-1" };

try {
  await worker.setRoster(); // wakeups for this agent come to this worker
  const d = await worker.dispatch({ tool: "greet", ...call, args: { name: process.argv[2] ?? "world" }, timeoutMs: 10_000 });
  console.log(`dispatched turn ${call.turnId} call ${call.callId}: command seq ${d.command_seq}${d.duplicate ? " (duplicate: the original call)" : ""}`);
  const r = await worker.awaitResult(call, { timeoutMs: 30_000 });
  console.log(`status: ${r.status}`);
  console.log(`result: ${JSON.stringify(r.card.content.result)}`);
  await worker.consume(call);
  process.exitCode = r.status === "success" ? 0 : 1;
} catch (err) {
  console.error(err instanceof LedgerError ? `refused: ${err.message}` : err);
  process.exitCode = 1;
} finally {
  await worker.close();
  await conn.close();
}
