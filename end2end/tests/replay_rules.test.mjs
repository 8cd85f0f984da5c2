// The replay rules page, reached from the dead letters, without JavaScript (plain form posts
// answered by a redirect back): create a rule and see it listed, have a bad delay refused
// naming the field (the form coming back with what was typed), edit the rule through its Edit
// link, disable it, delete it; each change is audited.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, openBrowser, screenshot, signIn, textOf } from './support.mjs';

const RULE = 'payments-5xx-e2e';
const row = (name) => `tr[data-rule="${name}"]`;

/** The rule as the OJS API reports it, or null when there is none. */
async function apiRule(name) {
  const res = await fetch(`${BASE_URL}/ojs/v1/dead-letter/replay-rules/${name}`);
  if (res.status === 404) return null;
  assert.equal(res.status, 200);
  return (await res.json()).replay_rule;
}

/** Fills the rule form's text fields and saves it. */
async function saveRule(page, fields) {
  for (const [name, value] of Object.entries(fields)) {
    await page.fill(`.replay-rule-editor input[name=${name}]`, value);
  }
  await Promise.all([page.waitForNavigation(), page.click('button:has-text("Save rule")')]);
}

test('create, list, edit, disable and delete a replay rule without JavaScript', async () => {
  const { page, close } = await openBrowser({ javaScriptEnabled: false });
  try {
    await signIn(page);
    await page.goto(`${BASE_URL}/dead-letters`);
    await Promise.all([page.waitForNavigation(), page.click('main a:has-text("Replay rules")')]);
    assert.equal(page.url(), `${BASE_URL}/dead-letters/replay-rules`);

    // Six hours: none of the seeded dead letters falls due while the tests run.
    await saveRule(page, { name: RULE, queue: 'payments', job_type: '', error_type: 'http.*', delay: 'PT6H', max_replays: '2' });
    const r = row(RULE);
    assert.match(await textOf(page, `${r} .filter`), /queue\s+payments\s+type\s+any\s+error\s+http\.\*/);
    assert.match(await textOf(page, `${r} .delay`), /PT6H\s+6h/);
    assert.equal(await textOf(page, `${r} td:nth-child(4)`), '2');
    assert.equal(await textOf(page, `${r} .tag`), 'enabled');
    const created = await apiRule(RULE);
    assert.deepEqual(created.filter, { queue: 'payments', type: null, error_type: 'http.*' });
    assert.equal(created.delay, 'PT6H');
    assert.equal(created.enabled, true);
    await screenshot(page, '23-replay-rule-created');

    // A delay that is not ISO-8601 is refused, naming the field, and nothing is saved; the
    // form comes back with what was typed.
    await page.selectOption('.replay-rule-editor select[name=enabled]', 'false');
    await saveRule(page, { name: 'bad-delay-e2e', queue: 'typed-queue', delay: 'six hours', max_replays: '4' });
    assert.match(await textOf(page, '.alert.error'), /^delay: must be an ISO-8601 duration/);
    assert.ok(await page.isVisible('.replay-rule-editor label.field.invalid input[name=delay]'), 'the delay field is marked');
    const typed = { name: 'bad-delay-e2e', queue: 'typed-queue', delay: 'six hours', max_replays: '4' };
    for (const [name, value] of Object.entries(typed)) {
      assert.equal(await page.inputValue(`.replay-rule-editor input[name=${name}]`), value, `${name} kept`);
    }
    assert.equal(await page.inputValue('.replay-rule-editor select[name=enabled]'), 'false', 'the status kept');
    assert.equal(await page.$(row('bad-delay-e2e')), null);
    assert.equal(await apiRule('bad-delay-e2e'), null);
    await screenshot(page, '24-replay-rule-bad-delay');

    // Edit fills the form with the rule; saving under its name replaces it.
    await Promise.all([page.waitForNavigation(), page.click(`${r} a:has-text("Edit")`)]);
    assert.equal(await page.inputValue('.replay-rule-editor input[name=name]'), RULE);
    assert.equal(await page.inputValue('.replay-rule-editor input[name=error_type]'), 'http.*');
    assert.equal(await page.inputValue('.replay-rule-editor input[name=delay]'), 'PT6H');
    await saveRule(page, { max_replays: '3' });
    assert.equal(await textOf(page, `${r} td:nth-child(4)`), '3');
    assert.equal((await apiRule(RULE)).max_replays, 3);

    await Promise.all([page.waitForNavigation(), page.click(`${r} button:has-text("Disable")`)]);
    assert.equal(await textOf(page, `${r} .tag`), 'disabled');
    assert.ok(await page.isVisible(`${r} button:has-text("Enable")`));
    const disabled = await apiRule(RULE);
    assert.equal(disabled.enabled, false);
    assert.equal(disabled.max_replays, 3, 'disabling changes nothing else');
    await screenshot(page, '25-replay-rule-disabled');

    // Deleted from its own edit page: the form offers to create it anew.
    await Promise.all([page.waitForNavigation(), page.click(`${r} button:has-text("Delete")`)]);
    assert.equal(await page.$(r), null);
    assert.equal(await apiRule(RULE), null);
    assert.match(await textOf(page, '.replay-rule-editor .note'), /no replay rule of that name/);

    await page.goto(`${BASE_URL}/audit?action=dead_letter.replay_rule.`);
    const entries = await page.$$eval('table.audit tbody tr', (rows) => rows.map((t) => t.textContent));
    for (const action of ['dead_letter.replay_rule.create', 'dead_letter.replay_rule.update', 'dead_letter.replay_rule.delete']) {
      assert.ok(entries.some((t) => t.includes(action) && t.includes('olivia') && t.includes(RULE)), `${action} by olivia in the audit log: ${entries}`);
    }
  } finally {
    await close();
  }
});
