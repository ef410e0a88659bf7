//! The charging policy: what the customer pays for an attempt that did not simply
//! succeed, and how large a job's hold must be to cover every call it may pay for.
//!
//! The provider may bill us for a call whose answer we never used. The rules:
//! - the accepted answer is charged at its usage;
//! - a call that cannot have been billed (never sent, refused with an error status,
//!   cancelled before sending) is never charged;
//! - output already streamed to the client is always charged, whatever became of the
//!   call (invalid output, timeout, lost connection, cancel, shutdown), together with
//!   the prompt it answered: the provider read all of it before the first token;
//! - for a call whose outcome is unknown, and for a call the tenant cancelled while it
//!   ran, the operator chooses: charge only the streamed output and absorb the rest
//!   of the provider's cost ([`UnfinishedCall::DeliveredOutput`], the default for
//!   unknown outcomes), charge the prompt as well ([`UnfinishedCall::Prompt`], the
//!   default for cancels: a provider bills a prompt once it has started on it, and a
//!   free cancel would let a tenant buy calls for nothing, create and cancel again and
//!   again), or pass the call's upper bound on to the customer
//!   ([`UnfinishedCall::CallBound`]);
//! - a call aborted at shutdown charges only what it streamed, whatever the policy:
//!   a restart is the operator's doing.
//!
//! Either way the exposure is bounded: a job makes at most `maxAttempts` paid calls,
//! each within its call bound, so what we may owe the provider for one job is at most
//! `maxAttempts` call bounds (calls aborted at shutdown add at most
//! `jobs::budget::FREE_HAND_BACKS` more, the operator's). The hold covers what the
//! customer may be charged, which follows this policy ([`ChargingPolicy::job_hold`]):
//! one whole call for the answer (or the cancel) that ends the job, and for each
//! other paid call what the policy charges for a call that ended without an accepted
//! answer. What the provider billed beyond the charges is the operator's.

use super::{Credits, ModelPrice};
use crate::llm::TokenUsage;

/// What the customer pays for a call that ended without an accepted answer, beyond
/// the output it streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnfinishedCall {
    /// Only the output already streamed to the client; the operator absorbs the rest.
    DeliveredOutput,
    /// The prompt, estimated as the streamed output's prompt is (one token per four
    /// bytes of the input bound), at the customer's input price — or what streamed,
    /// when that is more; the operator absorbs the output the provider made unseen.
    Prompt,
    /// The call's upper bound at the customer price: every input token and every
    /// allowed output token.
    CallBound,
}

/// The operator's charging choices (`[charging]` in the config file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChargingPolicy {
    /// A call sent whose outcome is unknown: a timeout or a lost connection after
    /// sending, a worker that died during the call.
    pub unknown_outcome: UnfinishedCall,
    /// A call the tenant cancelled while it ran.
    pub cancelled_during_call: UnfinishedCall,
}

impl Default for ChargingPolicy {
    fn default() -> Self {
        Self {
            unknown_outcome: UnfinishedCall::DeliveredOutput,
            cancelled_during_call: UnfinishedCall::Prompt,
        }
    }
}

/// How an attempt ended, as far as the customer's charge is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnding {
    /// The answer was accepted: its usage is charged.
    Accepted(TokenUsage),
    /// The request cannot have been billed.
    NotBilled,
    /// An answer came back and was not accepted (it failed the response schema, or
    /// could not be stored).
    Rejected,
    /// The request was sent and its outcome is unknown.
    Unknown,
    /// The tenant cancelled the job while the call ran.
    CancelledDuringCall,
    /// The worker shut down during the call and handed the job back: a restart is
    /// the operator's doing, so only what streamed is charged, whatever the policy.
    ShutDown,
}

/// One call's upper bound of tokens: what the hold and the unknown-outcome bounds
/// are priced from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallBound {
    pub input_tokens: u64,
    /// The input tokens the provider most likely reports: `input_tokens` when the
    /// prompt was counted with the model's tokenizer, a quarter of the bytes when it
    /// was bounded by bytes. What a prompt charged without reported usage is priced at.
    pub input_estimate: u64,
    pub max_output_tokens: u64,
}

impl CallBound {
    fn usage(self) -> TokenUsage {
        TokenUsage {
            input_tokens: self.input_tokens,
            cached_input_tokens: 0,
            output_tokens: self.max_output_tokens,
        }
    }

