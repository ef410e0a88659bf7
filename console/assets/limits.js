// Spend against limits. The limits API (`account { limits spend }`, set by an admin
// with setTenantLimits) is being added to the server separately: this section asks
// the schema whether it is served and shows it only then.

import { gql } from './api.js';
import { h, notice } from './dom.js';
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
