//! The OpenAI request fields anelm understands, parsed from raw JSON with errors that name the
//! field, and turned into a scheduler [`Request`].

use anelm_engine::{Constraint, ForcedCall, Grammar, Request, SamplerParams, StreamOptions, ToolSpec};
use anelm_model::chat_template::ChatMessage;
use serde_json::{Map, Value, json};

use crate::api_error::ApiError;

/// Default `max_tokens` when a request gives none.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// What a completion request asks for, before tokenization.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// Chat messages (chat endpoint) or the raw prompt (completions endpoint).
    pub input: Input,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// Send a final chunk with `usage` when streaming.
    pub include_usage: bool,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling.
    pub sampler: SamplerParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Template kwargs (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub template_kwargs: Map<String, Value>,
    /// Echo of `model`.
    pub model: Option<String>,
    /// Non-standard (as llama.cpp's server): never sample end-of-generation tokens.
    pub ignore_eos: bool,
    /// Report each token's log-probability and this many alternatives (chat: `logprobs` +
    /// `top_logprobs`; completions: the integer `logprobs`).
    pub logprobs: Option<usize>,
    /// What the output must match: `response_format` (`json_object`, `json_schema`) or the
    /// non-standard `grammar` (a Lark grammar string, or `{"lark": ...}`, `{"regex": ...}`,
    /// `{"json_schema": {...}}`).
    pub grammar: Option<Grammar>,
    /// The grammar came from the `grammar` field (not `response_format`): where errors point.
    pub grammar_field: bool,
    /// Functions the model may call (`tools`).
    pub tools: Vec<ToolSpec>,
    /// What it may do with them (`tool_choice`).
    pub tool_choice: ToolChoice,
    /// More than one call per answer allowed (`parallel_tool_calls`, default true).
    pub parallel_tool_calls: bool,
    /// Choices to generate (`n`, 1–16).
    pub n: usize,
    /// The priority `service_tier` asked for (`flex`: background), if it said.
    pub priority: Option<anelm_engine::Priority>,
    /// The request used the legacy `functions`/`function_call` (the answer uses them too).
    pub legacy_functions: bool,
    /// Non-standard `speculate`: speculative decoding by prompt lookup for this request.
    pub speculate: anelm_engine::Speculation,
}

/// The prompt part of a request.
#[derive(Debug, Clone)]
pub enum Input {
    /// `/v1/chat/completions` messages.
    Chat(Vec<ChatMessage>),
    /// `/v1/completions` prompt text.
    Text(String),
}

fn bad(param: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("'{param}' {what}"), Some(param))
}

fn number(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| bad(key, "must be a finite number")),
        Some(_) => Err(bad(key, "must be a number")),
    }
}

fn count(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(|v| Some(v as usize))
            .ok_or_else(|| bad(key, "must be a non-negative integer")),
        Some(_) => Err(bad(key, "must be a non-negative integer")),
    }
}

fn content_text(v: &Value, at: usize) -> Result<String, ApiError> {
    let param = format!("messages[{at}].content");
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        // The array form: concatenate its text parts.
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(bad(&param, "parts must be {\"type\": \"text\", \"text\": ...}")),
                }
            }
            Ok(out)
        }
        _ => Err(bad(&param, "must be a string or an array of text parts")),
    }
}

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// Request fields both endpoints implement.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "seed",
    "stop",
    "ignore_eos",
    "n",
    "logprobs",
    "grammar",
    "service_tier",
    "logit_bias",
    "repetition_penalty",
    "speculate",
];
/// Fields only `/v1/chat/completions` implements.
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "chat_template_kwargs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "top_logprobs",
    "reasoning_effort",
    "modalities",
    "functions",
    "function_call",
];
/// Fields only `/v1/completions` implements.
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "best_of", "suffix"];
/// Fields accepted and ignored because they change nothing about the answer (bookkeeping for
/// the caller or for OpenAI's own platform). Documented in the README.
pub const IGNORED_FIELDS: &[&str] = &["user", "metadata", "store", "safety_identifier", "prompt_cache_key"];
/// Keys a chat message may have (`name` is accepted and not shown to the model).
const MESSAGE_FIELDS: &[&str] = &["role", "content", "name", "tool_calls", "tool_call_id"];

