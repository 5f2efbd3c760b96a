// The wire shapes of docs/protocol.md that docs/openapi.json does not describe (the NATS API's
// bodies and answers, cards, commands, wakeups). Each interface has a key list, tied to it at
// compile time by `keyList` (tsc fails when a field is added to one and not the other), and the
// key lists are tied to protocol.md's own examples and tables by test/shapes.test.mjs (a field
// the document gains or loses fails it). Shapes the OpenAPI document has (InboxEntry,
// ToolDefinition, Violation, the error body) come from openapi.gen.ts instead.

import type { InboxEntry, LegacyError, ToolDefinition, Violation } from "./openapi.gen.js";

export type { InboxEntry, ToolDefinition, Violation };

/** The error member of a refused request's reply (`{"ok":false,"error":{...}}`). */
export type ErrorBody = LegacyError;

/**
 * Returns its argument, refusing at compile time a list that misses a key of T (or names one T
 * does not have), so a key list cannot drift from its interface.
 */
export function keyList<T>() {
  return <const K extends readonly (keyof T & string)[]>(
    keys: K & ([Exclude<keyof T, K[number]>] extends [never] ? unknown : { missing: Exclude<keyof T, K[number]> }),
  ): K => keys;
}

/** Every error code of protocol.md's Errors table. */
export const errorCodes = [
  "bad_request",
  "unknown_call",
  "unknown_card",
  "mismatch",
  "stale_epoch",
  "conflict",
  "not_found",
  "not_reported",
  "forbidden",
  "internal",
] as const;
/** A protocol error code. */
export type ErrorCode = (typeof errorCodes)[number];

/** Every violation code of protocol.md's Errors section. */
export const violationCodes = [
  "required",
  "empty",
  "invalid_type",
  "invalid_token",
  "invalid_value",
  "invalid_json",
  "forbidden",
  "identity_mismatch",
  "mismatch",
  "too_large",
  "invalid_subject",
  "conflict",
  "not_found",
  "stale_epoch",
  "not_reported",
  "invalid_utf8",
  "duplicate",
  "late",
  "not_served",
  "reserved",
  "invalid_schema",
] as const;

/** The five result statuses. */
export type Status = "success" | "failed" | "canceled" | "timeout" | "partial";
export const statuses: readonly Status[] = ["success", "failed", "canceled", "timeout", "partial"];
/** What the agent does after the call. */
export type AfterExecution = "suspend" | "terminate";

/** A card's metadata; the ledger always stores all three keys (`""` for those not given). */
export interface CardMetadata {
  trace_id?: string;
  parent_step_id?: string;
  step_id?: string;
}
export const cardMetadataKeys = keyList<CardMetadata>()(["trace_id", "parent_step_id", "step_id"]);

/** `ToolCallContent`. */
export interface ToolCallContent {
  tool_name: string;
  arguments: Record<string, unknown>;
}
export const toolCallContentKeys = keyList<ToolCallContent>()(["tool_name", "arguments"]);

/** The `error` member of a result card. */
export interface ResultError {
  code: string;
  message?: string;
  detail?: Record<string, unknown>;
}
export const resultErrorKeys = keyList<ResultError>()(["code", "message", "detail"]);

/** `ToolResultContent`. */
export interface ToolResultContent {
  status: Status;
  result?: unknown;
  error?: ResultError | null;
}
export const toolResultContentKeys = keyList<ToolResultContent>()(["status", "result", "error"]);

/** A card (protocol.md, Cards). */
export interface Card<C = ToolCallContent | ToolResultContent> {
  card_id: string;
  project_id: string;
  type: "tool.call" | "tool.result";
  author_id: string;
  function_name?: string;
  agent_turn_id: string;
  tool_call_id: string;
  content: C;
  metadata?: CardMetadata;
}
export const cardKeys = keyList<Card>()([
  "card_id",
  "project_id",
  "type",
  "author_id",
  "function_name",
  "agent_turn_id",
  "tool_call_id",
  "content",
  "metadata",
]);

