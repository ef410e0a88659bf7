/** Internal type. DO NOT USE DIRECTLY. */
type Exact<T extends { [key: string]: unknown }> = { [K in keyof T]: T[K] };
/** Internal type. DO NOT USE DIRECTLY. */
export type Incremental<T> = T | { [P in keyof T]?: P extends ' $fragmentName' | '__typename' ? T[P] : never };
import type { TypedDocumentNode as DocumentNode } from '@graphql-typed-document-node/core';
/** How an attempt ended. */
export type AttemptOutcome =
  | 'CANCELLED'
  | 'INVALID_OUTPUT'
  | 'LEASE_EXPIRED'
  | 'PERMANENT_ERROR'
  | 'RETRYABLE_ERROR'
  | 'RUNNING'
  | 'SUCCEEDED'
  /** The request was sent and no answer came back: it may have been billed. */
  | 'UNKNOWN';

/** A job to run. */
export type CreateJobInput = {
  /**
   * The job fails with `DEADLINE_EXCEEDED` if it has not finished by then (a
   * running attempt is cancelled). Must be in the future and after `runAt`.
   * Default: the operator's (24 hours unless configured) from when the job may start.
   */
  deadline?: string | null | undefined;
  /**
   * Models tried in order after `model` when it is rate limited, paused or failing
   * transiently, at most 4, each served and priced, none repeated: the hold covers
   * the dearest model of the chain, and each attempt records the model it called.
   */
  fallbackModels?: Array<string> | null | undefined;
  /** The client's unique name for this request: repeating it returns the same job. */
  idempotencyKey: string;
  /**
   * At most 16, one value per key (a key given twice is `VALIDATION`), for finding
   * the job again with `jobs(label:)`.
   */
  labels?: Array<LabelInput> | null | undefined;
  /** Attempts the job may use (default 3, at most 10). */
  maxAttempts?: number | null | undefined;
  maxOutputTokens: number;
  messages: Array<MessageInput>;
  /** Any JSON the client wants kept with the job. */
  metadata?: unknown;
  model: string;
  /**
   * 0 to 9 (default 5): among the tenant's due jobs, a higher priority runs first,
   * then the oldest. Fairness across tenants is unchanged.
   */
  priority?: number | null | undefined;
  /**
   * Other fields of the provider's request body, sent as given (at most 16 KiB). A
   * field that changes what a call may cost (`n`, `best_of`, `max_tokens`,
   * `logprobs`, `service_tier`, …) or that jobledger sets (`model`, `messages`,
   * `stream`, …) is `VALIDATION`, naming it.
   */
  providerOptions?: unknown;
  /** A JSON Schema the reply must satisfy; the result is then the parsed JSON. */
  responseSchema?: unknown;
  /**
   * Whether to retry an attempt whose outcome is unknown, at the risk of paying the
   * provider twice (default true).
   */
  retryUnknownOutcome?: boolean | null | undefined;
  /**
   * The job is not started before this instant (at most 366 days ahead); its hold
   * is taken now.
   */
  runAt?: string | null | undefined;
  /** For providers that sample reproducibly (dropped for Anthropic). */
  seed?: number | null | undefined;
  /** Up to 4 sequences (1 to 256 characters) that end the reply. */
  stop?: Array<string> | null | undefined;
  /**
   * Stream the reply: `jobUpdates` subscribers then see `OUTPUT_DELTA` events with
   * the text as it is written (default false).
   */
  streamOutput?: boolean | null | undefined;
  /** Sampling temperature, 0 to 2; the provider's default when omitted. */
  temperature?: number | null | undefined;
  /**
   * `"auto"`, `"none"`, `"required"` or `{"type": "function", "function":
   * {"name"}}` naming one of `tools`.
   */
  toolChoice?: unknown;
  /**
   * Function tools the model may call, in OpenAI's shape (`[{"type": "function",
   * "function": {"name", "description", "parameters"}}]`, at most 128, 64 KiB),
   * translated for Anthropic. A reply that calls tools has the result
   * `{"toolCalls": [{"name", "arguments", "id"}]}`; a call of a tool not offered,
   * or whose arguments fail its `parameters`, is `INVALID_OUTPUT`.
   */
  tools?: unknown;
  /** Nucleus sampling, above 0 and at most 1. */
  topP?: number | null | undefined;
};

/** What happened to a job. */
export type EventKind =
  | 'ATTEMPT_STARTED'
  | 'CANCELLED'
  | 'CANCEL_REQUESTED'
  | 'CREATED'
  | 'FAILED'
  /** Live text of a streaming attempt; not stored, so not replayed. */
  | 'OUTPUT_DELTA'
  | 'RETRY_SCHEDULED'
  | 'SUCCEEDED';

