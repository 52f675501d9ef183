//! Anthropic's Messages API: `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`. A request is translated into an OpenAI chat-completions
//! body and run through the chat handler ([`crate::internal`]), so the same scheduler,
//! constrained tool calls, reasoning split, upstream routing and privacy rules apply; the answer
//! (or its chunks) is translated back into Anthropic's message (or its stream events). Errors
//! take Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::api_error::ApiError;
use crate::internal::{self, ChunkStream, Endpoint};
use crate::openai::{self, Input};
use crate::{AppState, Ready};

/// Request fields `/v1/messages` implements.
const CREATE_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
];
/// Request fields `/v1/messages/count_tokens` implements.
const COUNT_FIELDS: &[&str] = &["model", "messages", "system", "tools", "tool_choice", "thinking"];
/// Fields accepted and ignored because they change nothing about the answer: bookkeeping
/// (`metadata`), routing and speed hints of Anthropic's platform, and prompt-caching hints (anelm
/// reuses prompt prefixes by itself).
const IGNORED_FIELDS: &[&str] = &[
    "metadata",
    "service_tier",
    "cache_control",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
];

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if (400..500).contains(&s) => "invalid_request_error",
        _ => "api_error",
    }
}

/// The Anthropic-shaped body of an error.
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// An [`ApiError`] answered in Anthropic's shape (status and `Retry-After` kept).
pub struct AnthropicError(pub ApiError);

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.respond_with(error_body(&self.0))
    }
}

fn bad(param: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("'{param}' {what}"), Some(param))
}

/// `obj[key]`, with `null` the same as absent.
fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// Refuse any key of `obj` (at `at`) outside `allowed`, naming it.
fn only(obj: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    match obj
        .keys()
        .find(|k| !allowed.contains(&k.as_str()) && !obj[k.as_str()].is_null())
    {
        Some(k) => Err(bad(&format!("{at}.{k}"), "is not supported by anelm's Messages API")),
        None => Ok(()),
    }
}

/// A Messages request as the chat-completions body that runs it.
#[derive(Clone, Debug)]
pub struct Translated {
    /// The OpenAI chat-completions body.
    pub body: Value,
    /// Stream the answer as Messages events.
    pub stream: bool,
    /// `thinking.display: "omitted"`: thinking blocks come back empty.
    pub omit_thinking: bool,
}

/// The text of a text block at `at`, checked.
fn text_block(b: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    only(b, &["type", "text", "cache_control", "citations"], at)?;
    if get(b, "citations").is_some_and(|c| c.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(bad(&format!("{at}.citations"), "is not supported by anelm"));
    }
    match b.get("text") {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(bad(&format!("{at}.text"), "is required and must be a string")),
    }
}

/// A content block: its `type`, its fields and where it is (`messages[i].content[j]`).
type BlockAt<'a> = (&'a str, &'a Map<String, Value>, String);

/// The blocks of a content array at `at`, each with its `type`.
fn blocks<'a>(v: &'a [Value], at: &str) -> Result<Vec<BlockAt<'a>>, ApiError> {
    let mut out = Vec::with_capacity(v.len());
    for (j, b) in v.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let Some(obj) = b.as_object() else {
            return Err(bad(&here, "must be a content block object"));
        };
        let Some(kind) = obj.get("type").and_then(Value::as_str) else {
            return Err(bad(&format!("{here}.type"), "is required and must be a string"));
        };
        out.push((kind, obj, here));
    }
    Ok(out)
}

fn unsupported_block(kind: &str, at: &str) -> ApiError {
    bad(
        &format!("{at}.type"),
        &format!(
            "'{kind}' is not supported by anelm's Messages API (text models): send text, tool_use and tool_result blocks"
        ),
    )
}

/// Text blocks (or a string) as one text; blocks are joined by a blank line.
fn texts(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(a) => {
            let mut parts = Vec::with_capacity(a.len());
            for (kind, b, here) in blocks(a, at)? {
                if kind != "text" {
                    return Err(unsupported_block(kind, &here));
                }
                parts.push(text_block(b, &here)?);
            }
            Ok(parts.join("\n\n"))
        }
        _ => Err(bad(at, "must be a string or an array of text blocks")),
    }
}

/// A chat message (OpenAI form) with `role` and `content`.
fn message(role: &str, content: String) -> Value {
    json!({"role": role, "content": content})
}

