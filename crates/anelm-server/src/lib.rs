//! anelm's OpenAI-compatible HTTP server: `/v1/chat/completions` and `/v1/completions`
//! (streaming SSE or not), `/v1/models`, `/health` (503 until the model is ready), Prometheus
//! `/metrics`. Every request becomes a scheduler request, so concurrent clients share batched
//! steps; a client that disconnects frees its session at the next step.

pub mod api_error;
pub mod embeddings;
pub mod logprobs;
pub mod openai;

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use anelm_engine::{
    CancelToken, Completion, ConstraintError, EngineError, Event, FinishReason, LoadedModel, Scheduler,
    SchedulerConfig, SubmitError, TokenLogprob, ToolFormat, ToolSpec, tools,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api_error::ApiError;
use crate::openai::{Input, Parsed, ToolChoice};

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Name reported by `/v1/models` and echoed in responses.
    pub model_id: String,
    /// Bearer token required on `/v1/*` when set.
    pub api_key: Option<String>,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
}

/// The loaded model and its scheduler, once ready.
pub struct Ready {
    /// Model, tokenizer and template.
    pub model: Arc<LoadedModel>,
    /// The continuous-batching scheduler serving it.
    pub scheduler: Scheduler,
}

/// Shared by all handlers. `ready` is empty while the model loads.
pub struct AppState {
    /// Settings.
    pub config: ServerConfig,
    /// Filled when loading is done.
    pub ready: OnceLock<Ready>,
    /// Set if loading failed (health reports it).
    pub load_error: OnceLock<String>,
    /// The embedding model, when the server has one (`/v1/embeddings`).
    pub embeddings: OnceLock<embeddings::Embeddings>,
}

impl AppState {
    /// A state that is still loading.
    pub fn new(config: ServerConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            ready: OnceLock::new(),
            load_error: OnceLock::new(),
            embeddings: OnceLock::new(),
        })
    }

    /// Make the model live; returns false if it already was.
    pub fn set_ready(&self, model: Arc<LoadedModel>, cfg: SchedulerConfig) -> anelm_engine::Result<bool> {
        let scheduler = Scheduler::start(model.clone(), cfg)?;
        Ok(self.ready.set(Ready { model, scheduler }).is_ok())
    }

    fn get_ready(&self) -> Result<&Ready, ApiError> {
        if let Some(e) = embeddings::text_refusal(self) {
            return Err(e);
        }
        self.ready.get().ok_or_else(|| {
            let msg = match self.load_error.get() {
                Some(e) => format!("the model failed to load: {e}"),
                None => "the model is still loading: retry shortly".to_string(),
            };
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", msg).retry_after(2)
        })
    }

    fn check_key(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.config.api_key else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given == Some(key.as_str()) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
            ))
        }
    }
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(embeddings::create))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint: see /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /health, /metrics",
    )
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let embedding_only = st.embeddings.get().is_some_and(|e| e.only);
    match (st.ready.get(), st.load_error.get()) {
        (Some(_), _) | (None, None) if embedding_only => {
            (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
        }
        (Some(_), _) => (StatusCode::OK, Json(json!({"status": "ok"}))).into_response(),
        (None, Some(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "error": e})),
        )
            .into_response(),
        (None, None) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading"}))).into_response(),
    }
}

