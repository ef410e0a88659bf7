// End-to-end checks of the web console in headless Chromium (playwright-core driving
// Debian's chromium), against a running `jobledger serve`:
//   node console.mjs BASE_URL ADMIN_TOKEN SCREENSHOT_DIR
// Prints one line per check and ends with "N console check(s) failed"; exits 1 when
// any failed. Screenshots of every page go to SCREENSHOT_DIR.

import { chromium } from 'playwright-core';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { createRequire } from 'node:module';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const [base, adminToken, screenshots] = process.argv.slice(2);
if (!base || !adminToken || !screenshots) {
  console.error('usage: node console.mjs BASE_URL ADMIN_TOKEN SCREENSHOT_DIR');
  process.exit(2);
}
mkdirSync(screenshots, { recursive: true });
const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
const origin = new URL(base).origin;

let failed = 0;
async function check(name, body) {
  try {
    await body();
    console.log(`ok   ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`FAIL ${name}: ${error.stack ?? error}`);
  }
}
function assert(condition, message) {
  if (!condition) throw new Error(message);
}

async function api(key, query, variables = {}) {
  const response = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ query, variables }),
  });
  const body = await response.json();
  if (body.errors) throw new Error(JSON.stringify(body.errors));
  return body.data;
}

/** "1.50" and "1.5" are one amount: compare decimals as nano-credits. */
function nanos(text) {
  const [whole, fraction = ''] = String(text).replace(/ cr$/, '').trim().split('.');
  return BigInt(whole) * 1_000_000_000n + BigInt((fraction + '000000000').slice(0, 9));
}

async function until(what, probe, limit = 40_000) {
  const deadline = Date.now() + limit;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const CREATE_JOB = `mutation CreateJob($input: CreateJobInput!) {
  createJob(input: $input) { job { id status } }
}`;
const JOB = `query Job($id: UUID!) {
  job(id: $id) { status attempts { outcome providerRequestId } cost { providerCost customerCharge margin marginAtWorst } }
}`;
const SUMMARY = `query BillingSummary($from: DateTime!, $to: DateTime!) {
  billingSummary(from: $from, to: $to) { jobsCreated providerCost customerCharges margin marginAtWorst unknownOutcomes }
}`;

function createJob(key, idempotencyKey, content, options = {}) {
  return api(key, CREATE_JOB, { input: {
    idempotencyKey, model: 'gpt-4o-mini', maxOutputTokens: 100, messages: [{ role: 'user', content }], ...options,
  } }).then((data) => data.createJob.job.id);
}

// ---- data set up through the API, as a tenant's own code would --------------------
const { createTenant } = await api(adminToken,
  'mutation { createTenant(name: "acme-console") { tenant { id } apiKey } }');
const tenantKey = createTenant.apiKey;
const tenantId = createTenant.tenant.id;
await api(adminToken, 'mutation($i: GrantCreditsInput!) { grantCredits(input: $i) { id } }',
  { i: { tenantId, amount: '100', idempotencyKey: 'console-test' } });
// A credit that expires a moment from now: its EXPIRY entry shows in the ledger.
await api(adminToken, 'mutation($i: GrantCreditsInput!) { grantCredits(input: $i) { id } }',
  { i: { tenantId, amount: '1', idempotencyKey: 'console-expiring', expiresAt: new Date(Date.now() + 2_000).toISOString() } });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
const page = await context.newPage();
// Generous: the suite runs this beside every other test on a shared machine.
page.setDefaultTimeout(40_000);
const consoleErrors = [];
const foreignRequests = [];
page.on('console', (message) => {
  if (message.type() === 'error') consoleErrors.push(`${page.url()}: ${message.text()}`);
});
page.on('pageerror', (error) => consoleErrors.push(`${page.url()}: ${error.message}`));
context.on('request', (request) => {
  const url = request.url();
  if (!url.startsWith('data:') && new URL(url).origin !== origin && !url.startsWith(origin.replace('http', 'ws'))) {
    foreignRequests.push(url);
  }
});

async function shot(name) {
  await page.screenshot({ path: join(screenshots, `${name}.png`), fullPage: true });
}

/** axe-core on the current page: no serious or critical violation. */
async function accessible(name) {
  await check(`${name}: axe-core finds no serious violation`, async () => {
    await page.evaluate(axeSource);
    const violations = await page.evaluate(async () =>
      (await window.axe.run(document, { resultTypes: ['violations'] })).violations
        .filter((violation) => ['serious', 'critical'].includes(violation.impact))
        .map((violation) => `${violation.id} (${violation.impact}): ${violation.nodes.map((node) => node.target.join(' ')).join(', ')}`));
    assert(violations.length === 0, violations.join('\n'));
  });
}

/** The page fits `width` without scrolling sideways. */
async function fits(name, width) {
  await check(`${name}: fits ${width} px wide`, async () => {
    await page.setViewportSize({ width, height: 1000 });
    const scrollWidth = await page.evaluate(() => document.documentElement.scrollWidth);
    assert(scrollWidth <= width, `the page is ${scrollWidth} px wide`);
    await shot(`${name}-${width}px`);
    await page.setViewportSize({ width: 1280, height: 900 });
  });
}

async function signIn(key, on = page) {
  await on.locator('#key').waitFor();
  // Keyboard only: the key field has focus; Enter submits.
  await on.keyboard.type(key);
  await on.keyboard.press('Enter');
}

/**
 * Another tab with its own session storage, its errors kept apart: the browser's own
 * lines about refused requests are expected where a test revokes a key.
 */
async function newTab() {
  const tabContext = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const tab = await tabContext.newPage();
  tab.setDefaultTimeout(40_000);
  const errors = [];
  tab.on('console', (message) => {
    if (message.type() === 'error') errors.push(`${tab.url()}: ${message.text()}`);
  });
  tab.on('pageerror', (error) => errors.push(`${tab.url()}: ${error.message}`));
  return { tab, errors, close: () => tabContext.close() };
}

/** Counts the `OUTPUT_DELTA` events of a job as a client of its own sees them. */
function watchDeltas(key, jobId) {
  const client = createClient({
    url: `${base.replace(/^http/, 'ws')}/graphql/ws`,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${key}` },
  });
  const watch = { deltas: 0, stop: () => client.dispose() };
  client.subscribe({
    query: 'subscription($jobId: UUID!) { jobUpdates(jobId: $jobId) { kind } }',
    variables: { jobId },
  }, {
    next: ({ data }) => { if (data.jobUpdates.kind === 'OUTPUT_DELTA') watch.deltas += 1; },
    error: () => {},
    complete: () => {},
  });
  return watch;
}

