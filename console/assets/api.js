// The GraphQL client: POST /graphql with the key kept in sessionStorage.

const KEY = 'jobledger.key';

/** The key this tab signed in with, if any. */
export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

let keyRefused = () => {};

/**
 * Calls `handler()` once the API refuses the key this tab signed in with (revoked,
 * or unknown to the server): the console then signs out rather than show every view
 * failing.
 */
export function onKeyRefused(handler) {
  keyRefused = handler;
}

/** Reports that the signed-in key was refused, once: the key is forgotten first. */
export function refuseStoredKey() {
  if (storedKey() === null) return;
  forgetKey();
  keyRefused();
}

/** An error answered by the API, with its `extensions.code`. */
export class ApiError extends Error {
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}

/** Runs one operation; resolves to `data`, rejects with the first error. */
export async function gql(query, variables = {}, key = storedKey()) {
  const response = await fetch('/graphql', {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      // application/json: errors come back with status 200, so the browser logs no
      // failed request for an answer the console shows itself.
      accept: 'application/json',
      ...(key ? { authorization: `Bearer ${key}` } : {}),
    },
    body: JSON.stringify({ query, variables }),
  });
  let body;
  try {
    body = await response.json();
  } catch {
    throw new ApiError(`the server answered ${response.status}`, 'HTTP');
  }
  if (body.errors && body.errors.length) {
    const [error] = body.errors;
    const code = error.extensions?.code ?? 'GRAPHQL';
    // Only the signed-in key ends the session: a key being tried at sign-in is not it.
    if (code === 'UNAUTHENTICATED' && key !== null && key === storedKey()) refuseStoredKey();
    throw new ApiError(error.message, code);
  }
  return body.data;
}
