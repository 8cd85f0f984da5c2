// The cron page: a cron job registered through the OJS API is listed with its schedule and next
// run; an operator triggers it (a job is enqueued, the last outcome says so), pauses it (no
// next run) and resumes it, with and without JavaScript; each action is in the audit log.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, hydrated, openBrowser, screenshot, signIn, textOf } from './support.mjs';

async function register(name) {
  // Once a year at midnight: it never fires by itself during the test.
  const res = await fetch(`${BASE_URL}/ojs/v1/cron`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      name,
      cron: '0 0 1 1 *',
      timezone: 'Europe/Berlin',
      type: 'report.yearly',
      args: [{ year: 'current' }],
      options: { queue: 'reports' },
      description: 'the yearly report',
    }),
  });
  assert.equal(res.status, 201, await res.text());
}

async function apiCron(name) {
  const res = await fetch(`${BASE_URL}/ojs/v1/cron/${name}`);
  assert.equal(res.status, 200);
  return (await res.json()).cron_job;
}

const row = (name) => `tr[data-cron="${name}"]`;

test('list, trigger, pause and resume a cron job', async () => {
  await register('yearly-report');
  const { page, errors, close } = await openBrowser();
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/cron`);
    await hydrated(page);
    const r = row('yearly-report');
    assert.match(await textOf(page, `${r} td:nth-child(2)`), /0 0 1 1 \*\s+Europe\/Berlin/);
    assert.match(await textOf(page, `${r} td:nth-child(3)`), /report\.yearly\s+on reports/);
    assert.match(await textOf(page, `${r} .next-run`), /\d{4}-12-31 23:00:00/, "midnight in Berlin, in UTC");
    assert.match(await textOf(page, `${r} .last-run`), /never/);
    await screenshot(page, '20-cron-list');

    await page.click(`${r} button:has-text("Trigger now")`);
    await page.waitForSelector('.alert.success');
    assert.match(await textOf(page, '.alert.success'), /enqueued job/);
    await page.waitForFunction((sel) => document.querySelector(`${sel} .last-run`)?.textContent.includes('triggered'), r);
    const triggered = await apiCron('yearly-report');
    assert.equal(triggered.last_outcome, 'triggered');
    assert.equal(triggered.run_count, 1);
    const job = await (await fetch(`${BASE_URL}/ojs/v1/jobs/${triggered.last_job_id}`)).json();
    assert.equal(job.job.type, 'report.yearly');
    assert.equal(job.job.meta.cron_name, 'yearly-report');
    assert.ok(await page.isVisible(`${r} .last-run a[href="/jobs/${triggered.last_job_id}"]`));

    await page.click(`${r} button:has-text("Pause")`);
    await page.waitForFunction((sel) => document.querySelector(`${sel} .tag.paused`), r);
    assert.equal((await apiCron('yearly-report')).next_run_at, null);
    assert.match(await textOf(page, `${r} .next-run`), /—/);
    await screenshot(page, '21-cron-paused');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }

  // Without JavaScript: the same form is a plain post, answered by a redirect back.
  const nojs = await openBrowser({ javaScriptEnabled: false });
  try {
    await signIn(nojs.page);
    await nojs.page.goto(`${BASE_URL}/cron`);
    await Promise.all([nojs.page.waitForNavigation(), nojs.page.click(`${row('yearly-report')} button:has-text("Resume")`)]);
    assert.match(await textOf(nojs.page, `${row('yearly-report')} td:nth-child(5)`), /active/);
    const resumed = await apiCron('yearly-report');
    assert.equal(resumed.enabled, true);
    assert.ok(resumed.next_run_at, 'resumed: a next run again');

    await nojs.page.goto(`${BASE_URL}/audit?action=cron.`);
    const actions = await nojs.page.$$eval('table.audit tbody tr', (rows) => rows.map((r) => r.textContent));
    for (const action of ['cron.resume', 'cron.pause', 'cron.trigger']) {
      assert.ok(actions.some((t) => t.includes(action) && t.includes('olivia')), `${action} by olivia in the audit log: ${actions}`);
    }
  } finally {
    await nojs.close();
  }
});
