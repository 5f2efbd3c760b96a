import { createHash, randomBytes } from "node:crypto";
import { jetstream } from "@nats-io/jetstream";
import type { ConsumerMessages, JsMsg } from "@nats-io/jetstream";
import type { MsgHdrs, Subscription } from "@nats-io/transport-node";
import type { LedgerConnection } from "./connection.js";
import { CgLedgerError, LedgerError, isRetryable } from "./errors.js";
import { ToolFailure, ToolOutcome, failed, success } from "./outcome.js";
import { H, isCanonicalEpoch, isIdentifier, isName, parseCommandSubject } from "./protocol.js";
import type {
  AfterExecution,
  AttemptStartResult,
  CallRecord,
  CancelGetResult,
  Card,
  CardGetResult,
  CardMetadata,
  CommandRejectBody,
  CommandRejectResult,
  DecisionEntry,
  PrepareResult,
  ReportBody,
  ReportResultBody,
  ReportResult,
  Status,
  ToolCallContent,
  ToolCommandPayload,
  ToolConsumerInfo,
  ToolDefinition,
  ToolResultContent,
  Violation,
} from "./protocol.js";

/** A call as the handler sees it. */
export interface ToolCall {
  project: string;
  channel: string;
  agentId: string;
  turnId: string;
  callId: string;
  /** `CG-Turn-Epoch`, canonical decimal. */
  epoch: string;
  stepId?: string;
  contextBoxId?: string;
  toolName: string;
  /** `card.content.arguments` of the tool.call card. */
  arguments: Record<string, unknown>;
  /** The tool.call card as stored. */
  card: Card<ToolCallContent>;
  /** The call's deadline (Unix ms), fixed at dispatch; `signal` aborts there. */
  deadlineUnixMs: number;
  /** The call's idempotency key: hand it to an upstream that deduplicates. */
  idempotencyKey: string;
  /** For a side_effectful tool, the attempt this run is (from attempt.start). */
  attempt?: number;
  /** The command's delivery count (1 on the first delivery). */
  deliveryCount: number;
  /** The definition the call pinned at dispatch, when the tool is registered. */
  definition?: ToolDefinition;
  /** Aborted on the worker's cancel (reason "canceled") or at the deadline (reason "timeout"). */
  signal: AbortSignal;
  /** The call record read for this delivery. */
  record: CallRecord;
}

/** A tool handler: its return value is the result (`success`), or a ToolOutcome; a throw is `failed`. */
export type ToolHandler = (call: ToolCall) => unknown | Promise<unknown>;

/** What a reconcile found for an attempt left open by a crash. */
export type ReconcileAnswer = { done: false } | { done: true; outcome: unknown };

/** The two-phase decision as the onDecision hook sees it. */
export interface ToolDecision {
  decision: "commit" | "abort";
  decidedBy: "worker" | "commit_deadline";
  commitToken: string;
  call: Omit<ToolCall, "signal" | "attempt"> & { signal: AbortSignal };
}

/** serveTool's options. */
export interface ServeToolOptions {
  /** Calls run at once by this service (default 1); each has its own pull. */
  concurrency?: number;
  /** The result card's `author_id` and the report's `CG-Source-Id` (default `cgledger-ts.<tool>`). */
  sourceId?: string;
  /** Recorded in attempt entries (default the source id and a random suffix). */
  executorId?: string;
  /**
   * How the tool behaves when run twice. Default: the `determinism` of the definition the call
   * pinned (`side_effectful` when the definition leaves it out, as the ledger's default), or
   * `side_effectful` for an unregistered tool.
   */
  determinism?: "pure" | "idempotent" | "side_effectful";
  /**
   * For a side_effectful tool: finds out whether an attempt left open by a crash took effect
   * (ask the upstream about `call.idempotencyKey`). Without it such a call is reported
   * `failed`, `S-TOOL-OUTCOME-UNKNOWN`. Throw to decide later (the command comes back).
   */
  reconcile?: (call: ToolCall, openAttempt: number) => Promise<ReconcileAnswer> | ReconcileAnswer;
  /** Phase 2 of a two-phase commit: the answer (as a handler's) is the call's final result. */
  onDecision?: (d: ToolDecision) => unknown | Promise<unknown>;
  /** Deliveries after which a call is reported failed (`S-TOOL-REDELIVERY`) instead of run again (default 5). */
  maxDeliveries?: number;
  /** Told of every problem the service handled without a report (a refused report, a lost connection...). */
  onError?: (err: unknown, where: string) => void;
  /** How long a pull waits for a command before the next (default 5 s). */
  pullExpiresMs?: number;
}