/// One Messages `messages[i]` as chat messages: a user turn's `tool_result` blocks become
/// `tool` messages (first, so they follow the calls they answer), its text one user message; an
/// assistant turn's `tool_use` blocks become `tool_calls`; thinking blocks of earlier answers
/// are dropped (as Anthropic drops them from the context).
fn turn(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let Some(obj) = m.as_object() else {
        return Err(bad(&at, "must be an object with role and content"));
    };
    only(obj, &["role", "content"], &at)?;
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        Some(r) => {
            return Err(bad(
                &format!("{at}.role"),
                &format!("must be \"user\" or \"assistant\", not '{r}' (the system prompt goes in 'system')"),
            ));
        }
        None => return Err(bad(&format!("{at}.role"), "is required: \"user\" or \"assistant\"")),
    };
    let content_at = format!("{at}.content");
    let list = match obj.get("content") {
        Some(Value::String(s)) => {
            out.push(message(role, s.clone()));
            return Ok(());
        }
        Some(Value::Array(a)) => a,
        _ => return Err(bad(&content_at, "is required: a string or an array of content blocks")),
    };
    let mut text = Vec::new();
    let mut results = Vec::new();
    let mut calls = Vec::new();
    for (kind, b, here) in blocks(list, &content_at)? {
        match (role, kind) {
            (_, "text") => text.push(text_block(b, &here)?),
            ("user", "tool_result") => {
                only(
                    b,
                    &["type", "tool_use_id", "content", "is_error", "cache_control"],
                    &here,
                )?;
                let Some(id) = b.get("tool_use_id").and_then(Value::as_str) else {
                    return Err(bad(&format!("{here}.tool_use_id"), "is required and must be a string"));
                };
                let mut content = match get(b, "content") {
                    None => String::new(),
                    Some(c) => texts(c, &format!("{here}.content"))?,
                };
                match get(b, "is_error") {
                    None | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => content = format!("Error: {content}"),
                    Some(_) => return Err(bad(&format!("{here}.is_error"), "must be a boolean")),
                }
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("assistant", "tool_use") => {
                only(b, &["type", "id", "name", "input", "cache_control"], &here)?;
                let (Some(id), Some(name)) = (
                    b.get("id").and_then(Value::as_str),
                    b.get("name").and_then(Value::as_str),
                ) else {
                    return Err(bad(&here, "needs a string 'id' and 'name'"));
                };
                let Some(input @ Value::Object(_)) = b.get("input") else {
                    return Err(bad(&format!("{here}.input"), "is required and must be an object"));
                };
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("assistant", "thinking" | "redacted_thinking") => {}
            (_, "tool_use" | "tool_result" | "thinking" | "redacted_thinking") => {
                return Err(bad(
                    &format!("{here}.type"),
                    &format!(
                        "'{kind}' blocks belong to {} messages",
                        if role == "user" { "assistant" } else { "user" }
                    ),
                ));
            }
            _ => return Err(unsupported_block(kind, &here)),
        }
    }
    let only_results = text.is_empty() && !results.is_empty();
    out.extend(results);
    if role == "assistant" {
        let mut msg = message(role, text.join("\n\n"));
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    } else if !only_results {
        out.push(message(role, text.join("\n\n")));
    }
    Ok(())
}

/// `tools` as OpenAI function tools, with their names.
fn tools(v: &Value) -> Result<(Vec<Value>, Vec<String>), ApiError> {
    let Value::Array(list) = v else {
        return Err(bad(
            "tools",
            "must be an array of {\"name\", \"description\", \"input_schema\"}",
        ));
    };
    let mut out = Vec::with_capacity(list.len());
    let mut names = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Some(obj) = t.as_object() else {
            return Err(bad(&at, "must be an object"));
        };
        match get(obj, "type").map(|t| t.as_str()) {
            None | Some(Some("custom")) => {}
            Some(Some(other)) => {
                return Err(bad(
                    &format!("{at}.type"),
                    &format!(
                        "'{other}' is a server tool anelm does not have: define it as a custom tool with an input_schema and run it yourself"
                    ),
                ));
            }
            Some(None) => return Err(bad(&format!("{at}.type"), "must be \"custom\"")),
        }
        only(
            obj,
            &["type", "name", "description", "input_schema", "cache_control", "strict"],
            &at,
        )?;
        let Some(name) = obj.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
            return Err(bad(&format!("{at}.name"), "is required and must be a non-empty string"));
        };
        let schema = match obj.get("input_schema") {
            Some(s @ Value::Object(o)) if o.get("type").is_none_or(|t| t == "object") => s.clone(),
            _ => {
                return Err(bad(
                    &format!("{at}.input_schema"),
                    "is required and must be a JSON schema of type \"object\"",
                ));
            }
        };
        match get(obj, "strict") {
            None | Some(Value::Bool(false)) => {}
            _ => {
                return Err(bad(
                    &format!("{at}.strict"),
                    "is not supported yet (a call forced with tool_choice any or tool always matches its schema)",
                ));
            }
        }
        let mut function = json!({"name": name, "parameters": schema});
        match get(obj, "description") {
            None => {}
            Some(Value::String(d)) => function["description"] = json!(d),
            Some(_) => return Err(bad(&format!("{at}.description"), "must be a string")),
        }
        names.push(name.to_string());
        out.push(json!({"type": "function", "function": function}));
    }
    Ok((out, names))
}

