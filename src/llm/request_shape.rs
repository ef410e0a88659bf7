//! Which `providerOptions` a provider's calls may carry, of which JSON type and within
//! which range: a field a provider does not take, or a value it refuses, is answered
//! 400 on every attempt, so a job is refused it at create instead.

use super::parameters::is_reasoning_model;
use serde_json::{Map, Value};

/// The API a provider's calls are sent to: it decides which `providerOptions` a call
/// may carry, and of which JSON type and range each must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestShape {
    /// OpenAI's own chat completions API (`api.openai.com`), which refuses the
    /// sampling fields of other servers and `reasoning_effort` for a model that does
    /// not reason.
    OpenAi,
    /// A server that takes OpenAI's chat completions shape (vLLM, Ollama, llama.cpp
    /// server, OpenRouter, the simulator): it may sample by more fields than OpenAI.
    OpenAiCompatible,
    /// Anthropic's messages.
    Anthropic,
}

/// The numbers a value may take, both ends included.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Range {
    min: f64,
    max: f64,
}

impl Range {
    const ANY: Self = Self::new(f64::NEG_INFINITY, f64::INFINITY);

    const fn new(min: f64, max: f64) -> Self {
        Self { min, max }
    }

    const fn at_least(min: f64) -> Self {
        Self::new(min, f64::INFINITY)
    }

    fn admits(self, value: &Value) -> bool {
        value
            .as_f64()
            .is_some_and(|number| (self.min..=self.max).contains(&number))
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.min.is_finite(), self.max.is_finite()) {
            (true, true) => write!(f, " from {} to {}", self.min, self.max),
            (true, false) => write!(f, " of at least {}", self.min),
            (false, true) => write!(f, " of at most {}", self.max),
            (false, false) => Ok(()),
        }
    }
}

/// The JSON a provider option's value must be.
#[derive(Clone, Copy, Debug, PartialEq)]
enum OptionType {
    String,
    Boolean,
    Number(Range),
    Integer(Range),
    /// An object of strings (OpenAI's `metadata`).
    Strings,
    /// `logit_bias`: an object from token ids (its keys, whole numbers) to biases.
    TokenBiases(Range),
    /// Anthropic's `metadata`: an object with at most a string `user_id`.
    UserId,
}

impl OptionType {
    fn admits(self, value: &Value) -> bool {
        match self {
            Self::String => value.is_string(),
            Self::Boolean => value.is_boolean(),
            Self::Number(range) => value.is_number() && range.admits(value),
            Self::Integer(range) => (value.is_i64() || value.is_u64()) && range.admits(value),
            Self::Strings => value
                .as_object()
                .is_some_and(|fields| fields.values().all(Value::is_string)),
            Self::TokenBiases(range) => value.as_object().is_some_and(|biases| {
                biases.iter().all(|(token, bias)| {
                    is_token_id(token) && bias.is_number() && range.admits(bias)
                })
            }),
            Self::UserId => value.as_object().is_some_and(|fields| {
                fields
                    .iter()
                    .all(|(name, value)| name == "user_id" && value.is_string())
            }),
        }
    }

    fn name(self) -> String {
        match self {
            Self::String => "a string".to_owned(),
            Self::Boolean => "a boolean".to_owned(),
            Self::Number(range) => format!("a number{range}"),
            Self::Integer(range) => format!("a whole number{range}"),
            Self::Strings => "an object of strings".to_owned(),
            Self::TokenBiases(range) => {
                format!("an object from token ids (whole numbers) to numbers{range}")
            }
            Self::UserId => "an object with only a string user_id".to_owned(),
        }
    }
}

/// A token id as a JSON object's key: decimal digits, as OpenAI's tokenizers number
/// their tokens.
fn is_token_id(key: &str) -> bool {
    !key.is_empty() && key.len() <= 10 && key.bytes().all(|byte| byte.is_ascii_digit())
}

/// OpenAI's documented range of `frequency_penalty` and `presence_penalty`.
const PENALTY: Range = Range::new(-2.0, 2.0);

/// What an OpenAI-shaped call may carry, OpenAI's own API and the servers that take
/// its shape alike.
const OPENAI_OPTIONS: &[(&str, OptionType)] = &[
    ("user", OptionType::String),
    ("metadata", OptionType::Strings),
    ("store", OptionType::Boolean),
    ("parallel_tool_calls", OptionType::Boolean),
    ("frequency_penalty", OptionType::Number(PENALTY)),
    ("presence_penalty", OptionType::Number(PENALTY)),
    (
        "logit_bias",
        OptionType::TokenBiases(Range::new(-100.0, 100.0)),
    ),
    ("reasoning_effort", OptionType::String),
    ("verbosity", OptionType::String),
    ("safety_identifier", OptionType::String),
    ("prompt_cache_key", OptionType::String),
];

