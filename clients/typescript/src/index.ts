/**
 * A typed client of the jobledger API for frontends and Node.js services.
 *
 * ```ts
 * import { createJobledgerClient } from '@jobledger/client';
 *
 * const jobledger = createJobledgerClient({
 *   url: 'https://jobs.example.com',
 *   credential: () => fetchBrowserToken(), // or an API key string, on a backend
 * });
 * const { job } = await jobledger.createJob({
 *   idempotencyKey: 'doc-42',
 *   model: 'gpt-4o-mini',
 *   maxOutputTokens: 200,
 *   messages: [{ role: 'user', content: 'Summarise: the quarter went well.' }],
 * });
 * for await (const event of jobledger.followJob(job.id)) console.log(event.seq, event.kind);
 * const cost = await jobledger.jobCost(job.id);
 * ```
 *
 * Every operation is a TypedDocumentNode generated from the repository's schema.graphql
 * (see codegen.ts); `request` sends any of them with its own result and variable types.
 */
import type { TypedDocumentNode } from '@graphql-typed-document-node/core';
import { print, type GraphQLFormattedError } from 'graphql';
import { createClient as createSseClient, NetworkError, type Client as SseClient } from 'graphql-sse';
import { createClient as createWsClient, type Client as WsClient } from 'graphql-ws';
import {
  CancelJobDocument,
  CreateJobDocument,
  JobCostDocument,
  JobDocument,
  JobUpdatesDocument,
  type CancelJobMutation,
  type CreateJobInput,
  type CreateJobMutation,
  type JobCostQuery,
  type JobQuery,
  type JobStatus,
  type JobUpdatesSubscription,
} from './generated/graphql.js';

export * from './generated/graphql.js';

/**
 * Who the client acts for: a bearer string, or a function that returns one. A function
 * is called for every HTTP request and every new socket, so a short-lived browser
 * token (minted by the tenant's backend with `createAccessToken`) can be refreshed
 * there; an API key string belongs on a backend only.
 */
export type Credential = string | (() => string | Promise<string>);

/** How a live stream that dropped is resumed. */
export interface RetryOptions {
  /** Reconnections in a row that deliver nothing before the stream fails (default 8). */
  attempts?: number;
  /** The wait before reconnection number `attempt` (1, 2, …), in ms. */
  delayMs?: (attempt: number) => number;
}

export interface ClientOptions {
  /** The API's base URL, e.g. `https://jobs.example.com` (`/graphql` is added). */
  url: string;
  credential: Credential;
  /** Defaults to the global `fetch` (browsers, Node.js 20). */
  fetch?: typeof fetch;
  /**
   * Defaults to the global `WebSocket` (browsers, Node.js 22). Node.js 20 has none:
   * pass the `ws` package's `WebSocket`.
   */
  webSocketImpl?: unknown;
  retry?: RetryOptions;
}

/** One event of a job, as `jobUpdates` delivers it. */
export type JobEvent = JobUpdatesSubscription['jobUpdates'];

export interface FollowOptions {
  /** Deliver the events after this seq only (default 0: every event). */
  afterSeq?: number;
  /** `ws`: graphql-ws on /graphql/ws (default); `sse`: graphql-sse on /graphql/sse. */
  transport?: 'ws' | 'sse';
  /** Called before each reconnection, with the seq the stream resumes after. */
  onReconnect?: (reconnect: { afterSeq: number; attempt: number; error: unknown }) => void;
}

/** A refusal by the API: its GraphQL errors, and the first one's `extensions.code`. */
export class JobledgerError extends Error {
  readonly code: string | undefined;
  constructor(
    readonly errors: readonly GraphQLFormattedError[],
    readonly status?: number,
  ) {
    super(errors.map((error) => error.message).join('; ') || `HTTP ${status}`);
    this.name = 'JobledgerError';
    const code = errors[0]?.extensions?.['code'];
    this.code = typeof code === 'string' ? code : undefined;
  }
}

export interface JobledgerClient {
  /** Sends any operation; resolves with its `data`, rejects with a `JobledgerError`. */
  request<Data, Variables extends Record<string, unknown>>(
    document: TypedDocumentNode<Data, Variables>,
    variables: Variables,
  ): Promise<Data>;
  /** Creates a job (QUEUED, its credit hold taken), or returns the one of the same idempotencyKey. */
  createJob(input: CreateJobInput): Promise<CreateJobMutation['createJob']>;
  /**
   * The job with its result, attempts, hold, charge, cost and events. A job the
   * credential cannot see rejects with code `NOT_FOUND`.
   */
  job(id: string): Promise<NonNullable<JobQuery['job']>>;
  /** What the job cost so far: its hold, charge and provider cost (`NOT_FOUND` as `job`). */
  jobCost(id: string): Promise<NonNullable<JobCostQuery['job']>>;
  cancelJob(id: string): Promise<CancelJobMutation['cancelJob']>;
  /**
   * The job's events in seq order, each once, from `afterSeq` on; ends after the
   * terminal event. When the connection drops it reconnects with `afterSeq` set to the
   * last seq delivered, so the server replays exactly what was missed. `OUTPUT_DELTA`
   * events (jobs created with `streamOutput`) carry the seq of the event they follow
   * and are live only: one sent while disconnected is not replayed.
   */
  followJob(id: string, options?: FollowOptions): AsyncGenerator<JobEvent, void, undefined>;
  /** Closes the sockets and streams the client holds. */
  dispose(): Promise<void>;
}

/** The statuses after which a job has no more events. */
const FINISHED: ReadonlySet<JobStatus> = new Set<JobStatus>(['SUCCEEDED', 'FAILED', 'CANCELLED']);