/// `tool_choice` as OpenAI's `tool_choice` and `parallel_tool_calls`.
fn tool_choice(v: &Value, names: &[String]) -> Result<(Value, Option<bool>), ApiError> {
    let Some(obj) = v.as_object() else {
        return Err(bad(
            "tool_choice",
            "must be an object: {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
        ));
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or_default();
    let allowed: &[&str] = match kind {
        "tool" => &["type", "name", "disable_parallel_tool_use"],
        "none" => &["type"],
        _ => &["type", "disable_parallel_tool_use"],
    };
    only(obj, allowed, "tool_choice")?;
    let parallel = match get(obj, "disable_parallel_tool_use") {
        None => None,
        Some(Value::Bool(b)) => Some(!b),
        Some(_) => return Err(bad("tool_choice.disable_parallel_tool_use", "must be a boolean")),
    };
    let choice = match kind {
        "auto" => json!("auto"),
        "none" => json!("none"),
        "any" if names.is_empty() => return Err(bad("tool_choice", "is \"any\" but no tools are given")),
        "any" => json!("required"),
        "tool" => {
            let Some(name) = obj.get("name").and_then(Value::as_str) else {
                return Err(bad("tool_choice.name", "is required with type \"tool\""));
            };
            if !names.iter().any(|n| n == name) {
                return Err(bad(
                    "tool_choice.name",
                    &format!("names '{name}', which is not in tools"),
                ));
            }
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(bad(
                "tool_choice.type",
                "must be \"auto\", \"any\", \"tool\" or \"none\"",
            ));
        }
    };
    Ok((choice, parallel))
}

/// `thinking` as the template's thinking switch, and whether thinking text is omitted.
fn thinking(v: &Value) -> Result<(bool, bool), ApiError> {
    let Some(obj) = v.as_object() else {
        return Err(bad(
            "thinking",
            "must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
        ));
    };
    let omit = match get(obj, "display").map(Value::as_str) {
        None | Some(Some("summarized")) => false,
        Some(Some("omitted")) => true,
        Some(_) => return Err(bad("thinking.display", "must be \"summarized\" or \"omitted\"")),
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            only(obj, &["type", "budget_tokens", "display"], "thinking")?;
            if obj.get("budget_tokens").and_then(Value::as_u64).is_none_or(|n| n < 1) {
                return Err(bad(
                    "thinking.budget_tokens",
                    "is required with type \"enabled\": a positive integer",
                ));
            }
            Ok((true, omit))
        }
        Some("adaptive") => {
            only(obj, &["type", "display"], "thinking")?;
            Ok((true, omit))
        }
        Some("disabled") => {
            only(obj, &["type"], "thinking")?;
            Ok((false, false))
        }
        _ => Err(bad(
            "thinking.type",
            "must be \"enabled\", \"adaptive\" or \"disabled\"",
        )),
    }
}

