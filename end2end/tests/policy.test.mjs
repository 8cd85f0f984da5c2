// Editing a type's retry policy: validation, live preview, dry run, save, audit, and the
// effect on a waiting job's planned retries.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, OPERATOR, hydrated, openBrowser, screenshot, seeded, signIn, textOf } from './support.mjs';

/** The delay column of the job's planned-retry rows. */
async function plannedDelays(page, jobId) {
  await page.goto(`${BASE_URL}/jobs/${jobId}`);
  await page.waitForSelector('table.schedule');
  return page.$$eval('table.schedule tbody tr', (rows) => rows.map((r) => r.cells[2].innerText.trim()));
}

test('edit a policy: preview as you type, save, audit entry, a waiting job\'s plan moves', async () => {
  const { page, errors, close } = await openBrowser();
  const waiting = seeded().waiting[0];
  try {
    await signIn(page);
    // Before: the type policy says PT1H × 2; the job waits for retry 1, then 2h, 4h, 8h.
    assert.deepEqual(await plannedDelays(page, waiting), ['1h', '2h', '4h', '8h']);

    await page.goto(`${BASE_URL}/policies`);
    await page.click('a:has-text("invoice.render")');
    await page.waitForSelector('input[name="policy[initial_interval]"]');
    await hydrated(page);
    assert.match(await textOf(page, '.dry-run'), /2 jobs of this type are waiting to retry/);

    // Validation names the field, live.
    await page.fill('input[name="policy[backoff_coefficient]"]', '0.5');
    await page.waitForSelector('.preview .alert.error[data-field="backoff_coefficient"]');
    assert.match(await textOf(page, '.preview .alert.error'), /backoff_coefficient.*>= 1\.0/);

    // The preview follows the typing, without a button.
    await page.fill('input[name="policy[backoff_coefficient]"]', '3');
    await page.fill('input[name="policy[initial_interval]"]', 'PT10M');
    await page.waitForFunction(() => {
      const cells = [...document.querySelectorAll('.preview-table tbody tr td:nth-child(3)')].map((c) => c.textContent);
      return cells.join(',') === '10m,30m,1h 30m,4h 30m';
    });
    assert.match(await textOf(page, '.dry-run'), /waits 2h now, 30m with this edit/);
    await screenshot(page, '03-policy-preview');

    await page.fill('input[name=note]', 'faster first retries');
    await page.click('button[name=intent][value=save]');
    await page.waitForSelector('.alert.success');
    assert.match(await textOf(page, '.alert.success'), /Saved version 2 of the invoice\.render policy/);
    // The history shows the new version and what changed.
    await page.waitForFunction(() => document.querySelector('table.history tbody tr')?.innerText.includes('v2'));
    assert.match(await textOf(page, 'table.history tbody tr'), /initial_interval: "PT1H" → "PT10M"/);
    await screenshot(page, '04-policy-saved');

    // The audit log has it, with who did it.
    await page.goto(`${BASE_URL}/audit?action=policy.`);
    const first = await textOf(page, 'table.audit tbody tr');
    assert.match(first, new RegExp(`${OPERATOR.username}\\s+policy\\.update\\s+invoice\\.render`));
    assert.match(first, /faster first retries/);
    await screenshot(page, '05-audit');

    // The waiting job's already-scheduled retry stays; the ones after it follow the new policy.
    assert.deepEqual(await plannedDelays(page, waiting), ['1h', '30m', '1h 30m', '4h 30m']);
    await screenshot(page, '06-waiting-job-after-edit');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});
