// Jobs: the live list (accountJobUpdates), and one job's page with its timeline,
// attempts, money and streamed output.

import { gql } from './api.js';
import { h, notice, replace, statusBadge, table, time } from './dom.js';
import { onConnectionState, subscribe } from './live.js';
import { credits } from './money.js';
import { newJobForm } from './new-job.js';

const STATUSES = ['QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
const PAGE_SIZE = 20;
const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);

const JOBS = `query Jobs($first: Int, $after: String, $status: JobStatus, $label: LabelInput, $tenantId: UUID) {
  jobs(first: $first, after: $after, status: $status, label: $label, tenantId: $tenantId) {
    edges { cursor node { id status model createdAt } }
    pageInfo { hasNextPage endCursor }
  }
}`;

const ACCOUNT_JOB_UPDATES = `subscription AccountJobUpdates {
  accountJobUpdates { seq jobId kind status at }
}`;

/** The list's filters and page survive going to a job and back (not a sign-out). */
const listState = { status: '', label: null, cursors: [null] };

/** Forgets the list's filters and page, for the next sign-in. */
export function forgetListState() {
  listState.status = '';
  listState.label = null;
  listState.cursors = [null];
}

/**
 * A label filter: `key=value`, the first `=` splitting them (a value may hold `=`).
 * Empty is no filter; `null` for text that names no label.
 */
function parseLabel(text) {
  const trimmed = text.trim();
  if (trimmed === '') return { label: null };
  const split = trimmed.indexOf('=');
  if (split <= 0 || split === trimmed.length - 1) return null;
  return { label: { key: trimmed.slice(0, split), value: trimmed.slice(split + 1) } };
}

/**
 * A list of jobs with a status filter and paging. For a tenant it is live; for an
 * admin (`tenantId` given) it is a read-only snapshot with a refresh button.
 */
export function renderJobList(root, { tenantId = null, state = listState } = {}) {
  const live = tenantId === null;
  const body = h('div', { class: 'list-body' });
  const liveState = h('p', { class: 'live-state', role: 'status', 'data-testid': 'live-state' });
  const statusSelect = h('select', { id: 'status-filter', onchange: () => {
    state.status = statusSelect.value;
    state.cursors = [null];
    load();
  } },
  h('option', { value: '' }, 'All statuses'),
  STATUSES.map((status) => h('option', { value: status, selected: state.status === status }, status)));
  const labelInput = h('input', {
    id: 'label-filter', name: 'label', placeholder: 'key=value', autocomplete: 'off',
    value: state.label ? `${state.label.key}=${state.label.value}` : '',
  });
  const labelMessage = h('span', { role: 'status', 'data-testid': 'label-filter-message' });
  const labelForm = h('form', { class: 'inline-form', onsubmit: (event) => {
    event.preventDefault();
    const parsed = parseLabel(labelInput.value);
    if (parsed === null) {
      replace(labelMessage, 'Write a label as key=value.');
      return;
    }
    replace(labelMessage);
    state.label = parsed.label;
    state.cursors = [null];
    load();
  } },
  h('label', { for: 'label-filter' }, 'Label'), labelInput,
  h('button', { type: 'submit' }, 'Filter'), labelMessage);
  let rows = new Map();
  let reload = null;
  let lastLoad = 0;
  // Only the newest request may draw: an older one answering late (a filter changed
  // twice quickly) would show jobs the filter no longer asks for.
  let newestRequest = 0;

  async function load() {
    const request = ++newestRequest;
    lastLoad = Date.now();
    const after = state.cursors[state.cursors.length - 1];
    let page;
    try {
      ({ jobs: page } = await gql(JOBS, {
        first: PAGE_SIZE, after, status: state.status || null, label: state.label, tenantId,
      }));
    } catch (error) {
      if (request === newestRequest) replace(body, notice(`Could not load jobs: ${error.message}`, 'error'));
      return;
    }
    if (request !== newestRequest) return;
    rows = new Map();
    // A keyboard user on a job's link keeps their place when the page is read again.
    const focused = body.contains(document.activeElement) ? document.activeElement.getAttribute('href') : null;
    const pageNumber = state.cursors.length;
    const link = (id) => h('a', { href: tenantId ? `#/admin/tenants/${tenantId}/jobs/${id}` : `#/jobs/${id}`, class: 'mono' }, id);
    const tableRows = page.edges.map(({ node }) => {
      const badge = statusBadge(node.status);
      rows.set(node.id, badge);
      return [link(node.id), badge, node.model, time(node.createdAt)];
    });
    replace(body,
      page.edges.length === 0 ? notice('No jobs match.') :
        table(`Jobs, page ${pageNumber}${state.status ? `, ${state.status} only` : ''}${state.label ? `, labelled ${state.label.key}=${state.label.value}` : ''}`,
          ['Job', 'Status', 'Model', 'Created'], tableRows, { testId: 'jobs-table' }),
      h('div', { class: 'pager' },
        h('button', { type: 'button', disabled: pageNumber === 1, onclick: () => {
          state.cursors.pop();
          load();
        } }, 'Previous page'),
        h('span', {}, `Page ${pageNumber}`),
        h('button', { type: 'button', disabled: !page.pageInfo.hasNextPage, onclick: () => {
          state.cursors.push(page.pageInfo.endCursor);
          load();
        } }, 'Next page')));
    if (focused) {
      const again = Array.from(body.querySelectorAll('a')).find((link) => link.getAttribute('href') === focused);
      if (again) again.focus();
    }
  }

  replace(root,
    tenantId ? h('h2', {}, 'Jobs (read-only)') : h('h1', {}, 'Jobs'),
    live && newJobForm(),
    h('div', { class: 'toolbar' },
      h('label', { for: 'status-filter' }, 'Status'), statusSelect, labelForm,
      live ? liveState : h('button', { type: 'button', onclick: () => load() }, 'Refresh')),
    body);
  load();
  if (!live) return () => {};

  const stopState = onConnectionState((connection) => {
    liveState.textContent = connection === 'live' ? 'Live: updates appear as they happen.'
      : connection === 'connecting' ? 'Connecting to live updates…' : 'Live updates paused; reconnecting…';
  });
  const stop = subscribe(ACCOUNT_JOB_UPDATES, () => ({}), {
    next: ({ accountJobUpdates: event }) => {
      const badge = rows.get(event.jobId);
      if (badge) replace(badge, event.status);
      if (badge) badge.className = `status status-${event.status.toLowerCase()}`;
      // New jobs, and jobs leaving the filter, need the page read again: once a
      // burst of events is over, and at least every second while it lasts.
      clearTimeout(reload);
      const wait = Math.max(0, Math.min(250, lastLoad + 1000 - Date.now()));
      reload = setTimeout(load, wait);
    },
  });
  return () => {
    clearTimeout(reload);
    stop();
    stopState();
  };
}