/// Translate a Messages request (`count`: a `count_tokens` request) into a chat-completions body.
pub fn to_chat(v: &Value, count: bool) -> Result<Translated, ApiError> {
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad_request("the body must be a JSON object", None));
    };
    let (fields, other, route) = if count {
        (COUNT_FIELDS, CREATE_FIELDS, "/v1/messages/count_tokens")
    } else {
        (CREATE_FIELDS, COUNT_FIELDS, "/v1/messages")
    };
    for (k, val) in obj {
        let k = k.as_str();
        if fields.contains(&k) || IGNORED_FIELDS.contains(&k) || val.is_null() {
            continue;
        }
        return Err(if other.contains(&k) {
            bad(k, &format!("is not a field of {route}"))
        } else {
            bad(k, "is not supported by anelm's Messages API")
        });
    }
    let mut body = Map::new();
    if let Some(m) = get(obj, "model") {
        if !m.is_string() {
            return Err(bad("model", "must be a string"));
        }
        body.insert("model".into(), m.clone());
    }
    if !count {
        match get(obj, "max_tokens").map(Value::as_u64) {
            Some(Some(n)) if n >= 1 => body.insert("max_tokens".into(), json!(n)),
            Some(_) => return Err(bad("max_tokens", "must be a positive integer")),
            None => return Err(bad("max_tokens", "is required: the most tokens to generate")),
        };
    }
    let mut messages = Vec::new();
    if let Some(s) = get(obj, "system") {
        let system = texts(s, "system")?;
        if !system.is_empty() {
            messages.push(message("system", system));
        }
    }
    let Some(Value::Array(turns)) = get(obj, "messages") else {
        return Err(bad("messages", "is required and must be an array"));
    };
    if turns.is_empty() {
        return Err(bad("messages", "must not be empty"));
    }
    for (i, m) in turns.iter().enumerate() {
        turn(m, i, &mut messages)?;
    }
    if turns
        .last()
        .and_then(|m| m.get("role"))
        .is_some_and(|r| r == "assistant")
    {
        return Err(bad(
            &format!("messages[{}]", turns.len() - 1),
            "is an assistant message: continuing a prefilled answer is not supported yet; end with a user message",
        ));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(s) = get(obj, "stop_sequences") {
        let list = s.as_array().filter(|a| a.iter().all(Value::is_string));
        match list {
            Some(a) if a.len() <= 16 => body.insert("stop".into(), s.clone()),
            Some(_) => return Err(bad("stop_sequences", "may hold at most 16 strings")),
            None => return Err(bad("stop_sequences", "must be an array of strings")),
        };
    }
    for key in ["temperature", "top_p", "top_k"] {
        if let Some(x) = get(obj, key) {
            body.insert(key.into(), x.clone());
        }
    }
    let stream = match get(obj, "stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream", "must be a boolean")),
    };
    if stream {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let names = match get(obj, "tools") {
        None => Vec::new(),
        Some(t) => {
            let (list, names) = tools(t)?;
            if !list.is_empty() {
                body.insert("tools".into(), Value::Array(list));
            }
            names
        }
    };
    if let Some(c) = get(obj, "tool_choice") {
        let (choice, parallel) = tool_choice(c, &names)?;
        if !names.is_empty() {
            body.insert("tool_choice".into(), choice);
            if let Some(p) = parallel {
                body.insert("parallel_tool_calls".into(), json!(p));
            }
        }
    }
    let mut omit_thinking = false;
    if let Some(t) = get(obj, "thinking") {
        let (on, omit) = thinking(t)?;
        omit_thinking = omit;
        body.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
    }
    Ok(Translated {
        body: Value::Object(body),
        stream,
        omit_thinking,
    })
}

/// Anthropic's `stop_reason` and `stop_sequence` for a chat choice's `finish_reason` (and the
/// stop string it names as `stop_reason`, when one ended it).
pub fn stop_reason(finish: &Value, stop_string: &Value) -> (&'static str, Value) {
    match finish.as_str() {
        Some("tool_calls") => ("tool_use", Value::Null),
        Some("length") => ("max_tokens", Value::Null),
        Some("stop") if stop_string.is_string() => ("stop_sequence", stop_string.clone()),
        _ => ("end_turn", Value::Null),
    }
}

/// A Messages id for a chat answer's id.
fn message_id(chat_id: &Value) -> String {
    let id = chat_id.as_str().unwrap_or_default();
    format!("msg_{}", id.strip_prefix("chatcmpl-").unwrap_or(id))
}

/// A `tool_use` block id for a chat tool call's id.
fn tool_use_id(call_id: &Value) -> String {
    let id = call_id.as_str().unwrap_or_default();
    format!("toolu_{}", id.strip_prefix("call_").unwrap_or(id))
}

