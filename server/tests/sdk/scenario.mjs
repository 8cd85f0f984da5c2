// A producer and a worker written with the public JS SDK (@openjobspec/sdk 0.4.0, its ESM
// build), run against a live rebound-server: what a new user would try first. Run by
// server/tests/sdks.sh:
//
//   node scenario.mjs http://127.0.0.1:PORT /path/to/sdk-copy
//
// Exits non-zero (with the failing check) unless every step behaves as OJS says.
//
// SDK limitations, each where it matters below:
// * Dead letters: `queues.listDeadLetter()` takes no paging parameters (no offset, no cursor),
//   so offset paging is exercised by the Python scenario only; here the whole list is read.
// * Subscriptions deliver an event once it is settled, about a second after it happened
//   (Rebound reads events back from its tables).
// * Heartbeats send `active_jobs` as a count and the ids in `active_job_ids` (Rebound reads
//   both); they carry no visibility timeout, so claims are extended by the fetch's.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const [url, sdkDir] = process.argv.slice(2);
const { HttpTransport, OJSClient, OJSWorker, batch, chain, group, reportProgress, subscribeJob, subscribeQueue } = await import(pathToFileURL(path.join(sdkDir, 'dist/esm/index.js')).href);

let checks = 0;
function check(cond, what) {
  assert.ok(cond, what);
  checks += 1;
}

