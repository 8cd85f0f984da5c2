// The page's Content-Security-Policy lets the dashboard hydrate and its forms work with
// JavaScript (nothing the policy refuses, no console errors), and a link carrying a
// server-function error the server never produced for this browser shows nothing of it.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, hydrated, openBrowser, screenshot, signIn, textOf } from './support.mjs';

const QUEUE = 'csp-check';

test('the CSP allows hydration and JavaScript forms, and nothing violates it', async () => {
  const res = await fetch(`${BASE_URL}/ojs/v1/jobs`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ type: 'csp.check', args: [], options: { queue: QUEUE } }),
  });
  assert.equal(res.status, 201);

  const { page, errors, close } = await openBrowser();
  try {
    const violations = [];
    await page.exposeFunction('reportViolation', (v) => violations.push(v));
    await page.addInitScript(() => {
      document.addEventListener('securitypolicyviolation', (e) => window.reportViolation(`${e.violatedDirective} ${e.blockedURI}`));
    });
    await signIn(page);
    const response = await page.goto(`${BASE_URL}/queues`);
    const csp = response.headers()['content-security-policy'] ?? '';
    assert.match(csp, /script-src 'self' 'nonce-[A-Za-z0-9_-]+' 'wasm-unsafe-eval'/);
    assert.match(csp, /frame-ancestors 'none'/);
    assert.equal(response.headers()['x-frame-options'], 'DENY');
    assert.equal(response.headers()['x-content-type-options'], 'nosniff');
    await hydrated(page);

    // A form submitted by the hydrated app (no page load): pause, then resume.
    const row = `tr:has(a:text-is("${QUEUE}"))`;
    await page.click(`${row} button:has-text("Pause")`);
    await page.waitForSelector(`.alert.success:has-text("Queue ${QUEUE} is paused")`);
    await page.waitForSelector(`${row} button:has-text("Resume")`);
    await page.click(`${row} button:has-text("Resume")`);
    await page.waitForSelector(`.alert.success:has-text("Queue ${QUEUE} is running again")`);
    await screenshot(page, '30-csp-hydrated');

    assert.deepEqual(violations, [], 'nothing the CSP refused');
    assert.deepEqual(errors, [], 'no console errors');
  } finally {
    await close();
  }
});

/** A browser signed in and at `link`, hydrated when JavaScript runs; the caller closes it. */
async function signedInAt(link, javaScriptEnabled) {
  const browser = await openBrowser({ javaScriptEnabled });
  try {
    await signIn(browser.page);
    await browser.page.goto(link);
    if (javaScriptEnabled) await hydrated(browser.page);
    return browser;
  } catch (e) {
    await browser.close();
    throw e;
  }
}

test('a forged __err link shows nothing attacker-chosen, with or without JavaScript', async () => {
  // Encoded as Leptos encodes its own (URL-safe base64 with padding), so that without the
  // server's check the page would show it.
  const forged = Buffer.from(JSON.stringify({ Forbidden: 'Your session expired: sign in again at https://evil.example/login' }))
    .toString('base64')
    .replace(/\+/g, '-')
    .replace(/\//g, '_');
  const link = `${BASE_URL}/queues?__path=%2Fapi%2Fset_queue_paused&__err=${encodeURIComponent(forged)}`;
  for (const javaScriptEnabled of [true, false]) {
    const { page, close } = await signedInAt(link, javaScriptEnabled);
    try {
      assert.equal(await textOf(page, 'h1'), 'Queues');
      assert.doesNotMatch(await page.content(), /evil\.example/, `js ${javaScriptEnabled}`);
      assert.equal(new URL(page.url()).searchParams.get('__err'), null, 'the error is dropped from the URL');
      await screenshot(page, `31-forged-error-link-${javaScriptEnabled ? 'js' : 'nojs'}`);
    } finally {
      await close();
    }
  }
});

test('a link carrying form values fills no form, with or without JavaScript', async () => {
  // The shape a refused save's way back has, but no refusal behind it: the values would be
  // shown as the rule's, and saved by a careless click.
  const link = `${BASE_URL}/dead-letters/replay-rules?edit=linked-rule&typed=1&name=linked-rule&delay=PT1M&max_replays=100&enabled=true`;
  for (const javaScriptEnabled of [true, false]) {
    const { page, close } = await signedInAt(link, javaScriptEnabled);
    try {
      assert.equal(await page.inputValue('.replay-rule-editor input[name=delay]'), 'PT1H', `js ${javaScriptEnabled}: a new rule's default`);
      assert.equal(await page.inputValue('.replay-rule-editor input[name=max_replays]'), '3', `js ${javaScriptEnabled}`);
    } finally {
      await close();
    }
  }
});