/// Refuse every field anelm does not implement, and every value of an implemented field that
/// asks for something not built yet, with a 400 naming it: a constraint the caller cannot know
/// was dropped is worse than an error.
fn refuse_unsupported(obj: &Map<String, Value>, chat: bool) -> Result<(), ApiError> {
    let endpoint = if chat { CHAT_FIELDS } else { COMPLETION_FIELDS };
    for key in obj.keys() {
        let k = key.as_str();
        if !(COMMON_FIELDS.contains(&k) || endpoint.contains(&k) || IGNORED_FIELDS.contains(&k)) {
            let other = if chat { COMPLETION_FIELDS } else { CHAT_FIELDS };
            let why = if other.contains(&k) {
                format!(
                    "is not a field of {}",
                    if chat {
                        "/v1/chat/completions"
                    } else {
                        "/v1/completions"
                    }
                )
            } else {
                "is not supported by anelm".to_string()
            };
            return Err(bad(k, &why));
        }
    }
    let absent_or = |key: &str, ok: &dyn Fn(&Value) -> bool| obj.get(key).is_none_or(|v| v.is_null() || ok(v));
    if !absent_or("parallel_tool_calls", &Value::is_boolean) {
        return Err(bad("parallel_tool_calls", "must be a boolean"));
    }
    if !absent_or("echo", &|v| v.as_bool() == Some(false)) {
        return Err(bad("echo", "is not supported yet"));
    }
    if !absent_or("best_of", &|v| v.as_u64() == Some(1)) {
        return Err(bad("best_of", "other than 1 is not supported"));
    }
    if !absent_or("suffix", &|v| v.as_str() == Some("")) {
        return Err(bad("suffix", "is not supported (no fill-in-the-middle)"));
    }
    if let Some(Value::Object(o)) = obj.get("stream_options")
        && let Some(k) = o.keys().find(|k| k.as_str() != "include_usage")
    {
        return Err(bad(&format!("stream_options.{k}"), "is not supported by anelm"));
    }
    Ok(())
}

/// The log-probability request: chat takes `logprobs: true` and `top_logprobs` (0–20, only
/// with `logprobs`), completions an integer `logprobs` (0–20 alternatives).
fn logprobs(obj: &Map<String, Value>, chat: bool) -> Result<Option<usize>, ApiError> {
    let limit = anelm_engine::stream::MAX_TOP_LOGPROBS;
    if chat {
        let on = match obj.get("logprobs") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("logprobs", "must be a boolean")),
        };
        let top = count(obj, "top_logprobs").map_err(|_| bad("top_logprobs", "must be an integer from 0 to 20"))?;
        match (on, top) {
            (_, Some(n)) if n > limit => Err(bad("top_logprobs", "must be an integer from 0 to 20")),
            (false, Some(n)) if n > 0 => Err(bad("top_logprobs", "needs \"logprobs\": true")),
            (false, _) => Ok(None),
            (true, n) => Ok(Some(n.unwrap_or(0))),
        }
    } else {
        match count(obj, "logprobs").map_err(|_| bad("logprobs", "must be an integer from 0 to 20"))? {
            Some(n) if n > limit => Err(bad("logprobs", "must be an integer from 0 to 20")),
            n => Ok(n),
        }
    }
}

const GRAMMAR_FORMS: &str =
    "must be a Lark grammar string, {\"lark\": ...}, {\"regex\": ...} or {\"json_schema\": {...}}";

