//! Function tools: what a job offers the model, in the form it is stored, and each
//! provider's shape of it (OpenAI's `tools`/`tool_choice`, Anthropic's
//! `input_schema` tools and `tool_choice`); and the calls a reply makes.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// One function the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the call's arguments.
    pub parameters: Value,
}

/// Whether and which tool the model must call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the providers' default when tools are offered).
    Auto,
    /// No tool call.
    None,
    /// Some tool call (OpenAI's `required`, Anthropic's `any`).
    Required,
    /// A call of this tool.
    Function(String),
}

/// A job's tools and its choice, sent with every call of it. Empty when the job
/// offers none, and then absent from what is stored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tools {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<ToolChoice>,
}

impl Tools {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The offered tool called `name`.
    pub fn find(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|tool| tool.name == name)
    }

    /// Adds `tools` and `tool_choice` to an OpenAI-shaped chat completions body.
    pub fn add_to_openai(&self, body: &mut Value) {
        if self.tools.is_empty() {
            return;
        }
        let tools: Vec<Value> = self
            .tools
            .iter()
            .map(|tool| {
                let mut function = json!({"name": tool.name, "parameters": tool.parameters});
                if let Some(description) = &tool.description {
                    function["description"] = json!(description);
                }
                json!({"type": "function", "function": function})
            })
            .collect();
        body["tools"] = json!(tools);
        if let Some(choice) = &self.choice {
            body["tool_choice"] = match choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Function(name) => {
                    json!({"type": "function", "function": {"name": name}})
                }
            };
        }
    }

    /// Adds `tools` (each with its `input_schema`) and `tool_choice` to an Anthropic
    /// messages body.
    pub fn add_to_anthropic(&self, body: &mut Value) {
        if self.tools.is_empty() {
            return;
        }
        let tools: Vec<Value> = self
            .tools
            .iter()
            .map(|tool| {
                let mut shaped = json!({"name": tool.name, "input_schema": tool.parameters});
                if let Some(description) = &tool.description {
                    shaped["description"] = json!(description);
                }
                shaped
            })
            .collect();
        body["tools"] = json!(tools);
        if let Some(choice) = &self.choice {
            body["tool_choice"] = match choice {
                ToolChoice::Auto => json!({"type": "auto"}),
                ToolChoice::None => json!({"type": "none"}),
                ToolChoice::Required => json!({"type": "any"}),
                ToolChoice::Function(name) => json!({"type": "tool", "name": name}),
            };
        }
    }
}

/// One tool call of a reply, as the provider sent it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolCall {
    /// The provider's id of the call (`call_…`, `toolu_…`), when it sent one.
    pub id: Option<String>,
    pub name: String,
    /// The arguments as JSON text, unchecked: OpenAI sends them as a string the model
    /// wrote, which need not be JSON at all.
    pub arguments: String,
}

/// Tool calls put together from a stream's pieces, each call by its position.
#[derive(Debug, Default)]
pub(super) struct StreamedCalls {
    calls: Vec<(u64, ToolCall)>,
}

impl StreamedCalls {
    /// The call at `index`, opened if this is its first piece.
    pub(super) fn at(&mut self, index: u64) -> &mut ToolCall {
        let at = match self.calls.iter().position(|(seen, _)| *seen == index) {
            Some(at) => at,
            None => {
                self.calls.push((index, ToolCall::default()));
                self.calls.len() - 1
            }
        };
        &mut self.calls[at].1
    }

    /// The calls, in the order of their positions.
    pub(super) fn finish(mut self) -> Vec<ToolCall> {
        self.calls.sort_by_key(|(index, _)| *index);
        self.calls.into_iter().map(|(_, call)| call).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(choice: ToolChoice) -> Tools {
        Tools {
            tools: vec![Tool {
                name: "weather".into(),
                description: Some("The weather in a city".into()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            }],
            choice: Some(choice),
        }
    }

    #[test]
    fn openai_gets_function_tools() {
        let mut body = json!({});
        tools(ToolChoice::Function("weather".into())).add_to_openai(&mut body);
        assert_eq!(
            body,
            json!({
                "tools": [{"type": "function", "function": {
                    "name": "weather", "description": "The weather in a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                }}],
                "tool_choice": {"type": "function", "function": {"name": "weather"}},
            })
        );
        let mut body = json!({});
        tools(ToolChoice::Required).add_to_openai(&mut body);
        assert_eq!(body["tool_choice"], json!("required"));
    }

    #[test]
    fn anthropic_gets_input_schemas() {
        let mut body = json!({});
        tools(ToolChoice::Function("weather".into())).add_to_anthropic(&mut body);
        assert_eq!(
            body,
            json!({
                "tools": [{
                    "name": "weather", "description": "The weather in a city",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
                }],
                "tool_choice": {"type": "tool", "name": "weather"},
            })
        );
        for (choice, shaped) in [
            (ToolChoice::Auto, json!({"type": "auto"})),
            (ToolChoice::None, json!({"type": "none"})),
            (ToolChoice::Required, json!({"type": "any"})),
        ] {
            let mut body = json!({});
            tools(choice).add_to_anthropic(&mut body);
            assert_eq!(body["tool_choice"], shaped);
        }
    }

    #[test]
    fn no_tools_add_nothing() {
        let mut body = json!({"model": "m"});
        Tools::default().add_to_openai(&mut body);
        Tools::default().add_to_anthropic(&mut body);
        assert_eq!(body, json!({"model": "m"}));
        assert_eq!(serde_json::to_value(Tools::default()).unwrap(), json!({}));
    }

    #[test]
    fn streamed_calls_come_out_in_index_order() {
        let mut calls = StreamedCalls::default();
        calls.at(1).name = "b".into();
        calls.at(0).name = "a".into();
        calls.at(1).arguments.push_str("{}");
        let calls = calls.finish();
        assert_eq!(calls[0].name, "a");
        assert_eq!(calls[1].name, "b");
        assert_eq!(calls[1].arguments, "{}");
    }
}
