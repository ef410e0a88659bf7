//! Fallback models: the models a job tries, in order, after its own when that one is
//! rate limited, paused or failing.
//!
//! A job's chain is its own model and then the fallbacks its `createJob` named. Which
//! model the next attempt calls is decided here, by [`ModelChain::next`], from the
//! model just called and the models paused at that moment: the chain is walked round
//! from the model after the one just called (wrapping to the job's own model after
//! the last), and the first model not paused takes the next attempt. So a job goes
//! down its chain one model per failure or wait, and comes back to its own model after
//! the last fallback, rather than staying on a model that just failed. When every
//! other model is paused too, the one whose pause ends first is taken, and the job
//! waits for that pause alone.

use crate::error::ServiceError;
use entity::{JsonText, Timestamp, jobs};

/// Most fallback models one job may name: each is one more model the hold is sized
/// for and one more price and route checked at create; four cover every provider a
/// deployment is likely to route one request to.
pub const MAX_FALLBACK_MODELS: usize = 4;

/// A job's models in the order they are tried: its own first, then its fallbacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelChain(Vec<String>);

/// The model the next attempt calls when it is not the one just called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextModel {
    pub model: String,
    /// Until when the model is paused, if every model of the chain is: the next
    /// attempt waits for that.
    pub paused_until: Option<Timestamp>,
}

impl ModelChain {
    /// The chain of a job whose own model is `model`, with `fallbacks` after it.
    pub fn new(model: String, fallbacks: Vec<String>) -> Self {
        let mut models = Vec::with_capacity(1 + fallbacks.len());
        models.push(model);
        models.extend(fallbacks);
        Self(models)
    }

    /// The chain stored with `job`. A job without one (no fallbacks, or written before
    /// fallbacks existed) has its model alone.
    pub fn of_job(job: &jobs::Model) -> Self {
        Self::stored(job.model.clone(), job.model_chain.as_ref())
    }

    /// The chain of a job row whose `model` and `model_chain` columns hold these.
    pub fn stored(model: String, chain: Option<&JsonText>) -> Self {
        chain
            .and_then(|chain| serde_json::from_value::<Vec<String>>(chain.0.clone()).ok())
            .filter(|models| !models.is_empty())
            .map_or_else(|| Self(vec![model]), Self)
    }

    /// The job's own model, the one its `createJob` named.
    pub fn own(&self) -> &str {
        &self.0[0]
    }

    /// The fallback models, in order.
    pub fn fallbacks(&self) -> &[String] {
        &self.0[1..]
    }

    /// Every model, the job's own first.
    pub fn models(&self) -> &[String] {
        &self.0
    }

    /// What the job row stores: `None` without fallbacks, so that such a job reads as
    /// every job did before fallbacks existed.
    pub fn to_column(&self) -> Option<JsonText> {
        (self.0.len() > 1).then(|| JsonText(serde_json::json!(self.0)))
    }

    /// The model the next attempt calls after an attempt of `current` that did not
    /// end the job, given the pauses in force at `now` (`paused`: model and until
    /// when; the pause the attempt just caused included). `None`: the next attempt
    /// calls `current` again, with the usual backoff — the chain has nothing else, or
    /// everything else is paused longer.
    pub fn next(
        &self,
        current: &str,
        paused: &[(String, Timestamp)],
        now: Timestamp,
    ) -> Option<NextModel> {
        if self.0.len() < 2 {
            return None;
        }
        let paused_until = |model: &str| {
            paused
                .iter()
                .filter(|(paused, until)| paused == model && *until > now)
                .map(|(_, until)| *until)
                .max()
        };
        // From the model after the current one round to the current one itself; a
        // current model not in the chain (the chain is read afresh) starts at the top.
        let start = self.0.iter().position(|model| model == current);
        let order = (1..=self.0.len()).map(|step| {
            let index = start.map_or(step - 1, |start| (start + step) % self.0.len());
            &self.0[index]
        });
        let mut soonest: Option<(&String, Timestamp)> = None;
        for model in order {
            match paused_until(model) {
                None => {
                    return (model != current).then(|| NextModel {
                        model: model.clone(),
                        paused_until: None,
                    });
                }
                Some(until) => {
                    if soonest.is_none_or(|(_, earliest)| until < earliest) {
                        soonest = Some((model, until));
                    }
                }
            }
        }
        let (model, until) = soonest?;
        (model != current).then(|| NextModel {
            model: model.clone(),
            paused_until: Some(until),
        })
    }
}

