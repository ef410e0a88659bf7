// The console's shell: sign-in, who is signed in, and hash routes to the views.

import { ApiError, forgetKey, gql, onKeyRefused, storeKey, storedKey } from './api.js';
import { h, notice, replace } from './dom.js';
import { disconnect, onConnectionState } from './live.js';
import { forgetListState, renderJobList, renderJob } from './jobs.js';
import { renderBilling } from './billing.js';
import { renderBatch, renderBatchList } from './batches.js';
import { renderAdminBilling, renderTenant, renderTenants } from './admin.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const signOut = document.getElementById('sign-out');

/** Who is signed in: { role: 'tenant' | 'admin', name }. */
let session = null;
/** Stops the current view's subscriptions and timers. */
let cleanup = () => {};

const ROUTES = [
  ['tenant', /^#\/jobs$/, () => renderJobList],
  ['tenant', /^#\/jobs\/([0-9a-f-]{36})$/, ([id]) => (root) => renderJob(root, { id })],
  ['tenant', /^#\/batches$/, () => renderBatchList],
  ['tenant', /^#\/batches\/([0-9a-f-]{36})$/, ([id]) => (root) => renderBatch(root, { id })],
  ['tenant', /^#\/billing$/, () => renderBilling],
  ['admin', /^#\/admin$/, () => renderTenants],
  ['admin', /^#\/admin\/billing$/, () => renderAdminBilling],
  ['admin', /^#\/admin\/tenants\/([0-9a-f-]{36})$/, ([tenantId]) => (root) => renderTenant(root, { tenantId })],
  ['admin', /^#\/admin\/tenants\/([0-9a-f-]{36})\/jobs\/([0-9a-f-]{36})$/,
    ([tenantId, id]) => (root) => renderJob(root, { id, tenantId })],
];

/** Works out whether `key` is a tenant's key or the admin token. */
async function identify(key) {
  try {
    const { account } = await gql('query ConsoleWho { account { id name } }', {}, key);
    return { role: 'tenant', name: account.name };
  } catch (error) {
    if (error instanceof ApiError && error.code === 'FORBIDDEN') {
      await gql('query ConsoleAdmin { tenants(first: 1) { pageInfo { hasNextPage } } }', {}, key);
      return { role: 'admin', name: 'admin' };
    }
    throw error;
  }
}

function showSignIn(message = null) {
  session = null;
  nav.hidden = true;
  signOut.hidden = true;
  who.textContent = '';
  const input = h('input', {
    id: 'key', name: 'key', type: 'password', autocomplete: 'off', required: true,
    'aria-describedby': 'key-help', spellcheck: 'false',
  });
  const form = h('form', { class: 'sign-in', onsubmit: async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    try {
      session = await identify(key);
    } catch (error) {
      showSignIn(error instanceof ApiError && error.code === 'UNAUTHENTICATED'
        ? 'That key was refused.' : `Sign-in failed: ${error.message}`);
      return;
    }
    storeKey(key);
    start();
  } },
  h('label', { for: 'key' }, 'API key or admin token'),
  input,
  h('p', { id: 'key-help', class: 'help' },
    'Kept in this tab’s session storage only; closing the tab forgets it.'),
  h('button', { type: 'submit' }, 'Sign in'));
  replace(main, h('h1', { tabindex: '-1' }, 'Sign in'), message && notice(message, 'error'), form);
  input.focus();
}

function start() {
  nav.hidden = false;
  signOut.hidden = false;
  who.textContent = session.role === 'admin' ? 'Signed in as admin' : `Tenant: ${session.name}`;
  for (const item of nav.querySelectorAll('li[data-role]')) {
    item.hidden = item.dataset.role !== session.role;
  }
  const home = session.role === 'admin' ? '#/admin' : '#/jobs';
  if (!ROUTES.some(([role, pattern]) => role === session.role && pattern.test(location.hash))) {
    // The hashchange that follows renders the page.
    location.hash = home;
    return;
  }
  route();
}

function route() {
  if (!session) return;
  cleanup();
  cleanup = () => {};
  for (const [role, pattern, view] of ROUTES) {
    const match = role === session.role && location.hash.match(pattern);
    if (!match) continue;
    for (const link of nav.querySelectorAll('a')) {
      if (link.getAttribute('href') === location.hash) link.setAttribute('aria-current', 'page');
      else link.removeAttribute('aria-current');
    }
    replace(main);
    const stop = view(match.slice(1))(main);
    cleanup = typeof stop === 'function' ? stop : () => {};
    main.focus();
    return;
  }
  location.hash = session.role === 'admin' ? '#/admin' : '#/jobs';
}

/** Stops every view and subscription, forgets the key and shows the sign-in form. */
function endSession(message = null) {
  cleanup();
  cleanup = () => {};
  disconnect();
  forgetKey();
  forgetListState();
  history.replaceState(null, '', '/');
  showSignIn(message);
}

signOut.addEventListener('click', () => endSession());

// A key revoked while the tab is open: every view would only show errors.
onKeyRefused(() => endSession('The server no longer accepts this key (it may have been revoked); sign in again.'));

window.addEventListener('hashchange', route);

onConnectionState((state) => {
  document.body.dataset.live = state;
});

const key = storedKey();
if (key) {
  identify(key).then((identified) => {
    session = identified;
    start();
  }, () => {
    // A refused key has already ended the session with its own message.
    if (storedKey() === null) return;
    forgetKey();
    showSignIn('Your session ended; sign in again.');
  });
} else {
  showSignIn();
}
