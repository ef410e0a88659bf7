//! Counting a job's prompt: the input tokens one call may use, by the rule of the
//! provider that serves the model (`llm::PromptCounting`).
//!
//! Where the model's tokenizer is public (OpenAI's models, through tiktoken's
//! encodings) the prompt is counted with it, plus the framing OpenAI documents for
//! chat messages: the bound is what OpenAI reports. Anthropic publishes no tokenizer
//! for its current models, so their bound stays one token per UTF-8 byte (every
//! token covers at least one byte), about four times what they report for English.
//! The response schema and the sampling parameters count as bytes under every rule:
//! no provider documents how it counts them.

use super::input::JobInput;
use crate::llm::{Encoding, Message, PromptCounting, ProviderRegistry};
use tiktoken_rs::CoreBPE;

/// Tokens counted for each message on top of its content by the bytes rule: role
/// markers and separators cost a few tokens in every chat format; 16 is more than
/// any of them uses.
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 16;
/// OpenAI's framing of each chat message (`<|start|>`, the role's separator,
/// `<|end|>`), on top of its role and content.
const TOKENS_PER_MESSAGE: u64 = 3;
/// OpenAI's priming of the reply (`<|start|>assistant<|message|>`), once per call.
const REPLY_PRIMING_TOKENS: u64 = 3;

/// What a call's prompt may count: its bound, and the expected count when the
/// provider never reports one (what a charged prompt is estimated at).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptTokens {
    /// No call for the input reports more input tokens.
    pub bound: u64,
    /// The count the provider most likely reports: the bound where the rule is
    /// exact, a quarter of the bytes where it is not.
    pub estimate: u64,
}

/// The prompt tokens of `input` under `counting`.
pub fn count_prompt(input: &JobInput, counting: PromptCounting, model: &str) -> PromptTokens {
    let extra = extra_bytes(input);
    let content_bytes: u64 = input
        .messages
        .iter()
        .flat_map(Message::texts)
        .map(|text| text.len() as u64)
        .sum();
    let media = counting.media_tokens(
        model,
        input.messages.iter().flat_map(|message| &message.parts),
    );
    let quarter_bytes = (content_bytes + extra).div_ceil(4);
    let exact = |bound: u64| PromptTokens {
        bound: bound + media,
        estimate: bound + media,
    };
    match counting {
        PromptCounting::Tokenizer(encoding) => exact(tokenized(&input.messages, encoding) + extra),
        PromptCounting::TokenizerOrQuarterBytes(encoding) => {
            exact((tokenized(&input.messages, encoding) + extra).max(quarter_bytes))
        }
        PromptCounting::QuarterBytes => exact(quarter_bytes),
        PromptCounting::Bytes(_) => {
            let bound =
                content_bytes + MESSAGE_OVERHEAD_TOKENS * input.messages.len() as u64 + extra;
            // Media count by their rules exactly; the text at a quarter of its bytes.
            PromptTokens {
                bound: bound + media,
                estimate: bound.div_ceil(4) + media,
            }
        }
    }
}

/// Tokens counted for offering tools on top of their bytes: providers wrap the
/// definitions in a prompt of their own (Anthropic documents 313 to 346 tokens).
const TOOLS_OVERHEAD_TOKENS: u64 = 512;

/// The schema, the parameters and the tools, in bytes: they travel in the request,
/// and no provider says how it counts them, so one token per byte keeps the bound a
/// bound.
fn extra_bytes(input: &JobInput) -> u64 {
    let schema = input
        .response_schema
        .as_ref()
        .map_or(0, |schema| schema.to_string().len() as u64);
    let parameters = if input.parameters.is_empty() {
        0
    } else {
        serde_json::to_string(&input.parameters).map_or(0, |text| text.len() as u64)
    };
    let tools = if input.tools.is_empty() {
        0
    } else {
        serde_json::to_string(&input.tools).map_or(0, |text| text.len() as u64)
            + TOOLS_OVERHEAD_TOKENS
    };
    schema + parameters + tools
}

/// The messages as OpenAI counts them: each one's role and content with the
/// encoding, its framing, and the reply's priming. Content is encoded as ordinary
/// text: OpenAI does not read special tokens in what a client sends, and an
/// ordinary encoding never counts fewer tokens than one that reads them.
fn tokenized(messages: &[Message], encoding: Encoding) -> u64 {
    let bpe = bpe(encoding);
    let count = |text: &str| bpe.encode_ordinary(text).len() as u64;
    messages
        .iter()
        .map(|message| {
            TOKENS_PER_MESSAGE
                + count(message.role.as_str())
                + message.texts().map(count).sum::<u64>()
        })
        .sum::<u64>()
        + REPLY_PRIMING_TOKENS
}

