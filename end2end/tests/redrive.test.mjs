// Re-driving dead letters: one from its row, then everything matching a filter.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, apiJob, hydrated, openBrowser, screenshot, seeded, signIn, textOf } from './support.mjs';

test('re-drive one dead letter, then all matching a filter', async () => {
  const { page, errors, close } = await openBrowser();
  const dead = seeded().dead;
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/dead-letters`);
    await hydrated(page);
    // Grouped by error signature, digits normalised.
    const groups = await page.$$eval('table.groups tbody tr', (rows) => rows.map((r) => r.innerText));
    // C-1…C-3 and V-1, and N-1 unless the no-JS test re-drove it already.
    assert.match(groups[0], /http\.5xx: gateway returned # after #s\t.*\t[45]\t/);
    assert.match(groups[1], /auth\.denied: card # declined by issuer\t.*\t2\t/);
    await screenshot(page, '07-dead-letters');

    // One: the row's own button.
    const c1 = dead['C-1'];
    await page.click(`table.jobs tr:has(a[href="/jobs/${c1}"]) button[name=one]`);
    await page.waitForSelector('.alert.success');
    assert.match(await textOf(page, '.alert.success'), /Re-drove 1 dead letter\./);
    const job = await apiJob(c1);
    assert.equal(job.state, 'available');
    await page.waitForFunction((id) => !document.querySelector(`table.jobs a[href="/jobs/${id}"]`), c1);

    // All matching a filter: the two auth.denied ones, with one more attempt each.
    await page.fill('input[name=error_type]', 'auth.denied');
    await Promise.all([page.waitForURL(/error_type=auth\.denied/), page.click('form.filters button[type=submit]')]);
    await page.waitForFunction(() => document.querySelectorAll('table.jobs tbody tr').length === 2);
    await page.check('input[name=scope][value=filter]');
    await page.check('input[name="how[budget]"][value=one_more]');
    await page.selectOption('select[name="how[stagger]"]', '60');
    await page.fill('input[name="how[reason]"]', 'issuer outage over');
    await page.click('button.primary:has-text("Re-drive")');
    await page.waitForFunction(() => /Re-drove 2 dead letters, spread over 1m\./.test(document.querySelector('.alert.success')?.textContent ?? ''));
    await screenshot(page, '08-bulk-redrive');
    for (const order of ['D-1', 'D-2']) {
      const j = await apiJob(dead[order]);
      assert.ok(['available', 'scheduled'].includes(j.state), `${order} is ${j.state}`);
    }
    // Staggered over a minute: the first goes at once, the second later.
    assert.equal((await apiJob(dead['D-1'])).state, 'available');
    assert.equal((await apiJob(dead['D-2'])).state, 'scheduled');

    // The audit log names the filter, the budget and the reason.
    await page.goto(`${BASE_URL}/audit?action=dead_letter.`);
    const entry = await textOf(page, 'table.audit tbody tr');
    assert.match(entry, /dead_letter\.redrive/);
    assert.match(entry, /"budget":"one_more"/);
    assert.match(entry, /issuer outage over/);
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});
