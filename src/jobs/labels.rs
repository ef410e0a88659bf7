//! Labels: `key=value` pairs a client puts on a job to find it again (a document id, a
//! user, an upload). They are stored one row each in `job_labels`, whose index on
//! (tenant, key, value, job) makes a page of a tenant's jobs with one label a range
//! scan in the jobs page's order, never a scan of JSON metadata.

use crate::error::ServiceError;
use entity::job_labels;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
};
use serde_json::Value;
use uuid::Uuid;

/// Most labels one job carries.
const MAX_LABELS: usize = 16;
/// Longest label key or value, in characters.
const MAX_LABEL_LENGTH: usize = 128;

/// One label, checked: key and value of 1 to 128 characters with no control or
/// invisible characters, so that a listing shows what a filter matches.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Label {
    key: String,
    value: String,
}

impl Label {
    /// A label from a key and a value, or `Validation` naming what is wrong.
    pub fn parse(key: String, value: String) -> Result<Self, ServiceError> {
        check_part("label key", &key)?;
        check_part(&format!("label {key:?} value"), &value)?;
        Ok(Self { key, value })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn value(&self) -> &str {
        &self.value
    }
}

fn check_part(field: &str, text: &str) -> Result<(), ServiceError> {
    let length = text.chars().count();
    if length == 0 || length > MAX_LABEL_LENGTH {
        return Err(ServiceError::validation(format!(
            "{field} must be 1 to {MAX_LABEL_LENGTH} characters"
        )));
    }
    crate::validation::single_line(field, text)
}

/// A job's labels: at most [`MAX_LABELS`], one value per key, in order of key.
///
/// A key given twice is refused rather than one value silently winning: a client that
/// sends `user=a` and `user=b` means something this model cannot keep, and should
/// hear so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Vec<Label>);

impl Labels {
    /// Labels from `(key, value)` pairs, or `Validation` for the first broken rule.
    pub fn parse(pairs: Vec<(String, String)>) -> Result<Self, ServiceError> {
        if pairs.len() > MAX_LABELS {
            return Err(ServiceError::validation(format!(
                "labels must hold at most {MAX_LABELS} labels"
            )));
        }
        let mut labels = pairs
            .into_iter()
            .map(|(key, value)| Label::parse(key, value))
            .collect::<Result<Vec<_>, _>>()?;
        labels.sort();
        if let Some(pair) = labels.windows(2).find(|pair| pair[0].key == pair[1].key) {
            return Err(ServiceError::validation(format!(
                "labels name the key {:?} more than once; a job has one value per key",
                pair[0].key
            )));
        }
        Ok(Self(labels))
    }

    /// The labels stored for a job, which were checked when it was created.
    pub fn of_rows(rows: Vec<job_labels::Model>) -> Self {
        let mut labels: Vec<Label> = rows
            .into_iter()
            .map(|row| Label {
                key: row.key,
                value: row.value,
            })
            .collect();
        labels.sort();
        Self(labels)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Label> {
        self.0.iter()
    }

    /// The labels as they count in a request's fingerprint: `[[key, value], …]` by key.
    pub fn to_json(&self) -> Value {
        self.0
            .iter()
            .map(|label| Value::from(vec![label.key.clone(), label.value.clone()]))
            .collect()
    }
}

/// Writes a new job's labels, in one statement, inside the transaction that creates it.
pub async fn write(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_id: Uuid,
    labels: &Labels,
) -> Result<(), sea_orm::DbErr> {
    if labels.is_empty() {
        return Ok(());
    }
    let rows = labels.0.iter().map(|label| job_labels::ActiveModel {
        job_id: Set(job_id),
        tenant_id: Set(tenant_id),
        key: Set(label.key.clone()),
        value: Set(label.value.clone()),
    });
    job_labels::Entity::insert_many(rows)
        .exec_without_returning(db)
        .await?;
    Ok(())
}

/// The labels of a tenant's jobs among `job_ids`, each job's in order of key. The
/// tenant is part of the query, so another tenant's job id finds nothing.
pub async fn labels_of_jobs(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_ids: &[Uuid],
) -> Result<Vec<job_labels::Model>, ServiceError> {
    Ok(job_labels::Entity::find()
        .filter(job_labels::Column::TenantId.eq(tenant_id))
        .filter(job_labels::Column::JobId.is_in(job_ids.iter().copied()))
        .order_by_asc(job_labels::Column::JobId)
        .order_by_asc(job_labels::Column::Key)
        .all(db)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: &str, value: &str) -> (String, String) {
        (key.to_owned(), value.to_owned())
    }

    #[test]
    fn labels_come_in_order_of_key() {
        let labels = Labels::parse(vec![pair("user", "u1"), pair("doc", "d1")]).unwrap();
        assert_eq!(
            labels.to_json(),
            serde_json::json!([["doc", "d1"], ["user", "u1"]])
        );
    }

    #[test]
    fn bad_labels_are_refused_with_a_reason() {
        let long = "x".repeat(MAX_LABEL_LENGTH + 1);
        let cases = [
            (vec![pair("", "v")], "1 to 128"),
            (vec![pair("k", "")], "1 to 128"),
            (vec![pair(&long, "v")], "1 to 128"),
            (vec![pair("k", &long)], "1 to 128"),
            (vec![pair("k\u{0}", "v")], "control"),
            (vec![pair("k", "a\nb")], "control"),
            (vec![pair("k", "a\u{200B}b")], "invisible"),
            (vec![pair("k", "a"), pair("k", "b")], "more than once"),
            (
                (0..=MAX_LABELS)
                    .map(|n| pair(&format!("k{n}"), "v"))
                    .collect(),
                "at most 16",
            ),
        ];
        for (pairs, reason) in cases {
            match Labels::parse(pairs.clone()) {
                Err(ServiceError::Validation(message)) => {
                    assert!(message.contains(reason), "{message:?} should say {reason}")
                }
                other => panic!("{pairs:?} should be refused, got {other:?}"),
            }
        }
        let longest = "x".repeat(MAX_LABEL_LENGTH);
        assert!(Labels::parse(vec![pair(&longest, &longest)]).is_ok());
    }
}