/** A tool command's payload as the ledger publishes it. */
export interface ToolCommandPayload {
  tool_call_card_id: string;
  tool_name: string;
  after_execution: AfterExecution;
  timeout_ms?: number;
  deadline_unix_ms?: number;
}
export const toolCommandPayloadKeys = keyList<ToolCommandPayload>()([
  "tool_call_card_id",
  "tool_name",
  "after_execution",
  "timeout_ms",
  "deadline_unix_ms",
]);

/** card.put's result. */
export interface CardPutResult {
  card_id: string;
  seq: number;
  duplicate: boolean;
}
export const cardPutResultKeys = keyList<CardPutResult>()(["card_id", "seq", "duplicate"]);

/** One card of card.get's result. */
export interface StoredCard {
  card: Card;
  seq: number;
  time: string;
}
export const storedCardKeys = keyList<StoredCard>()(["card", "seq", "time"]);

/** card.get's result. */
export interface CardGetResult {
  cards: StoredCard[];
  missing: string[];
}
export const cardGetResultKeys = keyList<CardGetResult>()(["cards", "missing"]);

/** dispatch's body. */
export interface DispatchBody {
  subject: string;
  card: Card<ToolCallContent>;
  payload: { tool_call_card_id: string; tool_name?: string; after_execution: AfterExecution; timeout_ms?: number };
  approval?: { required: boolean };
  /** Refuse (and record) an unknown tool or arguments failing its schema before anything is written. */
  checks?: DispatchChecks;
}
export const dispatchBodyKeys = keyList<DispatchBody>()(["subject", "card", "payload", "approval", "checks"]);

/** dispatch's optional checks (docs/protocol.md#dispatch, "Checks"). */
export interface DispatchChecks {
  registered?: boolean;
  arguments?: boolean;
}

/** dispatch's result. */
export interface DispatchResult {
  subject: string;
  tool_call_card_id: string;
  card_seq: number;
  command_seq: number;
  duplicate: boolean;
  deadline_unix_ms?: number;
  tool_def_seq?: number;
  tool_version?: string;
  tool_unavailable?: boolean;
  awaiting_approval?: boolean;
  approval_expires_unix_ms?: number;
  paused?: boolean;
}
export const dispatchResultKeys = keyList<DispatchResult>()([
  "subject",
  "tool_call_card_id",
  "card_seq",
  "command_seq",
  "duplicate",
  "deadline_unix_ms",
  "tool_def_seq",
  "tool_version",
  "tool_unavailable",
  "awaiting_approval",
  "approval_expires_unix_ms",
  "paused",
]);

/** report's body. */
export interface ReportBody {
  status: Status;
  after_execution: AfterExecution;
  tool_result_card_id: string;
  step_id?: string;
  attempt_outcome?: "reconciled" | "outcome_unknown";
}
export const reportBodyKeys = keyList<ReportBody>()([
  "status",
  "after_execution",
  "tool_result_card_id",
  "step_id",
  "attempt_outcome",
]);

/** The wakeup member of a report's result. */
export interface ReportWakeup {
  subject?: string;
  worker_target?: string;
  seq?: number;
  skipped: boolean;
  reason?: string;
}
export const reportWakeupKeys = keyList<ReportWakeup>()(["subject", "worker_target", "seq", "skipped", "reason"]);

/** report's (and report.resume's) result. */
export interface ReportResult {
  seq: number;
  agent_turn_id: string;
  tool_call_id: string;
  tool_result_card_id: string;
  status: Status;
  after_execution: AfterExecution;
  effective_after_execution: AfterExecution;
  duplicate: boolean;
  duplicate_seq?: number;
  wakeup: ReportWakeup;
}
export const reportResultKeys = keyList<ReportResult>()([
  "seq",
  "agent_turn_id",
  "tool_call_id",
  "tool_result_card_id",
  "status",
  "after_execution",
  "effective_after_execution",
  "duplicate",
  "duplicate_seq",
  "wakeup",
]);

