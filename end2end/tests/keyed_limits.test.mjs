// Keyed rate limits on the Queues page, without JavaScript: jobs sharing a key show up under
// "Rate-limit keys" with how many run and wait; a waiting job's page says why it is not
// picked up; an operator's override stops the key (a fetch then gets none of its jobs) and
// clearing it lets the next one go. Both changes are audited.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, openBrowser, screenshot, signIn, textOf } from './support.mjs';

const QUEUE = 'keyed-calls';
const KEY = 'partner:e2e';

async function post(path, body) {
  return fetch(`${BASE_URL}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

async function fetchJobs(count) {
  return (await (await post('/ojs/v1/workers/fetch', { queues: [QUEUE], count, worker_id: 'e2e-keyed' })).json()).jobs;
}

test('a rate-limit key seen, overridden and released from the Queues page', async () => {
  const ids = [];
  for (let i = 0; i < 4; i++) {
    const res = await post('/ojs/v1/jobs', { type: 'partner.call', args: [i], options: { queue: QUEUE, rate_limit: { key: KEY, concurrency: 1 } } });
    assert.equal(res.status, 201);
    ids.push((await res.json()).job.id);
  }
  const { page, close } = await openBrowser({ javaScriptEnabled: false });
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/queues`);
    const row = `table.rate-limit-keys tr:has(td:text-is("${KEY}"))`;
    const cells = async () => page.$$eval(`${row} td`, (tds) => tds.slice(0, 5).map((td) => td.textContent.trim()));
    assert.deepEqual(await cells(), [KEY, '1', '0', '1', '3'], 'one admitted, three waiting');
    await screenshot(page, '31-rate-limit-keys');

    // A waiting job says what it waits for.
    await page.goto(`${BASE_URL}/jobs/${ids[3]}`);
    assert.match(await page.content(), /partner:e2e \(waiting for a free slot or the key's next rate window\)/);

    // Stop the key: the admitted job is held back too, so a fetch gets nothing.
    await page.goto(`${BASE_URL}/queues`);
    await page.fill(`${row} input[name="concurrency"]`, '0');
    await page.fill(`${row} input[name="until"]`, '+PT1H');
    await Promise.all([page.waitForNavigation(), page.click(`${row} button:has-text("Override")`)]);
    assert.match(await textOf(page, `${row} td:nth-child(2)`), /^0 \(override until .*; jobs set 1\)$/);
    assert.equal((await fetchJobs(10)).length, 0);

    // A bad value names its field and changes nothing.
    await page.fill(`${row} input[name="concurrency"]`, 'lots');
    await Promise.all([page.waitForNavigation(), page.click(`${row} button:has-text("Override")`)]);
    assert.match(await page.content(), /concurrency/);
    assert.equal(await page.inputValue(`${row} input[type="text"][name="concurrency"]`), 'lots', 'the form comes back with what was typed');
    assert.equal((await (await fetch(`${BASE_URL}/ojs/v1/rate-limits/${KEY}`)).json()).override.concurrency, 0);

    // Clearing it: the jobs' own limit applies again, and one job goes.
    await page.goto(`${BASE_URL}/queues`);
    await Promise.all([page.waitForNavigation(), page.click(`${row} button:has-text("Clear override")`)]);
    assert.deepEqual((await cells()).slice(1), ['1', '0', '1', '3']);
    assert.equal((await fetchJobs(10)).length, 1);

    await page.goto(`${BASE_URL}/audit?action=rate_limit.override`);
    const entries = await page.$$eval('table.audit tbody tr', (rows) => rows.map((r) => r.textContent));
    assert.ok(entries.filter((t) => t.includes(KEY)).length >= 2, `both changes audited: ${entries}`);
  } finally {
    await close();
  }
});

test('a key with a rate window shows how much of it is spent, one with a throttle its spacing', async () => {
  const key = 'mailer:e2e';
  for (let i = 0; i < 3; i++) {
    const res = await post('/ojs/v1/jobs', { type: 'mail.send', args: [i], options: { queue: 'keyed-mail', rate_limit: { key, rate: { limit: 2, period: 'PT1H' } } } });
    assert.equal(res.status, 201);
  }
  const paced = 'paced:e2e';
  for (let i = 0; i < 2; i++) {
    const res = await post('/ojs/v1/jobs', { type: 'mail.send', args: [i], options: { queue: 'keyed-mail', rate_limit: { key: paced, throttle: { limit: 2, period: 'PT1H' } } } });
    assert.equal(res.status, 201);
  }
  const { page, close } = await openBrowser({ javaScriptEnabled: false });
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/queues`);
    const row = (k) => page.$$eval(`table.rate-limit-keys tr:has(td:text-is("${k}")) td`, (tds) => tds.slice(0, 5).map((td) => td.textContent.trim()));
    assert.deepEqual(await row(key), [key, '2 per PT1H (2 this window)', '0', '2', '1'], 'two admitted in the window, one waiting for the next');
    assert.deepEqual(await row(paced), [paced, '2 per PT1H, spaced evenly', '0', '1', '1'], 'one admitted, one waiting for the spacing');
  } finally {
    await close();
  }
});
