//! One worker's try at one job, written before the provider is called.

use crate::{AttemptOutcome, JobErrorCode, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "attempts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub number: i32,
    pub run_token: Uuid,
    pub worker_id: String,
    pub outcome: AttemptOutcome,
    pub error_code: Option<JobErrorCode>,
    pub error_message: Option<String>,
    pub provider: String,
    pub model: String,
    pub provider_request_id: Option<String>,
    pub input_tokens: Option<i64>,
    pub cached_input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// Exact cost, known when the provider reported usage.
    pub provider_cost_nanos: Option<i64>,
    /// What the attempt may have cost when its outcome is unknown.
    pub provider_cost_upper_bound_nanos: Option<i64>,
    /// What the customer pays for this attempt, decided when it ends: the accepted
    /// answer's price, or what the charging policy charges for a call that did not
    /// finish. `None` while the attempt runs.
    pub customer_charge_nanos: Option<i64>,
    /// Output tokens streamed to the client before the call ended without usage,
    /// estimated from the text (see `billing::policy`); `None` when nothing streamed.
    pub delivered_output_tokens: Option<i64>,
    /// The price version in force when the attempt ran: what its provider cost is
    /// priced with.
    pub model_price_id: Uuid,
    /// The price version its customer charge is priced with: the one the job's hold
    /// was sized with. `None` (attempts recorded before jobs kept it): the same as
    /// `model_price_id`.
    pub customer_price_id: Option<Uuid>,
    /// The provider batch the attempt went out in; `None` for a realtime call.
    pub provider_batch_id: Option<Uuid>,
    pub latency_ms: Option<i64>,
    pub started_at: Timestamp,
    pub finished_at: Option<Timestamp>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