/// What the OpenAI-compatible servers that sample by them take beside OpenAI's own
/// fields, and OpenAI refuses. Their ranges vary by server, so only types are checked.
const SAMPLER_OPTIONS: &[(&str, OptionType)] = &[
    ("top_k", OptionType::Integer(Range::ANY)),
    ("min_p", OptionType::Number(Range::ANY)),
    ("repetition_penalty", OptionType::Number(Range::ANY)),
];

/// What an Anthropic call may carry; `top_k` 0 or more, as Anthropic documents it.
const ANTHROPIC_OPTIONS: &[(&str, OptionType)] = &[
    ("metadata", OptionType::UserId),
    ("top_k", OptionType::Integer(Range::at_least(0.0))),
];

impl RequestShape {
    pub const ALL: [Self; 3] = [Self::OpenAi, Self::OpenAiCompatible, Self::Anthropic];

    fn options(self) -> impl Iterator<Item = &'static (&'static str, OptionType)> {
        let (own, more): (_, &[_]) = match self {
            Self::OpenAi => (OPENAI_OPTIONS, &[]),
            Self::OpenAiCompatible => (OPENAI_OPTIONS, SAMPLER_OPTIONS),
            Self::Anthropic => (ANTHROPIC_OPTIONS, &[]),
        };
        own.iter().chain(more)
    }

    /// Whether a call of this shape may carry the option `name` at all.
    pub fn takes(self, name: &str) -> bool {
        self.options().any(|(option, _)| *option == name)
    }

    /// The options a call of this shape may carry, in order.
    pub fn option_names(self) -> impl Iterator<Item = &'static str> {
        self.options().map(|(name, _)| *name)
    }

    /// The highest `temperature` this API takes (the lowest is 0 for all).
    pub fn max_temperature(self) -> f64 {
        match self {
            Self::OpenAi | Self::OpenAiCompatible => 2.0,
            Self::Anthropic => 1.0,
        }
    }

    /// The first of `options` a call of this shape to `model` cannot carry, with why:
    /// a field the provider does not take (for that model), or a value of another type
    /// or range than it takes.
    pub fn refused_option(
        self,
        model: &str,
        options: &Map<String, Value>,
    ) -> Option<(String, String)> {
        options.iter().find_map(|(name, value)| {
            let why = match self.options().find(|(option, _)| option == name) {
                None => format!(
                    "{self} does not take it (it takes {})",
                    self.option_names().collect::<Vec<_>>().join(", ")
                ),
                Some((_, kind)) if !kind.admits(value) => {
                    format!("{self} takes {} here", kind.name())
                }
                Some(_) => self.refused_for(model, name)?,
            };
            Some((name.clone(), why))
        })
    }

    /// Why this API refuses the option `name`, which its shape takes, for `model`.
    fn refused_for(self, model: &str, name: &str) -> Option<String> {
        (self == Self::OpenAi && name == "reasoning_effort" && !is_reasoning_model(model))
            .then(|| format!("{self} takes it only for its reasoning models (o-series, gpt-5)"))
    }
}