// ---- sign in -----------------------------------------------------------------------
await check('the console is served with a policy that allows only its own origin', async () => {
  const response = await page.goto(base);
  const policy = response.headers()['content-security-policy'];
  assert(policy && policy.includes("script-src 'self'") && !policy.includes('unsafe-inline'), `policy: ${policy}`);
  await page.locator('h1', { hasText: 'Sign in' }).waitFor();
  await shot('sign-in');
});
await accessible('sign-in');
await check('a tenant signs in with its key, typed and submitted from the keyboard', async () => {
  await signIn(tenantKey);
  await page.locator('h1', { hasText: 'Jobs' }).waitFor();
  const stored = await page.evaluate(() => [sessionStorage.getItem('jobledger.key'), localStorage.length]);
  assert(stored[0] === tenantKey && stored[1] === 0, 'the key is kept in session storage only');
});

// ---- jobs: live list -----------------------------------------------------------------
let fastJob;
await check('a job created through the API turns SUCCEEDED in the list without a reload', async () => {
  await page.getByTestId('live-state').filter({ hasText: 'Live:' }).waitFor();
  await page.evaluate(() => { window.notReloaded = true; });
  fastJob = await createJob(tenantKey, 'console-fast', 'Summarise the console test [mock:delay_ms=1500]');
  const row = page.getByRole('row').filter({ hasText: fastJob });
  await row.waitFor({ timeout: 40_000 });
  await row.getByText('SUCCEEDED').waitFor({ timeout: 40_000 });
  assert(await page.evaluate(() => window.notReloaded === true), 'the page was reloaded');
  await shot('jobs');
});
await accessible('jobs');
await check('the status filter shows only the chosen status', async () => {
  await page.locator('#status-filter').selectOption('FAILED');
  await page.getByText('No jobs match.').waitFor();
  await page.locator('#status-filter').selectOption('SUCCEEDED');
  await page.getByRole('row').filter({ hasText: fastJob }).waitFor();
  await page.locator('#status-filter').selectOption('');
});
await check('a keyboard user keeps their place in the list as new jobs arrive', async () => {
  const link = page.getByRole('link', { name: fastJob });
  await link.waitFor();
  await link.focus();
  const another = await createJob(tenantKey, 'console-focus', 'Arrive while a link has focus');
  await page.getByRole('row').filter({ hasText: another }).waitFor({ timeout: 40_000 });
  const focused = await page.evaluate(() => document.activeElement?.textContent);
  assert(focused === fastJob, `focus moved to ${focused}`);
});
await fits('jobs', 768);

// ---- one job ---------------------------------------------------------------------------
await check('the job opens from the keyboard and shows its attempts and exact cost', async () => {
  await page.getByRole('link', { name: fastJob }).focus();
  await page.keyboard.press('Enter');
  await page.getByTestId('attempts-table').waitFor();
  const { job } = await api(tenantKey, JOB, { id: fastJob });
  const attempts = page.getByTestId('attempts-table').locator('tbody tr');
  assert(await attempts.count() === job.attempts.length, 'one row per attempt');
  const row = await attempts.first().innerText();
  assert(row.includes('SUCCEEDED'), `attempt row: ${row}`);
  assert(row.includes(job.attempts[0].providerRequestId), `the provider request id is shown: ${row}`);
  for (const [testId, value] of [['provider-cost', job.cost.providerCost], ['customer-charge', job.cost.customerCharge], ['margin', job.cost.margin], ['margin-at-worst', job.cost.marginAtWorst]]) {
    const shown = await page.getByTestId(testId).innerText();
    assert(nanos(shown) === nanos(value), `${testId}: shown ${shown}, API ${value}`);
  }
  assert(nanos(job.cost.customerCharge) > 0n, 'the job was charged');
  await page.getByTestId('result').waitFor();
  assert((await page.getByTestId('timeline').locator('li').count()) >= 3, 'the timeline lists the events');
  await shot('job');
});
await accessible('job');
await fits('job', 768);

