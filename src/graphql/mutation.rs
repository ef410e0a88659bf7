//! Changes: jobs for tenants; tenants and credits for admins.

use super::scalars::Amount;
use super::types::{Attempt, CreditGrant, Job, Tenant};
use super::{ApiErrorCode, app, principal};
use crate::accounts::Principal;
use crate::accounts::access_tokens::AccessScope;
use crate::accounts::tenants;
use crate::billing::reconciliation::{self, NewReconciliation};
use crate::billing::{Credits, CreditsError, ledger};
use crate::db::begin_write;
use crate::error::ServiceError;
use crate::jobs::input::{IdempotencyKey, JobRequest, MessageRequest, NewJob};
use crate::jobs::parameters::ParameterRequest;
use crate::jobs::parts::{PartRequest, PartType};
use crate::jobs::reach::JobReach;
use crate::jobs::tools::ToolRequest;
use crate::jobs::{rerun, service};
use crate::llm::TokenUsage;
use async_graphql::{Context, InputObject, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::{Timestamp, attempt_reconciliations};
use uuid::Uuid;

/// One chat message of a job: its text, its parts, or both (the text comes first).
#[derive(InputObject)]
pub struct MessageInput {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    pub content: Option<String>,
    /// Text, images and PDF documents after the content; images and documents in
    /// user messages only, at most 20 parts per job, 5 MiB per part and 10 MiB in
    /// all (decoded).
    pub parts: Option<Vec<MessagePartInput>>,
}

/// What a message part is.
#[derive(async_graphql::Enum, Clone, Copy, PartialEq, Eq)]
pub enum MessagePartType {
    Text,
    /// PNG, JPEG, GIF or WebP: as `data`, or by `url` (then held at the most any
    /// image counts for the model's provider).
    Image,
    /// A PDF, as `data` only: by URL its pages could not be counted for the hold.
    Document,
}

/// One part of a message.
#[derive(InputObject)]
pub struct MessagePartInput {
    #[graphql(name = "type")]
    pub kind: MessagePartType,
    /// A TEXT part's text.
    pub text: Option<String>,
    /// An IMAGE's or DOCUMENT's bytes, in base64.
    pub data: Option<String>,
    /// Where the provider fetches an IMAGE (http or https).
    pub url: Option<String>,
    /// `image/png`, `image/jpeg`, `image/gif`, `image/webp` or `application/pdf`;
    /// read from the data when not given, and refused when the data says otherwise.
    pub media_type: Option<String>,
}

impl MessageInput {
    /// The message as the service takes it.
    pub fn into_request(self) -> MessageRequest {
        MessageRequest {
            role: self.role,
            content: self.content,
            parts: self
                .parts
                .unwrap_or_default()
                .into_iter()
                .map(|part| PartRequest {
                    kind: match part.kind {
                        MessagePartType::Text => PartType::Text,
                        MessagePartType::Image => PartType::Image,
                        MessagePartType::Document => PartType::Document,
                    },
                    text: part.text,
                    data: part.data,
                    url: part.url,
                    media_type: part.media_type,
                })
                .collect(),
        }
    }
}

/// A `key=value` pair to find a job by: key and value of 1 to 128 characters, with no
/// control or invisible characters.
#[derive(InputObject)]
pub struct LabelInput {
    pub key: String,
    pub value: String,
}

/// A job to run.
#[derive(InputObject)]
pub struct CreateJobInput {
    /// The client's unique name for this request: repeating it returns the same job.
    pub idempotency_key: String,
    pub model: String,
    pub messages: Vec<MessageInput>,
    pub max_output_tokens: i32,
    /// A JSON Schema the reply must satisfy; the result is then the parsed JSON.
    pub response_schema: Option<Json<serde_json::Value>>,
    /// Attempts the job may use (default 3, at most 10).
    pub max_attempts: Option<i32>,
    /// Whether to retry an attempt whose outcome is unknown, at the risk of paying the
    /// provider twice (default true).
    pub retry_unknown_outcome: Option<bool>,
    /// Any JSON the client wants kept with the job.
    pub metadata: Option<Json<serde_json::Value>>,
    /// Stream the reply: `jobUpdates` subscribers then see `OUTPUT_DELTA` events with
    /// the text as it is written (default false).
    pub stream_output: Option<bool>,
    /// 0 to 9 (default 5): among the tenant's due jobs, a higher priority runs first,
    /// then the oldest. Fairness across tenants is unchanged.
    pub priority: Option<i32>,
    /// The job is not started before this instant (at most 366 days ahead); its hold
    /// is taken now.
    pub run_at: Option<DateTime<Utc>>,
    /// At most 16, one value per key (a key given twice is `VALIDATION`), for finding
    /// the job again with `jobs(label:)`.
    pub labels: Option<Vec<LabelInput>>,
    /// Sampling temperature, 0 to 2; the provider's default when omitted.
    pub temperature: Option<f64>,
    /// Nucleus sampling, above 0 and at most 1.
    pub top_p: Option<f64>,
    /// Up to 4 sequences (1 to 256 characters) that end the reply.
    pub stop: Option<Vec<String>>,
    /// For providers that sample reproducibly (dropped for Anthropic).
    pub seed: Option<i32>,
    /// Other fields of the provider's request body, sent as given (at most 16 KiB). A
    /// field that changes what a call may cost (`n`, `best_of`, `max_tokens`,
    /// `logprobs`, `service_tier`, …) or that jobledger sets (`model`, `messages`,
    /// `stream`, …) is `VALIDATION`, naming it.
    pub provider_options: Option<Json<serde_json::Value>>,
    /// Function tools the model may call, in OpenAI's shape (`[{"type": "function",
    /// "function": {"name", "description", "parameters"}}]`, at most 128, 64 KiB),
    /// translated for Anthropic. A reply that calls tools has the result
    /// `{"toolCalls": [{"name", "arguments", "id"}]}`; a call of a tool not offered,
    /// or whose arguments fail its `parameters`, is `INVALID_OUTPUT`.
    pub tools: Option<Json<serde_json::Value>>,
    /// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function":
    /// {"name"}}` naming one of `tools`.
    pub tool_choice: Option<Json<serde_json::Value>>,
    /// The job fails with `DEADLINE_EXCEEDED` if it has not finished by then (a
    /// running attempt is cancelled). Must be in the future and after `runAt`.
    /// Default: the operator's (24 hours unless configured) from when the job may start.
    pub deadline: Option<DateTime<Utc>>,
    /// Models tried in order after `model` when it is rate limited, paused or failing
    /// transiently, at most 4, each served and priced, none repeated: the hold covers
    /// the dearest model of the chain, and each attempt records the model it called.
    pub fallback_models: Option<Vec<String>>,
}

/// `input` checked as `createJob` checks it, for the caller's `reach`: its labels
/// stamped with an access token's own, its key in the token's namespace.
pub(super) async fn new_job(
    context: &Context<'_>,
    reach: &JobReach,
    input: CreateJobInput,
) -> async_graphql::Result<NewJob> {
    let labels = reach.stamp(
        input
            .labels
            .unwrap_or_default()
            .into_iter()
            .map(|label| (label.key, label.value))
            .collect(),
    )?;
    let request = JobRequest {
        idempotency_key: reach.sent_key(input.idempotency_key),
        model: input.model,
        messages: input
            .messages
            .into_iter()
            .map(MessageInput::into_request)
            .collect(),
        max_output_tokens: input.max_output_tokens,
        response_schema: input.response_schema.map(|json| json.0),
        max_attempts: input.max_attempts,
        retry_unknown_outcome: input.retry_unknown_outcome,
        metadata: input.metadata.map(|json| json.0),
        stream_output: input.stream_output,
        priority: input.priority,
        run_at: input.run_at.map(Timestamp::from),
        deadline: input.deadline.map(Timestamp::from),
        default_deadline: app(context).default_deadline,
        charging: app(context).charging,
        labels,
        fallback_models: input.fallback_models.unwrap_or_default(),
        parameters: ParameterRequest {
            temperature: input.temperature,
            top_p: input.top_p,
            stop: input.stop,
            seed: input.seed.map(i64::from),
            provider_options: input.provider_options.map(|json| json.0),
        },
        tools: ToolRequest {
            tools: input.tools.map(|json| json.0),
            tool_choice: input.tool_choice.map(|json| json.0),
        },
    };
    let mut new = NewJob::parse_measuring(&app(context).measuring, request).await?;
    new.idempotency_key = reach.own_key(new.idempotency_key);
    Ok(new)
}

/// The job, and whether an earlier request with the same key created it.
#[derive(SimpleObject)]
pub struct CreateJobPayload {
    pub replayed: bool,
    pub job: Job,
}

/// Credits to add to a tenant.
#[derive(InputObject)]
pub struct GrantCreditsInput {
    pub tenant_id: Uuid,
    pub amount: Amount,
    /// Repeating a grant with the same key grants once.
    pub idempotency_key: String,
    pub reason: Option<String>,
    /// When what is left of the grant expires (in the future, at most 100 years
    /// ahead); omitted, it never does. Charges consume the soonest-expiring grants
    /// first, and expired credit never takes held credit.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A new tenant and its API key, shown this once.
#[derive(SimpleObject)]
pub struct CreateTenantPayload {
    pub tenant: Tenant,
    pub api_key: String,
}

/// The real usage of an attempt whose outcome was unknown, e.g. from the provider's
/// usage report or generation lookup.
#[derive(InputObject)]
pub struct ReconcileAttemptInput {
    pub attempt_id: Uuid,
    /// All input tokens, cached ones included.
    pub input_tokens: i32,
    /// Input tokens served from the provider's prompt cache (default 0).
    pub cached_input_tokens: Option<i32>,
    pub output_tokens: i32,
    /// The provider's id for the request, when the report names it.
    pub provider_request_id: Option<String>,
    /// Why, and from which source: kept in the audit trail.
    pub note: String,
}

/// The audit-trail entry of a reconciled attempt.
#[derive(SimpleObject)]
pub struct AttemptReconciliation {
    pub id: Uuid,
    pub attempt_id: Uuid,
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    /// The bound the attempt carried until now.
    pub previous_upper_bound: Option<Amount>,
    /// The exact cost, at the price version the attempt was priced with.
    pub provider_cost: Amount,
    pub input_tokens: i32,
    pub cached_input_tokens: i32,
    pub output_tokens: i32,
    pub provider_request_id: Option<String>,
    pub note: String,
    pub reconciled_by: String,
    pub created_at: DateTime<Utc>,
}

impl From<attempt_reconciliations::Model> for AttemptReconciliation {
    fn from(row: attempt_reconciliations::Model) -> Self {
        let money = |nanos| Amount::from(Credits::from_nanos(nanos));
        // Stored from 32-bit input, so they fit; saturate rather than fail all the same.
        let count = |tokens: i64| i32::try_from(tokens).unwrap_or(i32::MAX);
        Self {
            id: row.id,
            attempt_id: row.attempt_id,
            job_id: row.job_id,
            tenant_id: row.tenant_id,
            previous_upper_bound: row.previous_upper_bound_nanos.map(money),
            provider_cost: money(row.provider_cost_nanos),
            input_tokens: count(row.input_tokens),
            cached_input_tokens: count(row.cached_input_tokens),
            output_tokens: count(row.output_tokens),
            provider_request_id: row.provider_request_id,
            note: row.note,
            reconciled_by: row.reconciled_by,
            created_at: row.created_at.to_datetime(),
        }
    }
}

/// The audit-trail entry and the attempt with its exact cost.
#[derive(SimpleObject)]
pub struct ReconcileAttemptPayload {
    pub reconciliation: AttemptReconciliation,
    pub attempt: Attempt,
}

/// Who an admin request is recorded as: admins share one token and carry no name yet.
const ADMIN_ACTOR: &str = "admin";

/// Changes to jobs, tenants, credits and attempts.
#[derive(Default)]
pub struct JobMutation;

#[Object]
impl JobMutation {
    /// Creates a job and holds credits for it; returns at once. An access token needs
    /// `CREATE_JOBS`; the job gets the token's labels, and its hold counts against the
    /// token's `maxSpend`.
    async fn create_job(
        &self,
        context: &Context<'_>,
        input: CreateJobInput,
    ) -> async_graphql::Result<CreateJobPayload> {
        let began = std::time::Instant::now();
        let principal = principal(context)?;
        let (tenant_id, reach) = principal.job_access(AccessScope::CreateJobs)?;
        let new = new_job(context, &reach, input).await?;
        let app = app(context);
        let created = match &principal {
            Principal::Token(grant) => {
                service::create_job_for_token(
                    &app.db,
                    &app.bus,
                    &app.providers,
                    tenant_id,
                    grant.token_id,
                    new,
                )
                .await?
            }
            _ => service::create_job(&app.db, &app.bus, &app.providers, tenant_id, new).await?,
        };
        app.metrics
            .create_job_handled(began.elapsed(), !created.replayed);
        Ok(CreateJobPayload {
            replayed: created.replayed,
            job: created.job.into(),
        })
    }

    /// Creates a new job with the input of a finished one (model, messages, settings,
    /// labels, metadata), with its own hold and attempts and `rerunOf` naming the
    /// original. Idempotent by `idempotencyKey` like `createJob`. A job that has not
    /// finished is `VALIDATION`; a rerun of a batch item is a job outside the batch.
    async fn rerun_job(
        &self,
        context: &Context<'_>,
        id: Uuid,
        idempotency_key: String,
    ) -> async_graphql::Result<CreateJobPayload> {
        let tenant_id = principal(context)?.tenant_id()?;
        let idempotency_key = IdempotencyKey::parse(idempotency_key)?;
        let app = app(context);
        let created = rerun::rerun_job(
            &app.db,
            &app.bus,
            &app.providers,
            tenant_id,
            id,
            idempotency_key,
            app.charging,
        )
        .await?;
        Ok(CreateJobPayload {
            replayed: created.replayed,
            job: created.job.into(),
        })
    }

    /// Asks for a job to be cancelled: a queued job is cancelled at once, a running one
    /// as soon as its worker notices. An access token needs `CANCEL_JOBS` and cancels
    /// only jobs within its reach.
    async fn cancel_job(&self, context: &Context<'_>, id: Uuid) -> async_graphql::Result<Job> {
        let (tenant_id, reach) = principal(context)?.job_access(AccessScope::CancelJobs)?;
        let app = app(context);
        reach.require(&app.db, tenant_id, id).await?;
        Ok(
            service::cancel_job(&app.db, &app.bus, &app.metrics, tenant_id, id)
                .await?
                .into(),
        )
    }

    /// Admin: creates a tenant and its first API key.
    async fn create_tenant(
        &self,
        context: &Context<'_>,
        name: String,
    ) -> async_graphql::Result<CreateTenantPayload> {
        principal(context)?.require_admin()?;
        let transaction = begin_write(&app(context).db)
            .await
            .map_err(ServiceError::from)?;
        let (tenant, key) = tenants::create_tenant(&transaction, &name).await?;
        transaction.commit().await.map_err(ServiceError::from)?;
        Ok(CreateTenantPayload {
            tenant: tenant.into(),
            api_key: key.expose().to_owned(),
        })
    }

    /// Admin: adds credits to a tenant, once per idempotency key.
    async fn grant_credits(
        &self,
        context: &Context<'_>,
        input: GrantCreditsInput,
    ) -> async_graphql::Result<CreditGrant> {
        principal(context)?.require_admin()?;
        let amount = Credits::from_decimal(input.amount.0).map_err(|error| match error {
            CreditsError::TooPrecise | CreditsError::TooLarge => {
                ApiErrorCode::Validation.error(format!("amount: {error}"))
            }
        })?;
        let idempotency_key = input.idempotency_key.trim().to_owned();
        if idempotency_key.is_empty() {
            return Err(ApiErrorCode::Validation.error("idempotencyKey must not be empty"));
        }
        let grant = ledger::grant_credits(
            &app(context).db,
            ledger::NewGrant {
                tenant_id: input.tenant_id,
                amount,
                idempotency_key,
                reason: input.reason,
                expires_at: input.expires_at.map(Timestamp::from),
            },
        )
        .await?;
        Ok(grant.into())
    }

    /// Admin: records the real usage of an attempt whose outcome was unknown, turning
    /// its cost bound into the exact cost at the attempt's own price version, with an
    /// audit-trail entry. The customer's charge does not change. `NOT_FOUND` for an
    /// unknown attempt, `VALIDATION` for one whose cost is already exact.
    async fn reconcile_attempt(
        &self,
        context: &Context<'_>,
        input: ReconcileAttemptInput,
    ) -> async_graphql::Result<ReconcileAttemptPayload> {
        principal(context)?.require_admin()?;
        let count = |field: &str, value: i32| {
            u64::try_from(value).map_err(|_| {
                ApiErrorCode::Validation.error(format!("{field} must not be negative"))
            })
        };
        let usage = TokenUsage {
            input_tokens: count("inputTokens", input.input_tokens)?,
            cached_input_tokens: count(
                "cachedInputTokens",
                input.cached_input_tokens.unwrap_or(0),
            )?,
            output_tokens: count("outputTokens", input.output_tokens)?,
        };
        let transaction = begin_write(&app(context).db)
            .await
            .map_err(ServiceError::from)?;
        let reconciled = reconciliation::reconcile_attempt(
            &transaction,
            NewReconciliation {
                attempt_id: input.attempt_id,
                usage,
                provider_request_id: input.provider_request_id,
                note: input.note,
                reconciled_by: ADMIN_ACTOR.to_owned(),
            },
        )
        .await?;
        transaction.commit().await.map_err(ServiceError::from)?;
        Ok(ReconcileAttemptPayload {
            reconciliation: reconciled.reconciliation.into(),
            attempt: Attempt(reconciled.attempt),
        })
    }
}
