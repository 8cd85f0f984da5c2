// The Queues page edits a queue's rate limit live: set it (without JavaScript, a plain form
// post), see it in the row and through the OJS API, then a fetch beyond the limit gets nothing;
// clearing it frees the queue. Both actions are audited.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, openBrowser, screenshot, signIn, textOf } from './support.mjs';

const QUEUE = 'limited-exports';

async function enqueue(n) {
  for (let i = 0; i < n; i++) {
    const res = await fetch(`${BASE_URL}/ojs/v1/jobs`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ type: 'export.csv', args: [i], options: { queue: QUEUE } }),
    });
    assert.equal(res.status, 201);
  }
}

async function fetchJobs(count) {
  const res = await fetch(`${BASE_URL}/ojs/v1/workers/fetch`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ queues: [QUEUE], count, worker_id: 'e2e-limits' }),
  });
  return (await res.json()).jobs;
}

test('set and clear a queue rate limit from the Queues page', async () => {
  await enqueue(5);
  const { page, close } = await openBrowser({ javaScriptEnabled: false });
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/queues`);
    const row = `tr:has(a:text-is("${QUEUE}"))`;
    assert.match(await textOf(page, `${row} .limit-summary`), /none/);
    await page.click(`${row} details.limit-edit summary`);
    await page.fill(`${row} input[name="limit[rate_limit]"]`, '2');
    await page.fill(`${row} input[name="limit[rate_period]"]`, 'PT1H');
    await page.fill(`${row} input[name="limit[concurrency]"]`, '3');
    await Promise.all([page.waitForNavigation(), page.click(`${row} button:has-text("Save limit")`)]);
    assert.match(await textOf(page, `${row} .limit-summary`), /3 active · 2 per PT1H/);
    await screenshot(page, '22-queue-rate-limit');

    const state = await (await fetch(`${BASE_URL}/ojs/v1/rate-limits/queue:${QUEUE}`)).json();
    assert.equal(state.rate.limit, 2);
    assert.equal(state.concurrency.limit, 3);
    assert.equal((await fetchJobs(10)).length, 2, 'two starts per hour, whoever fetches');
    assert.equal((await fetchJobs(10)).length, 0);

    // A bad period is refused, naming the field, and changes nothing; the form comes back open
    // with what was typed.
    await page.click(`${row} details.limit-edit summary`);
    await page.fill(`${row} input[name="limit[rate_period]"]`, 'an hour');
    await page.fill(`${row} input[name="limit[concurrency]"]`, '4');
    await Promise.all([page.waitForNavigation(), page.click(`${row} button:has-text("Save limit")`)]);
    assert.match(await textOf(page, '.alert.error'), /rate_period/);
    assert.ok(await page.isVisible(`${row} input[name="limit[rate_period]"]`), 'the form is open');
    assert.equal(await page.inputValue(`${row} input[name="limit[rate_period]"]`), 'an hour');
    assert.equal(await page.inputValue(`${row} input[name="limit[concurrency]"]`), '4');
    assert.equal(await page.inputValue(`${row} input[name="limit[rate_limit]"]`), '2');
    assert.match(await textOf(page, `${row} .limit-summary`), /3 active · 2 per PT1H/, 'the limit in force is shown as saved');
    assert.equal((await (await fetch(`${BASE_URL}/ojs/v1/rate-limits/queue:${QUEUE}`)).json()).rate.limit, 2);

    // Clearing every field removes the limit.
    await page.goto(`${BASE_URL}/queues`);
    await page.click(`${row} details.limit-edit summary`);
    for (const f of ['concurrency', 'rate_limit', 'rate_period', 'throttle_limit', 'throttle_period']) {
      await page.fill(`${row} input[name="limit[${f}]"]`, '');
    }
    await Promise.all([page.waitForNavigation(), page.click(`${row} button:has-text("Save limit")`)]);
    assert.match(await textOf(page, `${row} .limit-summary`), /none/);
    assert.equal((await fetchJobs(10)).length, 3, 'the rest are free to go');

    await page.goto(`${BASE_URL}/audit?action=queue.rate_limit`);
    const entries = await page.$$eval('table.audit tbody tr', (rows) => rows.map((r) => r.textContent));
    assert.ok(entries.filter((t) => t.includes('olivia')).length >= 2, `both changes audited: ${entries}`);
  } finally {
    await close();
  }
});

test('override a queue\'s concurrency for a while from the Queues page, and clear it', async () => {
  const queue = 'override-exports';
  for (let i = 0; i < 2; i++) {
    const res = await fetch(`${BASE_URL}/ojs/v1/jobs`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ type: 'export.csv', args: [i], options: { queue } }),
    });
    assert.equal(res.status, 201);
  }
  const fetchFrom = async () => (await (await fetch(`${BASE_URL}/ojs/v1/workers/fetch`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ queues: [queue], count: 10, worker_id: 'e2e-override' }),
  })).json()).jobs;
  const { page, close } = await openBrowser({ javaScriptEnabled: false });
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/queues`);
    const row = `tr:has(a:text-is("${queue}"))`;
    await page.click(`${row} details.override-edit summary`);
    await page.fill(`${row} details.override-edit input[type="text"][name="concurrency"]`, '0');
    await page.fill(`${row} details.override-edit input[type="text"][name="until"]`, '+PT1H');
    await Promise.all([page.waitForNavigation(), page.click(`${row} details.override-edit button:text-is("Override")`)]);
    assert.match(await textOf(page, `${row} .limit-override`), /^Override: 0 at once until .*, in /);
    assert.match(await textOf(page, `${row} .limit-summary`), /none/, 'the queue\'s own limit is untouched');
    const state = await (await fetch(`${BASE_URL}/ojs/v1/rate-limits/queue:${queue}`)).json();
    assert.equal(state.override.concurrency, 0);
    assert.equal((await fetchFrom()).length, 0, 'stopped');

    // A bad end names its field and changes nothing.
    await page.fill(`${row} details.override-edit input[type="text"][name="concurrency"]`, '1');
    await page.fill(`${row} details.override-edit input[type="text"][name="until"]`, 'tomorrow');
    await Promise.all([page.waitForNavigation(), page.click(`${row} details.override-edit button:text-is("Override")`)]);
    assert.match(await textOf(page, '.alert.error'), /until/);
    assert.equal(await page.inputValue(`${row} details.override-edit input[type="text"][name="until"]`), 'tomorrow', 'the form comes back with what was typed');
    assert.equal(await page.inputValue(`${row} details.override-edit input[type="text"][name="concurrency"]`), '1');
    assert.equal((await (await fetch(`${BASE_URL}/ojs/v1/rate-limits/queue:${queue}`)).json()).override.concurrency, 0);

    await page.goto(`${BASE_URL}/queues`);
    await Promise.all([page.waitForNavigation(), page.click(`${row} button:text-is("Clear override")`)]);
    assert.equal(await page.$(`${row} .limit-override`), null);
    assert.equal((await fetchFrom()).length, 2, 'free again');

    await page.goto(`${BASE_URL}/audit?action=queue.rate_limit_override`);
    const entries = await page.$$eval('table.audit tbody tr', (rows) => rows.map((r) => r.textContent));
    assert.ok(entries.filter((t) => t.includes(queue)).length >= 2, `both changes audited: ${entries}`);
  } finally {
    await close();
  }
});
