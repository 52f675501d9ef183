//! Ollama's native API (`/api/*`) over the same engine as `/v1`. `/api/chat` and
//! `/api/generate` translate their request into an OpenAI chat-completions body (a completions
//! body for `/api/generate` with `raw`), run it through [`crate::internal`] (the scheduler,
//! constrained decoding, tools, reasoning split, upstream routing and privacy rules of `/v1`),
//! and translate the chunks back into Ollama's NDJSON lines (one object when `stream` is
//! false). `/api/embed` and `/api/embeddings` go through `/v1/embeddings`' handler. Errors are
//! Ollama's `{"error": "..."}`. The README ("Ollama's API") lists what is honoured and refused.

use std::collections::hash_map::DefaultHasher;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anelm_engine::{LoadedModel, ModelSource, reasoning};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::{Map, Value, json};

use crate::api_error::ApiError;
use crate::internal::{self, ChunkStream, Endpoint};
use crate::openai;
use crate::{AppState, Ready};

/// The Ollama version `/api/version` reports: the API level these routes follow.
pub const OLLAMA_API_VERSION: &str = "0.12.0";

/// An error in Ollama's shape, `{"error": "..."}`, with its status (and `Retry-After`).
#[derive(Debug)]
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        self.0.respond_with(json!({"error": self.0.message}))
    }
}

type OResult<T> = Result<T, OllamaError>;

fn bad(msg: impl Into<String>) -> OllamaError {
    OllamaError(ApiError::bad_request(msg, None))
}

fn status(s: StatusCode, msg: impl Into<String>) -> OllamaError {
    let kind = if s.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    OllamaError(ApiError::new(s, kind, msg))
}

/// The routes, merged into [`crate::router`].
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(root))
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/embed", post(embed))
        .route("/api/embeddings", post(embeddings_legacy))
        .route("/api/tags", get(tags))
        .route("/api/show", post(show))
        .route("/api/ps", get(ps))
        .route("/api/version", get(version))
        .route("/api/pull", post(pull))
        .route("/api/push", post(push))
        .route("/api/create", post(create))
        .route("/api/copy", post(copy))
        .route("/api/delete", delete(remove))
        .route("/api/blobs/{digest}", post(blobs).head(blobs))
}

async fn root() -> &'static str {
    "anelm is running (Ollama's API under /api, OpenAI's under /v1)"
}

// ---------------------------------------------------------------------------------------------
// Model names

/// Whether the Ollama name `name` (`name[:tag]`) means the model served as `id`, case aside:
/// the id itself, or a leading part of it that ends where the id has `-`, `.` or `_`
/// (`smollm2` for `SmolLM2-135M-Instruct.Q4_1`); the tag is `latest`, absent, or continues the
/// name within the id (`smollm2:135m`).
pub fn names_match(name: &str, id: &str) -> bool {
    let (name, id) = (name.to_ascii_lowercase(), id.to_ascii_lowercase());
    if name == id {
        return true;
    }
    let (base, tag) = match name.rsplit_once(':') {
        Some((b, t)) => (b, Some(t)),
        None => (name.as_str(), None),
    };
    let stem = match tag {
        None | Some("latest") => base.to_string(),
        Some(t) => format!("{base}-{t}"),
    };
    !stem.is_empty()
        && id.starts_with(&stem)
        && id
            .as_bytes()
            .get(stem.len())
            .is_none_or(|b| matches!(b, b'-' | b'.' | b'_'))
}

/// The name `/api/tags` lists for `id`: `id:latest` (as is when it has a tag).
pub(crate) fn tag_name(id: &str) -> String {
    if id.contains(':') {
        id.to_string()
    } else {
        format!("{id}:latest")
    }
}

/// Which model a request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// The text model.
    Text,
    /// The embedding model.
    Embedding,
    /// A model of an upstream engine (`--upstream`): the name goes there as it is.
    Upstream,
}

fn not_found(st: &AppState, name: &str) -> OllamaError {
    let mut served: Vec<String> = Vec::new();
    if !st.embeddings.get().is_some_and(|e| e.only) {
        served.push(tag_name(&st.config.model_id));
    }
    if let Some(e) = st.embeddings.get() {
        served.push(tag_name(&e.id));
    }
    status(
        StatusCode::NOT_FOUND,
        format!(
            "model '{name}' not found; this server serves {} (see /api/tags)",
            served
                .iter()
                .map(|s| format!("'{s}'"))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    )
}

/// The model `name` means; the embedding model is tried first when `embedding`.
fn resolve(st: &AppState, name: &str, embedding: bool) -> OResult<Target> {
    let emb = st.embeddings.get();
    let text = !emb.is_some_and(|e| e.only) && names_match(name, &st.config.model_id);
    let is_emb = emb.is_some_and(|e| names_match(name, &e.id));
    match (text, is_emb) {
        (true, true) => Ok(if embedding { Target::Embedding } else { Target::Text }),
        (true, false) => Ok(Target::Text),
        (false, true) => Ok(Target::Embedding),
        (false, false) if st.upstreams.named(name).is_some() => Ok(Target::Upstream),
        (false, false) => Err(not_found(st, name)),
    }
}

/// The body as a JSON object, or the 400 that says why not.
fn read_object(st: &AppState, body: Result<Bytes, BytesRejection>) -> OResult<Map<String, Value>> {
    let bytes = st.body(body)?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("the body is not valid JSON: {e}"))),
    }
}

/// `model` (or the legacy `name`), required.
fn model_name(obj: &Map<String, Value>) -> OResult<String> {
    match obj.get("model").or_else(|| obj.get("name")) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        None | Some(Value::Null) | Some(Value::String(_)) => {
            Err(bad("model is required: name the model (see /api/tags)"))
        }
        Some(_) => Err(bad("'model' must be a string")),
    }
}

fn refuse_unknown(obj: &Map<String, Value>, known: &[&str], route: &str) -> OResult<()> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(bad(format!("'{k}' is not supported by anelm on {route}"))),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// options, keep_alive

/// Options that change nothing about the answer (loading and performance): accepted.
const PERFORMANCE_OPTIONS: &[&str] = &[
    "numa",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "num_keep",
    "penalize_newline",
];

/// Ollama's sampling defaults, applied when `options` does not set them.
const DEFAULTS: &[(&str, f64)] = &[
    ("temperature", 0.8),
    ("top_k", 40.0),
    ("top_p", 0.9),
    ("repeat_penalty", 1.1),
];

/// `options` as OpenAI fields, with the two that need the prompt's length.
#[derive(Debug, Default, PartialEq)]
struct Options {
    /// OpenAI request fields (`temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`, the
    /// penalties), Ollama's defaults included.
    fields: Map<String, Value>,
    /// `num_predict` (negative: up to the context).
    num_predict: Option<i64>,
    /// `num_ctx`.
    num_ctx: Option<usize>,
}

