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
    throw new ApiError(error.message, error.extensions?.code ?? 'GRAPHQL');
  }
  return body.data;
}
