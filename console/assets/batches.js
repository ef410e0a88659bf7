// Batches: the list of the tenant's batches, and one batch's page with its progress,
// counts and money, live through batchUpdates, a cancel button and the results file.

import { gql, storedKey } from './api.js';
import { h, notice, replace, statusBadge, table, time } from './dom.js';
import { onConnectionState, subscribe } from './live.js';
import { credits, toNanos } from './money.js';

const PAGE_SIZE = 20;
const COUNTS = ['queued', 'running', 'succeeded', 'failed', 'cancelled'];

const BATCHES = `query Batches($first: Int, $after: String) {
  batches(first: $first, after: $after) {
    edges { cursor node { id name mode status itemCount createdAt } }
    pageInfo { hasNextPage endCursor }
  }
}`;

const BATCH = `query Batch($id: UUID!) {
  batch(id: $id) {
    id name mode model status cancelRequested itemCount createdAt closedAt finishedAt
    counts { queued running succeeded failed cancelled }
    reserved providerCost providerCostUpperBound customerCharge
    providerBatches {
      id provider state providerBatchId itemCount costBound createdAt submittedAt endedAt
      outcomes { outcome count }
    }
    realtimeComparison { answers charged atRealtimePrice saving }
  }
}`;

const BATCH_JOBS = `query BatchJobs($id: UUID!, $first: Int, $after: String) {
  batch(id: $id) {
    jobs(first: $first, after: $after) {
      edges { cursor node { id customId status } }
      pageInfo { hasNextPage endCursor }
    }
  }
}`;

const BATCH_UPDATES = `subscription BatchUpdates($id: UUID!) {
  batchUpdates(batchId: $id) {
    batchId status counts { queued running succeeded failed cancelled } customerCharge reserved at
  }
}`;

const CANCEL_BATCH = `mutation CancelBatch($id: UUID!) {
  cancelBatch(id: $id) { id status cancelRequested }
}`;

/** The list of the tenant's batches, newest first, with paging. */
export function renderBatchList(root) {
  const body = h('div', { class: 'list-body' });
  const cursors = [null];

  async function load() {
    let page;
    try {
      ({ batches: page } = await gql(BATCHES, { first: PAGE_SIZE, after: cursors[cursors.length - 1] }));
    } catch (error) {
      replace(body, notice(`Could not load batches: ${error.message}`, 'error'));
      return;
    }
    const pageNumber = cursors.length;
    replace(body,
      page.edges.length === 0 ? notice('No batches yet: create one with createBatch and addBatchItems.') :
        table(`Batches, page ${pageNumber}`, ['Batch', 'Name', 'Status', 'Mode', 'Items', 'Created'],
          page.edges.map(({ node }) => [
            h('a', { href: `#/batches/${node.id}`, class: 'mono' }, node.id),
            node.name ?? '—',
            statusBadge(node.status),
            node.mode,
            String(node.itemCount),
            time(node.createdAt),
          ]), { testId: 'batches-table' }),
      h('div', { class: 'pager' },
        h('button', { type: 'button', disabled: pageNumber === 1, onclick: () => {
          cursors.pop();
          load();
        } }, 'Previous page'),
        h('span', {}, `Page ${pageNumber}`),
        h('button', { type: 'button', disabled: !page.pageInfo.hasNextPage, onclick: () => {
          cursors.push(page.pageInfo.endCursor);
          load();
        } }, 'Next page')));
  }

  replace(root, h('h1', {}, 'Batches'),
    h('div', { class: 'toolbar' }, h('button', { type: 'button', onclick: () => load() }, 'Refresh')),
    body);
  load();
  return () => {};
}

/** Items finished, as a whole percentage of the items added. */
function finishedShare(counts, itemCount) {
  const finished = counts.succeeded + counts.failed + counts.cancelled;
  return { finished, percent: itemCount === 0 ? 0 : Math.floor((finished * 100) / itemCount) };
}