/// `fallbackModels` of a job whose own model is `model`: each a model name (trimmed,
/// not empty, one line), none repeated nor the job's own, at most
/// [`MAX_FALLBACK_MODELS`]. Whether each is routed and priced is checked at create.
pub fn parse_fallback_models(
    model: &str,
    fallbacks: Vec<String>,
) -> Result<Vec<String>, ServiceError> {
    if fallbacks.len() > MAX_FALLBACK_MODELS {
        return Err(ServiceError::validation(format!(
            "fallbackModels names {} models; at most {MAX_FALLBACK_MODELS} are accepted",
            fallbacks.len()
        )));
    }
    let mut parsed: Vec<String> = Vec::with_capacity(fallbacks.len());
    for fallback in fallbacks {
        let fallback = super::input::parse_model(fallback)
            .map_err(|_| ServiceError::validation("fallbackModels must hold model names"))?;
        if fallback == model {
            return Err(ServiceError::validation(format!(
                "fallbackModels names the job's own model {fallback:?}"
            )));
        }
        if parsed.contains(&fallback) {
            return Err(ServiceError::validation(format!(
                "fallbackModels names {fallback:?} twice"
            )));
        }
        parsed.push(fallback);
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(models: &[&str]) -> ModelChain {
        ModelChain::new(
            models[0].to_owned(),
            models[1..]
                .iter()
                .map(|model| (*model).to_owned())
                .collect(),
        )
    }

    const NOW: Timestamp = Timestamp(1_000_000_000);

    fn later(seconds: i64) -> Timestamp {
        Timestamp(NOW.0 + seconds * 1_000_000)
    }

    /// Which model the next attempt calls after one of `current` (`None`: the same
    /// one), and until when it is paused.
    #[test]
    fn the_next_attempt_walks_the_chain_round_past_paused_models() {
        type Case<'a> = (
            &'a [&'a str],
            &'a str,
            &'a [(&'a str, i64)],
            Option<(&'a str, Option<i64>)>,
            &'a str,
        );
        let cases: &[Case] = &[
            (&["a"], "a", &[], None, "no fallbacks: the same model"),
            (
                &["a"],
                "a",
                &[("a", 30)],
                None,
                "no fallbacks: wait for the pause",
            ),
            (
                &["a", "b", "c"],
                "a",
                &[],
                Some(("b", None)),
                "a failure moves down",
            ),
            (
                &["a", "b", "c"],
                "b",
                &[],
                Some(("c", None)),
                "a fallback failing moves down",
            ),
            (
                &["a", "b", "c"],
                "c",
                &[],
                Some(("a", None)),
                "after the last, the own model",
            ),
            (
                &["a", "b", "c"],
                "a",
                &[("a", 600)],
                Some(("b", None)),
                "a rate limit moves on without waiting",
            ),
            (
                &["a", "b", "c"],
                "a",
                &[("a", 600), ("b", 60)],
                Some(("c", None)),
                "a paused fallback is passed over",
            ),
            (
                &["a", "b", "c"],
                "c",
                &[("a", 60)],
                Some(("b", None)),
                "a paused own model too",
            ),
            (
                &["a", "b"],
                "a",
                &[("b", 60)],
                None,
                "the rest is paused and the model is not: the same model",
            ),
            (
                &["a", "b", "c"],
                "a",
                &[("a", 600), ("b", 60), ("c", 30)],
                Some(("c", Some(30))),
                "all paused: the soonest free",
            ),
            (
                &["a", "b"],
                "a",
                &[("a", 10), ("b", 60)],
                None,
                "all paused, the model itself soonest: the same model",
            ),
            (
                &["a", "b"],
                "a",
                &[("b", -5)],
                Some(("b", None)),
                "a pause that is over does not count",
            ),
            (
                &["a", "b", "c"],
                "gone",
                &[],
                Some(("a", None)),
                "a model not in the chain starts it again",
            ),
        ];
        for (models, current, paused, expected, why) in cases {
            let paused: Vec<(String, Timestamp)> = paused
                .iter()
                .map(|(model, seconds)| ((*model).to_owned(), later(*seconds)))
                .collect();
            let next = chain(models).next(current, &paused, NOW);
            let expected = expected.map(|(model, until)| NextModel {
                model: model.to_owned(),
                paused_until: until.map(later),
            });
            assert_eq!(next, expected, "{why}");
        }
    }

    #[test]
    fn fallbacks_are_distinct_names_other_than_the_model_and_few() {
        let names = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect();
        assert_eq!(
            parse_fallback_models("a", names(&[" b ", "c"])).unwrap(),
            ["b", "c"]
        );
        assert!(parse_fallback_models("a", Vec::new()).unwrap().is_empty());
        for (fallbacks, says) in [
            (names(&["b", "b"]), "twice"),
            (names(&["a"]), "own model"),
            (names(&["  "]), "model names"),
            (names(&["b", "c", "d", "e", "f"]), "at most 4"),
        ] {
            match parse_fallback_models("a", fallbacks) {
                Err(ServiceError::Validation(message)) => {
                    assert!(message.contains(says), "{message:?} should say {says}")
                }
                other => panic!("expected a validation error saying {says}, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_chain_is_stored_only_with_fallbacks() {
        assert_eq!(chain(&["a"]).to_column(), None);
        let stored = chain(&["a", "b"]).to_column().unwrap();
        assert_eq!(stored.0, serde_json::json!(["a", "b"]));
    }
}
