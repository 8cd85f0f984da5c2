// Signing in and out, and that the hydrated app runs without errors.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, OPERATOR, hydrated, openBrowser, screenshot, signIn, textOf } from './support.mjs';

test('a wrong password is refused, the right one signs in, logout signs out', async () => {
  const { page, errors, close } = await openBrowser();
  try {
    // Signed out, any page sends you to the login page and back afterwards.
    await page.goto(`${BASE_URL}/dead-letters`);
    assert.match(page.url(), /\/login\?next=%2Fdead-letters$/);

    await page.fill('input[name=username]', OPERATOR.username);
    await page.fill('input[name=password]', 'not-the-password');
    await Promise.all([page.waitForURL(/\/login\?error=1/), page.click('button[type=submit]')]);
    assert.match(await textOf(page, '.alert.error'), /Wrong username or password/);

    await signIn(page);
    await hydrated(page);
    assert.equal(await textOf(page, 'h1'), 'Overview');
    assert.match(await textOf(page, 'header .user'), new RegExp(`${OPERATOR.username}.*operator`));
    // The seed's dead letters show on the overview.
    assert.equal(await textOf(page, '.card.state-dead .card-count'), '8');
    // The session cookie is HttpOnly: scripts cannot read it.
    assert.equal(await page.evaluate(() => document.cookie.includes('rebound_session')), false);
    await screenshot(page, '01-overview');

    // Client-side navigation after hydration.
    await page.click('header nav a[href="/jobs"]');
    await page.waitForSelector('table.jobs');
    assert.equal(await textOf(page, 'h1'), 'Jobs');

    await Promise.all([page.waitForURL(/\/login\?logged_out=1/), page.click('header button:has-text("Log out")')]);
    await page.goto(`${BASE_URL}/`);
    assert.match(page.url(), /\/login/);
    assert.deepEqual(errors.filter((e) => !e.includes('401')), []);
  } finally {
    await close();
  }
});
