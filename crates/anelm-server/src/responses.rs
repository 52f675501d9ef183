//! OpenAI's Responses API: `POST /v1/responses` (whole or streamed with the semantic events),
//! `GET /v1/responses/{id}` and `DELETE /v1/responses/{id}` for stored responses. A request is
//! translated into a chat-completions body and run through the same handler
//! ([`crate::internal`]), so tools, structured outputs, reasoning, priority, prefix sharing,
//! upstreams and privacy behave exactly as on `/v1/chat/completions`; the answer is translated
//! back into `output` items (`reasoning`, `message`, `function_call`). `store` (default true,
//! as OpenAI's) keeps the response and its conversation, which `previous_response_id` continues
//! (in the data directory when the server has one, else in memory, bounded).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::AppState;
use crate::api_error::ApiError;
use crate::files_api::blocking;
use crate::internal::{self, Endpoint};
use crate::job_store::new_id;

/// Request fields the Responses API takes here.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "reasoning",
    "store",
    "previous_response_id",
    "stream",
    "metadata",
    "parallel_tool_calls",
    "user",
    "truncation",
    "service_tier",
    "top_logprobs",
    "include",
    "safety_identifier",
    "prompt_cache_key",
    "seed",
];

fn bad(param: &str, what: impl Into<String>) -> ApiError {
    ApiError::bad_request(what.into(), Some(param))
}

/// The text of a content value: a string, or an array of text parts.
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                        out.push_str(p.get("text").and_then(Value::as_str).unwrap_or_default());
                    }
                    Some(other) => {
                        return Err(bad(
                            &format!("{param}[{i}]"),
                            format!("content of type '{other}' is not supported (text only)"),
                        ));
                    }
                    None => return Err(bad(&format!("{param}[{i}]"), "a content part needs a `type`")),
                }
            }
            Ok(out)
        }
        _ => Err(bad(param, "must be a string or an array of content parts")),
    }
}

/// `input` as chat messages (the conversation's new turns).
pub fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => return Err(bad("input", "must be a string or an array of items")),
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    Some(r) => {
                        return Err(bad(
                            &param,
                            format!("role '{r}' is not user, assistant, system or developer"),
                        ));
                    }
                    None => return Err(bad(&param, "a message needs a `role`")),
                };
                let content = text_of(item.get("content").unwrap_or(&Value::Null), &format!("{param}.content"))?;
                out.push(json!({"role": role, "content": content}));
            }
            Some("function_call") => {
                let call_id = item.get("call_id").and_then(Value::as_str);
                let name = item.get("name").and_then(Value::as_str);
                let (Some(call_id), Some(name)) = (call_id, name) else {
                    return Err(bad(&param, "a function_call needs `call_id` and `name`"));
                };
                let arguments = item.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let call =
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Consecutive calls belong to one assistant turn.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" && last.get("tool_calls").is_some() => {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            Some("function_call_output") => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(bad(&param, "a function_call_output needs `call_id`"));
                };
                let output = text_of(item.get("output").unwrap_or(&Value::Null), &format!("{param}.output"))?;
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // Earlier reasoning is not shown to the model again (chat templates drop it too).
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(
                    &param,
                    format!(
                        "input items of type '{other}' are not supported (message, function_call, function_call_output, reasoning)"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// `tools` in the chat form (function tools only).
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(list) = tools else {
        return Err(bad("tools", "must be an array"));
    };
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(bad(
                    &format!("tools[{i}]"),
                    format!("tools of type '{other}' are not supported: anelm runs function tools only"),
                ));
            }
            None => return Err(bad(&format!("tools[{i}]"), "a tool needs a `type`")),
        }
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return Err(bad(&format!("tools[{i}]"), "a function tool needs a `name`"));
        };
        let mut f = json!({"name": name});
        for k in ["description", "parameters", "strict"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                f[k] = v.clone();
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// What the request asked of the answer's form, in the chat form.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let Some(schema) = format.get("schema") else {
                return Err(bad("text.format.schema", "is required for json_schema"));
            };
            let name = format.get("name").and_then(Value::as_str).unwrap_or("response");
            let mut js = json!({"name": name, "schema": schema});
            if let Some(s) = format.get("strict") {
                js["strict"] = s.clone();
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(bad("text.format.type", "must be text, json_object or json_schema")),
    }
}

