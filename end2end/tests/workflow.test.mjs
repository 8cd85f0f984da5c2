// A workflow's page: a chain created and half-run through the OJS API, looked at and
// cancelled by an operator in the browser; the page updates without a reload.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, hydrated, openBrowser, screenshot, signIn, textOf } from './support.mjs';

const QUEUE = 'e2e-workflows';

async function api(method, path, body) {
  const res = await fetch(`${BASE_URL}/ojs/v1${path}`, {
    method,
    headers: { 'content-type': 'application/openjobspec+json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return JSON.parse(text);
}

test('an operator follows a chain step by step and cancels the rest', async () => {
  const step = (type) => ({ type, args: [{ order: 'WF-1' }], options: { queue: QUEUE } });
  const created = await api('POST', '/workflows', { type: 'chain', name: 'ship-order-WF-1', steps: [step('order.validate'), step('order.pack'), step('order.ship')] });
  const id = created.workflow.id;
  const { jobs } = await api('POST', '/workers/fetch', { queues: [QUEUE], count: 5, worker_id: 'e2e-wf' });
  assert.equal(jobs.length, 1, 'only the first step is ready');
  await api('POST', '/workers/ack', { job_id: jobs[0].id, worker_id: 'e2e-wf', result: { valid: true } });

  const { page, errors, close } = await openBrowser();
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/workflows/${id}`);
    await hydrated(page);
    assert.match(await textOf(page, 'h1'), /ship-order-WF-1/);
    assert.equal(await textOf(page, '.wf-state'), 'running');
    const states = () => page.$$eval('table.workflow-steps tbody tr td:nth-child(4)', (cells) => cells.map((c) => c.innerText.trim()));
    assert.deepEqual(await states(), ['completed', 'available', 'waiting']);
    assert.match(await textOf(page, 'table.workflow-steps tbody tr:first-child td:nth-child(8)'), /valid/);
    await screenshot(page, '14-workflow-running');

    await page.click('button:has-text("Cancel workflow")');
    await page.waitForSelector('.alert.success');
    await page.waitForFunction(() => document.querySelector('.wf-state')?.textContent === 'cancelled', null, { timeout: 10000 });
    assert.deepEqual(await states(), ['completed', 'cancelled', 'cancelled']);
    const after = await api('GET', `/workflows/${id}`);
    assert.equal(after.workflow.state, 'cancelled');
    await screenshot(page, '15-workflow-cancelled');

    // The step's own page links back to its workflow.
    await page.click('table.workflow-steps tbody tr:first-child td:nth-child(2) a');
    await page.waitForSelector(`a[href="/workflows/${id}"]`);
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});
