//! The dashboards' figures computed here, independently, from every row read back
//! through SeaORM.

use super::{credits, status_name};
use crate::helpers::{TestApp, decimal};
use chrono::{DateTime, Utc};
use entity::{AttemptOutcome, JobStatus, attempts, charges, jobs};
use rust_decimal::{Decimal, RoundingStrategy};
use sea_orm::{EntityTrait, QueryOrder};
use serde_json::Value;
use std::collections::BTreeMap;
use uuid::Uuid;

/// Every row the dashboards are computed from, read back through SeaORM.
pub(super) struct Rows {
    pub(super) jobs: Vec<jobs::Model>,
    pub(super) attempts: Vec<attempts::Model>,
    pub(super) charges: Vec<charges::Model>,
}

impl Rows {
    pub(super) async fn load(app: &TestApp) -> Self {
        let db = &app.app.db;
        Self {
            jobs: jobs::Entity::find()
                .order_by_desc(jobs::Column::Id)
                .all(db)
                .await
                .unwrap(),
            attempts: attempts::Entity::find().all(db).await.unwrap(),
            charges: charges::Entity::find().all(db).await.unwrap(),
        }
    }

    pub(super) fn attempts_of(&self, job_id: Uuid) -> impl Iterator<Item = &attempts::Model> {
        self.attempts
            .iter()
            .filter(move |attempt| attempt.job_id == job_id)
    }

    pub(super) fn charge_of(&self, job_id: Uuid) -> i64 {
        self.charges
            .iter()
            .filter(|charge| charge.job_id == job_id)
            .map(|charge| charge.amount_nanos)
            .sum()
    }

    /// The jobs `include` picks, newest first.
    pub(super) fn jobs_where(&self, include: impl Fn(&jobs::Model) -> bool) -> Vec<&jobs::Model> {
        self.jobs.iter().filter(|job| include(job)).collect()
    }

    /// Checks one `jobCosts` node against the job's rows.
    pub(super) fn assert_cost_line(&self, node: &Value) {
        let id: Uuid = node["jobId"].as_str().unwrap().parse().unwrap();
        let job = self.jobs.iter().find(|job| job.id == id).unwrap();
        let attempts: Vec<_> = self.attempts_of(id).collect();
        let exact: i64 = attempts.iter().filter_map(|a| a.provider_cost_nanos).sum();
        let bounds: i64 = attempts
            .iter()
            .filter(|a| a.provider_cost_nanos.is_none())
            .filter_map(|a| a.provider_cost_upper_bound_nanos)
            .sum();
        let charge = self.charge_of(id);
        assert_eq!(node["model"], job.model.as_str(), "{node}");
        assert_eq!(node["status"], status_name(job.status), "{node}");
        assert_eq!(node["attempts"], attempts.len(), "{node}");
        assert_eq!(decimal(&node["providerCost"]), credits(exact), "{node}");
        assert_eq!(
            decimal(&node["providerCostUpperBound"]),
            credits(exact + bounds),
            "{node}"
        );
        assert_eq!(decimal(&node["customerCharge"]), credits(charge), "{node}");
        assert_eq!(decimal(&node["margin"]), credits(charge - exact), "{node}");
        let created: DateTime<Utc> = node["createdAt"].as_str().unwrap().parse().unwrap();
        assert_eq!(created, job.created_at.to_datetime(), "{node}");
        // Beyond the contract: only in the documents that ask for them.
        if !node["tenantId"].is_null() {
            assert_eq!(node["tenantId"], job.tenant_id.to_string(), "{node}");
            let unknown = attempts
                .iter()
                .filter(|a| a.provider_cost_nanos.is_none())
                .count();
            assert_eq!(node["unknownAttempts"], unknown, "{node}");
            assert_eq!(
                decimal(&node["marginAtWorst"]),
                credits(charge - exact - bounds),
                "{node}"
            );
        }
    }

    /// The summary of `jobs`, added up here.
    pub(super) fn figures(&self, jobs: &[&jobs::Model]) -> Figures {
        let mut figures = Figures::default();
        for job in jobs {
            figures.created += 1;
            match job.status {
                JobStatus::Succeeded => figures.succeeded += 1,
                JobStatus::Failed => figures.failed += 1,
                JobStatus::Cancelled => figures.cancelled += 1,
                JobStatus::Queued | JobStatus::Running => {}
            }
            let attempts: Vec<_> = self.attempts_of(job.id).collect();
            figures.attempts += attempts.len() as i64;
            figures.retries += attempts.len().saturating_sub(1) as i64;
            figures.unknown += attempts
                .iter()
                .filter(|a| a.outcome == AttemptOutcome::Unknown)
                .count() as i64;
            figures.lease_expired += attempts
                .iter()
                .filter(|a| a.outcome == AttemptOutcome::LeaseExpired)
                .count() as i64;
            let cost: i64 = attempts.iter().filter_map(|a| a.provider_cost_nanos).sum();
            let bounds: i64 = attempts
                .iter()
                .filter(|a| a.provider_cost_nanos.is_none())
                .filter_map(|a| a.provider_cost_upper_bound_nanos)
                .sum();
            let charge = self.charge_of(job.id);
            figures.cost += cost;
            figures.bounds += bounds;
            figures.charges += charge;
            let model = figures.by_model.entry(job.model.clone()).or_default();
            model.jobs += 1;
            model.cost += cost;
            model.bounds += bounds;
            model.charges += charge;
        }
        figures
    }
}

