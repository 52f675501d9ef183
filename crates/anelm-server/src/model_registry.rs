//! The models of a multi-model server (`anelm serve --models-dir DIR`, or `--model` given more
//! than once): each is a named entry that is loaded on first use into an [`AppState`] of its own
//! (served by the ordinary [`crate::router`]), unloaded after its idle time or when another
//! needs its share of `--max-loaded-bytes` ([`crate::model_budget`]), and pinned or released by
//! a request's `keep_alive`. A model that fails to load is marked failed with the loader's
//! message; the others keep serving. [`crate::model_router`] puts HTTP in front of it.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::api_error::ApiError;
use crate::model_budget::{Resident, plan_eviction};
use crate::{AppState, ServerConfig};

/// What a model serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// A causal language model: chat, completions, responses, messages.
    Chat,
    /// An embedding model: `/v1/embeddings`, `/api/embed`.
    Embedding,
    /// A reranker: `/v1/rerank`, `/v1/classify`.
    Rerank,
}

impl ModelKind {
    /// `chat`, `embedding` or `rerank`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Embedding => "embedding",
            Self::Rerank => "rerank",
        }
    }
}

/// Loads a model into a fresh [`AppState`] (its `ready`, `embeddings` or `rerank`), or says
/// why it could not. Runs on a blocking thread.
pub type ModelLoader = Arc<dyn Fn(&Arc<AppState>) -> Result<(), String> + Send + Sync>;

/// One model the server offers.
pub struct ModelSpec {
    /// The name requests use (`model`), unique case aside.
    pub id: String,
    /// Its file or directory.
    pub path: PathBuf,
    /// What it serves.
    pub kind: ModelKind,
    /// The size of its files: what it counts for against `--max-loaded-bytes`.
    pub bytes: u64,
    /// How to load it.
    pub load: ModelLoader,
}

/// Settings of the registry.
#[derive(Clone, Debug, Default)]
pub struct RegistryConfig {
    /// Bearer token required on `/v1/*` (every model's state gets it too).
    pub api_key: Option<String>,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// Most bytes of models loaded at once (`None`: no limit).
    pub max_loaded_bytes: Option<u64>,
    /// Unload a model after this long without requests (`None`: keep it), unless a request's
    /// `keep_alive` said otherwise.
    pub idle_unload: Option<Duration>,
}

/// Why a registry could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// No models at all.
    #[error("no models to serve")]
    Empty,
    /// Two models with the same id.
    #[error("two models are named '{id}' ({first} and {second}): give each its own name")]
    Duplicate {
        /// The id.
        id: String,
        /// The first model's path.
        first: String,
        /// The second's.
        second: String,
    },
}

/// Where a model is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelState {
    /// Not in memory: the next request loads it.
    Unloaded,
    /// Being loaded.
    Loading,
    /// Serving.
    Loaded,
    /// Its last load failed (`POST /v1/models/{id}/load` tries again).
    Failed,
}

impl ModelState {
    /// `unloaded`, `loading`, `loaded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unloaded => "unloaded",
            Self::Loading => "loading",
            Self::Loaded => "loaded",
            Self::Failed => "failed",
        }
    }
}

enum Slot {
    Unloaded,
    Loading,
    Loaded(Arc<Loaded>),
    Failed(String),
}

struct Loaded {
    state: Arc<AppState>,
    router: Router,
}

/// How long an idle model stays loaded, as a request's `keep_alive` set it: `None` follows
/// the server's `--idle-unload`, `Some(None)` pins it, `Some(Some(d))` is its own idle time.
type KeepAlive = Option<Option<Duration>>;

struct Entry {
    spec: ModelSpec,
    slot: Mutex<Slot>,
    /// Requests holding a [`Lease`] (changed under `slot`'s lock when it matters).
    in_flight: AtomicUsize,
    last_used: Mutex<Instant>,
    keep: Mutex<KeepAlive>,
    requests: AtomicU64,
    loads: AtomicU64,
    unloads: AtomicU64,
    evictions: AtomicU64,
    failures: AtomicU64,
    last_load_ms: AtomicU64,
}