/// The output grammar a request asks for, if any: OpenAI's `response_format` (chat) or the
/// non-standard `grammar` (both endpoints), never both.
fn grammar(obj: &Map<String, Value>) -> Result<Option<Grammar>, ApiError> {
    let from_format = match obj.get("response_format") {
        None | Some(Value::Null) => None,
        Some(Value::Object(f)) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Grammar::JsonObject),
            Some("json_schema") => {
                let Some(Value::Object(js)) = f.get("json_schema") else {
                    return Err(bad(
                        "response_format.json_schema",
                        "is required for type json_schema and must be an object",
                    ));
                };
                if !js.get("name").is_some_and(Value::is_string) {
                    return Err(bad(
                        "response_format.json_schema.name",
                        "is required and must be a string",
                    ));
                }
                if !js.get("strict").is_none_or(|v| v.is_boolean() || v.is_null()) {
                    return Err(bad("response_format.json_schema.strict", "must be a boolean"));
                }
                match js.get("schema") {
                    Some(s @ Value::Object(_)) => Some(Grammar::JsonSchema(s.clone())),
                    Some(Value::Bool(true)) | None => Some(Grammar::JsonSchema(Value::Object(Map::new()))),
                    Some(_) => {
                        return Err(bad(
                            "response_format.json_schema.schema",
                            "must be a JSON schema object",
                        ));
                    }
                }
            }
            _ => {
                return Err(bad(
                    "response_format.type",
                    "must be \"text\", \"json_object\" or \"json_schema\"",
                ));
            }
        },
        Some(_) => return Err(bad("response_format", "must be an object")),
    };
    let from_grammar = match obj.get("grammar") {
        None | Some(Value::Null) => None,
        Some(Value::String(lark)) => Some(Grammar::Lark(lark.clone())),
        Some(Value::Object(g)) if g.len() == 1 => match g.iter().next() {
            Some((k, Value::String(l))) if k == "lark" => Some(Grammar::Lark(l.clone())),
            Some((k, Value::String(r))) if k == "regex" => Some(Grammar::Regex(r.clone())),
            Some((k, s @ Value::Object(_))) if k == "json_schema" => Some(Grammar::JsonSchema(s.clone())),
            _ => return Err(bad("grammar", GRAMMAR_FORMS)),
        },
        Some(_) => return Err(bad("grammar", GRAMMAR_FORMS)),
    };
    match (from_format, from_grammar) {
        (Some(_), Some(_)) => Err(bad("grammar", "cannot be combined with a JSON response_format")),
        (a, b) => Ok(a.or(b)),
    }
}

/// An assistant message's `tool_calls`, checked: each `{"id", "type": "function", "function":
/// {"name", "arguments"}}`.
fn message_tool_calls(m: &Value, i: usize) -> Result<Option<Vec<Value>>, ApiError> {
    let param = format!("messages[{i}].tool_calls");
    match m.get("tool_calls") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(calls)) if m.get("role").and_then(Value::as_str) == Some("assistant") => {
            for (j, c) in calls.iter().enumerate() {
                let f = &c["function"];
                if !f["name"].is_string() || !(f["arguments"].is_string() || f["arguments"].is_object()) {
                    return Err(bad(
                        &format!("{param}[{j}]"),
                        "must be {\"type\": \"function\", \"function\": {\"name\": string, \"arguments\": string}}",
                    ));
                }
            }
            Ok(Some(calls.clone()))
        }
        Some(_) => Err(bad(&param, "must be an array, on an assistant message")),
    }
}

/// What a request lets the model do with its tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tools, or `tool_choice: "none"`: plain text.
    None,
    /// The model decides (`"auto"`, the default with tools).
    Auto,
    /// A call is forced (`"required"` or a named function).
    Forced(ForcedCall),
}

