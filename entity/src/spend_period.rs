use crate::Timestamp;
use chrono::{Datelike, NaiveTime};

/// A period a spend cap covers, in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpendPeriod {
    Day,
    Month,
}

impl SpendPeriod {
    /// The first instant of the period that contains `at`.
    pub fn start_of(self, at: Timestamp) -> Timestamp {
        let date = at.to_datetime().date_naive();
        let first_day = match self {
            Self::Day => date,
            Self::Month => date.with_day(1).unwrap_or(date),
        };
        Timestamp::from(first_day.and_time(NaiveTime::MIN).and_utc())
    }

    /// The name clients see in `extensions.period`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "DAY",
            Self::Month => "MONTH",
        }
    }
}
