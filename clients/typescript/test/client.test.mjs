// The client against a running `jobledger serve` (tests/it/typescript_client.rs starts
// one and passes it here):
//   JOBLEDGER_URL=http://127.0.0.1:8080 JOBLEDGER_KEY=<funded tenant key> node --test test/
// It runs the built client (dist/), as a package user would.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, test } from 'node:test';
import WebSocket from 'ws';
import { createJobledgerClient, JobledgerError } from '../dist/index.js';

const url = process.env.JOBLEDGER_URL;
const key = process.env.JOBLEDGER_KEY;
assert.ok(url && key, 'JOBLEDGER_URL and JOBLEDGER_KEY name the API and a funded tenant key');

/** Quick reconnections: the tests drop connections on purpose. */
const retry = { attempts: 5, delayMs: () => 50 };
const clients = [];
function client(options = {}) {
  const made = createJobledgerClient({ url, credential: key, webSocketImpl: WebSocket, retry, ...options });
  clients.push(made);
  return made;
}
after(() => Promise.all(clients.map((made) => made.dispose())));

let jobs = 0;
/** A job that runs for `delayMs` in the simulator. */
function jobInput(delayMs) {
  jobs += 1;
  return {
    idempotencyKey: `ts-client-${process.pid}-${jobs}`,
    model: 'gpt-4o-mini',
    maxOutputTokens: 50,
    messages: [{ role: 'user', content: `Say hello ${jobs}. [mock:delay_ms=${delayMs}]` }],
  };
}

async function collect(events) {
  const received = [];
  for await (const event of events) received.push(event);
  return received;
}

/** The job's stored events as (seq, kind, status): what a follower must receive, each once. */
async function storedEvents(jobledger, id) {
  const job = await jobledger.job(id);
  return job.events.map(({ seq, kind, status }) => ({ seq, kind, status }));
}
/** Decimals ("1.50", "0.0003") as exact nano-credits. */
function nanos(text) {
  const [whole, fraction = ''] = String(text).split('.');
  return BigInt(whole) * 1_000_000_000n + BigInt((fraction + '000000000').slice(0, 9));
}
const shape = (events) => events.map(({ seq, kind, status }) => ({ seq, kind, status }));

/**
 * A TCP proxy in front of the API whose connections can be cut, as a flaky network
 * or a restarting load balancer would cut them.
 */
