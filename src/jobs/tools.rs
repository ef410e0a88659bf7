//! A job's function tools: checking `tools` and `toolChoice` as a client sends them
//! (OpenAI's shape), and judging the tool calls of a reply against them.

use super::input::{check_json, check_response_schema};
use crate::error::ServiceError;
use crate::jobs::lifecycle::JobError;
use crate::llm::{Tool, ToolCall, ToolChoice, Tools};
use entity::JobErrorCode;
use serde_json::{Value, json};

/// Most tools one job may offer: OpenAI's own limit.
const MAX_TOOLS: usize = 128;
/// Longest tool name: OpenAI's and Anthropic's limit.
const MAX_NAME_LENGTH: usize = 64;
/// Longest tool description, in characters.
const MAX_DESCRIPTION_LENGTH: usize = 4 * 1024;
/// Largest serialized `tools`, in bytes: counted in the hold, and sent with every call.
const MAX_TOOLS_BYTES: usize = 64 * 1024;

/// `tools` and `toolChoice` as a client sent them.
#[derive(Clone, Debug, Default)]
pub struct ToolRequest {
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
}

/// The tools, or `Validation` naming the field and the first broken rule.
pub fn parse_tools(request: ToolRequest) -> Result<Tools, ServiceError> {
    let tools = match request.tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let size = Value::Array(items.clone()).to_string().len();
            if size > MAX_TOOLS_BYTES {
                return Err(ServiceError::validation(format!(
                    "tools is {size} bytes; at most {MAX_TOOLS_BYTES} are accepted"
                )));
            }
            if items.len() > MAX_TOOLS {
                return Err(ServiceError::validation(format!(
                    "tools holds at most {MAX_TOOLS} tools"
                )));
            }
            let tools = items
                .into_iter()
                .enumerate()
                .map(|(index, item)| parse_tool(item).map_err(|message| at(index, message)))
                .collect::<Result<Vec<_>, _>>()?;
            for (index, tool) in tools.iter().enumerate() {
                if tools[..index].iter().any(|other| other.name == tool.name) {
                    return Err(at(index, format!("the name {:?} is taken", tool.name)));
                }
            }
            tools
        }
        Some(_) => {
            return Err(ServiceError::validation(
                "tools must be a JSON array of function tools",
            ));
        }
    };
    let choice = match request.tool_choice {
        None | Some(Value::Null) => None,
        Some(choice) => Some(parse_choice(&choice, &tools)?),
    };
    Ok(Tools { tools, choice })
}

fn at(index: usize, message: String) -> ServiceError {
    ServiceError::validation(format!("tools[{index}]: {message}"))
}

/// `{"type": "function", "function": {"name", "description"?, "parameters"?}}`.
fn parse_tool(item: Value) -> Result<Tool, String> {
    let Value::Object(mut item) = item else {
        return Err("a tool must be a JSON object".to_owned());
    };
    if item.get("type").and_then(Value::as_str) != Some("function") {
        return Err("type must be \"function\": other tools are not supported".to_owned());
    }
    let Some(Value::Object(mut function)) = item.remove("function") else {
        return Err("function must be an object with a name".to_owned());
    };
    let name = match function.remove("name") {
        Some(Value::String(name)) => name,
        _ => return Err("function.name must be a string".to_owned()),
    };
    let valid_name = !name.is_empty()
        && name.len() <= MAX_NAME_LENGTH
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(format!(
            "function.name must be 1 to {MAX_NAME_LENGTH} letters, digits, _ or -"
        ));
    }
    let description = match function.remove("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            if text.chars().count() > MAX_DESCRIPTION_LENGTH {
                return Err(format!(
                    "function.description must be at most {MAX_DESCRIPTION_LENGTH} characters"
                ));
            }
            crate::validation::free_text("function.description", &text)
                .map_err(|error| error.to_string())?;
            Some(text)
        }
        Some(_) => return Err("function.description must be a string".to_owned()),
    };
    // A function without parameters takes none: both providers want a schema.
    let parameters = match function.remove("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(schema) => {
            if schema.get("type").and_then(Value::as_str) != Some("object") {
                return Err("function.parameters must be a JSON Schema of type object".to_owned());
            }
            check_json("function.parameters", &schema).map_err(|error| error.to_string())?;
            check_response_schema(&schema).map_err(|error| {
                error
                    .to_string()
                    .replace("responseSchema", "function.parameters")
            })?;
            schema
        }
    };
    if let Some(other) = function.keys().find(|key| key.as_str() != "strict") {
        return Err(format!(
            "function.{other} is not a field of a function tool"
        ));
    }
    Ok(Tool {
        name,
        description,
        parameters,
    })
}

/// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name"}}`
/// naming one of `tools`.
fn parse_choice(choice: &Value, tools: &[Tool]) -> Result<ToolChoice, ServiceError> {
    if tools.is_empty() {
        return Err(ServiceError::validation(
            "toolChoice needs tools to choose from",
        ));
    }
    let parsed = match choice {
        Value::String(word) => match word.as_str() {
            "auto" => Some(ToolChoice::Auto),
            "none" => Some(ToolChoice::None),
            "required" => Some(ToolChoice::Required),
            _ => None,
        },
        Value::Object(_) if choice["type"] == "function" => choice["function"]["name"]
            .as_str()
            .map(|name| ToolChoice::Function(name.to_owned())),
        _ => None,
    };
    match parsed {
        Some(ToolChoice::Function(name)) if !tools.iter().any(|tool| tool.name == name) => Err(
            ServiceError::validation(format!("toolChoice names {name:?}, which is not in tools")),
        ),
        Some(choice) => Ok(choice),
        None => Err(ServiceError::validation(
            "toolChoice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
        )),
    }
}

