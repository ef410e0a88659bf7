//! Checking a job's parameters (`temperature`, `topP`, `stop`, `seed`,
//! `providerOptions`) before they are stored and sent with every call of it.

use super::input::check_json;
use crate::error::ServiceError;
use crate::llm::{Parameters, RequestShape};
use serde_json::Value;

/// Most stop sequences: OpenAI takes four, Anthropic more.
const MAX_STOP_SEQUENCES: usize = 4;
/// Longest stop sequence, in characters.
const MAX_STOP_LENGTH: usize = 256;
/// Largest serialized `providerOptions`, in bytes.
const MAX_OPTIONS_BYTES: usize = 16 * 1024;

/// Fields `providerOptions` may not set, each with why. Those that change what a call
/// may cost would break the hold, which is sized by one reply of `maxOutputTokens` to
/// the input; the others are what jobledger itself sends.
const REFUSED_OPTIONS: &[(&str, &str)] = &[
    ("n", "more than one reply is billed beyond the hold"),
    ("best_of", "the candidates are billed beyond the hold"),
    (
        "max_tokens",
        "maxOutputTokens sets it, and the hold is sized by it",
    ),
    (
        "max_completion_tokens",
        "maxOutputTokens sets it, and the hold is sized by it",
    ),
    (
        "max_output_tokens",
        "maxOutputTokens sets it, and the hold is sized by it",
    ),
    (
        "logprobs",
        "log probabilities change what a reply returns and costs",
    ),
    (
        "top_logprobs",
        "log probabilities change what a reply returns and costs",
    ),
    ("modalities", "audio output is billed at other rates"),
    ("audio", "audio output is billed at other rates"),
    (
        "prediction",
        "rejected prediction tokens are billed beyond the hold",
    ),
    ("service_tier", "another tier is billed at other rates"),
    ("web_search_options", "searches are billed beyond the hold"),
    ("thinking", "thinking tokens are billed beyond the hold"),
    ("model", "the job's model is sent"),
    ("messages", "the job's messages are sent"),
    ("system", "the job's system messages are sent"),
    ("stream", "jobledger decides how it reads the reply"),
    ("stream_options", "jobledger decides how it reads the reply"),
    ("response_format", "responseSchema sets it"),
    ("temperature", "use temperature"),
    ("top_p", "use topP"),
    ("stop", "use stop"),
    ("stop_sequences", "use stop"),
    ("seed", "use seed"),
];

/// Whether `providerOptions` may set `name` for some provider: each field a provider
/// takes (`RequestShape`) is known to leave what a call may cost within its hold
/// (output stays bounded by `maxOutputTokens`, input by the messages). Anything else —
/// a provider's server-side tools, faster or regional tiers, containers, MCP servers,
/// fields not known here — may bill beyond the hold, so it is refused by name rather
/// than passed on. Which provider takes which, and of what type, is checked at create,
/// when the models' providers are known ([`check_parameters_for`]).
fn known_option(name: &str) -> bool {
    RequestShape::ALL.iter().any(|shape| shape.takes(name))
}

/// Every field some provider takes, for the message that refuses another.
fn known_options() -> Vec<&'static str> {
    let mut names: Vec<&str> = RequestShape::ALL
        .iter()
        .flat_map(|shape| shape.option_names())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// `Validation` naming the first of `parameters` that `model`'s provider, whose calls
/// are sent to `shape`, does not take or takes of another type or range: it would
/// answer 400 to every attempt.
pub fn check_parameters_for(
    model: &str,
    shape: RequestShape,
    parameters: &Parameters,
) -> Result<(), ServiceError> {
    let max_temperature = shape.max_temperature();
    if let Some(temperature) = parameters.temperature
        && temperature > max_temperature
    {
        return Err(ServiceError::validation(format!(
            "temperature must be 0 to {max_temperature} for model {model:?}: {shape} takes no more"
        )));
    }
    match shape.refused_option(model, &parameters.provider_options) {
        None => Ok(()),
        Some((name, why)) => Err(ServiceError::validation(format!(
            "providerOptions.{name} cannot be sent for model {model:?}: {why}"
        ))),
    }
}

/// The parameters as a client sent them.
#[derive(Clone, Debug, Default)]
pub struct ParameterRequest {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stop: Option<Vec<String>>,
    pub seed: Option<i64>,
    pub provider_options: Option<Value>,
}

