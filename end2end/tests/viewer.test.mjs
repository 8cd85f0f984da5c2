// A viewer sees everything and changes nothing: the buttons are disabled, and a forged
// request (with a valid CSRF token) is refused with 403 and changes nothing.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, VIEWER, apiJob, hydrated, openBrowser, screenshot, seeded, signIn, textOf } from './support.mjs';

test('a viewer cannot act', async () => {
  const { page, close } = await openBrowser();
  const target = seeded().dead['V-1'];
  try {
    await signIn(page, VIEWER);
    await page.goto(`${BASE_URL}/jobs/${target}`);
    await hydrated(page);
    assert.match(await textOf(page, 'p.note'), /viewer/);
    assert.equal(await page.isDisabled('button[name=action][value=redrive]'), true);
    await screenshot(page, '09-viewer-job');

    const csrf = await page.getAttribute('input[name=csrf]', 'value');
    assert.ok(csrf && csrf.length >= 32);
    // The same request the form would send, from the viewer's session.
    const res = await page.request.post(`${BASE_URL}/api/act_on_job`, {
      form: { csrf, id: target, action: 'redrive', budget: 'fresh' },
      headers: { accept: 'application/json' },
    });
    assert.equal(res.status(), 403);
    assert.match(await res.text(), /viewer/);
    // A policy save and a queue pause are refused too.
    const save = await page.request.post(`${BASE_URL}/api/save_policy`, {
      form: { csrf, job_type: 'payment.refund', 'policy[max_attempts]': '9', intent: 'save' },
    });
    assert.equal(save.status(), 403);
    const pause = await page.request.post(`${BASE_URL}/api/set_queue_paused`, { form: { csrf, queue: 'payments', paused: 'true' } });
    assert.equal(pause.status(), 403);

    const job = await apiJob(target);
    assert.equal(job.state, 'discarded');
    const policy = await fetch(`${BASE_URL}/ojs/v1/admin/policies/payment.refund`);
    assert.equal(policy.status, 404);
    const queues = await (await fetch(`${BASE_URL}/ojs/v1/queues`)).json();
    const payments = (queues.queues ?? []).find((q) => q.name === 'payments');
    assert.ok(!payments?.paused, 'the payments queue must not be paused');

    // Without a valid CSRF token even an operator's session would be refused; here: 403 too.
    const forged = await page.request.post(`${BASE_URL}/api/act_on_job`, { form: { csrf: 'forged', id: target, action: 'redrive' } });
    assert.equal(forged.status(), 403);
  } finally {
    await close();
  }
});