/// The result of a reply that calls tools: `{"toolCalls": [{"name", "arguments",
/// "id"?}]}`, its text besides as `text` when there is some; or `INVALID_OUTPUT` when
/// a call names a tool the job did not offer, or its arguments are not JSON valid
/// against the tool's parameters.
pub fn accept_tool_calls(calls: &[ToolCall], text: &str, tools: &Tools) -> Result<Value, JobError> {
    // As for response schemas, the tenant reads fixed texts only: an answer it is not
    // charged for must not leave through the error (a tool name is the model's text).
    let invalid = |message: &str| JobError::new(JobErrorCode::InvalidOutput, message);
    let mut accepted = Vec::with_capacity(calls.len());
    for call in calls {
        let tool = tools.find(&call.name).ok_or_else(|| invalid(NOT_OFFERED))?;
        let arguments: Value = serde_json::from_str(if call.arguments.trim().is_empty() {
            "{}"
        } else {
            &call.arguments
        })
        .map_err(|_| invalid(NOT_JSON))?;
        // The schema compiled when the job was created; it still does.
        let validator = jsonschema::validator_for(&tool.parameters)
            .map_err(|error| invalid(&format!("a tool's parameters do not compile: {error}")))?;
        if !validator.is_valid(&arguments) {
            return Err(invalid(MISMATCH));
        }
        let mut accepted_call = json!({"name": call.name, "arguments": arguments});
        if let Some(id) = &call.id {
            accepted_call["id"] = json!(id);
        }
        accepted.push(accepted_call);
    }
    let mut result = json!({"toolCalls": accepted});
    if !text.is_empty() {
        result["text"] = json!(text);
    }
    Ok(result)
}

/// What the tenant reads of a call of a tool the job did not offer.
const NOT_OFFERED: &str = "the reply calls a tool that was not offered";
/// What the tenant reads of a call whose arguments are not JSON.
const NOT_JSON: &str = "the arguments of a tool call are not JSON";
/// What the tenant reads of a call whose arguments fail the tool's parameters.
const MISMATCH: &str = "the arguments of a tool call do not match the tool's parameters";

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }}])
    }

    fn parse(tools: Value, choice: Option<Value>) -> Result<Tools, ServiceError> {
        parse_tools(ToolRequest {
            tools: Some(tools),
            tool_choice: choice,
        })
    }

    fn refused(tools: Value, choice: Option<Value>) -> String {
        match parse(tools, choice) {
            Err(ServiceError::Validation(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn function_tools_and_choices_parse() {
        let tools = parse(
            weather(),
            Some(json!({"type": "function", "function": {"name": "weather"}})),
        )
        .unwrap();
        assert_eq!(tools.tools[0].name, "weather");
        assert_eq!(tools.choice, Some(ToolChoice::Function("weather".into())));
        assert_eq!(
            parse(weather(), Some(json!("required"))).unwrap().choice,
            Some(ToolChoice::Required)
        );
        let bare = parse(
            json!([{"type": "function", "function": {"name": "now"}}]),
            None,
        )
        .unwrap();
        assert_eq!(
            bare.tools[0].parameters,
            json!({"type": "object", "properties": {}})
        );
    }

    #[test]
    fn bad_tools_are_refused_naming_the_field() {
        assert!(refused(json!({}), None).contains("tools"));
        assert!(refused(json!([{"type": "retrieval"}]), None).contains("tools[0]"));
        assert!(
            refused(
                json!([{"type": "function", "function": {"name": "a b"}}]),
                None
            )
            .contains("function.name")
        );
        let twice = json!([
            {"type": "function", "function": {"name": "a"}},
            {"type": "function", "function": {"name": "a"}},
        ]);
        assert!(refused(twice, None).contains("tools[1]"));
        let bad_schema = json!([{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "no-such"}}}}}]);
        assert!(refused(bad_schema, None).contains("function.parameters"));
        let many: Vec<Value> = (0..=MAX_TOOLS)
            .map(|i| json!({"type": "function", "function": {"name": format!("t{i}")}}))
            .collect();
        assert!(refused(json!(many), None).contains("at most 128"));
        let huge = json!([{"type": "function", "function": {"name": "a", "description": "x".repeat(70_000)}}]);
        assert!(refused(huge, None).contains("bytes"));
        assert!(refused(weather(), Some(json!("sometimes"))).contains("toolChoice"));
        assert!(
            refused(
                weather(),
                Some(json!({"type": "function", "function": {"name": "other"}}))
            )
            .contains("toolChoice")
        );
        assert!(matches!(
            parse_tools(ToolRequest { tools: None, tool_choice: Some(json!("auto")) }),
            Err(ServiceError::Validation(message)) if message.contains("toolChoice")
        ));
    }

    #[test]
    fn calls_are_checked_against_the_offered_tools() {
        let tools = parse(weather(), None).unwrap();
        let call = |name: &str, arguments: &str| ToolCall {
            id: Some("call_1".into()),
            name: name.into(),
            arguments: arguments.into(),
        };
        assert_eq!(
            accept_tool_calls(&[call("weather", r#"{"city": "Paris"}"#)], "", &tools).unwrap(),
            json!({"toolCalls": [{"name": "weather", "arguments": {"city": "Paris"}, "id": "call_1"}]})
        );
        for (bad, message) in [
            (call("weather", r#"{"city": 5}"#), MISMATCH),
            (call("weather", "{"), NOT_JSON),
            (call("other", "{}"), NOT_OFFERED),
        ] {
            let error = accept_tool_calls(&[bad], "", &tools).unwrap_err();
            assert_eq!(error.code, entity::JobErrorCode::InvalidOutput);
            assert_eq!(error.message, message);
        }
    }
}
