// A sqlq worker in Node.js 20 (or 18, Debian 12's) with no dependencies: the pull protocol
// over plain fetch, the proof that a worker anywhere needs HTTP and JSON, and no sqlq code.
//
//   SQLQ_URL=http://127.0.0.1:8080 SQLQ_QUEUE=node node examples/worker.mjs
//
// Environment: SQLQ_URL, SQLQ_QUEUE (comma-separated), SQLQ_TOKEN (a worker token),
// SQLQ_WORKER (this worker's name), SQLQ_CONCURRENCY, SQLQ_LEASE_S, SQLQ_WAIT_S,
// SQLQ_GRACE_S, and SQLQ_EXIT_WHEN_IDLE=1 (exit once a claim finds nothing: for scripts).
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";

const env = process.env;
const URL = (env.SQLQ_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const QUEUES = (env.SQLQ_QUEUE ?? "default").split(",");
const NAME = env.SQLQ_WORKER ?? `node-${hostname()}-${process.pid}`.replace(/[^\w.:-]/g, "_");
const CONCURRENCY = Number(env.SQLQ_CONCURRENCY ?? 4);
const LEASE_S = Number(env.SQLQ_LEASE_S ?? 30); // 5 to 3600
const WAIT_S = Number(env.SQLQ_WAIT_S ?? 10); // a claim's long poll, at most 30
const GRACE_S = Number(env.SQLQ_GRACE_S ?? 10);
const EXIT_WHEN_IDLE = env.SQLQ_EXIT_WHEN_IDLE === "1";

// The handlers, by kind: (args, ctx) -> a JSON result, or a throw (the attempt fails, and
// the server's retry policy decides what next; `permanent` dead-letters it at once).
// ctx.signal aborts when the job stopped being ours (fenced) or a cancel was asked for;
// what ctx.progress says goes with the next heartbeat.
const handlers = {
  echo: async (args) => args,
  add: async ({ a, b }) => a + b,
  fail: async ({ message }) => { throw new Error(message ?? "asked to fail"); },
  flaky: async ({ succeed_on = 2 }, { job }) => { // job.attempts counts this one, from 1
    if (job.attempts < succeed_on) throw new Error(`flaky: attempt ${job.attempts} fails`);
    return { attempts: job.attempts };
  },
  slow: async ({ steps = 10, step_ms = 100 }, { signal, progress }) => {
    for (let i = 1; i <= steps; i++) {
      await sleep(step_ms, undefined, { signal }); // rejects once aborted
      progress(Math.round((100 * i) / steps), `step ${i} of ${steps}`);
    }
    return { steps };
  },
};
const permanent = (message) => Object.assign(new Error(message), { permanent: true });
const aborted = (signal) =>
  new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));

const held = new Map(); // token -> { job, abort?, progress?, fenced? }: the leases we hold
const pending = []; // outcomes the server has not answered yet: { token, complete|fail|... }
let stoppedAt = null; // when SIGTERM came (or a claim found nothing, with EXIT_WHEN_IDLE)
const log = (...words) => console.log(`[${NAME}]`, ...words);

async function post(path, body) {
  const headers = { "content-type": "application/json" };
  if (env.SQLQ_TOKEN) headers.authorization = `Bearer ${env.SQLQ_TOKEN}`;
  const r = await fetch(URL + path, { method: "POST", headers, body: JSON.stringify(body) });
  const answer = await r.json();
  if (r.status === 200) return answer;
  const err = new Error(`${path}: ${r.status} ${JSON.stringify(answer)}`);
  throw Object.assign(err, { status: r.status });
}

// Outcomes go in batches: one POST /claims/outcomes takes all that finished while the last
// one was in flight. Each answer is exact: the job's new state, or "fenced" (too late: the
// lease ran out, or the job was cancelled). Unreachable: keep them and try again, so a
// finished result outlives a server restart; a 4xx can't succeed later, so it is dropped.
let flushing = null;
function report(token, outcome) {
  pending.push({ token, ...outcome });
  send();
}
function send() {
  flushing ??= flush().finally(() => { flushing = null; if (pending.length) send(); });
}
async function flush() {
  let delay = 100;
  while (pending.length) {
    const batch = pending.splice(0, 1000);
    let again = [];
    try {
      const answers = (await post("/claims/outcomes", { outcomes: batch })).outcomes;
      // "unavailable" (the store took the others, not this one) or no answer: again
      batch.forEach((o, i) => {
        const a = answers[i];
        if (!a || a.error === "unavailable") return again.push(o);
        log(`${held.get(o.token)?.job.id}: ${a.state ?? a.error}`, a.detail ?? "");
        held.delete(o.token);
      });
    } catch (err) {
      if (err.status >= 400 && err.status < 500 && err.status !== 429) {
        log(`outcomes refused: ${err.message}`);
        for (const { token } of batch) held.delete(token);
      } else {
        log(`outcomes not reported (${err.message}); retrying`);
        again = batch;
      }
    }
    if (again.length === 0) { delay = 100; continue; }
    pending.unshift(...again);
    await sleep(delay);
    delay = Math.min(2 * delay, 5000);
  }
}