/** A running tool service. */
export interface ToolService {
  /** The consumer it pulls. */
  readonly consumer: ToolConsumerInfo;
  /** Stops pulling, waits up to `drainMs` (default 30 s) for calls in flight, then aborts the rest (their commands come back). */
  stop(drainMs?: number): Promise<void>;
  /** Resolves when the service stopped. */
  readonly stopped: Promise<void>;
}

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder();

/** The idempotency key of a call (protocol.md, Tool commands). */
export function idempotencyKey(project: string, turnId: string, callId: string): string {
  const part = (s: string) => `${Buffer.byteLength(s, "utf8")}:${s};`;
  return "idem-" + createHash("sha256").update(part(project) + part(turnId) + part(callId)).digest("hex").slice(0, 32);
}

/** A command's identity and payload, validated. */
export interface ValidCommand {
  project: string;
  channel: string;
  target: string;
  agentId: string;
  turnId: string;
  callId: string;
  epoch: string;
  stepId?: string;
  contextBoxId?: string;
  traceparent?: string;
  payload: ToolCommandPayload;
}

const identityHeaders = [H.agentId, H.turnId, H.epoch, H.callId] as const;
const traceparentRe = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

function headerMap(h: MsgHdrs | undefined): Map<string, { names: string[]; values: string[] }> {
  const m = new Map<string, { names: string[]; values: string[] }>();
  if (!h) return m;
  for (const [name, values] of h) {
    const k = name.toLowerCase();
    const e = m.get(k) ?? { names: [], values: [] };
    e.names.push(name);
    e.values.push(...values);
    m.set(k, e);
  }
  return m;
}

/**
 * Validates a tool command as protocol.md's Tool commands and Headers sections say, listing
 * every violation. `identity` is the call the headers name, when they name one validly (so a bad
 * command of a dispatched call can be answered through its report).
 */