/// A validated request: the chat body to run, the conversation so far, and what the response
/// echoes.
pub struct Translated {
    /// The chat-completions body.
    pub chat: Value,
    /// The conversation without the instructions (stored for `previous_response_id`).
    pub conversation: Vec<Value>,
    /// Stream the answer.
    pub stream: bool,
    /// Keep the response.
    pub store: bool,
    /// The response object's fields that echo the request.
    pub echo: Map<String, Value>,
}

/// Translate a request; `previous` is the stored conversation it continues.
pub fn translate(req: &Map<String, Value>, previous: Option<&Value>) -> Result<Translated, ApiError> {
    if let Some(k) = req.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(k, format!("'{k}' is not supported by anelm's Responses API")));
    }
    let input = req.get("input").ok_or_else(|| bad("input", "is required"))?;
    let mut conversation: Vec<Value> = match previous {
        Some(Value::Array(m)) => m.clone(),
        _ => Vec::new(),
    };
    conversation.extend(input_messages(input)?);
    if conversation.is_empty() {
        return Err(bad("input", "holds no message"));
    }
    let mut messages = Vec::new();
    if let Some(instr) = req.get("instructions").filter(|v| !v.is_null()) {
        let text = text_of(instr, "instructions")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    messages.extend(conversation.iter().cloned());
    let mut chat = json!({"messages": messages});
    let copy = |chat: &mut Value, from: &str, to: &str| {
        if let Some(v) = req.get(from).filter(|v| !v.is_null()) {
            chat[to] = v.clone();
        }
    };
    copy(&mut chat, "model", "model");
    copy(&mut chat, "max_output_tokens", "max_tokens");
    copy(&mut chat, "temperature", "temperature");
    copy(&mut chat, "top_p", "top_p");
    copy(&mut chat, "parallel_tool_calls", "parallel_tool_calls");
    copy(&mut chat, "service_tier", "service_tier");
    copy(&mut chat, "seed", "seed");
    if let Some(tools) = req.get("tools").filter(|v| !v.is_null()) {
        chat["tools"] = chat_tools(tools)?;
    }
    if let Some(tc) = req.get("tool_choice").filter(|v| !v.is_null()) {
        chat["tool_choice"] = match tc {
            Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => tc.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let Some(name) = o.get("name").and_then(Value::as_str) else {
                    return Err(bad("tool_choice", "a function tool_choice needs a `name`"));
                };
                json!({"type": "function", "function": {"name": name}})
            }
            _ => {
                return Err(bad(
                    "tool_choice",
                    "must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
                ));
            }
        };
    }
    if let Some(text) = req.get("text").filter(|v| !v.is_null()) {
        if let Some(rf) = response_format(text)? {
            chat["response_format"] = rf;
        }
    }
    if let Some(r) = req.get("reasoning").filter(|v| !v.is_null()) {
        // The template's thinking switch: "none"/"minimal" turn thinking off, other efforts on.
        match r.get("effort").and_then(Value::as_str) {
            None => {}
            Some("none" | "minimal") => chat["chat_template_kwargs"] = json!({"enable_thinking": false}),
            Some("low" | "medium" | "high") => chat["chat_template_kwargs"] = json!({"enable_thinking": true}),
            Some(e) => {
                return Err(bad(
                    "reasoning.effort",
                    format!("'{e}' is not none, minimal, low, medium or high"),
                ));
            }
        }
    }
    if let Some(n) = req.get("top_logprobs").filter(|v| !v.is_null()) {
        chat["logprobs"] = json!(true);
        chat["top_logprobs"] = n.clone();
    }
    match req.get("truncation").and_then(Value::as_str) {
        None | Some("disabled") => {}
        Some(_) => {
            return Err(bad(
                "truncation",
                "only 'disabled' is supported: a conversation longer than the context is refused, not cut",
            ));
        }
    }
    if let Some(inc) = req.get("include").and_then(Value::as_array) {
        for v in inc {
            if v.as_str() != Some("message.output_text.logprobs") && v.as_str() != Some("reasoning.encrypted_content") {
                return Err(bad("include", format!("{v} is not supported")));
            }
        }
    }
    let stream = match req.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream", "must be a boolean")),
    };
    let store = match req.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("store", "must be a boolean")),
    };
    let mut echo = Map::new();
    let get = |k: &str, default: Value| req.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    echo.insert("instructions".into(), get("instructions", Value::Null));
    echo.insert("max_output_tokens".into(), get("max_output_tokens", Value::Null));
    echo.insert("metadata".into(), get("metadata", json!({})));
    echo.insert("parallel_tool_calls".into(), get("parallel_tool_calls", json!(true)));
    echo.insert("previous_response_id".into(), get("previous_response_id", Value::Null));
    echo.insert(
        "reasoning".into(),
        json!({"effort": req.get("reasoning").and_then(|r| r.get("effort")).cloned().unwrap_or(Value::Null), "summary": null}),
    );
    echo.insert("store".into(), json!(store));
    echo.insert("temperature".into(), get("temperature", json!(1.0)));
    echo.insert("text".into(), get("text", json!({"format": {"type": "text"}})));
    echo.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    echo.insert("tools".into(), get("tools", json!([])));
    echo.insert("top_p".into(), get("top_p", json!(1.0)));
    echo.insert("truncation".into(), json!("disabled"));
    echo.insert("user".into(), get("user", Value::Null));
    Ok(Translated {
        chat,
        conversation,
        stream,
        store,
        echo,
    })
}