    /// This bound kept within `tokens`, the bound the job was held for when it was
    /// created ([`Self::tokens`] of the API's count). A worker counts the prompt by
    /// its own provider's rule, which may count more than the API's (another config,
    /// the built-in simulator); the hold covers only what the API counted, and usage
    /// reported above a bound is cut to it, so the call is bounded by the smaller.
    pub fn within(self, tokens: Option<i64>) -> Self {
        let Some(tokens) = tokens.and_then(|tokens| u64::try_from(tokens).ok()) else {
            return self;
        };
        let input_tokens = self
            .input_tokens
            .min(tokens.saturating_sub(self.max_output_tokens));
        Self {
            input_tokens,
            input_estimate: self.input_estimate.min(input_tokens),
            ..self
        }
    }

    /// Every token the call may use: what a tokens-per-minute limit counts it as.
    pub fn tokens(self) -> i64 {
        i64::try_from(self.input_tokens.saturating_add(self.max_output_tokens)).unwrap_or(i64::MAX)
    }

    /// What the call may cost at the provider at most.
    pub fn provider_cost(self, price: &ModelPrice) -> Credits {
        price.provider_cost(&self.usage())
    }

    /// What the call may cost the customer at most.
    pub fn customer_cost(self, price: &ModelPrice) -> Credits {
        price.customer_charge(&self.usage())
    }

    /// `usage` with each count cut to what this call could use. A provider reporting
    /// more is faulty (or counts something never sent): its figures would break every
    /// bound a hold is sized by.
    pub fn limit(self, usage: TokenUsage) -> TokenUsage {
        let input_tokens = usage.input_tokens.min(self.input_tokens);
        TokenUsage {
            input_tokens,
            cached_input_tokens: usage.cached_input_tokens.min(input_tokens),
            output_tokens: usage.output_tokens.min(self.max_output_tokens),
        }
    }
}

/// Output tokens in streamed text whose exact count the provider never reported: one
/// token per four UTF-8 bytes, rounded up — the usual average for English text, and
/// exactly what the built-in simulator counts.
pub fn estimated_output_tokens(streamed_bytes: u64) -> u64 {
    streamed_bytes.div_ceil(4)
}

impl CallBound {
    /// What a call that streamed `streamed_bytes` of output and then ended without
    /// reporting usage used, by the same estimates: the prompt's, and the streamed
    /// text at one token per four bytes.
    pub fn estimated_delivery(self, streamed_bytes: u64) -> TokenUsage {
        TokenUsage {
            output_tokens: estimated_output_tokens(streamed_bytes),
            ..self.estimated_prompt()
        }
    }

    /// The prompt of a call whose provider never reported usage: the input's
    /// estimate (its tokenizer count, or one token per four bytes).
    pub fn estimated_prompt(self) -> TokenUsage {
        TokenUsage {
            input_tokens: self.input_estimate.min(self.input_tokens),
            cached_input_tokens: 0,
            output_tokens: 0,
        }
    }
}

impl ChargingPolicy {
    /// The most this policy may charge the customer for one paid call of `bound` that
    /// did not end the job: a call that ended without an accepted answer and was
    /// tried again. `streams`: the job streams its output, which is charged whatever
    /// became of the call — as much as a whole call, at most.
    fn unfinished_call_charge(
        &self,
        price: &ModelPrice,
        bound: CallBound,
        streams: bool,
    ) -> Credits {
        let whole_call = bound.customer_cost(price);
        if streams {
            return whole_call;
        }
        // Without streamed output, a rejected answer and a call aborted at shutdown
        // charge nothing; an unknown outcome charges what the policy says. A cancel
        // ends the job, so it is the job's last call, held for in full.
        match self.unknown_outcome {
            UnfinishedCall::DeliveredOutput => Credits::ZERO,
            UnfinishedCall::Prompt => price.customer_charge(&bound.estimated_prompt()),
            UnfinishedCall::CallBound => whole_call,
        }
    }

    /// The hold of a job of up to `max_attempts` paid calls of `bound` at `price`:
    /// what the customer may be charged for them under this policy. The last call
    /// (the accepted answer, or the call a cancel stopped) may cost a whole call;
    /// each call before it what [`Self::unfinished_call_charge`] allows. Under the
    /// default policy a job that does not stream is held for one call, whatever its
    /// `maxAttempts`: its failed calls are the operator's. What the provider bills
    /// for those is bounded by the paid-call ceiling, not by the hold.
    pub fn job_hold(
        &self,
        bound: CallBound,
        price: &ModelPrice,
        max_attempts: u32,
        streams: bool,
    ) -> Credits {
        let earlier = self
            .unfinished_call_charge(price, bound, streams)
            .times(max_attempts.saturating_sub(1));
        bound.customer_cost(price) + earlier
    }