async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let entry = |id: &str| json!({"id": id, "object": "model", "created": now(), "owned_by": "anelm"});
    let data: Vec<Value> = match st.embeddings.get() {
        Some(e) if e.only => vec![entry(&e.id)],
        Some(e) => vec![entry(&st.config.model_id), entry(&e.id)],
        None => vec![entry(&st.config.model_id)],
    };
    Ok(Json(json!({"object": "list", "data": data})))
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, v: f64| {
        out.push_str(&format!(
            "# HELP anelm_{name} {help}\n# TYPE anelm_{name} {kind}\nanelm_{name} {v}\n"
        ));
    };
    put(
        "ready",
        "gauge",
        "1 when the model is loaded",
        f64::from(u8::from(st.ready.get().is_some())),
    );
    if let Some(r) = st.ready.get() {
        let m = r.scheduler.metrics();
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
        put("requests_total", "counter", "requests accepted", g(&m.requests_total));
        put(
            "requests_rejected_total",
            "counter",
            "requests refused (queue full)",
            g(&m.requests_rejected),
        );
        put(
            "requests_finished_total",
            "counter",
            "requests finished",
            g(&m.requests_finished),
        );
        put(
            "requests_cancelled_total",
            "counter",
            "requests cancelled by clients",
            g(&m.requests_cancelled),
        );
        put(
            "prompt_tokens_total",
            "counter",
            "prompt tokens prefilled",
            g(&m.prompt_tokens_total),
        );
        put(
            "reused_tokens_total",
            "counter",
            "prompt tokens reused from session caches",
            g(&m.reused_tokens_total),
        );
        put(
            "generated_tokens_total",
            "counter",
            "tokens generated",
            g(&m.generated_tokens_total),
        );
        put(
            "queue_depth",
            "gauge",
            "requests waiting for a session",
            g(&m.queue_depth),
        );
        put(
            "busy_sessions",
            "gauge",
            "sessions serving a request",
            g(&m.busy_sessions),
        );
        put(
            "sessions",
            "gauge",
            "sessions in the pool",
            r.scheduler.config().sessions as f64,
        );
        put(
            "session_cache_bytes",
            "gauge",
            "bytes the sessions' caches hold for prompt reuse (KV capacity included)",
            g(&m.session_cache_bytes),
        );
        put("steps_total", "counter", "batched forward steps", g(&m.steps_total));
        put(
            "step_seconds_total",
            "counter",
            "time in steps",
            g(&m.step_time_us_total) / 1e6,
        );
        put(
            "generation_tokens_per_second",
            "gauge",
            "generation rate of the last step",
            g(&m.last_step_gen_tok_s_milli) / 1000.0,
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn request_id(prefix: &str) -> String {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{:x}{:06x}", now(), NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    handle(st, headers, body, true).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    handle(st, headers, body, false).await
}

/// Cancels the scheduler request when the response (or its stream) is dropped early.
struct CancelOnDrop(CancelToken);
impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

fn usage(c: &Completion) -> Value {
    json!({"prompt_tokens": c.prompt_tokens, "completion_tokens": c.tokens.len(),
           "total_tokens": c.prompt_tokens + c.tokens.len()})
}

async fn handle(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than {} bytes", st.config.max_body_bytes),
            )
        } else {
            ApiError::bad_request(format!("could not read the body: {e}"), None)
        }
    })?;
    let ready = st.get_ready()?;
    let lm = &ready.model;
    let ctx = ready.scheduler.config().ctx_size;
    let parsed: Parsed = openai::parse(&body, chat, ctx)?;
    // The tools the model sees: none with tool_choice "none".
    let tools: &[ToolSpec] = if parsed.tool_choice == ToolChoice::None {
        &[]
    } else {
        &parsed.tools
    };
    let tool_format = ToolFormat::of(&lm.template);
    let prompt_text = match &parsed.input {
        Input::Chat(msgs) => lm
            .render_chat(msgs, tools, &parsed.template_kwargs)
            .map_err(|e| ApiError::bad_request(format!("chat template: {e}"), Some("messages")))?,
        Input::Text(t) => t.clone(),
    };
    let prompt = lm
        .tokenizer
        .encode(&prompt_text)
        .map_err(|e| ApiError::bad_request(format!("tokenization failed: {e}"), None))?;
    if prompt.is_empty() {
        return Err(ApiError::bad_request(
            "the prompt is empty",
            Some(if chat { "messages" } else { "prompt" }),
        ));
    }
    if prompt.len() + parsed.max_tokens > ctx {
        return Err(ApiError::bad_request(
            format!(
                "the prompt ({} tokens) plus max_tokens ({}) exceeds the context of {ctx} tokens",
                prompt.len(),
                parsed.max_tokens
            ),
            Some("max_tokens"),
        ));
    }
    let forced = match &parsed.tool_choice {
        ToolChoice::Forced(which) => Some(tools::forced_call_grammar(tool_format, tools, which)),
        _ => None,
    };
    let constraint = match forced.or_else(|| parsed.grammar.clone()) {
        None => None,
        Some(g) => {
            // Compiling a grammar (and, the first time, indexing the vocabulary) is CPU work.
            let model = lm.clone();
            let compiled = tokio::task::spawn_blocking(move || model.constraint(&g))
                .await
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))?;
            let param = if parsed.tool_choice != ToolChoice::None && parsed.grammar.is_none() {
                "tools"
            } else if parsed.grammar_field {
                "grammar"
            } else {
                "response_format"
            };
            Some(compiled.map_err(|e| match e {
                EngineError::Constraint(ConstraintError::Invalid(m)) => {
                    ApiError::bad_request(format!("the output grammar is invalid: {m}"), Some(param))
                }
                other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", other.to_string()),
            })?)
        }
    };
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let cancel = CancelToken::new();
    ready
        .scheduler
        .submit(
            parsed.request(prompt, constraint),
            Box::new(move |e| tx.send(e).is_ok()),
            cancel.clone(),
        )
        .map_err(|e| match e {
            SubmitError::QueueFull(_) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "server_error", e.to_string()).retry_after(1)
            }
            SubmitError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", e.to_string()).retry_after(5)
            }
            SubmitError::Invalid(m) => ApiError::bad_request(m, None),
        })?;
    let guard = CancelOnDrop(cancel);
    let reply = Reply {
        id: request_id(if chat { "chatcmpl" } else { "cmpl" }),
        model: parsed.model.clone().unwrap_or_else(|| st.config.model_id.clone()),
        chat,
        lm: lm.clone(),
        tools: (!tools.is_empty()).then_some(tool_format),
        parallel_tool_calls: parsed.parallel_tool_calls,
    };
    if parsed.stream {
        Ok(stream_response(rx, guard, reply, parsed.include_usage).into_response())
    } else {
        collect_response(rx, guard, reply).await
    }
}