impl std::fmt::Display for RequestShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OpenAi => "OpenAI's API",
            Self::OpenAiCompatible => "an OpenAI-compatible API",
            Self::Anthropic => "Anthropic's API",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(shape: RequestShape, model: &str, options: Value) -> Option<String> {
        shape
            .refused_option(model, options.as_object().unwrap())
            .map(|(name, _)| name)
    }

    #[test]
    fn each_shape_takes_its_own_options_of_their_own_types() {
        use RequestShape::{Anthropic, OpenAiCompatible};
        let openai = |options| refused(OpenAiCompatible, "gpt-4o", options);
        let anthropic = |options| refused(Anthropic, "claude-sonnet-4-5", options);
        assert_eq!(openai(json!({"store": true, "user": "u"})), None);
        assert_eq!(openai(json!({"store": "yes"})), Some("store".into()));
        assert_eq!(anthropic(json!({"store": true})), Some("store".into()));
        assert_eq!(anthropic(json!({"user": "u"})), Some("user".into()));
        assert_eq!(
            anthropic(json!({"metadata": {"user_id": "u-1"}, "top_k": 5})),
            None
        );
        assert_eq!(
            anthropic(json!({"metadata": {"tenant": "t"}})),
            Some("metadata".into())
        );
        assert_eq!(openai(json!({"metadata": {"tenant": "t"}})), None);
        assert_eq!(
            openai(json!({"metadata": {"n": 1}})),
            Some("metadata".into())
        );
        assert_eq!(openai(json!({"top_k": 2.5})), Some("top_k".into()));
        assert_eq!(
            openai(json!({"logit_bias": {"1": "x"}})),
            Some("logit_bias".into())
        );
        assert_eq!(
            openai(json!({"frequency_penalty": "0.5"})),
            Some("frequency_penalty".into())
        );
        let (_, why) = Anthropic
            .refused_option(
                "claude-sonnet-4-5",
                json!({"store": true}).as_object().unwrap(),
            )
            .unwrap();
        assert!(why.contains("metadata, top_k"), "{why}");
    }

    /// OpenAI answers 400 to the sampling fields of other servers, and to
    /// `reasoning_effort` for a model that does not reason; those servers take both.
    #[test]
    fn openais_own_api_refuses_what_only_other_servers_take() {
        use RequestShape::{OpenAi, OpenAiCompatible};
        for options in [
            json!({"top_k": 5}),
            json!({"min_p": 0.1}),
            json!({"repetition_penalty": 1.1}),
        ] {
            let name = options.as_object().unwrap().keys().next().unwrap().clone();
            assert_eq!(refused(OpenAi, "gpt-4o", options.clone()), Some(name));
            assert_eq!(refused(OpenAiCompatible, "llama3", options), None);
        }
        let effort = json!({"reasoning_effort": "low"});
        for model in ["gpt-4o", "gpt-4.1-mini", "gpt-5-chat-latest"] {
            assert_eq!(
                refused(OpenAi, model, effort.clone()),
                Some("reasoning_effort".into()),
                "{model}"
            );
            assert_eq!(refused(OpenAiCompatible, model, effort.clone()), None);
        }
        for model in ["o3-mini", "o4-mini", "gpt-5", "gpt-5-mini"] {
            assert_eq!(refused(OpenAi, model, effort.clone()), None, "{model}");
        }
        let (_, why) = OpenAi
            .refused_option("gpt-4o", effort.as_object().unwrap())
            .unwrap();
        assert!(why.contains("reasoning models"), "{why}");
    }

    #[test]
    fn values_out_of_the_documented_range_are_refused_with_the_range() {
        use RequestShape::{Anthropic, OpenAi, OpenAiCompatible};
        for shape in [OpenAi, OpenAiCompatible] {
            for (options, refused_as) in [
                (json!({"frequency_penalty": 2}), None),
                (json!({"frequency_penalty": -2.0}), None),
                (json!({"frequency_penalty": 2.5}), Some("frequency_penalty")),
                (json!({"presence_penalty": -2.01}), Some("presence_penalty")),
                (json!({"logit_bias": {"50256": -100, "15": 100}}), None),
                (json!({"logit_bias": {"50256": -101}}), Some("logit_bias")),
                (json!({"logit_bias": {"50256": 100.5}}), Some("logit_bias")),
                (json!({"logit_bias": {"hello": 1}}), Some("logit_bias")),
                (json!({"logit_bias": {"-5": 1}}), Some("logit_bias")),
                (json!({"logit_bias": {"": 1}}), Some("logit_bias")),
            ] {
                assert_eq!(
                    refused(shape, "gpt-4o", options.clone()),
                    refused_as.map(str::to_owned),
                    "{shape}: {options}"
                );
            }
        }
        assert_eq!(
            refused(Anthropic, "claude-haiku-4-5", json!({"top_k": 0})),
            None
        );
        assert_eq!(
            refused(Anthropic, "claude-haiku-4-5", json!({"top_k": -1})),
            Some("top_k".into())
        );
        let why = |shape: RequestShape, options: Value| {
            shape
                .refused_option("gpt-4o", options.as_object().unwrap())
                .unwrap()
                .1
        };
        assert!(
            why(OpenAi, json!({"presence_penalty": 3})).contains("a number from -2 to 2"),
            "{}",
            why(OpenAi, json!({"presence_penalty": 3}))
        );
        assert!(
            why(OpenAi, json!({"logit_bias": {"1": 200}})).contains("from -100 to 100"),
            "{}",
            why(OpenAi, json!({"logit_bias": {"1": 200}}))
        );
        assert!(
            why(Anthropic, json!({"top_k": -1})).contains("a whole number of at least 0"),
            "{}",
            why(Anthropic, json!({"top_k": -1}))
        );
    }
}
