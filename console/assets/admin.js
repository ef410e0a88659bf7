// Admin: tenants with balances, creating tenants, granting credits, keys, the
// cross-tenant billing summary and a read-only view of any tenant's jobs.

import { gql } from './api.js';
import { h, notice, replace, table, time } from './dom.js';
import { balanceCards, ledger, periodReport } from './billing.js';
import { renderJobList } from './jobs.js';
import { renderTenantLimits } from './limits.js';
import { credits } from './money.js';

const TENANTS = `query ConsoleTenants($first: Int, $after: String) {
  tenants(first: $first, after: $after) {
    edges { cursor node { id name createdAt balance { granted held charged expired available } } }
    pageInfo { hasNextPage endCursor }
  }
}`;

const CREATE_TENANT = `mutation CreateTenant($name: String!) {
  createTenant(name: $name) { tenant { id name } apiKey }
}`;

const GRANT = `mutation GrantCredits($input: GrantCreditsInput!) {
  grantCredits(input: $input) { id amount expiresAt }
}`;

const API_KEYS = `query ApiKeys($tenantId: UUID) {
  apiKeys(tenantId: $tenantId) { id name prefix createdAt lastUsedAt revokedAt }
}`;

const CREATE_KEY = `mutation CreateApiKey($name: String!, $tenantId: UUID) {
  createApiKey(name: $name, tenantId: $tenantId) { apiKey key { id name prefix createdAt } }
}`;

const REVOKE_KEY = `mutation RevokeApiKey($id: UUID!) {
  revokeApiKey(id: $id) { id revokedAt }
}`;

/** A labelled input. */
function field(id, label, attributes = {}) {
  const input = h('input', { id, name: id, ...attributes });
  return [h('label', { for: id }, label), input];
}

/** A secret shown once, selectable, with what to do with it. */
function secret(text, value) {
  return h('div', { class: 'notice notice-info', role: 'status' },
    h('p', {}, text), h('pre', { class: 'output mono', 'data-testid': 'secret' }, value));
}

/** A form that grants credits to `tenantId` (or to the tenant picked in `select`). */
function grantForm(tenantOf, onGranted) {
  const [amountLabel, amount] = field('grant-amount', 'Amount (credits)', { inputmode: 'decimal', required: true, pattern: '[0-9]+(\\.[0-9]{1,9})?' });
  const [reasonLabel, reason] = field('grant-reason', 'Reason (optional)', { maxlength: 200 });
  // A local date-time picker, read as UTC, the time every page shows.
  const [expiresLabel, expires] = field('grant-expires', 'Expires at, UTC (optional)', { type: 'datetime-local' });
  const message = h('div', {});
  // One idempotency key per intended grant: a double submit grants once.
  let idempotencyKey = crypto.randomUUID();
  return h('form', { class: 'stack', 'data-testid': 'grant-form', onsubmit: async (event) => {
    event.preventDefault();
    try {
      const { grantCredits } = await gql(GRANT, { input: {
        tenantId: tenantOf(), amount: amount.value.trim(), idempotencyKey, reason: reason.value.trim() || null,
        expiresAt: expires.value ? new Date(`${expires.value}Z`).toISOString() : null,
      } });
      idempotencyKey = crypto.randomUUID();
      amount.value = '';
      reason.value = '';
      expires.value = '';
      const until = grantCredits.expiresAt
        ? `, expiring ${new Date(grantCredits.expiresAt).toISOString().slice(0, 16).replace('T', ' ')} UTC` : '';
      replace(message, notice(`Granted ${credits(grantCredits.amount)}${until}.`));
      onGranted();
    } catch (error) {
      replace(message, notice(`Could not grant: ${error.message}`, 'error'));
    }
  } }, h('h3', {}, 'Grant credits'), amountLabel, amount, reasonLabel, reason, expiresLabel, expires, h('button', { type: 'submit' }, 'Grant credits'), message);
}

