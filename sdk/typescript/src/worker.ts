import { createHash } from "node:crypto";
import type { Subscription } from "@nats-io/transport-node";
import type { LedgerConnection } from "./connection.js";
import { AbortError, CgLedgerError, TimeoutError, UnavailableError } from "./errors.js";
import { H, isIdentifier } from "./protocol.js";
import type {
  AfterExecution,
  CallRecord,
  CancelResult,
  Card,
  CardGetResult,
  CardMetadata,
  ConsumeResult,
  DecisionResult,
  DispatchBody,
  DispatchChecks,
  DispatchResult,
  InboxEntry,
  InboxListResult,
  RosterEntry,
  Status,
  ToolCallContent,
  ToolResultContent,
  Wakeup,
} from "./protocol.js";

/** Who the worker acts for. */
export interface WorkerOptions {
  /** The agent: the actor of every request and `CG-Agent-Id` of every dispatch. */
  agentId: string;
  /** The worker target whose wakeups this worker receives (default: the agent id, as `creds issue` binds it). */
  workerTarget?: string;
  /** How often awaitResult lists the Inbox while it waits, besides wakeups and reconnects (default 10 s). */
  recoverEveryMs?: number;
}

/** A call's identity within the worker's agent. */
export interface CallRef {
  turnId: string;
  callId: string;
}

/** One tool call to dispatch. The same options dispatch the same call: repeating it is answered `duplicate`. */
export interface DispatchOptions extends CallRef {
  /** The tool's name (the card's `content.tool_name`). */
  tool: string;
  /** The command's tool target (default `tool`); ignored when `subject` is given. */
  target?: string;
  /** The channel (default `main`). */
  channel?: string;
  /** The full command subject, e.g. a registered tool's `target_subject` with its tokens filled in. */
  subject?: string;
  /** The turn epoch (default 1). */
  epoch?: number | bigint | string;
  /** The arguments (default `{}`). */
  args?: Record<string, unknown>;
  afterExecution?: AfterExecution;
  /** The call's time budget from dispatch (default: the tool's `timeout_ms_default`). */
  timeoutMs?: number;
  stepId?: string;
  contextBoxId?: string;
  traceparent?: string;
  tracestate?: string;
  metadata?: CardMetadata;
  /** The tool.call card's id (default `cc-` and 24 hex digits derived from project, turn and call). */
  cardId?: string;
  /** The card's `author_id` (default the agent id). */
  authorId?: string;
  /** Hold this call for an approver's decision. */
  approvalRequired?: boolean;
  /** Ask the ledger to refuse, on record, an unknown tool (registered) or arguments failing its schema (arguments). */
  checks?: DispatchChecks;
}

/** A call's result, once reported. */
export interface CallResult {
  status: Status;
  /** The `tool.result` card. */
  card: Card<ToolResultContent>;
  /** The call record the result was confirmed with (`state` `claimed` or `woken`). */
  record: CallRecord;
  /** How the worker learnt of it: its wakeup, the Inbox listing, or the record read when awaiting. */
  via: "wakeup" | "inbox" | "call.get";
}

interface Waiter {
  resolve(r: CallResult): void;
  reject(e: unknown): void;
  checking: boolean;
}

/** The card id dispatch uses by default: `cc-` and 24 hex digits of SHA-256 over project, turn and call. */
export function defaultCallCardId(project: string, turnId: string, callId: string): string {
  return "cc-" + createHash("sha256").update(`${project}\u0000${turnId}\u0000${callId}`).digest("hex").slice(0, 24);
}

/**
 * A worker (agent runtime) of one agent: dispatches calls, awaits their results (wakeups, and the
 * agent's pending Inbox after every reconnect), consumes them, cancels calls, sets its roster entry.
 */
export class Worker {
  readonly conn: LedgerConnection;
  readonly agentId: string;
  readonly workerTarget: string;
  private readonly recoverEveryMs: number;
  private readonly waiters = new Map<string, Waiter[]>();
  private sub?: Subscription;
  private timer?: NodeJS.Timeout;
  private closed = false;

  constructor(conn: LedgerConnection, opts: WorkerOptions) {
    if (!isIdentifier(opts.agentId)) throw new CgLedgerError(`agentId ${JSON.stringify(opts.agentId)} is not an identifier`);
    this.conn = conn;
    this.agentId = opts.agentId;
    this.workerTarget = opts.workerTarget ?? opts.agentId;
    this.recoverEveryMs = opts.recoverEveryMs ?? 10_000;
  }

  private req<T>(op: string, body: unknown, hdrs?: Record<string, string>): Promise<T> {
    return this.conn.request<T>(this.agentId, op, body, hdrs);
  }

  /** Writes the agent's roster entry: its wakeups go to `workerTarget` (default this worker's). */
  setRoster(workerTarget: string = this.workerTarget): Promise<RosterEntry> {
    return this.req("roster.set", { project_id: this.conn.project, agent_id: this.agentId, worker_target: workerTarget });
  }