await check('a slow running job is cancelled from its page', async () => {
  const slow = await createJob(tenantKey, 'console-slow', 'Take your time [mock:delay_ms=60000]');
  await until('the slow job to run', async () => (await api(tenantKey, JOB, { id: slow })).job.status === 'RUNNING');
  await page.goto(`${base}/#/jobs/${slow}`);
  const cancel = page.getByRole('button', { name: 'Cancel job' });
  await cancel.waitFor();
  await cancel.focus();
  await page.keyboard.press('Enter');
  await page.locator('.facts dd .status', { hasText: 'CANCELLED' }).first().waitFor({ timeout: 40_000 });
  const { job } = await api(tenantKey, JOB, { id: slow });
  assert(job.status === 'CANCELLED', `status ${job.status}`);
  assert(job.attempts.length === 1 && job.attempts[0].outcome === 'CANCELLED', JSON.stringify(job.attempts));
  // The call may have been billed and its cost is unknown: the margin is shown as a
  // limit, next to the worst case.
  await page.getByText('Margin, at most (costs unknown)').waitFor();
  await page.getByText('Margin, at worst').waitFor();
  await shot('job-cancelled');
});

await check('a streaming job shows its output on its page while it runs', async () => {
  const reply = 'alpha beta gamma delta epsilon zeta eta theta iota kappa';
  const streaming = await createJob(tenantKey, 'console-stream',
    `Stream this [mock:reply=${reply}] [mock:chunk_delay_ms=300]`, { streamOutput: true });
  await page.goto(`${base}/#/jobs/${streaming}`);
  const output = page.getByTestId('live-output');
  await until('output while the job runs', async () => {
    const shown = await output.textContent();
    const { job } = await api(tenantKey, JOB, { id: streaming });
    return shown.length > 0 && reply.startsWith(shown) && job.status === 'RUNNING';
  });
  await page.getByTestId('result').filter({ hasText: reply }).waitFor({ timeout: 40_000 });
  await shot('job-streaming');
});

await check('streamed output resumes after the live connection drops mid-stream, and ends whole', async () => {
  const { tab, errors, close } = await newTab();
  // Every live connection of the tab passes through here. A reconnection waits until
  // `release` resolves, so that a delta is certainly sent while the tab is offline.
  const connections = [];
  let release = () => {};
  const released = new Promise((resolve) => { release = resolve; });
  await tab.routeWebSocket(/\/graphql\/ws$/, async (socket) => {
    const number = connections.length;
    const waiting = [];
    let server = null;
    connections.push({ socket, server: () => server });
    socket.onMessage((message) => (server ? server.send(message) : waiting.push(message)));
    if (number > 0) await released;
    server = socket.connectToServer();
    server.onMessage((message) => socket.send(message));
    for (const message of waiting) server.send(message);
  });
  await tab.goto(base);
  await signIn(tenantKey, tab);
  await tab.locator('h1', { hasText: 'Jobs' }).waitFor();
  // The simulator streams a reply in four pieces, each after the delay.
  const reply = Array.from({ length: 24 }, (_, index) => `piece${index}`).join(' ');
  const streaming = await createJob(tenantKey, 'console-stream-reconnect',
    `Stream across a reconnect [mock:reply=${reply}] [mock:chunk_delay_ms=2000]`, { streamOutput: true });
  const watch = watchDeltas(tenantKey, streaming);
  await tab.goto(`${base}/#/jobs/${streaming}`);
  const output = tab.getByTestId('live-output');
  await until('output before the drop', async () => (await output.textContent()).length > 0);
  const seenBeforeDrop = watch.deltas;
  const first = connections[connections.length - 1];
  await first.socket.close({ code: 1011, reason: 'dropped by the test' });
  await first.server()?.close();
  await until('a delta sent while the tab is offline', async () => watch.deltas > seenBeforeDrop);
  release();
  await tab.getByTestId('output-gap').waitFor({ state: 'attached' });
  const afterGap = await until('output after the reconnect', async () => {
    const text = await output.evaluate((element) => {
      let shown = '';
      for (let node = element.querySelector('.output-gap')?.nextSibling; node; node = node.nextSibling) shown += node.textContent;
      return shown;
    });
    return text.length > 0 && text;
  });
  assert(reply.includes(afterGap), `after the reconnect: ${afterGap}`);
  await tab.getByTestId('result').filter({ hasText: reply }).waitFor({ timeout: 40_000 });
  await until('the output made whole', async () => (await output.textContent()) === reply);
  watch.stop();
  assert(errors.length === 0, errors.join('\n'));
  await close();
});

await check('a key revoked while its tab is live signs the console out at once', async () => {
  const { tab, errors, close } = await newTab();
  const { createApiKey } = await api(tenantKey,
    'mutation { createApiKey(name: "console-revoked-live") { apiKey key { id } } }');
  await tab.goto(base);
  await signIn(createApiKey.apiKey, tab);
  await tab.getByTestId('live-state').filter({ hasText: 'Live:' }).waitFor();
  // An event of one of the tenant's jobs makes the list read itself again; one arriving
  // between the revocation and the socket's close would send a request that is refused.
  // The earlier checks' jobs are left to end first, so only the socket can tell the tab.
  await until('no queued or running job', async () => {
    const { queued, running } = await api(tenantKey,
      '{ queued: jobs(first: 1, status: QUEUED) { edges { node { id } } } running: jobs(first: 1, status: RUNNING) { edges { node { id } } } }');
    return queued.edges.length === 0 && running.edges.length === 0;
  });
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  await api(tenantKey, 'mutation($id: UUID!) { revokeApiKey(id: $id) { id } }', { id: createApiKey.key.id });
  await tab.locator('h1', { hasText: 'Sign in' }).waitFor();
  await tab.getByRole('alert').filter({ hasText: 'no longer accepts this key' }).waitFor();
  assert(await tab.evaluate(() => sessionStorage.getItem('jobledger.key')) === null, 'the key is forgotten');
  assert(await tab.locator('#nav').isHidden(), 'the navigation is gone');
  // The live connection told the tab: no request was refused, nothing was logged.
  assert(errors.length === 0, errors.join('\n'));
  await close();
});

