// Commands that do not validate. With credentials only the ledger publishes commands, so these
// run against a `--no-auth` server, where a test may publish on cg.> as a broken dispatcher would.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { headers } from "@nats-io/transport-node";
import { Worker, connect, serveTool, validateCommand } from "../dist/index.js";
import { Server, eventually, toolDef } from "./harness.mjs";

const P = "sdkts-cmd";
const enc = new TextEncoder();
let srv;
let conn;
let svc;
let runs = 0;

function hdrs(record) {
  const h = headers();
  for (const [k, vs] of Object.entries(record)) for (const v of [].concat(vs)) h.append(k, v);
  return h;
}

before(async () => {
  srv = await Server.start(["--no-auth"]);
  await srv.register(P, toolDef("ts_strict", "idempotent"));
  await srv.register(P, toolDef("ts_forged", "idempotent"));
  await srv.register(P, toolDef("ts_copy", "pure"));
  conn = await connect({ servers: srv.natsURL, project: P });
  svc = await serveTool(conn, "ts_strict", () => {
    runs++;
    return {};
  });
});

after(async () => {
  await svc?.stop(1_000);
  await conn?.close();
  await srv?.stop();
});

test("validateCommand lists every violation of a command", () => {
  const { violations, command, identity } = validateCommand(
    "cg.v1.p1.c1.cmd.tool.search",
    hdrs({ "CG-Agent-Id": "a1", "CG-Agent-Turn-Id": "t1", "CG-Turn-Epoch": "01", "cg-step-id": ["s1", "s2"], traceparent: "00-zz" }),
    enc.encode(JSON.stringify({ args: {}, after_execution: "later", agent_id: "other", deadline_unix_ms: -1 })),
    "search",
  );
  assert.equal(command, undefined);
  assert.equal(identity, undefined);
  const got = violations.map((v) => `${v.field} ${v.code}`).sort();
  assert.deepEqual(got, [
    "header.CG-Step-Id duplicate",
    "header.CG-Tool-Call-Id required",
    "header.CG-Turn-Epoch invalid_value",
    "header.traceparent invalid_value",
    "payload.after_execution invalid_value",
    "payload.agent_id identity_mismatch",
    "payload.args forbidden",
    "payload.deadline_unix_ms invalid_type",
    "payload.tool_call_card_id required",
  ]);
  const other = validateCommand("cg.v1.p1.c1.cmd.tool.other", hdrs({}), enc.encode("[]"), "search");
  assert.ok(other.violations.some((v) => v.field === "subject" && v.code === "invalid_subject"));
  assert.ok(other.violations.some((v) => v.field === "payload" && v.code === "invalid_type"));
});

test("a command that names no dispatched call is recorded with command.reject, acked, and never run", async () => {
  const jsm = await jetstreamManager(conn.nc);
  // A bad command (inline args, no call id) and a valid one of a call the ledger never dispatched.
  conn.nc.publish(`cg.v1.${P}.main.cmd.tool.ts_strict`, enc.encode(JSON.stringify({ tool_call_card_id: "cc-x", after_execution: "suspend", args: { a: 1 } })), {
    headers: hdrs({ "CG-Agent-Id": "a1", "CG-Agent-Turn-Id": "t1", "CG-Turn-Epoch": "1" }),
  });
  conn.nc.publish(`cg.v1.${P}.main.cmd.tool.ts_strict`, enc.encode(JSON.stringify({ tool_call_card_id: "cc-y", after_execution: "suspend" })), {
    headers: hdrs({ "CG-Agent-Id": "a1", "CG-Agent-Turn-Id": "t1", "CG-Turn-Epoch": "1", "CG-Tool-Call-Id": "never" }),
  });
  const last = (code) => jsm.streams.getMessage("CG_LEDGER", { last_by_subj: `cg.v1.${P}.main.ledger.rejection.${code}` });
  const bad = await eventually(() => last("bad_request").catch(() => null), 30_000, "the bad command's rejection");
  const rej = bad.json();
  assert.equal(rej.op, "command");
  const fields = rej.violations.map((v) => `${v.field} ${v.code}`).sort();
  assert.deepEqual(fields, ["header.CG-Tool-Call-Id required", "payload.args forbidden"]);
  const unknown = await eventually(() => last("unknown_call").catch(() => null), 30_000, "the unknown call's rejection");
  assert.equal(unknown.json().op, "command");
  assert.equal(unknown.json().request.subject, `cg.v1.${P}.main.cmd.tool.ts_strict`);
  await eventually(async () => {
    const ci = await jsm.consumers.info("CG_LEDGER", svc.consumer.consumer);
    return ci.num_ack_pending === 0 && ci.num_pending === 0 && ci.delivered.consumer_seq >= 2;
  }, 30_000, "both commands acknowledged");
  assert.equal(runs, 0);
});