/// `tools`, `tool_choice` and `parallel_tool_calls`, checked: every function has a name and an
/// object schema, the chosen function exists.
fn tools(obj: &Map<String, Value>) -> Result<(Vec<ToolSpec>, ToolChoice, bool), ApiError> {
    let mut specs = Vec::new();
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                let param = format!("tools[{i}]");
                if t.get("type").and_then(Value::as_str) != Some("function") {
                    return Err(bad(&format!("{param}.type"), "must be \"function\""));
                }
                let f = &t["function"];
                let Some(name) = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
                    return Err(bad(
                        &format!("{param}.function.name"),
                        "is required and must be a non-empty string",
                    ));
                };
                if specs.iter().any(|s: &ToolSpec| s.name == name) {
                    return Err(bad(&format!("{param}.function.name"), "repeats another tool's name"));
                }
                let description = match f.get("description") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(d)) => Some(d.clone()),
                    Some(_) => return Err(bad(&format!("{param}.function.description"), "must be a string")),
                };
                let parameters = match f.get("parameters") {
                    None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
                    Some(p @ Value::Object(_)) => p.clone(),
                    Some(_) => {
                        return Err(bad(
                            &format!("{param}.function.parameters"),
                            "must be a JSON schema object",
                        ));
                    }
                };
                specs.push(ToolSpec {
                    name: name.to_string(),
                    description,
                    parameters,
                });
            }
        }
        Some(_) => {
            return Err(bad(
                "tools",
                "must be an array of {\"type\": \"function\", \"function\": {...}}",
            ));
        }
    }
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => {
            if specs.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => {
                if specs.is_empty() {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                }
            }
            "required" if specs.is_empty() => return Err(bad("tool_choice", "is \"required\" but no tools are given")),
            "required" => ToolChoice::Forced(ForcedCall::Any),
            _ => {
                return Err(bad(
                    "tool_choice",
                    "must be \"none\", \"auto\", \"required\" or a named function",
                ));
            }
        },
        Some(v @ Value::Object(_)) => {
            let Some(name) = v["function"]["name"].as_str().filter(|_| v["type"] == "function") else {
                return Err(bad(
                    "tool_choice",
                    "must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            };
            if !specs.iter().any(|s| s.name == name) {
                return Err(bad("tool_choice", &format!("names '{name}', which is not in tools")));
            }
            ToolChoice::Forced(ForcedCall::Named(name.to_string()))
        }
        Some(_) => return Err(bad("tool_choice", "must be a string or an object")),
    };
    let parallel = obj.get("parallel_tool_calls").and_then(Value::as_bool).unwrap_or(true);
    Ok((specs, choice, parallel))
}

/// `logit_bias`: `{"token id": bias}` with bias in [-100, 100] (ids are checked against the
/// vocabulary when the request is submitted).
fn logit_bias(obj: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = obj.get("logit_bias") else {
        return Ok(Vec::new());
    };
    let Value::Object(m) = v else {
        return Err(bad("logit_bias", "must be an object mapping token ids to biases"));
    };
    if m.len() > 1024 {
        return Err(bad("logit_bias", "may name at most 1024 tokens"));
    }
    let mut out = Vec::with_capacity(m.len());
    for (k, b) in m {
        let id: u32 = k.parse().map_err(|_| {
            bad(
                "logit_bias",
                &format!("key '{k}' is not a token id (a non-negative integer)"),
            )
        })?;
        let b = b.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
            bad(
                "logit_bias",
                &format!("the bias of token {k} must be a number from -100 to 100"),
            )
        })?;
        out.push((id, b as f32));
    }
    out.sort_by_key(|(id, _)| *id);
    Ok(out)
}