await check('a key refused on a request signs the console out with a message', async () => {
  const { tab, errors, close } = await newTab();
  const { createApiKey } = await api(tenantKey,
    'mutation { createApiKey(name: "console-revoked-idle") { apiKey key { id } } }');
  await tab.goto(`${base}/#/billing`);
  await signIn(createApiKey.apiKey, tab);
  // The billing page holds no live connection: only a request can learn of the revocation.
  await tab.getByTestId('balance-available').waitFor();
  assert(await tab.evaluate(() => document.body.dataset.live) === 'offline', 'billing opened no live connection');
  await api(tenantKey, 'mutation($id: UUID!) { revokeApiKey(id: $id) { id } }', { id: createApiKey.key.id });
  await tab.getByRole('link', { name: 'Jobs' }).click();
  await tab.locator('h1', { hasText: 'Sign in' }).waitFor();
  await tab.getByRole('alert').filter({ hasText: 'no longer accepts this key' }).waitFor();
  assert(await tab.locator('text=Could not load').count() === 0, 'no view is left showing errors');
  // The browser itself logs the refused request's 401; the console logs nothing more
  // and sends nothing after it.
  const others = errors.filter((line) => !line.includes('status of 401'));
  assert(others.length === 0, others.join('\n'));
  const refused = errors.length - others.length;
  assert(refused <= 1, `${refused} refused requests were logged:\n${errors.join('\n')}`);
  await close();
});

await check('a job created from the console opens on its page and succeeds there', async () => {
  await page.getByRole('link', { name: 'Jobs', exact: true }).click();
  await page.getByText('New job').click();
  await page.locator('#job-prompt').fill('Written in the console [mock:delay_ms=500]');
  await page.getByRole('button', { name: 'Create job' }).click();
  await page.getByTestId('result').waitFor();
  const id = page.url().split('/').pop();
  const { job } = await api(tenantKey, JOB, { id });
  assert(job.status === 'SUCCEEDED', `status ${job.status}`);
});

// Spending limits are shown once the server serves them (account { limits spend }).
const { __type: accountType } = await api(tenantKey, '{ __type(name: "Account") { fields { name } } }');
const limitsServed = accountType.fields.some((field) => field.name === 'limits');
console.log(`# spending limits ${limitsServed ? 'are' : 'are not'} served`);
if (limitsServed) {
  await api(adminToken, 'mutation($i: TenantLimitsInput!) { setTenantLimits(input: $i) { tenantId } }',
    { i: { tenantId, dailySpendLimit: '50' } });
}

// ---- billing ---------------------------------------------------------------------------
async function chartTotalsMatch(key) {
  // The totals sit in the folded table under the chart.
  await page.getByTestId('total-provider-cost').waitFor({ state: 'attached', timeout: 40_000 });
  const [from, to] = await page.getByTestId('period').locator('time')
    .evaluateAll((times) => times.map((element) => element.getAttribute('datetime')));
  const { billingSummary: summary } = await api(key, SUMMARY, { from, to });
  assert(summary.jobsCreated >= 2, `jobs created: ${summary.jobsCreated}`);
  for (const [testId, value] of [
    ['total-provider-cost', summary.providerCost],
    ['total-customer-charges', summary.customerCharges],
    ['total-margin', summary.margin],
    ['summary-margin-at-worst', summary.marginAtWorst],
  ]) {
    const shown = await page.getByTestId(testId).textContent();
    assert(nanos(shown) === nanos(value), `${testId}: charts say ${shown}, billingSummary ${value}`);
  }
  assert(nanos(summary.providerCost) > 0n, 'there is a cost to chart');
  const unknown = await page.getByTestId('total-unknown-outcomes').textContent();
  assert(Number(unknown) === summary.unknownOutcomes, `unknown outcomes: ${unknown}`);
  assert(await page.locator('figure svg rect').count() > 0, 'the charts draw bars');
  // The numbers are one click away.
  const numbers = page.getByTestId('cost-per-day');
  assert(!(await numbers.isVisible()), 'the table starts folded');
  await page.locator('summary').first().click();
  assert(await numbers.isVisible(), 'one click shows the numbers');
}