// One heartbeat renews every lease we hold; its answer says which jobs to stop.
async function heartbeat() {
  if (held.size === 0) return;
  const items = [...held].map(([token, h]) => ({ token, progress: h.progress })); // null: none
  try {
    for (const beat of (await post("/claims/heartbeat", { items })).items) {
      const h = held.get(beat.token);
      if (h === undefined) continue; // its outcome was answered meanwhile
      if (beat.error) { h.fenced = true; h.abort?.abort(new Error("fenced")); }
      else if (beat.cancel_requested) h.abort?.abort(new Error("cancelled: asked to stop"));
    }
  } catch (err) {
    log(`heartbeat failed (${err.message}); the next one retries`);
  }
}

async function run(token, job) {
  const h = { job, abort: new AbortController(), progress: null, fenced: false };
  held.set(token, h);
  const ctx = { job, signal: h.abort.signal, progress: (percent, message) => {
    h.progress = { percent, message };
  } };
  try {
    const handler = handlers[job.kind];
    if (!handler) throw permanent(`no handler for kind ${job.kind}`);
    // Raced with the signal: a handler that ignores it still gives its slot back.
    const result = await Promise.race([handler(job.args, ctx), aborted(ctx.signal)]);
    if (!h.fenced) return report(token, { complete: { result: result ?? null } });
  } catch (thrown) {
    // Aborted: report why (cancelled, interrupted), not the AbortError it threw. Once a
    // cancel was asked for, the server ends a failed attempt cancelled, never retried.
    const err = ctx.signal.aborted ? ctx.signal.reason : thrown;
    const fail = { error: String(err).slice(0, 4000), retry: !err?.permanent };
    if (!h.fenced) return report(token, { fail });
  }
  held.delete(token); // fenced: the job is no longer ours, and no outcome of ours can land
  log(`${job.id}: fenced, stopped`);
}

async function main() {
  const beats = setInterval(heartbeat, (LEASE_S * 1000) / 3);
  const stop = () => { stoppedAt ??= Date.now(); log("stopping: no more claims"); };
  process.once("SIGTERM", stop).once("SIGINT", stop); // a second signal kills at once
  log(`claiming from ${QUEUES.join(",")} at ${URL}`);
  for (let delay = 100; stoppedAt === null; ) {
    const max = CONCURRENCY - held.size;
    if (max <= 0) { await sleep(10); continue; }
    const body = { queues: QUEUES, worker: NAME, max, wait_s: WAIT_S, lease_s: LEASE_S };
    let claims;
    try {
      // Never aborted mid-flight, even on SIGTERM: jobs the server claimed for an answer we
      // dropped would sit out their lease. What arrives after SIGTERM is given back instead.
      ({ claims } = await post("/claims", body));
      delay = 100;
    } catch (err) {
      log(`claim failed (${err.message}); backing off`);
      await sleep(delay);
      delay = Math.min(2 * delay, 5000);
      continue;
    }
    for (const { token, job } of claims) {
      if (stoppedAt === null) { run(token, job); continue; }
      held.set(token, { job });
      report(token, { release: {} }); // unstarted: due again now, no attempt counted
    }
    if (EXIT_WHEN_IDLE && claims.length === 0 && held.size === 0) stop();
  }
  // Running handlers get the grace period; then each is cut off, and fails with an attempt
  // counted (as a server that stops counts one). Leave once every outcome is answered.
  while (held.size && Date.now() < stoppedAt + GRACE_S * 1000) await sleep(10);
  for (const h of held.values()) h.abort?.abort(new Error(`interrupted: worker ${NAME} stopped`));
  while (held.size || flushing) await sleep(10);
  clearInterval(beats);
  log("stopped");
}

main();