const JOB = `query Job($id: UUID!, $tenantId: UUID) {
  job(id: $id, tenantId: $tenantId) {
    id status cancelRequested model fallbackModels deadline idempotencyKey result batchId customId
    labels { key value } rerunOf { id }
    error { code message }
    attemptCount maxAttempts createdAt startedAt finishedAt
    attempts {
      number model outcome errorCode errorMessage provider providerRequestId
      inputTokens cachedInputTokens outputTokens
      providerCost providerCostUpperBound customerCharge latencyMs startedAt finishedAt
    }
    reservation { id amount status settledAmount releasedAmount }
    charge { id amount createdAt }
    cost { providerCost providerCostUpperBound customerCharge margin marginAtWorst unknownAttempts }
    events { seq kind status at }
  }
}`;

const JOB_UPDATES = `subscription JobOutput($jobId: UUID!, $afterSeq: Int) {
  jobUpdates(jobId: $jobId, afterSeq: $afterSeq) { seq kind status delta }
}`;

const CANCEL = `mutation CancelJob($id: UUID!) {
  cancelJob(id: $id) { id status cancelRequested }
}`;

const RERUN = `mutation RerunJob($id: UUID!, $idempotencyKey: String!) {
  rerunJob(id: $id, idempotencyKey: $idempotencyKey) { replayed job { id } }
}`;