/// What every response of one request names: its id, the model, the endpoint's shape, and the
/// tokenizer that spells log-probabilities' tokens.
#[derive(Clone)]
struct Reply {
    id: String,
    model: String,
    chat: bool,
    lm: Arc<LoadedModel>,
    /// The request offered tools, which the model writes in this format: the answer is read
    /// for calls (and, streaming, held back until it is complete).
    tools: Option<ToolFormat>,
    parallel_tool_calls: bool,
}

/// An answer read for tool calls: the text outside them and the calls in OpenAI's form.
struct Answer {
    content: Option<String>,
    tool_calls: Vec<Value>,
}

impl Reply {
    /// `text` read for tool calls when the request offered tools.
    fn answer(&self, text: String) -> Answer {
        let Some(format) = self.tools else {
            return Answer {
                content: Some(text),
                tool_calls: Vec::new(),
            };
        };
        let (content, mut calls) = tools::parse_tool_calls(format, &text);
        if !self.parallel_tool_calls {
            calls.truncate(1);
        }
        if calls.is_empty() {
            return Answer {
                content: Some(text),
                tool_calls: Vec::new(),
            };
        }
        let tool_calls = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"id": format!("call_{}_{i}", self.id), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments.to_string()}})
            })
            .collect();
        Answer {
            content: (!content.is_empty()).then_some(content),
            tool_calls,
        }
    }

    /// `finish_reason` for a finished answer: `tool_calls` when it made calls.
    fn finish(&self, answer: &Answer, f: FinishReason) -> &'static str {
        if !answer.tool_calls.is_empty() && f == FinishReason::Stop {
            "tool_calls"
        } else {
            finish_reason(f)
        }
    }

    /// The `logprobs` value of a choice for `tokens`, whose text starts at byte `offset`.
    fn logprobs(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        if self.chat {
            logprobs::chat(&self.lm.tokenizer, tokens)
        } else {
            logprobs::completions(&self.lm.tokenizer, tokens, offset)
        }
    }
}

async fn collect_response(
    mut rx: mpsc::UnboundedReceiver<Event>,
    guard: CancelOnDrop,
    reply: Reply,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut lps: Option<Vec<TokenLogprob>> = None;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Logprob(lp) => lps.get_or_insert_with(Vec::new).push(lp),
            Event::Failed(m) => {
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m));
            }
            Event::Done(c) => {
                drop(guard);
                let logprobs = lps.as_deref().map_or(Value::Null, |l| reply.logprobs(l, 0));
                let choice = if reply.chat {
                    let answer = reply.answer(text);
                    let finish = reply.finish(&answer, c.finish);
                    let mut message = json!({"role": "assistant", "content": answer.content});
                    if !answer.tool_calls.is_empty() {
                        message["tool_calls"] = Value::Array(answer.tool_calls);
                    }
                    json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish})
                } else {
                    json!({"index": 0, "text": text, "logprobs": logprobs,
                           "finish_reason": finish_reason(c.finish)})
                };
                let obj = if reply.chat {
                    "chat.completion"
                } else {
                    "text_completion"
                };
                let body = json!({"id": reply.id, "object": obj, "created": now(), "model": reply.model,
                                  "choices": [choice], "usage": usage(&c)});
                return Ok(Json(body).into_response());
            }
        }
    }
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "generation ended without a result",
    ))
}

/// A streamed response's state between events.
struct StreamState {
    rx: mpsc::UnboundedReceiver<Event>,
    guard: Option<CancelOnDrop>,
    /// Frames ready to send.
    queue: std::collections::VecDeque<Value>,
    /// Log-probabilities of tokens whose text has not been sent yet.
    pending: Vec<TokenLogprob>,
    /// Bytes of completion text sent so far (the completions form's `text_offset`).
    offset: usize,
    /// With tools offered, the text is held here until the answer is complete and read for
    /// calls (a call cannot be told from text while it is being written).
    held: Option<String>,
    done: bool,
}