fn options(v: Option<&Value>) -> OResult<Options> {
    let mut out = Options::default();
    for (k, d) in DEFAULTS {
        let v = if *k == "top_k" { json!(*d as u64) } else { json!(d) };
        out.fields.insert((*k).to_string(), v);
    }
    let obj = match v {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("'options' must be an object")),
    };
    let number = |k: &str, v: &Value| {
        v.as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| bad(format!("options.{k} must be a number")))
    };
    let mut unknown = Vec::new();
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "temperature" | "top_p" | "min_p" | "repeat_penalty" | "presence_penalty" | "frequency_penalty" => {
                out.fields.insert(k.clone(), json!(number(k, v)?));
            }
            "top_k" => {
                let n = v.as_i64().ok_or_else(|| bad("options.top_k must be an integer"))?;
                out.fields.insert(k.clone(), json!(n.max(0)));
            }
            "seed" => {
                let s = v.as_i64().ok_or_else(|| bad("options.seed must be an integer"))?;
                // A negative seed asks for a random one: the engine's default.
                if s >= 0 {
                    out.fields.insert(k.clone(), json!(s));
                }
            }
            "stop" => {
                let list: Option<Vec<Value>> = match v {
                    Value::String(s) => Some(vec![json!(s)]),
                    Value::Array(a) if a.iter().all(Value::is_string) => Some(a.clone()),
                    _ => None,
                };
                let list = list.ok_or_else(|| bad("options.stop must be a list of strings"))?;
                if !list.is_empty() {
                    out.fields.insert(k.clone(), Value::Array(list));
                }
            }
            "num_predict" => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| bad("options.num_predict must be an integer"))?;
                if n == 0 {
                    return Err(bad(
                        "options.num_predict must be positive, or -1 to generate up to the context",
                    ));
                }
                out.num_predict = Some(n);
            }
            "num_ctx" => {
                let n = v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad("options.num_ctx must be a positive integer"))?;
                out.num_ctx = Some(usize::try_from(n).unwrap_or(usize::MAX));
            }
            // Values that leave sampling as it is are accepted; others are not built.
            "repeat_last_n" if v.as_i64() == Some(64) => {}
            "typical_p" | "tfs_z" if v.as_f64() == Some(1.0) => {}
            "mirostat" if v.as_i64() == Some(0) => {}
            // Only read by mirostat, which is off.
            "mirostat_tau" | "mirostat_eta" => {}
            "repeat_last_n" => {
                return Err(bad(
                    "options.repeat_last_n: anelm's penalties look at the last 64 tokens; only 64 is supported",
                ));
            }
            "typical_p" | "tfs_z" => {
                return Err(bad(format!(
                    "options.{k}: not supported by anelm (only 1.0, which is off)"
                )));
            }
            "mirostat" => return Err(bad("options.mirostat: not supported by anelm (only 0, which is off)")),
            k if PERFORMANCE_OPTIONS.contains(&k) => {}
            k => unknown.push(k.to_string()),
        }
    }
    if !unknown.is_empty() {
        return Err(bad(format!(
            "options not supported by anelm: {} (remove them: anelm does not ignore settings that would change the answer)",
            unknown.join(", ")
        )));
    }
    Ok(out)
}

/// A Go duration (`"5m"`, `"1h30m"`, `"-1s"`, `"250ms"`) or a bare number of seconds, in
/// signed seconds.
fn go_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<f64>() {
        return n.is_finite().then_some(n);
    }
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Some(sign * total)
}

/// `keep_alive`: `None` when absent; `Some(None)` keeps the model loaded (negative);
/// `Some(Some(d))` releases it after `d` idle.
pub(crate) fn keep_alive(v: Option<&Value>) -> OResult<Option<Option<Duration>>> {
    let secs = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => go_duration(s),
        Some(_) => None,
    };
    let secs = secs
        .ok_or_else(|| bad("'keep_alive' must be seconds (a number) or a duration such as \"5m\", \"0\" or \"-1\""))?;
    Ok(Some((secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e12)))))
}

// ---------------------------------------------------------------------------------------------
// Requests → OpenAI bodies

/// Fields of `/api/chat`.
const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
    "logprobs",
    "top_logprobs",
];
/// Fields of `/api/generate`.
const GENERATE_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "suffix",
    "system",
    "template",
    "context",
    "stream",
    "raw",
    "format",
    "images",
    "options",
    "keep_alive",
    "think",
    "logprobs",
    "top_logprobs",
];
/// Keys of a chat message (`thinking`, a past answer's reasoning, is accepted and not shown to
/// the model: chat templates drop it from past turns).
const MESSAGE_FIELDS: &[&str] = &[
    "role",
    "content",
    "images",
    "tool_calls",
    "tool_name",
    "tool_call_id",
    "thinking",
];

const IMAGES_REFUSED: &str = "images are not supported by anelm: the served model reads text only";

/// An Ollama request as an OpenAI one.
#[derive(Debug)]
struct Translated {
    /// The OpenAI body (`model` set later).
    body: Map<String, Value>,
    /// Where it goes.
    endpoint: Endpoint,
    /// Stream NDJSON (Ollama's default).
    stream: bool,
    /// `num_predict` and `num_ctx`, applied once the prompt's length is known.
    num_predict: Option<i64>,
    num_ctx: Option<usize>,
    /// `think`, when given.
    think: Option<bool>,
    /// Nothing to generate (no messages, an empty prompt): a load (or unload) request.
    empty: bool,
}

pub(crate) fn is_empty_value(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    }
}

/// `stream`, `format`, `options`, `think`, `logprobs` into `out`.
fn common(obj: &Map<String, Value>, out: &mut Translated) -> OResult<()> {
    let chat = out.endpoint == Endpoint::Chat;
    out.stream = match obj.get("stream") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'stream' must be a boolean")),
    };
    let schema = match obj.get("format") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some(None),
        Some(s @ Value::Object(_)) => Some(Some(s.clone())),
        Some(_) => return Err(bad("'format' must be \"json\" or a JSON schema object")),
    };
    match (schema, chat) {
        (None, _) => {}
        (Some(None), true) => {
            out.body
                .insert("response_format".into(), json!({"type": "json_object"}));
        }
        (Some(Some(s)), true) => {
            out.body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": s, "strict": true}}),
            );
        }
        (Some(s), false) => {
            let s = s.unwrap_or_else(|| json!({"type": "object"}));
            out.body.insert("grammar".into(), json!({ "json_schema": s }));
        }
    }
    let opts = options(obj.get("options"))?;
    out.body.extend(opts.fields);
    out.num_predict = opts.num_predict;
    out.num_ctx = opts.num_ctx;
    out.think = match obj.get("think") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(level)) => {
            return Err(bad(format!(
                "'think': levels such as '{level}' are not supported by anelm; send true or false"
            )));
        }
        Some(_) => return Err(bad("'think' must be true or false")),
    };
    if let Some(t) = out.think {
        if !chat {
            return Err(bad("'think' has no effect with raw: the prompt is used as it is"));
        }
        out.body
            .insert("chat_template_kwargs".into(), json!({"enable_thinking": t}));
    }
    let logprobs = match obj.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'logprobs' must be a boolean")),
    };
    let top = match obj.get("top_logprobs") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .filter(|&n| n <= 20)
            .ok_or_else(|| bad("'top_logprobs' must be an integer from 0 to 20"))?,
    };
    if top > 0 && !logprobs {
        return Err(bad("'top_logprobs' needs \"logprobs\": true"));
    }
    if logprobs {
        if chat {
            out.body.insert("logprobs".into(), json!(true));
            out.body.insert("top_logprobs".into(), json!(top));
        } else {
            out.body.insert("logprobs".into(), json!(top));
        }
    }
    Ok(())
}

fn new_translated(endpoint: Endpoint) -> Translated {
    Translated {
        body: Map::new(),
        endpoint,
        stream: true,
        num_predict: None,
        num_ctx: None,
        think: None,
        empty: false,
    }
}