await check('the billing charts show the same totals as billingSummary', async () => {
  // The expiring grant has expired by now (the server's sweep runs every second). Jobs
  // charged before its expiry consumed it first (soonest-expiring credit goes first),
  // so what expired is its remainder: wait until that amount stops changing.
  let expired = '0';
  for (let tries = 0; ; tries += 1) {
    const { account } = await api(tenantKey, 'query { account { balance { expired } } }');
    if (account.balance.expired !== '0' && account.balance.expired === expired) break;
    expired = account.balance.expired;
    assert(tries < 60, `the grant never expired: ${expired}`);
    await new Promise((resolve) => setTimeout(resolve, 1_000));
  }
  assert(nanos(expired) > 0n && nanos(expired) <= nanos('1'), `expired: ${expired}`);
  // The charts are fed by one billingSeries request, not one billingSummary a day.
  const operations = [];
  const record = (request) => {
    const body = request.postData() ?? '';
    for (const name of ['billingSeries', 'billingSummary']) if (body.includes(`${name}(`)) operations.push(name);
  };
  page.on('request', record);
  await page.getByRole('link', { name: 'Billing' }).click();
  await page.getByTestId('balance-available').waitFor();
  await page.getByTestId('balance-expired').filter({ hasText: `${expired} cr` }).waitFor();
  await page.getByTestId('ledger').locator('tbody tr', { hasText: 'EXPIRY' }).first().waitFor();
  await chartTotalsMatch(tenantKey);
  page.off('request', record);
  const count = (name) => operations.filter((operation) => operation === name).length;
  assert(count('billingSeries') === 1 && count('billingSummary') === 1, `requests: ${operations}`);
  // A chosen period: the last three days.
  await page.locator('#period').selectOption('custom');
  const day = (offset) => new Date(Date.now() - offset * 86_400_000).toISOString().slice(0, 10);
  await page.locator('#period-from').fill(day(2));
  await page.locator('#period-to').fill(day(0));
  await page.getByRole('button', { name: 'Show' }).click();
  await page.getByTestId('cost-per-day').locator('tbody tr').nth(2).waitFor({ state: 'attached' });
  assert(await page.getByTestId('cost-per-day').locator('tbody tr').count() === 3, 'one row per chosen day');
  await chartTotalsMatch(tenantKey);
  const ledgerRows = await page.getByTestId('ledger').locator('tbody tr').count();
  assert(ledgerRows >= 4, `ledger rows: ${ledgerRows}`);
  if (limitsServed) {
    await page.getByTestId('limits').getByText('of 50 cr').waitFor();
  } else {
    await page.getByTestId('limits').getByText('does not serve').waitFor();
  }
  await shot('billing');
});
await accessible('billing');
await fits('billing', 768);

// ---- labels and reruns (after billing: its ledger check reads the newest 20 entries,
// among them the expiry made at the start, which a rerun's entries would push out) ----
await check('a finished job shows its labels and reruns from its page; the list filters by label', async () => {
  const labelled = await createJob(tenantKey, 'console-labelled', 'Summarise the labelled document', {
    labels: [{ key: 'user', value: 'u1' }, { key: 'doc', value: 'console-7' }],
  });
  await until('the labelled job to finish', async () => (await api(tenantKey, JOB, { id: labelled })).job.status === 'SUCCEEDED');
  await page.goto(`${base}/#/jobs/${labelled}`);
  const labels = page.getByTestId('job-labels');
  await labels.waitFor();
  const shown = await labels.innerText();
  assert(shown.indexOf('doc=console-7') !== -1 && shown.indexOf('doc=console-7') < shown.indexOf('user=u1'), `labels, in order of key: ${shown}`);
  const rerun = page.getByRole('button', { name: 'Rerun', exact: true });
  await rerun.focus();
  await page.keyboard.press('Enter');
  const original = page.getByTestId('job-rerun-of');
  await original.waitFor();
  assert(await original.innerText() === labelled, 'the rerun names the job it reruns');
  const rerunId = page.url().split('/').pop();
  assert(rerunId !== labelled, 'the rerun is a job of its own');
  await page.getByTestId('job-labels').waitFor();
  await shot('job-rerun');
  await page.goto(`${base}/#/jobs`);
  await page.locator('#label-filter').fill('doc=console-7');
  await page.locator('#label-filter').press('Enter');
  await page.getByRole('row').filter({ hasText: rerunId }).waitFor();
  const rows = page.getByTestId('jobs-table').locator('tbody tr');
  await until('only the two labelled jobs to be listed', async () => (await rows.count()) === 2);
  await page.locator('#label-filter').fill('doc');
  await page.locator('#label-filter').press('Enter');
  await page.getByText('Write a label as key=value.').waitFor();
  await page.locator('#label-filter').fill('');
  await page.locator('#label-filter').press('Enter');
  await page.getByRole('row').filter({ hasText: fastJob }).waitFor();
});
await check('a job with fallback models shows its chain, its deadline and the model of each attempt', async () => {
  const fallback = await createJob(tenantKey, 'console-fallback', 'Summarise [mock:status=500][mock:fail_model=gpt-4o-mini]', {
    fallbackModels: ['gpt-4o'],
  });
  await until('the fallback job to finish', async () => (await api(tenantKey, JOB, { id: fallback })).job.status === 'SUCCEEDED');
  await page.goto(`${base}/#/jobs/${fallback}`);
  const chain = page.getByTestId('job-fallback-models');
  await chain.waitFor();
  assert((await chain.innerText()).trim() === 'gpt-4o', `fallback models: ${await chain.innerText()}`);
  const deadline = await page.getByTestId('job-deadline').innerText();
  assert(deadline.endsWith('UTC'), `the deadline is shown: ${deadline}`);
  const rows = page.getByTestId('attempts-table').locator('tbody tr');
  assert(await rows.count() === 2, 'one row per attempt');
  const [failed, answered] = [await rows.nth(0).innerText(), await rows.nth(1).innerText()];
  assert(failed.includes('gpt-4o-mini') && failed.includes('RETRYABLE_ERROR'), `first attempt: ${failed}`);
  assert(answered.includes('gpt-4o') && !answered.includes('gpt-4o-mini') && answered.includes('SUCCEEDED'), `second attempt: ${answered}`);
  await shot('job-fallback');
});

// ---- the new-job form (after billing, for its ledger check as above) -------------------
const MODELS = '{ models { name price { inputPerMillion outputPerMillion } } }';
const HELD = `query Held($id: UUID!) {
  job(id: $id) { status model labels { key value } reservation { amount } input }
}`;
/** A PNG's signature and header, 1024 × 1024: all a provider's count needs. */
function png() {
  const header = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, 0x49, 0x48, 0x44, 0x52]);
  const size = Buffer.alloc(8);
  size.writeUInt32BE(1024, 0);
  size.writeUInt32BE(1024, 4);
  return Buffer.concat([header, size, Buffer.from([8, 6, 0, 0, 0, 0, 0, 0, 0])]);
}

