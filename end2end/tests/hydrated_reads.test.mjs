// With JavaScript on, every page's own refresh (a server function called every few seconds)
// is answered: a read the CSRF guard took for a change was refused 403 on the Queues page's
// rate-limit keys and on the replay rules page, so those parts of the hydrated pages stopped
// updating and showed an error.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BASE_URL, hydrated, openBrowser, signIn } from './support.mjs';

test('hydrated pages refresh through their read-only server functions without a refusal', async () => {
  const res = await fetch(`${BASE_URL}/ojs/v1/jobs`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ type: 'partner.call', args: [], options: { queue: 'hydrated-reads', rate_limit: { key: 'partner:hydrated', concurrency: 1 } } }),
  });
  assert.equal(res.status, 201);
  const { page, errors, close } = await openBrowser();
  const calls = [];
  page.on('response', (r) => {
    const path = new URL(r.url()).pathname;
    if (path.startsWith('/api/')) calls.push([path, r.status()]);
  });
  try {
    await signIn(page);
    for (const [path, fn] of [
      ['/queues', '/api/rate_limit_keys'],
      ['/dead-letters/replay-rules', '/api/replay_rules'],
    ]) {
      calls.length = 0;
      await page.goto(`${BASE_URL}${path}`);
      await hydrated(page);
      // The page's resources refetch on the refresh tick (every 5 s).
      await page.waitForResponse((r) => new URL(r.url()).pathname === fn, { timeout: 15000 });
      await page.waitForTimeout(500);
      const refused = calls.filter(([, status]) => status >= 400);
      assert.deepEqual(refused, [], `${path}: ${JSON.stringify(calls)}`);
      assert.ok(calls.some(([p, status]) => p === fn && status === 200), `${path}: ${JSON.stringify(calls)}`);
      assert.equal(await page.locator('main .alert.error').count(), 0, `${path} shows no error`);
    }
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});
