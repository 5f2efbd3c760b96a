import type { Status } from "./protocol.js";

/** The error classes of executor.md's taxonomy, as `error.detail.class`. */
export type ErrorClass = "retryable_error" | "terminal_error" | "invalid_request" | "partial";

/**
 * What a tool handler answers, when a plain return value (reported `success` with it as `result`)
 * is not enough. Build one with `success`, `failed`, `partial`, `timedOut` or `prepared`.
 */
export class ToolOutcome {
  readonly status: Status | "prepared";
  readonly result?: unknown;
  readonly error?: { code: string; message: string; detail: Record<string, unknown> };
  /** For `prepared`: the commit token and deadline (two-phase commit). */
  readonly prepare?: { commitToken: string; commitDeadlineUnixMs: number };

  constructor(init: {
    status: Status | "prepared";
    result?: unknown;
    error?: { code: string; message: string; detail: Record<string, unknown> };
    prepare?: { commitToken: string; commitDeadlineUnixMs: number };
  }) {
    this.status = init.status;
    this.result = init.result;
    this.error = init.error;
    this.prepare = init.prepare;
  }
}

/** A successful result. */
export function success(result?: unknown): ToolOutcome {
  return new ToolOutcome({ status: "success", result: result ?? null });
}

/**
 * A failure: `code` is the card's `error.code` (`bad_request`, `auth_failed`,
 * `upstream_unavailable`, `internal_error`, ...), `detail` its `error.detail` (taxonomy_code,
 * class, fix_hint, ...: executor.md, Outcomes).
 */
export function failed(code: string, message: string, detail: Record<string, unknown> = {}): ToolOutcome {
  return new ToolOutcome({
    status: "failed",
    result: { error_code: code, error_message: message },
    error: { code, message, detail },
  });
}

/** A partial result: the tool's output, with the reason it is not whole. */
export function partial(result: unknown, taxonomyCode = "PARTIAL", message = "partial result"): ToolOutcome {
  return new ToolOutcome({
    status: "partial",
    result,
    error: { code: "internal_error", message, detail: { taxonomy_code: taxonomyCode, class: "partial" } },
  });
}

/** A timeout the tool itself ran into (an upstream's, say), reported `timeout`. */
export function timedOut(message: string, detail: Record<string, unknown> = {}): ToolOutcome {
  return new ToolOutcome({
    status: "timeout",
    result: { error_code: "tool_timeout", error_message: message },
    error: { code: "tool_timeout", message, detail: { taxonomy_code: "R-TIMEOUT-001", class: "retryable_error", ...detail } },
  });
}

/**
 * Phase 1 of a two-phase commit: the effect is reserved under `commitToken` until
 * `commitDeadlineUnixMs` (at most the call's deadline). The service records it (`prepare`), and
 * the worker's commit or abort reaches the service's `onDecision` hook, whose answer is the
 * call's result.
 */
export function prepared(commitToken: string, commitDeadlineUnixMs: number): ToolOutcome {
  return new ToolOutcome({ status: "prepared", prepare: { commitToken, commitDeadlineUnixMs } });
}

/** Thrown by a handler: reported `failed` with this code, message and detail. */
export class ToolFailure extends Error {
  readonly code: string;
  readonly detail: Record<string, unknown>;
  constructor(code: string, message: string, detail: Record<string, unknown> = {}) {
    super(message);
    this.name = "ToolFailure";
    this.code = code;
    this.detail = detail;
  }
}
