// What every dashboard test needs: Debian's Chromium through playwright-core (never a
// downloaded browser), a fresh profile per browser, signing in, screenshots, and the seed.

import { mkdtempSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));

export const BASE_URL = (process.env.BASE_URL ?? 'http://127.0.0.1:3000').replace(/\/$/, '');
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
export const SCREENSHOTS = resolve(process.env.SCREENSHOT_DIR ?? join(here, '..', '..', 'target', 'e2e-screenshots'));

export const OPERATOR = { username: process.env.E2E_OPERATOR ?? 'olivia', password: process.env.E2E_OPERATOR_PASSWORD ?? 'operator-password' };
export const VIEWER = { username: process.env.E2E_VIEWER ?? 'victor', password: process.env.E2E_VIEWER_PASSWORD ?? 'viewer-password' };

/** The ids the seed script printed (see ../seed.mjs). */
export function seeded() {
  const file = process.env.E2E_SEED_FILE;
  if (!file) throw new Error('E2E_SEED_FILE is not set: run the tests through scripts/e2e.sh');
  return JSON.parse(readFileSync(file, 'utf8'));
}

/**
 * A browser with a fresh profile. `javaScriptEnabled: false` tests the no-JS paths.
 * Returns { context, page, errors, close } where `errors` collects console errors and page
 * errors, so a test can assert that hydration went cleanly.
 */
export async function openBrowser({ javaScriptEnabled = true } = {}) {
  const profile = mkdtempSync(join(tmpdir(), 'rebound-e2e-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    javaScriptEnabled,
    viewport: { width: 1400, height: 900 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  const page = context.pages()[0] ?? (await context.newPage());
  const errors = [];
  page.on('console', (msg) => {
    if (msg.type() === 'error') errors.push(msg.text());
  });
  page.on('pageerror', (err) => errors.push(String(err)));
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, page, errors, close };
}

/** Signs in through the login form and waits for the overview. */
export async function signIn(page, who = OPERATOR) {
  await page.goto(`${BASE_URL}/login`);
  await page.fill('input[name=username]', who.username);
  await page.fill('input[name=password]', who.password);
  await Promise.all([page.waitForURL(`${BASE_URL}/`), page.click('button[type=submit]')]);
}

/** Waits until the wasm has hydrated the page (the app marks <body> once it runs). */
export async function hydrated(page) {
  await page.waitForFunction(() => document.body.dataset.hydrated === 'true', null, { timeout: 15000 });
}

/** A full-page PNG under target/e2e-screenshots/. */
export async function screenshot(page, name) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

/** The rendered text of the first element matching `selector`, trimmed. */
export async function textOf(page, selector) {
  return ((await page.innerText(selector)) ?? '').trim();
}

/** A job as the OJS API reports it (state, attempt, …). */
export async function apiJob(id) {
  const res = await fetch(`${BASE_URL}/ojs/v1/jobs/${id}`);
  if (!res.ok) throw new Error(`GET job ${id}: ${res.status}`);
  const body = await res.json();
  return body.job ?? body;
}
