//! anelm's OpenAI-compatible HTTP server: `/v1/chat/completions` and `/v1/completions`
//! (streaming SSE or not), `/v1/models`, `/health` (503 until the model is ready), Prometheus
//! `/metrics`, and Ollama's native API under `/api` ([`ollama`]). Every request becomes a scheduler request, so concurrent clients share batched
//! steps; a client that disconnects frees its session at the next step.

pub mod anthropic;
pub mod api_error;
pub mod batch_runner;
pub mod batches_api;
pub mod classify;
pub mod data_dir;
pub mod embeddings;
pub mod files_api;
pub mod idle;
pub mod internal;
pub mod job_store;
pub mod logprobs;
pub mod model_budget;
pub mod model_registry;
pub mod model_router;
pub mod ollama;
pub mod openai;
pub mod priority;
pub mod rerank;
pub mod respond;
pub mod response_store;
pub mod responses;
pub mod speculate;
pub mod upstream;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anelm_engine::{
    CancelToken, ConstraintError, EngineError, Event, LoadedModel, Scheduler, SchedulerConfig, SubmitError, ToolFormat,
    reasoning, tools,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api_error::ApiError;
use crate::batch_runner::Jobs;
use crate::idle::{Live, Loader};
use crate::openai::{Input, Parsed, ToolChoice};
use crate::respond::{CancelOnDrop, Reply};
use crate::upstream::{Privacy, Upstreams};

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
    /// The model being served, once loaded (empty again while it sleeps).
    pub ready: Live,
    /// How to load the model again after an idle sleep (`--idle-unload`).
    loader: OnceLock<Loader>,
    /// Set if loading failed (health reports it).
    pub load_error: OnceLock<String>,
    /// Engines requests may be forwarded to, and the privacy rules.
    pub upstreams: Upstreams,
    /// The embedding model, when the server has one (`/v1/embeddings`).
    pub embeddings: OnceLock<embeddings::Embeddings>,
    /// The reranker, when the server has one (`/v1/rerank`, `/v1/classify`).
    pub rerank: OnceLock<rerank::Rerank>,
    /// The Files and Batch APIs' store and runner, when the server has a data directory.
    pub jobs: OnceLock<Arc<Jobs>>,
    /// Stored responses of the Responses API.
    pub responses: response_store::ResponseStore,
    /// What Ollama's `/api/tags`, `/api/show` and `/api/ps` tell of the model, read once.
    pub ollama_facts: OnceLock<ollama::Facts>,
}

impl AppState {
    /// A state that is still loading, with no upstreams.
    pub fn new(config: ServerConfig) -> Arc<Self> {
        Self::with_upstreams(config, Upstreams::default())
    }

    /// A state that is still loading, forwarding to `upstreams`.
    pub fn with_upstreams(config: ServerConfig, upstreams: Upstreams) -> Arc<Self> {
        Arc::new(Self {
            config,
            ready: Live::default(),
            loader: OnceLock::new(),
            load_error: OnceLock::new(),
            upstreams,
            embeddings: OnceLock::new(),
            rerank: OnceLock::new(),
            jobs: OnceLock::new(),
            responses: response_store::ResponseStore::default(),
            ollama_facts: OnceLock::new(),
        })
    }

    /// Make the model live; returns false if it already was.
    pub fn set_ready(&self, model: Arc<LoadedModel>, cfg: SchedulerConfig) -> anelm_engine::Result<bool> {
        let scheduler = Scheduler::start(model.clone(), cfg)?;
        Ok(self.ready.set(Ready { model, scheduler }))
    }