/// Ollama chat messages as OpenAI ones: calls get ids (`call_<message>_<index>` unless they
/// have one) and a tool message's `tool_name` finds the id of the latest call of that name.
fn messages(list: &[Value]) -> OResult<Vec<Value>> {
    let mut out = Vec::with_capacity(list.len());
    let mut calls: Vec<(String, String)> = Vec::new(); // (name, id) of calls made so far
    for (i, m) in list.iter().enumerate() {
        let Some(fields) = m.as_object() else {
            return Err(bad(format!("messages[{i}] must be an object")));
        };
        if let Some(k) = fields.keys().find(|k| !MESSAGE_FIELDS.contains(&k.as_str())) {
            return Err(bad(format!("messages[{i}].{k} is not supported by anelm")));
        }
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(bad(format!("messages[{i}].role is required and must be a string")));
        };
        if !is_empty_value(m.get("images")) {
            return Err(bad(format!("messages[{i}].images: {IMAGES_REFUSED}")));
        }
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(format!("messages[{i}].content must be a string"))),
        };
        let mut msg = json!({"role": role, "content": content});
        match m.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) if !list.is_empty() => {
                let mut openai_calls = Vec::with_capacity(list.len());
                for (j, c) in list.iter().enumerate() {
                    let f = &c["function"];
                    let Some(name) = f.get("name").and_then(Value::as_str) else {
                        return Err(bad(format!(
                            "messages[{i}].tool_calls[{j}] must be {{\"function\": {{\"name\": string, \"arguments\": object}}}}"
                        )));
                    };
                    let arguments = match f.get("arguments") {
                        None | Some(Value::Null) => "{}".to_string(),
                        Some(Value::String(s)) => s.clone(),
                        Some(a @ Value::Object(_)) => a.to_string(),
                        Some(_) => {
                            return Err(bad(format!(
                                "messages[{i}].tool_calls[{j}].function.arguments must be an object"
                            )));
                        }
                    };
                    let id = c
                        .get("id")
                        .and_then(Value::as_str)
                        .map_or_else(|| format!("call_{i}_{j}"), str::to_string);
                    calls.push((name.to_string(), id.clone()));
                    openai_calls.push(json!({"id": id, "type": "function",
                                             "function": {"name": name, "arguments": arguments}}));
                }
                msg["tool_calls"] = Value::Array(openai_calls);
            }
            Some(Value::Array(_)) => {}
            Some(_) => return Err(bad(format!("messages[{i}].tool_calls must be a list"))),
        }
        if role == "tool" {
            let by_id = m.get("tool_call_id").and_then(Value::as_str).map(str::to_string);
            let name = m.get("tool_name").and_then(Value::as_str);
            let id =
                by_id.or_else(|| name.and_then(|n| calls.iter().rev().find(|(c, _)| c == n).map(|(_, id)| id.clone())));
            if let Some(id) = id {
                msg["tool_call_id"] = json!(id);
            }
            if let Some(n) = name {
                msg["name"] = json!(n);
            }
        }
        out.push(msg);
    }
    Ok(out)
}

/// `/api/chat` → `/v1/chat/completions`.
fn chat_request(obj: &Map<String, Value>) -> OResult<Translated> {
    refuse_unknown(obj, CHAT_FIELDS, "/api/chat")?;
    let mut t = new_translated(Endpoint::Chat);
    let msgs = match obj.get("messages") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => messages(list)?,
        Some(_) => return Err(bad("'messages' must be a list")),
    };
    t.empty = msgs.is_empty();
    t.body.insert("messages".into(), Value::Array(msgs));
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            let mut tools = Vec::with_capacity(list.len());
            for (i, tool) in list.iter().enumerate() {
                let Some(o) = tool.as_object() else {
                    return Err(bad(format!("tools[{i}] must be an object")));
                };
                let mut o = o.clone();
                o.entry("type").or_insert_with(|| json!("function"));
                tools.push(Value::Object(o));
            }
            if !tools.is_empty() {
                t.body.insert("tools".into(), Value::Array(tools));
            }
        }
        Some(_) => return Err(bad("'tools' must be a list")),
    }
    common(obj, &mut t)?;
    Ok(t)
}

/// `/api/generate` → `/v1/chat/completions` (the prompt as the user's message, `system` before
/// it), or `/v1/completions` with `raw`.
fn generate_request(obj: &Map<String, Value>) -> OResult<Translated> {
    refuse_unknown(obj, GENERATE_FIELDS, "/api/generate")?;
    let raw = match obj.get("raw") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'raw' must be a boolean")),
    };
    let text = |k: &str| -> OResult<Option<String>> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!("'{k}' must be a string"))),
        }
    };
    if text("template")?.is_some() {
        return Err(bad(
            "'template' is not supported by anelm: the model's own chat template is used; send raw: true with the prompt already formatted instead",
        ));
    }
    if text("suffix")?.is_some() {
        return Err(bad("'suffix' is not supported by anelm (no fill-in-the-middle)"));
    }
    if !is_empty_value(obj.get("context")) {
        return Err(bad(
            "'context' is not supported by anelm: send the conversation to /api/chat as messages instead",
        ));
    }
    if !is_empty_value(obj.get("images")) {
        return Err(bad(IMAGES_REFUSED));
    }
    let prompt = text("prompt")?;
    let system = text("system")?;
    let mut t = new_translated(if raw { Endpoint::Completions } else { Endpoint::Chat });
    t.empty = prompt.is_none();
    let prompt = prompt.unwrap_or_default();
    if raw {
        if system.is_some() {
            return Err(bad("'system' has no effect with raw: put it in the prompt"));
        }
        t.body.insert("prompt".into(), json!(prompt));
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = system {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.push(json!({"role": "user", "content": prompt}));
        t.body.insert("messages".into(), Value::Array(msgs));
    }
    common(obj, &mut t)?;
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// OpenAI chunks → Ollama lines

/// Ollama's name for why generation stopped (a tool call is a plain stop).
fn done_reason(finish: Option<&str>) -> &str {
    match finish {
        None | Some("stop") | Some("tool_calls") => "stop",
        Some(other) => other,
    }
}

/// Nanoseconds, for the `*_duration` fields.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Reads an OpenAI answer's chunks and writes Ollama's lines: the pieces as they come, then
/// the last line with `done: true` and the counts and times.
struct Translator {
    /// `/api/chat` (a `message`) or `/api/generate` (a `response`).
    chat: bool,
    /// The model name the client sent.
    model: String,
    /// When the request arrived.
    started: Instant,
    /// Time spent loading the model for it.
    load: Duration,
    /// When generation was asked for (after the load).
    gen_start: Instant,
    /// When the first generated text came.
    first: Option<Instant>,
    content: String,
    thinking: String,
    /// Calls as they stream: (id, name, arguments).
    calls: Vec<(String, String, String)>,
    logprobs: Vec<Value>,
    finish: Option<String>,
    prompt_tokens: u64,
    completion_tokens: u64,
    /// Prefill and generation time as the engine measured them (`timings`), when it said.
    engine_times: Option<(Duration, Duration)>,
}

impl Translator {
    fn new(chat: bool, model: &str, started: Instant, load: Duration) -> Self {
        Self {
            chat,
            model: model.to_string(),
            started,
            load,
            gen_start: Instant::now(),
            first: None,
            content: String::new(),
            thinking: String::new(),
            calls: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
            prompt_tokens: 0,
            completion_tokens: 0,
            engine_times: None,
        }
    }

    /// Ollama's logprobs (`[{token, logprob, top_logprobs: [{token, logprob}]}]`) from a
    /// chat (`content: [...]`) or completions (`tokens`, `token_logprobs`, `top_logprobs`)
    /// choice's `logprobs`.
    fn logprobs_of(v: Option<&Value>) -> Vec<Value> {
        let Some(v) = v.filter(|v| v.is_object()) else {
            return Vec::new();
        };
        if let Some(content) = v.get("content").and_then(Value::as_array) {
            return content
                .iter()
                .map(|t| {
                    let top: Vec<Value> = t
                        .get("top_logprobs")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .map(|x| json!({"token": x["token"], "logprob": x["logprob"]}))
                                .collect()
                        })
                        .unwrap_or_default();
                    json!({"token": t["token"], "logprob": t["logprob"], "top_logprobs": top})
                })
                .collect();
        }
        let empty = Vec::new();
        let tokens = v.get("tokens").and_then(Value::as_array).unwrap_or(&empty);
        let lps = v.get("token_logprobs").and_then(Value::as_array).unwrap_or(&empty);
        let tops = v.get("top_logprobs").and_then(Value::as_array).unwrap_or(&empty);
        tokens
            .iter()
            .enumerate()
            .map(|(i, tok)| {
                // The completions shape is a map, which JSON keeps in key order: most likely first again.
                let mut top: Vec<(&String, f64)> = tops
                    .get(i)
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, lp)| (k, lp.as_f64().unwrap_or(f64::NEG_INFINITY)))
                            .collect()
                    })
                    .unwrap_or_default();
                top.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
                let top: Vec<Value> = top
                    .into_iter()
                    .map(|(k, lp)| json!({"token": k, "logprob": lp}))
                    .collect();
                json!({"token": tok, "logprob": lps.get(i).cloned().unwrap_or(Value::Null), "top_logprobs": top})
            })
            .collect()
    }

    /// The calls in Ollama's shape (arguments as an object).
    fn tool_calls(&self) -> Vec<Value> {
        self.calls
            .iter()
            .enumerate()
            .map(|(i, (id, name, args))| {
                let arguments: Value = serde_json::from_str(args)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| Value::Object(Map::new()));
                json!({"id": id, "function": {"index": i, "name": name, "arguments": arguments}})
            })
            .collect()
    }

    /// One line (not done) with `text`, `thinking`, `calls`, `logprobs`.
    fn line(&self, text: &str, thinking: &str, calls: Option<Vec<Value>>, logprobs: Vec<Value>) -> Value {
        let mut line = json!({"model": self.model, "created_at": rfc3339(SystemTime::now())});
        if self.chat {
            let mut message = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                message["thinking"] = json!(thinking);
            }
            if let Some(c) = calls {
                message["tool_calls"] = Value::Array(c);
            }
            line["message"] = message;
        } else {
            line["response"] = json!(text);
            if !thinking.is_empty() {
                line["thinking"] = json!(thinking);
            }
        }
        line["done"] = json!(false);
        if !logprobs.is_empty() {
            line["logprobs"] = Value::Array(logprobs);
        }
        line
    }

    /// Read one OpenAI chunk; returns the lines to stream now.
    fn push(&mut self, chunk: &Value) -> Vec<Value> {
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
            self.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
        }
        if let Some(t) = chunk.get("timings") {
            let ms = |k: &str| t[k].as_f64().filter(|v| v.is_finite() && *v >= 0.0);
            if let (Some(p), Some(g)) = (ms("prompt_ms"), ms("predicted_ms")) {
                self.engine_times = Some((Duration::from_secs_f64(p / 1e3), Duration::from_secs_f64(g / 1e3)));
            }
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Vec::new();
        };
        let delta = choice.get("delta");
        let field = |k: &str| delta.and_then(|d| d.get(k)).and_then(Value::as_str).unwrap_or("");
        let text = match choice.get("text").and_then(Value::as_str) {
            Some(t) => t,
            None => field("content"),
        };
        let thinking = field("reasoning_content");
        let lps = Self::logprobs_of(choice.get("logprobs"));
        if let Some(calls) = delta.and_then(|d| d.get("tool_calls")).and_then(Value::as_array) {
            for c in calls {
                let i = c["index"]
                    .as_u64()
                    .and_then(|i| usize::try_from(i).ok())
                    .unwrap_or(self.calls.len());
                if i >= self.calls.len() {
                    self.calls.resize(i + 1, Default::default());
                }
                let slot = &mut self.calls[i];
                if let Some(id) = c["id"].as_str() {
                    slot.0 = id.to_string();
                }
                if let Some(n) = c["function"]["name"].as_str() {
                    slot.1 = n.to_string();
                }
                if let Some(a) = c["function"]["arguments"].as_str() {
                    slot.2.push_str(a);
                }
            }
        }
        let mut lines = Vec::new();
        if !text.is_empty() || !thinking.is_empty() || !lps.is_empty() {
            self.first.get_or_insert_with(Instant::now);
            self.content.push_str(text);
            self.thinking.push_str(thinking);
            self.logprobs.extend(lps.iter().cloned());
            lines.push(self.line(text, thinking, None, lps));
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.first.get_or_insert_with(Instant::now);
            self.finish = Some(f.to_string());
            if self.chat && !self.calls.is_empty() {
                lines.push(self.line("", "", Some(self.tool_calls()), Vec::new()));
            }
        }
        lines
    }

    /// The last line: `whole` (no streaming) carries the whole answer, a streamed one none.
    fn done(&self, whole: bool) -> Value {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        let (text, thinking) = if whole {
            (self.content.as_str(), self.thinking.as_str())
        } else {
            ("", "")
        };
        let calls = (whole && self.chat && !self.calls.is_empty()).then(|| self.tool_calls());
        let logprobs = if whole { self.logprobs.clone() } else { Vec::new() };
        let mut line = self.line(text, thinking, calls, logprobs);
        line["done"] = json!(true);
        line["done_reason"] = json!(done_reason(self.finish.as_deref()));
        line["total_duration"] = json!(nanos(end.duration_since(self.started)));
        line["load_duration"] = json!(nanos(self.load));
        line["prompt_eval_count"] = json!(self.prompt_tokens);
        // The engine's own times; else as seen from here (the first text may come late: an
        // answer read for tool calls is held until it is complete).
        let (prompt, eval) = self.engine_times.unwrap_or_else(|| {
            (
                first.saturating_duration_since(self.gen_start),
                end.saturating_duration_since(first),
            )
        });
        line["prompt_eval_duration"] = json!(nanos(prompt));
        line["eval_count"] = json!(self.completion_tokens);
        line["eval_duration"] = json!(nanos(eval));
        line
    }
}

