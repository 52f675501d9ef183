//! Tool calling: how a model is shown the functions it may call, how its answer is read back
//! into calls, and the grammar that forces a valid call when a request requires one.
//!
//! Two output formats, chosen from the model's chat template:
//! - **Hermes** (Qwen2.5/Qwen3/Qwen3.5, Hermes, SmolLM3, and anelm's generic tool prompt for
//!   templates that do not lay out tools themselves): each call is
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, text may surround them.
//! - **Llama JSON** (Llama 3.1–3.3 templates): the whole answer is one JSON object
//!   `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`.

use anelm_model::chat_template::{ChatMessage, ChatTemplate};
use serde_json::{Map, Value, json};

use crate::constraint::Grammar;

/// A function the model may call (OpenAI's `tools[].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

impl ToolSpec {
    /// OpenAI's form, `{"type": "function", "function": {...}}`, as templates expect it.
    pub fn to_openai(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            f.insert("description".into(), json!(d));
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": f})
    }
}

/// How a model writes its tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name", "arguments"}</tool_call>` blocks.
    Hermes,
    /// One JSON object `{"name", "parameters"}` (Llama 3.x).
    LlamaJson,
}

impl ToolFormat {
    /// The format `template` teaches its model (Hermes for templates that know no tools: anelm's
    /// generic tool prompt asks for it).
    pub fn of(template: &ChatTemplate) -> Self {
        let src = template.source();
        if src.contains("<tool_call>") || !template.takes_tools() {
            ToolFormat::Hermes
        } else if src.contains("<|python_tag|>") || src.contains("ipython") || src.contains("\"parameters\"") {
            ToolFormat::LlamaJson
        } else {
            ToolFormat::Hermes
        }
    }
}

/// One call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments (a JSON object).
    pub arguments: Value,
}

/// The system text anelm adds for a template that does not lay out tools itself.
pub fn generic_tool_prompt(tools: &[ToolSpec]) -> String {
    let mut s = String::from("You can call functions. Each function, with the JSON schema of its arguments:\n");
    for t in tools {
        let mut f = Map::new();
        f.insert("name".into(), json!(t.name));
        if let Some(d) = &t.description {
            f.insert("description".into(), json!(d));
        }
        f.insert("parameters".into(), t.parameters.clone());
        s.push_str(&Value::Object(f).to_string());
        s.push('\n');
    }
    s.push_str(
        "To call a function, answer with exactly:\n<tool_call>\n{\"name\": \"<function name>\", \"arguments\": {<arguments as JSON>}}\n</tool_call>\n\
         The result comes back in <tool_response> tags. If no function is needed, answer normally.",
    );
    s
}

/// The messages as a template that takes no tools should see them: the generic tool prompt in
/// the system message, assistant calls written out as `<tool_call>` blocks, and tool results as
/// user messages in `<tool_response>` tags.
pub fn with_generic_tool_prompt(messages: &[ChatMessage], tools: &[ToolSpec]) -> Vec<ChatMessage> {
    let prompt = generic_tool_prompt(tools);
    let mut out = Vec::with_capacity(messages.len() + 1);
    match messages.first() {
        Some(m) if m.role == "system" => {
            out.push(ChatMessage::new("system", format!("{}\n\n{prompt}", m.content)));
        }
        _ => out.push(ChatMessage::new("system", prompt)),
    }
    let rest = if messages.first().is_some_and(|m| m.role == "system") {
        &messages[1..]
    } else {
        messages
    };
    for m in rest {
        match (m.role.as_str(), &m.tool_calls) {
            ("assistant", Some(calls)) => {
                let mut text = m.content.clone();
                for c in calls {
                    let f = &c["function"];
                    let call = json!({"name": f["name"], "arguments": arguments_object(&f["arguments"])});
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
                }
                out.push(ChatMessage::new("assistant", text));
            }
            ("tool", _) => out.push(ChatMessage::new(
                "user",
                format!("<tool_response>\n{}\n</tool_response>", m.content),
            )),
            _ => out.push(ChatMessage::new(m.role.clone(), m.content.clone())),
        }
    }
    out
}

/// The messages as a template that takes tools should see them: call arguments as objects
/// (OpenAI sends them as JSON strings; the templates write them with `tojson`).
pub fn with_argument_objects(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(calls) = &mut m.tool_calls {
                for c in calls.iter_mut() {
                    if let Some(f) = c.get_mut("function").and_then(Value::as_object_mut)
                        && let Some(a) = f.get("arguments")
                    {
                        let obj = arguments_object(a);
                        f.insert("arguments".into(), obj);
                    }
                }
            }
            m
        })
        .collect()
}

/// Arguments as a JSON object: a JSON string is parsed, anything unparsable kept as it is.
fn arguments_object(a: &Value) -> Value {
    match a {
        Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or_else(|_| a.clone()),
        other => other.clone(),
    }
}

/// Read the calls out of a model's answer; returns the text outside them (trimmed) and the
/// calls. Text that does not parse as a call stays in the text.
pub fn parse_tool_calls(format: ToolFormat, text: &str) -> (String, Vec<ToolCall>) {
    match format {
        ToolFormat::Hermes => parse_hermes(text),
        ToolFormat::LlamaJson => {
            let body = text.trim().trim_start_matches("<|python_tag|>").trim();
            match call_from(serde_json::from_str::<Value>(body).ok(), &["parameters", "arguments"]) {
                Some(call) => (String::new(), vec![call]),
                None => (text.trim().to_string(), Vec::new()),
            }
        }
    }
}

fn call_from(v: Option<Value>, argument_keys: &[&str]) -> Option<ToolCall> {
    let v = v?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = argument_keys
        .iter()
        .find_map(|k| v.get(*k))
        .map(arguments_object)
        .unwrap_or_else(|| json!({}));
    arguments.is_object().then_some(ToolCall { name, arguments })
}

