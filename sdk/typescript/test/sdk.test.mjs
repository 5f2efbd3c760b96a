// The SDK against a real `cgledger serve` (authentication on), as a worker and tool services
// in another process would use it.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { jetstream } from "@nats-io/jetstream";
import {
  AbortError,
  CgLedgerError,
  LedgerError,
  OPS,
  PermissionDeniedError,
  TimeoutError,
  UnknownOpError,
  isRetryable,
  Worker,
  abortReason,
  connect,
  idempotencyKey,
  serveTool,
  prepared,
  success,
} from "../dist/index.js";
import { Server, eventually, toolDef } from "./harness.mjs";

const P = "sdkts";
let srv;
const closers = [];

// serveTool, stopped at the end of the suite too, so a failed test leaves nothing running.
async function serve(conn, tool, handler, opts) {
  const svc = await serveTool(conn, tool, handler, opts);
  closers.push(() => svc.stop(1_000));
  return svc;
}

async function toolConn(tool) {
  const c = await srv.creds(P, "tool", ["--tool", tool]);
  const conn = await connect({ servers: srv.natsURL, project: P, credsFile: c.file, name: `tool-${tool}` });
  assert.equal(conn.inboxPrefix, c.inboxPrefix, "the inbox prefix is the one creds issue names");
  closers.push(() => conn.close());
  return conn;
}

async function worker(agent) {
  const c = await srv.creds(P, "worker", ["--agent", agent]);
  const conn = await connect({ servers: srv.natsURL, project: P, credsFile: c.file, name: `worker-${agent}` });
  const w = new Worker(conn, { agentId: agent, recoverEveryMs: 1_000 });
  await w.setRoster();
  closers.push(async () => {
    await w.close();
    await conn.close();
  });
  return w;
}

function deferred() {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
}

before(async () => {
  srv = await Server.start();
  for (const [name, det] of [
    ["ts_echo", "idempotent"],
    ["ts_slow", "idempotent"],
    ["ts_redeliver", "idempotent"],
    ["ts_result", "idempotent"],
    ["ts_pay", "side_effectful"],
    ["ts_2pc", "idempotent"],
    ["ts_conc", "pure"],
    ["ts_idle", "idempotent"],
  ]) {
    await srv.register(P, toolDef(name, det));
  }
});

after(async () => {
  for (const c of closers.reverse()) await c().catch(() => undefined);
  await srv?.stop();
});