async function flakyProxy() {
  const target = new URL(url);
  const sockets = new Set();
  let connections = 0;
  const server = net.createServer((downstream) => {
    connections += 1;
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const [from, to] of [[downstream, upstream], [upstream, downstream]]) {
      sockets.add(from);
      from.pipe(to);
      from.on('error', () => to.destroy());
      from.on('close', () => {
        sockets.delete(from);
        to.destroy();
      });
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const cut = () => {
    for (const socket of sockets) socket.resetAndDestroy();
  };
  // close() waits for open connections: a kept-alive one would hold the test for seconds.
  after(() => new Promise((resolve) => server.close(resolve) && cut()));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    get connections() {
      return connections;
    },
    cut,
  };
}

test('createJob returns a queued job with its hold, and the same job for the same idempotency key', async () => {
  const jobledger = client();
  const input = jobInput(0);
  const created = await jobledger.createJob(input);
  assert.equal(created.replayed, false);
  assert.equal(created.job.status, 'QUEUED');
  assert.equal(created.job.idempotencyKey, input.idempotencyKey);
  assert.equal(created.job.reservation.status, 'HELD');
  assert.ok(Number(created.job.reservation.amount) > 0, created.job.reservation.amount);
  const again = await jobledger.createJob(input);
  assert.equal(again.replayed, true);
  assert.equal(again.job.id, created.job.id);
});

for (const transport of ['ws', 'sse']) {
  test(`followJob over ${transport} delivers every event once, in seq order, to SUCCEEDED`, async () => {
    const jobledger = client();
    const { job } = await jobledger.createJob(jobInput(300));
    const events = await collect(jobledger.followJob(job.id, { transport }));
    assert.ok(events.every((event) => event.jobId === job.id));
    assert.deepEqual(
      events.map((event) => event.seq),
      events.map((_, index) => index + 1),
    );
    assert.equal(events[0].kind, 'CREATED');
    assert.equal(events.at(-1).kind, 'SUCCEEDED');
    assert.deepEqual(shape(events), await storedEvents(jobledger, job.id));
  });

  test(`followJob over ${transport} resumes after the last seq when the connection is cut`, async () => {
    const proxy = await flakyProxy();
    const direct = client();
    const jobledger = client({ url: proxy.url });
    const { job } = await direct.createJob(jobInput(1_500));
    const reconnects = [];
    const events = [];
    for await (const event of jobledger.followJob(job.id, {
      transport,
      onReconnect: ({ afterSeq }) => reconnects.push(afterSeq),
    })) {
      events.push(event);
      // Cut while the job still runs: what follows must come over a new connection.
      if (event.status !== 'SUCCEEDED') proxy.cut();
    }
    assert.ok(reconnects.length >= 1, 'the stream reconnected');
    assert.ok(proxy.connections > reconnects.length, `${proxy.connections} connections`);
    // Each reconnection resumed after the last event delivered before it.
    for (const afterSeq of reconnects) assert.ok(events.some((event) => event.seq === afterSeq), `${afterSeq}`);
    assert.deepEqual(shape(events), await storedEvents(direct, job.id));
    assert.equal(events.at(-1).status, 'SUCCEEDED');
  });
}

test('followJob with afterSeq delivers only the later events', async () => {
  const jobledger = client();
  const { job } = await jobledger.createJob(jobInput(0));
  const all = await collect(jobledger.followJob(job.id));
  assert.ok(all.length >= 3, JSON.stringify(all));
  for (const transport of ['ws', 'sse']) {
    const later = await collect(jobledger.followJob(job.id, { afterSeq: 1, transport }));
    assert.deepEqual(shape(later), shape(all.slice(1)), transport);
  }
});

test('cancelJob stops a running job, and followJob ends with CANCELLED', async () => {
  const jobledger = client();
  const { job } = await jobledger.createJob(jobInput(30_000));
  const events = [];
  for await (const event of jobledger.followJob(job.id)) {
    events.push(event);
    if (event.kind === 'ATTEMPT_STARTED') {
      const cancelled = await jobledger.cancelJob(job.id);
      assert.equal(cancelled.cancelRequested, true);
    }
  }
  assert.equal(events.at(-1).status, 'CANCELLED');
  assert.deepEqual(shape(events), await storedEvents(jobledger, job.id));
  // Settled for what the attempt may have cost, or released: nothing stays held.
  assert.notEqual((await jobledger.jobCost(job.id)).reservation.status, 'HELD');
});

test('jobCost reads what a finished job cost: its charge settled from its hold', async () => {
  const jobledger = client();
  const { job } = await jobledger.createJob(jobInput(0));
  await collect(jobledger.followJob(job.id));
  const cost = await jobledger.jobCost(job.id);
  assert.equal(cost.id, job.id);
  assert.equal(cost.status, 'SUCCEEDED');
  assert.equal(cost.reservation.status, 'SETTLED');
  const { providerCost, customerCharge, margin } = cost.cost;
  assert.ok(nanos(providerCost) > 0n, providerCost);
  assert.equal(nanos(margin), nanos(customerCharge) - nanos(providerCost));
  assert.equal(nanos(cost.charge.amount), nanos(customerCharge));
  assert.equal(nanos(cost.reservation.settledAmount), nanos(cost.charge.amount));
  assert.equal(cost.cost.unknownAttempts, 0);
  await assert.rejects(jobledger.jobCost('00000000-0000-7000-8000-000000000000'), { code: 'NOT_FOUND' });
});

test('a credential function is asked again for every request and every connection', async () => {
  let asked = 0;
  const jobledger = client({
    credential: async () => {
      asked += 1;
      return key;
    },
  });
  const { job } = await jobledger.createJob(jobInput(0));
  assert.equal(asked, 1);
  await jobledger.jobCost(job.id);
  assert.equal(asked, 2);
  await collect(jobledger.followJob(job.id, { transport: 'sse' }));
  assert.equal(asked, 3);
});

test('a refused credential fails at once, over HTTP and both live protocols, without retrying', async () => {
  const jobledger = client({ credential: 'jl_not-a-key' });
  await assert.rejects(jobledger.createJob(jobInput(0)), (error) => {
    assert.ok(error instanceof JobledgerError, String(error));
    assert.equal(error.code, 'UNAUTHENTICATED');
    return true;
  });
  const { job } = await client().createJob(jobInput(0));
  for (const transport of ['ws', 'sse']) {
    const reconnects = [];
    await assert.rejects(
      collect(jobledger.followJob(job.id, { transport, onReconnect: (reconnect) => reconnects.push(reconnect) })),
      transport,
    );
    assert.deepEqual(reconnects, [], transport);
  }
});
