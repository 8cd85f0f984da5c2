// With JavaScript off, the dashboard still works: sign in, re-drive from a job's page,
// preview a policy edit with the Preview button, and get a refused save back with its values.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, apiJob, openBrowser, screenshot, seeded, signIn, textOf } from './support.mjs';

test('re-drive works with JavaScript disabled', async () => {
  const { page, close } = await openBrowser({ javaScriptEnabled: false });
  const target = seeded().dead['N-1'];
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/jobs/${target}`);
    assert.match(await textOf(page, 'h1 .state'), /dead letter/);
    await page.check('input[name=budget][value=one_more]');
    // A real form post to the server function, answered by a redirect back to this page.
    await Promise.all([page.waitForNavigation(), page.click('button[name=action][value=redrive]')]);
    assert.match(page.url(), new RegExp(`/jobs/${target}\\??$`));
    assert.match(await textOf(page, 'h1 .state'), /available/);
    const job = await apiJob(target);
    assert.equal(job.state, 'available');
    // One more attempt: the job may run once more, whatever the policy says.
    assert.equal(job.max_attempts ?? job.options?.retry?.max_attempts, 2);
    await screenshot(page, '10-no-js-redrive');

    // The policy editor's Preview button, without JavaScript.
    await page.goto(`${BASE_URL}/policies/edit?type=payment.refund`);
    await page.fill('input[name="policy[max_attempts]"]', '4');
    await page.fill('input[name="policy[initial_interval]"]', 'PT30S');
    await Promise.all([page.waitForNavigation(), page.click('button[name=intent][value=preview]')]);
    assert.match(page.url(), /preview=1/);
    const delays = await page.$$eval('.preview-table tbody tr td:nth-child(3)', (cells) => cells.map((c) => c.textContent.trim()));
    assert.deepEqual(delays, ['30s', '1m', '2m']);
    assert.equal(await page.inputValue('input[name="policy[max_attempts]"]'), '4');
    await screenshot(page, '11-no-js-policy-preview');

    // A save the policy's rules refuse comes back with what was typed, and the reason.
    const stored = async () => {
      const res = await fetch(`${BASE_URL}/ojs/v1/admin/policies/payment.refund/versions`);
      return `${res.status} ${await res.text()}`;
    };
    const before = await stored();
    await page.fill('input[name="policy[max_attempts]"]', '-1');
    await Promise.all([page.waitForNavigation(), page.click('button[name=intent][value=save]')]);
    assert.match(await textOf(page, '.alert.error'), /max_attempts/);
    assert.equal(await page.inputValue('input[name="policy[max_attempts]"]'), '-1');
    assert.equal(await page.inputValue('input[name="policy[initial_interval]"]'), 'PT30S', 'the other edits are kept');
    assert.equal(await stored(), before, 'nothing was saved');
    await screenshot(page, '12-no-js-policy-refused');
  } finally {
    await close();
  }
});

test('jobs listed in the order they run, chosen in the filter form without JavaScript', async () => {
  // A queue no worker serves, so its jobs stay available.
  const queue = 'e2e-run-order';
  const ids = [];
  for (const [i, priority] of [0, 5, -5].entries()) {
    const res = await fetch(`${BASE_URL}/ojs/v1/jobs`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ type: 'report.order', args: [i], options: { queue, priority } }),
    });
    assert.equal(res.status, 201);
    ids.push((await res.json()).job.id);
  }
  const { page, close } = await openBrowser({ javaScriptEnabled: false });
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/jobs`);
    await page.fill('form.filters input[name=queue]', queue);
    await page.selectOption('form.filters select[name=sort]', 'priority');
    await Promise.all([page.waitForNavigation(), page.click('form.filters button[type=submit]')]);
    assert.match(page.url(), /sort=priority/);
    const listed = async () => (await page.$$eval('a[href^="/jobs/"]', (as) => as.map((a) => a.getAttribute('href').split('/').pop()))).filter((id) => ids.includes(id));
    assert.deepEqual(await listed(), [ids[1], ids[0], ids[2]], 'highest priority first');
    assert.equal(await page.inputValue('form.filters select[name=sort]'), 'priority', 'the form keeps the order');
    await screenshot(page, '12-no-js-jobs-by-priority');
    await page.selectOption('form.filters select[name=sort]', 'scheduled');
    await Promise.all([page.waitForNavigation(), page.click('form.filters button[type=submit]')]);
    assert.deepEqual(await listed(), ids, 'soonest scheduled first: in the order they were enqueued');
  } finally {
    await close();
  }
});