  /**
   * Dispatches a call: the tool.call card and the command, in one request. Idempotent on the call
   * identity: the same options again are answered with the original result (`duplicate: true`);
   * anything different under the same (turn, call) is a `conflict` LedgerError.
   */
  dispatch(o: DispatchOptions): Promise<DispatchResult> {
    const project = this.conn.project;
    const channel = o.channel ?? "main";
    const subject = o.subject ?? `cg.v1.${project}.${channel}.cmd.tool.${o.target ?? o.tool}`;
    const cardId = o.cardId ?? defaultCallCardId(project, o.turnId, o.callId);
    const card: Card<ToolCallContent> = {
      card_id: cardId,
      project_id: project,
      type: "tool.call",
      author_id: o.authorId ?? this.agentId,
      agent_turn_id: o.turnId,
      tool_call_id: o.callId,
      content: { tool_name: o.tool, arguments: o.args ?? {} },
    };
    if (o.metadata) card.metadata = o.metadata;
    const body: DispatchBody = {
      subject,
      card,
      payload: { tool_call_card_id: cardId, tool_name: o.tool, after_execution: o.afterExecution ?? "suspend" },
    };
    if (o.timeoutMs !== undefined) body.payload.timeout_ms = o.timeoutMs;
    if (o.approvalRequired) body.approval = { required: true };
    if (o.checks?.registered || o.checks?.arguments) body.checks = { ...o.checks };
    const hdrs: Record<string, string> = {
      [H.agentId]: this.agentId,
      [H.turnId]: o.turnId,
      [H.epoch]: String(o.epoch ?? 1),
      [H.callId]: o.callId,
    };
    if (o.stepId !== undefined) hdrs[H.stepId] = o.stepId;
    if (o.contextBoxId !== undefined) hdrs[H.contextBoxId] = o.contextBoxId;
    if (o.traceparent !== undefined) hdrs[H.traceparent] = o.traceparent;
    if (o.tracestate !== undefined) hdrs[H.tracestate] = o.tracestate;
    return this.req("dispatch", body, hdrs);
  }

  /** Reads the call record (`call.get`; `twoPhase` adds the prepared call's token and decision). */
  callGet(ref: CallRef, twoPhase = false): Promise<CallRecord> {
    const body: Record<string, unknown> = { project_id: this.conn.project, agent_turn_id: ref.turnId, tool_call_id: ref.callId };
    if (twoPhase) body.two_phase = true;
    return this.req("call.get", body);
  }

  /** Reads cards by id. */
  cardGet(ids: string[]): Promise<CardGetResult> {
    return this.req("card.get", { project_id: this.conn.project, card_ids: ids });
  }

  /** Records that the agent consumed the call's result (`inbox.consume`; again: `duplicate: true`). */
  consume(ref: CallRef): Promise<ConsumeResult> {
    return this.req("inbox.consume", {
      project_id: this.conn.project,
      agent_id: this.agentId,
      agent_turn_id: ref.turnId,
      tool_call_id: ref.callId,
    });
  }

  /** Asks to cancel a call. The call's outcome is still its report: await it as for any call. */
  cancel(ref: CallRef, reason?: string): Promise<CancelResult> {
    const body: Record<string, unknown> = {
      project_id: this.conn.project,
      agent_id: this.agentId,
      agent_turn_id: ref.turnId,
      tool_call_id: ref.callId,
    };
    if (reason !== undefined) body.reason = reason;
    return this.req("cancel", body);
  }

  /** Commits a prepared call (two-phase), with the token its tool prepared it under. */
  commit(ref: CallRef, commitToken: string): Promise<DecisionResult> {
    return this.decide("commit", ref, commitToken);
  }

  /** Aborts a prepared call (two-phase). */
  abort(ref: CallRef, commitToken: string): Promise<DecisionResult> {
    return this.decide("abort", ref, commitToken);
  }

  private decide(op: "commit" | "abort", ref: CallRef, token: string): Promise<DecisionResult> {
    return this.req(op, {
      project_id: this.conn.project,
      agent_id: this.agentId,
      agent_turn_id: ref.turnId,
      tool_call_id: ref.callId,
      commit_token: token,
    });
  }

