//! The HTTP front of a multi-model server: a request to a model endpoint (chat, completions,
//! responses, messages, embeddings, rerank, classify, Ollama's chat/generate/embed/show) is read
//! (up to `--max-body-bytes`), its JSON `model` picks the model ([`ModelRegistry::resolve`];
//! none: the first, the default), the model is loaded if it is not, and the request goes to
//! that model's own [`crate::router`] unchanged, so every endpoint behaves as in a one-model
//! server. Ollama's `keep_alive` sets the model's idle time (`-1` pins it, `0` unloads it after
//! the request). The front itself answers `/v1/models` (every model with its state), the load
//! and unload endpoints, `/health`, `/metrics` (per-model lines labelled `model`), each model's
//! own `/models/{id}/health` and `/models/{id}/metrics`, and Ollama's `/api/tags` and
//! `/api/ps`. Any other path goes to the default model.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Map, Value, json};

use crate::anthropic::AnthropicError;
use crate::api_error::ApiError;
use crate::model_registry::{ModelRegistry, ModelState};
use crate::ollama::{self, OllamaError};

/// The POST endpoints whose body names a model.
const MODEL_ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/reranking",
    "/rerank",
    "/reranking",
    "/v1/classify",
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
];

/// The router in front of every model of `reg` (and its idle reaper, started here: call from
/// within the server's async runtime).
pub fn router(reg: Arc<ModelRegistry>) -> Router {
    reg.start_reaper();
    let mut r = Router::new();
    for path in MODEL_ENDPOINTS {
        r = r.route(path, post(by_model));
    }
    r.route("/v1/models", get(list))
        .route("/v1/models/{id}", get(one))
        .route("/v1/models/{id}/load", post(load))
        .route("/v1/models/{id}/unload", post(unload))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/models/{id}/health", get(model_health))
        .route("/models/{id}/metrics", get(model_metrics))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .fallback(to_default)
        .with_state(reg)
}

/// `e` in the error shape of the API `path` belongs to (Ollama's, Anthropic's or OpenAI's).
fn shaped(path: &str, e: ApiError) -> Response {
    if path.starts_with("/api/") {
        OllamaError(e).into_response()
    } else if path.starts_with("/v1/messages") {
        AnthropicError(e).into_response()
    } else {
        e.into_response()
    }
}

fn check_key(reg: &ModelRegistry, headers: &HeaderMap) -> Result<(), ApiError> {
    crate::check_api_key(reg.config().api_key.as_deref(), headers)
}

async fn by_model(State(reg): State<Arc<ModelRegistry>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    match route_by_model(reg, req, &path).await {
        Ok(r) => r,
        Err(e) => shaped(&path, e),
    }
}

async fn route_by_model(reg: Arc<ModelRegistry>, req: Request, path: &str) -> Result<Response, ApiError> {
    let started = Instant::now();
    // Refuse a request without the key before it can make a model load.
    check_key(&reg, req.headers())?;
    let limit = reg.config().max_body_bytes;
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        if e.into_inner().is::<http_body_util::LengthLimitError>() {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than {limit} bytes"),
            )
        } else {
            ApiError::bad_request("could not read the body", None)
        }
    })?;
    // A body that is not a JSON object goes to the default model, whose handler says what is
    // wrong with it.
    let obj: Map<String, Value> = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) => o,
        _ => Map::new(),
    };
    let ollama_api = path.starts_with("/api/");
    let named = obj
        .get("model")
        .or_else(|| ollama_api.then(|| obj.get("name")).flatten())
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let i = match named {
        Some(name) => reg.resolve(name)?,
        None => 0,
    };
    if ollama_api && path != "/api/show" {
        let keep = ollama::keep_alive(obj.get("keep_alive")).map_err(|e| e.0)?;
        let empty = match path {
            "/api/chat" => ollama::is_empty_value(obj.get("messages")),
            "/api/generate" => ollama::is_empty_value(obj.get("prompt")),
            _ => false,
        };
        if empty && keep == Some(Some(Duration::ZERO)) {
            // Ollama's unload request: nothing to generate, keep_alive 0.
            reg.unload(i).await?;
            let name = named.unwrap_or(reg.id(i)).to_string();
            return Ok(ollama::load_answer(
                path == "/api/chat",
                &name,
                started,
                Duration::ZERO,
                "unload",
            ));
        }
        // As Ollama: each request sets how long its model stays loaded (none: the default).
        reg.set_keep_alive(i, keep);
    }
    let lease = reg.acquire(i).await?;
    Ok(lease.forward(Request::from_parts(parts, Body::from(bytes))).await)
}

/// Any other path: the default model's router (loading it).
async fn to_default(State(reg): State<Arc<ModelRegistry>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    match reg.acquire(0).await {
        Ok(lease) => lease.forward(req).await,
        Err(e) => shaped(&path, e),
    }
}

async fn list(State(reg): State<Arc<ModelRegistry>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    check_key(&reg, &headers)?;
    let data: Vec<Value> = (0..reg.len()).map(|i| reg.describe(i)).collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

async fn one(
    State(reg): State<Arc<ModelRegistry>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    check_key(&reg, &headers)?;
    let i = reg.resolve(&id)?;
    Ok(Json(reg.describe(i)))
}

/// `POST /v1/models/{id}/load`, optionally with `{"keep_alive": -1 | seconds | "5m"}`: load the
/// model now (again, if its last load failed) and answer its description.
async fn load(
    State(reg): State<Arc<ModelRegistry>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    check_key(&reg, &headers)?;
    let i = reg.resolve(&id)?;
    let keep = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let obj = match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(o)) => o,
            _ => {
                return Err(ApiError::bad_request(
                    "the body must be empty or a JSON object such as {\"keep_alive\": -1}",
                    None,
                ));
            }
        };
        if let Some(k) = obj.keys().find(|k| k.as_str() != "keep_alive") {
            return Err(ApiError::bad_request(
                format!("'{k}' is not supported here: the body may only set keep_alive"),
                Some(k),
            ));
        }
        ollama::keep_alive(obj.get("keep_alive")).map_err(|e| ApiError {
            param: Some("keep_alive".into()),
            ..e.0
        })?
    };
    reg.load(i).await?;
    if keep.is_some() {
        reg.set_keep_alive(i, keep);
    }
    Ok(Json(reg.describe(i)))
}

