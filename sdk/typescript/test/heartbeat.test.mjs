// Heartbeats: a call that runs longer than two ack waits of its tool's consumer is delivered once,
// because the service progress-acks (+WPI) its command while the handler runs. The serve here
// keeps its tool consumers at a 1 s ack wait (--tool-ack-wait), so a 2.5 s call needs them.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Worker, connect, serveTool } from "../dist/index.js";
import { Server, toolDef } from "./harness.mjs";

const P = "sdkhb";
let srv;
const closers = [];

before(async () => {
  srv = await Server.start(["--tool-ack-wait", "1s"]);
  await srv.register(P, toolDef("ts_long", "idempotent"));
});

after(async () => {
  for (const c of closers.reverse()) await c().catch(() => undefined);
  await srv?.stop();
});

test("a call longer than two ack waits is delivered once: the service heartbeats its command", async () => {
  const tc = await srv.creds(P, "tool", ["--tool", "ts_long"]);
  const conn = await connect({ servers: srv.natsURL, project: P, credsFile: tc.file, name: "tool-ts_long" });
  closers.push(() => conn.close());
  const deliveries = [];
  const svc = await serveTool(
    conn,
    "ts_long",
    async (call) => {
      deliveries.push(call.deliveryCount);
      await new Promise((r) => setTimeout(r, 2_500));
      return { slept_ms: 2_500 };
    },
    { concurrency: 2 },
  );
  closers.push(() => svc.stop(1_000));
  assert.equal(svc.consumer.ack_wait_ms, 1_000, "the consumer's ack wait is serve's --tool-ack-wait");

  const wc = await srv.creds(P, "worker", ["--agent", "hb"]);
  const wconn = await connect({ servers: srv.natsURL, project: P, credsFile: wc.file, name: "worker-hb" });
  const w = new Worker(wconn, { agentId: "hb", recoverEveryMs: 1_000 });
  closers.push(async () => {
    await w.close();
    await wconn.close();
  });
  await w.setRoster();
  await w.dispatch({ tool: "ts_long", turnId: "t1", callId: "k1", timeoutMs: 30_000 });
  const r = await w.awaitResult({ turnId: "t1", callId: "k1" }, { timeoutMs: 60_000 });
  assert.equal(r.status, "success");
  assert.deepEqual(r.card.content.result, { slept_ms: 2_500 });
  // A redelivery while the first run went on would have run the handler again (delivery 2).
  assert.deepEqual(deliveries, [1]);
});