/**
 * Why an attempt ended as it did, or why a job failed: `Job.error.code` and
 * `Attempt.errorCode`.
 */
export type JobErrorCode =
  /** The tenant cancelled the job. */
  | 'CANCELLED'
  /**
   * The job had not finished by its `deadline`: a queued job fails there, a running
   * attempt is cancelled (outcome `CANCELLED`).
   */
  | 'DEADLINE_EXCEEDED'
  /** The reply did not satisfy the job's response schema (or was not JSON). */
  | 'INVALID_OUTPUT'
  /**
   * The worker running the attempt stopped renewing its lease; another process took
   * the job back.
   */
  | 'LEASE_EXPIRED'
  /** No configured provider serves the job's model; no call was made. */
  | 'MODEL_NOT_SERVED'
  /**
   * The job cannot be run at all (unreadable input, a model without a price); no
   * call was made.
   */
  | 'NOT_RUNNABLE'
  /**
   * The request was sent and no answer came back: it may have been billed. Retried
   * only when the job's `retryUnknownOutcome` allows it.
   */
  | 'OUTCOME_UNKNOWN'
  /**
   * The job made as many calls that may have been billed as it may pay for, or
   * their cost reached its hold.
   */
  | 'PAID_CALL_LIMIT'
  /**
   * The provider refused the request with a permanent status; not billed, not
   * retried.
   */
  | 'PROVIDER_REJECTED'
  /**
   * The provider was unreachable or answered a retryable status; retried with
   * backoff while attempts remain.
   */
  | 'PROVIDER_UNAVAILABLE'
  /** The answer came back and was paid for, but could not be stored. */
  | 'RESULT_NOT_STORED'
  /** The worker shut down during the attempt and handed the job back. */
  | 'WORKER_SHUTDOWN';

/** Where a job is in its lifecycle. */
export type JobStatus =
  | 'CANCELLED'
  | 'FAILED'
  | 'QUEUED'
  | 'RUNNING'
  | 'SUCCEEDED';

/**
 * A `key=value` pair to find a job by: key and value of 1 to 128 characters, with no
 * control or invisible characters.
 */
export type LabelInput = {
  key: string;
  value: string;
};

/** One chat message of a job: its text, its parts, or both (the text comes first). */
export type MessageInput = {
  content?: string | null | undefined;
  /**
   * Text, images and PDF documents after the content; images and documents in
   * user messages only, at most 20 parts per job, 5 MiB per part and 10 MiB in
   * all (decoded).
   */
  parts?: Array<MessagePartInput> | null | undefined;
  /** `system`, `developer`, `user` or `assistant`. */
  role: string;
};

/** One part of a message. */
export type MessagePartInput = {
  /** An IMAGE's or DOCUMENT's bytes, in base64. */
  data?: string | null | undefined;
  /**
   * `image/png`, `image/jpeg`, `image/gif`, `image/webp` or `application/pdf`;
   * read from the data when not given, and refused when the data says otherwise.
   */
  mediaType?: string | null | undefined;
  /** A TEXT part's text. */
  text?: string | null | undefined;
  type: MessagePartType;
  /** Where the provider fetches an IMAGE (http or https). */
  url?: string | null | undefined;
};

/** What a message part is. */
export type MessagePartType =
  /** A PDF, as `data` only: by URL its pages could not be counted for the hold. */
  | 'DOCUMENT'
  /**
   * PNG, JPEG, GIF or WebP: as `data`, or by `url` (then held at the most any
   * image counts for the model's provider).
   */
  | 'IMAGE'
  | 'TEXT';

/** The state of a job's credit hold. */
export type ReservationStatus =
  | 'HELD'
  | 'RELEASED'
  | 'SETTLED';

export type CreateJobMutationVariables = Exact<{
  input: CreateJobInput;
}>;


export type CreateJobMutation = { createJob: { replayed: boolean, job: { id: string, status: JobStatus, idempotencyKey: string, model: string, createdAt: string, reservation: { id: string, amount: string, status: ReservationStatus } | null } } };

export type CancelJobMutationVariables = Exact<{
  id: string;
}>;


export type CancelJobMutation = { cancelJob: { id: string, status: JobStatus, cancelRequested: boolean } };

export type JobQueryVariables = Exact<{
  id: string;
}>;