/// The legacy `functions`/`function_call` request (and history: assistant `function_call`,
/// `function` messages) rewritten as `tools`/`tool_choice`/`tool_calls`/`tool` messages. Returns
/// whether the request used them.
fn legacy_functions(obj: &mut Map<String, Value>) -> Result<bool, ApiError> {
    let legacy = obj.contains_key("functions") || obj.contains_key("function_call");
    if legacy && (obj.contains_key("tools") || obj.contains_key("tool_choice")) {
        return Err(bad(
            "functions",
            "give tools/tool_choice or the legacy functions/function_call, not both",
        ));
    }
    if let Some(fs) = obj.remove("functions") {
        let Value::Array(fs) = fs else {
            return Err(bad("functions", "must be an array"));
        };
        let tools: Vec<Value> = fs
            .into_iter()
            .map(|f| json!({"type": "function", "function": f}))
            .collect();
        obj.insert("tools".into(), Value::Array(tools));
        obj.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    if let Some(fc) = obj.remove("function_call") {
        let choice = match &fc {
            Value::String(s) if s == "none" || s == "auto" => fc.clone(),
            Value::Object(o) if o.get("name").is_some_and(Value::is_string) => {
                json!({"type": "function", "function": {"name": o["name"]}})
            }
            _ => return Err(bad("function_call", "must be \"none\", \"auto\" or {\"name\": ...}")),
        };
        obj.insert("tool_choice".into(), choice);
    }
    // History written with the legacy fields.
    if let Some(Value::Array(msgs)) = obj.get_mut("messages") {
        let mut last_call = 0usize;
        for m in msgs.iter_mut() {
            let Some(o) = m.as_object_mut() else { continue };
            if let Some(call) = o.remove("function_call") {
                last_call += 1;
                o.insert(
                    "tool_calls".into(),
                    json!([{"id": format!("call_legacy_{last_call}"), "type": "function", "function": call}]),
                );
            }
            if o.get("role").and_then(Value::as_str) == Some("function") {
                o.insert("role".into(), json!("tool"));
                o.remove("name");
                o.insert("tool_call_id".into(), json!(format!("call_legacy_{last_call}")));
            }
        }
    }
    Ok(legacy)
}

/// Parse a request body for `chat` (messages) or completions (prompt).
pub fn parse(body: &[u8], chat: bool, max_context: usize) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    let Value::Object(obj) = v else {
        return Err(ApiError::bad_request("the body must be a JSON object", None));
    };
    // `null` for an optional field means the same as leaving it out.
    let mut obj: Map<String, Value> = obj.into_iter().filter(|(_, v)| !v.is_null()).collect();
    refuse_unsupported(&obj, chat)?;
    let legacy_functions = chat && legacy_functions(&mut obj)?;
    let input = if chat {
        let Some(Value::Array(msgs)) = obj.get("messages") else {
            return Err(bad("messages", "is required and must be an array"));
        };
        if msgs.is_empty() {
            return Err(bad("messages", "must not be empty"));
        }
        let mut out = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.iter().enumerate() {
            let Some(fields) = m.as_object() else {
                return Err(bad(&format!("messages[{i}]"), "must be an object"));
            };
            if let Some(k) = fields.keys().find(|k| !MESSAGE_FIELDS.contains(&k.as_str())) {
                return Err(bad(&format!("messages[{i}].{k}"), "is not supported by anelm"));
            }
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("messages[{i}].role"), "is required and must be a string"))?;
            let content = content_text(m.get("content").unwrap_or(&Value::Null), i)?;
            let mut msg = ChatMessage::new(role, content);
            msg.tool_calls = message_tool_calls(m, i)?;
            msg.tool_call_id = match m.get("tool_call_id") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if role == "tool" => Some(s.clone()),
                Some(_) => {
                    return Err(bad(
                        &format!("messages[{i}].tool_call_id"),
                        "must be a string, on a tool message",
                    ));
                }
            };
            out.push(msg);
        }
        Input::Chat(out)
    } else {
        match obj.get("prompt") {
            Some(Value::String(s)) => Input::Text(s.clone()),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                Input::Text(a[0].as_str().unwrap_or_default().to_string())
            }
            _ => return Err(bad("prompt", "is required and must be a string")),
        }
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream", "must be a boolean")),
    };
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let max_tokens = match (count(&obj, "max_completion_tokens")?, count(&obj, "max_tokens")?) {
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => DEFAULT_MAX_TOKENS.min(max_context),
    };
    if max_tokens == 0 {
        return Err(bad("max_tokens", "must be at least 1"));
    }
    if max_tokens > max_context {
        return Err(bad(
            "max_tokens",
            &format!("is larger than the context of {max_context} tokens"),
        ));
    }
    // OpenAI's default temperature is 1.
    let mut sampler = SamplerParams {
        temperature: number(&obj, "temperature")?.unwrap_or(1.0) as f32,
        ..SamplerParams::default()
    };
    if let Some(p) = number(&obj, "top_p")? {
        sampler.top_p = p as f32;
    }
    if let Some(k) = count(&obj, "top_k")? {
        sampler.top_k = k;
    }
    if let Some(p) = number(&obj, "min_p")? {
        sampler.min_p = p as f32;
    }
    if let Some(p) = number(&obj, "presence_penalty")? {
        sampler.presence_penalty = p as f32;
    }
    if let Some(p) = number(&obj, "frequency_penalty")? {
        sampler.frequency_penalty = p as f32;
    }
    let repetition = number(&obj, "repetition_penalty")?;
    if let (Some(a), Some(b)) = (number(&obj, "repeat_penalty")?, repetition)
        && a != b
    {
        return Err(bad(
            "repetition_penalty",
            "differs from repeat_penalty: give one of the two (they are the same setting)",
        ));
    }
    if let Some(p) = number(&obj, "repeat_penalty")?.or(repetition) {
        sampler.repeat_penalty = p as f32;
    }
    if let Some(s) = count(&obj, "seed")? {
        sampler.seed = s as u64;
    }
    if sampler.presence_penalty != 0.0 || sampler.frequency_penalty != 0.0 || sampler.repeat_penalty != 1.0 {
        sampler.penalty_last_n = sampler.penalty_last_n.max(64);
    }
    sampler
        .validate()
        .map_err(|e| ApiError::bad_request(format!("sampling parameters: {e}"), None))?;
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            let v: Option<Vec<String>> = a.iter().map(|s| s.as_str().map(str::to_string)).collect();
            let v = v.ok_or_else(|| bad("stop", "must be a string or an array of strings"))?;
            if v.len() > 16 {
                return Err(bad("stop", "may hold at most 16 strings"));
            }
            v
        }
        Some(_) => return Err(bad("stop", "must be a string or an array of strings")),
    };
    let template_kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(bad("chat_template_kwargs", "must be an object")),
    };
    let model = obj.get("model").and_then(Value::as_str).map(str::to_string);
    let logprobs = logprobs(&obj, chat)?;
    let grammar = grammar(&obj)?;
    let (tools, tool_choice, parallel_tool_calls) = tools(&obj)?;
    let logit_bias = logit_bias(&obj)?;
    if let Some(m) = obj.get("modalities") {
        let text_only = m
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|x| x == "text"));
        if !text_only {
            return Err(bad("modalities", "only [\"text\"] is supported (anelm generates text)"));
        }
    }
    if grammar.is_some() && matches!(tool_choice, ToolChoice::Forced(_)) {
        return Err(bad(
            "tool_choice",
            "cannot force a tool call together with a response_format or grammar",
        ));
    }
    let ignore_eos = match obj.get("ignore_eos") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("ignore_eos", "must be a boolean")),
    };
    if ignore_eos && grammar.is_some() {
        return Err(bad(
            "ignore_eos",
            "cannot be combined with a grammar or JSON response_format (the grammar decides where the output ends)",
        ));
    }
    let n = match count(&obj, "n").map_err(|_| bad("n", "must be an integer from 1 to 16"))? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES).contains(&n) => n,
        Some(_) => return Err(bad("n", "must be an integer from 1 to 16")),
    };
    let priority = crate::priority::of_service_tier(obj.get("service_tier"))?;
    let speculate = crate::speculate::parse(obj.get("speculate"))?;
    sampler.logit_bias = logit_bias;
    let mut template_kwargs = template_kwargs;
    if let Some(effort) = obj.get("reasoning_effort") {
        let think = match effort.as_str() {
            Some("none" | "minimal") => false,
            Some("low" | "medium" | "high") => true,
            _ => return Err(bad("reasoning_effort", "must be none, minimal, low, medium or high")),
        };
        // An explicit chat_template_kwargs.enable_thinking wins.
        template_kwargs.entry("enable_thinking").or_insert(Value::Bool(think));
    }
    Ok(Parsed {
        legacy_functions,
        priority,
        n,
        tools,
        tool_choice,
        parallel_tool_calls,
        grammar_field: obj.get("grammar").is_some_and(|v| !v.is_null()),
        grammar,
        logprobs,
        ignore_eos,
        input,
        stream,
        include_usage,
        max_tokens,
        sampler,
        stop,
        template_kwargs,
        model,
        speculate,
    })
}