/// The response object around `output`.
fn response_object(
    id: &str,
    created: u64,
    model: &Value,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    echo: &Map<String, Value>,
) -> Value {
    let mut r = json!({"id": id, "object": "response", "created_at": created, "status": status,
                       "error": null, "incomplete_details": null, "model": model, "output": output,
                       "usage": usage});
    if status == "incomplete" {
        r["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    if let Value::Object(m) = &mut r {
        for (k, v) in echo {
            m.insert(k.clone(), v.clone());
        }
    }
    r
}

/// A response's `status` from the chat answer's `finish_reason`.
fn status_of(finish: &Value) -> &'static str {
    match finish.as_str() {
        Some("length") => "incomplete",
        Some("cancelled") => "cancelled",
        _ => "completed",
    }
}

/// `usage` in the Responses form from the chat form.
fn usage_of(u: &Value) -> Value {
    let i = u["prompt_tokens"].as_u64().unwrap_or(0);
    let o = u["completion_tokens"].as_u64().unwrap_or(0);
    json!({"input_tokens": i, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": o,
           "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": i + o})
}

/// The output items of a whole chat answer.
pub fn output_items(choice: &Value) -> Vec<Value> {
    let msg = &choice["message"];
    let mut items = Vec::new();
    if let Some(r) = msg
        .get("reasoning_content")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        items.push(reasoning_item(&new_id("rs_"), r, "completed"));
    }
    if let Some(t) = msg.get("content").and_then(Value::as_str) {
        let logprobs = choice.pointer("/logprobs/content").cloned().unwrap_or(json!([]));
        items.push(message_item(&new_id("msg_"), t, "completed", logprobs));
    }
    for call in msg.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        items.push(
            json!({"type": "function_call", "id": new_id("fc_"), "call_id": call["id"],
                          "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                          "status": "completed"}),
        );
    }
    items
}