impl Entry {
    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn state(&self) -> (ModelState, Option<String>) {
        match &*self.slot() {
            Slot::Unloaded => (ModelState::Unloaded, None),
            Slot::Loading => (ModelState::Loading, None),
            Slot::Loaded(_) => (ModelState::Loaded, None),
            Slot::Failed(e) => (ModelState::Failed, Some(e.clone())),
        }
    }

    fn keep(&self) -> KeepAlive {
        self.keep.lock().map(|k| *k).unwrap_or(None)
    }

    fn set_keep(&self, keep: KeepAlive) {
        if let Ok(mut k) = self.keep.lock() {
            *k = keep;
        }
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }

    fn last_used(&self) -> Instant {
        self.last_used.lock().map(|t| *t).unwrap_or_else(|_| Instant::now())
    }

    fn pinned(&self) -> bool {
        self.keep() == Some(None)
    }
}

/// Why the registry unloads a model (its counters and log line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Asked,
    Idle,
    Budget,
}

/// The set of models and their states.
pub struct ModelRegistry {
    config: RegistryConfig,
    entries: Vec<Entry>,
    /// One load at a time: the budget is decided and the model loaded under it, and concurrent
    /// first requests for a model wait for its one load.
    load_lock: tokio::sync::Mutex<()>,
}

/// A request's hold on a loaded model: while it lives the model is not unloaded. Dropped when
/// the response's body has been sent.
pub struct Lease {
    registry: Arc<ModelRegistry>,
    index: usize,
    router: Router,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(e) = self.registry.entries.get(self.index) {
            e.touch();
            e.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Lease {
    /// Run `req` through the model's own router; the lease is held until the response's body
    /// (a stream, maybe) ends or is dropped.
    pub async fn forward(self, req: Request) -> Response {
        let resp = match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let (parts, body) = resp.into_parts();
        let lease = self;
        let body = body.into_data_stream().map(move |chunk| {
            let _held = &lease;
            chunk
        });
        Response::from_parts(parts, Body::from_stream(body))
    }
}

/// Which model a name means, or why none.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// This one.
    Found(usize),
    /// None does.
    Unknown,
    /// Several do (Ollama-style short names); the ids that match.
    Ambiguous(Vec<String>),
}

impl ModelRegistry {
    /// A registry of `specs` (the first is the default model: requests without `model` go
    /// there); every model starts unloaded.
    pub fn new(config: RegistryConfig, specs: Vec<ModelSpec>) -> Result<Arc<Self>, RegistryError> {
        if specs.is_empty() {
            return Err(RegistryError::Empty);
        }
        let mut seen: HashSet<String> = HashSet::new();
        for (i, s) in specs.iter().enumerate() {
            if !seen.insert(s.id.to_ascii_lowercase()) {
                let first = specs
                    .iter()
                    .take(i)
                    .find(|o| o.id.eq_ignore_ascii_case(&s.id))
                    .map_or_else(String::new, |o| o.path.display().to_string());
                return Err(RegistryError::Duplicate {
                    id: s.id.clone(),
                    first,
                    second: s.path.display().to_string(),
                });
            }
        }
        let entries = specs
            .into_iter()
            .map(|spec| Entry {
                spec,
                slot: Mutex::new(Slot::Unloaded),
                in_flight: AtomicUsize::new(0),
                last_used: Mutex::new(Instant::now()),
                keep: Mutex::new(None),
                requests: AtomicU64::new(0),
                loads: AtomicU64::new(0),
                unloads: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                last_load_ms: AtomicU64::new(0),
            })
            .collect();
        Ok(Arc::new(Self {
            config,
            entries,
            load_lock: tokio::sync::Mutex::new(()),
        }))
    }

    /// The settings.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// How many models.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Never: a registry has at least one model.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The model ids, in order (the first is the default).
    pub fn ids(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.spec.id.as_str()).collect()
    }

    /// Model `i`'s id.
    pub fn id(&self, i: usize) -> &str {
        self.entries.get(i).map_or("", |e| e.spec.id.as_str())
    }

    /// Model `i`'s description.
    pub fn spec(&self, i: usize) -> Option<&ModelSpec> {
        self.entries.get(i).map(|e| &e.spec)
    }

