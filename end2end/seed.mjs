// Seeds a fresh Rebound database, through the server's OJS HTTP API (started with
// `--api-auth none`), with the jobs the browser tests look for. It plays the worker itself
// (fetch, then ack or nack), so no worker process is needed.
//
//   node seed.mjs http://127.0.0.1:3300 > seed.json
//
// What it leaves behind (args carry an `order` tag the tests search for):
//   emails    email.send      3 completed
//   reports   report.build    1 retryable after 2 failed attempts (custom schedule, next run in 1 h)
//   invoices  invoice.render  2 retryable after 1 failure, on a type policy (PT1H × 2, no jitter)
//   payments  payment.charge  5 dead letters: http.5xx (C-1 … C-3) and auth.denied (D-1, D-2)
//             payment.refund  2 dead letters: http.5xx (V-1 for the viewer test, N-1 for no-JS)
//   redrive   demo.succeed    1 dead letter (W-1): re-driven, a real worker completes it

const base = (process.argv[2] ?? process.env.BASE_URL ?? 'http://127.0.0.1:3000').replace(/\/$/, '');
const WORKER = 'seed-worker';

async function api(method, path, body) {
  const res = await fetch(`${base}/ojs/v1${path}`, {
    method,
    headers: { 'content-type': 'application/openjobspec+json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function enqueue(type, queue, args, retry) {
  const options = { queue };
  if (retry) options.retry = retry;
  const out = await api('POST', '/jobs', { type, args, options });
  return out.job?.id ?? out.id;
}

/** Claims the job with `id` (waiting up to 10 s for it to become available). */
async function claim(queue, id) {
  for (let i = 0; i < 100; i++) {
    const { jobs } = await api('POST', '/workers/fetch', { queues: [queue], count: 50, worker_id: WORKER });
    const mine = jobs.find((j) => j.id === id);
    // Hand back anything else we claimed, uncounted.
    for (const other of jobs.filter((j) => j.id !== id)) {
      await api('POST', '/workers/nack', { job_id: other.id, requeue: true, worker_id: WORKER });
    }
    if (mine) return mine;
    await sleep(100);
  }
  throw new Error(`job ${id} never became available in ${queue}`);
}

async function fail(queue, id, type, message) {
  await claim(queue, id);
  return api('POST', '/workers/nack', { job_id: id, worker_id: WORKER, error: { type, message, details: { host: 'pay-gw-2', status: 503 } } });
}

async function complete(queue, id) {
  await claim(queue, id);
  return api('POST', '/workers/ack', { job_id: id, worker_id: WORKER, result: { delivered: true } });
}

const seeded = {};

// Completed work, for the overview's charts.
for (let i = 1; i <= 3; i++) {
  await complete('emails', await enqueue('email.send', 'emails', [{ order: `E-${i}`, to: `user${i}@example.com` }]));
}

// A job failing twice: one short retry, then an hour.
const report = await enqueue('report.build', 'reports', [{ order: 'R-1', report: 'monthly-sales' }], {
  max_attempts: 5,
  backoff_strategy: 'custom',
  schedule: ['PT1S', 'PT1H'],
  jitter: false,
  on_exhaustion: 'dead_letter',
});
await fail('reports', report, 'http.5xx', 'warehouse API returned 503 Service Unavailable');
await fail('reports', report, 'http.timeout', 'warehouse API did not answer within 30s');
seeded.failing = report;

// Waiting jobs on a type policy, for the policy editor's dry run.
await api('PUT', '/admin/policies/invoice.render?note=seeded', {
  max_attempts: 5,
  initial_interval: 'PT1H',
  backoff_coefficient: 2,
  max_interval: 'P1D',
  jitter: false,
  on_exhaustion: 'dead_letter',
});
seeded.waiting = [];
for (let i = 1; i <= 2; i++) {
  const id = await enqueue('invoice.render', 'invoices', [{ order: `I-${i}` }]);
  await fail('invoices', id, 'pdf.render', `font cache locked (pid ${4000 + i})`);
  seeded.waiting.push(id);
}

// Dead letters: one attempt, then the dead-letter queue.
const once = { max_attempts: 1, on_exhaustion: 'dead_letter' };
seeded.dead = {};
const dead = [
  ['payment.charge', 'C-1', 'http.5xx', 'gateway returned 503 after 31s'],
  ['payment.charge', 'C-2', 'http.5xx', 'gateway returned 503 after 30s'],
  ['payment.charge', 'C-3', 'http.5xx', 'gateway returned 502 after 12s'],
  ['payment.charge', 'D-1', 'auth.denied', 'card 4242 declined by issuer'],
  ['payment.charge', 'D-2', 'auth.denied', 'card 1881 declined by issuer'],
  ['payment.refund', 'V-1', 'http.5xx', 'gateway returned 503 after 29s'],
  ['payment.refund', 'N-1', 'http.5xx', 'gateway returned 504 after 60s'],
];
for (const [type, order, errorType, message] of dead) {
  const id = await enqueue(type, 'payments', [{ order, amount_cents: 1999 }], once);
  await fail('payments', id, errorType, message);
  seeded.dead[order] = id;
}

// A dead letter whose handler will succeed once re-driven (scripts/e2e.sh starts a worker on
// the `redrive` queue after seeding).
const w1 = await enqueue('demo.succeed', 'redrive', [{ order: 'W-1' }], once);
await fail('redrive', w1, 'demo.transient', 'downstream was briefly unavailable');
seeded.dead['W-1'] = w1;

console.log(JSON.stringify(seeded, null, 2));