    /// What the customer pays for one attempt. `delivered` is what the call used to
    /// produce the output streamed to the client before it ended — its usage when the
    /// provider reported it, an estimate otherwise — and `None` when nothing streamed.
    pub fn customer_charge(
        &self,
        price: &ModelPrice,
        bound: CallBound,
        ending: AttemptEnding,
        delivered: Option<&TokenUsage>,
    ) -> Credits {
        let delivered = delivered.map_or(Credits::ZERO, |usage| price.customer_charge(usage));
        let unfinished = |choice: UnfinishedCall| match choice {
            UnfinishedCall::DeliveredOutput => delivered,
            // What streamed was priced with its prompt already.
            UnfinishedCall::Prompt => price
                .customer_charge(&bound.estimated_prompt())
                .max(delivered),
            // The bound covers every output token, the delivered ones among them.
            UnfinishedCall::CallBound => bound.customer_cost(price).max(delivered),
        };
        match ending {
            AttemptEnding::Accepted(usage) => price.customer_charge(&usage),
            AttemptEnding::NotBilled => Credits::ZERO,
            AttemptEnding::Rejected | AttemptEnding::ShutDown => delivered,
            AttemptEnding::Unknown => unfinished(self.unknown_outcome),
            AttemptEnding::CancelledDuringCall => unfinished(self.cancelled_during_call),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::prices::{PricePerMillion, Rates};
    use uuid::Uuid;

    fn price() -> ModelPrice {
        let per_million =
            |credits: i64| PricePerMillion(Credits::from_nanos(credits * 1_000_000_000));
        ModelPrice {
            id: Uuid::nil(),
            customer_version: Uuid::nil(),
            model: "m".into(),
            version: 1,
            batch: None,
            limits: Default::default(),
            source: String::new(),
            provider: Rates {
                input: per_million(1),
                cached_input: per_million(1),
                output: per_million(2),
            },
            customer: Rates {
                input: per_million(2),
                cached_input: per_million(2),
                output: per_million(4),
            },
        }
    }

    const BOUND: CallBound = CallBound {
        input_tokens: 1_000,
        input_estimate: 250,
        max_output_tokens: 500,
    };

    #[test]
    fn streamed_output_is_charged_whatever_the_policy() {
        let usage = BOUND.estimated_delivery(400);
        // 250 prompt tokens at 2 per million and 100 output tokens at 4 per million.
        let delivered = Credits::from_nanos(2_000 * 250 + 4_000 * 100);
        for policy in [
            ChargingPolicy::default(),
            ChargingPolicy {
                unknown_outcome: UnfinishedCall::CallBound,
                cancelled_during_call: UnfinishedCall::CallBound,
            },
        ] {
            for ending in [
                AttemptEnding::Rejected,
                AttemptEnding::Unknown,
                AttemptEnding::CancelledDuringCall,
                AttemptEnding::ShutDown,
            ] {
                assert!(policy.customer_charge(&price(), BOUND, ending, Some(&usage)) >= delivered);
            }
            assert_eq!(
                policy.customer_charge(&price(), BOUND, AttemptEnding::NotBilled, Some(&usage)),
                Credits::ZERO
            );
        }
    }

    #[test]
    fn the_bound_policy_passes_the_whole_call_on() {
        let policy = ChargingPolicy {
            unknown_outcome: UnfinishedCall::CallBound,
            cancelled_during_call: UnfinishedCall::DeliveredOutput,
        };
        // 1,000 input tokens at 2 per million and 500 output tokens at 4 per million.
        let bound = Credits::from_nanos(2_000 * 1_000 + 4_000 * 500);
        assert_eq!(
            policy.customer_charge(&price(), BOUND, AttemptEnding::Unknown, None),
            bound
        );
        assert_eq!(
            policy.customer_charge(&price(), BOUND, AttemptEnding::CancelledDuringCall, None),
            Credits::ZERO
        );
        assert_eq!(
            policy.customer_charge(&price(), BOUND, AttemptEnding::ShutDown, None),
            Credits::ZERO,
            "a restart is never passed on"
        );
    }

    #[test]
    fn a_cancel_during_the_call_charges_its_prompt_by_default() {
        let policy = ChargingPolicy::default();
        // 250 estimated prompt tokens at 2 per million.
        let prompt = Credits::from_nanos(2_000 * 250);
        assert_eq!(
            policy.customer_charge(&price(), BOUND, AttemptEnding::CancelledDuringCall, None),
            prompt
        );
        assert_eq!(
            policy.customer_charge(&price(), BOUND, AttemptEnding::Unknown, None),
            Credits::ZERO,
            "an unknown outcome is absorbed by default"
        );
        let streamed = BOUND.estimated_delivery(400);
        assert_eq!(
            policy.customer_charge(
                &price(),
                BOUND,
                AttemptEnding::CancelledDuringCall,
                Some(&streamed)
            ),
            price().customer_charge(&streamed),
            "streamed output is charged with its prompt, once"
        );
        assert!(prompt <= BOUND.customer_cost(&price()));
    }

    /// Every way three paid calls can end for the customer under `policy`: two that
    /// did not end the job, then the one that did. The worst is what the hold covers.
    fn worst_charge(policy: ChargingPolicy, streams: bool) -> Credits {
        let delivered = streams.then(|| BOUND.usage());
        let not_last = [
            AttemptEnding::NotBilled,
            AttemptEnding::Rejected,
            AttemptEnding::Unknown,
            AttemptEnding::ShutDown,
        ];
        let last = [
            AttemptEnding::Accepted(BOUND.usage()),
            AttemptEnding::CancelledDuringCall,
            AttemptEnding::Unknown,
            AttemptEnding::Rejected,
        ];
        let charge = |ending| policy.customer_charge(&price(), BOUND, ending, delivered.as_ref());
        let worst_earlier = not_last.into_iter().map(charge).max().unwrap();
        let worst_last = last.into_iter().map(charge).max().unwrap();
        worst_earlier.times(2) + worst_last
    }

    #[test]
    fn the_hold_follows_the_policy_and_covers_what_it_may_charge() {
        use UnfinishedCall::*;
        let call = BOUND.customer_cost(&price());
        let prompt = price().customer_charge(&BOUND.estimated_prompt());
        for (unknown_outcome, streams, expected) in [
            (DeliveredOutput, false, call),
            (Prompt, false, call + prompt.times(2)),
            (CallBound, false, call.times(3)),
            (DeliveredOutput, true, call.times(3)),
            (Prompt, true, call.times(3)),
            (CallBound, true, call.times(3)),
        ] {
            for cancelled_during_call in [DeliveredOutput, Prompt, CallBound] {
                let policy = ChargingPolicy {
                    unknown_outcome,
                    cancelled_during_call,
                };
                let hold = policy.job_hold(BOUND, &price(), 3, streams);
                assert_eq!(hold, expected, "{policy:?}, streaming {streams}");
                assert!(
                    worst_charge(policy, streams) <= hold,
                    "{policy:?}, streaming {streams}: the hold must cover every charge"
                );
            }
        }
    }

    #[test]
    fn a_workers_bound_stays_within_what_the_job_was_held_for() {
        let bound = CallBound {
            input_tokens: 4_000,
            input_estimate: 1_000,
            max_output_tokens: 500,
        };
        let held = bound.within(Some(1_500));
        assert_eq!(held.input_tokens, 1_000);
        assert_eq!(held.input_estimate, 1_000);
        assert_eq!(held.max_output_tokens, 500);
        assert_eq!(bound.within(Some(2_000)).input_estimate, 1_000);
        assert_eq!(bound.within(Some(10_000)), bound);
        assert_eq!(bound.within(None), bound);
    }

    #[test]
    fn reported_usage_is_cut_to_the_bound() {
        let absurd = TokenUsage {
            input_tokens: u64::MAX,
            cached_input_tokens: u64::MAX,
            output_tokens: 10_u64.pow(18),
        };
        assert_eq!(
            BOUND.limit(absurd),
            TokenUsage {
                input_tokens: 1_000,
                cached_input_tokens: 1_000,
                output_tokens: 500,
            }
        );
        let fair = TokenUsage {
            input_tokens: 10,
            cached_input_tokens: 4,
            output_tokens: 7,
        };
        assert_eq!(BOUND.limit(fair), fair);
    }

    #[test]
    fn four_streamed_bytes_make_a_token() {
        assert_eq!(estimated_output_tokens(0), 0);
        assert_eq!(estimated_output_tokens(1), 1);
        assert_eq!(estimated_output_tokens(8), 2);
        assert_eq!(estimated_output_tokens(9), 3);
    }
}
