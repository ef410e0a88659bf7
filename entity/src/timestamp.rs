use chrono::{DateTime, TimeZone, Utc};
use sea_orm::DeriveValueType;
use serde::{Deserialize, Serialize};

/// A UTC instant stored as BIGINT microseconds since the Unix epoch.
///
/// SQLite keeps chrono timestamps as text whose fractional digits vary in length, so a
/// string comparison in SQL can order them wrongly; an integer never does.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    DeriveValueType,
)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The current instant, truncated to microseconds.
    pub fn now() -> Self {
        Self::from(Utc::now())
    }

    /// Microseconds since the Unix epoch.
    pub fn micros(self) -> i64 {
        self.0
    }

    /// This instant moved by `duration` (negative durations move it back).
    pub fn plus(self, duration: chrono::Duration) -> Self {
        Self(
            // A duration too long for microseconds saturates in its own direction: a
            // huge step back must not wrap into the far future.
            self.0.saturating_add(duration.num_microseconds().unwrap_or(
                if duration < chrono::Duration::zero() {
                    i64::MIN
                } else {
                    i64::MAX
                },
            )),
        )
    }

    /// The instant as a chrono value.
    pub fn to_datetime(self) -> DateTime<Utc> {
        Utc.timestamp_micros(self.0)
            .single()
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(value: DateTime<Utc>) -> Self {
        Self(value.timestamp_micros())
    }
}

impl From<Timestamp> for DateTime<Utc> {
    fn from(value: Timestamp) -> Self {
        value.to_datetime()
    }
}