/** report.result's body: the tool.result card (as card.put takes it) and the report, whose `tool_result_card_id` is optional (the card's). */
export interface ReportResultBody {
  card: Card<ToolResultContent>;
  report: Omit<ReportBody, "tool_result_card_id"> & { tool_result_card_id?: string };
}
export const reportResultBodyKeys = keyList<ReportResultBody>()(["card", "report"]);

/** report.result's result: report's, plus where the card is stored. */
export interface ReportResultReply extends ReportResult {
  card_seq: number;
  card_duplicate?: boolean;
}
export const reportResultReplyKeys = keyList<ReportResultReply>()([
  ...reportResultKeys,
  "card_seq",
  "card_duplicate",
]);

/** roster.set's and roster.get's result. */
export interface RosterEntry {
  project_id: string;
  agent_id: string;
  worker_target: string;
  seq: number;
}
export const rosterEntryKeys = keyList<RosterEntry>()(["project_id", "agent_id", "worker_target", "seq"]);

/** A call record's `claim` (its stored report). Other fields are informative. */
export interface CallClaim {
  status: Status;
  tool_result_card_id: string;
  seq: number;
  wakeup_seq?: number;
  source_id?: string;
  [key: string]: unknown;
}

/** call.get's result: the call record. The protocol says its other fields may grow. */
export interface CallRecord {
  state: "dispatched" | "claimed" | "woken" | "awaiting_approval" | "paused";
  project_id: string;
  channel_id: string;
  agent_id: string;
  agent_turn_id: string;
  turn_epoch: number;
  tool_call_id: string;
  step_id?: string;
  subject: string;
  tool_name?: string;
  after_execution: AfterExecution;
  tool_call_card_id: string;
  card_seq: number;
  card_metadata: CardMetadata;
  dispatch_fingerprint: string;
  command_seq?: number;
  dispatched_at: string;
  deadline_unix_ms?: number;
  claim?: CallClaim;
  tool_def_seq?: number;
  tool_version?: string;
  outcome?: "reconciled" | "outcome_unknown";
  two_phase?: TwoPhaseState;
  resolution?: Record<string, unknown>;
  held?: Record<string, unknown>;
}
export const callRecordKeys = keyList<CallRecord>()([
  "state",
  "project_id",
  "channel_id",
  "agent_id",
  "agent_turn_id",
  "turn_epoch",
  "tool_call_id",
  "step_id",
  "subject",
  "tool_name",
  "after_execution",
  "tool_call_card_id",
  "card_seq",
  "card_metadata",
  "dispatch_fingerprint",
  "command_seq",
  "dispatched_at",
  "deadline_unix_ms",
  "claim",
  "tool_def_seq",
  "tool_version",
  "outcome",
  "two_phase",
  "resolution",
  "held",
]);

/** call.get's `two_phase` member (with `"two_phase": true`). */
export interface TwoPhaseState {
  state: "prepared" | "committed" | "aborted";
  commit_token: string;
  commit_deadline_unix_ms: number;
  prepared_seq: number;
  decision_seq?: number;
  decided_by?: "worker" | "commit_deadline";
}
export const twoPhaseStateKeys = keyList<TwoPhaseState>()([
  "state",
  "commit_token",
  "commit_deadline_unix_ms",
  "prepared_seq",
  "decision_seq",
  "decided_by",
]);

/** inbox.list's result: a page of the agent's pending results. */
export interface InboxListResult {
  as_of_seq: number;
  ledger_seq: number;
  next_cursor?: string;
  items: InboxEntry[];
}
export const inboxListResultKeys = keyList<InboxListResult>()(["as_of_seq", "ledger_seq", "next_cursor", "items"]);

/** inbox.consume's result. */
export interface ConsumeResult {
  seq: number;
  report_seq: number;
  duplicate: boolean;
}
export const consumeResultKeys = keyList<ConsumeResult>()(["seq", "report_seq", "duplicate"]);

/** cancel's result. */
export interface CancelResult {
  seq: number;
  duplicate: boolean;
}
export const cancelResultKeys = keyList<CancelResult>()(["seq", "duplicate"]);

/** cancel.get's result. */
export interface CancelGetResult {
  canceled: boolean;
}
export const cancelGetResultKeys = keyList<CancelGetResult>()(["canceled"]);