export type JobQuery = { job: { id: string, status: JobStatus, cancelRequested: boolean, model: string, result: unknown, attemptCount: number, maxAttempts: number, createdAt: string, startedAt: string | null, finishedAt: string | null, error: { code: JobErrorCode, message: string } | null, attempts: Array<{ number: number, outcome: AttemptOutcome, errorCode: JobErrorCode | null, providerRequestId: string | null, inputTokens: number | null, cachedInputTokens: number | null, outputTokens: number | null, providerCost: string | null, providerCostUpperBound: string | null, startedAt: string, finishedAt: string | null }>, reservation: { id: string, amount: string, status: ReservationStatus, settledAmount: string, releasedAmount: string } | null, charge: { id: string, amount: string, createdAt: string } | null, cost: { providerCost: string, providerCostUpperBound: string, customerCharge: string, margin: string, unknownAttempts: number }, events: Array<{ seq: number, kind: EventKind, status: JobStatus, at: string }> } };

export type JobCostQueryVariables = Exact<{
  id: string;
}>;


export type JobCostQuery = { job: { id: string, status: JobStatus, reservation: { amount: string, status: ReservationStatus, settledAmount: string, releasedAmount: string } | null, charge: { amount: string } | null, cost: { providerCost: string, providerCostUpperBound: string, customerCharge: string, margin: string, unknownAttempts: number } } };

export type JobUpdatesSubscriptionVariables = Exact<{
  jobId: string;
  afterSeq?: number | null | undefined;
}>;


export type JobUpdatesSubscription = { jobUpdates: { seq: number, jobId: string, kind: EventKind, status: JobStatus, at: string } };