    /// Release the model after `after` without requests, and load it again with `loader` when
    /// the next one comes (`--idle-unload`). Call from within the server's async runtime.
    pub fn enable_idle_unload(self: &Arc<Self>, after: Duration, loader: Loader) {
        if self.loader.set(loader).is_err() {
            return;
        }
        let _ = self.ready.idle_after.set(after);
        let st = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if st.ready.get().is_none() {
                    continue;
                }
                let s = st.clone();
                // An Ollama request's keep_alive may have set another idle time.
                let limit = st.ready.idle_limit(Some(after)).unwrap_or(after);
                if tokio::task::spawn_blocking(move || s.ready.sleep_if_idle(after))
                    .await
                    .unwrap_or(false)
                {
                    eprintln!(
                        "anelm serve: idle for {} s, model released (the next request reloads it)",
                        limit.as_secs_f64()
                    );
                }
            }
        });
    }

    /// The live model, reloading it first if it sleeps.
    async fn live(&self) -> Result<Arc<Ready>, ApiError> {
        if let Some(e) = embeddings::text_refusal(self) {
            return Err(e);
        }
        if let Some(e) = rerank::refusal(self, "generate text") {
            return Err(e);
        }
        if let Some(r) = self.ready.get() {
            return Ok(r);
        }
        if self.ready.is_sleeping()
            && let Some(loader) = self.loader.get()
        {
            return self.ready.wake(loader).await.map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    format!("could not reload the model: {e}"),
                )
                .retry_after(2)
            });
        }
        let msg = match self.load_error.get() {
            Some(e) => format!("the model failed to load: {e}"),
            None => "the model is still loading: retry shortly".to_string(),
        };
        Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", msg).retry_after(2))
    }

    /// A request whose `model` names an upstream goes there (`path` under its `/v1` base), or is
    /// refused when it is private; `None`: it runs here.
    async fn route_upstream(&self, privacy: Privacy, body: &[u8], path: &str) -> Option<Result<Response, ApiError>> {
        if self.upstreams.list.is_empty() {
            return None;
        }
        let v = serde_json::from_slice::<Value>(body).ok()?;
        let requested = v.get("model").and_then(Value::as_str)?.to_string();
        let up = self.upstreams.named(&requested)?;
        if privacy == Privacy::Local {
            return Some(Err(self
                .upstreams
                .refuse_private(&format!("names the upstream model '{requested}'"))));
        }
        let model = up.model_for(&requested).await;
        Some(up.forward(path, v, &model).await)
    }

    /// A request body, or the OpenAI error for one that is too large or could not be read.
    fn body(&self, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
        body.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    format!("the request body is larger than {} bytes", self.config.max_body_bytes),
                )
            } else {
                ApiError::bad_request(format!("could not read the body: {e}"), None)
            }
        })
    }

    /// With `--api-key`, the request must carry it: `Authorization: Bearer <key>` or (as
    /// Anthropic's clients send it) `x-api-key: <key>`.
    fn check_key(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        check_api_key(self.config.api_key.as_deref(), headers)
    }
}

