// The README quick start's TypeScript step: examples/tool-service.mjs and examples/worker.mjs as
// separate processes against a real serve, with their own credentials.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Server, eventually } from "./harness.mjs";

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), "..");
let srv;
let svc;

before(async () => {
  srv = await Server.start();
});

after(async () => {
  if (svc && svc.exitCode === null) svc.kill("SIGKILL");
  await srv?.stop();
});

test("the example tool service answers the example worker, and a repeated run gets the same call", async () => {
  await srv.registerFile("demo", join(root, "examples", "greet.yaml"));
  const tool = await srv.creds("demo", "tool", ["--tool", "greet"]);
  const bob = await srv.creds("demo", "worker", ["--agent", "bob"]);
  let log = "";
  svc = spawn(process.execPath, [join(root, "examples", "tool-service.mjs")], {
    cwd: root,
    env: { ...process.env, CGLEDGER_NATS_URL: srv.natsURL, CGLEDGER_CREDS: tool.file },
  });
  svc.stdout.on("data", (b) => (log += b));
  svc.stderr.on("data", (b) => (log += b));
  await eventually(() => log.includes("greet: serving demo"), 30_000, "the tool service is up");

  const env = { ...process.env, CGLEDGER_NATS_URL: srv.natsURL, CGLEDGER_CREDS: bob.file, CGLEDGER_TURN: "turn-1" };
  const first = await run(process.execPath, [join(root, "examples", "worker.mjs"), "world"], { cwd: root, env });
  assert.match(first.stdout, /status: success/);
  assert.match(first.stdout, /result: \{"greeting":"hello, world"\}/);
  const second = await run(process.execPath, [join(root, "examples", "worker.mjs"), "world"], { cwd: root, env });
  assert.match(second.stdout, /\(duplicate: the original call\)/);
  assert.match(second.stdout, /result: \{"greeting":"hello, world"\}/);

  const exited = new Promise((r) => svc.once("exit", (code) => r(code)));
  svc.kill("SIGTERM");
  assert.equal(await exited, 0, log);
  assert.match(log, /greet: stopped/);
});
