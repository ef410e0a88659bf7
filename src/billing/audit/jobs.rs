//! Each job against its reservation, its charge and its ledger entries, a page of
//! jobs at a time; and reservations or charges whose job does not exist.

use super::report::{Invariant, Recorder, Subject, VIOLATIONS_SHOWN, Violation, credits};
use entity::{
    AttemptOutcome, JobStatus, LedgerEntryKind, ReservationStatus, attempts, charges,
    credit_reservations, jobs, ledger_entries,
};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, FromQueryResult, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use std::collections::HashMap;
use uuid::Uuid;

#[derive(FromQueryResult)]
struct JobRow {
    id: Uuid,
    tenant_id: Uuid,
    status: JobStatus,
}

/// A job's ledger entries of one kind.
#[derive(Clone, Copy, Debug, Default)]
struct EntryTotal {
    count: i64,
    total: i64,
}

#[derive(FromQueryResult)]
struct JobKindTotal {
    job_id: Uuid,
    kind: LedgerEntryKind,
    count: i64,
    total: i64,
}

#[derive(FromQueryResult)]
struct AttemptRow {
    id: Uuid,
    job_id: Uuid,
    outcome: AttemptOutcome,
    customer_charge_nanos: Option<i64>,
}

/// What a job's attempts charge the customer, summed.
#[derive(Debug, FromQueryResult)]
struct AttemptChargeTotal {
    job_id: Uuid,
    total: i64,
}

pub(super) async fn audit_jobs(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page_size: u64,
) -> Result<(), DbErr> {
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::Id)
            .column(jobs::Column::TenantId)
            .column(jobs::Column::Status)
            .order_by_asc(jobs::Column::Id)
            .limit(page_size);
        if let Some(after) = after {
            query = query.filter(jobs::Column::Id.gt(after));
        }
        let page = query.into_model::<JobRow>().all(db).await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some(last.id);
        audit_job_page(db, recorder, &page).await?;
        if (page.len() as u64) < page_size {
            return Ok(());
        }
    }
}

