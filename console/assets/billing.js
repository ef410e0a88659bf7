// Billing: balance, spend limits, charts over a chosen period and the credit ledger.
// The same charts serve an admin across every tenant.

import { gql } from './api.js';
import { h, notice, replace, table, time } from './dom.js';
import { chartDefinitions, costByModel, costPerDay, reliabilityPerDay } from './charts.js';
import { renderLimits } from './limits.js';
import { credits, sum } from './money.js';

const ACCOUNT = `query Account {
  account { id name balance { granted held charged expired available } }
}`;

const SUMMARY = `query BillingSummary($from: DateTime!, $to: DateTime!, $tenantId: UUID) {
  billingSummary(from: $from, to: $to, tenantId: $tenantId) {
    jobsCreated jobsSucceeded jobsFailed jobsCancelled providerAttempts retryRate
    unknownOutcomes leaseExpirations providerCost providerCostUpperBound customerCharges
    margin marginAtWorst costPerSucceededJob
    byModel { model jobs providerCost customerCharges }
  }
}`;

const SERIES = `query BillingSeries($from: DateTime!, $to: DateTime!, $tenantId: UUID) {
  billingSeries(from: $from, to: $to, interval: DAY, tenantId: $tenantId) {
    start providerCost customerCharges margin providerAttempts retryRate unknownOutcomes
    leaseExpirations
  }
}`;

const LEDGER = `query CreditLedger($first: Int, $after: String, $tenantId: UUID) {
  creditLedger(first: $first, after: $after, tenantId: $tenantId) {
    edges { node { id kind amount jobId createdAt } }
    pageInfo { hasNextPage endCursor }
  }
}`;

const PERIODS = [7, 14, 30];
const DAY = 86_400_000;

/** Most days a chosen period may span (the charts stay readable). */
const MAX_DAYS = 92;

/** Midnight UTC today. */
function midnight() {
  const today = new Date();
  return Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate());
}

/** Midnight UTC of a date input's value ("YYYY-MM-DD"); NaN when it holds none. */
function dayStart(value) {
  return value ? Date.parse(`${value}T00:00:00Z`) : NaN;
}

/** The UTC days from `first` to `last` (midnights), both included: [{ date, from, to }]. */
function daysBetween(first, last) {
  const count = Math.round((last - first) / DAY) + 1;
  return Array.from({ length: count }, (_, index) => {
    const start = first + index * DAY;
    return {
      date: new Date(start).toISOString().slice(0, 10),
      from: new Date(start).toISOString(),
      to: new Date(start + DAY).toISOString(),
    };
  });
}

/** The balance of the signed-in tenant. */
export function balanceCards(balance) {
  return h('dl', { class: 'cards', 'data-testid': 'balance' },
    [['Granted', balance.granted], ['Held', balance.held], ['Charged', balance.charged], ['Expired', balance.expired], ['Available', balance.available]]
      .map(([label, amount]) => h('div', { class: 'card' }, h('dt', {}, label), h('dd', { 'data-testid': `balance-${label.toLowerCase()}` }, credits(amount)))));
}

/**
 * Period selector, summary figures and charts, for the caller (a tenant), or for an
 * admin across every tenant (`tenantId` null) or for one.
 */
