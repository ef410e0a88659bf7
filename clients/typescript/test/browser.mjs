// The client in a real browser, from a page of another origin than the API's
// (tests/it/typescript_client.rs starts `jobledger serve --cors-origin` first):
//   CHROMIUM=/usr/bin/chromium node test/browser.mjs API_URL ADMIN_TOKEN LISTED_PORT UNLISTED_PORT
// Serves one page on http://127.0.0.1:LISTED_PORT (an origin `--cors-origin` lists) and
// on http://127.0.0.1:UNLISTED_PORT (one it does not). The listed page creates a job
// with the built bundle (dist/browser/jobledger-client.js), follows it to the end over
// graphql-ws and over graphql-sse and reads its cost; the unlisted page's calls must be
// blocked by the browser. Prints one line per check, then "N browser check(s) failed".
import { chromium } from 'playwright-core';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

const [api, adminToken, listedPort, unlistedPort] = process.argv.slice(2);
if (!api || !adminToken || !listedPort || !unlistedPort) {
  console.error('usage: node browser.mjs API_URL ADMIN_TOKEN LISTED_PORT UNLISTED_PORT');
  process.exit(2);
}

async function graphql(credential, query, variables = {}) {
  const response = await fetch(`${api}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${credential}` },
    body: JSON.stringify({ query, variables }),
  });
  return response.json();
}

/**
 * The credential the page is handed, minted as a frontend's backend would mint one for
 * the browser session: a short-lived access token of a funded tenant, for its jobs of
 * one session label only, with a cap on what its creates may hold. The tenant's key
 * never reaches the page.
 */
async function browserCredential() {
  const created = await graphql(
    adminToken,
    'mutation { createTenant(name: "browser") { tenant { id } apiKey } }',
  );
  const { tenant, apiKey } = created.data.createTenant;
  const granted = await graphql(
    adminToken,
    'mutation($input: GrantCreditsInput!) { grantCredits(input: $input) { id } }',
    { input: { tenantId: tenant.id, amount: '10', idempotencyKey: 'browser-test' } },
  );
  if (granted.errors) throw new Error(JSON.stringify(granted.errors));
  const minted = await graphql(
    apiKey,
    'mutation($input: CreateAccessTokenInput!) { createAccessToken(input: $input) { token } }',
    {
      input: {
        scopes: ['READ_JOBS', 'CREATE_JOBS', 'CANCEL_JOBS'],
        labels: [{ key: 'session', value: 'browser-test' }],
        ttlSeconds: 600,
        maxSpend: '5',
      },
    },
  );
  if (minted.errors) throw new Error(JSON.stringify(minted.errors));
  return minted.data.createAccessToken.token;
}

const bundle = readFileSync(new URL('../dist/browser/jobledger-client.js', import.meta.url));
const page = '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>frontend</title></head><body></body></html>';
function staticServer(port) {
  const server = createServer((request, response) => {
    if (request.url === '/jobledger-client.js') {
      response.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' }).end(bundle);
    } else if (request.url === '/favicon.ico') {
      // Asked for by the browser itself; a 404 would be an error in the page's console.
      response.writeHead(204).end();
    } else if (request.url === '/') {
      response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(page);
    } else {
      response.writeHead(404).end();
    }
  });
  return new Promise((resolve) => server.listen(Number(port), '127.0.0.1', () => resolve(server)));
}

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

const credential = await browserCredential();
const servers = await Promise.all([staticServer(listedPort), staticServer(unlistedPort)]);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});

/** A fresh page of `http://127.0.0.1:PORT/`, with what its console said. */
async function open(port) {
  const context = await browser.newContext();
  const tab = await context.newPage();
  tab.setDefaultTimeout(40_000);
  const console = [];
  tab.on('console', (message) => console.push(message.text()));
  tab.on('pageerror', (error) => console.push(`pageerror: ${error.message}`));
  await tab.goto(`http://127.0.0.1:${port}/`);
  return { tab, console };
}