/** One job. A tenant sees it live and may cancel it; an admin reads it. */
export function renderJob(root, { id, tenantId = null }) {
  const live = tenantId === null;
  const back = tenantId ? `#/admin/tenants/${tenantId}` : '#/jobs';
  const details = h('div', {});
  const output = h('pre', { class: 'output', tabindex: '0', 'aria-live': 'off', 'data-testid': 'live-output' });
  const outputSection = h('section', { hidden: true, 'aria-labelledby': 'output-title' },
    h('h2', { id: 'output-title' }, 'Output so far'), output);
  const actionMessage = h('div', { role: 'status' });
  let lastSeq = 0;
  let refresh = null;
  let stop = () => {};

  async function load() {
    let job;
    try {
      ({ job } = await gql(JOB, { id, tenantId }));
    } catch (error) {
      replace(details, notice(`Could not load the job: ${error.message}`, 'error'));
      return null;
    }
    lastSeq = Math.max(lastSeq, ...job.events.map((event) => event.seq));
    replace(details, jobDetails(job, live ? (TERMINAL.has(job.status) ? rerunButton() : cancelButton(job)) : null, tenantId));
    if (TERMINAL.has(job.status) && output.textContent === '') outputSection.hidden = true;
    // Output missed while reconnecting is only known once the job has its result.
    if (output.querySelector('.output-gap') && typeof job.result === 'string') output.textContent = job.result;
    return job;
  }

  function cancelButton(job) {
    if (TERMINAL.has(job.status)) return null;
    if (job.cancelRequested) return h('p', {}, 'Cancellation requested.');
    return h('button', { type: 'button', class: 'danger', onclick: async (event) => {
      event.target.disabled = true;
      try {
        const { cancelJob } = await gql(CANCEL, { id });
        replace(actionMessage, notice(`Cancellation requested; the job is ${cancelJob.status}.`));
      } catch (error) {
        replace(actionMessage, notice(`Could not cancel: ${error.message}`, 'error'));
        event.target.disabled = false;
      }
      load();
    } }, 'Cancel job');
  }

  // One key per page shown: a double click reruns once, and opens that one rerun.
  const rerunKey = `console-rerun-${crypto.randomUUID()}`;
  function rerunButton() {
    return h('button', { type: 'button', onclick: async (event) => {
      event.target.disabled = true;
      try {
        const { rerunJob } = await gql(RERUN, { id, idempotencyKey: rerunKey });
        location.hash = `#/jobs/${rerunJob.job.id}`;
      } catch (error) {
        replace(actionMessage, notice(`Could not rerun: ${error.message}`, 'error'));
        event.target.disabled = false;
      }
    } }, 'Rerun');
  }

  replace(root,
    h('p', {}, h('a', { href: back }, '← Back to jobs')),
    h('h1', {}, 'Job ', h('span', { class: 'mono' }, id)),
    actionMessage, details, outputSection);
  load().then((job) => {
    if (!live || !job || TERMINAL.has(job.status)) return;
    stop = subscribe(JOB_UPDATES, () => ({ jobId: id, afterSeq: lastSeq }), {
      next: ({ jobUpdates: event }) => {
        if (event.kind === 'OUTPUT_DELTA') {
          outputSection.hidden = false;
          output.append(event.delta ?? '');
          return;
        }
        lastSeq = Math.max(lastSeq, event.seq);
        if (event.kind === 'ATTEMPT_STARTED') output.textContent = '';
        clearTimeout(refresh);
        refresh = setTimeout(load, 150);
      },
      complete: () => {
        clearTimeout(refresh);
        load();
      },
      // Deltas are live only: those sent while the connection was down are gone. The
      // output continues after a mark, and is made whole from the result at the end.
      restarted: () => {
        if (output.textContent === '' || output.lastChild?.classList?.contains('output-gap')) return;
        output.append(h('span', { class: 'output-gap', 'data-testid': 'output-gap' },
          ' […output sent while reconnecting is not shown…] '));
      },
    });
  });
  return () => {
    clearTimeout(refresh);
    stop();
  };
}

function definitionList(entries) {
  return h('dl', { class: 'facts' }, entries.map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)]));
}

/** An attempt's cost: exact, or a bound while its outcome is unknown. */
function attemptCost(attempt) {
  if (attempt.providerCost !== null) return credits(attempt.providerCost);
  if (attempt.providerCostUpperBound !== null) return `at most ${credits(attempt.providerCostUpperBound)} (unknown)`;
  return '—';
}