await check('the new-job form offers the served models with their prices, quotes the hold and creates the job it quoted', async () => {
  await page.getByRole('link', { name: 'Jobs', exact: true }).click();
  await page.getByText('New job').click();
  const { models } = await api(tenantKey, MODELS);
  const options = page.locator('#job-model option');
  await until('the models to be listed', async () => (await options.count()) === models.length);
  for (const [index, model] of models.entries()) {
    const text = await options.nth(index).innerText();
    assert(text.startsWith(model.name) && text.includes(`${model.price.inputPerMillion} cr`), `option ${index}: ${text}`);
  }
  await page.locator('#job-model').selectOption('gpt-4o');
  await page.locator('#job-prompt').fill('Describe the picture [mock:delay_ms=300]');
  await page.locator('#job-max-tokens').fill('150');
  const amount = page.getByTestId('job-hold-amount');
  await amount.waitFor();
  const first = await amount.innerText();
  // More output tokens: the quote follows the input.
  await page.locator('#job-max-tokens').fill('400');
  await until('the hold to be quoted again', async () => (await amount.count()) === 1 && (await amount.innerText()) !== first);
  const textOnly = await amount.innerText();
  assert(nanos(textOnly) > nanos(first), `hold ${first} then ${textOnly}`);
  await page.locator('#job-temperature').fill('0.4');
  await page.locator('#job-seed').fill('7');
  await page.locator('#job-stop').fill('THE END');
  for (const [index, [key, value]] of [['user', 'u-form'], ['doc', 'form-1']].entries()) {
    await page.getByRole('button', { name: 'Add label' }).click();
    await page.locator(`#job-label-key-${index}`).fill(key);
    await page.locator(`#job-label-value-${index}`).fill(value);
  }
  await page.getByText('at most 5.0 MiB').waitFor();
  await page.locator('#job-image').setInputFiles({ name: 'square.png', mimeType: 'image/png', buffer: png() });
  await page.getByTestId('job-image-state').filter({ hasText: 'square.png' }).waitFor();
  // The image adds its tiles to the bound.
  await until('the hold with the image', async () => (await amount.count()) === 1 && nanos(await amount.innerText()) > nanos(textOnly));
  await page.waitForTimeout(500);
  const quoted = await amount.innerText();
  await shot('new-job');
  await page.getByRole('button', { name: 'Create job' }).click();
  await page.getByTestId('job-labels').waitFor();
  const id = page.url().split('/').pop();
  const { job } = await api(tenantKey, HELD, { id });
  assert(nanos(job.reservation.amount) === nanos(quoted), `held ${job.reservation.amount}, quoted ${quoted}`);
  assert(job.model === 'gpt-4o', `model ${job.model}`);
  const shown = await page.getByTestId('job-labels').innerText();
  assert(shown.includes('user=u-form') && shown.includes('doc=form-1'), `labels: ${shown}`);
  const input = typeof job.input === 'string' ? JSON.parse(job.input) : job.input;
  const parts = JSON.stringify(input.messages);
  assert(parts.includes('image/png'), `the image part was sent: ${parts.slice(0, 300)}`);
  const sent = JSON.stringify(input);
  assert(sent.includes('0.4') && sent.includes('THE END'), `parameters: ${sent.slice(0, 500)}`);
  await page.getByTestId('result').waitFor();
});
await check('the new-job form shows why an input cannot be held', async () => {
  await page.getByRole('link', { name: 'Jobs', exact: true }).click();
  await page.getByText('New job').click();
  await page.locator('#job-prompt').fill('Too hot');
  await page.locator('#job-temperature').fill('9');
  await page.getByTestId('job-hold').filter({ hasText: 'No hold:' }).waitFor();
});
await accessible('new-job');

// ---- batches ----------------------------------------------------------------------------
const CREATE_BATCH = `mutation CreateBatch($input: CreateBatchInput!) {
  createBatch(input: $input) { batch { id } }
}`;
const ADD_ITEMS = `mutation AddBatchItems($batchId: UUID!, $items: [BatchItemInput!]!) {
  addBatchItems(batchId: $batchId, items: $items) { added }
}`;
const BATCH = `query Batch($id: UUID!) {
  batch(id: $id) { status itemCount counts { succeeded cancelled } reserved customerCharge providerCost }
}`;

/** A batch with one item per content, made through the API as a client would. */
async function batchWithItems(name, contents) {
  const { createBatch } = await api(tenantKey, CREATE_BATCH, { input: {
    idempotencyKey: `console-${name}`, name, model: 'gpt-4o-mini', maxOutputTokens: 50,
  } });
  const { addBatchItems } = await api(tenantKey, ADD_ITEMS, {
    batchId: createBatch.batch.id,
    items: contents.map((content, index) => ({ customId: `${name}-${index}`, messages: [{ role: 'user', content }] })),
  });
  assert(addBatchItems.added === contents.length, `added ${addBatchItems.added}`);
  return createBatch.batch.id;
}