/** Every tenant with its balance, and creating a tenant. */
export function renderTenants(root) {
  const list = h('div', {});
  const cursors = [null];
  async function load() {
    let page;
    try {
      ({ tenants: page } = await gql(TENANTS, { first: 50, after: cursors[cursors.length - 1] }));
    } catch (error) {
      replace(list, notice(`Could not load tenants: ${error.message}`, 'error'));
      return;
    }
    replace(list,
      page.edges.length === 0 ? notice('No tenants yet.') :
        table(`Tenants, page ${cursors.length}, newest first`, ['Tenant', 'Granted', 'Held', 'Charged', 'Available', 'Created'],
          page.edges.map(({ node }) => [
            h('a', { href: `#/admin/tenants/${node.id}` }, node.name),
            credits(node.balance.granted), credits(node.balance.held), credits(node.balance.charged),
            credits(node.balance.available), time(node.createdAt),
          ]), { testId: 'tenants-table' }),
      h('div', { class: 'pager' },
        h('button', { type: 'button', disabled: cursors.length === 1, onclick: () => { cursors.pop(); load(); } }, 'Previous page'),
        h('button', { type: 'button', disabled: !page.pageInfo.hasNextPage, onclick: () => { cursors.push(page.pageInfo.endCursor); load(); } }, 'Next page')));
  }
  const [nameLabel, name] = field('tenant-name', 'Name', { required: true, maxlength: 200, autocomplete: 'off' });
  const created = h('div', {});
  const form = h('form', { class: 'stack', onsubmit: async (event) => {
    event.preventDefault();
    try {
      const { createTenant } = await gql(CREATE_TENANT, { name: name.value.trim() });
      name.value = '';
      replace(created, secret(`Tenant “${createTenant.tenant.name}” created. Its API key, shown this once:`, createTenant.apiKey));
      load();
    } catch (error) {
      replace(created, notice(`Could not create the tenant: ${error.message}`, 'error'));
    }
  } }, nameLabel, name, h('button', { type: 'submit' }, 'Create tenant'), created);
  replace(root, h('h1', {}, 'Tenants'), list,
    h('section', { 'aria-labelledby': 'new-tenant-title' }, h('h2', { id: 'new-tenant-title' }, 'New tenant'), form));
  load();
}

/** One tenant: balance, grants, keys, ledger and its jobs, read-only. */
export function renderTenant(root, { tenantId }) {
  const header = h('h1', {}, 'Tenant');
  const balance = h('div', {});
  const keys = h('div', {});
  async function loadTenant() {
    // The tenant list is the admin's only read of one tenant's balance.
    let after = null;
    for (;;) {
      const { tenants: page } = await gql(TENANTS, { first: 100, after });
      const edge = page.edges.find(({ node }) => node.id === tenantId);
      if (edge) {
        replace(header, `Tenant ${edge.node.name}`);
        replace(balance, balanceCards(edge.node.balance));
        return;
      }
      if (!page.pageInfo.hasNextPage) break;
      after = page.pageInfo.endCursor;
    }
    replace(balance, notice('No such tenant.', 'error'));
  }
  async function loadKeys() {
    const { apiKeys } = await gql(API_KEYS, { tenantId });
    replace(keys, table('API keys, newest first', ['Name', 'Prefix', 'Created', 'Last used', 'Revoked', ''],
      apiKeys.map((key) => [key.name || '(first key)', h('span', { class: 'mono' }, key.prefix), time(key.createdAt),
        time(key.lastUsedAt), time(key.revokedAt),
        key.revokedAt ? '' : h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke key ${key.prefix}`, onclick: async () => {
          // Revoking is immediate and cannot be undone: the key's connections close.
          if (!window.confirm(`Revoke the key ${key.prefix}…? Clients using it stop at once.`)) return;
          await gql(REVOKE_KEY, { id: key.id });
          loadKeys();
        } }, 'Revoke')]), { testId: 'keys-table' }));
  }
  const [keyNameLabel, keyName] = field('key-name', 'Key name', { required: true, maxlength: 200, autocomplete: 'off' });
  const newKey = h('div', {});
  const keyForm = h('form', { class: 'stack', onsubmit: async (event) => {
    event.preventDefault();
    try {
      const { createApiKey } = await gql(CREATE_KEY, { name: keyName.value.trim(), tenantId });
      keyName.value = '';
      replace(newKey, secret('The new key, shown this once:', createApiKey.apiKey));
      loadKeys();
    } catch (error) {
      replace(newKey, notice(`Could not create the key: ${error.message}`, 'error'));
    }
  } }, h('h3', {}, 'New key'), keyNameLabel, keyName, h('button', { type: 'submit' }, 'Create key'), newKey);
  const jobs = h('section', { class: 'nested' });
  replace(root,
    h('p', {}, h('a', { href: '#/admin' }, '← All tenants')),
    header,
    h('section', { 'aria-labelledby': 'balance-title' }, h('h2', { id: 'balance-title' }, 'Balance'), balance,
      grantForm(() => tenantId, () => loadTenant())),
    h('section', { 'aria-labelledby': 'keys-title' }, h('h2', { id: 'keys-title' }, 'API keys'), keys, keyForm),
    renderTenantLimits(tenantId),
    jobs,
    ledger(tenantId));
  const stopJobs = renderJobList(jobs, { tenantId, state: { status: '', cursors: [null] } });
  loadTenant().catch((error) => replace(balance, notice(`Could not load the tenant: ${error.message}`, 'error')));
  loadKeys().catch((error) => replace(keys, notice(`Could not load keys: ${error.message}`, 'error')));
  return stopJobs;
}

/** The billing summary across every tenant. */
export function renderAdminBilling(root) {
  replace(root, h('h1', {}, 'Billing across all tenants'), periodReport(null));
}