/** One batch, live until it is FINISHED. */
export function renderBatch(root, { id }) {
  const summary = h('div', {});
  const progress = h('div', {});
  const money = h('div', {});
  const uploads = h('div', {});
  const uploadsSection = h('section', { 'aria-labelledby': 'batch-uploads-title', hidden: true },
    h('h2', { id: 'batch-uploads-title' }, 'Provider batches'), uploads);
  const items = h('div', {});
  const actionMessage = h('div', { role: 'status' });
  const liveState = h('p', { class: 'live-state', role: 'status', 'data-testid': 'live-state' });
  let batch = null;
  let stop = () => {};
  let stopState = () => {};
  let refresh = null;

  function draw() {
    const { finished, percent } = finishedShare(batch.counts, batch.itemCount);
    replace(summary, h('dl', { class: 'facts' },
      [['Name', batch.name ?? '—'],
        ['Status', h('span', { 'data-testid': 'batch-status' }, statusBadge(batch.status),
          batch.cancelRequested ? ' (cancelled)' : '')],
        ['Mode', h('span', { 'data-testid': 'batch-mode' }, batch.mode)],
        ['Model', batch.model],
        ['Items', h('span', { 'data-testid': 'item-count' }, String(batch.itemCount))],
        ['Created', time(batch.createdAt)],
        ['Closed', time(batch.closedAt)],
        ['Finished', time(batch.finishedAt)],
      ].map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)])),
    actions());
    replace(progress,
      h('label', { for: 'batch-progress' }, `${finished} of ${batch.itemCount} items finished (${percent}%)`),
      h('progress', {
        id: 'batch-progress', class: 'batch-progress', max: Math.max(batch.itemCount, 1), value: finished,
        'data-testid': 'batch-progress',
      }, `${percent}%`),
      h('dl', { class: 'cards', 'data-testid': 'batch-counts' }, COUNTS.map((name) =>
        h('div', { class: 'card' }, h('dt', {}, name.toUpperCase()),
          h('dd', { 'data-testid': `count-${name}` }, String(batch.counts[name]))))));
    // Spent (charged) and still held, against the credit the batch holds or held.
    const charged = toNanos(batch.customerCharge);
    const held = toNanos(batch.reserved);
    const whole = charged + held;
    const share = whole === 0n ? 0 : Number((charged * 1000n) / whole) / 10;
    replace(money, h('dl', { class: 'facts' }, [
      ['Customer charge', h('span', { 'data-testid': 'batch-charge' }, credits(batch.customerCharge))],
      ['Still reserved', h('span', { 'data-testid': 'batch-reserved' }, credits(batch.reserved))],
      ['Provider cost', h('span', { 'data-testid': 'batch-provider-cost' }, credits(batch.providerCost))],
      ['Provider cost, with bounds of unknown outcomes', credits(batch.providerCostUpperBound)],
    ].map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)])),
    h('label', { for: 'batch-spend' }, `Charged ${share}% of charged + still reserved`),
    h('meter', { id: 'batch-spend', class: 'batch-progress', min: 0, max: 100, value: share }, `${share}%`));
    uploadsSection.hidden = batch.mode !== 'PROVIDER_BATCH';
    if (!uploadsSection.hidden) replace(uploads, providerBatches(batch));
  }

  function actions() {
    const download = h('button', { type: 'button', onclick: () => downloadResults(id, actionMessage) },
      'Download results (NDJSON)');
    if (batch.status === 'FINISHED' || batch.cancelRequested) return h('div', { class: 'toolbar' }, download);
    return h('div', { class: 'toolbar' }, download,
      h('button', { type: 'button', class: 'danger', onclick: async (event) => {
        event.target.disabled = true;
        try {
          const { cancelBatch } = await gql(CANCEL_BATCH, { id });
          replace(actionMessage, notice(`Cancellation requested; the batch is ${cancelBatch.status}.`));
        } catch (error) {
          replace(actionMessage, notice(`Could not cancel: ${error.message}`, 'error'));
          event.target.disabled = false;
        }
        load();
      } }, 'Cancel batch'));
  }

  async function load() {
    let answer;
    try {
      answer = await gql(BATCH, { id });
    } catch (error) {
      replace(summary, notice(`Could not load the batch: ${error.message}`, 'error'));
      return null;
    }
    batch = answer.batch;
    draw();
    loadItems();
    return batch;
  }

  async function loadItems() {
    let page;
    try {
      ({ batch: { jobs: page } } = await gql(BATCH_JOBS, { id, first: PAGE_SIZE }));
    } catch (error) {
      replace(items, notice(`Could not load the items: ${error.message}`, 'error'));
      return;
    }
    replace(items, page.edges.length === 0 ? notice('No items yet.') :
      table(`The first ${page.edges.length} items`, ['Custom id', 'Job', 'Status'],
        page.edges.map(({ node }) => [
          h('span', { class: 'mono' }, node.customId ?? '—'),
          h('a', { href: `#/jobs/${node.id}`, class: 'mono' }, node.id),
          statusBadge(node.status),
        ]), { testId: 'batch-items' }));
  }

  replace(root,
    h('p', {}, h('a', { href: '#/batches' }, '← Back to batches')),
    h('h1', {}, 'Batch ', h('span', { class: 'mono' }, id)),
    actionMessage, liveState,
    h('section', { 'aria-labelledby': 'batch-summary-title' },
      h('h2', { id: 'batch-summary-title' }, 'Summary'), summary),
    h('section', { 'aria-labelledby': 'batch-progress-title' },
      h('h2', { id: 'batch-progress-title' }, 'Progress'), progress),
    h('section', { 'aria-labelledby': 'batch-money-title' },
      h('h2', { id: 'batch-money-title' }, 'Credits'), money),
    uploadsSection,
    h('section', { 'aria-labelledby': 'batch-items-title' },
      h('h2', { id: 'batch-items-title' }, 'Items'), items));

  load().then((loaded) => {
    if (!loaded || loaded.status === 'FINISHED') return;
    stopState = onConnectionState((connection) => {
      liveState.textContent = connection === 'live' ? 'Live: progress appears as it happens.'
        : connection === 'connecting' ? 'Connecting to live updates…' : 'Live updates paused; reconnecting…';
    });
    stop = subscribe(BATCH_UPDATES, () => ({ id }), {
      next: ({ batchUpdates: update }) => {
        if (!batch) return;
        batch = { ...batch, status: update.status, counts: update.counts,
          customerCharge: update.customerCharge, reserved: update.reserved };
        draw();
        // The rest (provider cost, times, the items' statuses) is read again once the
        // updates pause, and at least every two seconds while they last.
        if (refresh === null) refresh = setTimeout(() => { refresh = null; load(); }, 2000);
      },
      complete: () => {
        clearTimeout(refresh);
        refresh = null;
        liveState.textContent = '';
        stopState();
        load();
      },
      // Updates carry the whole state: what was missed is replaced by the next one.
      restarted: () => load(),
    });
  });
  return () => {
    clearTimeout(refresh);
    stop();
    stopState();
  };
}