    /// Model `i`'s state, and the error of its failed load.
    pub fn state(&self, i: usize) -> (ModelState, Option<String>) {
        self.entries.get(i).map_or((ModelState::Unloaded, None), Entry::state)
    }

    /// The model `name` means: its id case aside, then as Ollama names it (`:latest`, or a
    /// leading part of the id, [`crate::ollama::names_match`]) when that is unambiguous.
    pub fn find(&self, name: &str) -> Lookup {
        if let Some(i) = self.entries.iter().position(|e| e.spec.id.eq_ignore_ascii_case(name)) {
            return Lookup::Found(i);
        }
        let matching: Vec<usize> = (0..self.entries.len())
            .filter(|&i| crate::ollama::names_match(name, &self.entries[i].spec.id))
            .collect();
        match matching.as_slice() {
            [] => Lookup::Unknown,
            [i] => Lookup::Found(*i),
            many => Lookup::Ambiguous(many.iter().map(|&i| self.entries[i].spec.id.clone()).collect()),
        }
    }

    /// [`Self::find`] as an answer: the index, or the 404 (400 when ambiguous) that lists the
    /// models.
    pub fn resolve(&self, name: &str) -> Result<usize, ApiError> {
        match self.find(name) {
            Lookup::Found(i) => Ok(i),
            Lookup::Unknown => Err(ApiError {
                param: Some("model".into()),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    format!(
                        "the model '{name}' does not exist on this server; it serves {} (see /v1/models)",
                        quoted(&self.ids())
                    ),
                )
            }),
            Lookup::Ambiguous(ids) => Err(ApiError::bad_request(
                format!(
                    "the model '{name}' is ambiguous: it could mean {}; name one of them",
                    quoted(&ids.iter().map(String::as_str).collect::<Vec<_>>())
                ),
                Some("model"),
            )),
        }
    }

    /// Set model `i`'s idle time from a request's `keep_alive` (see [`KeepAlive`]).
    pub fn set_keep_alive(&self, i: usize, keep: Option<Option<Duration>>) {
        if let Some(e) = self.entries.get(i) {
            e.set_keep(keep);
        }
    }

    /// A lease on model `i` if it is loaded now (no load).
    pub fn lease_if_loaded(self: &Arc<Self>, i: usize) -> Option<Lease> {
        let e = self.entries.get(i)?;
        let slot = e.slot();
        let Slot::Loaded(l) = &*slot else {
            return None;
        };
        e.in_flight.fetch_add(1, Ordering::AcqRel);
        e.touch();
        Some(Lease {
            registry: self.clone(),
            index: i,
            router: l.router.clone(),
        })
    }

    /// A lease on model `i` for one request, loading it first if needed (concurrent first
    /// requests wait for one load). A model whose load failed answers with that failure until
    /// it is loaded again explicitly ([`Self::load`]).
    pub async fn acquire(self: &Arc<Self>, i: usize) -> Result<Lease, ApiError> {
        let e = self.entry(i)?;
        e.requests.fetch_add(1, Ordering::Relaxed);
        if let Some(l) = self.lease_if_loaded(i) {
            return Ok(l);
        }
        self.failed_error(i)?;
        let _one = self.load_lock.lock().await;
        if let Some(l) = self.lease_if_loaded(i) {
            return Ok(l);
        }
        self.failed_error(i)?;
        self.load_locked(i).await
    }

    /// Load model `i` now (`POST /v1/models/{id}/load`), trying again if its last load failed;
    /// nothing to do when it is loaded.
    pub async fn load(self: &Arc<Self>, i: usize) -> Result<(), ApiError> {
        let e = self.entry(i)?;
        let _one = self.load_lock.lock().await;
        if matches!(&*e.slot(), Slot::Loaded(_)) {
            e.touch();
            return Ok(());
        }
        self.load_locked(i).await.map(drop)
    }

    /// Unload model `i` now (`POST /v1/models/{id}/unload`), and forget its `keep_alive`;
    /// a model with requests in flight is not unloaded (409). Returns whether it was loaded.
    pub async fn unload(&self, i: usize) -> Result<bool, ApiError> {
        let e = self.entry(i)?;
        e.set_keep(None);
        match self.take_if_idle(i) {
            Ok(Some(l)) => {
                self.release(i, l, Why::Asked).await;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(n) => Err(ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                format!(
                    "the model '{}' has {n} request(s) in flight: unload it when they end (or send keep_alive 0 with the last one)",
                    e.spec.id
                ),
            )),
        }
    }

    /// Unload, every 250 ms, the models idle past their time (`--idle-unload`, or a
    /// request's `keep_alive`). Call from within the server's async runtime.
    pub fn start_reaper(self: &Arc<Self>) {
        let reg = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                for i in 0..reg.entries.len() {
                    let e = &reg.entries[i];
                    if e.state().0 != ModelState::Loaded || e.in_flight.load(Ordering::Acquire) > 0 {
                        continue;
                    }
                    let limit = match e.keep() {
                        Some(k) => k,
                        None => reg.config.idle_unload,
                    };
                    let Some(limit) = limit else { continue };
                    if e.last_used().elapsed() < limit {
                        continue;
                    }
                    if let Ok(Some(l)) = reg.take_if_idle(i) {
                        e.set_keep(None);
                        reg.release(i, l, Why::Idle).await;
                    }
                }
            }
        });
    }

    fn entry(&self, i: usize) -> Result<&Entry, ApiError> {
        self.entries.get(i).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no model #{i} on this server"),
            )
        })
    }

    /// The error of model `i`'s failed load, if it failed.
    fn failed_error(&self, i: usize) -> Result<(), ApiError> {
        let e = self.entry(i)?;
        match &*e.slot() {
            Slot::Failed(msg) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!(
                    "the model '{}' failed to load: {msg} (fix it, then POST /v1/models/{}/load to try again)",
                    e.spec.id, e.spec.id
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Take model `i` out of its slot if it is loaded and idle: `Ok(None)` when it is not
    /// loaded, `Err(n)` with `n` requests in flight.
    fn take_if_idle(&self, i: usize) -> Result<Option<Arc<Loaded>>, usize> {
        let Some(e) = self.entries.get(i) else {
            return Ok(None);
        };
        let mut slot = e.slot();
        if !matches!(&*slot, Slot::Loaded(_)) {
            return Ok(None);
        }
        let n = e.in_flight.load(Ordering::Acquire);
        if n > 0 {
            return Err(n);
        }
        match std::mem::replace(&mut *slot, Slot::Unloaded) {
            Slot::Loaded(l) => Ok(Some(l)),
            other => {
                *slot = other;
                Ok(None)
            }
        }
    }

    /// Stop a model taken out of its slot and free it (its scheduler's thread joined on a
    /// blocking thread).
    async fn release(&self, i: usize, loaded: Arc<Loaded>, why: Why) {
        let Some(e) = self.entries.get(i) else { return };
        e.unloads.fetch_add(1, Ordering::Relaxed);
        if why == Why::Budget {
            e.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(r) = loaded.state.ready.get() {
                r.scheduler.shutdown(false);
            }
            drop(loaded);
        })
        .await;
        let reason = match why {
            Why::Asked => "as asked",
            Why::Idle => "idle",
            Why::Budget => "to make room under --max-loaded-bytes",
        };
        eprintln!("anelm serve: model '{}' unloaded ({reason})", e.spec.id);
    }

    /// Load model `i` (the caller holds the load lock): make room under the budget, then run
    /// its loader on a blocking thread. Its slot ends loaded or failed; loaded, it comes with a
    /// lease taken at once (so the idle reaper cannot unload it before its first request).
    async fn load_locked(self: &Arc<Self>, i: usize) -> Result<Lease, ApiError> {
        let e = self.entry(i)?;
        self.make_room(i).await?;
        *e.slot() = Slot::Loading;
        eprintln!("anelm serve: loading model '{}' ({})", e.spec.id, e.spec.path.display());
        let state = AppState::new(ServerConfig {
            model_id: e.spec.id.clone(),
            api_key: self.config.api_key.clone(),
            max_body_bytes: self.config.max_body_bytes,
        });
        let t0 = Instant::now();
        let (load, st) = (e.spec.load.clone(), state.clone());
        let outcome = match tokio::task::spawn_blocking(move || load(&st)).await {
            Ok(r) => r,
            Err(join) => Err(format!("the loader stopped: {join}")),
        };
        match outcome {
            Ok(()) => {
                let router = crate::router(state.clone());
                {
                    let mut slot = e.slot();
                    *slot = Slot::Loaded(Arc::new(Loaded {
                        state,
                        router: router.clone(),
                    }));
                    e.in_flight.fetch_add(1, Ordering::AcqRel);
                }
                let lease = Lease {
                    registry: self.clone(),
                    index: i,
                    router,
                };
                e.touch();
                e.loads.fetch_add(1, Ordering::Relaxed);
                e.last_load_ms.store(
                    u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                eprintln!(
                    "anelm serve: model '{}' loaded in {:.1} s",
                    e.spec.id,
                    t0.elapsed().as_secs_f64()
                );
                Ok(lease)
            }
            Err(msg) => {
                let msg = msg.replace('\n', " ");
                eprintln!("anelm serve: error: model '{}' failed to load: {msg}", e.spec.id);
                e.failures.fetch_add(1, Ordering::Relaxed);
                *e.slot() = Slot::Failed(msg);
                Err(self.failed_error(i).err().unwrap_or_else(|| {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the load failed")
                }))
            }
        }
    }

    /// Under `--max-loaded-bytes`, unload the least recently used idle, unpinned models until
    /// model `i` fits (the caller holds the load lock).
    async fn make_room(&self, i: usize) -> Result<(), ApiError> {
        let Some(budget) = self.config.max_loaded_bytes else {
            return Ok(());
        };
        let e = self.entry(i)?;
        let resident: Vec<Resident> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(j, o)| *j != i && matches!(&*o.slot(), Slot::Loaded(_) | Slot::Loading))
            .map(|(j, o)| Resident {
                index: j,
                bytes: o.spec.bytes,
                last_used: o.last_used(),
                evictable: o.in_flight.load(Ordering::Acquire) == 0 && !o.pinned(),
            })
            .collect();
        let victims = plan_eviction(&resident, e.spec.bytes, budget).map_err(|why| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("the model '{}' cannot be loaded now: {why}", e.spec.id),
            )
            .retry_after(2)
        })?;
        for v in victims {
            match self.take_if_idle(v) {
                Ok(Some(l)) => self.release(v, l, Why::Budget).await,
                Ok(None) => {}
                Err(_) => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "server_error",
                        format!(
                            "the model '{}' cannot be loaded now: '{}' got a request while making room; retry",
                            e.spec.id,
                            self.id(v)
                        ),
                    )
                    .retry_after(1));
                }
            }
        }
        Ok(())
    }

    /// Bytes of the models loaded (or loading) now.
    pub fn loaded_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| matches!(e.state().0, ModelState::Loaded | ModelState::Loading))
            .fold(0u64, |a, e| a.saturating_add(e.spec.bytes))
    }

    /// When an idle model `i` would be unloaded (`None`: not while the server runs).
    pub fn expires_at(&self, i: usize) -> Option<SystemTime> {
        let e = self.entries.get(i)?;
        let limit = match e.keep() {
            Some(k) => k,
            None => self.config.idle_unload,
        }?;
        let left = limit.saturating_sub(e.last_used().elapsed());
        Some(SystemTime::now() + left)
    }

    /// Model `i` as `/v1/models` lists it: OpenAI's fields, and `kind`, `state`, `size_bytes`,
    /// `pinned`, `in_flight`, and `error` when its load failed.
    pub fn describe(&self, i: usize) -> Value {
        let Some(e) = self.entries.get(i) else {
            return Value::Null;
        };
        let (state, error) = e.state();
        let mut v = json!({
            "id": e.spec.id,
            "object": "model",
            "created": crate::now(),
            "owned_by": "anelm",
            "kind": e.spec.kind.as_str(),
            "state": state.as_str(),
            "size_bytes": e.spec.bytes,
            "pinned": e.pinned(),
            "in_flight": e.in_flight.load(Ordering::Acquire),
            "default": i == 0,
        });
        if let Some(err) = error {
            v["error"] = json!(err);
        }
        v
    }

    /// The registry's Prometheus lines: per model (label `model`) its state, size, requests,
    /// loads, unloads, evictions and failed loads; the bytes loaded and the budget.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, value: &dyn Fn(&Entry) -> f64| {
            let _ = write!(
                out,
                "# HELP anelm_model_{name} {help}\n# TYPE anelm_model_{name} {kind}\n"
            );
            for e in &self.entries {
                let _ = writeln!(
                    out,
                    "anelm_model_{name}{{model=\"{}\"}} {}",
                    label(&e.spec.id),
                    value(e)
                );
            }
        };
        let is = |s: ModelState| move |e: &Entry| f64::from(u8::from(e.state().0 == s));
        family(
            "loaded",
            "gauge",
            "1 while the model is loaded",
            &is(ModelState::Loaded),
        );
        family("loading", "gauge", "1 while the model loads", &is(ModelState::Loading));
        family(
            "failed",
            "gauge",
            "1 when the model's last load failed",
            &is(ModelState::Failed),
        );
        family("bytes", "gauge", "the size of the model's files", &|e| {
            e.spec.bytes as f64
        });
        family("pinned", "gauge", "1 while keep_alive -1 pins the model", &|e| {
            f64::from(u8::from(e.pinned()))
        });
        family("in_flight", "gauge", "requests being served by the model", &|e| {
            e.in_flight.load(Ordering::Acquire) as f64
        });
        family("requests_total", "counter", "requests routed to the model", &|e| {
            e.requests.load(Ordering::Relaxed) as f64
        });
        family("loads_total", "counter", "loads of the model", &|e| {
            e.loads.load(Ordering::Relaxed) as f64
        });
        family(
            "unloads_total",
            "counter",
            "unloads of the model (asked, idle, or budget)",
            &|e| e.unloads.load(Ordering::Relaxed) as f64,
        );
        family(
            "evictions_total",
            "counter",
            "of those, unloads to make room under --max-loaded-bytes",
            &|e| e.evictions.load(Ordering::Relaxed) as f64,
        );
        family("load_failures_total", "counter", "failed loads of the model", &|e| {
            e.failures.load(Ordering::Relaxed) as f64
        });
        family(
            "last_load_seconds",
            "gauge",
            "how long the model's last load took",
            &|e| e.last_load_ms.load(Ordering::Relaxed) as f64 / 1e3,
        );
        let _ = write!(
            out,
            "# HELP anelm_loaded_bytes bytes of the models loaded now\n# TYPE anelm_loaded_bytes gauge\nanelm_loaded_bytes {}\n",
            self.loaded_bytes()
        );
        if let Some(b) = self.config.max_loaded_bytes {
            let _ = write!(
                out,
                "# HELP anelm_max_loaded_bytes the budget of loaded models (--max-loaded-bytes)\n# TYPE anelm_max_loaded_bytes gauge\nanelm_max_loaded_bytes {b}\n"
            );
        }
        if let Some(b) = crate::idle::resident_bytes() {
            let _ = write!(
                out,
                "# HELP anelm_resident_bytes resident memory of the process\n# TYPE anelm_resident_bytes gauge\nanelm_resident_bytes {b}\n"
            );
        }
        out
    }
}