let batchId;
await check('a batch made through the API reaches FINISHED on its page, live', async () => {
  batchId = await batchWithItems('console-batch',
    [1, 2, 3, 4, 5].map((number) => `Batch item ${number} [mock:delay_ms=1500]`));
  await page.getByRole('link', { name: 'Batches', exact: true }).click();
  await page.getByTestId('batches-table').getByRole('row').filter({ hasText: batchId }).waitFor();
  await shot('batches');
  await page.getByRole('link', { name: batchId }).click();
  await page.getByTestId('live-state').filter({ hasText: 'Live:' }).waitFor();
  await page.evaluate(() => { window.notReloaded = true; });
  await api(tenantKey, 'mutation($id: UUID!) { closeBatch(id: $id) { status } }', { id: batchId });
  await page.getByTestId('batch-status').filter({ hasText: 'FINISHED' }).waitFor({ timeout: 40_000 });
  await page.getByTestId('count-succeeded').filter({ hasText: /^5$/ }).waitFor();
  assert(await page.evaluate(() => window.notReloaded === true), 'the page was reloaded');
  const { batch } = await api(tenantKey, BATCH, { id: batchId });
  assert(batch.status === 'FINISHED' && batch.counts.succeeded === 5, JSON.stringify(batch));
  for (const [testId, value] of [['batch-charge', batch.customerCharge], ['batch-reserved', batch.reserved], ['batch-provider-cost', batch.providerCost]]) {
    const shown = await page.getByTestId(testId).innerText();
    assert(nanos(shown) === nanos(value), `${testId}: shown ${shown}, API ${value}`);
  }
  assert(nanos(batch.customerCharge) > 0n && nanos(batch.reserved) === 0n, JSON.stringify(batch));
  const bar = page.getByTestId('batch-progress');
  assert(await bar.getAttribute('value') === '5' && await bar.getAttribute('max') === '5', 'the bar is full');
  await page.getByTestId('batch-items').locator('tbody tr').nth(4).waitFor();
  await shot('batch');
});
await accessible('batch');
await fits('batch', 768);
await check('the batch’s results download as NDJSON, one line per item', async () => {
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.getByRole('button', { name: 'Download results (NDJSON)' }).click(),
  ]);
  const lines = readFileSync(await download.path(), 'utf8').trim().split('\n').map((line) => JSON.parse(line));
  assert(lines.length === 5, `${lines.length} lines`);
  assert(lines.every((line, index) => line.customId === `console-batch-${index}` && line.status === 'SUCCEEDED'),
    JSON.stringify(lines));
  await page.getByText('Downloaded the results').waitFor();
});
await check('an item’s job page names its batch and custom id', async () => {
  await page.getByTestId('batch-items').getByRole('link').first().click();
  await page.getByTestId('job-custom-id').filter({ hasText: 'console-batch-0' }).waitFor();
  await page.getByTestId('job-batch').click();
  await page.getByTestId('batch-status').filter({ hasText: 'FINISHED' }).waitFor();
});
await check('another batch is cancelled from its page', async () => {
  const slow = await batchWithItems('console-batch-slow',
    [1, 2, 3].map((number) => `Slow batch item ${number} [mock:delay_ms=60000]`));
  await page.goto(`${base}/#/batches/${slow}`);
  await page.getByTestId('live-state').filter({ hasText: 'Live:' }).waitFor();
  const cancel = page.getByRole('button', { name: 'Cancel batch' });
  await cancel.focus();
  await page.keyboard.press('Enter');
  await page.getByTestId('batch-status').filter({ hasText: 'FINISHED' }).waitFor({ timeout: 40_000 });
  await page.getByTestId('count-cancelled').filter({ hasText: /^3$/ }).waitFor();
  assert(await page.getByRole('button', { name: 'Cancel batch' }).count() === 0, 'no cancel once cancelled');
  const { batch } = await api(tenantKey, BATCH, { id: slow });
  assert(batch.status === 'FINISHED' && batch.counts.cancelled === 3 && nanos(batch.reserved) === 0n, JSON.stringify(batch));
  await shot('batch-cancelled');
});

const PROVIDER_BATCH = `query ProviderBatch($id: UUID!) {
  batch(id: $id) {
    status mode counts { succeeded }
    providerBatches { id state itemCount outcomes { outcome count } }
    realtimeComparison { answers charged atRealtimePrice saving }
  }
}`;
await check('a finished PROVIDER_BATCH batch shows its mode, its provider batches and its saving against realtime', async () => {
  const { createBatch } = await api(tenantKey, CREATE_BATCH, { input: {
    idempotencyKey: 'console-provider-batch', name: 'console-provider-batch', mode: 'PROVIDER_BATCH',
    model: 'gpt-4o-mini', maxOutputTokens: 50,
  } });
  const id = createBatch.batch.id;
  await api(tenantKey, ADD_ITEMS, { batchId: id, items: [1, 2, 3].map((number) => ({
    customId: `provider-${number}`, messages: [{ role: 'user', content: `Provider batch item ${number}` }],
  })) });
  await page.goto(`${base}/#/batches/${id}`);
  await page.getByTestId('batch-mode').filter({ hasText: 'PROVIDER_BATCH' }).waitFor();
  await page.getByText('Nothing sent to the provider yet').waitFor();
  await api(tenantKey, 'mutation($id: UUID!) { closeBatch(id: $id) { status } }', { id });
  await page.getByTestId('batch-status').filter({ hasText: 'FINISHED' }).waitFor({ timeout: 60_000 });
  const { batch } = await api(tenantKey, PROVIDER_BATCH, { id });
  assert(batch.counts.succeeded === 3 && batch.providerBatches.length >= 1, JSON.stringify(batch));
  const rows = page.getByTestId('provider-batches').locator('tbody tr');
  await until('every provider batch to be listed settled', async () =>
    (await rows.count()) === batch.providerBatches.length && (await rows.first().innerText()).includes('SETTLED'));
  const row = await rows.first().innerText();
  assert(row.includes(batch.providerBatches[0].id) && row.includes('SUCCEEDED 3'), `row: ${row}`);
  const comparison = batch.realtimeComparison;
  assert(comparison.answers === 3 && nanos(comparison.saving) > 0n, JSON.stringify(comparison));
  for (const [testId, value] of [['comparison-charged', comparison.charged], ['comparison-realtime', comparison.atRealtimePrice], ['comparison-saving', comparison.saving]]) {
    const shown = await page.getByTestId(testId).innerText();
    assert(nanos(shown) === nanos(value), `${testId}: shown ${shown}, API ${value}`);
  }
  await shot('batch-provider');
});
await accessible('batch-provider');
await fits('batch-provider', 768);