/// Builds the tokenizers' tables, which happens once per process and takes seconds in
/// an unoptimised build on a busy machine. A worker does it before its first claim:
/// done inside the claim, between taking the lease and the first renewal, it can
/// outlast a short lease and hand the job to a second worker while the first calls.
pub fn load_tokenizers() {
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        bpe(encoding);
    }
}

fn bpe(encoding: Encoding) -> &'static CoreBPE {
    match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    }
}

/// The rule the provider serving `model` counts its prompts by; one token per byte
/// when no provider serves it (the job is refused or fails without a call anyway).
pub fn counting_for(providers: &ProviderRegistry, model: &str) -> PromptCounting {
    providers
        .provider_for(model)
        .map_or(PromptCounting::Bytes(None), |provider| {
            provider.prompt_counting(model)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::prices::{PricePerMillion, Rates};
    use crate::billing::{ChargingPolicy, Credits, ModelPrice};
    use crate::llm::{Role, TokenUsage};

    /// English prose of about `bytes` bytes: a few paragraphs of varied sentences,
    /// repeated.
    pub(crate) fn prose(bytes: usize) -> String {
        const PARAGRAPHS: [&str; 3] = [
            "The quarterly report shows that revenue grew by eleven percent, driven mostly by \
             the new subscription plans that launched in the spring. Costs rose as well, \
             although more slowly, because the team moved two services to cheaper machines \
             and renegotiated the contract with its largest supplier. ",
            "Customers in the northern region asked for faster delivery, and the warehouse \
             answered by adding an evening shift. Complaints fell by a third within two \
             months. The board wants to know whether the same approach would work in the \
             south, where the roads are longer and the towns are smaller. ",
            "Next year the company plans to hire twenty engineers, open an office abroad, \
             and rewrite the billing system that has grown slow and fragile. None of this \
             is certain: the budget depends on how the autumn sales go, and the market has \
             been difficult to predict since the spring. ",
        ];
        let mut text = String::with_capacity(bytes + 400);
        for paragraph in PARAGRAPHS.iter().cycle() {
            if text.len() >= bytes {
                break;
            }
            text.push_str(paragraph);
        }
        text
    }

    fn input(content: &str) -> JobInput {
        JobInput {
            messages: vec![
                Message::text(Role::System, "You summarise documents for busy readers."),
                Message::text(Role::User, content),
            ],
            max_output_tokens: 500,
            response_schema: None,
            metadata: None,
            stream_output: false,
            parameters: Default::default(),
            tools: Default::default(),
        }
    }

    /// gpt-4o's list price, with a 1.25 markup for the customer.
    fn gpt_4o() -> ModelPrice {
        let per_million = |nanos: i64| PricePerMillion(Credits::from_nanos(nanos * 1_000_000));
        ModelPrice {
            id: uuid::Uuid::nil(),
            customer_version: uuid::Uuid::nil(),
            model: "gpt-4o".into(),
            version: 1,
            batch: None,
            limits: Default::default(),
            source: String::new(),
            provider: Rates {
                input: per_million(2_500),
                cached_input: per_million(1_250),
                output: per_million(10_000),
            },
            customer: Rates {
                input: per_million(3_125),
                cached_input: per_million(1_563),
                output: per_million(12_500),
            },
        }
    }

    #[test]
    fn openai_counts_with_the_tokenizer_and_its_framing() {
        let job = input("hello world");
        let tokens = count_prompt(
            &job,
            PromptCounting::Tokenizer(Encoding::O200kBase),
            "gpt-4o",
        );
        // "You summarise documents for busy readers." is 8 tokens and "hello world" 2
        // in o200k_base; each role one; three per message and three for the reply.
        assert_eq!(tokens.bound, (3 + 1 + 8) + (3 + 1 + 2) + 3);
        assert_eq!(tokens.estimate, tokens.bound);
    }

    #[test]
    fn an_endpoint_that_may_be_the_simulator_is_bounded_by_both_rules() {
        for content in [
            prose(20_000),
            "[mock:reply=ok] ".repeat(100),
            "日本語の文章".repeat(500),
        ] {
            let job = input(&content);
            let either = count_prompt(
                &job,
                PromptCounting::TokenizerOrQuarterBytes(Encoding::O200kBase),
                "gpt-4o",
            );
            let tokenizer = count_prompt(
                &job,
                PromptCounting::Tokenizer(Encoding::O200kBase),
                "gpt-4o",
            );
            let simulator = count_prompt(&job, PromptCounting::QuarterBytes, "gpt-4o");
            assert_eq!(either.bound, tokenizer.bound.max(simulator.bound));
        }
    }

    #[test]
    fn the_simulator_counts_a_quarter_of_the_bytes() {
        let job = input("héllo");
        let bytes = "You summarise documents for busy readers.".len() + "héllo".len();
        let tokens = count_prompt(&job, PromptCounting::QuarterBytes, "gpt-4o");
        assert_eq!(tokens.bound, (bytes as u64).div_ceil(4));
    }

    #[test]
    fn the_bytes_rule_bounds_any_tokenizer() {
        // Text a tokenizer splits finely: one token per byte at most, whatever it is.
        for content in [
            "日本語の文章".repeat(300),
            "x\u{1F600}!".repeat(300),
            prose(5_000),
        ] {
            let job = input(&content);
            let bytes = count_prompt(&job, PromptCounting::Bytes(None), "gpt-4o");
            for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
                assert!(
                    count_prompt(&job, PromptCounting::Tokenizer(encoding), "gpt-4o").bound
                        <= bytes.bound
                );
            }
        }
    }

    #[test]
    fn models_take_their_encodings() {
        assert_eq!(Encoding::of_model("gpt-4o"), Some(Encoding::O200kBase));
        assert_eq!(Encoding::of_model("gpt-4o-mini"), Some(Encoding::O200kBase));
        assert_eq!(Encoding::of_model("gpt-4.1"), Some(Encoding::O200kBase));
        assert_eq!(Encoding::of_model("o3-mini"), Some(Encoding::O200kBase));
        assert_eq!(Encoding::of_model("gpt-4"), Some(Encoding::Cl100kBase));
        assert_eq!(
            Encoding::of_model("gpt-3.5-turbo"),
            Some(Encoding::Cl100kBase)
        );
        assert_eq!(Encoding::of_model("claude-sonnet-4"), None);
        assert_eq!(Encoding::of_model("llama3"), None);
    }

    /// The measurement the tokenizer bound is for: what a plain-text job of 20 KB of
    /// English prose, `maxAttempts` 3, is held, divided by what OpenAI's usage for it
    /// charges (its exact prompt and every output token it may write), before (a
    /// token per byte, held for three calls) and after (gpt-4o's tokenizer, held by
    /// the default policy). `cargo test -- --nocapture hold_over_charge` prints it.
    #[test]
    fn hold_over_charge_for_english_prose() {
        let price = gpt_4o();
        let job = input(&prose(20 * 1024));
        let counting = PromptCounting::Tokenizer(Encoding::O200kBase);
        let charged = price.customer_charge(&TokenUsage {
            input_tokens: count_prompt(&job, counting, "gpt-4o").bound,
            cached_input_tokens: 0,
            output_tokens: u64::from(job.max_output_tokens),
        });
        let before_bound = job.call_bound(PromptCounting::Bytes(None), "gpt-4o");
        let before = before_bound
            .provider_cost(&price)
            .max(before_bound.customer_cost(&price))
            .times(3);
        let after = ChargingPolicy::default().job_hold(
            job.call_bound(counting, "gpt-4o"),
            &price,
            3,
            false,
        );
        let ratio = |hold: Credits| hold.nanos() as f64 / charged.nanos() as f64;
        println!(
            "20 KB of English prose, maxAttempts 3: hold ÷ charge {:.2} before, {:.2} after",
            ratio(before),
            ratio(after)
        );
        assert!(
            ratio(before) > 10.0,
            "the bytes bound held {:.2}×",
            ratio(before)
        );
        assert!(
            ratio(after) <= 1.0 + f64::EPSILON,
            "held {:.2}×",
            ratio(after)
        );
        // Where the endpoint may be the simulator, the bound is a quarter of the bytes:
        // 1.20 × the tokenizer's count for this prose (o200k_base makes about five
        // bytes a token of plain English).
        let either = ChargingPolicy::default().job_hold(
            job.call_bound(
                PromptCounting::TokenizerOrQuarterBytes(Encoding::O200kBase),
                "gpt-4o",
            ),
            &price,
            3,
            false,
        );
        println!(
            "  … {:.2} on an endpoint that may be the simulator",
            ratio(either)
        );
        assert!(ratio(either) <= 1.25, "held {:.2}×", ratio(either));
    }
}
