// Runs a real `cgledger serve` (the binary in CGLEDGER_BIN, or one built from this repository)
// on free loopback ports with authentication on, and issues credentials with its CLI, as an
// outside client's operator would.
import { execFile, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Waits until f() is truthy (polling), or fails after timeoutMs. */
export async function eventually(f, timeoutMs = 30_000, what = "condition") {
  const until = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await f();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > until) throw new Error(`${what} did not hold within ${timeoutMs} ms${last ? `: ${last}` : ""}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function binary() {
  if (process.env.CGLEDGER_BIN) return process.env.CGLEDGER_BIN;
  const dir = await mkdtemp(join(tmpdir(), "cgledger-sdkts-bin-"));
  const bin = join(dir, "cgledger");
  await run("go", ["build", "-o", bin, "./cmd/cgledger"], { cwd: repo });
  return bin;
}

export class Server {
  static async start(extra = []) {
    const s = new Server();
    s.bin = await binary();
    s.dir = await mkdtemp(join(tmpdir(), "cgledger-sdkts-"));
    s.data = join(s.dir, "data");
    s.natsPort = await freePort();
    s.httpPort = await freePort();
    s.natsURL = `nats://127.0.0.1:${s.natsPort}`;
    s.httpURL = `http://127.0.0.1:${s.httpPort}`;
    s.log = "";
    s.proc = spawn(
      s.bin,
      ["serve", "--data", s.data, "--nats-listen", `127.0.0.1:${s.natsPort}`, "--http-listen", `127.0.0.1:${s.httpPort}`,
        "--roles", "api,projector", "--log-format", "json", ...extra],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    s.proc.stdout.on("data", (b) => (s.log += b));
    s.proc.stderr.on("data", (b) => (s.log += b));
    s.exited = new Promise((r) => s.proc.once("exit", r));
    await eventually(async () => (await fetch(`${s.httpURL}/readyz`)).status === 200, 60_000, "serve ready").catch((err) => {
      throw new Error(`${err.message}\nserve log:\n${s.log}`);
    });
    return s;
  }

  env() {
    return { ...process.env, CGLEDGER_DATA: this.data, CGLEDGER_NATS_URL: this.natsURL, CGLEDGER_SERVER: this.httpURL };
  }

  /** Issues a credential (`creds issue --json`) and writes it to a file: {file, inboxPrefix}. */
  async creds(project, role, flags = []) {
    const { stdout } = await run(this.bin, ["creds", "issue", "--data", this.data, "--project", project, "--role", role, "--json", ...flags], { env: this.env() });
    const j = JSON.parse(stdout);
    const file = join(this.dir, `${project}-${role}-${flags.join("-")}.creds`);
    await writeFile(file, j.creds, { mode: 0o600 });
    return { file, inboxPrefix: j.inbox_prefix };
  }

  /** Registers a tool (`tools register`) with the embedded admin credential. */
  async register(project, def) {
    const file = join(this.dir, `${def.tool_name}.json`);
    await writeFile(file, JSON.stringify(def));
    await run(this.bin, ["tools", "register", file, "--project", project], { env: this.env() });
  }

  /** Registers a tool definition file (YAML or JSON) with the embedded admin credential. */
  async registerFile(project, file) {
    await run(this.bin, ["tools", "register", file, "--project", project], { env: this.env() });
  }

  async stop() {
    if (this.proc.exitCode === null) {
      this.proc.kill("SIGTERM");
      await this.exited;
    }
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** A minimal tool definition whose commands go to cg.v1.<project>.<channel>.cmd.tool.<name>. */
export function toolDef(name, determinism, extra = {}) {
  return {
    tool_name: name,
    description: `${name} (sdk test)`,
    parameters: { type: "object" },
    target_subject: `cg.v1.{project_id}.{channel_id}.cmd.tool.${name}`,
    after_execution: "suspend",
    determinism,
    ...extra,
  };
}