test("a bad command naming a dispatched call is answered through its report: failed, bad_request, every violation", async () => {
  const release = { fn: () => {} };
  const held = new Promise((r) => (release.fn = r));
  const started = { fn: () => {} };
  const running = new Promise((r) => (started.fn = r));
  const errors = [];
  // Two at once: the dispatched command's handler holds while the forged one is handled.
  const forgedSvc = await serveTool(conn, "ts_forged", async () => {
    started.fn();
    await held;
    return { ran: true };
  }, { concurrency: 2, onError: (err, where) => errors.push(`${where}: ${err.code ?? err.message}`) });
  try {
    const w = new Worker(conn, { agentId: "a1" });
    await w.setRoster();
    await w.dispatch({ tool: "ts_forged", turnId: "t1", callId: "f1", timeoutMs: 60_000 });
    await running;
    conn.nc.publish(`cg.v1.${P}.main.cmd.tool.ts_forged`, enc.encode(JSON.stringify({ tool_call_card_id: "cc-f", after_execution: "later", arguments: {} })), {
      headers: hdrs({ "CG-Agent-Id": "a1", "CG-Agent-Turn-Id": "t1", "CG-Turn-Epoch": "1", "CG-Tool-Call-Id": "f1" }),
    });
    const r = await w.awaitResult({ turnId: "t1", callId: "f1" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "failed");
    assert.equal(r.card.content.error.code, "bad_request");
    assert.equal(r.card.content.error.detail.taxonomy_code, "I-REQ-002");
    const got = r.card.content.error.detail.violations.map((v) => `${v.field} ${v.code}`).sort();
    assert.deepEqual(got, ["payload.after_execution invalid_value", "payload.arguments forbidden"]);
    release.fn();
    // The held run's report loses to the one stored: the service says so and lets the command go.
    await eventually(() => errors.some((e) => e === "report: conflict"), 30_000, "the late report refused");
    await w.close();
  } finally {
    release.fn();
    await forgedSvc.stop(1_000);
  }
});

test("a copy of a command delivered while its call runs is acknowledged, and the tool runs once", async () => {
  const release = { fn: () => {} };
  const held = new Promise((r) => (release.fn = r));
  const started = { fn: () => {} };
  const running = new Promise((r) => (started.fn = r));
  let copyRuns = 0;
  // Two at once, so the copy is delivered while the first delivery's handler holds.
  const copySvc = await serveTool(conn, "ts_copy", async () => {
    copyRuns++;
    started.fn();
    await held;
    return { ran: true };
  }, { concurrency: 2 });
  try {
    const jsm = await jetstreamManager(conn.nc);
    const w = new Worker(conn, { agentId: "a1" });
    await w.setRoster();
    const d = await w.dispatch({ tool: "ts_copy", turnId: "t-copy", callId: "c1", timeoutMs: 60_000 });
    await running;
    // The command as stored, published again without its Nats-Msg-Id (a redelivery in all but name).
    const orig = await jsm.streams.getMessage("CG_LEDGER", { seq: d.command_seq });
    const h = headers();
    for (const [k, vs] of orig.header) if (!k.toLowerCase().startsWith("nats-")) for (const v of vs) h.append(k, v);
    conn.nc.publish(orig.subject, orig.data, { headers: h });
    await eventually(async () => {
      const ci = await jsm.consumers.info("CG_LEDGER", copySvc.consumer.consumer);
      return ci.delivered.stream_seq > d.command_seq && ci.num_ack_pending === 1;
    }, 30_000, "the copy delivered and acknowledged while the first runs");
    release.fn();
    const r = await w.awaitResult({ turnId: "t-copy", callId: "c1" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "success");
    await eventually(async () => (await jsm.consumers.info("CG_LEDGER", copySvc.consumer.consumer)).num_ack_pending === 0, 30_000, "both acknowledged");
    assert.equal(copyRuns, 1, "the copy did not run the tool again");
    await w.close();
  } finally {
    release.fn();
    await copySvc.stop(1_000);
  }
});