/// A call's `arguments` (a JSON string) as the `tool_use` block's `input` object.
fn tool_input(arguments: &Value) -> Value {
    match arguments {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| json!({})),
        v @ Value::Object(_) => v.clone(),
        _ => json!({}),
    }
}

/// Translate a whole chat-completions answer into a Messages `message`.
pub fn from_chat(chat: &Value, omit_thinking: bool) -> Value {
    let choice = &chat["choices"][0];
    let msg = &choice["message"];
    let mut content = Vec::new();
    if let Some(r) = msg["reasoning_content"].as_str() {
        let r = if omit_thinking { "" } else { r };
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(t) = msg["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": t}));
    }
    for call in msg["tool_calls"].as_array().into_iter().flatten() {
        content.push(json!({"type": "tool_use", "id": tool_use_id(&call["id"]),
                            "name": call["function"]["name"], "input": tool_input(&call["function"]["arguments"])}));
    }
    let (reason, sequence) = stop_reason(&choice["finish_reason"], &choice["stop_reason"]);
    json!({
        "id": message_id(&chat["id"]), "type": "message", "role": "assistant", "model": chat["model"],
        "content": content, "stop_reason": reason, "stop_sequence": sequence,
        "usage": {"input_tokens": chat["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                  "output_tokens": chat["usage"]["completion_tokens"].as_u64().unwrap_or(0)},
    })
}

/// The kind of content block a stream has open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// Turns a chat answer's chunks into Messages stream events, in Anthropic's order:
/// `message_start`; per block `content_block_start`, its deltas, `content_block_stop` (a `ping`
/// after the first block's start); `message_delta` with `stop_reason` and `usage`;
/// `message_stop`.
#[derive(Debug, Default)]
pub struct EventWriter {
    omit_thinking: bool,
    open: Option<Block>,
    /// Blocks started so far (the next one's index).
    blocks: usize,
    pinged: bool,
    finish: Value,
    stop_string: Value,
    usage: Option<(u64, u64)>,
}

/// One stream event: its name and data.
pub type StreamEvent = (&'static str, Value);

impl EventWriter {
    /// A writer; `omit_thinking` sends thinking blocks without their text.
    pub fn new(omit_thinking: bool) -> Self {
        Self {
            omit_thinking,
            ..Self::default()
        }
    }

    /// `message_start` for the answer whose first chunk is `first`, with the prompt's tokens.
    pub fn start(&self, first: &Value, input_tokens: usize) -> StreamEvent {
        let message = json!({"id": message_id(&first["id"]), "type": "message", "role": "assistant",
                             "model": first["model"], "content": [], "stop_reason": null, "stop_sequence": null,
                             "usage": {"input_tokens": input_tokens, "output_tokens": 0}});
        ("message_start", json!({"type": "message_start", "message": message}))
    }

    fn close(&mut self, out: &mut Vec<StreamEvent>) {
        if self.open.take().is_some() {
            let index = self.blocks - 1;
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn open(&mut self, kind: Block, block: Value, out: &mut Vec<StreamEvent>) {
        self.close(out);
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
        ));
        self.blocks += 1;
        self.open = Some(kind);
        if !self.pinged {
            self.pinged = true;
            out.push(("ping", json!({"type": "ping"})));
        }
    }

    fn delta(&self, delta: Value) -> StreamEvent {
        let index = self.blocks.saturating_sub(1);
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    /// The events one chat chunk gives.
    pub fn chunk(&mut self, chunk: &Value) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| u[k].as_u64().unwrap_or(0);
            self.usage = Some((n("prompt_tokens"), n("completion_tokens")));
        }
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        if let Some(r) = delta["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
            if self.open != Some(Block::Thinking) {
                let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                self.open(Block::Thinking, start, &mut out);
            }
            if !self.omit_thinking {
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": r})));
            }
        }
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            if self.open != Some(Block::Text) {
                self.open(Block::Text, json!({"type": "text", "text": ""}), &mut out);
            }
            out.push(self.delta(json!({"type": "text_delta", "text": t})));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            if call.get("id").is_some_and(Value::is_string) {
                let block = json!({"type": "tool_use", "id": tool_use_id(&call["id"]),
                                   "name": call["function"]["name"], "input": {}});
                self.open(Block::ToolUse, block, &mut out);
            }
            if let Some(args) = call["function"]["arguments"].as_str().filter(|a| !a.is_empty())
                && self.open == Some(Block::ToolUse)
            {
                out.push(self.delta(json!({"type": "input_json_delta", "partial_json": args})));
            }
        }
        if !choice["finish_reason"].is_null() {
            self.finish = choice["finish_reason"].clone();
            self.stop_string = choice.get("stop_reason").cloned().unwrap_or(Value::Null);
        }
        out
    }

    /// The closing events once the chat stream has ended; an `error` event if it ended
    /// without finishing.
    pub fn end(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if self.finish.is_null() {
            out.push(error_event("the answer ended without a finish reason"));
            return out;
        }
        self.close(&mut out);
        if !self.pinged {
            self.pinged = true;
            out.push(("ping", json!({"type": "ping"})));
        }
        let (reason, sequence) = stop_reason(&self.finish, &self.stop_string);
        let mut usage = json!({"output_tokens": 0});
        if let Some((input, output)) = self.usage {
            usage = json!({"input_tokens": input, "output_tokens": output});
        }
        out.push((
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": usage}),
        ));
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }
}