/// The assistant's chat turn that `output` items stand for (what a continuation shows the
/// model): the message text, and the function calls as `tool_calls`.
pub fn assistant_turn(output: &[Value]) -> Value {
    let text: String = output
        .iter()
        .filter(|i| i["type"] == "message")
        .filter_map(|i| i.pointer("/content/0/text").and_then(Value::as_str))
        .collect();
    let mut turn = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
    let calls: Vec<Value> = output
        .iter()
        .filter(|i| i["type"] == "function_call")
        .map(|i| json!({"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}))
        .collect();
    if !calls.is_empty() {
        turn["tool_calls"] = Value::Array(calls);
    }
    turn
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "status": status,
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str, logprobs: Value) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}]})
}

/// `POST /v1/responses`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let body = st.body(body)?;
    let req: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(ApiError::bad_request("the body must be a JSON object", None)),
        Err(e) => return Err(ApiError::bad_request(format!("the body is not valid JSON: {e}"), None)),
    };
    let previous = match req.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => {
            let (store, key) = (st.clone(), id.clone());
            let found = blocking(move || store.responses.get(&key)).await?;
            match found {
                Some((_, conversation)) => Some(conversation),
                None => {
                    return Err(bad(
                        "previous_response_id",
                        format!("no stored response with id '{id}' (it was not stored, or was deleted)"),
                    ));
                }
            }
        }
        Some(_) => return Err(bad("previous_response_id", "must be a string")),
    };
    let t = translate(&req, previous.as_ref())?;
    let id = new_id("resp_");
    let created = crate::now();
    let model = req.get("model").cloned().unwrap_or_else(|| json!(st.config.model_id));
    if t.stream {
        let mut chat = t.chat.clone();
        chat["stream_options"] = json!({"include_usage": true});
        let chunks = internal::stream(st.clone(), headers, &chat, Endpoint::Chat).await?;
        let (tx, rx) = mpsc::channel::<SseEvent>(64);
        tokio::spawn(run_stream(st, chunks, tx, StreamCtx { id, created, model, t }));
        let events = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
        });
        return Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response());
    }
    let answer = internal::call(st.clone(), headers, &t.chat, Endpoint::Chat).await?;
    let choice = &answer["choices"][0];
    let status = status_of(&choice["finish_reason"]);
    let items = output_items(choice);
    let resp = response_object(&id, created, &model, status, items, usage_of(&answer["usage"]), &t.echo);
    if t.store {
        store(&st, &id, &resp, t.conversation).await?;
    }
    Ok(Json(resp).into_response())
}

/// Keep a response, and its conversation with the answer's turn at the end.
async fn store(st: &Arc<AppState>, id: &str, resp: &Value, mut conversation: Vec<Value>) -> Result<(), ApiError> {
    conversation.push(assistant_turn(resp["output"].as_array().map_or(&[][..], Vec::as_slice)));
    let (st, id, resp) = (st.clone(), id.to_string(), resp.clone());
    blocking(move || st.responses.put(&id, &resp, &Value::Array(conversation))).await
}

struct StreamCtx {
    id: String,
    created: u64,
    model: Value,
    t: Translated,
}

/// The item being written while the answer streams.
enum Open {
    None,
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
}

/// Writes the semantic events, numbering them.
struct Emitter {
    tx: mpsc::Sender<SseEvent>,
    seq: u64,
}

impl Emitter {
    async fn send(&mut self, kind: &str, mut data: Value) -> bool {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let ev = SseEvent::default().event(kind).data(data.to_string());
        self.tx.send(ev).await.is_ok()
    }
}

/// Close the open item: its `.done` events, then `response.output_item.done`; the finished
/// item joins `items`.
async fn close(e: &mut Emitter, open: &mut Open, items: &mut Vec<Value>) -> bool {
    let idx = items.len();
    let item = match std::mem::replace(open, Open::None) {
        Open::None => return true,
        Open::Reasoning { id, text } => {
            e.send(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text}),
            )
            .await;
            reasoning_item(&id, &text, "completed")
        }
        Open::Message { id, text } => {
            e.send(
                "response.output_text.done",
                json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text, "logprobs": []}),
            )
            .await;
            e.send(
                "response.content_part.done",
                json!({"item_id": id, "output_index": idx, "content_index": 0,
                       "part": {"type": "output_text", "text": text, "annotations": [], "logprobs": []}}),
            )
            .await;
            message_item(&id, &text, "completed", json!([]))
        }
        Open::Call {
            id,
            call_id,
            name,
            args,
        } => {
            e.send(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": idx, "arguments": args, "name": name}),
            )
            .await;
            json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": args,
                   "status": "completed"})
        }
    };
    let ok = e
        .send("response.output_item.done", json!({"output_index": idx, "item": item}))
        .await;
    items.push(item);
    ok
}