async fn audit_job_page(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page: &[JobRow],
) -> Result<(), DbErr> {
    let ids: Vec<Uuid> = page.iter().map(|job| job.id).collect();
    let mut reservations: HashMap<Uuid, Vec<credit_reservations::Model>> = HashMap::new();
    for reservation in credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.is_in(ids.iter().copied()))
        .all(db)
        .await?
    {
        reservations
            .entry(reservation.job_id)
            .or_default()
            .push(reservation);
    }
    let mut job_charges: HashMap<Uuid, Vec<charges::Model>> = HashMap::new();
    for charge in charges::Entity::find()
        .filter(charges::Column::JobId.is_in(ids.iter().copied()))
        .all(db)
        .await?
    {
        job_charges.entry(charge.job_id).or_default().push(charge);
    }
    let mut entries: HashMap<(Uuid, LedgerEntryKind), EntryTotal> = HashMap::new();
    for row in ledger_entries::Entity::find()
        .select_only()
        .column(ledger_entries::Column::JobId)
        .column(ledger_entries::Column::Kind)
        .column_as(
            Expr::col(ledger_entries::Column::Id)
                .count()
                .cast_as("BIGINT"),
            "count",
        )
        .column_as(
            Expr::col(ledger_entries::Column::AmountNanos)
                .sum()
                .cast_as("BIGINT"),
            "total",
        )
        .filter(ledger_entries::Column::JobId.is_in(ids.iter().copied()))
        .group_by(ledger_entries::Column::JobId)
        .group_by(ledger_entries::Column::Kind)
        .into_model::<JobKindTotal>()
        .all(db)
        .await?
    {
        entries.insert(
            (row.job_id, row.kind),
            EntryTotal {
                count: row.count,
                total: row.total,
            },
        );
    }
    let charged_attempt_ids: Vec<Uuid> = job_charges
        .values()
        .flatten()
        .map(|charge| charge.attempt_id)
        .collect();
    let charged_attempts: HashMap<Uuid, AttemptRow> = if charged_attempt_ids.is_empty() {
        HashMap::new()
    } else {
        attempts::Entity::find()
            .select_only()
            .column(attempts::Column::Id)
            .column(attempts::Column::JobId)
            .column(attempts::Column::Outcome)
            .column(attempts::Column::CustomerChargeNanos)
            .filter(attempts::Column::Id.is_in(charged_attempt_ids))
            .into_model::<AttemptRow>()
            .all(db)
            .await?
            .into_iter()
            .map(|attempt| (attempt.id, attempt))
            .collect()
    };

    let attempt_charges: HashMap<Uuid, i64> = attempts::Entity::find()
        .select_only()
        .column(attempts::Column::JobId)
        .column_as(
            Expr::col(attempts::Column::CustomerChargeNanos)
                .sum()
                .cast_as("BIGINT"),
            "total",
        )
        .filter(attempts::Column::JobId.is_in(ids.iter().copied()))
        .group_by(attempts::Column::JobId)
        .into_model::<AttemptChargeTotal>()
        .all(db)
        .await?
        .into_iter()
        .map(|row| (row.job_id, row.total))
        .collect();

    for invariant in [
        Invariant::ReservationMatchesJobStatus,
        Invariant::OneReservationPerJob,
        Invariant::ChargeMatchesAttempts,
    ] {
        recorder.checked(invariant, page.len() as u64);
    }
    for job in page {
        let subject = Subject::Job(job.id);
        let found = reservations.get(&job.id).map_or(&[][..], Vec::as_slice);
        recorder.checked(Invariant::ReservationAmountsConsistent, found.len() as u64);
        recorder.checked(Invariant::ReservationResolvedOnce, found.len() as u64);
        let reservation = match found {
            [] => {
                recorder.violation(
                    Invariant::OneReservationPerJob,
                    subject,
                    "has no credit reservation",
                );
                None
            }
            [reservation] => Some(reservation),
            many => {
                recorder.violation(
                    Invariant::OneReservationPerJob,
                    subject,
                    format!("has {} credit reservations", many.len()),
                );
                None
            }
        };
        if let Some(reservation) = reservation {
            if reservation.tenant_id != job.tenant_id {
                recorder.violation(
                    Invariant::OneReservationPerJob,
                    subject,
                    format!(
                        "its reservation {} belongs to tenant {}, the job to tenant {}",
                        reservation.id, reservation.tenant_id, job.tenant_id
                    ),
                );
            }
            check_reservation_amounts(recorder, subject, reservation);
            check_reservation_entries(recorder, subject, reservation, &entries);
            check_reservation_status(recorder, subject, job.status, reservation);
        }
        let charges = job_charges.get(&job.id).map_or(&[][..], Vec::as_slice);
        let attempts_charged = attempt_charges.get(&job.id).copied().unwrap_or(0);
        check_charges(
            recorder,
            job,
            reservation,
            charges,
            attempts_charged,
            &charged_attempts,
        );
    }
    Ok(())
}

fn check_reservation_amounts(
    recorder: &mut Recorder,
    subject: Subject,
    reservation: &credit_reservations::Model,
) {
    let amount = reservation.amount_nanos;
    let settled = reservation.settled_amount_nanos;
    let released = reservation.released_amount_nanos;
    let shown = format!(
        "{:?} reservation of {}: settled {}, released {}",
        reservation.status,
        credits(amount),
        credits(settled),
        credits(released)
    );
    let problem = if amount < 0 || settled < 0 || released < 0 {
        Some("an amount is negative")
    } else {
        match reservation.status {
            ReservationStatus::Held if settled != 0 || released != 0 => {
                Some("an open hold has settled or released something")
            }
            ReservationStatus::Held => None,
            ReservationStatus::Settled | ReservationStatus::Released if settled > amount => {
                Some("settled above the hold")
            }
            ReservationStatus::Settled | ReservationStatus::Released
                if i128::from(settled) + i128::from(released) != i128::from(amount) =>
            {
                Some("settled + released ≠ the hold")
            }
            ReservationStatus::Released if settled != 0 => {
                Some("a released hold has a settled part")
            }
            ReservationStatus::Settled | ReservationStatus::Released => None,
        }
    };
    if let Some(problem) = problem {
        recorder.violation(
            Invariant::ReservationAmountsConsistent,
            subject,
            format!("{shown}: {problem}"),
        );
    }
}

