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
 * The request got no answer: no ledger process serves the operation (`no responders`, e.g.
 * inbox.list with no projector running) or none answered in time. Retry the same request: every
 * write of the protocol is safe to repeat.
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