// ---- admin -------------------------------------------------------------------------------
await check('the admin signs in and sees tenants with their balances', async () => {
  await page.getByRole('button', { name: 'Sign out' }).click();
  assert(await page.evaluate(() => sessionStorage.getItem('jobledger.key')) === null, 'signing out forgets the key');
  await signIn(adminToken);
  const row = page.getByTestId('tenants-table').getByRole('row').filter({ hasText: 'acme-console' });
  await row.waitFor();
  await shot('admin-tenants');
});
await accessible('admin-tenants');
// The tenant's newest job: the first row of the admin's first page of its jobs.
const { jobs: { edges: [{ node: { id: newestJob } }] } } = await api(tenantKey, '{ jobs(first: 1) { edges { node { id } } } }');
await check('the admin grants credits and reads the tenant’s jobs and keys', async () => {
  await page.getByRole('link', { name: 'acme-console' }).click();
  await page.getByTestId('jobs-table').getByRole('row').filter({ hasText: newestJob }).waitFor();
  await page.getByTestId('keys-table').waitFor();
  await page.locator('#grant-amount').fill('5.5');
  await page.locator('#grant-amount').press('Enter');
  await page.getByText('Granted 5.5 cr.').waitFor();
  await page.getByTestId('balance-granted').filter({ hasText: '106.5 cr' }).waitFor();
  // An expiring grant: the form reads the picked time as UTC.
  await page.locator('#grant-amount').fill('2');
  await page.locator('#grant-expires').fill('2099-01-02T03:04');
  await page.locator('#grant-amount').press('Enter');
  await page.getByText('Granted 2 cr, expiring 2099-01-02 03:04 UTC.').waitFor();
  await page.getByTestId('balance-granted').filter({ hasText: '108.5 cr' }).waitFor();
  if (limitsServed) {
    // The limits the tenant has now, before anything is changed.
    const before = page.getByTestId('tenant-limits');
    await before.filter({ hasText: '50 cr' }).waitFor();
    await page.locator('#limit-monthlySpendLimit').fill('80');
    await page.locator('#limit-monthlySpendLimit').press('Enter');
    await page.getByText('Limits saved. They are now:').waitFor();
    const limits = page.getByTestId('tenant-limits');
    await limits.waitFor();
    const shown = await limits.innerText();
    assert(shown.includes('80 cr') && shown.includes('50 cr'), `limits after saving: ${shown}`);
  } else {
    await page.getByTestId('limits').getByText('does not serve').waitFor();
  }
  await shot('admin-tenant');
});
await accessible('admin-tenant');
await check('the admin opens a tenant’s job read-only', async () => {
  await page.getByRole('link', { name: newestJob }).click();
  await page.getByTestId('attempts-table').waitFor();
  assert(await page.getByRole('button', { name: 'Cancel job' }).count() === 0, 'no cancel for an admin');
});
await check('the cross-tenant billing charts agree with billingSummary', async () => {
  await page.getByRole('link', { name: 'Billing summary' }).click();
  await chartTotalsMatch(adminToken);
  await shot('admin-billing');
});
await accessible('admin-billing');
await fits('admin-billing', 768);

// ---- GraphiQL ------------------------------------------------------------------------------
await check('GraphiQL loads at /graphql from this server alone', async () => {
  await page.goto(`${base}/graphql`);
  await page.locator('.graphiql-container').waitFor({ timeout: 40_000 });
  await shot('graphiql');
});
await check('a token pasted into GraphiQL is not kept in the browser', async () => {
  await page.getByRole('button', { name: 'Headers' }).click();
  await page.locator('.graphiql-editor-tool .CodeMirror').last().click();
  await page.keyboard.type(`{"authorization": "Bearer ${adminToken}"}`);
  await page.locator('.graphiql-query-editor .CodeMirror').click();
  await page.keyboard.press('Control+A');
  await page.keyboard.type('{ tenants(first: 1) { edges { node { id } } } }');
  await page.locator('.graphiql-execute-button').click();
  await page.locator('.graphiql-response').getByText('"edges"').waitFor({ timeout: 20_000 });
  // The console itself keeps its sign-in in session storage; nothing may be in local
  // storage, which outlives the tab.
  const kept = await page.evaluate(() => JSON.stringify({ ...localStorage }));
  assert(!kept.includes(adminToken), `the token is in local storage: ${kept.slice(0, 300)}`);
});

await check('no request left the server’s origin', async () => {
  assert(foreignRequests.length === 0, foreignRequests.join('\n'));
});
await check('no console errors', async () => {
  assert(consoleErrors.length === 0, consoleErrors.join('\n'));
});

await browser.close();
console.log(`${failed} console check(s) failed`);
process.exit(failed === 0 ? 0 : 1);
