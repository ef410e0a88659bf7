//! Where an account stream resumes: the cursor each event it delivers carries, and the
//! pages of stored events a resumed stream catches up from.
//!
//! `job_events` has no order that is global and follows commits: its key is per job
//! (`job_id`, `seq`), and `at` is stamped by the writing process's clock before its
//! transaction commits, so an event stamped earlier than one already delivered can
//! still be committed after it (a slow transaction, or another process whose clock
//! runs behind). A cursor that only said "after this `at`" would skip such an event.
//! So a cursor says two things: a point in time `from`, [`CLOCK_SKEW_MARGIN`] before
//! the event it comes with (no event stamped earlier can still be committed after that
//! event was delivered: the same assumption the account streams' re-reads rest on);
//! and, for every job the stream delivered an event of stamped at or after `from`, the
//! last seq it delivered. Resuming reads the tenant's events stamped at or after
//! `from` and skips, per job, those up to the seq the cursor holds: each missed event
//! once, none twice. Within a job seqs are committed in order, so "delivered up to
//! seq n" covers the job's earlier events too.
//!
//! [`CLOCK_SKEW_MARGIN`]: super::CLOCK_SKEW_MARGIN

use crate::error::ServiceError;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use entity::{Timestamp, job_events};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

/// Stored events a resumed stream reads at once while catching up.
pub const CATCH_UP_PAGE: u64 = 500;

/// Bumped when the encoding changes, so that an old cursor is refused, not misread.
const VERSION: u8 = 1;
const HEADER: usize = 1 + 16 + 8;
const JOB: usize = 16 + 4 + 8;

/// A decoded cursor: see the module's documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub tenant_id: Uuid,
    pub from: Timestamp,
    pub seen: Vec<SeenJob>,
}

/// The last event of one job that a stream delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeenJob {
    pub job_id: Uuid,
    pub seq: i32,
    pub at: Timestamp,
}

impl Cursor {
    /// The cursor `text`, which must be one of `tenant_id`'s streams: any other string,
    /// or another tenant's cursor, is refused alike.
    pub fn parse(text: &str, tenant_id: Uuid) -> Result<Self, ServiceError> {
        let invalid = || ServiceError::validation("not a cursor of this account's job updates");
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| invalid())?;
        if bytes.len() < HEADER
            || !(bytes.len() - HEADER).is_multiple_of(JOB)
            || bytes[0] != VERSION
        {
            return Err(invalid());
        }
        let uuid = |at: usize| Uuid::from_slice(&bytes[at..at + 16]).expect("16 bytes");
        let i64_at = |at: usize| i64::from_be_bytes(bytes[at..at + 8].try_into().expect("8"));
        if uuid(1) != tenant_id {
            return Err(invalid());
        }
        let seen = bytes[HEADER..]
            .chunks(JOB)
            .map(|job| SeenJob {
                job_id: Uuid::from_slice(&job[..16]).expect("16 bytes"),
                seq: i32::from_be_bytes(job[16..20].try_into().expect("4 bytes")),
                at: Timestamp(i64::from_be_bytes(job[20..28].try_into().expect("8 bytes"))),
            })
            .collect();
        Ok(Self {
            tenant_id,
            from: Timestamp(i64_at(17)),
            seen,
        })
    }

    /// The opaque text a client holds: binary, in URL-safe base64.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(HEADER + JOB * self.seen.len());
        bytes.push(VERSION);
        bytes.extend_from_slice(self.tenant_id.as_bytes());
        bytes.extend_from_slice(&self.from.micros().to_be_bytes());
        for job in &self.seen {
            bytes.extend_from_slice(job.job_id.as_bytes());
            bytes.extend_from_slice(&job.seq.to_be_bytes());
            bytes.extend_from_slice(&job.at.micros().to_be_bytes());
        }
        URL_SAFE_NO_PAD.encode(bytes)
    }
}

/// One page of the tenant's events stamped at or after `from`, in the stable order
/// (`at`, `job_id`, `seq`), after the event `after` when given (the last one of the
/// previous page).
pub async fn stored_page(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    from: Timestamp,
    after: Option<&job_events::Model>,
) -> Result<Vec<job_events::Model>, DbErr> {
    use job_events::Column;
    let mut query = job_events::Entity::find()
        .filter(Column::TenantId.eq(tenant_id))
        .filter(Column::At.gte(from));
    if let Some(last) = after {
        query = query.filter(
            Condition::any().add(Column::At.gt(last.at)).add(
                Condition::all().add(Column::At.eq(last.at)).add(
                    Condition::any().add(Column::JobId.gt(last.job_id)).add(
                        Condition::all()
                            .add(Column::JobId.eq(last.job_id))
                            .add(Column::Seq.gt(last.seq)),
                    ),
                ),
            ),
        );
    }
    query
        .order_by_asc(Column::At)
        .order_by_asc(Column::JobId)
        .order_by_asc(Column::Seq)
        .limit(CATCH_UP_PAGE)
        .all(db)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(tenant_id: Uuid) -> Cursor {
        Cursor {
            tenant_id,
            from: Timestamp(1_764_626_400_000_000),
            seen: vec![SeenJob {
                job_id: Uuid::now_v7(),
                seq: 7,
                at: Timestamp(1_764_626_401_000_000),
            }],
        }
    }

    #[test]
    fn a_cursor_reads_back_as_written_for_its_tenant_only() {
        let tenant = Uuid::now_v7();
        let written = cursor(tenant);
        let text = written.encode();
        assert_eq!(Cursor::parse(&text, tenant).unwrap(), written);
        assert!(Cursor::parse(&text, Uuid::now_v7()).is_err());
    }

    #[test]
    fn anything_else_is_refused() {
        let text = cursor(Uuid::nil()).encode();
        for bad in ["", "not a cursor", &text[..text.len() - 3], "AAAA"] {
            assert!(Cursor::parse(bad, Uuid::nil()).is_err(), "{bad}");
        }
    }
}