// ---------------------------------------------------------------------------------------------
// /api/chat, /api/generate

async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    run(st, headers, body, true).await
}

async fn generate(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    run(st, headers, body, false).await
}

/// Tokens of the prompt `body` renders to, rendered as the chat or completions handler will.
fn prompt_len(ready: &Ready, body: &Value, chat: bool, ctx: usize) -> OResult<usize> {
    let parsed = openai::parse(body.to_string().as_bytes(), chat, ctx)?;
    Ok(crate::render_prompt(&ready.model, &parsed)?.1.len())
}

/// The whole answer to a load or unload request (no prompt).
pub(crate) fn load_answer(chat: bool, model: &str, started: Instant, load: Duration, reason: &str) -> Response {
    let mut t = Translator::new(chat, model, started, load);
    t.finish = Some(reason.to_string());
    Json(t.done(true)).into_response()
}

/// Newline-delimited JSON lines, as Ollama streams.
fn ndjson(lines: &[Value]) -> Bytes {
    let mut out = String::new();
    for l in lines {
        out.push_str(&l.to_string());
        out.push('\n');
    }
    Bytes::from(out)
}

async fn run(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<Response, OllamaError> {
    let started = Instant::now();
    st.check_key(&headers)?;
    let obj = read_object(&st, body)?;
    let name = model_name(&obj)?;
    let target = resolve(&st, &name, false)?;
    if target == Target::Embedding {
        let route = if chat { "chat" } else { "generate" };
        return Err(bad(format!(
            "'{name}' does not support {route}: it is an embedding model (use /api/embed)"
        )));
    }
    let keep = keep_alive(obj.get("keep_alive"))?;
    let mut t = if chat {
        chat_request(&obj)?
    } else {
        generate_request(&obj)?
    };
    let keeps_here = target == Target::Text && st.loader.get().is_some();
    if t.empty {
        // A load request, or with keep_alive 0 an unload request.
        if target == Target::Upstream {
            return Ok(load_answer(chat, &name, started, Duration::ZERO, "load"));
        }
        if keep == Some(Some(Duration::ZERO)) {
            if !keeps_here {
                return Err(bad(
                    "anelm serve keeps its model loaded: start it with --idle-unload SECS to let keep_alive release it",
                ));
            }
            st.ready.set_keep_alive(keep);
            return Ok(load_answer(chat, &name, started, Duration::ZERO, "unload"));
        }
        let was_loaded = st.ready.get().is_some();
        st.ready.touch();
        st.live().await?;
        if keeps_here {
            st.ready.set_keep_alive(keep);
        }
        let load = if was_loaded { Duration::ZERO } else { started.elapsed() };
        return Ok(load_answer(chat, &name, started, load, "load"));
    }
    let mut load = Duration::ZERO;
    let mut body = Value::Object(std::mem::take(&mut t.body));
    let endpoint_chat = t.endpoint == Endpoint::Chat;
    if target == Target::Text {
        body["model"] = json!(st.config.model_id);
        let was_loaded = st.ready.get().is_some();
        st.ready.touch();
        let ready = st.live().await?;
        if !was_loaded {
            load = started.elapsed();
        }
        if t.think == Some(true) && !reasoning::template_thinks(ready.model.template.source()) {
            return Err(bad(format!("'{name}' does not support thinking")));
        }
        let ctx = ready.scheduler.config().ctx_size;
        let limit = match t.num_ctx {
            Some(n) if n > ctx => {
                return Err(bad(format!(
                    "options.num_ctx ({n}) is larger than this server's context of {ctx} tokens: send at most {ctx}, or start anelm serve with --ctx-size {n}"
                )));
            }
            Some(n) => n,
            None => ctx,
        };
        let prompt = prompt_len(&ready, &body, endpoint_chat, ctx)?;
        let room = limit.saturating_sub(prompt);
        if room == 0 {
            let fix = if t.num_ctx.is_some() {
                "raise options.num_ctx"
            } else {
                "start anelm serve with a larger --ctx-size"
            };
            return Err(bad(format!(
                "the prompt ({prompt} tokens) fills the context of {limit} tokens: shorten it or {fix}"
            )));
        }
        let max = match t.num_predict {
            Some(n) if n > 0 => usize::try_from(n).unwrap_or(usize::MAX).min(room),
            _ => room,
        };
        body["max_tokens"] = json!(max);
    } else {
        // An upstream model: its engine knows its context.
        body["model"] = json!(name);
        if t.num_ctx.is_some() {
            return Err(bad(format!(
                "options.num_ctx is not supported for the upstream model '{name}'"
            )));
        }
        if let Some(n) = t.num_predict.filter(|&n| n > 0) {
            body["max_tokens"] = json!(n);
        }
    }
    body["stream_options"] = json!({"include_usage": true});
    let endpoint = t.endpoint;
    let chunks = internal::stream(st.clone(), headers, &body, endpoint).await?;
    let tr = Translator::new(chat, &name, started, load);
    let keep = keeps_here.then_some(keep);
    if !t.stream {
        return whole(st, chunks, tr, keep).await;
    }
    let stream = futures_util::stream::unfold(Some((chunks, tr, st, keep)), |state| async move {
        let (mut chunks, mut tr, st, keep) = state?;
        loop {
            match chunks.next().await {
                Some(Ok(v)) => {
                    let lines = tr.push(&v);
                    if !lines.is_empty() {
                        return Some((Ok::<_, Infallible>(ndjson(&lines)), Some((chunks, tr, st, keep))));
                    }
                }
                Some(Err(e)) => return Some((Ok(ndjson(&[json!({"error": e.message})])), None)),
                None => {
                    if let Some(k) = keep {
                        st.ready.set_keep_alive(k);
                    }
                    return Some((Ok(ndjson(&[tr.done(false)])), None));
                }
            }
        }
    });
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    Ok(resp)
}

/// The answer as one object (`stream: false`).
async fn whole(
    st: Arc<AppState>,
    mut chunks: ChunkStream,
    mut tr: Translator,
    keep: Option<Option<Option<Duration>>>,
) -> Result<Response, OllamaError> {
    while let Some(chunk) = chunks.next().await {
        tr.push(&chunk?);
    }
    if let Some(k) = keep {
        st.ready.set_keep_alive(k);
    }
    Ok(Json(tr.done(true)).into_response())
}

// ---------------------------------------------------------------------------------------------
// /api/embed, /api/embeddings

/// Fields of `/api/embed`.
const EMBED_FIELDS: &[&str] = &["model", "input", "truncate", "dimensions", "options", "keep_alive"];
/// Fields of `/api/embeddings`.
const EMBEDDINGS_FIELDS: &[&str] = &["model", "prompt", "options", "keep_alive"];

/// Embeds `texts` with the model `name` means through `/v1/embeddings`' handler: the vectors
/// and the tokens embedded.
async fn embed_texts(
    st: &Arc<AppState>,
    headers: HeaderMap,
    name: &str,
    texts: Vec<String>,
    dimensions: Option<&Value>,
    truncate: bool,
) -> OResult<(Vec<Value>, u64)> {
    let model = match resolve(st, name, true)? {
        Target::Embedding => st.embeddings.get().map(|e| e.id.clone()).unwrap_or_default(),
        Target::Upstream => name.to_string(),
        Target::Text => {
            let fix = match st.embeddings.get() {
                Some(e) => format!("use the embedding model '{}'", tag_name(&e.id)),
                None => "start anelm serve with --embedding-model DIR (a sentence-transformers directory)".to_string(),
            };
            return Err(bad(format!(
                "'{name}' does not support embeddings: it is a text generation model; {fix}"
            )));
        }
    };
    if texts.is_empty() {
        return Ok((Vec::new(), 0));
    }
    if !truncate && let Some(e) = st.embeddings.get().filter(|e| e.id == model) {
        let emb = e.model.clone();
        let max = emb.info().max_tokens;
        let list = texts.clone();
        let seqs = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = list.iter().map(String::as_str).collect();
            emb.tokenize(&refs)
        })
        .await
        .map_err(|e| status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| bad(format!("tokenization failed: {e}")))?;
        if let Some(i) = seqs.iter().position(|s| s.len() >= max) {
            return Err(bad(format!(
                "input {i} reaches this model's limit of {max} tokens and would be cut: shorten it, or send truncate: true"
            )));
        }
    }
    let mut req = json!({"model": model, "input": texts});
    if let Some(d) = dimensions.filter(|d| !d.is_null()) {
        req["dimensions"] = d.clone();
    }
    let resp = crate::embeddings::create(State(st.clone()), headers, Ok(Bytes::from(req.to_string()))).await?;
    let code = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .map_err(|e| status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if !code.is_success() {
        let e = internal::error_of(code, &bytes);
        // Name Ollama's fields, not OpenAI's.
        return Err(OllamaError(e));
    }
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| status(StatusCode::INTERNAL_SERVER_ERROR, format!("embeddings answer: {e}")))?;
    let vectors = v["data"]
        .as_array()
        .map(|d| d.iter().map(|x| x["embedding"].clone()).collect())
        .unwrap_or_default();
    Ok((vectors, v["usage"]["prompt_tokens"].as_u64().unwrap_or(0)))
}