fn check_reservation_entries(
    recorder: &mut Recorder,
    subject: Subject,
    reservation: &credit_reservations::Model,
    entries: &HashMap<(Uuid, LedgerEntryKind), EntryTotal>,
) {
    let entry = |kind| {
        entries
            .get(&(reservation.job_id, kind))
            .copied()
            .unwrap_or_default()
    };
    let (hold, charge, release) = (
        entry(LedgerEntryKind::Hold),
        entry(LedgerEntryKind::Charge),
        entry(LedgerEntryKind::Release),
    );
    let mut problems = Vec::new();
    if hold.count != 1 || hold.total != reservation.amount_nanos {
        problems.push(format!(
            "{} hold entries totalling {} for a hold of {}",
            hold.count,
            credits(hold.total),
            credits(reservation.amount_nanos)
        ));
    }
    // What the ledger must show once the reservation is resolved: one charge entry
    // when settled (even of zero), one release entry when anything was released.
    let (charges_wanted, releases_wanted) = match reservation.status {
        ReservationStatus::Held => (0, 0),
        ReservationStatus::Settled => (1, i64::from(reservation.released_amount_nanos > 0)),
        ReservationStatus::Released => (0, i64::from(reservation.released_amount_nanos > 0)),
    };
    if charge.count > 1 || release.count > 1 {
        problems.push(format!(
            "resolved more than once: {} charge and {} release entries",
            charge.count, release.count
        ));
    } else if charge.count != charges_wanted || release.count != releases_wanted {
        problems.push(format!(
            "a {:?} reservation with {} charge and {} release entries",
            reservation.status, charge.count, release.count
        ));
    }
    if charge.count <= 1
        && release.count <= 1
        && reservation.status != ReservationStatus::Held
        && (charge.total != reservation.settled_amount_nanos
            || release.total != reservation.released_amount_nanos)
    {
        problems.push(format!(
            "ledger charged {} and released {}, the reservation settled {} and released {}",
            credits(charge.total),
            credits(release.total),
            credits(reservation.settled_amount_nanos),
            credits(reservation.released_amount_nanos)
        ));
    }
    if !problems.is_empty() {
        recorder.violation(
            Invariant::ReservationResolvedOnce,
            subject,
            problems.join("; "),
        );
    }
}

fn check_reservation_status(
    recorder: &mut Recorder,
    subject: Subject,
    status: JobStatus,
    reservation: &credit_reservations::Model,
) {
    let wanted: &[ReservationStatus] = match status {
        JobStatus::Succeeded => &[ReservationStatus::Settled],
        JobStatus::Failed | JobStatus::Cancelled => {
            &[ReservationStatus::Released, ReservationStatus::Settled]
        }
        JobStatus::Queued | JobStatus::Running => &[ReservationStatus::Held],
    };
    if !wanted.contains(&reservation.status) {
        recorder.violation(
            Invariant::ReservationMatchesJobStatus,
            subject,
            format!(
                "a {status:?} job's reservation is {:?}, not one of {wanted:?}",
                reservation.status
            ),
        );
    }
}

