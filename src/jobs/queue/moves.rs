//! Moving queued jobs off a paused model: a job with fallback models that waits on a
//! model the provider just paused goes to the next model of its chain that is not
//! paused ([`ModelChain::next`]), instead of waiting for the pause like the model's
//! other jobs. The claim passes over a paused model's jobs without reading them, so
//! the worker that records the pause moves them, reading them by a partial index of
//! queued jobs that have a chain: the model's jobs without one cost nothing.

use crate::db::Values;
use crate::jobs::fallbacks::ModelChain;
use crate::jobs::flow;
use entity::{JobStatus, JsonText, Timestamp, jobs};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

/// Most jobs one statement moves; a model with more queued jobs with fallbacks moves
/// them a chunk after another.
const MOVE_CHUNK: u64 = 500;
/// Most chunks one pause moves, so that a pause never holds its writer for long; the
/// jobs left wait for the pause as jobs without fallbacks do.
const MOST_CHUNKS: usize = 20;

/// Moves the queued jobs on `model` that have fallback models to the next model of
/// their chain not paused at `now`; returns how many moved. Each move matches the job
/// only while it is still queued on `model`, so a claim or a cancel in between wins.
pub async fn move_off_paused_model(
    db: &DatabaseConnection,
    model: &str,
    now: Timestamp,
) -> Result<u64, DbErr> {
    let mut moved = 0;
    let mut after = Uuid::nil();
    for _ in 0..MOST_CHUNKS {
        let waiting = jobs::Entity::find()
            .select_only()
            .columns([
                jobs::Column::Id,
                jobs::Column::Model,
                jobs::Column::ModelChain,
            ])
            .filter(jobs::Column::Status.eq(JobStatus::Queued))
            .filter(jobs::Column::Model.eq(model))
            .filter(jobs::Column::ModelChain.is_not_null())
            .filter(jobs::Column::Id.gt(after))
            .order_by_asc(jobs::Column::Id)
            .limit(MOVE_CHUNK)
            .into_tuple::<(Uuid, String, Option<JsonText>)>()
            .all(db)
            .await?;
        let Some((last, ..)) = waiting.last() else {
            break;
        };
        after = *last;
        let chains: Vec<(Uuid, ModelChain)> = waiting
            .into_iter()
            .map(|(id, model, chain)| (id, ModelChain::stored(model, chain.as_ref())))
            .collect();
        let mut models: Vec<String> = chains
            .iter()
            .flat_map(|(_, chain)| chain.models().iter().cloned())
            .collect();
        models.sort();
        models.dedup();
        let paused = flow::storage::paused_models(db, &models, now).await?;
        let mut values = Values::new(db.get_database_backend(), "v", ["id", "model"]);
        for (id, chain) in &chains {
            // Only to a model free now: one that is paused too gains the job nothing.
            if let Some(next) = chain.next(model, &paused, now)
                && next.paused_until.is_none()
            {
                values.push([(*id).into(), next.model.into()]);
            }
        }
        if !values.is_empty() {
            let from = values.bind(model);
            // Bound from the enum, so the text cannot drift from the stored value.
            let queued = values.bind(JobStatus::Queued);
            let result = db
                .execute_raw(values.statement(&format!(
                    "UPDATE jobs SET model = v.model FROM v
                     WHERE jobs.id = v.id AND jobs.status = {queued} AND jobs.model = {from}"
                )))
                .await?;
            moved += result.rows_affected();
        }
        if (chains.len() as u64) < MOVE_CHUNK {
            break;
        }
    }
    Ok(moved)
}