/** Close codes of graphql-transport-ws that mean the credential was refused. */
const CREDENTIAL_REFUSED = new Set([4401, 4403]);

/** The API answers an unknown job with a NOT_FOUND error; a null job is the same answer. */
function found<Job>(job: Job | null | undefined): Job {
  if (job == null) throw new JobledgerError([{ message: 'not found', extensions: { code: 'NOT_FOUND' } }]);
  return job;
}

const defaultDelay = (attempt: number): number =>
  Math.min(250 * 2 ** (attempt - 1), 5_000) * (0.75 + Math.random() / 2);

export function createJobledgerClient(options: ClientOptions): JobledgerClient {
  const base = options.url.replace(/\/+$/, '');
  const fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  const attempts = options.retry?.attempts ?? 8;
  const delayMs = options.retry?.delayMs ?? defaultDelay;
  const refreshable = typeof options.credential === 'function';
  const bearer = async (): Promise<string> => {
    const credential = options.credential;
    return `Bearer ${typeof credential === 'function' ? await credential() : credential}`;
  };

  const printed = new WeakMap<object, string>();
  const text = (document: TypedDocumentNode<unknown, never>): string => {
    let query = printed.get(document);
    if (query === undefined) {
      query = print(document);
      printed.set(document, query);
    }
    return query;
  };

  async function request<Data, Variables extends Record<string, unknown>>(
    document: TypedDocumentNode<Data, Variables>,
    variables: Variables,
  ): Promise<Data> {
    const response = await fetchImpl(`${base}/graphql`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/graphql-response+json, application/json',
        authorization: await bearer(),
      },
      body: JSON.stringify({ query: text(document), variables }),
    });
    let body: { data?: Data | null; errors?: GraphQLFormattedError[] };
    try {
      body = (await response.json()) as typeof body;
    } catch {
      throw new JobledgerError([], response.status);
    }
    if (body.errors?.length || body.data == null) {
      throw new JobledgerError(body.errors ?? [], response.status);
    }
    return body.data;
  }

  // Retries are this client's own (below): graphql-ws and graphql-sse would resubscribe
  // with the variables of the first subscribe, and so replay from the first afterSeq.
  let ws: WsClient | undefined;
  const wsClient = (): WsClient =>
    (ws ??= createWsClient({
      url: `${base.replace(/^http/, 'ws')}/graphql/ws`,
      webSocketImpl: options.webSocketImpl,
      connectionParams: async () => ({ authorization: await bearer() }),
      retryAttempts: 0,
    }));
  let sse: SseClient | undefined;
  const sseClient = (): SseClient =>
    (sse ??= createSseClient({
      url: `${base}/graphql/sse`,
      fetchFn: fetchImpl,
      headers: async () => ({ authorization: await bearer() }),
      retryAttempts: 0,
    }));

  /** Whether a stream that ended with `error` may be resumed. */
  function resumable(error: unknown): boolean {
    if (error instanceof JobledgerError) return false;
    if (error instanceof NetworkError && error.response) {
      // 4xx: the request itself is refused, again on every retry — unless the
      // credential is refreshed (an expired browser token).
      const status = error.response.status;
      return status >= 500 || ((status === 401 || status === 403) && refreshable);
    }
    const code = (error as { code?: unknown } | null)?.code;
    if (typeof code === 'number' && code >= 4000 && code < 5000) {
      return CREDENTIAL_REFUSED.has(code) && refreshable;
    }
    // A socket closed or reset, a fetch that failed: the network, worth another try.
    return true;
  }

  async function* followJob(id: string, follow: FollowOptions = {}): AsyncGenerator<JobEvent, void, undefined> {
    let afterSeq = follow.afterSeq ?? 0;
    let failures = 0;
    for (;;) {
      const request = { query: text(JobUpdatesDocument), variables: { jobId: id, afterSeq } };
      const results =
        follow.transport === 'sse'
          ? sseClient().iterate<JobUpdatesSubscription>(request)
          : wsClient().iterate<JobUpdatesSubscription>(request);
      let problem: unknown;
      try {
        for await (const result of results) {
          if (result.errors?.length || !result.data) {
            // Parsed from the wire: formatted errors, whatever the libraries' types say.
            throw new JobledgerError((result.errors ?? []) as readonly GraphQLFormattedError[]);
          }
          const event = result.data.jobUpdates;
          failures = 0;
          afterSeq = Math.max(afterSeq, event.seq);
          yield event;
          if (FINISHED.has(event.status)) return;
        }
        // The stream ended before the terminal event: an SSE response cut short ends
        // like a completed one.
        problem = new Error('the stream ended before the job finished');
      } catch (error) {
        if (!resumable(error)) throw error;
        problem = error;
      } finally {
        // Stops the subscription when the caller leaves the loop early.
        await results.return?.();
      }
      failures += 1;
      if (failures > attempts) throw problem;
      follow.onReconnect?.({ afterSeq, attempt: failures, error: problem });
      await new Promise((resolve) => setTimeout(resolve, delayMs(failures)));
    }
  }

  return {
    request,
    createJob: async (input) => (await request(CreateJobDocument, { input })).createJob,
    job: async (id) => found((await request(JobDocument, { id })).job),
    jobCost: async (id) => found((await request(JobCostDocument, { id })).job),
    cancelJob: async (id) => (await request(CancelJobDocument, { id })).cancelJob,
    followJob,
    async dispose() {
      sse?.dispose();
      await ws?.dispose();
    },
  };
}
