import { readFile } from "node:fs/promises";
import { connect as natsConnect, credsAuthenticator, errors as natsErrors, headers as natsHeaders } from "@nats-io/transport-node";
import type { MsgHdrs, NatsConnection, NodeConnectionOptions } from "@nats-io/transport-node";
import { LedgerError, PermissionDeniedError, ProtocolError, UnavailableError, UnknownOpError } from "./errors.js";
import { OPS, apiSubject, isIdentifier } from "./protocol.js";
import type { ReportResultBody, ReportResultReply } from "./protocol.js";
import type { ErrorBody } from "./protocol.js";

/** How to reach the ledger's NATS server. */
export interface ConnectOptions {
  /** NATS URL(s), e.g. `nats://127.0.0.1:4222`. */
  servers: string | string[];
  /** The project every request is about (`cgledger.v1.<project>...`). */
  project: string;
  /** Path of a `.creds` file from `cgledger creds issue`; omit for a `--no-auth` server. */
  credsFile?: string;
  /** The `.creds` file's content, instead of `credsFile`. */
  creds?: string | Uint8Array;
  /** Connection name shown by the NATS server. */
  name?: string;
  /** How long a request waits for its answer (default 10 s). */
  requestTimeoutMs?: number;
  /** Further options of the NATS connection (`tls`, `reconnectTimeWait`, ...); the inbox prefix and authenticator are the SDK's. */
  nats?: Partial<NodeConnectionOptions>;
}

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder();

/**
 * The inbox prefix a credential may receive replies under, `_INBOX_<user public key>`, read from
 * the `sub` of the user JWT in a `.creds` file (security.md: a credential gets replies only there).
 */
export function inboxPrefixOf(creds: string): string {
  const m = /-----BEGIN NATS USER JWT-----\s*([A-Za-z0-9_\-.=]+)\s*-+END NATS USER JWT-+/.exec(creds);
  if (!m) throw new ProtocolError("creds: no user JWT block");
  const parts = m[1].split(".");
  if (parts.length !== 3) throw new ProtocolError("creds: the user JWT does not have three parts");
  const claims = JSON.parse(Buffer.from(parts[1], "base64url").toString("utf8")) as { sub?: unknown };
  if (typeof claims.sub !== "string" || !/^U[A-Z2-7]{55}$/.test(claims.sub)) {
    throw new ProtocolError("creds: the user JWT has no user public key in sub");
  }
  return `_INBOX_${claims.sub}`;
}

/** An open connection to the ledger, with its project. Workers and tool services share one. */
export class LedgerConnection {
  readonly nc: NatsConnection;
  readonly project: string;
  readonly inboxPrefix: string;
  readonly requestTimeoutMs: number;

  private constructor(nc: NatsConnection, project: string, inboxPrefix: string, requestTimeoutMs: number) {
    this.nc = nc;
    this.project = project;
    this.inboxPrefix = inboxPrefix;
    this.requestTimeoutMs = requestTimeoutMs;
  }

  /**
   * Connects with a credential and the inbox prefix it allows. The connection reconnects for
   * ever; a worker lists its pending results after each reconnect (Worker.awaitResult).
   */
  static async connect(opts: ConnectOptions): Promise<LedgerConnection> {
    if (!isIdentifier(opts.project)) throw new ProtocolError(`project ${JSON.stringify(opts.project)} is not an identifier`);
    let creds: string | undefined;
    if (opts.creds !== undefined) creds = typeof opts.creds === "string" ? opts.creds : fromUtf8.decode(opts.creds);
    else if (opts.credsFile !== undefined) creds = await readFile(opts.credsFile, "utf8");
    const inboxPrefix = creds ? inboxPrefixOf(creds) : "_INBOX";
    const nc = await natsConnect({
      maxReconnectAttempts: -1,
      ...opts.nats,
      servers: opts.servers,
      name: opts.name ?? opts.nats?.name,
      inboxPrefix,
      authenticator: creds ? credsAuthenticator(utf8.encode(creds)) : opts.nats?.authenticator,
    });
    return new LedgerConnection(nc, opts.project, inboxPrefix, opts.requestTimeoutMs ?? 10_000);
  }

  /**
   * Sends `op` as `actor` and returns the answer's result, or throws: LedgerError for a refusal
   * (its code and every violation), PermissionDeniedError when NATS refused the subject,
   * UnavailableError on no responders or a timeout, UnknownOpError (before sending) for an op
   * not in OPS.
   */
  async request<T>(actor: string, op: string, body: unknown, hdrs?: Record<string, string>, timeoutMs?: number): Promise<T> {
    if (!OPS.includes(op)) throw new UnknownOpError(op);
    const subject = apiSubject(this.project, actor, op);
    let h: MsgHdrs | undefined;
    if (hdrs) {
      h = natsHeaders();
      for (const [k, v] of Object.entries(hdrs)) h.set(k, v);
    }
    let reply;
    try {
      reply = await this.nc.request(subject, utf8.encode(JSON.stringify(body)), {
        timeout: timeoutMs ?? this.requestTimeoutMs,
        headers: h,
      });
    } catch (err) {
      throw classify(subject, err);
    }
    let env: { ok?: unknown; result?: unknown; error?: ErrorBody };
    try {
      env = JSON.parse(fromUtf8.decode(reply.data));
    } catch {
      throw new ProtocolError(`${op}: the reply is not JSON: ${fromUtf8.decode(reply.data).slice(0, 200)}`);
    }
    if (env.ok === true) return env.result as T;
    if (env.ok === false && env.error && typeof env.error.code === "string") throw new LedgerError(op, env.error);
    throw new ProtocolError(`${op}: the reply is not the {"ok":...} envelope`);
  }

  /**
   * Stores a call's tool.result card and its report in one request (`report.result`), as the
   * tool target `actor`: `hdrs` are the report's headers (the command's identity unchanged,
   * CG-Project-Id, CG-Channel-Id, CG-Source-Id, CG-Source-Function). The ledger stores both or
   * neither; a retry with the same card and body answers `duplicate` (and `card_duplicate`).
   */
  reportResult(actor: string, body: ReportResultBody, hdrs: Record<string, string>, timeoutMs?: number): Promise<ReportResultReply> {
    return this.request<ReportResultReply>(actor, "report.result", body, hdrs, timeoutMs);
  }

  /** Drains and closes the connection. */
  async close(): Promise<void> {
    if (!this.nc.isClosed()) await this.nc.drain().catch(() => this.nc.close());
  }
}

function classify(subject: string, err: unknown): Error {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    if (e instanceof natsErrors.PermissionViolationError) return new PermissionDeniedError(subject, e);
    if (e instanceof natsErrors.NoRespondersError) return new UnavailableError(subject, "no_responders", err);
    if (e instanceof natsErrors.TimeoutError) return new UnavailableError(subject, "timeout", err);
    if (e instanceof natsErrors.RequestError && e.isNoResponders()) return new UnavailableError(subject, "no_responders", err);
    if (/permissions violation/i.test(e.message)) return new PermissionDeniedError(subject, e);
  }
  return err instanceof Error ? err : new Error(String(err));
}