/**
 * A PROVIDER_BATCH batch's uploads to the provider's batch API with their state and
 * attempts by outcome, and its answers priced at the batch and the realtime price.
 */
function providerBatches(batch) {
  const comparison = batch.realtimeComparison;
  const outcomes = (upload) => upload.outcomes.length === 0 ? 'none yet'
    : upload.outcomes.map(({ outcome, count }) => `${outcome} ${count}`).join(', ');
  return [
    batch.providerBatches.length === 0
      ? notice('Nothing sent to the provider yet: the items go out once the batch is closed.')
      : table('Uploads to the provider’s batch API, oldest first', [
        'Provider batch', 'Provider', 'State', 'Provider’s id', 'Items', 'Attempts by outcome', 'Cost bound', 'Submitted', 'Ended',
      ], batch.providerBatches.map((upload) => [
        h('span', { class: 'mono' }, upload.id),
        upload.provider,
        statusBadge(upload.state),
        h('span', { class: 'mono' }, upload.providerBatchId ?? '—'),
        String(upload.itemCount),
        outcomes(upload),
        credits(upload.costBound),
        time(upload.submittedAt),
        time(upload.endedAt),
      ]), { testId: 'provider-batches' }),
    comparison && h('h3', {}, 'Against the realtime price'),
    comparison && h('dl', { class: 'facts', 'data-testid': 'realtime-comparison' }, [
      ['Answers compared', h('span', { 'data-testid': 'comparison-answers' }, String(comparison.answers))],
      ['Charged for them at the batch price', h('span', { 'data-testid': 'comparison-charged' }, credits(comparison.charged))],
      ['The same usage at the realtime price', h('span', { 'data-testid': 'comparison-realtime' }, credits(comparison.atRealtimePrice))],
      ['Saving against realtime', h('span', { 'data-testid': 'comparison-saving' }, credits(comparison.saving))],
    ].map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)])),
  ];
}

/**
 * GET /batches/{id}/results needs the Authorization header, which a plain link cannot
 * send: the file is fetched and handed to the browser as a Blob.
 */
async function downloadResults(id, message) {
  let response;
  try {
    response = await fetch(`/batches/${id}/results`, {
      headers: { authorization: `Bearer ${storedKey()}` },
    });
  } catch (error) {
    replace(message, notice(`Could not download the results: ${error.message}`, 'error'));
    return;
  }
  if (!response.ok) {
    replace(message, notice(`Could not download the results: the server answered ${response.status}`, 'error'));
    return;
  }
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = h('a', { href: url, download: `batch-${id}-results.jsonl`, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
  replace(message, notice(`Downloaded the results (${blob.size} bytes).`));
}