async fn run_stream(st: Arc<AppState>, mut chunks: internal::ChunkStream, tx: mpsc::Sender<SseEvent>, ctx: StreamCtx) {
    let mut e = Emitter { tx, seq: 0 };
    let start = response_object(
        &ctx.id,
        ctx.created,
        &ctx.model,
        "in_progress",
        vec![],
        Value::Null,
        &ctx.t.echo,
    );
    if !e.send("response.created", json!({"response": start})).await
        || !e.send("response.in_progress", json!({"response": start})).await
    {
        return;
    }
    let mut items: Vec<Value> = Vec::new();
    let mut open = Open::None;
    let mut usage = Value::Null;
    let mut finish = Value::Null;
    let mut failed: Option<String> = None;
    while let Some(next) = chunks.next().await {
        let chunk = match next {
            Ok(c) => c,
            Err(err) => {
                failed = Some(err.message);
                break;
            }
        };
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            usage = chunk["usage"].clone();
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            continue;
        };
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
        let delta = &choice["delta"];
        let idx = items.len();
        if let Some(r) = delta
            .get("reasoning_content")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            if !matches!(open, Open::Reasoning { .. }) {
                close(&mut e, &mut open, &mut items).await;
                let id = new_id("rs_");
                let idx = items.len();
                e.send(
                    "response.output_item.added",
                    json!({"output_index": idx, "item": reasoning_item(&id, "", "in_progress")}),
                )
                .await;
                open = Open::Reasoning {
                    id,
                    text: String::new(),
                };
            }
            if let Open::Reasoning { id, text } = &mut open {
                text.push_str(r);
                let ok = e
                    .send(
                        "response.reasoning_text.delta",
                        json!({"item_id": id, "output_index": items.len(), "content_index": 0, "delta": r}),
                    )
                    .await;
                if !ok {
                    return;
                }
            }
        }
        if let Some(c) = delta.get("content").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            if !matches!(open, Open::Message { .. }) {
                close(&mut e, &mut open, &mut items).await;
                let id = new_id("msg_");
                let idx = items.len();
                e.send("response.output_item.added", json!({"output_index": idx, "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}))
                    .await;
                e.send(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": idx, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
                )
                .await;
                open = Open::Message {
                    id,
                    text: String::new(),
                };
            }
            if let Open::Message { id, text } = &mut open {
                text.push_str(c);
                let ok = e
                    .send("response.output_text.delta", json!({"item_id": id, "output_index": items.len(), "content_index": 0, "delta": c, "logprobs": []}))
                    .await;
                if !ok {
                    return;
                }
            }
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            if let Some(call_id) = call.get("id").and_then(Value::as_str) {
                close(&mut e, &mut open, &mut items).await;
                let id = new_id("fc_");
                let name = call
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let idx = items.len();
                e.send(
                    "response.output_item.added",
                    json!({"output_index": idx, "item": {"type": "function_call", "id": id, "call_id": call_id,
                                                          "name": name, "arguments": "", "status": "in_progress"}}),
                )
                .await;
                open = Open::Call {
                    id,
                    call_id: call_id.to_string(),
                    name,
                    args: String::new(),
                };
            }
            let piece = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Open::Call { id, args, .. } = &mut open
                && !piece.is_empty()
            {
                args.push_str(piece);
                e.send(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": idx, "delta": piece}),
                )
                .await;
            }
        }
    }
    if let Some(message) = failed {
        close(&mut e, &mut open, &mut items).await;
        let mut r = response_object(
            &ctx.id,
            ctx.created,
            &ctx.model,
            "failed",
            items,
            Value::Null,
            &ctx.t.echo,
        );
        r["error"] = json!({"code": "server_error", "message": message});
        e.send("response.failed", json!({"response": r})).await;
        return;
    }
    close(&mut e, &mut open, &mut items).await;
    let status = status_of(&finish);
    let resp = response_object(
        &ctx.id,
        ctx.created,
        &ctx.model,
        status,
        items,
        usage_of(&usage),
        &ctx.t.echo,
    );
    if ctx.t.store
        && let Err(err) = store(&st, &ctx.id, &resp, ctx.t.conversation).await
    {
        let mut r = resp.clone();
        r["status"] = json!("failed");
        r["error"] = json!({"code": "server_error", "message": err.message});
        e.send("response.failed", json!({"response": r})).await;
        return;
    }
    e.send("response.completed", json!({"response": resp})).await;
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no stored response with id '{id}'"),
    )
}