async fn embed(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let started = Instant::now();
    st.check_key(&headers)?;
    let obj = read_object(&st, body)?;
    refuse_unknown(&obj, EMBED_FIELDS, "/api/embed")?;
    let name = model_name(&obj)?;
    options(obj.get("options"))?;
    keep_alive(obj.get("keep_alive"))?;
    let texts: Vec<String> = match obj.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(format!("input[{i}] must be a string")))
            })
            .collect::<OResult<_>>()?,
        _ => return Err(bad("'input' is required: a string or a list of strings")),
    };
    let truncate = match obj.get("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'truncate' must be a boolean")),
    };
    let (vectors, tokens) = embed_texts(&st, headers, &name, texts, obj.get("dimensions"), truncate).await?;
    Ok(Json(json!({
        "model": name,
        "embeddings": vectors,
        "total_duration": nanos(started.elapsed()),
        "load_duration": 0,
        "prompt_eval_count": tokens,
    }))
    .into_response())
}

async fn embeddings_legacy(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    st.check_key(&headers)?;
    let obj = read_object(&st, body)?;
    refuse_unknown(&obj, EMBEDDINGS_FIELDS, "/api/embeddings")?;
    let name = model_name(&obj)?;
    options(obj.get("options"))?;
    keep_alive(obj.get("keep_alive"))?;
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("'prompt' must be a string")),
    };
    let texts = if prompt.is_empty() { Vec::new() } else { vec![prompt] };
    let (mut vectors, _) = embed_texts(&st, headers, &name, texts, None, true).await?;
    let embedding = if vectors.is_empty() {
        json!([])
    } else {
        vectors.swap_remove(0)
    };
    Ok(Json(json!({ "embedding": embedding })).into_response())
}

// ---------------------------------------------------------------------------------------------
// /api/tags, /api/show, /api/ps, /api/version

/// What the model routes tell of the text model, read once from its file.
#[derive(Clone, Debug)]
pub struct Facts {
    /// Bytes on disk.
    pub size: u64,
    /// The file's modification time.
    pub modified: SystemTime,
    /// A fingerprint of the file's path, size and time (not a hash of its bytes).
    pub digest: String,
    /// `gguf` or `safetensors`.
    pub format: &'static str,
    /// The architecture.
    pub family: String,
    /// `135M`, `1.5B`.
    pub parameter_size: String,
    /// The most common weight type (`Q4_1`, `F16`).
    pub quantization: String,
    /// `general.*` and architecture keys (GGUF metadata without its arrays).
    pub model_info: Map<String, Value>,
    /// The chat template's source.
    pub template: String,
    /// `completion`, `tools`, and `thinking` for templates that think.
    pub capabilities: Vec<&'static str>,
    /// Where the model is.
    pub path: String,
    /// The server's context.
    pub context_length: usize,
}