describe("worker and tool service", () => {
  test("dispatch, serve, await, consume; metadata copied verbatim; re-dispatch is idempotent", async () => {
    const conn = await toolConn("ts_echo");
    let runs = 0;
    const svc = await serve(conn, "ts_echo", (call) => {
      runs++;
      return { echo: call.arguments, key: call.idempotencyKey };
    }, { concurrency: 2 });
    const w = await worker("agent-echo");
    const metadata = { trace_id: "tr-ü-<&>-\u2028-✓", parent_step_id: "ps1", step_id: "s1" };
    const opts = { tool: "ts_echo", turnId: "t1", callId: "k1", args: { q: "nats", n: 3 }, metadata, stepId: "s1" };
    const d = await w.dispatch(opts);
    assert.equal(d.duplicate, false);
    assert.ok(d.deadline_unix_ms > Date.now());

    const r = await w.awaitResult({ turnId: "t1", callId: "k1" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "success");
    assert.deepEqual(r.card.content.result, { echo: { q: "nats", n: 3 }, key: idempotencyKey(P, "t1", "k1") });
    assert.deepEqual(r.card.metadata, metadata);
    assert.equal(r.card.author_id, "cgledger-ts.ts_echo");
    assert.equal(r.card.function_name, "ts_echo");

    const again = await w.dispatch(opts);
    assert.equal(again.duplicate, true);
    assert.equal(again.command_seq, d.command_seq);
    await assert.rejects(w.dispatch({ ...opts, args: { q: "other" } }), (e) => e instanceof LedgerError && e.code === "conflict");

    const c1 = await w.consume({ turnId: "t1", callId: "k1" });
    assert.equal(c1.duplicate, false);
    assert.equal(c1.report_seq, r.record.claim.seq);
    assert.equal((await w.consume({ turnId: "t1", callId: "k1" })).duplicate, true);
    assert.deepEqual(await w.pending(), []);
    await svc.stop();
    assert.equal(runs, 1);
  });

  test("a refused dispatch is a LedgerError listing every violation", async () => {
    const w = await worker("agent-bad");
    const err = await w
      .dispatch({ tool: "ts_echo", turnId: "t1", callId: "k.1", afterExecution: "later", epoch: "01" })
      .then(() => assert.fail("dispatch was accepted"), (e) => e);
    assert.ok(err instanceof LedgerError, String(err));
    assert.equal(err.code, "bad_request");
    assert.ok(err.rejectionSeq > 0);
    assert.ok(err.has("invalid_token", "header.CG-Tool-Call-Id"), JSON.stringify(err.violations));
    assert.ok(err.has("invalid_value", "payload.after_execution"), JSON.stringify(err.violations));
    assert.ok(err.violations.some((v) => v.field === "header.CG-Turn-Epoch"), JSON.stringify(err.violations));
  });

  test("dispatch checks refuse an unknown tool and arguments failing the schema, each on record", async () => {
    await srv.register(P, toolDef("ts_strict", "idempotent", {
      parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"], additionalProperties: false },
    }));
    const w = await worker("agent-checks");
    const checks = { registered: true, arguments: true };
    const unknown = await w
      .dispatch({ tool: "ts_strikt", turnId: "t1", callId: "c1", checks })
      .then(() => assert.fail("dispatch was accepted"), (e) => e);
    assert.ok(unknown instanceof LedgerError, String(unknown));
    assert.equal(unknown.code, "not_found");
    assert.ok(unknown.rejectionSeq > 0);
    assert.ok(unknown.has("not_found", "card.content.tool_name"), JSON.stringify(unknown.violations));
    const bad = await w
      .dispatch({ tool: "ts_strict", turnId: "t1", callId: "c2", args: { q: 1, x: true }, checks })
      .then(() => assert.fail("dispatch was accepted"), (e) => e);
    assert.equal(bad.code, "bad_request");
    assert.ok(bad.rejectionSeq > 0);
    assert.ok(bad.has("type", "card.content.arguments.q"), JSON.stringify(bad.violations));
    assert.ok(bad.has("additionalProperties", "card.content.arguments"), JSON.stringify(bad.violations));
    const ok = await w.dispatch({ tool: "ts_strict", turnId: "t1", callId: "c3", args: { q: "x" }, checks });
    assert.equal(ok.duplicate, false);
    assert.equal((await w.dispatch({ tool: "ts_strict", turnId: "t1", callId: "c3", args: { q: "x" }, checks })).duplicate, true);
  });

  test("a cancel reaches the handler's AbortSignal and the call ends canceled", async () => {
    const conn = await toolConn("ts_slow");
    const started = deferred();
    let reason;
    const svc = await serve(conn, "ts_slow", (call) =>
      new Promise((_, reject) => {
        started.resolve();
        call.signal.addEventListener("abort", () => {
          reason = abortReason(call.signal);
          reject(call.signal.reason);
        });
      }), { concurrency: 2 });
    const w = await worker("agent-cancel");
    await w.dispatch({ tool: "ts_slow", turnId: "t1", callId: "c1", timeoutMs: 60_000 });
    await started.promise;
    const c = await w.cancel({ turnId: "t1", callId: "c1" }, "user stop");
    assert.equal(c.duplicate, false);
    const r = await w.awaitResult({ turnId: "t1", callId: "c1" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "canceled");
    assert.equal(r.card.content.error.code, "canceled");
    assert.equal(reason, "canceled");
    await svc.stop();
  });

  test("the command's deadline aborts the handler and the call is reported timeout once", async () => {
    const conn = await toolConn("ts_slow");
    let runs = 0;
    let reason;
    const svc = await serve(conn, "ts_slow", (call) =>
      new Promise((_, reject) => {
        runs++;
        call.signal.addEventListener("abort", () => {
          reason = abortReason(call.signal);
          reject(call.signal.reason);
        });
      }));
    const w = await worker("agent-deadline");
    // Long enough that a loaded machine (CI runs every package at once on 2 cores) still picks
    // the command up, and arms the handler's deadline, well before the deadline passes.
    const d = await w.dispatch({ tool: "ts_slow", turnId: "t1", callId: "d1", timeoutMs: 8_000 });
    const r = await w.awaitResult({ turnId: "t1", callId: "d1" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "timeout");
    assert.equal(r.card.content.error.code, "tool_timeout");
    assert.equal(r.card.content.error.detail.taxonomy_code, "R-TIMEOUT-001");
    assert.equal(r.record.claim.source_id, "cgledger-ts.ts_slow");
    assert.equal(reason, "timeout");
    // Past the ledger's own deadline (+5 s grace) the service's report still stands alone.
    await eventually(() => Date.now() > d.deadline_unix_ms + 6_000, 30_000, "the ledger's grace passed");
    const rec = await w.callGet({ turnId: "t1", callId: "d1" });
    assert.equal(rec.claim.seq, r.record.claim.seq);
    assert.equal(rec.claim.source_id, "cgledger-ts.ts_slow");
    const pending = (await w.pending()).filter((i) => i.tool_call_id === "d1");
    assert.equal(pending.length, 1);
    assert.equal(runs, 1);
    await svc.stop();
  });

  test("a command redelivered after its report (the first service died before its ack) is not run again", async () => {
    const conn = await toolConn("ts_redeliver");
    const w = await worker("agent-redeliver");
    await w.dispatch({ tool: "ts_redeliver", turnId: "t1", callId: "r1", metadata: { trace_id: "x" } });
    // The first service: pulls the command, puts its card, reports, and dies before acking (nak).
    const info = await conn.request("ts_redeliver", "tool.consumer", {});
    const js = jetstream(conn.nc, { apiPrefix: info.api_prefix });
    const consumer = await js.consumers.get(info.stream, info.consumer);
    const m = await consumer.next({ expires: 10_000 });
    assert.ok(m, "the command was delivered");
    const call = await conn.request("ts_redeliver", "call.get", { project_id: P, agent_turn_id: "t1", tool_call_id: "r1" });
    await conn.request("ts_redeliver", "card.put", {
      card_id: "res-first", project_id: P, type: "tool.result", author_id: "first", function_name: "ts_redeliver",
      agent_turn_id: "t1", tool_call_id: "r1", content: { status: "success", result: { by: "first" } }, metadata: call.card_metadata,
    });
    const hdr = {};
    for (const [k, v] of m.headers) if (k.startsWith("CG-Agent") || k === "CG-Turn-Epoch" || k === "CG-Tool-Call-Id") hdr[k] = v[0];
    const rep = await conn.request("ts_redeliver", "report",
      { status: "success", after_execution: "suspend", tool_result_card_id: "res-first" },
      { ...hdr, "CG-Project-Id": P, "CG-Channel-Id": "main", "CG-Source-Id": "first", "CG-Source-Function": "ts_redeliver" });
    m.nak();

    let runs = 0;
    const svc = await serve(conn, "ts_redeliver", () => {
      runs++;
      return success({ by: "second" });
    });
    await eventually(async () => {
      const ci = await consumer.info();
      return ci.num_ack_pending === 0 && ci.num_pending === 0 && ci.delivered.consumer_seq >= 2;
    }, 30_000, "the redelivery acknowledged");
    const r = await w.awaitResult({ turnId: "t1", callId: "r1" }, { timeoutMs: 30_000 });
    assert.equal(r.record.claim.seq, rep.seq);
    assert.deepEqual(r.card.content.result, { by: "first" });
    assert.equal(runs, 0);
    await svc.stop();
  });
});

describe("report.result", () => {
  test("one request stores the card and the report together; a retry is a duplicate; refusals name body.card and body.report", async () => {
    const conn = await toolConn("ts_result");
    const w = await worker("agent-result");
    await w.dispatch({ tool: "ts_result", turnId: "t-rr", callId: "rr1", metadata: { trace_id: "tr-rr1" } });
    const info = await conn.request("ts_result", "tool.consumer", {});
    const js = jetstream(conn.nc, { apiPrefix: info.api_prefix });
    const consumer = await js.consumers.get(info.stream, info.consumer);
    const m = await consumer.next({ expires: 10_000 });
    assert.ok(m, "the command was delivered");
    const call = await conn.request("ts_result", "call.get", { project_id: P, agent_turn_id: "t-rr", tool_call_id: "rr1" });
    const hdrs = { "CG-Project-Id": P, "CG-Channel-Id": "main", "CG-Source-Id": "svc", "CG-Source-Function": "ts_result" };
    for (const [k, v] of m.headers) if (k.startsWith("CG-Agent") || k === "CG-Turn-Epoch" || k === "CG-Tool-Call-Id") hdrs[k] = v[0];
    const card = {
      card_id: "res-rr1", project_id: P, type: "tool.result", author_id: "svc", function_name: "ts_result",
      agent_turn_id: "t-rr", tool_call_id: "rr1", content: { status: "success", result: { n: 1 } }, metadata: call.card_metadata,
    };
    const report = { status: "success", after_execution: "suspend" };

    const bad = await conn
      .reportResult("ts_result", { card: { ...card, author_id: "other" }, report: { ...report, after_execution: "later" } }, hdrs)
      .then(() => assert.fail("report.result was accepted"), (e) => e);
    assert.ok(bad instanceof LedgerError, String(bad));
    assert.equal(bad.code, "bad_request");
    assert.ok(bad.has("mismatch", "body.card.author_id"), JSON.stringify(bad.violations));
    assert.ok(bad.has("invalid_value", "body.report.after_execution"), JSON.stringify(bad.violations));

    const r = await conn.reportResult("ts_result", { card, report }, hdrs);
    assert.equal(r.duplicate, false);
    assert.equal(r.card_seq, r.seq - 1, "the card and the report are stored together");
    assert.equal(r.tool_result_card_id, "res-rr1");
    assert.equal(r.card_duplicate, undefined);
    m.ack();

    const again = await conn.reportResult("ts_result", { card, report: { ...report, tool_result_card_id: "res-rr1" } }, hdrs);
    assert.equal(again.duplicate, true);
    assert.equal(again.card_duplicate, true);
    assert.equal(again.seq, r.seq);
    assert.equal(again.card_seq, r.card_seq);

    const other = await conn
      .reportResult("ts_result", { card: { ...card, content: { status: "success", result: { n: 2 } } }, report }, hdrs)
      .then(() => assert.fail("a different card under the id was accepted"), (e) => e);
    assert.ok(other instanceof LedgerError, String(other));
    assert.equal(other.code, "conflict");
    assert.ok(other.has("conflict", "body.card.card_id"), JSON.stringify(other.violations));

    const res = await w.awaitResult({ turnId: "t-rr", callId: "rr1" }, { timeoutMs: 30_000 });
    assert.equal(res.record.claim.seq, r.seq);
    assert.deepEqual(res.card.content.result, { n: 1 });
  });
});

describe("errors of awaitResult and of unknown ops", () => {
  test("a timeout is a TimeoutError (code timeout); an abort an AbortError with the signal's reason; both CgLedgerErrors", async () => {
    const w = await worker("agent-errs");
    // Dispatched to a tool nobody serves: no result comes.
    const ref = { turnId: "t-idle", callId: "never" };
    await w.dispatch({ tool: "ts_idle", turnId: ref.turnId, callId: ref.callId, args: {} });
    await assert.rejects(w.awaitResult(ref, { timeoutMs: 50 }), (e) =>
      e instanceof TimeoutError && e instanceof CgLedgerError && e.code === "timeout" && e.timeoutMs === 50 && e.callId === "never");

    const ac = new AbortController();
    const waiting = w.awaitResult(ref, { signal: ac.signal });
    ac.abort(new Error("user left"));
    await assert.rejects(waiting, (e) =>
      e instanceof AbortError && e instanceof CgLedgerError && e.name === "AbortError" && e.code === "aborted" && e.cause.message === "user left");
    await assert.rejects(w.awaitResult(ref, { signal: AbortSignal.abort() }), (e) => e instanceof AbortError && e.cause.name === "AbortError",
      "a signal aborted already");
  });

  test("an op outside the protocol's list is refused before sending, not retryable", async () => {
    const c = await srv.creds(P, "worker", ["--agent", "agent-op"]);
    const conn = await connect({ servers: srv.natsURL, project: P, credsFile: c.file, name: "worker-op" });
    closers.push(() => conn.close());
    const before = conn.nc.stats().outMsgs;
    await assert.rejects(conn.request("agent-op", "call.gte", {}), (e) => {
      assert.ok(e instanceof UnknownOpError && e instanceof CgLedgerError, String(e));
      assert.equal(e.code, "unknown_op");
      assert.equal(isRetryable(e), false);
      return true;
    });
    assert.equal(conn.nc.stats().outMsgs, before, "nothing was sent");
    assert.ok(OPS.includes("call.get") && OPS.includes("conformance.observe"));
    await assert.rejects(conn.request("agent-op", "call.get", {}), (e) => e instanceof LedgerError && e.code === "bad_request", "a known op is sent");
  });
});

describe("concurrency", () => {
  test("a service with concurrency 3 runs three calls at once", async () => {
    const conn = await toolConn("ts_conc");
    let inFlight = 0;
    let most = 0;
    const all = deferred();
    const svc = await serve(conn, "ts_conc", async (call) => {
      inFlight++;
      most = Math.max(most, inFlight);
      if (inFlight === 3) all.resolve();
      await all.promise; // each call holds until all three run at once
      inFlight--;
      return { n: call.arguments.n };
    }, { concurrency: 3 });
    const w = await worker("agent-conc");
    const refs = [1, 2, 3].map((n) => ({ turnId: "t1", callId: `n${n}` }));
    await Promise.all(refs.map((r, i) => w.dispatch({ tool: "ts_conc", ...r, args: { n: i + 1 } })));
    const results = await Promise.all(refs.map((r) => w.awaitResult(r, { timeoutMs: 30_000 })));
    assert.deepEqual(results.map((r) => r.card.content.result.n), [1, 2, 3]);
    assert.equal(most, 3);
    await svc.stop();
  });
});

describe("missed wakeups", () => {
  test("after a reconnect the worker finds a result whose wakeup went elsewhere on its pending list", async () => {
    const conn = await toolConn("ts_echo");
    const release = deferred();
    const started = deferred();
    const svc = await serve(conn, "ts_echo", async () => {
      started.resolve();
      await release.promise;
      return { late: true };
    });
    const c = await srv.creds(P, "worker", ["--agent", "agent-missed"]);
    const wconn = await connect({ servers: srv.natsURL, project: P, credsFile: c.file });
    closers.push(() => wconn.close());
    // Only a reconnect (or awaitResult's first look) lists the Inbox here.
    const w = new Worker(wconn, { agentId: "agent-missed", recoverEveryMs: 600_000 });
    closers.push(() => w.close());
    await w.setRoster("elsewhere"); // its wakeups go to another worker target
    await w.dispatch({ tool: "ts_echo", turnId: "t1", callId: "m1" });
    let settled = false;
    const replies = wconn.nc.stats().inMsgs;
    const result = w.awaitResult({ turnId: "t1", callId: "m1" }, { timeoutMs: 60_000 }).finally(() => (settled = true));
    // awaitResult's first look (call.get) is answered before the call is reported.
    await eventually(() => wconn.nc.stats().inMsgs > replies, 30_000, "awaitResult's first look answered");
    await started.promise;
    release.resolve();
    await eventually(async () => (await w.callGet({ turnId: "t1", callId: "m1" })).state === "woken", 30_000, "the call is reported");
    assert.equal(settled, false, "no wakeup reached this worker");
    await wconn.nc.reconnect();
    const r = await result;
    assert.equal(r.via, "inbox");
    assert.deepEqual(r.card.content.result, { late: true });
    await svc.stop();
  });
});

describe("side_effectful tools", () => {
  let conn;
  let consumer;
  before(async () => {
    conn = await toolConn("ts_pay");
    const info = await conn.request("ts_pay", "tool.consumer", {});
    consumer = await jetstream(conn.nc, { apiPrefix: info.api_prefix }).consumers.get(info.stream, info.consumer);
  });

  // A first service that recorded its attempt and died mid-effect (nak: no ack, no report).
  async function diedMidEffect(callId) {
    const m = await consumer.next({ expires: 10_000 });
    assert.ok(m, "the command was delivered");
    assert.equal(m.headers.get("CG-Tool-Call-Id"), callId);
    const a = await conn.request("ts_pay", "attempt.start", { project_id: P, agent_turn_id: "t1", tool_call_id: callId, executor_id: "first" });
    assert.equal(a.started, true);
    m.nak();
  }

  test("a normal run records its attempt first", async () => {
    const w = await worker("agent-pay");
    let seen;
    const svc = await serve(conn, "ts_pay", (call) => {
      seen = { attempt: call.attempt, key: call.idempotencyKey };
      return { paid: true };
    });
    await w.dispatch({ tool: "ts_pay", turnId: "t1", callId: "p1" });
    const r = await w.awaitResult({ turnId: "t1", callId: "p1" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "success");
    assert.deepEqual(seen, { attempt: 1, key: idempotencyKey(P, "t1", "p1") });
    assert.equal(r.record.outcome, undefined);
    await svc.stop();
  });

  test("an attempt left open is reconciled, not run again", async () => {
    const w = await worker("agent-pay2");
    await w.dispatch({ tool: "ts_pay", turnId: "t1", callId: "p2" });
    await diedMidEffect("p2");
    let runs = 0;
    let reconciled;
    const svc = await serve(conn, "ts_pay", () => {
      runs++;
      return { paid: "again" };
    }, {
      reconcile: (call, attempt) => {
        reconciled = { attempt, key: call.idempotencyKey };
        return { done: true, outcome: { paid: true, found: "upstream" } };
      },
    });
    const r = await w.awaitResult({ turnId: "t1", callId: "p2" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "success");
    assert.deepEqual(r.card.content.result, { paid: true, found: "upstream" });
    assert.equal(r.record.outcome, "reconciled");
    assert.deepEqual(reconciled, { attempt: 1, key: idempotencyKey(P, "t1", "p2") });
    assert.equal(runs, 0);
    await svc.stop();
  });

  test("without a reconcile an open attempt is reported outcome_unknown", async () => {
    const w = await worker("agent-pay3");
    await w.dispatch({ tool: "ts_pay", turnId: "t1", callId: "p3" });
    await diedMidEffect("p3");
    let runs = 0;
    const svc = await serve(conn, "ts_pay", () => {
      runs++;
      return {};
    });
    const r = await w.awaitResult({ turnId: "t1", callId: "p3" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "failed");
    assert.equal(r.card.content.error.code, "internal_error");
    assert.equal(r.card.content.error.detail.taxonomy_code, "S-TOOL-OUTCOME-UNKNOWN");
    assert.equal(r.record.outcome, "outcome_unknown");
    assert.equal(runs, 0);
    await svc.stop();
  });
});

describe("two-phase commit", () => {
  test("a prepared call waits for the worker's commit, and onDecision's answer is its result", async () => {
    const conn = await toolConn("ts_2pc");
    let decided;
    const svc = await serve(conn, "ts_2pc", (call) => prepared(`tok-${call.callId}`, Math.min(call.deadlineUnixMs, Date.now() + 20_000)), {
      onDecision: (d) => {
        decided = { decision: d.decision, by: d.decidedBy, token: d.commitToken, args: d.call.arguments };
        return { committed: d.decision === "commit" };
      },
    });
    const w = await worker("agent-2pc");
    await w.dispatch({ tool: "ts_2pc", turnId: "t1", callId: "q1", args: { amount: 5 }, timeoutMs: 60_000 });
    const rec = await eventually(async () => {
      const r = await w.callGet({ turnId: "t1", callId: "q1" }, true);
      return r.two_phase?.state === "prepared" ? r : null;
    }, 30_000, "the call is prepared");
    assert.equal(rec.state, "dispatched");
    assert.equal(rec.two_phase.commit_token, "tok-q1");
    const c = await w.commit({ turnId: "t1", callId: "q1" }, "tok-q1");
    assert.equal(c.decision, "commit");
    const r = await w.awaitResult({ turnId: "t1", callId: "q1" }, { timeoutMs: 30_000 });
    assert.equal(r.status, "success");
    assert.deepEqual(r.card.content.result, { committed: true });
    assert.deepEqual(decided, { decision: "commit", by: "worker", token: "tok-q1", args: { amount: 5 } });
    await svc.stop();
  });
});

describe("credentials", () => {
  test("a credential of another project is refused by NATS, and nothing reaches the ledger", async () => {
    const other = await srv.creds("other-project", "worker", ["--agent", "a1"]);
    const conn = await connect({ servers: srv.natsURL, project: P, credsFile: other.file });
    closers.push(() => conn.close());
    const w = new Worker(conn, { agentId: "a1" });
    await assert.rejects(w.dispatch({ tool: "ts_echo", turnId: "t1", callId: "x1" }), (e) => e instanceof PermissionDeniedError && e.subject === `cgledger.v1.${P}.a1.dispatch`);
    // Its own project answers (unknown_call: it was never dispatched there).
    const own = await connect({ servers: srv.natsURL, project: "other-project", credsFile: other.file });
    closers.push(() => own.close());
    await assert.rejects(new Worker(own, { agentId: "a1" }).callGet({ turnId: "t1", callId: "x1" }), (e) => e instanceof LedgerError && e.code === "unknown_call");
  });
});