impl Parsed {
    /// The tools the model sees: none with `tool_choice: "none"`.
    pub fn visible_tools(&self) -> &[ToolSpec] {
        if self.tool_choice == ToolChoice::None {
            &[]
        } else {
            &self.tools
        }
    }

    /// The scheduler request for already tokenized `prompt`, constrained by the compiled
    /// `grammar` when the request has one.
    pub fn request(&self, prompt: Vec<u32>, constraint: Option<Constraint>) -> Request {
        Request {
            prompt,
            stream: StreamOptions {
                max_tokens: self.max_tokens,
                sampler: self.sampler.clone(),
                stop: self.stop.clone(),
                ignore_eos: self.ignore_eos,
                logprobs: self.logprobs,
                constraint,
            },
            speculate: self.speculate,
        }
    }
}

#[cfg(test)]
mod new_field_tests {
    use super::*;

    #[test]
    fn the_newer_chat_fields_are_implemented() {
        let p = parse(
            br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"7":2.5,"3":-100},"repetition_penalty":1.3,"reasoning_effort":"none"}"#,
            true,
            100,
        )
        .unwrap();
        assert_eq!(p.sampler.logit_bias, vec![(3, -100.0), (7, 2.5)]);
        assert_eq!(p.sampler.repeat_penalty, 1.3);
        assert_eq!(p.template_kwargs["enable_thinking"], false);
        let p = parse(
            br#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false}}"#,
            true,
            100,
        )
        .unwrap();
        assert_eq!(p.template_kwargs["enable_thinking"], false, "explicit kwargs win");
    }

    #[test]
    fn legacy_functions_become_tools_and_their_history_tool_turns() {
        let p = parse(
            br#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}},{"role":"function","name":"f","content":"42"}],"functions":[{"name":"f","parameters":{"type":"object"}}],"function_call":{"name":"f"}}"#,
            true,
            100,
        )
        .unwrap();
        assert!(p.legacy_functions);
        assert_eq!(p.tools.len(), 1);
        assert_eq!(p.tool_choice, ToolChoice::Forced(ForcedCall::Named("f".into())));
        let Input::Chat(m) = &p.input else { unreachable!() };
        assert_eq!(m[2].role, "tool");
        assert_eq!(m[2].tool_call_id.as_deref(), Some("call_legacy_1"));
        assert!(m[1].tool_calls.is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_parsed_and_bad_ones_named() {
        let p = parse(
            br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0,"stop":"x","seed":3}"#,
            true,
            100,
        )
        .expect("valid");
        assert_eq!(p.max_tokens, 5);
        assert_eq!(p.sampler.temperature, 0.0);
        assert_eq!(p.stop, vec!["x".to_string()]);
        for (body, param) in [
            (&br#"{"messages":"hi"}"#[..], "messages"),
            (br#"{"messages":[{"content":"x"}]}"#, "messages[0].role"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
                "max_tokens",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1000}"#,
                "max_tokens",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                "stream",
            ),
            (br#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#, "stop"),
        ] {
            let e = parse(body, true, 100).expect_err("invalid");
            assert_eq!(e.param.as_deref(), Some(param), "{}", String::from_utf8_lossy(body));
        }
        assert!(parse(b"{not json", true, 100).is_err());
        // Nothing is silently ignored: unknown fields and unbuilt values are named.
        for (body, chat, param) in [
            (&br#"{"messages":[{"role":"user","content":"x"}],"frobnicate":1}"#[..], true, "frobnicate"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"a":5}}"#, true, "logit_bias"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":101}}"#, true, "logit_bias"),
            (br#"{"messages":[{"role":"user","content":"x"}],"modalities":["audio"]}"#, true, "modalities"),
            (br#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"}"#, true, "reasoning_effort"),
            (br#"{"messages":[{"role":"user","content":"x"}],"repeat_penalty":1.1,"repetition_penalty":1.2}"#, true, "repetition_penalty"),
            (br#"{"messages":[{"role":"user","content":"x"}],"functions":[],"tools":[]}"#, true, "functions"),
            (br#"{"messages":[{"role":"user","content":"x"}],"function_call":"maybe"}"#, true, "function_call"),
            (br#"{"messages":[{"role":"user","content":"x"}],"n":17}"#, true, "n"),
            (br#"{"messages":[{"role":"user","content":"x"}],"n":0}"#, true, "n"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logprobs":1}"#, true, "logprobs"),
            (br#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#, true, "top_logprobs"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}"#,
                true,
                "top_logprobs",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}}"#,
                true,
                "response_format.type",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{}}}}"#,
                true,
                "response_format.json_schema.name",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"grammar":"start: \"a\""}"#,
                true,
                "grammar",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"ignore_eos":true}"#,
                true,
                "ignore_eos",
            ),
            (br#"{"prompt":"x","grammar":{"lark":"a","regex":"b"}}"#, false, "grammar"),
            (br#"{"prompt":"x","response_format":{"type":"json_object"}}"#, false, "response_format"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]}"#,
                true,
                "tools[0].function.name",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}"#,
                true,
                "tools[0].function.parameters",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}"#,
                true,
                "tool_choice",
            ),
            (br#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"required"}"#, true, "tool_choice"),
            (br#"{"messages":[{"role":"user","content":"x","tool_call_id":"a"}]}"#, true, "messages[0].tool_call_id"),
            (br#"{"messages":[{"role":"user","content":"x","frob":"a"}]}"#, true, "messages[0].frob"),
            (br#"{"messages":[{"role":"user","content":"x"}],"prompt":"x"}"#, true, "prompt"),
            (br#"{"prompt":"x","messages":[]}"#, false, "messages"),
            (br#"{"prompt":"x","echo":true}"#, false, "echo"),
            (br#"{"prompt":"x","logprobs":true}"#, false, "logprobs"),
            (br#"{"prompt":"x","suffix":"y"}"#, false, "suffix"),
            (br#"{"prompt":"x","stream_options":{"include_usage":true,"x":1}}"#, false, "stream_options.x"),
        ] {
            let e = parse(body, chat, 100).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(param), "{}", String::from_utf8_lossy(body));
        }
        // Defaults of unbuilt features and bookkeeping fields are accepted.
        for body in [
            &br#"{"messages":[{"role":"user","content":"x","name":"a"}],"n":1,"logprobs":false,"user":"u","store":false,"metadata":{"a":"b"}}"#[..],
            br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"},"tools":[],"tool_choice":"none"}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":null,"temperature":null,"stop":null,"tools":null,"seed":null}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"modalities":["text"],"repetition_penalty":1.1,"logit_bias":{"5":-100}}"#,
        ] {
            parse(body, true, 100).expect("accepted");
        }
        parse(
            br#"{"prompt":"x","echo":false,"best_of":1,"logprobs":null,"n":1}"#,
            false,
            100,
        )
        .expect("accepted");
        let p = parse(br#"{"prompt":"x","logprobs":3}"#, false, 100).expect("accepted");
        assert_eq!(p.logprobs, Some(3));
        let p = parse(
            br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2}"#,
            true,
            100,
        )
        .expect("accepted");
        assert_eq!(p.logprobs, Some(2));
        let p = parse(
            br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true}"#,
            true,
            100,
        )
        .expect("ok");
        assert_eq!(p.logprobs, Some(0));
        let p = parse(
            br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"integer"},"strict":true}}}"#,
            true,
            100,
        )
        .expect("accepted");
        assert_eq!(
            p.grammar,
            Some(Grammar::JsonSchema(serde_json::json!({"type": "integer"})))
        );
        let p = parse(br#"{"prompt":"x","grammar":{"regex":"[0-9]+"}}"#, false, 100).expect("accepted");
        assert_eq!(p.grammar, Some(Grammar::Regex("[0-9]+".into())));
        assert!(p.grammar_field);
        let p = parse(
            br#"{"prompt":"x","grammar":{"json_schema":{"type":"object"}}}"#,
            false,
            100,
        )
        .expect("ok");
        assert_eq!(
            p.grammar,
            Some(Grammar::JsonSchema(serde_json::json!({"type": "object"})))
        );
        let p = parse(
            br#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"1"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","parallel_tool_calls":false}"#,
            true,
            100,
        )
        .expect("accepted");
        assert_eq!(p.tool_choice, ToolChoice::Forced(ForcedCall::Any));
        assert!(!p.parallel_tool_calls);
        assert_eq!(p.tools[0].name, "f");
        let Input::Chat(m) = &p.input else { panic!("chat") };
        assert!(m[1].tool_calls.is_some() && m[2].tool_call_id.as_deref() == Some("c"));
        assert!(parse(b"[]", false, 100).is_err());
        assert!(parse(br#"{"prompt":"a","temperature":-1}"#, false, 100).is_err());
    }
}