fn parse_hermes(text: &str) -> (String, Vec<ToolCall>) {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        let after = &rest[at + OPEN.len()..];
        let (body, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        match call_from(
            serde_json::from_str::<Value>(body.trim()).ok(),
            &["arguments", "parameters"],
        ) {
            Some(call) => {
                content.push_str(&rest[..at]);
                calls.push(call);
            }
            None => content.push_str(&rest[..at + OPEN.len() + body.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    (content.trim().to_string(), calls)
}

/// Which call a request forces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForcedCall {
    /// Any one of the tools (`tool_choice: "required"`).
    Any,
    /// This function (`tool_choice: {"type": "function", "function": {"name"}}`).
    Named(String),
}

/// The grammar that makes the answer exactly one valid call in `format` of one of `tools`
/// (or of the named one), its arguments valid under the function's schema.
pub fn forced_call_grammar(format: ToolFormat, tools: &[ToolSpec], which: &ForcedCall) -> Grammar {
    let args_key = match format {
        ToolFormat::Hermes => "arguments",
        ToolFormat::LlamaJson => "parameters",
    };
    let (mut defs, mut definitions) = (Map::new(), Map::new());
    let options: Vec<Value> = tools
        .iter()
        .enumerate()
        .filter(|(_, t)| match which {
            ForcedCall::Any => true,
            ForcedCall::Named(n) => &t.name == n,
        })
        .enumerate()
        .map(|(k, (i, t))| {
            // The parameters' `$defs` move to the root, where their `$ref`s look.
            let at = format!("/anyOf/{k}/properties/{args_key}");
            let (params, d, d7) = crate::json_schema::embed(&t.parameters, &at, &format!("tool{i}_"));
            defs.extend(d);
            definitions.extend(d7);
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, args_key: params},
                "required": ["name", args_key],
                "additionalProperties": false
            })
        })
        .collect();
    // anelm's JSON layout (`x-guidance`) is added where every schema is prepared.
    let mut schema = json!({"anyOf": options});
    for (key, found) in [("$defs", defs), ("definitions", definitions)] {
        if !found.is_empty() {
            schema[key] = Value::Object(found);
        }
    }
    match format {
        ToolFormat::Hermes => Grammar::TaggedJson {
            open: "<tool_call>\n".into(),
            schema,
            close: "\n</tool_call>".into(),
        },
        ToolFormat::LlamaJson => Grammar::JsonSchema(schema),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_calls_are_read_with_the_text_around_them() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>";
        let (content, calls) = parse_tool_calls(ToolFormat::Hermes, text);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "weather");
        assert_eq!(calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(calls[1].arguments, json!({"tz": "CET"}), "string arguments are parsed");
        // A block that is not a call stays text; a cut-off final block still parses.
        let (content, calls) = parse_tool_calls(ToolFormat::Hermes, "<tool_call>not json</tool_call>");
        assert!(calls.is_empty());
        assert!(content.contains("not json"));
        let (_, calls) = parse_tool_calls(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}");
        assert_eq!(calls.len(), 1);
        let (content, calls) = parse_tool_calls(ToolFormat::Hermes, "Just text.");
        assert_eq!((content.as_str(), calls.len()), ("Just text.", 0));
    }

    #[test]
    fn llama_json_calls_are_read_whole() {
        let (c, calls) = parse_tool_calls(
            ToolFormat::LlamaJson,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}",
        );
        assert_eq!(c, "");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "f".into(),
                arguments: json!({"x": 1})
            }]
        );
        let (c, calls) = parse_tool_calls(ToolFormat::LlamaJson, "The answer is 4.");
        assert_eq!((c.as_str(), calls.len()), ("The answer is 4.", 0));
    }

    #[test]
    fn the_generic_prompt_rewrites_history_for_templates_without_tools() {
        let tools = [ToolSpec {
            name: "weather".into(),
            description: Some("Weather in a city".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }];
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = Some(vec![json!({"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}})]);
        let mut result = ChatMessage::new("tool", "{\"temp\": 3}");
        result.tool_call_id = Some("c1".into());
        let msgs = with_generic_tool_prompt(&[ChatMessage::new("user", "Weather in Oslo?"), call, result], &tools);
        assert_eq!(msgs[0].role, "system");
        assert!(msgs[0].content.contains("\"name\":\"weather\"") && msgs[0].content.contains("<tool_call>"));
        assert_eq!(
            msgs[2].content,
            "<tool_call>\n{\"name\":\"weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"
        );
        assert_eq!(msgs[3].role, "user");
        assert!(msgs[3].content.starts_with("<tool_response>"));
    }

    #[test]
    fn the_forced_grammar_names_only_the_chosen_function() {
        let tools = [
            ToolSpec {
                name: "a".into(),
                description: None,
                parameters: json!({"type": "object"}),
            },
            ToolSpec {
                name: "b".into(),
                description: None,
                parameters: json!({"type": "object"}),
            },
        ];
        let Grammar::TaggedJson { open, schema, .. } =
            forced_call_grammar(ToolFormat::Hermes, &tools, &ForcedCall::Named("b".into()))
        else {
            panic!("Hermes calls are JSON between tags");
        };
        let g = schema.to_string();
        assert_eq!(open, "<tool_call>\n");
        assert!(g.contains("\"const\":\"b\"") && !g.contains("\"const\":\"a\""), "{g}");
        assert!(matches!(
            forced_call_grammar(ToolFormat::LlamaJson, &tools, &ForcedCall::Any),
            Grammar::JsonSchema(_)
        ));
    }
}
