// Re-driving a dead letter and watching a real worker complete it: the job page refreshes
// itself, so the operator sees the state change without reloading.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, apiJob, hydrated, openBrowser, screenshot, seeded, signIn, textOf } from './support.mjs';

test('re-drive a dead letter and see it complete', { skip: !process.env.E2E_WORKER && 'no worker running' }, async () => {
  const { page, errors, close } = await openBrowser();
  const target = seeded().dead['W-1'];
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/jobs/${target}`);
    await hydrated(page);
    assert.match(await textOf(page, 'h1 .state'), /dead letter/);
    await page.click('button[name=action][value=redrive]');
    await page.waitForSelector('.alert.success');
    // No reload: the page polls while the tab is visible.
    await page.waitForFunction(() => document.querySelector('h1 .state')?.textContent === 'completed', null, { timeout: 30000 });
    const job = await apiJob(target);
    assert.equal(job.state, 'completed');
    const outcomes = await page.$$eval('table.attempts tbody tr td:nth-child(5)', (cells) => cells.map((c) => c.innerText.trim()));
    assert.deepEqual(outcomes, ['exhausted', 'completed']);
    await screenshot(page, '12-redriven-and-completed');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});