/// An `error` stream event (the answer failed after it started).
fn error_event(message: &str) -> StreamEvent {
    (
        "error",
        json!({"type": "error", "error": {"type": "api_error", "message": message}}),
    )
}

/// The tokens of the prompt a chat `body` renders to on the served model (what the chat
/// handler prefills for it).
fn prompt_tokens(ready: &Ready, body: &Value) -> Result<usize, ApiError> {
    let ctx = ready.scheduler.config().ctx_size;
    let parsed = openai::parse(body.to_string().as_bytes(), true, ctx)?;
    if !matches!(parsed.input, Input::Chat(_)) {
        return Err(ApiError::bad_request("'messages' is required", Some("messages")));
    }
    Ok(crate::render_prompt(&ready.model, &parsed)?.1.len())
}

/// Whether a translated body's `model` names an upstream (it runs there, not here).
fn upstream_model(st: &AppState, body: &Value) -> bool {
    body["model"].as_str().is_some_and(|m| st.upstreams.named(m).is_some())
}

/// The request's JSON, after the key check and the body limit.
fn request(st: &AppState, headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    st.check_key(headers)?;
    let bytes = st.body(body)?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))
}

/// `POST /v1/messages`.
pub async fn messages(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match create(st, headers, body).await {
        Ok(r) => r,
        Err(e) => AnthropicError(e).into_response(),
    }
}