/// `GET /v1/responses/{id}`.
pub async fn get(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let (s, key) = (st.clone(), id.clone());
    let found = blocking(move || s.responses.get(&key)).await?;
    found.map(|(r, _)| Json(r)).ok_or_else(|| not_found(&id))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let (s, key) = (st.clone(), id.clone());
    let gone = blocking(move || s.responses.delete(&key)).await?;
    if gone {
        Ok(Json(json!({"id": id, "object": "response", "deleted": true})))
    } else {
        Err(not_found(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn items_become_chat_messages() {
        let input = json!([
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]);
        let m = input_messages(&input).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1]["content"], "weather?");
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
        assert!(input_messages(&json!([{"role": "user", "content": [{"type": "input_image"}]}])).is_err());
        assert!(input_messages(&json!([{"type": "web_search_call"}])).is_err());
        assert!(input_messages(&json!(3)).is_err());
    }

    #[test]
    fn a_request_translates_to_the_chat_form() {
        let req = obj(json!({
            "model": "m", "input": "hi", "instructions": "sys", "max_output_tokens": 7,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
            "reasoning": {"effort": "minimal"}, "store": false
        }));
        let t = translate(&req, Some(&json!([{"role": "user", "content": "before"}]))).unwrap();
        assert_eq!(t.chat["messages"][0], json!({"role": "system", "content": "sys"}));
        assert_eq!(t.chat["messages"][1]["content"], "before");
        assert_eq!(t.chat["messages"][2]["content"], "hi");
        assert_eq!(t.conversation.len(), 2);
        assert_eq!(t.chat["max_tokens"], 7);
        assert_eq!(t.chat["tools"][0]["function"]["name"], "f");
        assert_eq!(t.chat["tool_choice"]["function"]["name"], "f");
        assert_eq!(t.chat["response_format"]["json_schema"]["name"], "x");
        assert_eq!(t.chat["chat_template_kwargs"]["enable_thinking"], false);
        assert!(!t.store && !t.stream);
        for bad_req in [
            json!({"input": "x", "frobnicate": 1}),
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            json!({"input": "x", "truncation": "auto"}),
            json!({"input": "x", "reasoning": {"effort": "max"}}),
            json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
            json!({"input": []}),
            json!({}),
        ] {
            assert!(translate(&obj(bad_req.clone()), None).is_err(), "{bad_req}");
        }
    }

    #[test]
    fn a_chat_answer_becomes_output_items() {
        let choice = json!({"message": {"role": "assistant", "content": "ok", "reasoning_content": "hmm",
                            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                            "finish_reason": "tool_calls"});
        let items = output_items(&choice);
        let turn = [assistant_turn(&items)];
        let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(items[1]["content"][0]["text"], "ok");
        assert_eq!(items[2]["call_id"], "call_1");
        assert_eq!(turn[0]["tool_calls"][0]["id"], "call_1");
    }
}
