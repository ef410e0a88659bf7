// A small graphql-transport-ws client for /graphql/ws: one connection per tab,
// authenticated in connection_init, reconnecting with backoff. Each subscription
// remembers its latest variables (`resume`) so that it continues where it left off.

import { refuseStoredKey, storedKey } from './api.js';

let socket = null;
let acknowledged = false;
let nextId = 1;
let retries = 0;
const active = new Map();
const listeners = new Set();

/** Calls `listener(state)` with 'connecting' | 'live' | 'offline' on every change. */
export function onConnectionState(listener) {
  listeners.add(listener);
  listener(acknowledged ? 'live' : socket ? 'connecting' : 'offline');
  return () => listeners.delete(listener);
}

function announce(state) {
  for (const listener of listeners) listener(state);
}

function connect() {
  if (socket) return;
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  socket = new WebSocket(`${scheme}//${location.host}/graphql/ws`, 'graphql-transport-ws');
  acknowledged = false;
  announce('connecting');
  const current = socket;
  current.addEventListener('open', () => {
    // Signed out while connecting: closing a socket before it opens makes the browser
    // log an error, so it is closed now.
    if (socket !== current) {
      current.close(1000, 'signed out');
      return;
    }
    current.send(JSON.stringify({
      type: 'connection_init',
      payload: { authorization: `Bearer ${storedKey()}` },
    }));
  });
  current.addEventListener('message', (event) => {
    const message = JSON.parse(event.data);
    const subscription = active.get(message.id);
    switch (message.type) {
      case 'connection_ack':
        acknowledged = true;
        retries = 0;
        announce('live');
        for (const [id, entry] of active) {
          // Started before on a connection that dropped: what it sent meanwhile is lost.
          if (entry.started) entry.restarted();
          start(id, entry);
        }
        break;
      case 'ping':
        current.send(JSON.stringify({ type: 'pong' }));
        break;
      case 'next':
        if (subscription) {
          if (message.payload.errors) subscription.error(message.payload.errors[0]);
          else subscription.next(message.payload.data);
        }
        break;
      case 'error':
        if (subscription) {
          active.delete(message.id);
          subscription.error(message.payload[0]);
        }
        break;
      case 'complete':
        if (subscription) {
          active.delete(message.id);
          subscription.complete();
        }
        break;
      default:
        break;
    }
  });
  current.addEventListener('close', (event) => {
    if (socket !== current) return;
    socket = null;
    acknowledged = false;
    announce('offline');
    // 4403: the key was refused or revoked; reconnecting would not help.
    if (event.code === 4403) {
      refuseStoredKey();
      return;
    }
    if (active.size === 0) return;
    retries += 1;
    setTimeout(connect, Math.min(30_000, 500 * 2 ** retries));
  });
}

function start(id, entry) {
  entry.started = true;
  socket.send(JSON.stringify({
    id,
    type: 'subscribe',
    payload: { query: entry.query, variables: entry.variables() },
  }));
}

/**
 * Subscribes to `query`; `variables` is a function called at each (re)start, and
 * `restarted` is called before a restart on a new connection (live-only messages sent
 * while the connection was down are lost). Returns a function that stops the
 * subscription.
 */
export function subscribe(query, variables, {
  next, error = () => {}, complete = () => {}, restarted = () => {},
}) {
  const id = String(nextId++);
  const entry = { query, variables, next, error, complete, restarted, started: false };
  active.set(id, entry);
  if (socket && acknowledged) start(id, entry);
  else connect();
  return () => {
    if (!active.delete(id)) return;
    if (socket && acknowledged) socket.send(JSON.stringify({ id, type: 'complete' }));
  };
}

/** Closes the connection and forgets every subscription (on sign-out). */
export function disconnect() {
  active.clear();
  if (socket) {
    const closing = socket;
    socket = null;
    acknowledged = false;
    if (closing.readyState !== WebSocket.CONNECTING) closing.close(1000, 'signed out');
  }
  announce('offline');
}