/// A 64-hex-digit fingerprint of `parts`.
pub(crate) fn fingerprint(parts: &str) -> String {
    (0u8..4)
        .map(|i| {
            let mut h = DefaultHasher::new();
            (i, parts).hash(&mut h);
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// `135M`, `1.2B` for a count of parameters.
fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0}M", n / 1e6)
    } else {
        format!("{:.0}K", n / 1e3)
    }
}

fn gguf_json(v: &anelm_model::gguf::GgufValue) -> Option<Value> {
    use anelm_model::gguf::GgufValue as G;
    Some(match v {
        G::U8(x) => json!(x),
        G::I8(x) => json!(x),
        G::U16(x) => json!(x),
        G::I16(x) => json!(x),
        G::U32(x) => json!(x),
        G::I32(x) => json!(x),
        G::U64(x) => json!(x),
        G::I64(x) => json!(x),
        G::F32(x) => json!(x),
        G::F64(x) => json!(x),
        G::Bool(x) => json!(x),
        G::String(s) => json!(s),
        G::Array(_) => return None,
    })
}

/// Read the facts of `lm` (its file's metadata; a GGUF's header).
fn facts_of(lm: &LoadedModel, ctx: usize) -> Facts {
    let info = lm.model.info();
    let arch = info.architecture.clone();
    let mut model_info = Map::new();
    let (path, format) = match &lm.source {
        ModelSource::Gguf(p) => (p.clone(), "gguf"),
        ModelSource::SafetensorsDir(p) => (p.clone(), "safetensors"),
    };
    let (mut size, mut modified) = (0u64, UNIX_EPOCH);
    let mut parameter_size = String::new();
    let mut quantization = String::new();
    match &lm.source {
        ModelSource::Gguf(p) => {
            if let Ok(m) = std::fs::metadata(p) {
                size = m.len();
                modified = m.modified().unwrap_or(UNIX_EPOCH);
            }
            if let Ok(g) = anelm_model::gguf::GgufFile::open(p) {
                for (k, v) in g.metadata() {
                    if let Some(j) = gguf_json(v) {
                        model_info.insert(k.clone(), j);
                    }
                }
                let mut by_type: Vec<(String, u64)> = Vec::new();
                let mut params = 0u64;
                for t in g.tensors() {
                    let n = t.n_elements();
                    params += n;
                    let name = t.type_name();
                    match by_type.iter_mut().find(|(k, _)| *k == name) {
                        Some((_, c)) => *c += n,
                        None => by_type.push((name, n)),
                    }
                }
                quantization = by_type
                    .into_iter()
                    .max_by_key(|(_, c)| *c)
                    .map(|(k, _)| k)
                    .unwrap_or_default();
                model_info.insert("general.parameter_count".into(), json!(params));
                parameter_size = g
                    .get_str("general.size_label")
                    .map_or_else(|| human_count(params), str::to_string);
            }
        }
        ModelSource::SafetensorsDir(dir) => {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if let Ok(m) = e.metadata()
                        && m.is_file()
                    {
                        size += m.len();
                        modified = modified.max(m.modified().unwrap_or(UNIX_EPOCH));
                    }
                }
            }
        }
    }
    model_info.insert("general.architecture".into(), json!(arch));
    for (k, v) in [
        ("context_length", info.context_length),
        ("embedding_length", info.hidden_size),
        ("block_count", info.n_layers),
        ("vocab_size", info.vocab_size),
    ] {
        model_info.entry(format!("{arch}.{k}")).or_insert_with(|| json!(v));
    }
    let template = lm.template.source().to_string();
    let mut capabilities = vec!["completion", "tools"];
    if reasoning::template_thinks(&template) {
        capabilities.push("thinking");
    }
    let stamp = modified.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    Facts {
        digest: fingerprint(&format!("{}|{size}|{stamp}", path.display())),
        size,
        modified,
        format,
        family: arch,
        parameter_size,
        quantization,
        model_info,
        template,
        capabilities,
        path: path.display().to_string(),
        context_length: ctx,
    }
}

/// The text model's facts: read once it has loaded (`None` until then).
async fn facts(st: &Arc<AppState>) -> Option<Facts> {
    if let Some(f) = st.ollama_facts.get() {
        return Some(f.clone());
    }
    let ready = st.ready.get()?;
    let f = tokio::task::spawn_blocking(move || facts_of(&ready.model, ready.scheduler.config().ctx_size))
        .await
        .ok()?;
    let _ = st.ollama_facts.set(f.clone());
    Some(f)
}

pub(crate) fn details(format: &str, family: &str, parameter_size: &str, quantization: &str) -> Value {
    json!({"parent_model": "", "format": format, "family": family, "families": [family],
           "parameter_size": parameter_size, "quantization_level": quantization})
}

/// The text model's `/api/tags` entry (what is known while it loads).
async fn text_entry(st: &Arc<AppState>) -> Value {
    let name = tag_name(&st.config.model_id);
    let f = facts(st).await;
    let (size, modified, digest, det) = match &f {
        Some(f) => (
            f.size,
            f.modified,
            f.digest.clone(),
            details(f.format, &f.family, &f.parameter_size, &f.quantization),
        ),
        None => (0, UNIX_EPOCH, fingerprint(&name), details("", "", "", "")),
    };
    json!({"name": name, "model": name, "modified_at": rfc3339(modified), "size": size,
           "digest": digest, "details": det})
}

fn embedding_entry(e: &crate::embeddings::Embeddings) -> Value {
    let name = tag_name(&e.id);
    let info = e.model.info();
    json!({"name": name, "model": name, "modified_at": rfc3339(UNIX_EPOCH), "size": 0,
           "digest": fingerprint(&e.id), "details": details("safetensors", &info.architecture, "", "")})
}

