//! Runs the lines of every active batch through the same handlers as interactive requests, at
//! background priority (so the person at the keyboard goes first), and records each line's
//! result in the job store as it ends. A line is only ever marked done together with its
//! result, so after a crash, a restart or an idle unload the runner picks up exactly the lines
//! without one: every input line ends with exactly one output line.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinSet};

use crate::AppState;
use crate::api_error::ApiError;
use crate::job_store::{BatchRow, JobStore, LineResult, PendingLine, StoreError};
use crate::priority::PRIORITY_HEADER;
use crate::upstream::PRIVACY_HEADER;

/// The endpoints a batch may target.
pub const BATCH_ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// The Files and Batch APIs' state: the store, and the runner working through it.
pub struct Jobs {
    /// The job database.
    pub store: Arc<JobStore>,
    /// Largest file `POST /v1/files` accepts.
    pub max_file_bytes: usize,
    /// Lines run at once (in the scheduler's sessions or waiting at background priority).
    pub concurrency: usize,
    wake: Notify,
    stopping: AtomicBool,
    stopped: Notify,
    finished: AtomicBool,
}

impl Jobs {
    /// The jobs of `store`; the runner starts with [`Jobs::start`].
    pub fn new(store: JobStore, max_file_bytes: usize, concurrency: usize) -> Arc<Self> {
        Arc::new(Self {
            store: Arc::new(store),
            max_file_bytes,
            concurrency: concurrency.max(1),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            stopped: Notify::new(),
            finished: AtomicBool::new(false),
        })
    }

    /// Something changed (a batch was created or cancelled): look again now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Start the runner on the server's runtime.
    pub fn start(self: &Arc<Self>, st: Arc<AppState>, grace: Duration) {
        let jobs = self.clone();
        tokio::spawn(async move {
            run(st, jobs.clone(), grace).await;
            jobs.finished.store(true, Ordering::SeqCst);
            jobs.stopped.notify_waiters();
        });
    }

    /// Stop taking lines, let the lines in flight finish for up to the grace period given to
    /// [`Jobs::start`], and leave the rest pending for the next start. Returns once the runner
    /// has stopped.
    pub async fn stop(&self) {
        let stopped = self.stopped.notified();
        self.stopping.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        if !self.finished.load(Ordering::SeqCst) {
            stopped.await;
        }
    }
}

/// Whether a response is a temporary refusal (queue full, model loading or reloading, server
/// shutting down) or a generation cut by shutdown: the line is tried again, not failed.
fn transient(status: StatusCode, body: &Value) -> bool {
    if status == StatusCode::TOO_MANY_REQUESTS {
        return true;
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        let msg = body.pointer("/error/message").and_then(Value::as_str).unwrap_or("");
        return !msg.contains("failed to load");
    }
    body.get("choices")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["finish_reason"] == "cancelled"))
        || body["status"] == "cancelled"
}

/// A line refused before it runs.
fn refused(e: ApiError) -> Option<LineResult> {
    Some(LineResult {
        status: e.status.as_u16(),
        body: e.to_json(),
    })
}

/// Run one line through its endpoint's handler, as a background request.
async fn execute(st: Arc<AppState>, endpoint: &str, private: bool, body: &str) -> Option<LineResult> {
    let parsed: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return refused(ApiError::bad_request(format!("the body is not valid JSON: {e}"), None)),
    };
    if parsed.get("stream").and_then(Value::as_bool) == Some(true) {
        return refused(ApiError::bad_request(
            "a batch request cannot stream: remove `stream` (its result goes to the output file)",
            Some("stream"),
        ));
    }
    let mut headers = HeaderMap::new();
    if let Some(key) = &st.config.api_key
        && let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}"))
    {
        headers.insert(header::AUTHORIZATION, v);
    }
    let privacy = if private { "local" } else { "allow-upstream" };
    headers.insert(PRIVACY_HEADER, HeaderValue::from_static(privacy));
    headers.insert(PRIORITY_HEADER, HeaderValue::from_static("background"));
    let bytes = Bytes::copy_from_slice(body.as_bytes());
    let resp = match endpoint {
        "/v1/chat/completions" => crate::handle(st, headers, Ok(bytes), true).await,
        "/v1/completions" => crate::handle(st, headers, Ok(bytes), false).await,
        "/v1/responses" => crate::responses::create(State(st), headers, Ok(bytes)).await,
        _ => crate::embeddings::create(State(st), headers, Ok(bytes)).await,
    };
    let resp = resp.unwrap_or_else(|e| e.into_response());
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.ok()?;
    let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the response was not JSON",
        )
        .to_json()
    });
    if transient(status, &body) {
        return None;
    }
    Some(LineResult {
        status: status.as_u16(),
        body,
    })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, StoreError> + Send + 'static) -> Option<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::error!("batch runner: {e}");
            eprintln!("anelm serve: batch runner: {e}");
            None
        }
        Err(_) => None,
    }
}

