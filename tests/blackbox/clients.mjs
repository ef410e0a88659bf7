// Subscribes to one job's updates with the reference clients of both live
// protocols, as a frontend would, and checks what each receives:
//
//   node tests/blackbox/clients.mjs http://127.0.0.1:8080 <tenant key> <job id>
//
// - graphql-ws (the `graphql-transport-ws` subprotocol) on /graphql/ws;
// - graphql-sse ("distinct connections" mode) on /graphql/sse;
// - graphql-ws with a key that is not valid: the connection closes with 4403.
// Exits 1 when a check fails, 2 when it could not run.
import { createClient as createWsClient } from 'graphql-ws';
import { createClient as createSseClient } from 'graphql-sse';
import WebSocket from 'ws';

const [base, key, jobId] = process.argv.slice(2);
if (!base || !key || !jobId) {
  console.error('usage: node clients.mjs <base URL> <tenant key> <job id>');
  process.exit(2);
}
const query = `subscription ($jobId: UUID!) {
  jobUpdates(jobId: $jobId, afterSeq: 0) { seq kind status }
}`;
const expected = ['CREATED', 'ATTEMPT_STARTED', 'SUCCEEDED'];
const wsUrl = base.replace(/^http/, 'ws') + '/graphql/ws';

/** Every payload of one subscription until it completes (or 30 s pass). */
function collect(client) {
  return new Promise((resolve, reject) => {
    const received = [];
    const timer = setTimeout(() => reject(new Error(`no completion within 30 s: ${JSON.stringify(received)}`)), 30_000);
    client.subscribe(
      { query, variables: { jobId } },
      {
        next: (result) => received.push(result),
        error: (error) => {
          clearTimeout(timer);
          reject(error instanceof Error ? error : new Error(JSON.stringify(error)));
        },
        complete: () => {
          clearTimeout(timer);
          resolve(received);
        },
      },
    );
  });
}

function check(name, results) {
  const errors = results.filter((result) => result.errors);
  const kinds = results.map((result) => result.data?.jobUpdates?.kind);
  const seqs = results.map((result) => result.data?.jobUpdates?.seq);
  const ok =
    errors.length === 0 &&
    JSON.stringify(kinds) === JSON.stringify(expected) &&
    JSON.stringify(seqs) === JSON.stringify([1, 2, 3]);
  console.log(`${ok ? 'ok  ' : 'FAIL'}  ${name}: ${JSON.stringify(results)}`);
  return ok;
}

let failures = 0;

const ws = createWsClient({
  url: wsUrl,
  webSocketImpl: WebSocket,
  connectionParams: { authorization: `Bearer ${key}` },
  retryAttempts: 0,
});
try {
  if (!check('graphql-ws jobUpdates', await collect(ws))) failures += 1;
} catch (error) {
  console.log(`FAIL  graphql-ws jobUpdates: ${error.message ?? error}`);
  failures += 1;
} finally {
  await ws.dispose();
}

const sse = createSseClient({
  url: `${base}/graphql/sse`,
  headers: { authorization: `Bearer ${key}` },
  retryAttempts: 0,
});
try {
  if (!check('graphql-sse jobUpdates', await collect(sse))) failures += 1;
} catch (error) {
  console.log(`FAIL  graphql-sse jobUpdates: ${error.message ?? error}`);
  failures += 1;
} finally {
  sse.dispose();
}

const refusedCode = await new Promise((resolve) => {
  const client = createWsClient({
    url: wsUrl,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: 'Bearer jl_not-a-key' },
    retryAttempts: 0,
    lazy: false,
    on: { closed: (event) => resolve(event.code) },
    onNonLazyError: () => {},
  });
  setTimeout(() => {
    client.dispose();
    resolve('no close within 10 s');
  }, 10_000);
});
const refusedOk = refusedCode === 4403;
console.log(`${refusedOk ? 'ok  ' : 'FAIL'}  graphql-ws refuses an invalid key with 4403 (closed with ${refusedCode})`);
if (!refusedOk) failures += 1;

console.log(`${failures} client check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