export const CreateJobDocument = {"kind":"Document","definitions":[{"kind":"OperationDefinition","operation":"mutation","name":{"kind":"Name","value":"CreateJob"},"variableDefinitions":[{"kind":"VariableDefinition","variable":{"kind":"Variable","name":{"kind":"Name","value":"input"}},"type":{"kind":"NonNullType","type":{"kind":"NamedType","name":{"kind":"Name","value":"CreateJobInput"}}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"createJob"},"arguments":[{"kind":"Argument","name":{"kind":"Name","value":"input"},"value":{"kind":"Variable","name":{"kind":"Name","value":"input"}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"replayed"}},{"kind":"Field","name":{"kind":"Name","value":"job"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"id"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"idempotencyKey"}},{"kind":"Field","name":{"kind":"Name","value":"model"}},{"kind":"Field","name":{"kind":"Name","value":"createdAt"}},{"kind":"Field","name":{"kind":"Name","value":"reservation"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"id"}},{"kind":"Field","name":{"kind":"Name","value":"amount"}},{"kind":"Field","name":{"kind":"Name","value":"status"}}]}}]}}]}}]}}]} as unknown as DocumentNode<CreateJobMutation, CreateJobMutationVariables>;
export const CancelJobDocument = {"kind":"Document","definitions":[{"kind":"OperationDefinition","operation":"mutation","name":{"kind":"Name","value":"CancelJob"},"variableDefinitions":[{"kind":"VariableDefinition","variable":{"kind":"Variable","name":{"kind":"Name","value":"id"}},"type":{"kind":"NonNullType","type":{"kind":"NamedType","name":{"kind":"Name","value":"UUID"}}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"cancelJob"},"arguments":[{"kind":"Argument","name":{"kind":"Name","value":"id"},"value":{"kind":"Variable","name":{"kind":"Name","value":"id"}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"id"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"cancelRequested"}}]}}]}}]} as unknown as DocumentNode<CancelJobMutation, CancelJobMutationVariables>;
export const JobDocument = {"kind":"Document","definitions":[{"kind":"OperationDefinition","operation":"query","name":{"kind":"Name","value":"Job"},"variableDefinitions":[{"kind":"VariableDefinition","variable":{"kind":"Variable","name":{"kind":"Name","value":"id"}},"type":{"kind":"NonNullType","type":{"kind":"NamedType","name":{"kind":"Name","value":"UUID"}}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"job"},"arguments":[{"kind":"Argument","name":{"kind":"Name","value":"id"},"value":{"kind":"Variable","name":{"kind":"Name","value":"id"}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"id"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"cancelRequested"}},{"kind":"Field","name":{"kind":"Name","value":"model"}},{"kind":"Field","name":{"kind":"Name","value":"result"}},{"kind":"Field","name":{"kind":"Name","value":"error"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"code"}},{"kind":"Field","name":{"kind":"Name","value":"message"}}]}},{"kind":"Field","name":{"kind":"Name","value":"attemptCount"}},{"kind":"Field","name":{"kind":"Name","value":"maxAttempts"}},{"kind":"Field","name":{"kind":"Name","value":"createdAt"}},{"kind":"Field","name":{"kind":"Name","value":"startedAt"}},{"kind":"Field","name":{"kind":"Name","value":"finishedAt"}},{"kind":"Field","name":{"kind":"Name","value":"attempts"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"number"}},{"kind":"Field","name":{"kind":"Name","value":"outcome"}},{"kind":"Field","name":{"kind":"Name","value":"errorCode"}},{"kind":"Field","name":{"kind":"Name","value":"providerRequestId"}},{"kind":"Field","name":{"kind":"Name","value":"inputTokens"}},{"kind":"Field","name":{"kind":"Name","value":"cachedInputTokens"}},{"kind":"Field","name":{"kind":"Name","value":"outputTokens"}},{"kind":"Field","name":{"kind":"Name","value":"providerCost"}},{"kind":"Field","name":{"kind":"Name","value":"providerCostUpperBound"}},{"kind":"Field","name":{"kind":"Name","value":"startedAt"}},{"kind":"Field","name":{"kind":"Name","value":"finishedAt"}}]}},{"kind":"Field","name":{"kind":"Name","value":"reservation"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"id"}},{"kind":"Field","name":{"kind":"Name","value":"amount"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"settledAmount"}},{"kind":"Field","name":{"kind":"Name","value":"releasedAmount"}}]}},{"kind":"Field","name":{"kind":"Name","value":"charge"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"id"}},{"kind":"Field","name":{"kind":"Name","value":"amount"}},{"kind":"Field","name":{"kind":"Name","value":"createdAt"}}]}},{"kind":"Field","name":{"kind":"Name","value":"cost"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"providerCost"}},{"kind":"Field","name":{"kind":"Name","value":"providerCostUpperBound"}},{"kind":"Field","name":{"kind":"Name","value":"customerCharge"}},{"kind":"Field","name":{"kind":"Name","value":"margin"}},{"kind":"Field","name":{"kind":"Name","value":"unknownAttempts"}}]}},{"kind":"Field","name":{"kind":"Name","value":"events"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"seq"}},{"kind":"Field","name":{"kind":"Name","value":"kind"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"at"}}]}}]}}]}}]} as unknown as DocumentNode<JobQuery, JobQueryVariables>;
export const JobCostDocument = {"kind":"Document","definitions":[{"kind":"OperationDefinition","operation":"query","name":{"kind":"Name","value":"JobCost"},"variableDefinitions":[{"kind":"VariableDefinition","variable":{"kind":"Variable","name":{"kind":"Name","value":"id"}},"type":{"kind":"NonNullType","type":{"kind":"NamedType","name":{"kind":"Name","value":"UUID"}}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"job"},"arguments":[{"kind":"Argument","name":{"kind":"Name","value":"id"},"value":{"kind":"Variable","name":{"kind":"Name","value":"id"}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"id"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"reservation"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"amount"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"settledAmount"}},{"kind":"Field","name":{"kind":"Name","value":"releasedAmount"}}]}},{"kind":"Field","name":{"kind":"Name","value":"charge"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"amount"}}]}},{"kind":"Field","name":{"kind":"Name","value":"cost"},"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"providerCost"}},{"kind":"Field","name":{"kind":"Name","value":"providerCostUpperBound"}},{"kind":"Field","name":{"kind":"Name","value":"customerCharge"}},{"kind":"Field","name":{"kind":"Name","value":"margin"}},{"kind":"Field","name":{"kind":"Name","value":"unknownAttempts"}}]}}]}}]}}]} as unknown as DocumentNode<JobCostQuery, JobCostQueryVariables>;
export const JobUpdatesDocument = {"kind":"Document","definitions":[{"kind":"OperationDefinition","operation":"subscription","name":{"kind":"Name","value":"JobUpdates"},"variableDefinitions":[{"kind":"VariableDefinition","variable":{"kind":"Variable","name":{"kind":"Name","value":"jobId"}},"type":{"kind":"NonNullType","type":{"kind":"NamedType","name":{"kind":"Name","value":"UUID"}}}},{"kind":"VariableDefinition","variable":{"kind":"Variable","name":{"kind":"Name","value":"afterSeq"}},"type":{"kind":"NamedType","name":{"kind":"Name","value":"Int"}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"jobUpdates"},"arguments":[{"kind":"Argument","name":{"kind":"Name","value":"jobId"},"value":{"kind":"Variable","name":{"kind":"Name","value":"jobId"}}},{"kind":"Argument","name":{"kind":"Name","value":"afterSeq"},"value":{"kind":"Variable","name":{"kind":"Name","value":"afterSeq"}}}],"selectionSet":{"kind":"SelectionSet","selections":[{"kind":"Field","name":{"kind":"Name","value":"seq"}},{"kind":"Field","name":{"kind":"Name","value":"jobId"}},{"kind":"Field","name":{"kind":"Name","value":"kind"}},{"kind":"Field","name":{"kind":"Name","value":"status"}},{"kind":"Field","name":{"kind":"Name","value":"at"}}]}}]}}]} as unknown as DocumentNode<JobUpdatesSubscription, JobUpdatesSubscriptionVariables>;