#[derive(Debug, Default)]
pub(super) struct ModelFigures {
    pub(super) jobs: i64,
    pub(super) cost: i64,
    pub(super) bounds: i64,
    pub(super) charges: i64,
}

#[derive(Debug, Default)]
pub(super) struct Figures {
    pub(super) created: i64,
    pub(super) succeeded: i64,
    pub(super) failed: i64,
    pub(super) cancelled: i64,
    pub(super) attempts: i64,
    pub(super) retries: i64,
    pub(super) unknown: i64,
    pub(super) lease_expired: i64,
    pub(super) cost: i64,
    pub(super) bounds: i64,
    pub(super) charges: i64,
    pub(super) by_model: BTreeMap<String, ModelFigures>,
}

impl Figures {
    pub(super) fn assert_matches(&self, summary: &Value) {
        assert_eq!(summary["jobsCreated"], self.created, "{summary}");
        assert_eq!(summary["jobsSucceeded"], self.succeeded, "{summary}");
        assert_eq!(summary["jobsFailed"], self.failed, "{summary}");
        assert_eq!(summary["jobsCancelled"], self.cancelled, "{summary}");
        assert_eq!(summary["providerAttempts"], self.attempts, "{summary}");
        let retry_rate = if self.attempts == 0 {
            0.0
        } else {
            self.retries as f64 / self.attempts as f64
        };
        let served = summary["retryRate"].as_f64().unwrap();
        assert!((served - retry_rate).abs() < 1e-12, "{summary}");
        assert_eq!(summary["unknownOutcomes"], self.unknown, "{summary}");
        assert_eq!(summary["leaseExpirations"], self.lease_expired, "{summary}");
        assert_eq!(decimal(&summary["providerCost"]), credits(self.cost));
        // Beyond the contract: only in the documents that ask for it.
        if !summary["providerCostUpperBound"].is_null() {
            assert_eq!(
                decimal(&summary["providerCostUpperBound"]),
                credits(self.cost + self.bounds)
            );
            assert_eq!(
                decimal(&summary["marginAtWorst"]),
                credits(self.charges - self.cost - self.bounds)
            );
        }
        assert_eq!(decimal(&summary["customerCharges"]), credits(self.charges));
        assert_eq!(
            decimal(&summary["margin"]),
            credits(self.charges - self.cost)
        );
        if self.succeeded == 0 {
            assert!(summary["costPerSucceededJob"].is_null(), "{summary}");
        } else {
            let expected = (credits(self.cost) / Decimal::from(self.succeeded))
                .round_dp_with_strategy(9, RoundingStrategy::MidpointAwayFromZero);
            assert_eq!(decimal(&summary["costPerSucceededJob"]), expected);
        }
        let by_model = summary["byModel"].as_array().unwrap();
        let models: Vec<_> = by_model
            .iter()
            .map(|row| row["model"].as_str().unwrap())
            .collect();
        let expected_models: Vec<_> = self.by_model.keys().map(String::as_str).collect();
        assert_eq!(models, expected_models, "sorted by model: {summary}");
        for (row, expected) in by_model.iter().zip(self.by_model.values()) {
            assert_eq!(row["jobs"], expected.jobs, "{row}");
            assert_eq!(
                decimal(&row["providerCost"]),
                credits(expected.cost),
                "{row}"
            );
            assert_eq!(
                decimal(&row["customerCharges"]),
                credits(expected.charges),
                "{row}"
            );
            if !row["margin"].is_null() {
                assert_eq!(
                    decimal(&row["margin"]),
                    credits(expected.charges - expected.cost)
                );
                assert_eq!(
                    decimal(&row["providerCostUpperBound"]),
                    credits(expected.cost + expected.bounds)
                );
                assert_eq!(
                    decimal(&row["marginAtWorst"]),
                    credits(expected.charges - expected.cost - expected.bounds)
                );
            }
        }
    }
}