/// The parameters, or `Validation` naming the first broken rule.
pub fn parse_parameters(request: ParameterRequest) -> Result<Parameters, ServiceError> {
    if let Some(temperature) = request.temperature
        && !(0.0..=2.0).contains(&temperature)
    {
        return Err(ServiceError::validation("temperature must be 0 to 2"));
    }
    if let Some(top_p) = request.top_p
        && !(top_p > 0.0 && top_p <= 1.0)
    {
        return Err(ServiceError::validation(
            "topP must be above 0 and at most 1",
        ));
    }
    let stop = request.stop.unwrap_or_default();
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(ServiceError::validation(format!(
            "stop holds at most {MAX_STOP_SEQUENCES} sequences"
        )));
    }
    for sequence in &stop {
        let length = sequence.chars().count();
        if length == 0 || length > MAX_STOP_LENGTH {
            return Err(ServiceError::validation(format!(
                "each stop sequence must be 1 to {MAX_STOP_LENGTH} characters"
            )));
        }
        if sequence.contains('\0') {
            return Err(ServiceError::validation(
                "a stop sequence must not contain NUL",
            ));
        }
    }
    let provider_options = match request.provider_options {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(options)) => {
            let options = Value::Object(options);
            check_json("providerOptions", &options)?;
            let size = options.to_string().len();
            if size > MAX_OPTIONS_BYTES {
                return Err(ServiceError::validation(format!(
                    "providerOptions is {size} bytes; at most {MAX_OPTIONS_BYTES} are accepted"
                )));
            }
            let Value::Object(options) = options else {
                unreachable!("built as an object above")
            };
            if let Some((name, why)) = REFUSED_OPTIONS
                .iter()
                .find(|(name, _)| options.contains_key(*name))
            {
                return Err(ServiceError::validation(format!(
                    "providerOptions may not set {name:?}: {why}"
                )));
            }
            if let Some(name) = options.keys().find(|name| !known_option(name)) {
                return Err(ServiceError::validation(format!(
                    "providerOptions may not set {name:?}: only fields known to keep a call within its hold are passed on ({})",
                    known_options().join(", ")
                )));
            }
            options
        }
        Some(_) => {
            return Err(ServiceError::validation(
                "providerOptions must be a JSON object of request fields",
            ));
        }
    };
    Ok(Parameters {
        temperature: request.temperature,
        top_p: request.top_p,
        stop,
        seed: request.seed,
        provider_options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options(value: Value) -> Result<Parameters, ServiceError> {
        parse_parameters(ParameterRequest {
            provider_options: Some(value),
            ..Default::default()
        })
    }

    #[test]
    fn options_that_change_the_cost_are_refused_by_name() {
        for name in [
            "n",
            "best_of",
            "max_tokens",
            "max_completion_tokens",
            "logprobs",
            "service_tier",
        ] {
            let Err(ServiceError::Validation(message)) = options(json!({ name: 2, "user": "u" }))
            else {
                panic!("{name} must be refused");
            };
            assert!(message.contains(&format!("{name:?}")), "{message}");
        }
        assert!(options(json!({"user": "u-1", "logit_bias": {"50256": -100}})).is_ok());
        assert!(options(json!(["n"])).is_err());
    }

    #[test]
    fn options_not_known_to_keep_a_call_within_its_hold_are_refused_by_name() {
        // Server-side tools, faster or regional tiers, containers and MCP servers each
        // bill beyond the tokens the hold counts; an unknown field may too.
        for (name, value) in [
            (
                "tools",
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
            ),
            ("speed", json!("fast")),
            ("inference_geo", json!("us")),
            ("container", json!("x")),
            ("mcp_servers", json!([])),
            ("extra_body", json!({"n": 5})),
            ("N", json!(5)),
        ] {
            let Err(ServiceError::Validation(message)) = options(json!({ name: value })) else {
                panic!("{name} must be refused");
            };
            assert!(message.contains(&format!("{name:?}")), "{message}");
        }
        for name in known_options() {
            assert!(options(json!({ name: 1 })).is_ok(), "{name} is passed on");
        }
    }

    #[test]
    fn sampling_parameters_are_bounded() {
        let with = |temperature: Option<f64>, top_p: Option<f64>| {
            parse_parameters(ParameterRequest {
                temperature,
                top_p,
                ..Default::default()
            })
        };
        assert!(with(Some(0.0), Some(1.0)).is_ok());
        assert!(with(Some(2.0), None).is_ok());
        assert!(with(Some(2.01), None).is_err());
        assert!(with(Some(-0.1), None).is_err());
        assert!(with(Some(f64::NAN), None).is_err());
        assert!(with(None, Some(0.0)).is_err());
        assert!(with(None, Some(1.5)).is_err());
        let stops = |stop: Vec<&str>| {
            parse_parameters(ParameterRequest {
                stop: Some(stop.into_iter().map(str::to_owned).collect()),
                ..Default::default()
            })
        };
        assert!(stops(vec!["a", "b", "c", "d"]).is_ok());
        assert!(stops(vec!["a", "b", "c", "d", "e"]).is_err());
        assert!(stops(vec![""]).is_err());
    }

    /// Anthropic takes a temperature of at most 1, and OpenAI's own API none of the
    /// sampling fields of other servers: each is refused for a model of that provider
    /// only, naming the field, the model and what is taken.
    #[test]
    fn parameters_are_checked_against_the_models_provider() {
        let warm = Parameters {
            temperature: Some(1.5),
            ..Parameters::default()
        };
        let Err(ServiceError::Validation(message)) =
            check_parameters_for("claude-haiku-4-5", RequestShape::Anthropic, &warm)
        else {
            panic!("1.5 is above Anthropic's range");
        };
        assert!(
            message.contains("temperature must be 0 to 1 for model \"claude-haiku-4-5\""),
            "{message}"
        );
        for shape in [RequestShape::OpenAi, RequestShape::OpenAiCompatible] {
            assert!(check_parameters_for("gpt-4o", shape, &warm).is_ok());
        }
        let one = Parameters {
            temperature: Some(1.0),
            ..Parameters::default()
        };
        assert!(check_parameters_for("claude-haiku-4-5", RequestShape::Anthropic, &one).is_ok());
        let top_k = options(json!({"top_k": 40})).unwrap();
        let Err(ServiceError::Validation(message)) =
            check_parameters_for("gpt-4o", RequestShape::OpenAi, &top_k)
        else {
            panic!("OpenAI's own API takes no top_k");
        };
        assert!(
            message.contains("providerOptions.top_k cannot be sent for model \"gpt-4o\""),
            "{message}"
        );
        assert!(check_parameters_for("llama3", RequestShape::OpenAiCompatible, &top_k).is_ok());
    }
}
