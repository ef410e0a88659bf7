//! Which of a tenant's jobs a caller reaches: a tenant's own key reaches them all; an
//! access token only those carrying its labels, or those it was minted for.
//!
//! A job out of reach is `NotFound`, never `Forbidden`: a browser must not learn
//! which of its tenant's ids exist.

use super::input::{IdempotencyKey, scoped_key, unscoped_key};
use super::labels::{Label, Labels};
use crate::error::ServiceError;
use entity::job_labels;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, PaginatorTrait, QueryFilter};
use uuid::Uuid;

/// The jobs of its tenant a caller may see and act on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum JobReach {
    /// Every job of the tenant.
    #[default]
    All,
    /// The jobs carrying every one of these labels (never empty).
    Labelled(Labels),
    /// These jobs alone (sorted, without repeats).
    Listed(Vec<Uuid>),
}

impl JobReach {
    /// Whether the tenant's job `job_id` is within reach.
    pub async fn admits(
        &self,
        db: &impl ConnectionTrait,
        tenant_id: Uuid,
        job_id: Uuid,
    ) -> Result<bool, DbErr> {
        match self {
            Self::All => Ok(true),
            Self::Listed(ids) => Ok(ids.binary_search(&job_id).is_ok()),
            Self::Labelled(labels) => {
                // A job has one value per key, so it carries every label exactly when
                // as many of its rows match as there are labels.
                let mut matching = job_labels::Entity::find()
                    .filter(job_labels::Column::TenantId.eq(tenant_id))
                    .filter(job_labels::Column::JobId.eq(job_id));
                let mut any = sea_orm::Condition::any();
                for label in labels.iter() {
                    any = any.add(
                        sea_orm::Condition::all()
                            .add(job_labels::Column::Key.eq(label.key()))
                            .add(job_labels::Column::Value.eq(label.value())),
                    );
                }
                matching = matching.filter(any);
                Ok(matching.count(db).await? == labels.len() as u64)
            }
        }
    }

    /// `NotFound` unless the tenant's job `job_id` is within reach.
    pub async fn require(
        &self,
        db: &impl ConnectionTrait,
        tenant_id: Uuid,
        job_id: Uuid,
    ) -> Result<(), ServiceError> {
        if self.admits(db, tenant_id, job_id).await? {
            Ok(())
        } else {
            Err(ServiceError::NotFound)
        }
    }

    /// The labels a job created within this reach carries: the client's `requested`
    /// ones and the reach's own, so that the creator can see what it created. A
    /// requested label naming one of the reach's keys with another value is
    /// `Validation`: the job would be out of reach the moment it was made.
    pub fn stamp(
        &self,
        mut requested: Vec<(String, String)>,
    ) -> Result<Vec<(String, String)>, ServiceError> {
        let Self::Labelled(labels) = self else {
            return Ok(requested);
        };
        for label in labels.iter() {
            match requested.iter().find(|(key, _)| key == label.key()) {
                Some((_, value)) if value == label.value() => {}
                Some((key, _)) => {
                    return Err(ServiceError::validation(format!(
                        "label {key:?} must be {:?}: this token creates jobs with that label",
                        label.value()
                    )));
                }
                None => requested.push((label.key().to_owned(), label.value().to_owned())),
            }
        }
        Ok(requested)
    }

    /// The key a client of this reach sent, in the form it is parsed in: a labelled
    /// token may send back the stored form that answers show it.
    pub fn sent_key(&self, key: String) -> String {
        match self {
            Self::Labelled(labels) => unscoped_key(labels, key),
            Self::All | Self::Listed(_) => key,
        }
    }

    /// The stored form of a key the caller created a job with. A labelled token's keys
    /// live in a namespace of its labels: sharing the tenant's one, a token could
    /// learn which keys of other users exist (a conflict answers) and take a key
    /// another user's page is about to send.
    pub fn own_key(&self, key: IdempotencyKey) -> IdempotencyKey {
        match self {
            Self::Labelled(labels) => key.within(labels),
            Self::All | Self::Listed(_) => key,
        }
    }

    /// The stored keys a lookup by `key` tries, in order: a labelled token's own
    /// namespace first, then the tenant's (a job its backend created with the token's
    /// labels is within reach as well).
    pub fn lookup_keys(&self, key: String) -> Vec<String> {
        match self {
            Self::Labelled(labels) => {
                let key = unscoped_key(labels, key);
                vec![scoped_key(labels, &key), key]
            }
            Self::All | Self::Listed(_) => vec![key],
        }
    }

    /// The labels a listing within this reach must match besides `also` (the
    /// client's own filter); `None` when they contradict, so that nothing matches.
    pub fn labels_with(&self, also: Option<Label>) -> Option<Vec<Label>> {
        let mut all: Vec<Label> = match self {
            Self::Labelled(labels) => labels.iter().cloned().collect(),
            Self::All | Self::Listed(_) => Vec::new(),
        };
        if let Some(also) = also {
            match all.iter().find(|label| label.key() == also.key()) {
                Some(same) if same == &also => {}
                Some(_) => return None,
                None => all.push(also),
            }
        }
        Some(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(pairs: &[(&str, &str)]) -> JobReach {
        JobReach::Labelled(
            Labels::parse(
                pairs
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                    .collect(),
            )
            .unwrap(),
        )
    }

    fn pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn a_created_job_gets_the_reach_labels() {
        let reach = labelled(&[("user", "u1")]);
        assert_eq!(
            reach.stamp(pairs(&[("doc", "d1")])).unwrap(),
            pairs(&[("doc", "d1"), ("user", "u1")])
        );
        assert_eq!(
            reach.stamp(pairs(&[("user", "u1")])).unwrap(),
            pairs(&[("user", "u1")])
        );
        assert!(matches!(
            reach.stamp(pairs(&[("user", "u2")])),
            Err(ServiceError::Validation(_))
        ));
        assert_eq!(
            JobReach::All.stamp(pairs(&[("user", "u2")])).unwrap(),
            pairs(&[("user", "u2")])
        );
    }

    #[test]
    fn a_filter_contradicting_the_reach_matches_nothing() {
        let reach = labelled(&[("user", "u1")]);
        let label = |key: &str, value: &str| Label::parse(key.into(), value.into()).unwrap();
        assert_eq!(reach.labels_with(Some(label("user", "u2"))), None);
        assert_eq!(
            reach.labels_with(Some(label("user", "u1"))),
            Some(vec![label("user", "u1")])
        );
        assert_eq!(
            reach.labels_with(Some(label("doc", "d"))),
            Some(vec![label("user", "u1"), label("doc", "d")])
        );
        assert_eq!(JobReach::All.labels_with(None), Some(vec![]));
    }
}