async fn tags(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Result<Json<Value>, OllamaError> {
    st.check_key(&headers)?;
    let mut models = Vec::new();
    if !st.embeddings.get().is_some_and(|e| e.only) {
        models.push(text_entry(&st).await);
    }
    if let Some(e) = st.embeddings.get() {
        models.push(embedding_entry(e));
    }
    for up in &st.upstreams.list {
        if let Ok(ids) = up.models().await {
            for id in ids.iter() {
                let name = format!("{}/{id}", up.name);
                models.push(json!({"name": name, "model": name, "modified_at": rfc3339(UNIX_EPOCH),
                                   "size": 0, "digest": fingerprint(&name),
                                   "details": details("upstream", "", "", "")}));
            }
        }
    }
    Ok(Json(json!({ "models": models })))
}

/// Ollama's `parameters` text: one `name value` a line.
fn parameters_text(ctx: usize) -> String {
    let mut lines = vec![format!("num_ctx {ctx}")];
    lines.extend(DEFAULTS.iter().map(|(k, v)| format!("{k} {v}")));
    lines.join("\n")
}

async fn show(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, OllamaError> {
    st.check_key(&headers)?;
    let obj = read_object(&st, body)?;
    refuse_unknown(
        &obj,
        &["model", "name", "verbose", "system", "template", "options"],
        "/api/show",
    )?;
    let name = model_name(&obj)?;
    match resolve(&st, &name, false)? {
        Target::Text => {
            let Some(f) = facts(&st).await else {
                let msg = match st.load_error.get() {
                    Some(e) => format!("the model failed to load: {e}"),
                    None if st.ready.is_sleeping() => {
                        "the model is released for idleness: any generation request reloads it".to_string()
                    }
                    None => "the model is still loading: retry shortly".to_string(),
                };
                return Err(OllamaError(
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", msg).retry_after(2),
                ));
            };
            Ok(Json(json!({
                "modelfile": format!("# anelm serves this model file as it is\nFROM {}\n", f.path),
                "parameters": parameters_text(f.context_length),
                "template": f.template,
                "details": details(f.format, &f.family, &f.parameter_size, &f.quantization),
                "model_info": f.model_info,
                "capabilities": f.capabilities,
                "modified_at": rfc3339(f.modified),
            })))
        }
        Target::Embedding => {
            let Some(e) = st.embeddings.get() else {
                return Err(not_found(&st, &name));
            };
            let info = e.model.info();
            let arch = &info.architecture;
            Ok(Json(json!({
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": details("safetensors", arch, "", ""),
                "model_info": {"general.architecture": arch,
                               format!("{arch}.embedding_length"): info.dimensions,
                               format!("{arch}.context_length"): info.max_tokens},
                "capabilities": ["embedding"],
                "modified_at": rfc3339(UNIX_EPOCH),
            })))
        }
        Target::Upstream => Ok(Json(json!({
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": details("upstream", "", "", ""),
            "model_info": {},
            "capabilities": ["completion", "tools"],
            "modified_at": rfc3339(UNIX_EPOCH),
        }))),
    }
}

/// A time so far ahead it stands for "never".
pub(crate) fn never() -> SystemTime {
    SystemTime::now() + Duration::from_secs(100 * 365 * 86_400)
}

async fn ps(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Result<Json<Value>, OllamaError> {
    st.check_key(&headers)?;
    let mut models = Vec::new();
    if st.ready.get().is_some()
        && let Some(f) = facts(&st).await
    {
        let name = tag_name(&st.config.model_id);
        let expires = match st.loader.get() {
            Some(_) => st
                .ready
                .expires_in(st.ready.idle_after.get().copied())
                .map_or_else(never, |d| SystemTime::now() + d),
            None => never(),
        };
        models.push(json!({"name": name, "model": name, "size": f.size, "digest": f.digest,
                           "details": details(f.format, &f.family, &f.parameter_size, &f.quantization),
                           "expires_at": rfc3339(expires), "size_vram": 0,
                           "context_length": f.context_length}));
    }
    if let Some(e) = st.embeddings.get() {
        let mut entry = embedding_entry(e);
        if let Some(o) = entry.as_object_mut() {
            o.remove("modified_at");
            o.insert("expires_at".into(), json!(rfc3339(never())));
            o.insert("size_vram".into(), json!(0));
            o.insert("context_length".into(), json!(e.model.info().max_tokens));
        }
        models.push(entry);
    }
    Ok(Json(json!({ "models": models })))
}

async fn version() -> Json<Value> {
    Json(json!({"version": OLLAMA_API_VERSION}))
}

// ---------------------------------------------------------------------------------------------
// Model management: not anelm's

fn unsupported(what: &str) -> OllamaError {
    status(StatusCode::NOT_IMPLEMENTED, format!("not supported by anelm: {what}"))
}

async fn pull() -> OllamaError {
    unsupported(
        "/api/pull (anelm has no model store: it serves the model file given to `anelm serve --model PATH`; download the GGUF yourself and start the server with it)",
    )
}

async fn push() -> OllamaError {
    unsupported("/api/push (anelm has no model registry to push to)")
}

async fn create() -> OllamaError {
    unsupported(
        "/api/create (anelm serves model files as they are, without Modelfiles; start anelm serve with --model PATH, and --model-id NAME to name it)",
    )
}

async fn copy() -> OllamaError {
    unsupported("/api/copy (anelm serves one model; start anelm serve with --model-id NAME to rename it)")
}

async fn remove() -> OllamaError {
    unsupported("/api/delete (anelm has no model store; delete the file yourself)")
}

async fn blobs(Path(_digest): Path<String>) -> OllamaError {
    unsupported("/api/blobs (anelm has no model store to upload to)")
}

// ---------------------------------------------------------------------------------------------
// Time

/// `t` as RFC 3339 in UTC with microseconds (`2025-01-02T03:04:05.000006Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("an object")
    }

    fn msg(e: OllamaError) -> String {
        assert_eq!(e.0.status, StatusCode::BAD_REQUEST, "{}", e.0.message);
        e.0.message
    }

    #[test]
    fn names_match_the_served_id_as_ollama_clients_send_them() {
        let id = "SmolLM2-135M-Instruct.Q4_1";
        for n in [
            "SmolLM2-135M-Instruct.Q4_1",
            "smollm2-135m-instruct.q4_1:latest",
            "smollm2",
            "smollm2:latest",
            "smollm2:135m",
            "smollm2-135m-instruct",
        ] {
            assert!(names_match(n, id), "{n}");
        }
        for n in [
            "smol",
            "smollm2:7b",
            "llama3.2",
            "",
            ":latest",
            "smollm2-135m-instruct.q4_1:q8",
        ] {
            assert!(!names_match(n, id), "{n}");
        }
        assert!(names_match("all-minilm-l6-v2", "all-MiniLM-L6-v2"));
        assert_eq!(tag_name("x"), "x:latest");
        assert_eq!(tag_name("x:q4"), "x:q4");
    }

    #[test]
    fn options_map_to_openai_fields_and_refuse_what_is_not_built() {
        let o = options(Some(&json!({"temperature": 0, "top_k": 5, "seed": 7, "stop": ["\n"],
                                       "num_predict": 12, "num_ctx": 512, "min_p": 0.1,
                                       "num_thread": 4, "use_mmap": true, "num_gpu": 0,
                                       "repeat_last_n": 64, "typical_p": 1.0, "mirostat": 0})))
        .expect("valid");
        assert_eq!(o.fields["temperature"], json!(0.0));
        assert_eq!(o.fields["top_k"], json!(5));
        assert_eq!(o.fields["seed"], json!(7));
        assert_eq!(o.fields["stop"], json!(["\n"]));
        assert_eq!(o.fields["top_p"], json!(0.9)); // Ollama's default
        assert_eq!((o.num_predict, o.num_ctx), (Some(12), Some(512)));
        assert!(!o.fields.contains_key("num_thread"));
        let o = options(Some(&json!({"seed": -1}))).expect("random seed");
        assert!(!o.fields.contains_key("seed"));
        assert_eq!(options(None).expect("defaults").fields["temperature"], json!(0.8));
        let m = msg(options(Some(&json!({"frobnicate": 1, "temperature": 0, "zz": 2}))).unwrap_err());
        assert!(m.contains("frobnicate, zz"), "{m}");
        for bad_opts in [
            json!({"mirostat": 2}),
            json!({"typical_p": 0.5}),
            json!({"repeat_last_n": 32}),
            json!({"num_predict": 0}),
            json!({"num_ctx": 0}),
            json!({"temperature": "hot"}),
            json!({"stop": [1]}),
            json!([1]),
        ] {
            let e = options(Some(&bad_opts)).expect_err("refused");
            assert_eq!(e.0.status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn keep_alive_reads_numbers_and_go_durations() {
        let d = |s: f64| Some(Some(Duration::from_secs_f64(s)));
        assert_eq!(keep_alive(None).unwrap(), None);
        assert_eq!(keep_alive(Some(&json!(0))).unwrap(), d(0.0));
        assert_eq!(keep_alive(Some(&json!(30))).unwrap(), d(30.0));
        assert_eq!(keep_alive(Some(&json!("5m"))).unwrap(), d(300.0));
        assert_eq!(keep_alive(Some(&json!("1h30m"))).unwrap(), d(5400.0));
        assert_eq!(keep_alive(Some(&json!("250ms"))).unwrap(), d(0.25));
        assert_eq!(keep_alive(Some(&json!("0"))).unwrap(), d(0.0));
        assert_eq!(keep_alive(Some(&json!(-1))).unwrap(), Some(None));
        assert_eq!(keep_alive(Some(&json!("-1m"))).unwrap(), Some(None));
        for b in [json!("soon"), json!("5x"), json!(true), json!("-")] {
            assert!(keep_alive(Some(&b)).is_err(), "{b}");
        }
    }

    #[test]
    fn chat_requests_become_chat_completions() {
        let t = chat_request(&obj(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "thinking": "hm",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "format": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "options": {"temperature": 0, "num_predict": 5},
            "think": false,
            "stream": false,
            "logprobs": true,
            "top_logprobs": 2,
        })))
        .expect("valid");
        assert_eq!(t.endpoint, Endpoint::Chat);
        assert!(!t.stream && !t.empty);
        assert_eq!(t.num_predict, Some(5));
        let b = Value::Object(t.body);
        assert_eq!(b["messages"][2]["tool_calls"][0]["id"], "call_2_0");
        assert_eq!(
            b["messages"][2]["tool_calls"][0]["function"]["arguments"],
            json!(r#"{"city":"Paris"}"#)
        );
        assert!(b["messages"][2].get("thinking").is_none());
        assert_eq!(b["messages"][3]["tool_call_id"], "call_2_0");
        assert_eq!(b["response_format"]["type"], "json_schema");
        assert_eq!(
            b["response_format"]["json_schema"]["schema"]["properties"]["a"]["type"],
            "integer"
        );
        assert_eq!(b["chat_template_kwargs"], json!({"enable_thinking": false}));
        assert_eq!(
            (b["logprobs"].clone(), b["top_logprobs"].clone()),
            (json!(true), json!(2))
        );
        assert_eq!(b["temperature"], json!(0.0));
        // The OpenAI parser takes the translation as it is.
        openai::parse(b.to_string().as_bytes(), true, 1024).expect("a valid OpenAI body");

        let t = chat_request(&obj(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "format": "json"}),
        ))
        .expect("valid");
        assert!(t.stream);
        assert_eq!(t.body["response_format"], json!({"type": "json_object"}));
        assert!(chat_request(&obj(json!({"model": "m"}))).expect("load").empty);

        for (body, what) in [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
                "images",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "format": "xml"}),
                "format",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "think": "high"}),
                "levels",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "frob": 1}),
                "'frob'",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "frob": 1}]}),
                "messages[0].frob",
            ),
            (json!({"model": "m", "messages": [{"content": "x"}]}), "role"),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "no"}),
                "stream",
            ),
        ] {
            let m = msg(chat_request(&obj(body.clone())).unwrap_err());
            assert!(m.contains(what), "{body}: {m}");
        }
    }

    #[test]
    fn generate_requests_become_chat_or_raw_completions() {
        let t = generate_request(&obj(
            json!({"model": "m", "prompt": "hi", "system": "sys", "format": "json"}),
        ))
        .expect("valid");
        assert_eq!(t.endpoint, Endpoint::Chat);
        assert_eq!(
            t.body["messages"],
            json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}])
        );
        let t = generate_request(&obj(json!({"model": "m", "prompt": "hi", "raw": true,
                                              "format": {"type": "integer"}, "logprobs": true, "top_logprobs": 3})))
        .expect("valid");
        assert_eq!(t.endpoint, Endpoint::Completions);
        assert_eq!(t.body["prompt"], "hi");
        assert_eq!(t.body["grammar"], json!({"json_schema": {"type": "integer"}}));
        assert_eq!(t.body["logprobs"], json!(3));
        openai::parse(Value::Object(t.body).to_string().as_bytes(), false, 1024).expect("a valid body");
        assert!(generate_request(&obj(json!({"model": "m"}))).expect("load").empty);
        for (body, what) in [
            (
                json!({"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}),
                "template",
            ),
            (json!({"model": "m", "prompt": "x", "images": ["aGk="]}), "images"),
            (json!({"model": "m", "prompt": "x", "context": [1, 2]}), "context"),
            (json!({"model": "m", "prompt": "x", "suffix": "y"}), "suffix"),
            (
                json!({"model": "m", "prompt": "x", "raw": true, "system": "s"}),
                "system",
            ),
            (
                json!({"model": "m", "prompt": "x", "raw": true, "think": true}),
                "think",
            ),
        ] {
            let m = msg(generate_request(&obj(body.clone())).unwrap_err());
            assert!(m.contains(what), "{body}: {m}");
        }
        // Empty values of refused fields are what clients send by default.
        generate_request(&obj(
            json!({"model": "m", "prompt": "x", "template": "", "context": [], "images": [], "suffix": ""}),
        ))
        .expect("accepted");
    }

    #[test]
    fn chunks_become_lines_and_a_done_line() {
        let mut t = Translator::new(true, "smollm2", Instant::now(), Duration::ZERO);
        let role =
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
        assert!(t.push(&role).is_empty());
        let a =
            t.push(&json!({"choices": [{"index": 0, "delta": {"reasoning_content": "think"}, "finish_reason": null}]}));
        assert_eq!(a[0]["message"]["thinking"], "think");
        let b = t.push(&json!({"choices": [{"index": 0, "delta": {"content": "Hel"},
                                             "logprobs": {"content": [{"token": "Hel", "logprob": -0.5, "bytes": [72],
                                                                       "top_logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": [72]}]}]},
                                             "finish_reason": null}]}));
        assert_eq!(b[0]["message"], json!({"role": "assistant", "content": "Hel"}));
        assert_eq!(b[0]["done"], false);
        assert_eq!(
            b[0]["logprobs"][0],
            json!({"token": "Hel", "logprob": -0.5, "top_logprobs": [{"token": "Hel", "logprob": -0.5}]})
        );
        t.push(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                                          "function": {"name": "f", "arguments": ""}}]}}]}));
        t.push(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\": 1}"}}]}}]}));
        let end = t.push(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
        assert_eq!(
            end[0]["message"]["tool_calls"],
            json!([{"id": "c1", "function": {"index": 0, "name": "f", "arguments": {"x": 1}}}])
        );
        t.push(
            &json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
                       "timings": {"prompt_ms": 2.0, "predicted_ms": 3.5}}),
        );
        let done = t.done(false);
        assert_eq!(done["done"], true);
        assert_eq!(done["done_reason"], "stop");
        assert_eq!(done["message"], json!({"role": "assistant", "content": ""}));
        assert_eq!(
            (done["prompt_eval_count"].clone(), done["eval_count"].clone()),
            (json!(9), json!(4))
        );
        // The engine's own times (`timings`) become the nanosecond durations.
        assert_eq!(done["prompt_eval_duration"], 2_000_000);
        assert_eq!(done["eval_duration"], 3_500_000);
        assert_eq!(done["load_duration"], 0);
        assert!(done["total_duration"].is_u64());
        let whole = t.done(true);
        assert_eq!(whole["message"]["content"], "Hel");
        assert_eq!(whole["message"]["thinking"], "think");
        assert_eq!(whole["message"]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(whole["logprobs"].as_array().map(Vec::len), Some(1));

        let mut g = Translator::new(false, "m", Instant::now(), Duration::ZERO);
        let l = g.push(&json!({"choices": [{"index": 0, "text": "ab", "finish_reason": null,
                                             "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0],
                                                          "top_logprobs": [{"a": -1.0}, {"b": -2.0, "a": -3.0, "z": -0.5}]}}]}));
        assert_eq!(l[0]["response"], "ab");
        assert_eq!(
            l[0]["logprobs"][1],
            json!({"token": "b", "logprob": -2.0,
                   "top_logprobs": [{"token": "z", "logprob": -0.5}, {"token": "b", "logprob": -2.0},
                                    {"token": "a", "logprob": -3.0}]}),
            "alternatives most likely first, not in key order"
        );
        g.push(&json!({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}));
        let done = g.done(true);
        assert_eq!(
            (done["response"].clone(), done["done_reason"].clone()),
            (json!("ab"), json!("length"))
        );
        assert!(done.get("message").is_none());
    }

    #[test]
    fn errors_have_ollamas_shape() {
        let resp = status(StatusCode::NOT_FOUND, "model 'x' not found").into_response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let resp =
            OllamaError(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "loading").retry_after(2))
                .into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    }

    #[tokio::test]
    async fn error_bodies_are_one_error_string() {
        let resp = bad("no").into_response();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
        assert_eq!(
            serde_json::from_slice::<Value>(&bytes).expect("JSON"),
            json!({"error": "no"})
        );
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_709_251_199_123_456); // 2024-02-29T23:59:59
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59.123456Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000000Z"
        );
    }
}