try {
  await check('a page of a listed origin creates a job, follows it over graphql-ws and graphql-sse, and reads its cost', async () => {
    const { tab, console } = await open(listedPort);
    const seen = await tab.evaluate(
      async ({ api, credential }) => {
        const { createJobledgerClient } = await import('/jobledger-client.js');
        const jobledger = createJobledgerClient({ url: api, credential: async () => credential });
        const { job } = await jobledger.createJob({
          idempotencyKey: `browser-${Date.now()}`,
          model: 'gpt-4o-mini',
          maxOutputTokens: 50,
          messages: [{ role: 'user', content: 'Hello from a browser. [mock:delay_ms=300]' }],
        });
        const follow = async (transport) => {
          const events = [];
          for await (const event of jobledger.followJob(job.id, { transport })) events.push(event);
          return events.map(({ seq, kind }) => `${seq} ${kind}`);
        };
        const overWs = await follow('ws');
        const overSse = await follow('sse');
        const cost = await jobledger.jobCost(job.id);
        await jobledger.dispose();
        return { origin: location.origin, overWs, overSse, cost };
      },
      { api, credential },
    );
    assert(seen.origin !== new URL(api).origin, `the page is of another origin: ${seen.origin}`);
    const seqs = seen.overWs.map((line) => Number(line.split(' ')[0]));
    assert(
      JSON.stringify(seqs) === JSON.stringify(seqs.map((_, index) => index + 1)),
      `every event once, in order: ${seen.overWs}`,
    );
    assert(seen.overWs[0] === '1 CREATED' && seen.overWs.at(-1).endsWith(' SUCCEEDED'), `${seen.overWs}`);
    assert(JSON.stringify(seen.overSse) === JSON.stringify(seen.overWs), `SSE: ${seen.overSse} / ws: ${seen.overWs}`);
    assert(seen.cost.status === 'SUCCEEDED' && seen.cost.charge?.amount === seen.cost.cost.customerCharge, JSON.stringify(seen.cost));
    assert(!console.some((line) => /CORS|failed/i.test(line)), `console: ${console}`);
    await tab.context().close();
  });

  await check('a page of an origin not listed can neither read an answer nor open a WebSocket', async () => {
    const { tab, console } = await open(unlistedPort);
    const idempotencyKey = `unlisted-${Date.now()}`;
    const seen = await tab.evaluate(
      async ({ api, credential, idempotencyKey }) => {
        const { createJobledgerClient } = await import('/jobledger-client.js');
        const jobledger = createJobledgerClient({ url: api, credential });
        const created = await jobledger
          .createJob({
            idempotencyKey,
            model: 'gpt-4o-mini',
            maxOutputTokens: 50,
            messages: [{ role: 'user', content: 'Hello from elsewhere.' }],
          })
          .then(
            () => 'created',
            (error) => `${error.name}: ${error.message}`,
          );
        const socket = await new Promise((resolve) => {
          const ws = new WebSocket(`${api.replace(/^http/, 'ws')}/graphql/ws`, 'graphql-transport-ws');
          ws.onopen = () => resolve('open');
          ws.onclose = (event) => resolve(`closed ${event.code}`);
        });
        return { created, socket };
      },
      { api, credential, idempotencyKey },
    );
    // The fetch API reports a CORS refusal as a network error; the console says why.
    assert(seen.created === 'TypeError: Failed to fetch', `createJob: ${seen.created}`);
    assert(console.some((line) => /blocked by CORS policy/.test(line)), `console: ${console}`);
    assert(seen.socket === 'closed 1006', `WebSocket: ${seen.socket}`);
    assert(console.some((line) => /WebSocket.*403/.test(line)), `console: ${console}`);
    // The preflight failed, so the mutation was never sent: no job exists under its key.
    const lookup = await graphql(credential, 'query($key: String!) { job(idempotencyKey: $key) { id } }', {
      key: idempotencyKey,
    });
    assert(lookup.errors?.[0]?.extensions?.code === 'NOT_FOUND', `no job was created: ${JSON.stringify(lookup)}`);
    await tab.context().close();
  });
} finally {
  await browser.close();
  for (const server of servers) server.close();
}

console.log(`${failed} browser check(s) failed`);
process.exit(failed === 0 ? 0 : 1);