/// With an API key set, `headers` must carry it: `Authorization: Bearer <key>` or
/// `x-api-key: <key>`; the 401 otherwise.
pub(crate) fn check_api_key(key: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = key else {
        return Ok(());
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    if bearer == Some(key) || x_api_key == Some(key) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
        ))
    }
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    // Uploads may be larger than requests: their own limit (--max-file-bytes) is checked while
    // reading, with room for the multipart framing.
    let upload_limit = state
        .jobs
        .get()
        .map_or(limit, |j| j.max_file_bytes.saturating_add(1 << 16));
    Router::new()
        .route(
            "/v1/files",
            post(files_api::upload)
                .layer(DefaultBodyLimit::max(upload_limit))
                .get(files_api::list),
        )
        .route("/v1/files/{id}", get(files_api::get).delete(files_api::delete))
        .route("/v1/files/{id}/content", get(files_api::content))
        .route("/v1/batches", post(batches_api::create).get(batches_api::list))
        .route("/v1/batches/{id}", get(batches_api::get))
        .route("/v1/batches/{id}/cancel", post(batches_api::cancel))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(embeddings::create))
        .route("/v1/rerank", post(rerank::create))
        .route("/v1/reranking", post(rerank::create))
        .route("/rerank", post(rerank::create))
        .route("/reranking", post(rerank::create))
        .route("/v1/classify", post(classify::create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .merge(ollama::routes())
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
        "no such endpoint: see /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/embeddings, /v1/rerank, /v1/classify, /v1/files, /v1/batches, /v1/models, /health, /metrics, and Ollama's /api/chat, /api/generate, /api/embed, /api/tags",
    )
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.ready.is_sleeping() && st.ready.get().is_none() {
        return (StatusCode::OK, Json(json!({"status": "sleeping"}))).into_response();
    }
    let embedding_only = st.embeddings.get().is_some_and(|e| e.only);
    let rerank_only = st.rerank.get().is_some_and(|r| r.only);
    match (st.ready.get(), st.load_error.get()) {
        (None, None) if rerank_only => (StatusCode::OK, Json(json!({"status": "ok"}))).into_response(),
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
    let mut data: Vec<Value> = match st.embeddings.get() {
        Some(e) if e.only => vec![entry(&e.id)],
        Some(e) => vec![entry(&st.config.model_id), entry(&e.id)],
        None => vec![entry(&st.config.model_id)],
    };
    match st.rerank.get() {
        Some(r) if r.only => data = vec![entry(&r.id)],
        Some(r) => data.push(entry(&r.id)),
        None => {}
    }
    // Each upstream's own models as NAME/ID (its list cached), or the upstream alone with why
    // it cannot be listed.
    for up in &st.upstreams.list {
        match up.models().await {
            Ok(ids) => data.extend(ids.iter().map(|id| {
                json!({"id": format!("{}/{id}", up.name), "object": "model", "created": now(),
                       "owned_by": format!("upstream:{}", up.name), "anelm_health": "ok"})
            })),
            Err(why) => data.push(json!({"id": up.name, "object": "model", "created": now(),
                                         "owned_by": format!("upstream:{}", up.name),
                                         "anelm_health": format!("unreachable: {why}")})),
        }
    }
    Ok(Json(json!({"object": "list", "data": data})))
}

async fn metrics(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // With --api-key, the metrics (request counts, upstream names) need it too.
    if let Err(e) = st.check_key(&headers) {
        return e.into_response();
    }
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
            "prefix_hits_total",
            "counter",
            "requests that copied a shared prompt prefix from another session",
            g(&m.prefix_hits_total),
        );
        put(
            "prefix_tokens_saved_total",
            "counter",
            "prompt tokens those copies saved from prefilling",
            g(&m.prefix_tokens_saved_total),
        );
        put(
            "cache_evictions_total",
            "counter",
            "idle session caches released to stay within --cache-mem",
            g(&m.cache_evictions_total),
        );
        put(
            "constrained_steps_total",
            "counter",
            "decode steps of requests under a grammar (response_format, grammar, tool calls)",
            g(&m.constrained_steps_total),
        );
        put(
            "constraint_masks_total",
            "counter",
            "of those, steps that computed the grammar's full vocabulary mask",
            g(&m.constraint_masks_total),
        );
        put(
            "generated_tokens_total",
            "counter",
            "tokens generated",
            g(&m.generated_tokens_total),
        );
        put(
            "decode_passes_total",
            "counter",
            "decode passes of streams (generated tokens / passes = tokens per pass with speculation)",
            g(&m.decode_passes_total),
        );
        put(
            "draft_tokens_total",
            "counter",
            "tokens drafted by speculative decoding (prompt lookup or the draft model)",
            g(&m.draft_tokens_total),
        );
        put(
            "draft_accepted_total",
            "counter",
            "of those, tokens the streams' own draws agreed with (acceptance = accepted / drafted)",
            g(&m.draft_accepted_total),
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
        put(
            "background_requests_total",
            "counter",
            "background requests accepted (batch lines, X-Anelm-Priority: background, service_tier flex)",
            g(&m.background_requests_total),
        );
        put(
            "preemptions_total",
            "counter",
            "background requests parked so an interactive request could have their session",
            g(&m.preemptions_total),
        );
        put(
            "parked_requests",
            "gauge",
            "background requests parked right now (they resume where they stopped)",
            g(&m.parked),
        );
        if let Some(pc) = &r.scheduler.config().prompt_cache {
            let p = pc.stats();
            put(
                "prompt_cache_bytes",
                "gauge",
                "bytes the on-disk prompt cache takes",
                p.bytes as f64,
            );
            put(
                "prompt_cache_entries",
                "gauge",
                "prompt prefixes kept on disk",
                p.entries as f64,
            );
            put(
                "prompt_cache_hits_total",
                "counter",
                "requests that restored a prompt prefix from disk",
                p.hits as f64,
            );
            put(
                "prompt_cache_tokens_restored_total",
                "counter",
                "prompt tokens restored from disk instead of prefilled",
                p.tokens_restored as f64,
            );
            put(
                "prompt_cache_discarded_total",
                "counter",
                "on-disk entries discarded as unusable (torn, corrupt, another model's)",
                p.discarded as f64,
            );
        }
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
    put(
        "sleeping",
        "gauge",
        "1 while the model is released for idleness (--idle-unload)",
        f64::from(u8::from(st.ready.is_sleeping() && st.ready.get().is_none())),
    );
    put(
        "sleeps_total",
        "counter",
        "idle releases of the model",
        st.ready.sleeps.load(Ordering::Relaxed) as f64,
    );
    put(
        "reloads_total",
        "counter",
        "reloads after an idle release",
        st.ready.reloads.load(Ordering::Relaxed) as f64,
    );
    put(
        "last_reload_seconds",
        "gauge",
        "how long the last reload took",
        st.ready.last_reload_ms.load(Ordering::Relaxed) as f64 / 1e3,
    );
    if let Some(b) = idle::resident_bytes() {
        put("resident_bytes", "gauge", "resident memory of the process", b as f64);
    }
    put(
        "refused_private_total",
        "counter",
        "private requests refused instead of forwarded to an upstream",
        st.upstreams.refused_private.load(Ordering::Relaxed) as f64,
    );
    if !st.upstreams.list.is_empty() {
        out.push_str("# HELP anelm_upstream_requests_total requests forwarded to each upstream\n# TYPE anelm_upstream_requests_total counter\n");
        for u in &st.upstreams.list {
            out.push_str(&format!(
                "anelm_upstream_requests_total{{upstream=\"{}\"}} {}\n",
                u.name,
                u.forwarded.load(Ordering::Relaxed)
            ));
        }
        out.push_str("# HELP anelm_upstream_failures_total requests an upstream could not serve (502/504)\n# TYPE anelm_upstream_failures_total counter\n");
        for u in &st.upstreams.list {
            out.push_str(&format!(
                "anelm_upstream_failures_total{{upstream=\"{}\"}} {}\n",
                u.name,
                u.failed.load(Ordering::Relaxed)
            ));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// Seconds since the Unix epoch (`created` fields).
pub(crate) fn now() -> u64 {
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

/// The prompt a parsed request runs: the chat template applied to its messages (with the tools
/// it shows the model), or its raw text; and its tokens. Every surface that counts a request's
/// prompt tokens counts these.
pub(crate) fn render_prompt(lm: &LoadedModel, parsed: &Parsed) -> Result<(String, Vec<u32>), ApiError> {
    let text = match &parsed.input {
        Input::Chat(msgs) => lm
            .render_chat(msgs, parsed.visible_tools(), &parsed.template_kwargs)
            .map_err(|e| ApiError::bad_request(format!("chat template: {e}"), Some("messages")))?,
        Input::Text(t) => t.clone(),
    };
    let ids = lm
        .tokenizer
        .encode(&text)
        .map_err(|e| ApiError::bad_request(format!("tokenization failed: {e}"), None))?;
    Ok((text, ids))
}

/// A chat (`chat`) or completions request, from its headers and body to its response. The
/// batch runner sends batch lines through here too.
pub(crate) async fn handle(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let body = st.body(body)?;
    st.ready.touch();
    let privacy = Privacy::of(&headers, st.upstreams.private_by_default)?;
    let path = if chat { "/chat/completions" } else { "/completions" };
    if let Some(forwarded) = st.route_upstream(privacy, &body, path).await {
        return forwarded;
    }
    let ready = st.live().await?;
    let lm = &ready.model;
    let ctx = ready.scheduler.config().ctx_size;
    let parsed: Parsed = openai::parse(&body, chat, ctx)?;
    let priority = priority::of(&headers, parsed.priority)?;
    let tools = parsed.visible_tools();
    let tool_format = ToolFormat::of(&lm.template);
    let (prompt_text, prompt) = render_prompt(lm, &parsed)?;
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
    if parsed.speculate == anelm_engine::Speculation::Model && ready.scheduler.config().draft_model.is_none() {
        return Err(ApiError::bad_request(
            "speculate \"draft\": this server has no draft model (start it with --speculate PATH); ask for \"lookup\" or \"off\"",
            Some("speculate"),
        ));
    }
    // Where a long system prompt ends: the on-disk prompt cache keeps that prefix, which later
    // requests with the same system prompt and another question restore.
    let cache_hint = match (&parsed.input, &ready.scheduler.config().prompt_cache) {
        (Input::Chat(msgs), Some(pc))
            if msgs.len() > 1 && msgs[0].role == "system" && prompt.len() > pc.options().min_tokens =>
        {
            lm.render_chat(&msgs[..1], tools, &parsed.template_kwargs)
                .ok()
                .and_then(|t| lm.tokenizer.encode(&t).ok())
                .map(|sys| sys.iter().zip(&prompt).take_while(|(a, b)| a == b).count())
                .filter(|&n| n >= pc.options().min_tokens)
        }
        _ => None,
    };
    // `n` choices: `n` streams over the same prompt (they share its prefill: the scheduler's
    // prefix sharing copies the first one's cache), choice `i` sampling with seed + i.
    let (tx, rx) = mpsc::unbounded_channel::<(usize, Event)>();
    let mut cancels = Vec::with_capacity(parsed.n);
    for i in 0..parsed.n {
        let mut req = parsed.request(prompt.clone(), constraint.clone());
        req.stream.sampler.seed = req.stream.sampler.seed.wrapping_add(i as u64);
        let cancel = CancelToken::new();
        let tx = tx.clone();
        let how = anelm_engine::Submission { priority, cache_hint };
        let submitted =
            ready
                .scheduler
                .submit_with(req, how, Box::new(move |e| tx.send((i, e)).is_ok()), cancel.clone());
        if let Err(e) = submitted {
            cancels.iter().for_each(CancelToken::cancel);
            if matches!(e, SubmitError::QueueFull(_))
                && let Some(fb) = st.upstreams.fallback()
            {
                // The local queue is full: a request that may leave goes to the fallback.
                if privacy == Privacy::Local {
                    return Err(st.upstreams.refuse_private_fallback());
                }
                let v: Value = serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
                let model = fb.model_for(&fb.name).await;
                return fb.forward(path, v, &model).await;
            }
            return Err(match e {
                SubmitError::QueueFull(_) => {
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "server_error", e.to_string()).retry_after(1)
                }
                SubmitError::ShuttingDown => {
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", e.to_string()).retry_after(5)
                }
                SubmitError::Invalid(m) => ApiError::bad_request(m, None),
            });
        }
        cancels.push(cancel);
    }
    drop(tx);
    let guard = CancelOnDrop(cancels);
    let reply = Reply {
        id: request_id(if chat { "chatcmpl" } else { "cmpl" }),
        model: parsed.model.clone().unwrap_or_else(|| st.config.model_id.clone()),
        chat,
        lm: lm.clone(),
        tools: (!tools.is_empty()).then_some(tool_format),
        parallel_tool_calls: parsed.parallel_tool_calls,
        thinking_prompt: (chat && reasoning::template_thinks(lm.template.source()))
            .then(|| Arc::from(prompt_text.as_str())),
        choices: parsed.n,
        legacy_functions: parsed.legacy_functions,
    };
    if parsed.stream {
        Ok(respond::stream(rx, guard, reply, parsed.include_usage).into_response())
    } else {
        respond::collect(rx, guard, reply).await
    }
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