fn stream_response(
    rx: mpsc::UnboundedReceiver<Event>,
    guard: CancelOnDrop,
    reply: Reply,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let created = now();
    let obj = if reply.chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk = move |reply: &Reply, delta: Value, logprobs: Value, finish: Option<&str>| -> Value {
        let choice = if reply.chat {
            json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")),
                   "logprobs": logprobs, "finish_reason": finish})
        };
        json!({"id": reply.id, "object": obj, "created": created, "model": reply.model, "choices": [choice]})
    };
    let mut queue = std::collections::VecDeque::new();
    if reply.chat {
        queue.push_back(chunk(
            &reply,
            json!({"role": "assistant", "content": ""}),
            Value::Null,
            None,
        ));
    }
    let init = StreamState {
        rx,
        guard: Some(guard),
        queue,
        pending: Vec::new(),
        offset: 0,
        held: reply.tools.map(|_| String::new()),
        done: false,
    };
    let stream = futures_util::stream::unfold(init, move |mut st| {
        let reply = reply.clone();
        async move {
            loop {
                if let Some(v) = st.queue.pop_front() {
                    let ev = match v {
                        Value::String(s) => SseEvent::default().data(s),
                        v => SseEvent::default().data(v.to_string()),
                    };
                    return Some((Ok(ev), st));
                }
                if st.done {
                    return None;
                }
                // The log-probabilities of the tokens whose text goes out in this chunk.
                let take_logprobs = |st: &mut StreamState| {
                    if st.pending.is_empty() {
                        return Value::Null;
                    }
                    let v = reply.logprobs(&st.pending, st.offset);
                    st.offset += st
                        .pending
                        .iter()
                        .map(|t| reply.lm.tokenizer.token_bytes(t.token).len())
                        .sum::<usize>();
                    st.pending.clear();
                    v
                };
                match st.rx.recv().await {
                    Some(Event::Logprob(lp)) => st.pending.push(lp),
                    Some(Event::Text(t)) => match &mut st.held {
                        Some(held) => held.push_str(&t),
                        None => {
                            let lps = take_logprobs(&mut st);
                            st.queue.push_back(chunk(&reply, json!({"content": t}), lps, None));
                        }
                    },
                    Some(Event::Done(c)) => {
                        st.guard.take(); // finished: cancelling a finished request is a no-op
                        let mut finish = finish_reason(c.finish);
                        if let Some(text) = st.held.take() {
                            let answer = reply.answer(text);
                            finish = reply.finish(&answer, c.finish);
                            if let Some(content) = answer.content {
                                let lps = take_logprobs(&mut st);
                                st.queue
                                    .push_back(chunk(&reply, json!({"content": content}), lps, None));
                            }
                            for (i, call) in answer.tool_calls.into_iter().enumerate() {
                                // As OpenAI streams a call: id, type and name first, then the arguments.
                                let head = json!({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                  "function": {"name": call["function"]["name"], "arguments": ""}}]});
                                st.queue.push_back(chunk(&reply, head, Value::Null, None));
                                let args = json!({"tool_calls": [{"index": i,
                                                  "function": {"arguments": call["function"]["arguments"]}}]});
                                st.queue.push_back(chunk(&reply, args, Value::Null, None));
                            }
                        }
                        if !st.pending.is_empty() {
                            // Tokens whose text was held back and never sent (a stop string).
                            let lps = take_logprobs(&mut st);
                            st.queue.push_back(chunk(&reply, json!({"content": ""}), lps, None));
                        }
                        st.queue.push_back(chunk(&reply, json!({}), Value::Null, Some(finish)));
                        if include_usage {
                            let mut u = chunk(&reply, json!({}), Value::Null, None);
                            if let Some(o) = u.as_object_mut() {
                                o.insert("choices".into(), json!([]));
                                o.insert("usage".into(), usage(&c));
                            }
                            st.queue.push_back(u);
                        }
                        st.queue.push_back(Value::String("[DONE]".into()));
                        st.done = true;
                    }
                    Some(Event::Failed(m)) => {
                        st.queue
                            .push_back(json!({"error": {"message": m, "type": "server_error"}}));
                        st.queue.push_back(Value::String("[DONE]".into()));
                        st.done = true;
                    }
                    None => {
                        st.queue.push_back(Value::String("[DONE]".into()));
                        st.done = true;
                    }
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// Resolves when the process gets SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