/// What the runner tracks of a line in flight.
struct InFlight {
    batch: String,
    line: u64,
    abort: AbortHandle,
}

async fn run(st: Arc<AppState>, jobs: Arc<Jobs>, grace: Duration) {
    let mut tasks: JoinSet<(String, u64, bool)> = JoinSet::new();
    let mut flight: HashMap<tokio::task::Id, InFlight> = HashMap::new();
    let mut backoff = false;
    loop {
        if jobs.stopping.load(Ordering::SeqCst) {
            break;
        }
        let store = jobs.store.clone();
        let active = blocking(move || store.active_batches()).await.unwrap_or_default();
        for b in active {
            step_batch(&st, &jobs, &b, &mut tasks, &mut flight, backoff).await;
        }
        backoff = false;
        let tick = tokio::time::sleep(Duration::from_millis(500));
        tokio::select! {
            done = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let id = match &done {
                    Some(Ok((id, _))) => Some(*id),
                    Some(Err(e)) => Some(e.id()),
                    None => None,
                };
                if let Some(id) = id {
                    flight.remove(&id);
                }
                if let Some(Ok((_, (_, _, false)))) = done {
                    // A temporary refusal: give the server a moment before trying again.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    backoff = true;
                }
            }
            _ = jobs.wake.notified() => {}
            _ = tick => {}
        }
    }
    // Shutting down: let the lines in flight end within the grace period; the rest stay
    // pending and run again at the next start.
    let deadline = tokio::time::Instant::now() + grace;
    while !tasks.is_empty() {
        match tokio::time::timeout_at(deadline, tasks.join_next()).await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => {
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
                break;
            }
        }
    }
}

/// Move one batch along: end it when it is cancelled, expired or has no line left, else start
/// its pending lines while there is room.
async fn step_batch(
    st: &Arc<AppState>,
    jobs: &Arc<Jobs>,
    b: &BatchRow,
    tasks: &mut JoinSet<(String, u64, bool)>,
    flight: &mut HashMap<tokio::task::Id, InFlight>,
    backoff: bool,
) {
    let mine: Vec<u64> = flight.values().filter(|f| f.batch == b.id).map(|f| f.line).collect();
    let abort_mine = |flight: &HashMap<tokio::task::Id, InFlight>| {
        for f in flight.values().filter(|f| f.batch == b.id) {
            f.abort.abort();
        }
    };
    let finalize = |status: &'static str| {
        let (store, id) = (jobs.store.clone(), b.id.clone());
        async move { blocking(move || store.finalize(&id, status)).await }
    };
    match b.status.as_str() {
        "cancelling" => {
            abort_mine(flight);
            if mine.is_empty() {
                finalize("cancelled").await;
            }
            return;
        }
        "finalizing" => {
            finalize("completed").await;
            return;
        }
        _ => {}
    }
    if b.times.expires_at > 0 && crate::now() >= b.times.expires_at {
        abort_mine(flight);
        if mine.is_empty() {
            finalize("expired").await;
        }
        return;
    }
    let (total, done, failed) = b.counts;
    if done + failed >= total && mine.is_empty() {
        let (store, id) = (jobs.store.clone(), b.id.clone());
        blocking(move || store.set_finalizing(&id)).await;
        finalize("completed").await;
        return;
    }
    if backoff {
        return;
    }
    let room = jobs.concurrency.saturating_sub(flight.len());
    if room == 0 {
        return;
    }
    let (store, id, busy) = (jobs.store.clone(), b.id.clone(), mine.clone());
    let lines: Vec<PendingLine> = blocking(move || store.pending_lines(&id, room, &busy))
        .await
        .unwrap_or_default();
    for line in lines {
        let (st, store) = (st.clone(), jobs.store.clone());
        let (endpoint, private) = (b.endpoint.clone(), b.private);
        let (batch, line_no) = (line.batch_id.clone(), line.line_no);
        let abort = tasks.spawn(async move {
            let Some(result) = execute(st, &endpoint, private, &line.body).await else {
                return (line.batch_id, line.line_no, false);
            };
            let (bid, no) = (line.batch_id.clone(), line.line_no);
            blocking(move || store.finish_line(&bid, no, &result)).await;
            (line.batch_id, line.line_no, true)
        });
        flight.insert(
            abort.id(),
            InFlight {
                batch,
                line: line_no,
                abort,
            },
        );
    }
}