/// `POST /v1/models/{id}/unload`: unload the model now (409 while it serves requests) and
/// forget its `keep_alive`.
async fn unload(
    State(reg): State<Arc<ModelRegistry>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    check_key(&reg, &headers)?;
    let i = reg.resolve(&id)?;
    reg.unload(i).await?;
    Ok(Json(reg.describe(i)))
}

/// 200 while the server runs, with every model's state (one failed model does not make the
/// server unhealthy; `/models/{id}/health` tells of one model).
async fn health(State(reg): State<Arc<ModelRegistry>>) -> Json<Value> {
    let models: Vec<Value> = (0..reg.len())
        .map(|i| {
            let (state, error) = reg.state(i);
            let mut v = json!({"id": reg.id(i), "state": state.as_str()});
            if let Some(e) = error {
                v["error"] = json!(e);
            }
            v
        })
        .collect();
    Json(json!({"status": "ok", "models": models}))
}

async fn metrics(State(reg): State<Arc<ModelRegistry>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&reg, &headers) {
        return e.into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        reg.metrics_text(),
    )
        .into_response()
}

/// A `GET path` to model `i`'s own router, when it is loaded.
async fn ask_loaded(reg: &Arc<ModelRegistry>, i: usize, path: &str, headers: HeaderMap) -> Option<Response> {
    let lease = reg.lease_if_loaded(i)?;
    let mut req = Request::new(Body::empty());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = path.parse().ok()?;
    *req.headers_mut() = headers;
    Some(lease.forward(req).await)
}

/// One model's health: its own `/health` when loaded; else its state (`unloaded` is 200: the
/// next request loads it; `loading` and `failed` are 503).
async fn model_health(
    State(reg): State<Arc<ModelRegistry>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let i = reg.resolve(&id)?;
    if let Some(r) = ask_loaded(&reg, i, "/health", headers).await {
        return Ok(r);
    }
    let (state, error) = reg.state(i);
    let code = match state {
        ModelState::Unloaded | ModelState::Loaded => StatusCode::OK,
        ModelState::Loading | ModelState::Failed => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut v = json!({"status": state.as_str(), "model": reg.id(i)});
    if let Some(e) = error {
        v["error"] = json!(e);
    }
    Ok((code, Json(v)).into_response())
}

/// One model's own metrics (the one-model server's `/metrics`), while it is loaded.
async fn model_metrics(
    State(reg): State<Arc<ModelRegistry>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    check_key(&reg, &headers)?;
    let i = reg.resolve(&id)?;
    if let Some(r) = ask_loaded(&reg, i, "/metrics", headers).await {
        return Ok(r);
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        format!(
            "the model '{}' is {}: its own metrics exist while it is loaded (/metrics has its anelm_model_* lines)",
            reg.id(i),
            reg.state(i).0.as_str()
        ),
    ))
}

/// Ollama's entry for model `i`.
fn ollama_entry(reg: &ModelRegistry, i: usize) -> Option<Value> {
    let spec = reg.spec(i)?;
    let name = ollama::tag_name(&spec.id);
    let modified = std::fs::metadata(&spec.path)
        .and_then(|m| m.modified())
        .unwrap_or(UNIX_EPOCH);
    let format = if spec.path.is_dir() { "safetensors" } else { "gguf" };
    let stamp = modified.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Some(json!({
        "name": name, "model": name, "modified_at": ollama::rfc3339(modified), "size": spec.bytes,
        "digest": ollama::fingerprint(&format!("{}|{}|{stamp}", spec.path.display(), spec.bytes)),
        "details": ollama::details(format, "", "", ""),
        "kind": spec.kind.as_str(),
        "state": reg.state(i).0.as_str(),
    }))
}

/// Ollama's `/api/tags`: every model, loaded or not.
async fn tags(State(reg): State<Arc<ModelRegistry>>, headers: HeaderMap) -> Result<Json<Value>, OllamaError> {
    check_key(&reg, &headers)?;
    let models: Vec<Value> = (0..reg.len()).filter_map(|i| ollama_entry(&reg, i)).collect();
    Ok(Json(json!({ "models": models })))
}

/// Ollama's `/api/ps`: the loaded models, with when they would be unloaded.
async fn ps(State(reg): State<Arc<ModelRegistry>>, headers: HeaderMap) -> Result<Json<Value>, OllamaError> {
    check_key(&reg, &headers)?;
    let models: Vec<Value> = (0..reg.len())
        .filter(|&i| reg.state(i).0 == ModelState::Loaded)
        .filter_map(|i| {
            let mut v = ollama_entry(&reg, i)?;
            let o = v.as_object_mut()?;
            o.remove("modified_at");
            let expires: SystemTime = reg.expires_at(i).unwrap_or_else(ollama::never);
            o.insert("expires_at".into(), json!(ollama::rfc3339(expires)));
            o.insert("size_vram".into(), json!(0));
            Some(v)
        })
        .collect();
    Ok(Json(json!({ "models": models })))
}