export function periodReport(tenantId = null) {
  const choice = h('select', { id: 'period' },
    PERIODS.map((days) => h('option', { value: days, selected: days === 7 }, `Last ${days} days`)),
    h('option', { value: 'custom' }, 'Chosen days…'));
  const today = new Date(midnight()).toISOString().slice(0, 10);
  const firstDay = h('input', { id: 'period-from', type: 'date', max: today, value: today });
  const lastDay = h('input', { id: 'period-to', type: 'date', max: today, value: today });
  const custom = h('div', { class: 'toolbar', hidden: true },
    h('label', { for: 'period-from' }, 'First day (UTC)'), firstDay,
    h('label', { for: 'period-to' }, 'Last day'), lastDay,
    h('button', { type: 'button', onclick: () => load() }, 'Show'));
  const content = h('div', { 'aria-busy': 'true' });
  // Only the newest request may draw: a longer period answering after a shorter one
  // chosen since would show figures under the wrong label.
  let newestRequest = 0;
  async function load() {
    const request = ++newestRequest;
    custom.hidden = choice.value !== 'custom';
    let days;
    if (choice.value === 'custom') {
      const [first, last] = [dayStart(firstDay.value), dayStart(lastDay.value)];
      if (Number.isNaN(first) || Number.isNaN(last) || last < first || (last - first) / DAY >= MAX_DAYS) {
        replace(content, notice(`Choose a first day on or before the last, at most ${MAX_DAYS} days apart.`, 'error'));
        return;
      }
      days = daysBetween(first, last);
    } else {
      days = daysBetween(midnight() - (Number(choice.value) - 1) * DAY, midnight());
    }
    const from = days[0].from;
    const to = days[days.length - 1].to;
    content.setAttribute('aria-busy', 'true');
    replace(content, notice('Loading the period…'));
    let totals;
    try {
      // Two requests whatever the period: the totals and one point per day, which
      // start at the first day's midnight (UTC) and so fall on the days.
      const [summary, series] = await Promise.all([
        gql(SUMMARY, { from, to, tenantId }),
        gql(SERIES, { from, to, tenantId }),
      ]);
      days.forEach((day, index) => { day.summary = series.billingSeries[index]; });
      totals = summary.billingSummary;
    } catch (error) {
      if (request === newestRequest) replace(content, notice(`Could not load billing figures: ${error.message}`, 'error'));
      return;
    }
    if (request !== newestRequest) return;
    const dayTotals = {
      providerCost: sum(days.map((day) => day.summary.providerCost)),
      customerCharges: sum(days.map((day) => day.summary.customerCharges)),
      margin: sum(days.map((day) => day.summary.margin)),
      providerAttempts: totals.providerAttempts,
      retryRate: totals.retryRate,
      unknownOutcomes: days.reduce((count, day) => count + day.summary.unknownOutcomes, 0),
      leaseExpirations: days.reduce((count, day) => count + day.summary.leaseExpirations, 0),
    };
    replace(content,
      chartDefinitions(),
      h('p', { 'data-testid': 'period' }, 'From ', time(from), ' to ', time(to), ' (jobs created in the period).'),
      h('dl', { class: 'cards', 'data-testid': 'summary' }, [
        ['Jobs created', totals.jobsCreated],
        ['Succeeded', totals.jobsSucceeded],
        ['Failed', totals.jobsFailed],
        ['Cancelled', totals.jobsCancelled],
        ['Provider cost', credits(totals.providerCost)],
        ['With unknown bounds', credits(totals.providerCostUpperBound)],
        ['Customer charges', credits(totals.customerCharges)],
        [totals.unknownOutcomes > 0 ? 'Margin, at most (costs unknown)' : 'Margin', credits(totals.margin)],
        ['Margin, at worst', h('span', { 'data-testid': 'summary-margin-at-worst' }, credits(totals.marginAtWorst))],
        ['Cost per succeeded job', totals.costPerSucceededJob === null ? '—' : credits(totals.costPerSucceededJob)],
      ].map(([label, value]) => h('div', { class: 'card' }, h('dt', {}, label), h('dd', {}, value instanceof Node ? value : String(value))))),
      costPerDay(days, dayTotals),
      costByModel(totals.byModel),
      reliabilityPerDay(days, dayTotals));
    content.setAttribute('aria-busy', 'false');
  }
  choice.addEventListener('change', load);
  load();
  return h('section', { 'aria-labelledby': 'period-title' },
    h('h2', { id: 'period-title' }, 'Over a period'),
    h('div', { class: 'toolbar' }, h('label', { for: 'period' }, 'Period'), choice),
    custom,
    content);
}

/** The credit ledger, newest first, a page at a time. */
export function ledger(tenantId = null) {
  const section = h('section', { 'aria-labelledby': 'ledger-title' });
  const cursors = [null];
  async function load() {
    let page;
    try {
      ({ creditLedger: page } = await gql(LEDGER, { first: 20, after: cursors[cursors.length - 1], tenantId }));
    } catch (error) {
      replace(section, h('h2', { id: 'ledger-title' }, 'Credit ledger'), notice(`Could not load the ledger: ${error.message}`, 'error'));
      return;
    }
    const jobLink = (jobId) => (jobId && !tenantId ? h('a', { href: `#/jobs/${jobId}`, class: 'mono' }, jobId)
      : jobId ? h('span', { class: 'mono' }, jobId) : '—');
    replace(section,
      h('h2', { id: 'ledger-title' }, 'Credit ledger'),
      page.edges.length === 0 ? notice('No entries yet.') :
        table(`Ledger entries, page ${cursors.length}, newest first`, ['When', 'Kind', 'Amount', 'Job'],
          page.edges.map(({ node }) => [time(node.createdAt), node.kind, credits(node.amount), jobLink(node.jobId)]),
          { testId: 'ledger' }),
      h('div', { class: 'pager' },
        h('button', { type: 'button', disabled: cursors.length === 1, onclick: () => { cursors.pop(); load(); } }, 'Newer entries'),
        h('button', { type: 'button', disabled: !page.pageInfo.hasNextPage, onclick: () => { cursors.push(page.pageInfo.endCursor); load(); } }, 'Older entries')));
  }
  load();
  return section;
}

/** The tenant's billing page. */
export function renderBilling(root) {
  const balance = h('section', { 'aria-labelledby': 'balance-title' }, h('h2', { id: 'balance-title' }, 'Balance'));
  gql(ACCOUNT).then(({ account }) => balance.append(balanceCards(account.balance)),
    (error) => balance.append(notice(`Could not load the balance: ${error.message}`, 'error')));
  replace(root, h('h1', {}, 'Billing'), balance, renderLimits(), periodReport(), ledger());
}