fn check_charges(
    recorder: &mut Recorder,
    job: &JobRow,
    reservation: Option<&credit_reservations::Model>,
    charges: &[charges::Model],
    attempts_charged: i64,
    charged_attempts: &HashMap<Uuid, AttemptRow>,
) {
    let subject = Subject::Job(job.id);
    let invariant = Invariant::ChargeMatchesAttempts;
    let charges_wanted = match job.status {
        JobStatus::Succeeded => 1,
        JobStatus::Failed | JobStatus::Cancelled => usize::from(attempts_charged > 0),
        JobStatus::Queued | JobStatus::Running => 0,
    };
    if charges.len() != charges_wanted {
        recorder.violation(
            invariant,
            subject,
            format!(
                "a {:?} job whose attempts charged {} has {} charge(s) totalling {}",
                job.status,
                credits(attempts_charged),
                charges.len(),
                credits(charges.iter().map(|charge| charge.amount_nanos).sum())
            ),
        );
        return;
    }
    let [charge] = charges else {
        return;
    };
    let mut problems = Vec::new();
    if let Some(reservation) = reservation {
        if charge.amount_nanos != reservation.settled_amount_nanos {
            problems.push(format!(
                "charge {} ≠ settled amount {}",
                credits(charge.amount_nanos),
                credits(reservation.settled_amount_nanos)
            ));
        }
        let wanted = std::cmp::min(attempts_charged, reservation.amount_nanos);
        if charge.amount_nanos != wanted {
            problems.push(format!(
                "charge {} ≠ the attempts' charges {} capped at the hold {}",
                credits(charge.amount_nanos),
                credits(attempts_charged),
                credits(reservation.amount_nanos)
            ));
        }
    }
    if charge.tenant_id != job.tenant_id {
        problems.push(format!(
            "the charge is on tenant {}, the job of tenant {}",
            charge.tenant_id, job.tenant_id
        ));
    }
    match charged_attempts.get(&charge.attempt_id) {
        Some(attempt) if attempt.job_id != job.id => problems.push(format!(
            "the charged attempt {} belongs to job {}",
            attempt.id, attempt.job_id
        )),
        Some(attempt)
            if job.status == JobStatus::Succeeded
                && attempt.outcome != AttemptOutcome::Succeeded =>
        {
            problems.push(format!(
                "the charged attempt {} is {:?}, not the accepted one",
                attempt.id, attempt.outcome
            ))
        }
        Some(attempt)
            if job.status != JobStatus::Succeeded
                && attempt.customer_charge_nanos.unwrap_or(0) <= 0 =>
        {
            problems.push(format!(
                "the charged attempt {} of a {:?} job charged nothing",
                attempt.id, job.status
            ))
        }
        Some(_) => {}
        None => problems.push(format!(
            "the charged attempt {} does not exist",
            charge.attempt_id
        )),
    }
    if !problems.is_empty() {
        recorder.violation(invariant, subject, problems.join("; "));
    }
}

/// Reservations and charges whose job does not exist (foreign keys forbid them; the
/// audit does not take that on trust).
pub(super) async fn audit_orphans(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
) -> Result<(), DbErr> {
    // NOT EXISTS, not NOT IN: PostgreSQL runs a NOT IN over a subquery that does not
    // fit in memory as a nested loop, which took minutes at 200,000 jobs.
    use sea_orm::sea_query::IntoColumnRef;
    let job_missing = |job_id: sea_orm::sea_query::ColumnRef| {
        Expr::exists(
            Query::select()
                .expr(Expr::val(1))
                .from(jobs::Entity)
                .and_where(Expr::col((jobs::Entity, jobs::Column::Id)).equals(job_id))
                .to_owned(),
        )
        .not()
    };
    let orphans = credit_reservations::Entity::find().filter(job_missing(
        (
            credit_reservations::Entity,
            credit_reservations::Column::JobId,
        )
            .into_column_ref(),
    ));
    let count = orphans.clone().count(db).await?;
    if count > 0 {
        let shown = orphans
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?
            .into_iter()
            .map(|reservation| Violation {
                subject: Subject::Reservation(reservation.id),
                detail: format!(
                    "holds {} for job {}, which does not exist",
                    credits(reservation.amount_nanos),
                    reservation.job_id
                ),
            })
            .collect();
        recorder.violations(Invariant::OneReservationPerJob, count, shown);
    }
    let orphans = charges::Entity::find().filter(job_missing(
        (charges::Entity, charges::Column::JobId).into_column_ref(),
    ));
    let count = orphans.clone().count(db).await?;
    if count > 0 {
        let shown = orphans
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?
            .into_iter()
            .map(|charge| Violation {
                subject: Subject::Charge(charge.id),
                detail: format!(
                    "charges {} for job {}, which does not exist",
                    credits(charge.amount_nanos),
                    charge.job_id
                ),
            })
            .collect();
        recorder.violations(Invariant::ChargeMatchesAttempts, count, shown);
    }
    Ok(())
}