  /**
   * Every pending result of the agent (`inbox.list`, every page): reported, not yet consumed. A
   * listing whose views lag (`as_of_seq` below `ledger_seq`) is listed again, up to `lagWaitMs`.
   */
  async pending(lagWaitMs = 5_000): Promise<InboxEntry[]> {
    const until = Date.now() + lagWaitMs;
    for (;;) {
      const items: InboxEntry[] = [];
      let cursor: string | undefined;
      let lagging = false;
      do {
        const body: Record<string, unknown> = { project_id: this.conn.project, agent_id: this.agentId, limit: 1000 };
        if (cursor) body.cursor = cursor;
        const page = await this.req<InboxListResult>("inbox.list", body);
        items.push(...page.items);
        if (page.as_of_seq < page.ledger_seq) lagging = true;
        cursor = page.next_cursor;
      } while (cursor);
      if (!lagging || Date.now() >= until) return items;
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /**
   * Starts receiving the worker target's wakeups and listing the Inbox after each reconnect.
   * awaitResult calls it; call it yourself to receive wakeups from the start.
   */
  async start(): Promise<void> {
    if (this.sub || this.closed) return;
    const subject = `cg.v1.${this.conn.project}.*.cmd.agent.${this.workerTarget}.wakeup`;
    this.sub = this.conn.nc.subscribe(subject, {
      callback: (err, msg) => {
        if (err) return;
        // A wakeup is a nudge (security.md): only the ledger's entry kind counts, and the result
        // is confirmed with call.get before anyone sees it.
        if (msg.headers?.get(H.entryKind) !== "wakeup") return;
        let w: Wakeup;
        try {
          w = msg.json<Wakeup>();
        } catch {
          return;
        }
        if (w.phase || w.agent_id !== this.agentId) return;
        void this.check(w.agent_turn_id, w.tool_call_id, "wakeup");
      },
    });
    await this.conn.nc.flush();
    void (async () => {
      for await (const s of this.conn.nc.status()) {
        if (this.closed) return;
        if (s.type === "reconnect") void this.recover();
      }
    })();
  }

  /**
   * Waits for the call's result: its wakeup, or (after a reconnect, and every `recoverEveryMs`)
   * the agent's pending Inbox, each confirmed with `call.get`, then reads the result card. It
   * does not consume the result: call `consume` once it is processed.
   */
  async awaitResult(ref: CallRef, opts: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<CallResult> {
    await this.start();
    const key = `${ref.turnId}\u0000${ref.callId}`;
    const p = new Promise<CallResult>((resolve, reject) => {
      const w: Waiter = { resolve, reject, checking: false };
      let t: NodeJS.Timeout | undefined;
      const list = this.waiters.get(key) ?? [];
      list.push(w);
      this.waiters.set(key, list);
      const done = () => {
        if (t) clearTimeout(t);
        const l = this.waiters.get(key)?.filter((x) => x !== w) ?? [];
        if (l.length) this.waiters.set(key, l);
        else this.waiters.delete(key);
        if (this.waiters.size === 0 && this.timer) {
          clearInterval(this.timer);
          this.timer = undefined;
        }
      };
      w.resolve = (r) => {
        done();
        resolve(r);
      };
      w.reject = (e) => {
        done();
        reject(e);
      };
      if (opts.signal) {
        const signal = opts.signal;
        const aborted = () => new AbortError(`awaitResult for turn ${ref.turnId} call ${ref.callId} aborted`, signal.reason);
        if (signal.aborted) w.reject(aborted());
        signal.addEventListener("abort", () => w.reject(aborted()), { once: true });
      }
      if (opts.timeoutMs !== undefined) {
        t = setTimeout(
          () => w.reject(new TimeoutError(ref.turnId, ref.callId, opts.timeoutMs!)),
          opts.timeoutMs,
        );
      }
    });
    if (!this.timer) {
      this.timer = setInterval(() => void this.recover(), this.recoverEveryMs);
      this.timer.unref();
    }
    void this.check(ref.turnId, ref.callId, "call.get");
    return p;
  }

  /** Lists the Inbox and settles the waiters whose results are on it (protocol.md, Recovering missed wakeups). */
  private async recover(): Promise<void> {
    if (this.waiters.size === 0) return;
    let items: InboxEntry[];
    try {
      items = await this.pending();
    } catch (err) {
      // No projector answers inbox.list: read each awaited call's record instead.
      if (err instanceof UnavailableError) {
        for (const key of [...this.waiters.keys()]) {
          const [turn, call] = key.split("\u0000");
          void this.check(turn, call, "call.get");
        }
      }
      return;
    }
    for (const it of items) {
      if (this.waiters.has(`${it.agent_turn_id}\u0000${it.tool_call_id}`)) void this.check(it.agent_turn_id, it.tool_call_id, "inbox");
    }
  }

  private async check(turnId: string, callId: string, via: CallResult["via"]): Promise<void> {
    const key = `${turnId}\u0000${callId}`;
    const ws = this.waiters.get(key);
    if (!ws || ws.every((w) => w.checking)) return;
    for (const w of ws) w.checking = true;
    try {
      const record = await this.callGet({ turnId, callId });
      if (!record.claim || (record.state !== "claimed" && record.state !== "woken")) return;
      const cards = await this.cardGet([record.claim.tool_result_card_id]);
      const card = cards.cards[0]?.card as Card<ToolResultContent> | undefined;
      if (!card) return;
      const r: CallResult = { status: record.claim.status, card, record, via };
      for (const w of this.waiters.get(key) ?? []) w.resolve(r);
    } catch (err) {
      // unknown_call and the like are final for the waiters; transient errors wait for the next look.
      if (!(err instanceof UnavailableError) && !(err instanceof Error && "code" in err && err.code === "internal")) {
        for (const w of this.waiters.get(key) ?? []) w.reject(err);
      }
    } finally {
      for (const w of this.waiters.get(key) ?? []) w.checking = false;
    }
  }

  /** Stops receiving wakeups and rejects every pending awaitResult. The connection stays open. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.sub?.unsubscribe();
    for (const ws of [...this.waiters.values()]) for (const w of ws) w.reject(new CgLedgerError("worker closed"));
  }
}