export function validateCommand(
  subject: string,
  headers: MsgHdrs | undefined,
  data: Uint8Array,
  target?: string,
): { violations: Violation[]; command?: ValidCommand; identity?: { project: string; channel: string; turnId: string; callId: string } } {
  const v: Violation[] = [];
  const add = (field: string, code: string, message: string) => v.push({ field, code, message });
  const s = parseCommandSubject(subject);
  if (!s) add("subject", "invalid_subject", `not a tool command subject: ${subject}`);
  else if (target !== undefined && s.target !== target) add("subject", "invalid_subject", `not a command of tool ${target}: ${subject}`);

  const hm = headerMap(headers);
  const one = (name: string, required: boolean): string | undefined => {
    const e = hm.get(name.toLowerCase());
    if (!e) {
      if (required) add(`header.${name}`, "required", "header is required");
      return undefined;
    }
    if (e.values.length > 1 || e.names.length > 1) {
      add(`header.${name}`, "duplicate", "header is sent more than once");
      return undefined;
    }
    if (e.values[0] === "") {
      add(`header.${name}`, "empty", "header must not be empty");
      return undefined;
    }
    return e.values[0];
  };
  const ident = (name: string, required: boolean) => {
    const x = one(name, required);
    if (x !== undefined && !isIdentifier(x)) {
      add(`header.${name}`, "invalid_token", "not an identifier");
      return undefined;
    }
    return x;
  };
  const agentId = ident(H.agentId, true);
  const turnId = ident(H.turnId, true);
  let epoch = one(H.epoch, true);
  if (epoch !== undefined && !isCanonicalEpoch(epoch)) {
    add(`header.${H.epoch}`, "invalid_value", "not a canonical decimal unsigned 64-bit integer");
    epoch = undefined;
  }
  const callId = ident(H.callId, true);
  const stepId = ident(H.stepId, false);
  const contextBoxId = ident(H.contextBoxId, false);
  let traceparent = one(H.traceparent, false);
  if (traceparent !== undefined) {
    const m = traceparentRe.exec(traceparent);
    if (!m || /^0+$/.test(m[1]) || /^0+$/.test(m[2])) {
      add(`header.${H.traceparent}`, "invalid_value", "not a W3C traceparent");
      traceparent = undefined;
    }
  }
  for (const [k, e] of hm) {
    if (k.startsWith("cg-") && !identityHeaders.some((n) => n.toLowerCase() === k) && (e.values.length > 1 || e.names.length > 1)) {
      if (![H.stepId, H.contextBoxId].some((n) => n.toLowerCase() === k)) add(`header.${e.names[0]}`, "duplicate", "header is sent more than once");
    }
  }

  let payload: Record<string, unknown> | undefined;
  try {
    const p = JSON.parse(fromUtf8.decode(data)) as unknown;
    if (p === null || typeof p !== "object" || Array.isArray(p)) add("payload", "invalid_type", "payload is not a JSON object");
    else payload = p as Record<string, unknown>;
  } catch (err) {
    add("payload", "invalid_json", `payload is not JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (payload) {
    const card = payload.tool_call_card_id;
    if (card === undefined) add("payload.tool_call_card_id", "required", "tool_call_card_id is required");
    else if (!isIdentifier(card)) add("payload.tool_call_card_id", "invalid_token", "not an identifier");
    if (payload.tool_name !== undefined && !isName(payload.tool_name)) add("payload.tool_name", "invalid_value", "not a name");
    const ae = payload.after_execution;
    if (ae === undefined) add("payload.after_execution", "required", "after_execution is required");
    else if (ae !== "suspend" && ae !== "terminate") add("payload.after_execution", "invalid_value", `must be "suspend" or "terminate", got ${JSON.stringify(ae)}`);
    for (const k of ["args", "arguments", "result"]) {
      if (k in payload) add(`payload.${k}`, "forbidden", "inline arguments and results are not allowed: arguments come only from the tool.call card");
    }
    const same: [string, string | undefined, string][] = [
      ["agent_id", agentId, H.agentId],
      ["agent_turn_id", turnId, H.turnId],
      ["tool_call_id", callId, H.callId],
      ["step_id", stepId, H.stepId],
      ["context_box_id", contextBoxId, H.contextBoxId],
    ];
    for (const [k, hv, hn] of same) {
      if (payload[k] !== undefined && payload[k] !== hv) add(`payload.${k}`, "identity_mismatch", `differs from ${hn}`);
    }
    if (payload.turn_epoch !== undefined && String(payload.turn_epoch) !== epoch) add("payload.turn_epoch", "identity_mismatch", `differs from ${H.epoch}`);
    const d = payload.deadline_unix_ms;
    if (d !== undefined && (typeof d !== "number" || !Number.isSafeInteger(d) || d < 1)) add("payload.deadline_unix_ms", "invalid_type", "not a positive integer");
    const t = payload.timeout_ms;
    if (t !== undefined && (typeof t !== "number" || !Number.isSafeInteger(t) || t < 1 || t > 86_400_000)) add("payload.timeout_ms", "invalid_value", "not an integer from 1 to 86400000");
  }
  const identity = s && turnId && callId ? { project: s.project, channel: s.channel, turnId, callId } : undefined;
  if (v.length || !s || !payload) return { violations: v, identity };
  return {
    violations: v,
    identity,
    command: {
      project: s.project,
      channel: s.channel,
      target: s.target,
      agentId: agentId!,
      turnId: turnId!,
      callId: callId!,
      epoch: epoch!,
      stepId,
      contextBoxId,
      traceparent,
      payload: payload as unknown as ToolCommandPayload,
    },
  };
}

function childTraceparent(parent: string | undefined): string | undefined {
  const m = parent ? traceparentRe.exec(parent) : null;
  if (!m) return undefined;
  let span = randomBytes(8).toString("hex");
  while (/^0+$/.test(span)) span = randomBytes(8).toString("hex");
  return `00-${m[1]}-${span}-${m[3]}`;
}

function resultCardId(project: string, turnId: string, callId: string, tag: string): string {
  return "res-" + createHash("sha256").update(JSON.stringify(["cgledger-ts", project, turnId, callId, tag])).digest("hex").slice(0, 32);
}

function toOutcome(v: unknown): ToolOutcome {
  return v instanceof ToolOutcome ? v : success(v);
}

function errorOutcome(err: unknown, attempts: number): ToolOutcome {
  if (err instanceof ToolFailure) return failed(err.code, err.message, { class: "terminal_error", attempts, ...err.detail });
  const msg = err instanceof Error ? err.message : String(err);
  return failed("internal_error", msg, { taxonomy_code: "S-TOOL-ERROR", class: "retryable_error", attempts });
}

function canceledOutcome(attempts: number): ToolOutcome {
  return new ToolOutcome({
    status: "canceled",
    result: { error_code: "canceled", error_message: "the call was canceled" },
    error: { code: "canceled", message: "the call was canceled", detail: { taxonomy_code: "CANCELED", class: "terminal_error", attempts } },
  });
}

function deadlineOutcome(deadline: number, attempts: number): ToolOutcome {
  const message = `the call's deadline ${new Date(deadline).toISOString()} passed`;
  return new ToolOutcome({
    status: "timeout",
    result: { error_code: "tool_timeout", error_message: message },
    error: {
      code: "tool_timeout",
      message,
      detail: { taxonomy_code: "R-TIMEOUT-001", class: "retryable_error", attempts, deadline_unix_ms: deadline },
    },
  });
}

class Abort extends Error {
  constructor(readonly reason: "canceled" | "timeout") {
    super(reason === "canceled" ? "the call was canceled" : "the call's deadline passed");
    this.name = "AbortError";
  }
}

/**
 * Serves a tool target with `handler`: pulls the tool's durable consumer (tool.consumer, under its
 * JetStream API prefix) and does, for every delivery, what protocol.md's "A tool service, step by
 * step" asks. The connection must hold a tool credential bound to `tool` (the target).
 */
export async function serveTool(conn: LedgerConnection, tool: string, handler: ToolHandler, opts: ServeToolOptions = {}): Promise<ToolService> {
  const svc = new Service(conn, tool, handler, opts);
  await svc.start();
  return svc;
}

class Service implements ToolService {
  consumer!: ToolConsumerInfo;
  stopped: Promise<void>;
  private resolveStopped!: () => void;
  private stopping = false;
  private readonly inflight = new Map<string, AbortController>();
  private readonly running = new Set<Promise<void>>();
  private readonly pulls = new Set<ConsumerMessages>();
  private cancelSub?: Subscription;
  private readonly sourceId: string;
  private readonly executorId: string;
  private readonly definitions = new Map<number, Promise<ToolDefinition | undefined>>();

  constructor(
    private readonly conn: LedgerConnection,
    private readonly tool: string,
    private readonly handler: ToolHandler,
    private readonly opts: ServeToolOptions,
  ) {
    if (!isIdentifier(tool)) throw new CgLedgerError(`tool target ${JSON.stringify(tool)} is not an identifier`);
    this.sourceId = opts.sourceId ?? `cgledger-ts.${tool}`;
    this.executorId = opts.executorId ?? `${this.sourceId}-${randomBytes(4).toString("hex")}`;
    this.stopped = new Promise((r) => (this.resolveStopped = r));
  }

  private req<T>(op: string, body: unknown, hdrs?: Record<string, string>): Promise<T> {
    return this.conn.request<T>(this.tool, op, body, hdrs);
  }

  /**
   * How often a running call's command is progress-acked: a third of the consumer's ack wait, so
   * two heartbeats may be late before the command is delivered again (a floor of 1 s would equal
   * a 1 s ack wait, and the call would be redelivered while it runs).
   */
  private heartbeatMs(): number {
    return Math.max(100, Math.floor(this.consumer.ack_wait_ms / 3));
  }

  private report(where: string, err: unknown) {
    this.opts.onError?.(err, where);
  }

  async start(): Promise<void> {
    this.consumer = await this.req<ToolConsumerInfo>("tool.consumer", {});
    const js = jetstream(this.conn.nc, { apiPrefix: this.consumer.api_prefix });
    const consumer = await js.consumers.get(this.consumer.stream, this.consumer.consumer);
    // Cancel entries are a nudge for calls already running; cancel.get decides before a run.
    this.cancelSub = this.conn.nc.subscribe(`cg.v1.${this.conn.project}.*.ledger.cancel.>`, {
      callback: (err, msg) => {
        if (err || msg.headers?.get(H.entryKind) !== "cancel") return;
        const t = msg.subject.split(".");
        if (t.length !== 8) return;
        this.inflight.get(`${t[3]}\u0000${t[6]}\u0000${t[7]}`)?.abort(new Abort("canceled"));
      },
    });
    await this.conn.nc.flush();
    const n = Math.max(1, this.opts.concurrency ?? 1);
    const loops: Promise<void>[] = [];
    for (let i = 0; i < n; i++) {
      loops.push(
        (async () => {
          while (!this.stopping && !this.conn.nc.isClosed()) {
            let iter: ConsumerMessages;
            try {
              iter = await consumer.fetch({ max_messages: 1, expires: this.opts.pullExpiresMs ?? 5_000 });
            } catch (err) {
              if (this.stopping || this.conn.nc.isClosed()) break;
              this.report("pull", err);
              await new Promise((r) => setTimeout(r, 1_000));
              continue;
            }
            this.pulls.add(iter);
            try {
              for await (const m of iter) {
                const run = this.handle(m).catch((err) => {
                  this.report("handle", err);
                  m.nak(Math.min(30_000, 1_000 * m.info.deliveryCount));
                });
                this.running.add(run);
                await run;
                this.running.delete(run);
              }
            } catch (err) {
              if (!this.stopping) this.report("pull", err);
            } finally {
              this.pulls.delete(iter);
            }
          }
        })(),
      );
    }
    void Promise.all(loops).then(() => this.resolveStopped());
  }

  async stop(drainMs = 30_000): Promise<void> {
    this.stopping = true;
    for (const p of this.pulls) p.stop();
    const t = setTimeout(() => {
      for (const c of this.inflight.values()) c.abort(new CgLedgerError("the tool service stopped"));
    }, drainMs);
    await Promise.allSettled([...this.running]);
    clearTimeout(t);
    this.cancelSub?.unsubscribe();
    await this.stopped;
  }

  private definition(record: CallRecord, toolName: string): Promise<ToolDefinition | undefined> {
    const seq = record.tool_def_seq;
    if (!seq) return Promise.resolve(undefined);
    let p = this.definitions.get(seq);
    if (!p) {
      p = this.req<{ seq: number; definition: ToolDefinition }>("tool.get", { project_id: this.conn.project, tool_name: toolName, seq }).then(
        (r) => r.definition,
        (err) => {
          this.definitions.delete(seq);
          if (err instanceof LedgerError && err.code === "not_found") return undefined;
          throw err;
        },
      );
      this.definitions.set(seq, p);
    }
    return p;
  }

  private async handle(m: JsMsg): Promise<void> {
    if (m.headers?.get(H.entryKind) === "decision") return this.handleDecision(m);
    const { violations, command, identity } = validateCommand(m.subject, m.headers, m.data, this.tool);
    if (!command) return this.refuse(m, violations, identity);
    // Registered before the reads, so a cancel entry that arrives while they run is not missed.
    const key = `${command.channel}\u0000${command.turnId}\u0000${command.callId}`;
    if (this.inflight.has(key)) {
      // Another message of a call this service is running (a command published twice, a copy):
      // the running delivery answers the call and stays unacknowledged until it has (or comes
      // back), so acknowledging this one loses nothing, and running it would run the tool twice.
      return m.ack();
    }
    const ctl = new AbortController();
    this.inflight.set(key, ctl);
    try {
      await this.run(m, command, ctl);
    } finally {
      if (this.inflight.get(key) === ctl) this.inflight.delete(key);
    }
  }

  private async run(m: JsMsg, command: ValidCommand, ctl: AbortController): Promise<void> {
    const ids = { project_id: command.project, agent_turn_id: command.turnId, tool_call_id: command.callId };
    // Step 3: the record, the cancellation and the card, on every delivery, at once.
    const [recordR, canceledR, cardsR] = await Promise.allSettled([
      this.req<CallRecord>("call.get", this.opts.onDecision ? { ...ids, two_phase: true } : ids),
      this.req<CancelGetResult>("cancel.get", { ...ids, channel_id: command.channel }),
      this.req<CardGetResult>("card.get", { project_id: command.project, card_ids: [command.payload.tool_call_card_id] }),
    ]);
    if (recordR.status === "rejected") {
      if (recordR.reason instanceof LedgerError && recordR.reason.code === "unknown_call") {
        return this.reject(m, "unknown_call", "the command names a call the ledger never dispatched", [
          { field: `header.${H.callId}`, code: "not_found", message: "no such dispatched call" },
        ]);
      }
      throw recordR.reason;
    }
    const record = recordR.value;
    if (record.state === "woken") return m.ack();
    if (record.state === "claimed") {
      await this.withRetry(() => this.req<ReportResult>("report.resume", ids));
      return m.ack();
    }
    if (record.two_phase) return m.ack(); // prepared: the decision comes through the consumer
    if (canceledR.status === "rejected") throw canceledR.reason;
    if (cardsR.status === "rejected") throw cardsR.reason;
    const card = cardsR.value.cards[0]?.card as Card<ToolCallContent> | undefined;
    if (!card) throw new CgLedgerError(`call card ${command.payload.tool_call_card_id} is not readable`);
    const toolName = command.payload.tool_name ?? card.content.tool_name;
    const def = await this.definition(record, toolName);
    const determinism = this.opts.determinism ?? def?.determinism ?? "side_effectful";
    const deadline = command.payload.deadline_unix_ms ?? record.deadline_unix_ms ?? Date.now() + 30_000;
    const call: ToolCall = {
      project: command.project,
      channel: command.channel,
      agentId: command.agentId,
      turnId: command.turnId,
      callId: command.callId,
      epoch: command.epoch,
      stepId: command.stepId,
      contextBoxId: command.contextBoxId,
      toolName,
      arguments: card.content.arguments,
      card,
      deadlineUnixMs: deadline,
      idempotencyKey: m.headers?.get(H.idempotencyKey) || idempotencyKey(command.project, command.turnId, command.callId),
      deliveryCount: m.info.deliveryCount,
      definition: def,
      signal: ctl.signal,
      record,
    };
    const finish = (o: ToolOutcome, tag: string, attemptOutcome?: ReportBody["attempt_outcome"]) =>
      this.finish(m, command, call, o, tag, attemptOutcome);

    if (canceledR.value.canceled || abortReason(ctl.signal) === "canceled") return finish(canceledOutcome(0), "canceled");
    if (Date.now() >= deadline) return finish(deadlineOutcome(deadline, 0), "late");
    if (m.info.deliveryCount > (this.opts.maxDeliveries ?? 5) && determinism !== "side_effectful") {
      return finish(
        failed("internal_error", `delivered ${m.info.deliveryCount} times without an outcome`, {
          taxonomy_code: "S-TOOL-REDELIVERY",
          class: "terminal_error",
          attempts: 0,
          fix_hint: "the tool service kept failing to finish this call; see its log",
        }),
        "redelivery",
      );
    }

    const heartbeat = setInterval(() => m.working(), this.heartbeatMs());
    const timer = setTimeout(() => ctl.abort(new Abort("timeout")), Math.max(0, deadline - Date.now()));
    try {
      let tag = `d${m.info.deliveryCount}`;
      if (determinism === "side_effectful") {
        // Intent before effect: run only on started: true (protocol.md, attempt.start).
        let notDone = 0;
        for (;;) {
          const body: Record<string, unknown> = { ...ids, executor_id: this.executorId, deadline_unix_ms: deadline };
          if (notDone) body.not_done = notDone;
          let a: AttemptStartResult;
          try {
            a = await this.withRetry(() => this.req<AttemptStartResult>("attempt.start", body));
          } catch (err) {
            if (err instanceof LedgerError && err.code === "conflict") {
              // Reported meanwhile: finish it rather than run.
              await this.withRetry(() => this.req<ReportResult>("report.resume", ids)).catch(() => undefined);
              return m.ack();
            }
            throw err;
          }
          call.attempt = a.attempt;
          if (a.started) {
            tag = `a${a.attempt}`;
            break;
          }
          if (!this.opts.reconcile) {
            return await finish(
              failed("internal_error", `attempt ${a.attempt} of this call was left open by ${a.executor_id}: its effect is unknown`, {
                taxonomy_code: "S-TOOL-OUTCOME-UNKNOWN",
                class: "terminal_error",
                attempts: a.attempt,
                fix_hint: `check upstream whether the effect with idempotency key ${a.idempotency_key} took place, then resolve the call (cgledger calls resolve)`,
              }),
              `u${a.attempt}`,
              "outcome_unknown",
            );
          }
          const found = await this.opts.reconcile(call, a.attempt);
          if (found.done) {
            let o = toOutcome(found.outcome);
            if (o.status === "failed" && o.error) o = new ToolOutcome({ ...o, error: { ...o.error, detail: { ...o.error.detail, reconciled: true } } });
            return await finish(o, `a${a.attempt}`, "reconciled");
          }
          notDone = a.attempt;
        }
      }
      const attempts = call.attempt ?? 1;
      let outcome: ToolOutcome;
      const run = Promise.resolve().then(() => this.handler(call));
      if (determinism === "side_effectful") {
        // The effect may be under way: wait for the handler's own answer, whatever the signal says.
        try {
          outcome = toOutcome(await run);
        } catch (err) {
          outcome = ctl.signal.aborted ? abortedOutcome(ctl.signal.reason, deadline, attempts) : errorOutcome(err, attempts);
        }
      } else {
        const aborted = new Promise<never>((_, reject) => {
          if (ctl.signal.aborted) reject(ctl.signal.reason);
          ctl.signal.addEventListener("abort", () => reject(ctl.signal.reason), { once: true });
        });
        try {
          outcome = toOutcome(await Promise.race([run, aborted]));
        } catch (err) {
          outcome = ctl.signal.aborted ? abortedOutcome(ctl.signal.reason, deadline, attempts) : errorOutcome(err, attempts);
        }
        run.catch(() => undefined);
      }
      if (ctl.signal.reason instanceof CgLedgerError && this.stopping) {
        // Stopped mid-call: hand the command back rather than report an outcome it did not reach.
        return m.nak();
      }
      if (outcome.status === "prepared" && !this.opts.onDecision) {
        // Nobody would answer the decision: end the call now rather than at its deadline.
        outcome = failed("internal_error", "the handler prepared the call but the service has no onDecision hook", {
          taxonomy_code: "S-TOOL-ERROR",
          class: "terminal_error",
          attempts,
        });
      }
      if (outcome.status === "prepared" && outcome.prepare) {
        await this.withRetry(() =>
          this.req<PrepareResult>("prepare", {
            ...ids,
            commit_token: outcome.prepare!.commitToken,
            commit_deadline_unix_ms: outcome.prepare!.commitDeadlineUnixMs,
          }),
        );
        return m.ack();
      }
      return await finish(outcome, tag);
    } finally {
      clearInterval(heartbeat);
      clearTimeout(timer);
    }
  }

  private async handleDecision(m: JsMsg): Promise<void> {
    let d: DecisionEntry;
    try {
      d = m.json<DecisionEntry>();
    } catch {
      return m.term("not a decision entry");
    }
    const { violations, command } = validateCommand(
      `cg.v1.${d.project_id}.${d.channel_id}.cmd.tool.${this.tool}`,
      m.headers,
      utf8.encode(JSON.stringify({ tool_call_card_id: "decision", after_execution: "suspend" })),
      this.tool,
    );
    if (!command || violations.length) return m.term("decision without a call identity");
    const ids = { project_id: d.project_id, agent_turn_id: d.agent_turn_id, tool_call_id: d.tool_call_id };
    const record = await this.req<CallRecord>("call.get", { ...ids, two_phase: true });
    if (record.state === "woken") return m.ack();
    if (record.state === "claimed") {
      await this.withRetry(() => this.req<ReportResult>("report.resume", ids));
      return m.ack();
    }
    if (!this.opts.onDecision) {
      this.report("decision", new CgLedgerError(`a ${d.decision} decision arrived for ${d.agent_turn_id}/${d.tool_call_id} and the service has no onDecision hook`));
      return m.ack();
    }
    const cards = await this.req<CardGetResult>("card.get", { project_id: d.project_id, card_ids: [record.tool_call_card_id] });
    const card = cards.cards[0]?.card as Card<ToolCallContent>;
    const ctl = new AbortController();
    const deadline = record.deadline_unix_ms ?? Date.now() + 30_000;
    command.payload = { tool_call_card_id: record.tool_call_card_id, tool_name: d.tool_name, after_execution: record.after_execution };
    const call = {
      project: d.project_id,
      channel: d.channel_id,
      agentId: d.agent_id,
      turnId: d.agent_turn_id,
      callId: d.tool_call_id,
      epoch: command.epoch,
      stepId: command.stepId,
      contextBoxId: command.contextBoxId,
      toolName: d.tool_name,
      arguments: card.content.arguments,
      card,
      deadlineUnixMs: deadline,
      idempotencyKey: idempotencyKey(d.project_id, d.agent_turn_id, d.tool_call_id),
      deliveryCount: m.info.deliveryCount,
      signal: ctl.signal,
      record,
    };
    const heartbeat = setInterval(() => m.working(), this.heartbeatMs());
    let outcome: ToolOutcome;
    try {
      outcome = toOutcome(await this.opts.onDecision({ decision: d.decision, decidedBy: d.decided_by, commitToken: d.commit_token, call }));
    } catch (err) {
      outcome = errorOutcome(err, 1);
    } finally {
      clearInterval(heartbeat);
    }
    return this.finish(m, command, call, outcome, `decision-${d.decision}`);
  }

  /** Steps 5-7: the result card (metadata copied verbatim) and the report in one report.result, retried until it lands, then the ack. */
  private async finish(
    m: JsMsg,
    command: ValidCommand,
    call: Pick<ToolCall, "card" | "toolName" | "turnId" | "callId" | "project">,
    outcome: ToolOutcome,
    tag: string,
    attemptOutcome?: ReportBody["attempt_outcome"],
  ): Promise<void> {
    const status = outcome.status === "prepared" ? "failed" : outcome.status;
    const content: ToolResultContent = { status, result: outcome.result ?? null };
    if (outcome.error) content.error = outcome.error;
    const card: Card<ToolResultContent> = {
      card_id: resultCardId(call.project, call.turnId, call.callId, tag),
      project_id: call.project,
      type: "tool.result",
      author_id: this.sourceId,
      function_name: call.toolName,
      agent_turn_id: call.turnId,
      tool_call_id: call.callId,
      content,
      metadata: call.card.metadata as CardMetadata,
    };
    const hdrs: Record<string, string> = {
      [H.agentId]: command.agentId,
      [H.turnId]: command.turnId,
      [H.epoch]: command.epoch,
      [H.callId]: command.callId,
      [H.projectId]: command.project,
      [H.channelId]: command.channel,
      [H.sourceId]: this.sourceId,
      [H.sourceFunction]: call.toolName,
    };
    if (command.stepId !== undefined) hdrs[H.stepId] = command.stepId;
    const tp = childTraceparent(command.traceparent);
    if (tp) hdrs[H.traceparent] = tp;
    const report: ReportResultBody["report"] = {
      status: status as Status,
      after_execution: command.payload.after_execution as AfterExecution,
    };
    if (command.stepId !== undefined) report.step_id = command.stepId;
    if (attemptOutcome) report.attempt_outcome = attemptOutcome;
    // One request for the card and the report (report.result): stored together or not at all.
    const send = () => this.withRetry(() => this.conn.reportResult(this.tool, { card, report }, hdrs));
    try {
      try {
        await send();
      } catch (err) {
        if (!(err instanceof LedgerError && err.code === "conflict" && err.violations.some((v) => v.field === "body.card.card_id"))) throw err;
        // Another card holds the derived id (a run that died with other content): take a fresh one.
        card.card_id = "res-" + randomBytes(16).toString("hex");
        await send();
      }
    } catch (err) {
      if (err instanceof LedgerError && err.code !== "internal") {
        // A refused report will not pass on a redelivery either (late: the ledger's timeout
        // stands; conflict: another report won): record why and let the command go.
        this.report("report", err);
        return m.ack();
      }
      throw err;
    }
    m.ack();
  }

  /** A command that does not validate: answered through its call's report when it names one, else command.reject. */
  private async refuse(m: JsMsg, violations: Violation[], identity?: { project: string; channel: string; turnId: string; callId: string }): Promise<void> {
    if (identity && identity.project === this.conn.project) {
      let record: CallRecord | undefined;
      try {
        record = await this.req<CallRecord>("call.get", { project_id: identity.project, agent_turn_id: identity.turnId, tool_call_id: identity.callId });
      } catch (err) {
        if (!(err instanceof LedgerError && err.code === "unknown_call")) throw err;
      }
      if (record && record.channel_id === identity.channel && record.subject === m.subject) {
        if (record.state === "woken") return m.ack();
        if (record.state === "claimed") {
          await this.withRetry(() => this.req<ReportResult>("report.resume", { project_id: identity.project, agent_turn_id: identity.turnId, tool_call_id: identity.callId }));
          return m.ack();
        }
        const cards = await this.req<CardGetResult>("card.get", { project_id: identity.project, card_ids: [record.tool_call_card_id] });
        const card = cards.cards[0]?.card as Card<ToolCallContent>;
        const command: ValidCommand = {
          project: identity.project,
          channel: identity.channel,
          target: this.tool,
          agentId: record.agent_id,
          turnId: identity.turnId,
          callId: identity.callId,
          epoch: String(record.turn_epoch),
          stepId: record.step_id,
          payload: { tool_call_card_id: record.tool_call_card_id, tool_name: card.content.tool_name, after_execution: record.after_execution },
        };
        const o = failed("bad_request", `invalid tool command: ${violations.length} violation(s)`, {
          taxonomy_code: "I-REQ-002",
          class: "invalid_request",
          attempts: 0,
          violations,
        });
        return this.finish(m, command, { card, toolName: card.content.tool_name, turnId: identity.turnId, callId: identity.callId, project: identity.project }, o, "invalid");
      }
    }
    return this.reject(m, "bad_request", `invalid tool command: ${violations.length} violation(s)`, violations);
  }

  private async reject(m: JsMsg, code: CommandRejectBody["error"]["code"], message: string, violations: Violation[]): Promise<void> {
    const headers: Record<string, string[]> = {};
    if (m.headers) for (const [k, vs] of m.headers) headers[k] = [...vs];
    const body: CommandRejectBody = {
      subject: m.subject,
      headers,
      data: Buffer.from(m.data).toString("base64"),
      error: { code, message, violations: violations.slice(0, 256) },
    };
    await this.withRetry(() => this.req<CommandRejectResult>("command.reject", body));
    m.ack();
  }

  private async withRetry<T>(f: () => Promise<T>): Promise<T> {
    for (let i = 0; ; i++) {
      try {
        return await f();
      } catch (err) {
        if (!isRetryable(err) || i >= 4 || this.conn.nc.isClosed()) throw err;
        await new Promise((r) => setTimeout(r, 200 * 2 ** i));
      }
    }
  }
}

function abortedOutcome(reason: unknown, deadline: number, attempts: number): ToolOutcome {
  if (reason instanceof Abort && reason.reason === "canceled") return canceledOutcome(attempts);
  if (reason instanceof Abort) return deadlineOutcome(deadline, attempts);
  return errorOutcome(reason, attempts);
}

/** The reason an aborted ToolCall.signal carries: "canceled" or "timeout". */
export function abortReason(signal: AbortSignal): "canceled" | "timeout" | undefined {
  return signal.reason instanceof Abort ? signal.reason.reason : undefined;
}
