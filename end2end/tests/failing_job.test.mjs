// Finding a failing job and reading its attempts, its effective policy and its planned retries.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, hydrated, openBrowser, screenshot, seeded, signIn, textOf } from './support.mjs';

test('find a failing job and read its attempts and planned schedule', async () => {
  const { page, errors, close } = await openBrowser();
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/jobs`);
    await hydrated(page);
    // Filter by state and by text in the args.
    await page.selectOption('select[name=state]', 'retryable');
    await page.fill('input[name=text]', 'R-1');
    await Promise.all([page.waitForURL(/state=retryable.*text=R-1/), page.click('form.filters button[type=submit]')]);
    await page.waitForFunction(() => document.querySelectorAll('table.jobs tbody tr').length === 1);
    assert.match(await textOf(page, '.bulk-bar .count'), /^1 matching/);
    await page.click('table.jobs tbody tr a');
    await page.waitForSelector('table.attempts');
    assert.ok(page.url().endsWith(`/jobs/${seeded().failing}`));

    // Two attempts, each with its error and the delay chosen.
    const attempts = await page.$$eval('table.attempts tbody tr', (rows) => rows.map((r) => r.innerText));
    assert.equal(attempts.length, 2);
    assert.match(attempts[0], /retried/);
    assert.match(attempts[0], /http\.5xx/);
    assert.match(attempts[0], /warehouse API returned 503/);
    assert.match(attempts[1], /http\.timeout/);
    // The job's own custom schedule [PT1S, PT1H] is capped at the default max_interval (5m).
    assert.match(attempts[0], /1s →/);
    assert.match(attempts[1], /5m →/);

    // Where each policy field comes from.
    const sources = Object.fromEntries(
      await page.$$eval('table.policy-fields tbody tr', (rows) => rows.map((r) => [r.cells[0].innerText, r.cells[2].innerText])),
    );
    assert.equal(sources.max_attempts, 'job');
    assert.equal(sources.max_interval, 'default');

    // Planned retries: the scheduled one (retry 2) and two more, then exhaustion.
    const planned = await page.$$eval('table.schedule tbody tr', (rows) => rows.map((r) => r.innerText));
    assert.equal(planned.length, 3);
    assert.match(planned[0], /scheduled/);
    assert.match(planned[1], /^3\s+4\s+5m/);
    assert.match(await textOf(page, '.exhaustion'), /attempt 5 fails too.*dead letters/);
    assert.equal(await page.locator('svg.delay-chart rect.bar').count(), 4);
    await screenshot(page, '02-failing-job');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});
