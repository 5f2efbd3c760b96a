// @cgledger/client: a worker and a tool service for cgledger, written from docs/protocol.md.
export { LedgerConnection, inboxPrefixOf } from "./connection.js";
export type { ConnectOptions } from "./connection.js";
export { Worker, defaultCallCardId } from "./worker.js";
export type { CallRef, CallResult, DispatchOptions, WorkerOptions } from "./worker.js";
export { serveTool, validateCommand, idempotencyKey, abortReason } from "./tool.js";
export type { ReconcileAnswer, ServeToolOptions, ToolCall, ToolDecision, ToolHandler, ToolService, ValidCommand } from "./tool.js";
export { ToolOutcome, ToolFailure, success, failed, partial, timedOut, prepared } from "./outcome.js";
export type { ErrorClass } from "./outcome.js";
export {
  CgLedgerError,
  LedgerError,
  PermissionDeniedError,
  UnavailableError,
  TimeoutError,
  AbortError,
  UnknownOpError,
  ProtocolError,
  isRetryable,
} from "./errors.js";
export * from "./protocol.js";
export type * as openapi from "./openapi.gen.js";

import { LedgerConnection } from "./connection.js";
import type { ConnectOptions } from "./connection.js";

/** Connects to the ledger's NATS server with a credential (and the inbox prefix it allows). */
export function connect(opts: ConnectOptions): Promise<LedgerConnection> {
  return LedgerConnection.connect(opts);
}