/** tool.consumer's result. */
export interface ToolConsumerInfo {
  stream: string;
  consumer: string;
  filter_subjects: string[];
  api_prefix: string;
  max_ack_pending: number;
  max_waiting: number;
  ack_wait_ms: number;
}
export const toolConsumerInfoKeys = keyList<ToolConsumerInfo>()([
  "stream",
  "consumer",
  "filter_subjects",
  "api_prefix",
  "max_ack_pending",
  "max_waiting",
  "ack_wait_ms",
]);

/** command.reject's body. */
export interface CommandRejectBody {
  subject: string;
  headers?: Record<string, string[]>;
  data?: string;
  error: { code: Exclude<ErrorCode, "internal">; message: string; violations?: Violation[] };
}
export const commandRejectBodyKeys = keyList<CommandRejectBody>()(["subject", "headers", "data", "error"]);

/** command.reject's result. */
export interface CommandRejectResult {
  seq: number;
  duplicate?: boolean;
}

/** attempt.start's body. */
export interface AttemptStartBody {
  project_id: string;
  agent_turn_id: string;
  tool_call_id: string;
  executor_id: string;
  deadline_unix_ms?: number;
  not_done?: number;
}
export const attemptStartBodyKeys = keyList<AttemptStartBody>()([
  "project_id",
  "agent_turn_id",
  "tool_call_id",
  "executor_id",
  "deadline_unix_ms",
  "not_done",
]);

/** attempt.start's result. */
export interface AttemptStartResult {
  started: boolean;
  attempt: number;
  seq: number;
  idempotency_key: string;
  executor_id: string;
  deadline_unix_ms?: number;
}
export const attemptStartResultKeys = keyList<AttemptStartResult>()([
  "started",
  "attempt",
  "seq",
  "idempotency_key",
  "executor_id",
  "deadline_unix_ms",
]);

/** prepare's body. */
export interface PrepareBody {
  project_id: string;
  agent_turn_id: string;
  tool_call_id: string;
  commit_token: string;
  commit_deadline_unix_ms: number;
}
export const prepareBodyKeys = keyList<PrepareBody>()([
  "project_id",
  "agent_turn_id",
  "tool_call_id",
  "commit_token",
  "commit_deadline_unix_ms",
]);

/** prepare's result. */
export interface PrepareResult {
  seq: number;
  duplicate: boolean;
  wakeup_seq?: number;
}
export const prepareResultKeys = keyList<PrepareResult>()(["seq", "duplicate", "wakeup_seq"]);

/** commit's and abort's result. */
export interface DecisionResult {
  seq: number;
  decision: "commit" | "abort";
}
export const decisionResultKeys = keyList<DecisionResult>()(["seq", "decision"]);

/** A two-phase decision as the tool's consumer delivers it. */
export interface DecisionEntry {
  project_id: string;
  channel_id: string;
  agent_id: string;
  agent_turn_id: string;
  turn_epoch: number;
  tool_call_id: string;
  tool_name: string;
  decision: "commit" | "abort";
  decided_by: "worker" | "commit_deadline";
  commit_token: string;
  prepared_seq: number;
}
export const decisionEntryKeys = keyList<DecisionEntry>()([
  "project_id",
  "channel_id",
  "agent_id",
  "agent_turn_id",
  "turn_epoch",
  "tool_call_id",
  "tool_name",
  "decision",
  "decided_by",
  "commit_token",
  "prepared_seq",
]);

/** A wakeup's body. */
export interface Wakeup {
  project_id: string;
  channel_id: string;
  agent_id: string;
  worker_target: string;
  agent_turn_id: string;
  turn_epoch: number;
  tool_call_id: string;
  status: Status | "prepared" | "approved";
  tool_result_card_id: string;
  effective_after_execution: AfterExecution | "";
  report_seq: number;
  phase?: "prepared" | "approved";
}
export const wakeupKeys = keyList<Wakeup>()([
  "project_id",
  "channel_id",
  "agent_id",
  "worker_target",
  "agent_turn_id",
  "turn_epoch",
  "tool_call_id",
  "status",
  "tool_result_card_id",
  "effective_after_execution",
  "report_seq",
  "phase",
]);

