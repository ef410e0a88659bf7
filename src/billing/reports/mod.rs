//! The billing dashboards: what each job cost at the provider against what the
//! customer paid, a summary over a time window, and the credit ledger.
//!
//! Every figure is computed in the database with aggregate SQL (one grouped query per
//! report; a page of job costs picks its jobs first and adds up only theirs), never by
//! loading a tenant's rows into memory. Sums of BIGINT nano-credits are cast back to
//! BIGINT because PostgreSQL's `SUM(bigint)` is a `numeric`.
//!
//! One definition of a job's cost serves both the `cost` field of a job and the cost
//! dashboard: [`costs_of_jobs`] and [`job_costs`] run the same per-job query.

mod job_costs;
mod ledger;
mod series;
mod summary;

pub use job_costs::{JobCost, costs_of_jobs, job_costs};
pub use ledger::credit_ledger;
pub use series::{
    LabelBilling, MAX_SERIES_POINTS, SeriesInterval, SeriesPoint, billing_by_label, billing_series,
};
pub use summary::{BillingSummary, ModelBilling, billing_summary};

use super::Credits;
use crate::error::ServiceError;
use entity::Timestamp;
use uuid::Uuid;

// The page a list report is asked for, parsed as every list parses it.
use crate::page::unknown_cursor;
pub use crate::page::{Page, PageRequest};

/// Whose figures a report covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportScope {
    /// One tenant's jobs and ledger.
    Tenant(Uuid),
    /// Every tenant's (admins only).
    AllTenants,
}

impl ReportScope {
    fn tenant_id(self) -> Option<Uuid> {
        match self {
            Self::Tenant(tenant_id) => Some(tenant_id),
            Self::AllTenants => None,
        }
    }
}

/// Jobs created in `[from, to)`; either bound may be open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
}

impl Window {
    /// A window; `to` must come after `from` when both are given.
    pub fn new(from: Option<Timestamp>, to: Option<Timestamp>) -> Result<Self, ServiceError> {
        if let (Some(from), Some(to)) = (from, to)
            && to <= from
        {
            return Err(ServiceError::validation("to must be after from"));
        }
        Ok(Self { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_must_not_end_before_it_starts() {
        let at = Timestamp(1_000);
        assert!(Window::new(Some(at), Some(at)).is_err());
        assert!(Window::new(Some(at), Some(Timestamp(999))).is_err());
        assert!(Window::new(Some(at), Some(Timestamp(1_001))).is_ok());
        assert!(Window::new(None, Some(at)).is_ok());
    }
}
