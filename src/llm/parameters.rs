//! What a call sends besides its messages: sampling parameters and options passed
//! through to the provider as the client gave them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A job's parameters, sent with every call of it. Unset ones are not sent, so the
/// provider's defaults apply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Parameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Sequences that end the reply where they would appear.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// For providers that sample reproducibly from a seed; dropped by those that do
    /// not take one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Other fields of the provider's request body, added to it as they are (checked
    /// at create to change nothing a call may cost).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub provider_options: Map<String, Value>,
}

impl Parameters {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Adds the parameters to an OpenAI-shaped chat completions body. OpenAI's
    /// reasoning models refuse the sampling parameters and `stop` (a 400 for the
    /// whole call): for them those are dropped, as a provider that does not take a
    /// parameter is sent none.
    pub fn add_to_openai(&self, body: &mut Value) {
        self.add_options(body);
        let samples = !body["model"].as_str().is_some_and(is_reasoning_model);
        let fields = [
            (
                "temperature",
                self.temperature.filter(|_| samples).map(Value::from),
            ),
            ("top_p", self.top_p.filter(|_| samples).map(Value::from)),
            ("seed", self.seed.map(Value::from)),
            (
                "stop",
                (samples && !self.stop.is_empty()).then(|| Value::from(self.stop.clone())),
            ),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                body[name] = value;
            }
        }
    }

    /// Adds the parameters to an Anthropic messages body: `stop` is its
    /// `stop_sequences`, and it takes no seed. Its newer models refuse `temperature`
    /// and `top_p` together: given both, only `temperature` is sent.
    pub fn add_to_anthropic(&self, body: &mut Value) {
        self.add_options(body);
        let fields = [
            ("temperature", self.temperature.map(Value::from)),
            (
                "top_p",
                self.top_p
                    .filter(|_| self.temperature.is_none())
                    .map(Value::from),
            ),
            (
                "stop_sequences",
                (!self.stop.is_empty()).then(|| Value::from(self.stop.clone())),
            ),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                body[name] = value;
            }
        }
    }

    // First, so that the named parameters and the fields jobledger sets win: the
    // options were checked not to name them, and this keeps it so whatever is stored.
    fn add_options(&self, body: &mut Value) {
        let Some(fields) = body.as_object_mut() else {
            return;
        };
        for (name, value) in &self.provider_options {
            fields.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }
}

/// OpenAI's reasoning models (the o-series and GPT-5 but its chat model), which take
/// no sampling parameters.
pub(super) fn is_reasoning_model(model: &str) -> bool {
    let name = model.strip_prefix("ft:").unwrap_or(model);
    let o_series = name
        .strip_prefix('o')
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    o_series || (name.starts_with("gpt-5") && !name.starts_with("gpt-5-chat"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parameters() -> Parameters {
        Parameters {
            temperature: Some(0.2),
            top_p: Some(0.9),
            stop: vec!["END".into()],
            seed: Some(7),
            provider_options: json!({"user": "u-1", "model": "other"})
                .as_object()
                .unwrap()
                .clone(),
        }
    }

    #[test]
    fn each_shape_gets_the_parameters_it_takes() {
        let mut openai = json!({"model": "gpt-4o-mini"});
        parameters().add_to_openai(&mut openai);
        assert_eq!(
            openai,
            json!({"model": "gpt-4o-mini", "temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["END"], "user": "u-1"})
        );
        let mut anthropic = json!({"model": "claude-sonnet-4-5"});
        parameters().add_to_anthropic(&mut anthropic);
        assert_eq!(
            anthropic,
            json!({"model": "claude-sonnet-4-5", "temperature": 0.2, "stop_sequences": ["END"], "user": "u-1"}),
            "temperature wins over top_p"
        );
        let top_p_alone = Parameters {
            temperature: None,
            ..parameters()
        };
        let mut anthropic = json!({"model": "claude-sonnet-4-5"});
        top_p_alone.add_to_anthropic(&mut anthropic);
        assert_eq!(anthropic["top_p"], json!(0.9));
    }

    #[test]
    fn reasoning_models_are_sent_no_sampling_parameters() {
        for model in ["o1", "o3-mini", "o4-mini", "gpt-5", "gpt-5-mini"] {
            let mut body = json!({ "model": model });
            parameters().add_to_openai(&mut body);
            assert_eq!(
                body,
                json!({"model": model, "seed": 7, "user": "u-1"}),
                "{model}"
            );
        }
        for model in ["gpt-4o", "gpt-4.1-mini", "gpt-5-chat-latest", "omni-local"] {
            let mut body = json!({ "model": model });
            parameters().add_to_openai(&mut body);
            assert_eq!(body["temperature"], json!(0.2), "{model}");
        }
    }

    #[test]
    fn unset_parameters_are_not_stored() {
        assert_eq!(
            serde_json::to_value(Parameters::default()).unwrap(),
            json!({})
        );
        assert!(Parameters::default().is_empty());
    }
}