function jobDetails(job, action, tenantId) {
  const cost = job.cost;
  // An item of a batch: its batch (a tenant's own page) and the name the client gave it.
  const batch = job.batchId === null || job.batchId === undefined ? [] : [
    ['Batch', tenantId ? h('span', { class: 'mono', 'data-testid': 'job-batch' }, job.batchId)
      : h('a', { href: `#/batches/${job.batchId}`, class: 'mono', 'data-testid': 'job-batch' }, job.batchId)],
    ['Custom id', h('span', { class: 'mono', 'data-testid': 'job-custom-id' }, job.customId ?? '—')],
  ];
  const jobLink = (id) => tenantId ? `#/admin/tenants/${tenantId}/jobs/${id}` : `#/jobs/${id}`;
  const rerunOf = job.rerunOf ? [
    ['Rerun of', h('a', { href: jobLink(job.rerunOf.id), class: 'mono', 'data-testid': 'job-rerun-of' }, job.rerunOf.id)],
  ] : [];
  const labels = job.labels.length === 0 ? 'none'
    : h('ul', { class: 'labels', 'data-testid': 'job-labels' }, job.labels.map((label) =>
      h('li', { class: 'mono' }, `${label.key}=${label.value}`)));
  return [
    h('section', { 'aria-labelledby': 'summary-title' },
      h('h2', { id: 'summary-title' }, 'Summary'),
      definitionList([
        ['Status', [statusBadge(job.status), job.cancelRequested ? ' (cancel requested)' : '']],
        ['Model', job.model],
        ['Fallback models', job.fallbackModels.length === 0 ? 'none'
          : h('ol', { class: 'labels', 'data-testid': 'job-fallback-models' },
            job.fallbackModels.map((model) => h('li', { class: 'mono' }, model)))],
        ['Deadline', h('span', { 'data-testid': 'job-deadline' }, time(job.deadline))],
        ['Idempotency key', h('span', { class: 'mono' }, job.idempotencyKey)],
        ...batch,
        ...rerunOf,
        ['Labels', labels],
        ['Attempts', `${job.attemptCount} of at most ${job.maxAttempts}`],
        ['Created', time(job.createdAt)],
        ['Started', time(job.startedAt)],
        ['Finished', time(job.finishedAt)],
      ]),
      action),
    h('section', { 'aria-labelledby': 'money-title' },
      h('h2', { id: 'money-title' }, 'Credits'),
      definitionList([
        ['Reserved', job.reservation ? `${credits(job.reservation.amount)} (${job.reservation.status})` : '—'],
        ['Settled from the hold', job.reservation ? credits(job.reservation.settledAmount) : '—'],
        ['Released', job.reservation ? credits(job.reservation.releasedAmount) : '—'],
        ['Charge', job.charge ? credits(job.charge.amount) : 'none'],
        ['Provider cost', h('span', { 'data-testid': 'provider-cost' }, credits(cost.providerCost))],
        ['Provider cost, with bounds of unknown outcomes', credits(cost.providerCostUpperBound)],
        ['Customer charge', h('span', { 'data-testid': 'customer-charge' }, credits(cost.customerCharge))],
        // With unknown outcomes the known margin is only an upper limit: the calls may
        // have cost up to their bounds, which the margin at worst counts.
        [cost.unknownAttempts > 0 ? 'Margin, at most (costs unknown)' : 'Margin',
          h('span', { 'data-testid': 'margin' }, credits(cost.margin))],
        ['Margin, at worst', h('span', { 'data-testid': 'margin-at-worst' }, credits(cost.marginAtWorst))],
        ['Attempts with unknown cost', String(cost.unknownAttempts)],
      ])),
    h('section', { 'aria-labelledby': 'attempts-title' },
      h('h2', { id: 'attempts-title' }, 'Attempts'),
      job.attempts.length === 0 ? notice('No attempt yet.') :
        table('Every attempt, failures included', [
          '#', 'Model', 'Outcome', 'Error', 'Tokens in / cached / out', 'Provider request id',
          'Provider cost', 'Customer charge', 'Latency',
        ], job.attempts.map((attempt) => [
          String(attempt.number),
          h('span', { class: 'mono' }, attempt.model),
          statusBadge(attempt.outcome),
          attempt.errorCode ? `${attempt.errorCode}${attempt.errorMessage ? `: ${attempt.errorMessage}` : ''}` : '—',
          `${attempt.inputTokens ?? '—'} / ${attempt.cachedInputTokens ?? '—'} / ${attempt.outputTokens ?? '—'}`,
          h('span', { class: 'mono' }, attempt.providerRequestId ?? '—'),
          attemptCost(attempt),
          attempt.customerCharge === null ? '—' : credits(attempt.customerCharge),
          attempt.latencyMs === null ? '—' : `${attempt.latencyMs} ms`,
        ]), { testId: 'attempts-table' })),
    h('section', { 'aria-labelledby': 'result-title' },
      h('h2', { id: 'result-title' }, job.error ? 'Error' : 'Result'),
      job.error ? h('p', { role: 'alert' }, h('strong', {}, job.error.code), `: ${job.error.message}`)
        : job.result === null ? notice('No result yet.')
          : h('pre', { class: 'output', tabindex: '0', 'data-testid': 'result' },
            typeof job.result === 'string' ? job.result : JSON.stringify(job.result, null, 2))),
    h('section', { 'aria-labelledby': 'timeline-title' },
      h('h2', { id: 'timeline-title' }, 'Timeline'),
      h('ol', { class: 'timeline', 'data-testid': 'timeline' }, job.events.map((event) =>
        h('li', {}, time(event.at), ' ', h('strong', {}, event.kind), ` → ${event.status}`)))),
  ];
}