/** The CG-* headers of protocol.md's Headers table, as the ledger writes them. */
export const H = {
  agentId: "CG-Agent-Id",
  turnId: "CG-Agent-Turn-Id",
  epoch: "CG-Turn-Epoch",
  callId: "CG-Tool-Call-Id",
  stepId: "CG-Step-Id",
  contextBoxId: "CG-Context-Box-Id",
  projectId: "CG-Project-Id",
  channelId: "CG-Channel-Id",
  sourceId: "CG-Source-Id",
  sourceFunction: "CG-Source-Function",
  entryKind: "CG-Entry-Kind",
  idempotencyKey: "CG-Idempotency-Key",
  traceparent: "traceparent",
  tracestate: "tracestate",
} as const;

/** Whether s is an identifier: 1 to 256 bytes of printable ASCII without `.`, `*`, `>`, and not `_`. */
export function isIdentifier(s: unknown): s is string {
  if (typeof s !== "string" || s.length < 1 || s.length > 256 || s === "_") return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x21 || c > 0x7e || c === 0x2e || c === 0x2a || c === 0x3e) return false;
  }
  return true;
}

/** Whether s is a name: 1 to 256 bytes of UTF-8 without whitespace or control characters. */
export function isName(s: unknown): s is string {
  if (typeof s !== "string" || s.length < 1 || Buffer.byteLength(s, "utf8") > 256) return false;
  return !/[\s\p{Cc}]/u.test(s);
}

/** Whether s is a turn epoch in canonical decimal (no sign, no leading zeros), at most 2^64-1. */
export function isCanonicalEpoch(s: unknown): s is string {
  if (typeof s !== "string" || !/^(0|[1-9][0-9]*)$/.test(s)) return false;
  return BigInt(s) <= 18446744073709551615n;
}

/**
 * Every op of the protocol's request/reply API (the last token of `cgledger.v1.<project>.<actor>.<op>`).
 * `LedgerConnection.request` refuses any other with UnknownOpError before sending; test/sdkts
 * checks the list against the Go protocol package's ops.
 */
export const OPS: readonly string[] = Object.freeze([
  "abort",
  "approval.get",
  "approval.list",
  "approve",
  "attempt.start",
  "call.cancel",
  "call.get",
  "call.redrive",
  "call.resolve",
  "cancel",
  "cancel.get",
  "card.get",
  "card.put",
  "command",
  "command.reject",
  "commit",
  "conformance.command",
  "conformance.observe",
  "deny",
  "dispatch",
  "inbox.consume",
  "inbox.list",
  "prepare",
  "projector.skip",
  "report",
  "report.result",
  "report.resume",
  "roster.get",
  "roster.set",
  "tool.consumer",
  "tool.get",
  "tool.list",
  "tool.pause",
  "tool.register",
  "tool.resume",
  "views.snapshot",
  "views.snapshot.list",
]);

/** The API subject of an operation: `cgledger.v1.<project>.<actor>.<op>`. */
export function apiSubject(project: string, actor: string, op: string): string {
  return `cgledger.v1.${project}.${actor}.${op}`;
}

/** A parsed command subject `cg.<ver>.<project>.<channel>.cmd.tool.<target>[.<more>...]`. */
export interface CommandSubject {
  version: string;
  project: string;
  channel: string;
  target: string;
  rest: string[];
}

/** Parses a tool command subject, or returns undefined when it is not one. */
export function parseCommandSubject(subject: string): CommandSubject | undefined {
  const t = subject.split(".");
  if (t.length < 7 || t[0] !== "cg" || !/^v[0-9]+$/.test(t[1]) || t[4] !== "cmd" || t[5] !== "tool") return undefined;
  if (!isIdentifier(t[2]) || !isIdentifier(t[3]) || !isIdentifier(t[6])) return undefined;
  return { version: t[1], project: t[2], channel: t[3], target: t[6], rest: t.slice(7) };
}