async fn create(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let v = request(&st, &headers, body)?;
    let t = to_chat(&v, false)?;
    if !t.stream {
        let chat = internal::call(st, headers, &t.body, Endpoint::Chat).await?;
        return Ok(Json(from_chat(&chat, t.omit_thinking)).into_response());
    }
    let mut chunks = internal::stream(st.clone(), headers, &t.body, Endpoint::Chat).await?;
    // The first chunk (the assistant role) names the answer; by then the model is live.
    let first = match chunks.next().await {
        Some(Ok(c)) => c,
        Some(Err(e)) => return Err(e),
        None => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the answer ended before it started",
            ));
        }
    };
    let input_tokens = match st.ready.get() {
        Some(ready) if !upstream_model(&st, &t.body) => prompt_tokens(&ready, &t.body).unwrap_or(0),
        _ => 0, // counted by the upstream: message_delta carries it
    };
    let mut writer = EventWriter::new(t.omit_thinking);
    let mut queue: VecDeque<StreamEvent> = VecDeque::new();
    queue.push_back(writer.start(&first, input_tokens));
    queue.extend(writer.chunk(&first));
    let state = (chunks, writer, queue, false);
    let events = futures_util::stream::unfold(state, |(mut chunks, mut writer, mut queue, mut ended)| async move {
        loop {
            if let Some((name, data)) = queue.pop_front() {
                let ev = SseEvent::default().event(name).data(data.to_string());
                return Some((Ok::<_, Infallible>(ev), (chunks, writer, queue, ended)));
            }
            if ended {
                return None;
            }
            match ChunkStream::next(&mut chunks).await {
                Some(Ok(c)) => queue.extend(writer.chunk(&c)),
                Some(Err(e)) => {
                    queue.push_back(error_event(&e.message));
                    ended = true;
                }
                None => {
                    queue.extend(writer.end());
                    ended = true;
                }
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the tokens of the prompt the request
/// renders to on the served model.
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let counted = async {
        let v = request(&st, &headers, body)?;
        let t = to_chat(&v, true)?;
        if upstream_model(&st, &t.body) {
            return Err(bad(
                "model",
                "names an upstream model: count_tokens counts with the served model's tokenizer only; ask the upstream",
            ));
        }
        st.ready.touch();
        let ready = st.live().await?;
        prompt_tokens(&ready, &t.body)
    };
    match counted.await {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => AnthropicError(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: Value) -> Value {
        to_chat(&v, false).expect("translates").body
    }

    #[test]
    fn requests_become_chat_bodies() {
        let b = chat(json!({
            "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Here:"},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "3 C"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "oops", "is_error": true}]},
            ],
            "stop_sequences": ["END"], "temperature": 0, "top_k": 5, "top_p": 0.9, "metadata": {"user_id": "u"},
            "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "tool", "name": "get", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }));
        assert_eq!(
            b,
            json!({
                "model": "m", "max_tokens": 9,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "Let me look.", "tool_calls": [
                        {"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Oslo\"}"}}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "3 C"},
                    {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: oops"},
                    {"role": "user", "content": "Here:"},
                ],
                "stop": ["END"], "temperature": 0, "top_k": 5, "top_p": 0.9,
                "tools": [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "get"}},
                "parallel_tool_calls": false,
                "chat_template_kwargs": {"enable_thinking": true},
            })
        );
        let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        for (choice, want) in [
            (json!({"type": "auto"}), json!("auto")),
            (json!({"type": "any"}), json!("required")),
            (json!({"type": "none"}), json!("none")),
        ] {
            let b = chat(json!({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                                "tools": tools, "tool_choice": choice}));
            assert_eq!(b["tool_choice"], want);
        }
        let t = to_chat(
            &json!({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "stream": true,
                    "thinking": {"type": "disabled"}}),
            false,
        )
        .expect("ok");
        assert!(t.stream);
        assert_eq!(t.body["stream_options"], json!({"include_usage": true}));
        assert_eq!(t.body["chat_template_kwargs"], json!({"enable_thinking": false}));
        // count_tokens takes no max_tokens.
        let t = to_chat(
            &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            true,
        )
        .expect("ok");
        assert!(t.body.get("max_tokens").is_none());
    }

    #[test]
    fn bad_requests_are_named() {
        let user = json!([{"role": "user", "content": "x"}]);
        for (body, count, param) in [
            (json!({"messages": user}), false, "max_tokens"),
            (json!({"messages": user, "max_tokens": 0}), false, "max_tokens"),
            (json!({"messages": user, "max_tokens": 1}), true, "max_tokens"),
            (json!({"max_tokens": 1}), false, "messages"),
            (json!({"messages": [], "max_tokens": 1}), false, "messages"),
            (
                json!({"messages": [{"role": "system", "content": "x"}], "max_tokens": 1}),
                false,
                "messages[0].role",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "frobnicate": 1}),
                false,
                "frobnicate",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "output_config": {}}),
                false,
                "output_config",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "name": "a"}], "max_tokens": 1}),
                false,
                "messages[0].name",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 1}),
                false,
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}], "max_tokens": 1}),
                false,
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "max_tokens": 1}),
                false,
                "messages[1]",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "stop_sequences": "x"}),
                false,
                "stop_sequences",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "tools": [{"type": "web_search_20250305", "name": "w"}]}),
                false,
                "tools[0].type",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "tools": [{"name": "f", "input_schema": {"type": "string"}}]}),
                false,
                "tools[0].input_schema",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}}),
                false,
                "tool_choice.name",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "tool_choice": {"type": "any"}}),
                false,
                "tool_choice",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "thinking": {"type": "enabled"}}),
                false,
                "thinking.budget_tokens",
            ),
            (
                json!({"messages": user, "max_tokens": 1, "thinking": {"type": "between_tools"}}),
                false,
                "thinking.type",
            ),
        ] {
            let e = to_chat(&body, count).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
        // Fields that change nothing, and nulls, are accepted.
        to_chat(
            &json!({"messages": user, "max_tokens": 1, "metadata": {"user_id": "u"}, "service_tier": "auto",
                    "top_k": null, "anything_null": null}),
            false,
        )
        .expect("accepted");
    }

    #[test]
    fn answers_become_messages() {
        let answer = json!({
            "id": "chatcmpl-7", "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Sure.", "reasoning_content": "think",
                "tool_calls": [{"id": "call_x_0_0", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15},
        });
        assert_eq!(
            from_chat(&answer, false),
            json!({
                "id": "msg_7", "type": "message", "role": "assistant", "model": "m",
                "content": [
                    {"type": "thinking", "thinking": "think", "signature": ""},
                    {"type": "text", "text": "Sure."},
                    {"type": "tool_use", "id": "toolu_x_0_0", "name": "get", "input": {"a": 1}},
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 11, "output_tokens": 4},
            })
        );
        assert_eq!(from_chat(&answer, true)["content"][0]["thinking"], "");
        for (finish, stop, want) in [
            ("stop", Value::Null, ("end_turn", Value::Null)),
            ("stop", json!("END"), ("stop_sequence", json!("END"))),
            ("length", Value::Null, ("max_tokens", Value::Null)),
        ] {
            assert_eq!(stop_reason(&json!(finish), &stop), want);
        }
    }

    fn names(events: &[StreamEvent]) -> Vec<&'static str> {
        events.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn chunks_become_events_in_order() {
        let chunk = |delta: Value, finish: Value| json!({"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        let mut w = EventWriter::new(false);
        let first = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        let mut events = vec![w.start(&first, 7)];
        events.extend(w.chunk(&first));
        events.extend(w.chunk(&chunk(json!({"reasoning_content": "hm"}), Value::Null)));
        events.extend(w.chunk(&chunk(json!({"content": "Hi"}), Value::Null)));
        events.extend(w.chunk(&chunk(json!({"content": " there"}), Value::Null)));
        events.extend(w.chunk(&chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
            Value::Null,
        )));
        events.extend(w.chunk(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\":1}"}}]}),
            Value::Null,
        )));
        let mut last = chunk(json!({}), json!("tool_calls"));
        last["choices"][0]["stop_reason"] = Value::Null;
        events.extend(w.chunk(&last));
        events.extend(w.chunk(&json!({"id": "chatcmpl-1", "choices": [],
                                      "usage": {"prompt_tokens": 7, "completion_tokens": 5}})));
        events.extend(w.end());
        assert_eq!(
            names(&events),
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(events[0].1["message"]["id"], "msg_1");
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 7);
        assert_eq!(events[1].1["content_block"]["type"], "thinking");
        assert_eq!(
            events[3].1["delta"],
            json!({"type": "thinking_delta", "thinking": "hm"})
        );
        assert_eq!(events[6].1["delta"], json!({"type": "text_delta", "text": "Hi"}));
        assert_eq!(events[6].1["index"], 1);
        assert_eq!(
            events[9].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_a", "name": "f", "input": {}})
        );
        assert_eq!(
            events[10].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"x\":1}"})
        );
        assert_eq!(events[11].1["index"], 2);
        assert_eq!(
            events[12].1,
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                   "usage": {"input_tokens": 7, "output_tokens": 5}})
        );
        // A stop string ends with stop_sequence; an empty answer still pings once.
        let mut w = EventWriter::new(false);
        let mut last = chunk(json!({}), json!("stop"));
        last["choices"][0]["stop_reason"] = json!("END");
        let mut events = w.chunk(&last);
        events.extend(w.end());
        assert_eq!(names(&events), ["ping", "message_delta", "message_stop"]);
        assert_eq!(
            events[1].1["delta"],
            json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
        );
        // A stream cut short is an error event.
        assert_eq!(names(&EventWriter::new(false).end()), ["error"]);
    }

    #[test]
    fn errors_take_anthropics_shape() {
        for (status, kind) in [
            (StatusCode::BAD_REQUEST, "invalid_request_error"),
            (StatusCode::UNAUTHORIZED, "authentication_error"),
            (StatusCode::NOT_FOUND, "not_found_error"),
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
            (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error"),
        ] {
            let e = ApiError::new(status, "server_error", "why");
            assert_eq!(
                error_body(&e),
                json!({"type": "error", "error": {"type": kind, "message": "why"}})
            );
        }
        let resp =
            AnthropicError(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "x", "full").retry_after(1)).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            resp.headers()
                .get(axum::http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
    }
}