/// `'a', 'b' and 'c'`.
fn quoted(ids: &[&str]) -> String {
    let q: Vec<String> = ids.iter().map(|s| format!("'{s}'")).collect();
    match q.split_last() {
        None => "no models".into(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, load: ModelLoader) -> ModelSpec {
        ModelSpec {
            id: id.into(),
            path: PathBuf::from(format!("/models/{id}")),
            kind: ModelKind::Embedding,
            bytes: 100,
            load,
        }
    }

    fn ok() -> ModelLoader {
        Arc::new(|_| Ok(()))
    }

    fn registry(ids: &[&str], budget: Option<u64>) -> Arc<ModelRegistry> {
        let specs = ids
            .iter()
            .map(|id| {
                let load: ModelLoader = if id.starts_with("broken") {
                    Arc::new(|_| Err("the file ends early".into()))
                } else {
                    ok()
                };
                spec(id, load)
            })
            .collect();
        let config = RegistryConfig {
            max_body_bytes: 1 << 20,
            max_loaded_bytes: budget,
            ..RegistryConfig::default()
        };
        ModelRegistry::new(config, specs).expect("registry")
    }

    #[test]
    fn empty_and_duplicate_sets_are_refused() {
        assert!(matches!(
            ModelRegistry::new(RegistryConfig::default(), vec![]),
            Err(RegistryError::Empty)
        ));
        let dup = ModelRegistry::new(RegistryConfig::default(), vec![spec("Qwen", ok()), spec("qwen", ok())]);
        let msg = dup.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("'qwen'") && msg.contains("/models/Qwen"), "{msg}");
    }

    #[test]
    fn names_resolve_by_id_case_aside_and_as_ollama_names_them() {
        let reg = registry(&["SmolLM2-135M", "smollm2-360m", "gemma-3-270m"], None);
        assert_eq!(reg.find("smollm2-135m"), Lookup::Found(0));
        assert_eq!(reg.find("gemma-3-270m:latest"), Lookup::Found(2));
        assert_eq!(reg.find("gemma"), Lookup::Found(2));
        assert!(matches!(reg.find("smollm2"), Lookup::Ambiguous(ids) if ids.len() == 2));
        assert_eq!(reg.find("llama"), Lookup::Unknown);
        let e = reg.resolve("llama").expect_err("unknown");
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(
            e.message.contains("'SmolLM2-135M', 'smollm2-360m' and 'gemma-3-270m'"),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn load_on_demand_lru_eviction_and_failures() {
        // Each model is 100 bytes; the budget holds two.
        let reg = registry(&["a", "b", "c", "broken"], Some(250));
        assert_eq!(reg.state(0).0, ModelState::Unloaded);
        let lease_a = reg.acquire(0).await.expect("a loads");
        assert_eq!(reg.state(0).0, ModelState::Loaded);
        drop(reg.acquire(1).await.expect("b loads"));
        // c needs room: b is idle but a is busy (its lease is held), so b goes.
        drop(reg.acquire(2).await.expect("c loads"));
        assert_eq!(reg.state(1).0, ModelState::Unloaded);
        assert_eq!(reg.state(0).0, ModelState::Loaded);
        assert_eq!(reg.loaded_bytes(), 200);
        // With a still busy and c pinned, nothing can make room for b.
        reg.set_keep_alive(2, Some(None));
        let busy = reg.acquire(1).await.err().expect("no room");
        assert_eq!(busy.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(busy.message.contains("busy or pinned"), "{}", busy.message);
        // a is free again: it is the least recently used unpinned model, so it goes.
        drop(lease_a);
        drop(reg.acquire(1).await.expect("b loads again"));
        assert_eq!(reg.state(0).0, ModelState::Unloaded);
        assert_eq!(reg.state(2).0, ModelState::Loaded);
        // A failed load is reported with the loader's message, and does not disturb the rest.
        let failed = reg.acquire(3).await.err().expect("broken");
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(failed.message.contains("'broken'") && failed.message.contains("the file ends early"));
        assert_eq!(reg.state(3), (ModelState::Failed, Some("the file ends early".into())));
        assert!(reg.acquire(1).await.is_ok());
        // Unloading a busy model is refused; an idle one goes.
        let held = reg.acquire(2).await.expect("c");
        assert_eq!(reg.unload(2).await.err().map(|e| e.status), Some(StatusCode::CONFLICT));
        drop(held);
        assert_eq!(reg.unload(2).await.ok(), Some(true));
        assert_eq!(reg.state(2).0, ModelState::Unloaded);
        assert!(!reg.describe(2)["pinned"].as_bool().unwrap_or(true));
        assert!(
            reg.metrics_text()
                .contains("anelm_model_evictions_total{model=\"a\"} 1")
        );
    }

    #[tokio::test]
    async fn concurrent_first_requests_share_one_load() {
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = loads.clone();
        let load: ModelLoader = Arc::new(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            Ok(())
        });
        let reg = ModelRegistry::new(RegistryConfig::default(), vec![spec("m", load)]).expect("registry");
        let (a, b) = tokio::join!(reg.acquire(0), reg.acquire(0));
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\c"), "a\\\"b\\\\c");
    }
}
