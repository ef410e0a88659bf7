// Charts as SVG, readable without colour: each series has its own pattern and a
// text legend, every bar carries its value as a title, and the numbers behind each
// chart are in a table one click away.

import { h, s, table } from './dom.js';
import { approximate, credits } from './money.js';

const WIDTH = 720;
const HEIGHT = 240;
const MARGIN = { top: 16, right: 16, bottom: 40, left: 110 };

/**
 * The pattern every chart of a page shares (hatching for the second series), to be put
 * in the page once.
 */
export function chartDefinitions() {
  return s('svg', { class: 'chart-defs', width: 0, height: 0, 'aria-hidden': 'true', focusable: 'false' }, s('defs', {},
    s('pattern', { id: 'hatch', width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
      s('rect', { width: 6, height: 6, class: 'hatch-ground' }),
      s('line', { x1: 0, y1: 0, x2: 0, y2: 6, class: 'hatch-line' }))));
}

function legend(series) {
  return h('ul', { class: 'legend' }, series.map((entry) =>
    h('li', {}, s('svg', { width: 18, height: 12, 'aria-hidden': 'true' },
      s('rect', { width: 18, height: 12, class: entry.className })), entry.label)));
}

function figure(title, description, svg, extra, numbers) {
  const id = `chart-${title.toLowerCase().replace(/[^a-z]+/g, '-')}`;
  return h('figure', { class: 'chart', 'aria-labelledby': `${id}-title` },
    h('figcaption', { id: `${id}-title` }, h('strong', {}, title), h('span', { class: 'help' }, ` — ${description}`)),
    extra, svg,
    h('details', {}, h('summary', {}, `Numbers behind “${title}”`), numbers));
}

function chartSvg(title, children) {
  return s('svg', { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: 'img', 'aria-label': title, preserveAspectRatio: 'xMidYMid meet' },
    s('title', {}, title), children);
}

/** A vertical bar chart with one or more series per label. */
function bars(labels, series, format) {
  const plotWidth = WIDTH - MARGIN.left - MARGIN.right;
  const plotHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
  const max = Math.max(0, ...series.flatMap((entry) => entry.values.map(entry.scale)));
  const top = max === 0 ? 1 : max;
  const slot = plotWidth / Math.max(1, labels.length);
  const barWidth = Math.max(2, (slot * 0.8) / series.length);
  const everyLabel = Math.ceil(labels.length / 10);
  const shapes = [];
  labels.forEach((label, index) => {
    series.forEach((entry, seriesIndex) => {
      const value = entry.scale(entry.values[index]);
      const height = (value / top) * plotHeight;
      const x = MARGIN.left + index * slot + slot * 0.1 + seriesIndex * barWidth;
      shapes.push(s('rect', {
        x, y: MARGIN.top + plotHeight - height, width: barWidth, height: Math.max(height, 0), class: entry.className,
      }, s('title', {}, `${label}, ${entry.label}: ${format(entry.values[index])}`)));
    });
    if (index % everyLabel === 0) {
      shapes.push(s('text', { x: MARGIN.left + index * slot + slot / 2, y: HEIGHT - MARGIN.bottom + 16, class: 'tick', 'text-anchor': 'middle' }, label.slice(5)));
    }
  });
  return [
    s('line', { x1: MARGIN.left, y1: MARGIN.top + plotHeight, x2: WIDTH - MARGIN.right, y2: MARGIN.top + plotHeight, class: 'axis' }),
    s('line', { x1: MARGIN.left, y1: MARGIN.top, x2: MARGIN.left, y2: MARGIN.top + plotHeight, class: 'axis' }),
    s('text', { x: MARGIN.left - 6, y: MARGIN.top + 4, class: 'tick', 'text-anchor': 'end' }, series[0].axis(top)),
    s('text', { x: MARGIN.left - 6, y: MARGIN.top + plotHeight, class: 'tick', 'text-anchor': 'end' }, '0'),
    shapes,
  ];
}

/** Provider cost against customer charges, day by day. */
export function costPerDay(days, totals) {
  const series = [
    { label: 'Provider cost', className: 'series-cost', values: days.map((day) => day.summary.providerCost), scale: approximate, axis: (top) => `${top.toPrecision(3)} cr` },
    { label: 'Customer charges (hatched)', className: 'series-charge', values: days.map((day) => day.summary.customerCharges), scale: approximate },
  ];
  const svg = chartSvg('Provider cost and customer charges per day', bars(days.map((day) => day.date), series, credits));
  return figure('Cost and charges per day', 'provider cost (solid) against customer charges (hatched)', svg, legend(series),
    table('Provider cost, customer charges and margin per day (UTC)', ['Day', 'Provider cost', 'Customer charges', 'Margin'],
      days.map((day) => [day.date, credits(day.summary.providerCost), credits(day.summary.customerCharges), credits(day.summary.margin)]),
      {
        testId: 'cost-per-day',
        footer: ['Total', h('span', { 'data-testid': 'total-provider-cost' }, credits(totals.providerCost)),
          h('span', { 'data-testid': 'total-customer-charges' }, credits(totals.customerCharges)),
          h('span', { 'data-testid': 'total-margin' }, credits(totals.margin))],
      }));
}

/** Provider cost per model over the period, as labelled horizontal bars. */
export function costByModel(byModel) {
  const rowHeight = 28;
  const height = Math.max(1, byModel.length) * rowHeight + 16;
  const max = Math.max(0, ...byModel.map((model) => approximate(model.providerCost))) || 1;
  const labelWidth = 200;
  const plot = WIDTH - labelWidth - 160;
  const svg = s('svg', { viewBox: `0 0 ${WIDTH} ${height}`, role: 'img', 'aria-label': 'Provider cost by model' },
    s('title', {}, 'Provider cost by model'),
    byModel.map((model, index) => {
      const y = 8 + index * rowHeight;
      const width = (approximate(model.providerCost) / max) * plot;
      return [
        s('text', { x: labelWidth - 8, y: y + 16, class: 'tick', 'text-anchor': 'end' }, model.model),
        s('rect', { x: labelWidth, y, width: Math.max(width, 1), height: rowHeight - 8, class: 'series-cost' },
          s('title', {}, `${model.model}: ${credits(model.providerCost)}`)),
        s('text', { x: labelWidth + Math.max(width, 1) + 6, y: y + 16, class: 'tick' }, credits(model.providerCost)),
      ];
    }));
  return figure('Cost by model', 'provider cost of each model’s jobs over the period', svg, null,
    table('Jobs, provider cost and customer charges by model', ['Model', 'Jobs', 'Provider cost', 'Customer charges'],
      byModel.map((model) => [model.model, String(model.jobs), credits(model.providerCost), credits(model.customerCharges)]),
      { testId: 'cost-by-model' }));
}

/** Retry rate and unknown outcomes, day by day. */
export function reliabilityPerDay(days, totals) {
  const percent = (rate) => `${(rate * 100).toFixed(1)} %`;
  const retry = [{ label: 'Retry rate', className: 'series-cost', values: days.map((day) => day.summary.retryRate), scale: (rate) => rate, axis: (top) => percent(top) }];
  const unknown = [{ label: 'Unknown outcomes (hatched)', className: 'series-charge', values: days.map((day) => day.summary.unknownOutcomes), scale: (count) => count, axis: (top) => String(top) }];
  const labels = days.map((day) => day.date);
  return [
    figure('Retry rate per day', 'attempts beyond each job’s first, as a share of all attempts', chartSvg('Retry rate per day', bars(labels, retry, percent)), null,
      table('Attempts and retry rate per day (UTC)', ['Day', 'Attempts', 'Retry rate'],
        days.map((day) => [day.date, String(day.summary.providerAttempts), percent(day.summary.retryRate)]),
        { testId: 'retry-rate', footer: ['Period', String(totals.providerAttempts), percent(totals.retryRate)] })),
    figure('Unknown outcomes per day', 'attempts sent that never answered: possibly billed', chartSvg('Unknown outcomes per day', bars(labels, unknown, String)), null,
      table('Unknown outcomes and lease expirations per day (UTC)', ['Day', 'Unknown outcomes', 'Lease expirations'],
        days.map((day) => [day.date, String(day.summary.unknownOutcomes), String(day.summary.leaseExpirations)]),
        { testId: 'unknown-outcomes', footer: ['Total', h('span', { 'data-testid': 'total-unknown-outcomes' }, String(totals.unknownOutcomes)), String(totals.leaseExpirations)] })),
  ];
}