async function waitUntil(what, cond, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const client = new OJSClient({ url });
const q = `js-${randomUUID().slice(0, 8)}`;

async function producer() {
  const job = await client.enqueue('scenario.echo', { hello: 'world' }, { queue: q });
  check(job.state === 'available', `enqueue: ${job.state}`);
  check((await client.getJob(job.id)).id === job.id, 'get the job back');

  const batch = await client.enqueueBatch([0, 1, 2].map((i) => ({ type: 'scenario.batch', args: [i], options: { queue: q } })));
  check(batch.length === 3 && new Set(batch.map((j) => j.id)).size === 3, 'batch of three');

  // The JS SDK's unique `key` names args fields.
  const first = await client.enqueue('scenario.unique', { id: 7, note: 'a' }, { queue: q, unique: { key: ['id'] } });
  await assert.rejects(
    client.enqueue('scenario.unique', { id: 7, note: 'b' }, { queue: q, unique: { key: ['id'] } }),
    (e) => /duplicate/i.test(String(e.message ?? e)),
    'same id: a duplicate',
  );
  checks += 1;
  const other = await client.enqueue('scenario.unique', { id: 8, note: 'a' }, { queue: q, unique: { key: ['id'] } });
  check(other.id !== first.id, 'another id is not a duplicate');

  const delayed = await client.enqueue('scenario.delayed', [], { queue: q, delay: '1h' });
  check(delayed.state === 'scheduled', `delayed job is scheduled: ${delayed.state}`);
  const cancelled = await client.cancelJob(delayed.id);
  check(cancelled.state === 'cancelled', 'cancel');

  const stats = await client.queues.stats(q);
  // echo + 3 batch + 2 unique are available; the delayed one was cancelled.
  check(stats.name === q && stats.available === 6 && stats.scheduled === 0, `queue stats: ${JSON.stringify(stats)}`);
  await client.queues.pause(q);
  check((await client.queues.stats(q)).paused === true, 'pause');
  await client.queues.resume(q);
  check((await client.queues.stats(q)).paused === false, 'resume');
}

async function workerRun() {
  const runs = new Map();
  const ran = (id) => runs.set(id, (runs.get(id) ?? 0) + 1);
  // Visibility 1.5 s, beats every 0.3 s, jobs of 3 s: only the heartbeats keep the claims.
  const worker = new OJSWorker({ url, queues: [q], concurrency: 10, pollInterval: 200, heartbeatInterval: 300, visibilityTimeout: 1500, handleSignals: false });
  // The SDK's progress reporting (the worker keeps its transport private: one of its own).
  const transport = new HttpTransport({ url });
  worker.register('scenario.slow', async (ctx) => {
    ran(ctx.job.id);
    await new Promise((r) => setTimeout(r, 1500));
    await reportProgress(transport, ctx.job.id, 50, 'half way', { slept: 1.5 });
    await new Promise((r) => setTimeout(r, 1500));
    return { slept: 3 };
  });
  worker.register('scenario.fail', async (ctx) => {
    ran(ctx.job.id);
    throw new Error(`failing on purpose, attempt ${ctx.attempt}`);
  });
  for (const type of ['scenario.echo', 'scenario.batch', 'scenario.unique']) {
    worker.register(type, async (ctx) => {
      ran(ctx.job.id);
      return { args: ctx.job.args };
    });
  }
  const retry = { maxAttempts: 3, initialInterval: 'PT0.2S', jitter: false, onExhaustion: 'dead_letter' };
  // The SDK's SSE subscription to the queue follows everything below as it happens.
  const followed = [];
  const following = subscribeQueue({ url }, q, (e) => followed.push(e));
  const slow = [];
  for (let i = 0; i < 3; i++) slow.push(await client.enqueue('scenario.slow', [i], { queue: q }));
  const failing = [];
  for (let i = 0; i < 3; i++) failing.push(await client.enqueue('scenario.fail', [i], { queue: q, retry }));

  await worker.start();
  try {
    await waitUntil('the slow jobs completed', async () => (await Promise.all(slow.map((j) => client.getJob(j.id)))).every((j) => j.state === 'completed'));
    await waitUntil('the failing jobs were dead-lettered', async () => (await Promise.all(failing.map((j) => client.getJob(j.id)))).every((j) => j.state === 'discarded'));
    for (const j of slow) {
      check(runs.get(j.id) === 1, `slow job ${j.id} ran once (heartbeats kept its claim), ran ${runs.get(j.id)}`);
      check((await client.getJob(j.id)).attempt === 1, 'one attempt');
      const progress = await (await fetch(`${url}/ojs/v1/jobs/${j.id}/progress`)).json();
      check(progress.progress === 50 && progress.message === 'half way' && progress.data?.slept === 1.5, `progress kept: ${JSON.stringify(progress)}`);
    }
    for (const j of failing) check(runs.get(j.id) === 3, `failing job ${j.id} ran max_attempts=3 times, ran ${runs.get(j.id)}`);
    const stats = await client.queues.stats(q);
    check(stats.available === 0 && stats.active === 0, `the queue drained: ${JSON.stringify(stats)}`);
  } finally {
    await worker.stop();
  }
  const followedOf = (kind) => new Set(followed.filter((e) => e.type === kind).map((e) => e.data.data.job_id));
  await waitUntil('the queue subscription saw every completion and dead letter',
    async () => slow.every((j) => followedOf('job.completed').has(j.id)) && failing.every((j) => followedOf('job.dead_lettered').has(j.id)), 15000);
  check(followed.every((e) => e.id.startsWith('evt_') && e.data.specversion === '1.0'), 'SSE ids and OJS envelopes');
  check(slow.every((j) => followedOf('job.progress').has(j.id)) && followedOf('job.progress').size === slow.length, "each slow job's progress");
  check(slow.every((j) => followedOf('job.heartbeat').has(j.id)), "the heartbeats that kept the slow jobs' claims");
  following.unsubscribe();
  // A finished job's subscription replays its events (the stream then ends).
  const jobEvents = [];
  const one = subscribeJob({ url }, slow[0].id, (e) => jobEvents.push(e.type));
  await waitUntil("the job's subscription replayed its events", async () => jobEvents.includes('job.completed'), 15000);
  one.unsubscribe();
  check(jobEvents[0] === 'job.enqueued' && jobEvents[1] === 'job.started' && jobEvents.at(-1) === 'job.completed', `the job's subscription: ${jobEvents}`);
  check(jobEvents.includes('job.progress') && jobEvents.slice(2, -1).every((t) => t === 'job.heartbeat' || t === 'job.progress'), `with its heartbeats and progress between: ${jobEvents}`);

  const dead = (await client.queues.listDeadLetter()).filter((j) => j.queue === q);
  check(dead.length === 3 && dead.every((j) => failing.some((f) => f.id === j.id)), `dead letters listed: ${dead.length}`);
  await client.queues.retryDeadLetter(failing[0].id);
  check((await client.getJob(failing[0].id)).state === 'available', 'retry a dead letter');
  await client.queues.discardDeadLetter(failing[1].id);
  await assert.rejects(client.getJob(failing[1].id), /not found/i, 'a deleted dead letter is gone');
  checks += 1;
}

async function cron() {
  // A cron job registered through the SDK fires on schedule (every second) into its queue.
  const cronQ = `${q}-cron`;
  const name = `${q}-every-second`;
  const registered = await client.cron.register({ name, cron: '* * * * * *', timezone: 'Asia/Tokyo', type: 'scenario.cron', args: ['tick'], options: { queue: cronQ } });
  check(registered.name === name && registered.next_run_at, `cron registered: ${JSON.stringify(registered)}`);
  await waitUntil('the cron job fired twice', async () => (await client.queues.stats(cronQ)).available >= 2, 15000);
  const listed = (await client.cron.list()).cron_jobs.filter((c) => c.name === name);
  check(listed.length === 1 && listed[0].run_count >= 2, `cron listed: ${JSON.stringify(listed)}`);
  await client.cron.unregister(name);
  check(!(await client.cron.list()).cron_jobs.some((c) => c.name === name), 'cron unregistered');
}

async function workflows() {
  // A chain, a batch and a chain with a group nested in it, built with the SDK's helpers and
  // worked by an SDK worker. The SDK leaves its context's parentResults unset; the job
  // envelope carries `parent_results`.
  const wq = `${q}-wf`;
  const seen = [];
  const worker = new OJSWorker({ url, queues: [wq], concurrency: 4, pollInterval: 100, handleSignals: false });
  for (const type of ['scenario.step', 'scenario.mail', 'scenario.report', 'scenario.etl']) {
    worker.register(type, async (ctx) => {
      seen.push({ type, args: ctx.job.args, parents: ctx.job.parent_results ?? null });
      return { done: ctx.job.args[0] };
    });
  }
  const step = (n) => ({ type: 'scenario.step', args: [n], options: { queue: wq } });
  const pipeline = await client.workflow(chain(step('first'), step('second')));
  check(pipeline.type === 'chain' && ['pending', 'running'].includes(pipeline.state), `chain created: ${JSON.stringify(pipeline)}`);
  const mails = await client.workflow(batch([{ type: 'scenario.mail', args: ['a'], options: { queue: wq } }, { type: 'scenario.mail', args: ['b'], options: { queue: wq } }],
    { on_complete: { type: 'scenario.report', args: ['all'], options: { queue: wq } } }));
  const etl = (n) => ({ type: 'scenario.etl', args: [n], options: { queue: wq } });
  const nested = await client.workflow(chain(etl('extract'), group(etl('csv'), etl('json')), etl('load')));
  check(nested.steps?.[1]?.type === 'group' && nested.steps[1].state === 'waiting', `nested group created: ${JSON.stringify(nested.steps?.[1])}`);
  await worker.start();
  try {
    await waitUntil('the three workflows completed', async () =>
      (await Promise.all([pipeline, mails, nested].map((w) => client.getWorkflow(w.id)))).every((w) => w.state === 'completed'));
  } finally {
    await worker.stop();
  }
  const etls = seen.filter((s) => s.type === 'scenario.etl').map((s) => s.args[0]);
  check(etls.length === 4 && etls[0] === 'extract' && [etls[1], etls[2]].sort().join() === 'csv,json' && etls[3] === 'load',
    `the nested group ran between the chain's steps: ${JSON.stringify(etls)}`);
  const load = seen.find((s) => s.type === 'scenario.etl' && s.args[0] === 'load');
  check(JSON.stringify(load?.parents) === JSON.stringify([{ done: 'extract' }, [{ done: 'csv' }, { done: 'json' }]]),
    `the step after the group got its results: ${JSON.stringify(load?.parents)}`);
  const steps = seen.filter((s) => s.type === 'scenario.step');
  check(steps.length === 2 && steps[0].args[0] === 'first' && steps[1].args[0] === 'second', `the chain's steps in order: ${JSON.stringify(steps)}`);
  check(JSON.stringify(steps[1].parents) === JSON.stringify([{ done: 'first' }]), `the second step got the first's result: ${JSON.stringify(steps[1].parents)}`);
  const report = seen.filter((s) => s.type === 'scenario.report');
  check(report.length === 1 && report[0].parents.length === 2, `the batch's callback ran once with both results: ${JSON.stringify(report)}`);
  const status = await client.getWorkflow(mails.id);
  check(status.metadata.job_count === 2 && status.metadata.completed_count === 2, `batch status: ${JSON.stringify(status.metadata)}`);
}

check((await client.health()).status === 'ok', 'health');
await producer();
await workerRun();
await cron();
await workflows();
console.log(`js SDK scenario: ${checks} checks passed`);
