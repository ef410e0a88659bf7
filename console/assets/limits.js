// Spend against limits, and the admin's form for them. The limits API (`account {
// limits spend }`, set by an admin with setTenantLimits) is built separately from the
// console: each section asks the schema whether it is served and shows it only then.

import { gql } from './api.js';
import { h, notice, replace } from './dom.js';
import { credits } from './money.js';

const SERVED = `query ConsoleLimitsServed { __type(name: "Account") { fields { name } } }`;

const LIMITS = `query AccountLimits {
  account {
    id
    limits { dailySpendLimit monthlySpendLimit requestsPerMinute tokensPerMinute lowBalanceThreshold }
    spend { today thisMonth }
  }
}`;

function amount(value) {
  return value === null ? 'no limit' : credits(value);
}

/** The section; filled once the schema says whether limits are served. */
export function renderLimits() {
  const section = h('section', { 'aria-labelledby': 'limits-title', 'data-testid': 'limits' },
    h('h2', { id: 'limits-title' }, 'Spend against limits'));
  (async () => {
    const { __type: account } = await gql(SERVED);
    const names = new Set((account?.fields ?? []).map((field) => field.name));
    if (!names.has('limits') || !names.has('spend')) {
      section.append(notice('This server does not serve spending limits yet.'));
      return;
    }
    const { account: { limits, spend } } = await gql(LIMITS);
    section.append(h('dl', { class: 'facts' },
      h('dt', {}, 'Spent today'), h('dd', {}, `${credits(spend.today)} of ${amount(limits.dailySpendLimit)}`),
      h('dt', {}, 'Spent this month'), h('dd', {}, `${credits(spend.thisMonth)} of ${amount(limits.monthlySpendLimit)}`),
      h('dt', {}, 'Requests per minute'), h('dd', {}, limits.requestsPerMinute ?? 'no limit'),
      h('dt', {}, 'Tokens per minute'), h('dd', {}, limits.tokensPerMinute ?? 'no limit'),
      h('dt', {}, 'Low-balance alert below'), h('dd', {}, amount(limits.lowBalanceThreshold))));
  })().catch((error) => section.append(notice(`Could not load limits: ${error.message}`, 'error')));
  return section;
}

const SETTABLE = `query ConsoleSetLimitsServed {
  __schema { queryType { fields { name } } mutationType { fields { name } } }
}`;

const SET_LIMITS = `mutation SetTenantLimits($input: TenantLimitsInput!) {
  setTenantLimits(input: $input) {
    tenantId dailySpendLimit monthlySpendLimit requestsPerMinute tokensPerMinute lowBalanceThreshold
  }
}`;

const LIMIT_FIELDS = [
  ['dailySpendLimit', 'Daily spend limit (credits)', 'decimal'],
  ['monthlySpendLimit', 'Monthly spend limit (credits)', 'decimal'],
  ['requestsPerMinute', 'Requests per minute', 'integer'],
  ['tokensPerMinute', 'Tokens per minute', 'integer'],
  ['lowBalanceThreshold', 'Low-balance alert below (credits)', 'decimal'],
];

function limitsTable(limits) {
  return h('dl', { class: 'facts', 'data-testid': 'tenant-limits' }, LIMIT_FIELDS.map(([name, label, kind]) => [
    h('dt', {}, label),
    h('dd', {}, limits[name] === null ? 'no limit' : kind === 'decimal' ? credits(limits[name]) : String(limits[name])),
  ]));
}

const TENANT_LIMITS = `query ConsoleTenantLimits($tenantId: UUID!) {
  tenantLimits(tenantId: $tenantId) {
    tenantId dailySpendLimit monthlySpendLimit requestsPerMinute tokensPerMinute lowBalanceThreshold
  }
}`;

/**
 * The admin's form for one tenant's limits (setTenantLimits), when the server serves
 * it, under the limits the tenant has now (tenantLimits, when served). The form sends
 * only the fields filled in (the others keep their values), `none` clears one, and the
 * limits the server answers with replace those shown.
 */
export function renderTenantLimits(tenantId) {
  const section = h('section', { 'aria-labelledby': 'limits-title', 'data-testid': 'limits' },
    h('h2', { id: 'limits-title' }, 'Limits'));
  (async () => {
    const { __schema: schema } = await gql(SETTABLE);
    if (!(schema.mutationType?.fields ?? []).some((field) => field.name === 'setTenantLimits')) {
      section.append(notice('This server does not serve tenant limits yet.'));
      return;
    }
    const readable = (schema.queryType?.fields ?? []).some((field) => field.name === 'tenantLimits');
    const inputs = LIMIT_FIELDS.map(([name, label]) => {
      const input = h('input', { id: `limit-${name}`, name, autocomplete: 'off', 'aria-describedby': 'limits-help' });
      return [name, h('label', { for: `limit-${name}` }, label), input];
    });
    const result = h('div', {});
    if (readable) {
      const { tenantLimits } = await gql(TENANT_LIMITS, { tenantId });
      replace(result, h('p', {}, 'Limits now:'), limitsTable(tenantLimits));
    }
    section.append(h('form', { class: 'stack', 'data-testid': 'limits-form', onsubmit: async (event) => {
      event.preventDefault();
      const input = { tenantId };
      for (const [name, , field] of inputs) {
        const value = field.value.trim();
        if (value === '') continue;
        const kind = LIMIT_FIELDS.find(([fieldName]) => fieldName === name)[2];
        input[name] = value === 'none' ? null : kind === 'integer' ? Number(value) : value;
      }
      try {
        const { setTenantLimits } = await gql(SET_LIMITS, { input });
        for (const [, , field] of inputs) field.value = '';
        replace(result, h('p', { role: 'status' }, 'Limits saved. They are now:'), limitsTable(setTenantLimits));
      } catch (error) {
        replace(result, notice(`Could not save the limits: ${error.message}`, 'error'));
      }
    } },
    h('p', { id: 'limits-help', class: 'help' },
      'Fill in only what should change: an empty field keeps its limit, “none” removes it.'),
    inputs.map(([, label, input]) => [label, input]),
    h('button', { type: 'submit' }, 'Save limits'), result));
  })().catch((error) => section.append(notice(`Could not load limits: ${error.message}`, 'error')));
  return section;
}
