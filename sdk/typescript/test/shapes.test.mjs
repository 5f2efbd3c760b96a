// Ties the SDK's hand-written protocol shapes (src/protocol.ts, whose key lists tsc ties to the
// interfaces) to docs/protocol.md: every key of the document's examples must be a declared key,
// and every declared key must be named in the document's section. The OpenAPI-generated types
// are checked by `gen-types.mjs --check` (npm test's pretest).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import * as sdk from "../dist/index.js";

const docs = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "docs");
const protocol = readFileSync(join(docs, "protocol.md"), "utf8");
const openapi = JSON.parse(readFileSync(join(docs, "openapi.json"), "utf8"));

/** The text of the section under a heading (up to the next heading of the same or a higher level). */
function section(heading) {
  const lines = protocol.split("\n");
  const start = lines.findIndex((l) => l.trim() === heading);
  assert.ok(start >= 0, `protocol.md has no heading ${heading}`);
  const level = heading.match(/^#+/)[0].length;
  let end = lines.length;
  for (let i = start + 1; i < lines.length; i++) {
    const m = /^(#+) /.exec(lines[i]);
    if (m && m[1].length <= level) {
      end = i;
      break;
    }
  }
  return lines.slice(start, end).join("\n");
}

/** The JSON examples of a section, parsed; placeholders such as `{ ...the card... }` and `…` read as nothing. */
function examples(text) {
  const out = [];
  for (const m of text.matchAll(/```json\n([\s\S]*?)```/g)) {
    for (const chunk of m[1].split(/\n(?=\{)/)) {
      const cleaned = chunk
        .replace(/\{\s*\.\.\.[^{}]*\.\.\.\s*\}/g, "{}")
        .replace(/,\s*…\s*\}/g, "}")
        .trim();
      try {
        out.push(JSON.parse(cleaned));
      } catch {
        // an example that is not JSON (several objects on one line, prose): not a shape
      }
    }
  }
  return out;
}

function checkShape(name, keys, heading, pick = (exs) => exs) {
  const text = section(heading);
  for (const k of keys) {
    assert.ok(text.includes(`"${k}"`) || text.includes(`\`${k}\``), `${name}: key ${k} is not named in protocol.md's ${heading}`);
  }
  const objs = pick(examples(text)).filter((o) => o && typeof o === "object");
  for (const o of objs) {
    for (const k of Object.keys(o)) assert.ok(keys.includes(k), `${name}: protocol.md's ${heading} example has key ${k}, which the SDK's type lacks`);
  }
  return objs.length;
}

const byKey = (k) => (exs) => exs.filter((o) => k in o);

test("protocol.md's shapes match the SDK's types", () => {
  assert.ok(checkShape("Card", sdk.cardKeys, "## Cards") >= 2);
  assert.ok(checkShape("CardMetadata", sdk.cardMetadataKeys, "## Cards", (exs) => exs.map((o) => o.metadata)) >= 2);
  checkShape("ToolCallContent", sdk.toolCallContentKeys, "## Cards", (exs) => exs.filter((o) => o.type === "tool.call").map((o) => o.content));
  checkShape("ToolResultContent", sdk.toolResultContentKeys, "## Cards", (exs) => exs.filter((o) => o.type === "tool.result").map((o) => o.content));
  checkShape("ResultError", sdk.resultErrorKeys, "## Cards", () => []);
  assert.equal(checkShape("ToolCommandPayload", sdk.toolCommandPayloadKeys, "## Tool commands"), 1);
  assert.equal(checkShape("CardPutResult", sdk.cardPutResultKeys, "### card.put"), 1);
  assert.equal(checkShape("CardGetResult", sdk.cardGetResultKeys, "### card.get"), 1);
  assert.equal(checkShape("StoredCard", sdk.storedCardKeys, "### card.get", (exs) => exs.flatMap((o) => o.cards)), 1);
  assert.equal(checkShape("DispatchBody", sdk.dispatchBodyKeys, "### dispatch", byKey("payload")), 1);
  assert.ok(checkShape("DispatchResult", sdk.dispatchResultKeys, "### dispatch", byKey("card_seq")) >= 3);
  assert.equal(checkShape("ReportBody", sdk.reportBodyKeys, "### report", (exs) => exs.filter((o) => !("seq" in o))), 1);
  assert.equal(checkShape("ReportResult", sdk.reportResultKeys, "### report", byKey("seq")), 1);
  assert.equal(checkShape("ReportResultBody", sdk.reportResultBodyKeys, "### report.result", (exs) => exs.filter((o) => o.card)), 1);
  assert.equal(checkShape("ReportResultReply", sdk.reportResultReplyKeys, "### report.result", byKey("seq")), 1);
  assert.equal(checkShape("ReportWakeup", sdk.reportWakeupKeys, "### report", (exs) => exs.filter((o) => o.wakeup).map((o) => o.wakeup)), 1);
  checkShape("RosterEntry", sdk.rosterEntryKeys, "### roster.get");
  assert.equal(checkShape("CallRecord", sdk.callRecordKeys, "### call.get"), 1);
  checkShape("TwoPhaseState", sdk.twoPhaseStateKeys, "### call.get", () => []);
  assert.equal(checkShape("InboxListResult", sdk.inboxListResultKeys, "### inbox.list"), 1);
  checkShape("ConsumeResult", sdk.consumeResultKeys, "### inbox.consume");
  checkShape("CancelResult", sdk.cancelResultKeys, "### cancel");
  assert.equal(checkShape("ToolConsumerInfo", sdk.toolConsumerInfoKeys, "### tool.consumer"), 1);
  checkShape("CancelGetResult", sdk.cancelGetResultKeys, "### cancel.get");
  assert.equal(checkShape("CommandRejectBody", sdk.commandRejectBodyKeys, "### command.reject"), 1);
  assert.equal(checkShape("AttemptStartBody", sdk.attemptStartBodyKeys, "### attempt.start", byKey("not_done")), 1);
  assert.equal(checkShape("AttemptStartResult", sdk.attemptStartResultKeys, "### attempt.start", byKey("started")), 1);
  assert.equal(checkShape("PrepareBody", sdk.prepareBodyKeys, "### prepare"), 1);
  checkShape("PrepareResult", sdk.prepareResultKeys, "### prepare", () => []);
  checkShape("DecisionResult", sdk.decisionResultKeys, "### commit / abort", () => []);
  assert.equal(checkShape("DecisionEntry", sdk.decisionEntryKeys, "### commit / abort", byKey("decided_by")), 1);
  assert.equal(checkShape("Wakeup", sdk.wakeupKeys, "## Wakeups"), 1);
});

test("the Inbox items and the error body of protocol.md are the OpenAPI document's InboxEntry and LegacyError", () => {
  const entry = Object.keys(openapi.components.schemas.InboxEntry.properties);
  const [list] = examples(section("### inbox.list"));
  for (const k of Object.keys(list.items[0])) assert.ok(entry.includes(k), `inbox.list item key ${k} is not in InboxEntry`);
  const errorProps = Object.keys(openapi.components.schemas.LegacyError.properties);
  const violationProps = Object.keys(openapi.components.schemas.Violation.properties);
  const errs = examples(section("## Errors")).filter((o) => o.ok === false);
  assert.equal(errs.length, 1);
  for (const k of Object.keys(errs[0].error)) assert.ok(errorProps.includes(k), `error key ${k} is not in LegacyError`);
  for (const v of errs[0].error.violations) for (const k of Object.keys(v)) assert.ok(violationProps.includes(k), `violation key ${k}`);
  assert.ok(sdk.openapi === undefined, "openapi is a type-only namespace");
});

test("the error and violation codes are protocol.md's", () => {
  const errors = section("## Errors");
  const table = [...errors.matchAll(/^\| `([a-z_]+)` \|/gm)].map((m) => m[1]);
  assert.deepEqual([...table].sort(), [...sdk.errorCodes].sort());
  const para = errors.slice(errors.indexOf("Violation codes"), errors.indexOf("A bad API subject"));
  // The paragraph also names a header and two tool definition fields in passing.
  const notCodes = new Set(["violations", "code", "traceparent", "parameters", "result_schema"]);
  const codes = [...para.matchAll(/`([a-z0-9_]+)`/g)].map((m) => m[1]).filter((c) => !notCodes.has(c));
  assert.deepEqual([...new Set(codes)].sort(), [...sdk.violationCodes].sort());
});

test("the idempotency key is the one protocol.md defines", () => {
  // sha256("2:p1;2:t1;2:k1;") computed independently of the SDK's helper.
  const want = "idem-" + createHash("sha256").update("2:p1;2:t1;2:k1;").digest("hex").slice(0, 32);
  assert.equal(sdk.idempotencyKey("p1", "t1", "k1"), want);
});

