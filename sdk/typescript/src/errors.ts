import type { ErrorBody, ErrorCode, Violation } from "./protocol.js";

/** Every error the SDK throws. */
export class CgLedgerError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "CgLedgerError";
  }
}

/**
 * The ledger refused a request: `{"ok":false,"error":{...}}`. `code` is the protocol's error code,
 * `violations` every problem the ledger listed, `rejectionSeq` the rejection entry recording a
 * refused write (absent for reads).
 */
export class LedgerError extends CgLedgerError {
  readonly code: ErrorCode;
  readonly violations: readonly Violation[];
  readonly rejectionSeq?: number;
  /** The operation refused (`dispatch`, `report`, ...). */
  readonly op: string;

  constructor(op: string, body: ErrorBody) {
    const n = body.violations?.length ?? 0;
    super(`${op}: ${body.code}: ${body.message}${n ? ` (${body.violations!.map((v) => `${v.field} ${v.code}`).join(", ")})` : ""}`);
    this.name = "LedgerError";
    this.op = op;
    this.code = body.code as ErrorCode;
    this.violations = body.violations ?? [];
    this.rejectionSeq = body.rejection_seq;
  }

  /** Whether a violation with this code (and field, when given) is listed. */
  has(code: string, field?: string): boolean {
    return this.violations.some((v) => v.code === code && (field === undefined || v.field === field));
  }
}

/**
 * NATS refused to deliver the request: the credential may not publish on the subject (another
 * project or actor), or may not subscribe to its reply inbox. Nothing reached the ledger and
 * nothing was recorded (protocol.md, Connecting).
 */
export class PermissionDeniedError extends CgLedgerError {
  readonly subject: string;
  constructor(subject: string, cause: unknown) {
    super(`permissions violation: ${subject}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = "PermissionDeniedError";
    this.subject = subject;
  }
}

/**
 * The request got no answer. `no_responders`: no server subscribes to the request's subject at
 * all, because the ledger (or, for inbox.list and the other reads of the views, the projector) is
 * not running, or because the subject is wrong (an op the ledger does not serve: the SDK refuses
 * an op outside the protocol's list with UnknownOpError before sending). `timeout`: a server got
 * it but did not answer in time. Every write of the protocol is safe to repeat, so retrying the
 * same request is right, but bound the retries (a count or a deadline, with backoff): a ledger that
 * is down, or a subject nobody serves, answers no responders for ever.
 */
export class UnavailableError extends CgLedgerError {
  readonly subject: string;
  readonly reason: "no_responders" | "timeout";
  constructor(subject: string, reason: "no_responders" | "timeout", cause: unknown) {
    super(`${reason === "timeout" ? "request timed out" : "no responders"}: ${subject}`, { cause });
    this.name = "UnavailableError";
    this.subject = subject;
    this.reason = reason;
  }
}

/**
 * `Worker.awaitResult` got no result within its `timeoutMs`. The call is not affected: it may
 * still be answered; await it again, or list the Inbox later.
 */
export class TimeoutError extends CgLedgerError {
  readonly code = "timeout" as const;
  readonly turnId: string;
  readonly callId: string;
  readonly timeoutMs: number;
  constructor(turnId: string, callId: string, timeoutMs: number) {
    super(`no result for turn ${turnId} call ${callId} after ${timeoutMs} ms`);
    this.name = "TimeoutError";
    this.turnId = turnId;
    this.callId = callId;
    this.timeoutMs = timeoutMs;
  }
}

/**
 * The `signal` given to `Worker.awaitResult` was aborted. `name` is `"AbortError"`, as for a DOM
 * abort, and `cause` is the signal's reason; the call is not affected.
 */
export class AbortError extends CgLedgerError {
  readonly code = "aborted" as const;
  constructor(message: string, reason: unknown) {
    super(message, { cause: reason });
    this.name = "AbortError";
  }
}

/**
 * The op is not one of the protocol's (`OPS`): refused before anything is sent, since no server
 * would answer it (it would come back as no responders, which looks retryable). Not retryable.
 */
export class UnknownOpError extends CgLedgerError {
  readonly code = "unknown_op" as const;
  readonly op: string;
  constructor(op: string) {
    super(`unknown op ${JSON.stringify(op)}: not an op of the protocol (docs/protocol.md)`);
    this.name = "UnknownOpError";
    this.op = op;
  }
}

/** A reply that is not the protocol's `{"ok":...}` envelope. */
export class ProtocolError extends CgLedgerError {
  constructor(message: string) {
    super(message);
    this.name = "ProtocolError";
  }
}

/** Whether an error is worth retrying with the same request (`internal`, timeouts, no responders). */
export function isRetryable(err: unknown): boolean {
  return (err instanceof LedgerError && err.code === "internal") || err instanceof UnavailableError;
}
