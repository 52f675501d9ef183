//! Continuous batching: a pool of sessions serving many requests from one warm model. Every step
//! runs **one** batched forward for every session that needs work — a decode token for each
//! generating stream plus a bounded chunk of prompt for streams still prefilling — so each weight
//! block is read once for all of them, and a long prompt never stalls the other streams for more
//! than one chunk.
//!
//! Requests wait in a bounded queue; a full queue is refused at once ([`SubmitError::QueueFull`]).
//! Each request has a [`Priority`]: interactive requests take free sessions first, and one that
//! finds every session busy while some serve background requests takes one of those at the next
//! step — the background request is parked with its session (cache, sampler, pending prompt) and
//! resumes exactly where it stopped once a session is free again.
//! A request's events go to its [`Sink`]; a sink that returns false (its client went away), or a
//! cancelled [`CancelToken`], frees the session at the next step. A finished session keeps its
//! cache, and a new request whose prompt extends that session's tokens is placed there and
//! prefills only the new part (multi-turn chat without re-prefill).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anelm_model::tokenizer::Tokenizer;

use crate::draft_model::{DraftLane, draft_lanes};
use crate::error::{EngineError, Result};
use crate::loader::LoadedModel;
use crate::model::{LogitsMode, StepItem};
use crate::prompt_cache::PromptCache;
use crate::session::Session;
use crate::speculate::{
    DraftBudget, Drafting, MAX_DRAFT_TOKENS, Rollback, Speculation, draft_history, draft_limit, next_drafts, verify,
};
use crate::stream::FinishReason;
use crate::stream::{Stream, StreamOptions, TokenLogprob};

mod prompt_cache_hook;

/// How the scheduler is sized.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Concurrent sessions (streams generating at once).
    pub sessions: usize,
    /// Requests that may wait for a session; more are refused.
    pub queue: usize,
    /// Positions per session.
    pub ctx_size: usize,
    /// Most prompt tokens one session prefills per step.
    pub prefill_chunk: usize,
    /// Most tokens (decode + prefill, all sessions) in one step's forward.
    pub max_step_tokens: usize,
    /// CPU threads of the scheduler's pool.
    pub threads: usize,
    /// Concurrent requests whose prompts share a prefix prefill it once: a request copies
    /// another session's cache up to the shared length instead of computing it, and waits for
    /// an earlier request that is still prefilling it (see `share_prefixes`).
    pub share_prefixes: bool,
    /// Most bytes the sessions' caches may keep (`None`: no limit). Idle sessions keep their
    /// cache for prompt reuse; beyond this, the least recently used idle ones are released.
    pub cache_mem: Option<usize>,
    /// The on-disk prompt cache (`None`: off). At admission a request whose prompt starts with
    /// a stored prefix longer than any session shares restores it and prefills only the rest;
    /// long prompts and prefixes two requests share are saved (see `prompt_cache_hook`).
    pub prompt_cache: Option<Arc<PromptCache>>,
    /// Speculative decoding for requests that leave it to the server
    /// ([`Speculation::ServerDefault`]): each decode step of a stream also feeds the tokens
    /// prompt lookup or the draft model drafts, and keeps those the stream's own draws agree
    /// with.
    pub speculate: Option<Drafting>,
    /// A draft model sharing the target's tokenizer, for requests that draft with it
    /// ([`Drafting::Model`]): each such stream gets a session of it, and one step's drafting runs
    /// as batched passes of the draft model over all of them.
    pub draft_model: Option<DraftConfig>,
}

/// The scheduler's draft model ([`SchedulerConfig::draft_model`]).
#[derive(Clone)]
pub struct DraftConfig {
    /// The model (check its tokenizer against the target's first:
    /// [`crate::check_same_vocabulary`]).
    pub model: Arc<dyn crate::model::LanguageModel>,
    /// Most tokens one pass drafts (1..=[`MAX_DRAFT_TOKENS`]).
    pub draft_tokens: usize,
}

impl std::fmt::Debug for DraftConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftConfig")
            .field("model", &self.model.info().architecture)
            .field("draft_tokens", &self.draft_tokens)
            .finish()
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            sessions: 4,
            queue: 64,
            ctx_size: 4096,
            prefill_chunk: crate::DEFAULT_PREFILL_CHUNK,
            max_step_tokens: 256,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            share_prefixes: true,
            cache_mem: None,
            prompt_cache: None,
            speculate: None,
            draft_model: None,
        }
    }
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct Request {
    /// Prompt token ids (the chat template already applied).
    pub prompt: Vec<u32>,
    /// How its stream decodes: budget, sampling, stop strings, log-probabilities.
    pub stream: StreamOptions,
    /// Whether its decode steps draft tokens (the output is the same either way).
    pub speculate: Speculation,
}

/// Who waits for a request: the person at the keyboard, or a job that may yield to them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Priority {
    /// Ordinary requests: served first, and may take a session from background work.
    #[default]
    Interactive,
    /// Batch lines and requests that ask for it: only fill what interactive work leaves, and
    /// are parked (not lost) when an interactive request needs their session.
    Background,
}

/// How a request is submitted besides its tokens and options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Submission {
    /// Interactive or background.
    pub priority: Priority,
    /// A prompt position worth keeping in the on-disk prompt cache, e.g. where a long system
    /// prompt ends: later requests sharing it restore it, also after a restart (a hybrid
    /// model's prefill ends a chunk there so its recurrent state can be saved exactly).
    pub cache_hint: Option<usize>,
}

/// What a request produces, in order: tokens with their text, then exactly one `Done` or
/// `Failed`.
#[derive(Clone, Debug)]
pub enum Event {
    /// Newly generated text (possibly empty while text is held back).
    Text(String),
    /// A generated token's log-probability (requests that ask for them), sent before the text
    /// the token completes.
    Logprob(TokenLogprob),
    /// Generation ended.
    Done(Completion),
    /// The request failed (the message says why).
    Failed(String),
}

/// Counts and timings of a finished request.
#[derive(Clone, Debug)]
pub struct Completion {
    /// Why it ended.
    pub finish: FinishReason,
    /// The stop string that ended it, when one did (`finish` is then `Stop`).
    pub stop_string: Option<String>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Of those, reused from the session's cache (or another session's, or restored from the
    /// on-disk prompt cache): not prefilled.
    pub reused_tokens: usize,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Time waiting for a session.
    pub queued: Duration,
    /// Submission to first generated token.
    pub time_to_first_token: Duration,
    /// Submission to end.
    pub total: Duration,
}

/// Receives a request's events; returns false when nobody listens any more (cancels it).
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

/// Set to cancel a request from outside (e.g. when its HTTP client disconnects).
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A fresh token.
    pub fn new() -> Self {
        Self::default()
    }
    /// Ask for cancellation.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    /// Whether cancellation was asked for.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Why a request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The queue is full: retry later.
    #[error("the request queue is full ({0} waiting): retry later")]
    QueueFull(usize),
    /// The scheduler is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The request itself is invalid.
    #[error("{0}")]
    Invalid(String),
}

/// Live counters (Prometheus-friendly totals and gauges).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests accepted into the queue.
    pub requests_total: AtomicU64,
    /// Requests refused because the queue was full.
    pub requests_rejected: AtomicU64,
    /// Requests finished (any reason).
    pub requests_finished: AtomicU64,
    /// Requests cancelled by their client.
    pub requests_cancelled: AtomicU64,
    /// Prompt tokens prefilled (not counting reused ones).
    pub prompt_tokens_total: AtomicU64,
    /// Prompt tokens reused from session caches (restored ones from the on-disk prompt cache
    /// included).
    pub reused_tokens_total: AtomicU64,
    /// Requests that copied a shared prompt prefix from another session's cache.
    pub prefix_hits_total: AtomicU64,
    /// Prompt tokens those copies saved from prefilling.
    pub prefix_tokens_saved_total: AtomicU64,
    /// Idle sessions whose cache was released to stay within the memory budget.
    pub cache_evictions_total: AtomicU64,
    /// Tokens generated.
    pub generated_tokens_total: AtomicU64,
    /// Decode passes of streams (one per stream per step it decodes in; with speculation a
    /// pass may yield several tokens: generated / passes is the tokens per pass).
    pub decode_passes_total: AtomicU64,
    /// Tokens speculative decoding drafted.
    pub draft_tokens_total: AtomicU64,
    /// Of those, tokens the streams' own draws agreed with (acceptance = accepted / drafted).
    pub draft_accepted_total: AtomicU64,
    /// Steps of streams under a grammar (structured outputs, tool calls).
    pub constrained_steps_total: AtomicU64,
    /// Of those, steps that computed the grammar's full mask over the vocabulary (the others
    /// took the sampler's draw after a check of that one token).
    pub constraint_masks_total: AtomicU64,
    /// Places held in the queue by requests waiting for a session (a request is counted once its
    /// place is reserved, so the count never exceeds `SchedulerConfig::queue`).
    pub queue_depth: AtomicU64,
    /// Sessions serving a request.
    pub busy_sessions: AtomicU64,
    /// Batched forward steps run.
    pub steps_total: AtomicU64,
    /// Time spent in steps, in microseconds.
    pub step_time_us_total: AtomicU64,
    /// Tokens per second of generation over the last step with any (×1000, fixed point).
    pub last_step_gen_tok_s_milli: AtomicU64,
    /// Bytes the sessions' caches hold allocated (KV capacity, recurrent state, tokens), kept
    /// between requests for prompt reuse; updated after every step.
    pub session_cache_bytes: AtomicU64,
    /// Background requests parked so that an interactive one could have their session.
    pub preemptions_total: AtomicU64,
    /// Background requests parked right now (each keeps its session's cache aside).
    pub parked: AtomicU64,
    /// Background requests accepted.
    pub background_requests_total: AtomicU64,
}

struct Job {
    priority: Priority,
    /// A prompt position worth keeping in the on-disk prompt cache (the end of a long system
    /// prompt that later requests will share).
    cache_hint: Option<usize>,
    req: Request,
    sink: Sink,
    cancel: CancelToken,
    submitted: Instant,
}

/// The continuous-batching scheduler; dropping it (or [`Scheduler::shutdown`]) stops the worker
/// after the in-flight requests finish.
pub struct Scheduler {
    tx: Mutex<Option<SyncSender<Job>>>,
    metrics: Arc<Metrics>,
    worker: Mutex<Option<JoinHandle<()>>>,
    stop_now: Arc<AtomicBool>,
    cfg: SchedulerConfig,
    vocab: usize,
}

impl Scheduler {
    /// Start the worker thread for `model`. `cfg.ctx_size` is capped at the model's own
    /// context, so [`Scheduler::config`] tells what a session really holds.
    pub fn start(model: Arc<LoadedModel>, mut cfg: SchedulerConfig) -> Result<Self> {
        cfg.ctx_size = cfg.ctx_size.min(model.model.info().context_length.max(1));
        if cfg.sessions == 0 || cfg.threads == 0 || cfg.prefill_chunk == 0 || cfg.max_step_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "sessions, threads, prefill chunk and step tokens must all be at least 1".into(),
            ));
        }
        match (&cfg.speculate, &cfg.draft_model) {
            (Some(Drafting::Model), None) => {
                return Err(EngineError::InvalidRequest(
                    "speculation by a draft model needs the draft model (SchedulerConfig::draft_model)".into(),
                ));
            }
            (Some(Drafting::Lookup(l)), _) => l.validate().map_err(EngineError::InvalidRequest)?,
            _ => {}
        }
        if let Some(d) = &cfg.draft_model
            && !(1..=MAX_DRAFT_TOKENS).contains(&d.draft_tokens)
        {
            return Err(EngineError::InvalidRequest(format!(
                "the draft model's draft tokens must be 1..={MAX_DRAFT_TOKENS}, not {}",
                d.draft_tokens
            )));
        }
        let (tx, rx) = sync_channel::<Job>(cfg.queue);
        let metrics = Arc::new(Metrics::default());
        let stop_now = Arc::new(AtomicBool::new(false));
        let pool = crate::threads::start_pools(cfg.threads, "anelm-sched")?;
        let vocab = model.model.info().vocab_size;
        let worker = {
            let (metrics, stop_now, cfg) = (metrics.clone(), stop_now.clone(), cfg.clone());
            std::thread::Builder::new()
                .name("anelm-scheduler".into())
                .spawn(move || pool.install(move || run_loop(&model, &cfg, &rx, &metrics, &stop_now)))
                .map_err(|e| EngineError::InvalidRequest(format!("could not start the scheduler: {e}")))?
        };
        Ok(Self {
            tx: Mutex::new(Some(tx)),
            metrics,
            worker: Mutex::new(Some(worker)),
            stop_now,
            cfg,
            vocab,
        })
    }

    /// Queue an interactive request; its events go to `sink`. Refused at once when the queue is
    /// full.
    pub fn submit(&self, req: Request, sink: Sink, cancel: CancelToken) -> std::result::Result<(), SubmitError> {
        self.submit_as(req, Priority::Interactive, sink, cancel)
    }

    /// Queue a request of the given [`Priority`]; its events go to `sink`. Refused at once when
    /// the queue is full.
    pub fn submit_as(
        &self,
        req: Request,
        priority: Priority,
        sink: Sink,
        cancel: CancelToken,
    ) -> std::result::Result<(), SubmitError> {
        self.submit_with(
            req,
            Submission {
                priority,
                cache_hint: None,
            },
            sink,
            cancel,
        )
    }

    /// Queue a request as `how` says (priority, a prompt position worth keeping on disk); its
    /// events go to `sink`. Refused at once when the queue is full.
    pub fn submit_with(
        &self,
        req: Request,
        how: Submission,
        sink: Sink,
        cancel: CancelToken,
    ) -> std::result::Result<(), SubmitError> {
        let Submission { priority, cache_hint } = how;
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty (no tokens)".into()));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(SubmitError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab
            )));
        }
        if let Some(&(bad, _)) = req
            .stream
            .sampler
            .logit_bias
            .iter()
            .find(|(t, _)| *t as usize >= self.vocab)
        {
            return Err(SubmitError::Invalid(format!(
                "logit_bias names token {bad}, outside the vocabulary of {}",
                self.vocab
            )));
        }
        if req.stream.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        if req.prompt.len() + 1 > self.cfg.ctx_size {
            return Err(SubmitError::Invalid(format!(
                "the prompt has {} tokens; the context holds {} (including at least one generated token)",
                req.prompt.len(),
                self.cfg.ctx_size
            )));
        }
        req.stream
            .sampler
            .validate()
            .map_err(|e| SubmitError::Invalid(e.to_string()))?;
        let guard = self.tx.lock().map_err(|_| SubmitError::ShuttingDown)?;
        let tx = guard.as_ref().ok_or(SubmitError::ShuttingDown)?;
        let job = Job {
            priority,
            cache_hint: cache_hint.filter(|&h| h > 0 && h < req.prompt.len()),
            req,
            sink,
            cancel,
            submitted: Instant::now(),
        };
        // Reserve a place first: the depth is the number of places held, so a request that shows
        // in `queue_depth` already holds its place and a later request cannot take it (a count
        // raised before the send let a later request's send win, and the earlier one got 429).
        // Reserving before sending also keeps the worker's decrement from running first.
        let cap = self.cfg.queue as u64;
        let reserved = self
            .metrics
            .queue_depth
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| (d < cap).then_some(d + 1));
        if reserved.is_err() {
            self.metrics.requests_rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::QueueFull(self.cfg.queue));
        }
        match tx.try_send(job) {
            Ok(()) => {
                self.metrics.requests_total.fetch_add(1, Ordering::Relaxed);
                if priority == Priority::Background {
                    self.metrics.background_requests_total.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(e) => {
                self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                match e {
                    TrySendError::Full(_) => {
                        self.metrics.requests_rejected.fetch_add(1, Ordering::Relaxed);
                        Err(SubmitError::QueueFull(self.cfg.queue))
                    }
                    TrySendError::Disconnected(_) => Err(SubmitError::ShuttingDown),
                }
            }
        }
    }

    /// Live counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Stop accepting requests and wait for the worker. With `cancel_in_flight`, running requests
    /// end at the next step with [`FinishReason::Cancelled`]; otherwise they run to completion
    /// (and queued ones are still served).
    pub fn shutdown(&self, cancel_in_flight: bool) {
        if cancel_in_flight {
            self.stop_now.store(true, Ordering::Relaxed);
        }
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut w) = self.worker.lock()
            && let Some(handle) = w.take()
        {
            let _ = handle.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown(true);
    }
}

/// A request being served in a session.
struct Active<'t> {
    job: Job,
    stream: Stream<'t>,
    /// Prompt tokens not yet prefilled.
    pending: VecDeque<u32>,
    /// Admission order (earlier requests never wait for later ones).
    seq: u64,
    /// The token to feed next step once prefill is done.
    next: Option<u32>,
    reused: usize,
    admitted: Instant,
    first_token: Option<Instant>,
    /// Speculative decoding: where drafts come from, the tokens drafted to follow `next` in the
    /// next step, and how many the next draft may have.
    drafting: Option<Drafting>,
    drafts: Vec<u32>,
    draft_budget: DraftBudget,
}

struct Slot<'t> {
    session: Session,
    /// The draft model's session for this slot's streams (made when one drafts with it).
    draft: Option<Session>,
    active: Option<Active<'t>>,
    last_used: u64,
}

impl Slot<'_> {
    /// Bytes its sessions (the target's and the draft model's) keep.
    fn reserved_bytes(&self) -> usize {
        self.session.reserved_bytes() + self.draft.as_ref().map_or(0, Session::reserved_bytes)
    }
}

/// Requests taken from the channel and not yet in a session, by priority.
#[derive(Default)]
struct Waiting {
    interactive: VecDeque<Job>,
    background: VecDeque<Job>,
}

impl Waiting {
    fn push(&mut self, job: Job) {
        match job.priority {
            Priority::Interactive => self.interactive.push_back(job),
            Priority::Background => self.background.push_back(job),
        }
    }
    fn is_empty(&self) -> bool {
        self.interactive.is_empty() && self.background.is_empty()
    }
}

fn run_loop(lm: &LoadedModel, cfg: &SchedulerConfig, rx: &Receiver<Job>, metrics: &Metrics, stop_now: &AtomicBool) {
    let model = lm.model.as_ref();
    let tok: &Tokenizer = &lm.tokenizer;
    let ctx = cfg.ctx_size; // capped at the model's context in `Scheduler::start`
    let fresh = || Slot {
        session: model.new_session(ctx),
        draft: None,
        active: None,
        last_used: 0,
    };
    let mut slots: Vec<Slot<'_>> = (0..cfg.sessions).map(|_| fresh()).collect();
    // Background requests parked for interactive ones, each with its own session, oldest first.
    let mut parked: Vec<Slot<'_>> = Vec::new();
    let mut waiting = Waiting::default();
    let mut clock = 0u64;
    let mut open = true;
    loop {
        // Take what has arrived; block (briefly) only when there is nothing to do.
        if open {
            let idle = slots.iter().all(|s| s.active.is_none()) && parked.is_empty() && waiting.is_empty();
            if idle {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(j) => waiting.push(j),
                    Err(RecvTimeoutError::Timeout) => {
                        if stop_now.load(Ordering::Relaxed) {
                            return;
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(j) => waiting.push(j),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
        }
        // Admission: interactive requests first (taking a background request's session when
        // every session is busy), then parked background requests, then new ones.
        loop {
            let free = slots.iter().any(|s| s.active.is_none());
            if let Some(job) = waiting.interactive.pop_front() {
                if !free {
                    // The background request admitted last has the least work to set aside.
                    let victim = slots
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| {
                            s.active
                                .as_ref()
                                .is_some_and(|a| a.job.priority == Priority::Background)
                        })
                        .max_by_key(|(_, s)| s.active.as_ref().map_or(0, |a| a.seq))
                        .map(|(i, _)| i);
                    let Some(v) = victim else {
                        waiting.interactive.push_front(job);
                        break;
                    };
                    parked.push(std::mem::replace(&mut slots[v], fresh()));
                    metrics.preemptions_total.fetch_add(1, Ordering::Relaxed);
                }
                metrics.queue_depth.fetch_sub(1, Ordering::AcqRel);
                clock += 1;
                admit(&mut slots, job, tok, metrics, clock, cfg);
                continue;
            }
            if !free {
                break;
            }
            if !parked.is_empty() {
                // Resume the oldest parked request in place of the least recently used free
                // session (whose cache is released: the parked one brings its own).
                let f = slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.active.is_none())
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(i, _)| i);
                if let Some(f) = f {
                    slots[f] = parked.remove(0);
                }
                continue;
            }
            let Some(job) = waiting.background.pop_front() else {
                break;
            };
            metrics.queue_depth.fetch_sub(1, Ordering::AcqRel);
            clock += 1;
            admit(&mut slots, job, tok, metrics, clock, cfg);
        }
        metrics.parked.store(parked.len() as u64, Ordering::Relaxed);
        let busy = slots.iter().any(|s| s.active.is_some());
        if !open && !busy && parked.is_empty() && waiting.is_empty() {
            return;
        }
        // Drop cancelled requests before spending a step on them (parked ones too).
        let cancel_all = stop_now.load(Ordering::Relaxed);
        for slot in slots.iter_mut().chain(parked.iter_mut()) {
            if let Some(a) = &slot.active
                && (cancel_all || a.job.cancel.is_cancelled())
            {
                finish(slot, metrics);
            }
        }
        parked.retain(|s| s.active.is_some());
        if !busy {
            continue;
        }
        step(model, &mut slots, cfg, metrics);
    }
}

/// Place `job` in the free session sharing the longest prefix with its prompt (else the least
/// recently used free one) and rewind that session to the shared prefix.
fn admit<'t>(
    slots: &mut [Slot<'t>],
    mut job: Job,
    tok: &'t Tokenizer,
    metrics: &Metrics,
    clock: u64,
    cfg: &SchedulerConfig,
) {
    let shared = |s: &Session, p: &[u32]| common_prefix(s.tokens(), p);
    let Some(best) = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.active.is_none())
        .max_by_key(|(_, s)| (shared(&s.session, &job.req.prompt), std::cmp::Reverse(s.last_used)))
        .map(|(i, _)| i)
    else {
        return;
    };
    let drafting = job.req.speculate.resolve(cfg.speculate);
    let checked = match drafting {
        Some(Drafting::Lookup(l)) => l.validate().map_err(|e| format!("speculate: {e}")),
        Some(Drafting::Model) if cfg.draft_model.is_none() => Err(
            "speculate: this server has no draft model (start it with --speculate PATH), ask for \"lookup\" instead"
                .to_string(),
        ),
        _ => Ok(()),
    };
    let stream = match checked.and_then(|()| Stream::new(tok, &job.req.stream).map_err(|e| e.to_string())) {
        Ok(s) => s,
        Err(e) => {
            (job.sink)(Event::Failed(e));
            metrics.requests_finished.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let slot = &mut slots[best];
    // Keep at least the last prompt token to run again: its logits start generation.
    let common = shared(&slot.session, &job.req.prompt).min(job.req.prompt.len() - 1);
    let held = slot.session.len();
    // A recurrent (hybrid-model) session cannot rewind: it may keep less than asked.
    let mut common = slot.session.truncate(common);
    if let Some(disk) = cfg.prompt_cache.as_deref() {
        common = prompt_cache_hook::on_admit(disk, &mut slot.session, held, &job.req.prompt, common);
    }
    slot.last_used = clock;
    metrics.busy_sessions.fetch_add(1, Ordering::Relaxed);
    metrics.reused_tokens_total.fetch_add(common as u64, Ordering::Relaxed);
    slot.active = Some(Active {
        pending: job.req.prompt[common..].iter().copied().collect(),
        seq: clock,
        next: None,
        reused: common,
        admitted: Instant::now(),
        first_token: None,
        drafting,
        drafts: Vec::new(),
        draft_budget: DraftBudget::default(),
        stream,
        job,
    });
}

/// Release idle sessions' caches, least recently used first, until all sessions together keep
/// at most `budget` bytes (sessions serving a request are never touched).
fn evict_idle(slots: &mut [Slot<'_>], budget: usize, metrics: &Metrics) {
    let mut total: usize = slots.iter().map(Slot::reserved_bytes).sum();
    while total > budget {
        let Some(lru) = slots
            .iter_mut()
            .filter(|s| s.active.is_none() && s.session.reserved_bytes() > 0 && !s.session.is_empty())
            .min_by_key(|s| s.last_used)
        else {
            return;
        };
        let before = lru.reserved_bytes();
        lru.session.release();
        lru.draft = None;
        total = total - before + lru.reserved_bytes();
        metrics.cache_evictions_total.fetch_add(1, Ordering::Relaxed);
    }
}

/// Draft for the `wanted` streams (slot, history, most drafts) with the draft model, in batched
/// passes over all of them ([`draft_lanes`]); each slot's draft session is made on first use.
/// A failed draft costs only speed: the streams decode on without drafts this step (the output
/// is the same either way) and their draft sessions start over.
fn draft_with_model(
    draft: &DraftConfig,
    slots: &mut [Slot<'_>],
    wanted: &[(usize, Vec<u32>, usize)],
    ctx_size: usize,
    target_vocab: usize,
) {
    let ctx = ctx_size.min(draft.model.info().context_length.max(1));
    let mut lanes: Vec<DraftLane<'_>> = Vec::with_capacity(wanted.len());
    let mut k = 0;
    for (i, slot) in slots.iter_mut().enumerate() {
        let Some((_, history, limit)) = wanted.get(k).filter(|w| w.0 == i) else {
            continue;
        };
        k += 1;
        lanes.push(DraftLane {
            session: slot.draft.get_or_insert_with(|| draft.model.new_session(ctx)),
            history,
            limit: (*limit).min(draft.draft_tokens),
        });
    }
    match draft_lanes(draft.model.as_ref(), &mut lanes, target_vocab) {
        Ok(drafts) => {
            for ((i, _, _), d) in wanted.iter().zip(drafts) {
                if let Some(a) = slots[*i].active.as_mut() {
                    a.drafts = d;
                }
            }
        }
        Err(e) => {
            tracing::warn!("the draft model failed ({e}); these streams decode without drafts this step");
            for (i, _, _) in wanted {
                slots[*i].draft = None;
            }
        }
    }
}

/// Shortest shared prefix worth copying or waiting for (below it, prefilling is as cheap).
const MIN_SHARED_PREFIX: usize = 32;

/// How many leading tokens `a` and `b` share.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// What a prefilling request does about a prefix another session shares with it.
enum Sharing {
    /// Copy that session's cache up to this many positions.
    Copy { from: usize, len: usize },
    /// An earlier request is still prefilling the shared prefix: wait for it this step.
    Wait,
}

/// Concurrent requests with a common prompt prefix (a long system prompt, the choices of one
/// request) prefill it once. A prefilling request whose prompt agrees with another session's
/// cache for more positions than its own copies that cache up to the agreement (a memory copy
/// instead of a forward; bit for bit the same rows, as every row is computed alone), and one
/// whose shared prefix an earlier-admitted request is still prefilling waits until that
/// request has passed it. A hybrid model's recurrent state can only be copied where it was
/// saved, so the request being waited for ends a prefill chunk exactly at the shared length and
/// checkpoints there. Returns which slots wait this step and where each slot's next prefill
/// chunk must end.
fn share_prefixes(
    slots: &mut [Slot<'_>],
    metrics: &Metrics,
    disk: Option<&PromptCache>,
) -> (Vec<bool>, Vec<Option<usize>>) {
    let mut cuts: Vec<Option<usize>> = vec![None; slots.len()];
    let mut decisions: Vec<(usize, Sharing)> = Vec::new();
    for (x, sx) in slots.iter().enumerate() {
        let Some(ax) = &sx.active else { continue };
        if ax.next.is_some() || ax.pending.is_empty() {
            continue;
        }
        let prompt = &ax.job.req.prompt;
        let limit = prompt.len() - 1; // the last prompt token always runs, for its logits
        let have = sx.session.len();
        let mut best: Option<(usize, usize)> = None;
        let mut wait = false;
        let mut wait_on: Option<(usize, usize)> = None;
        for (y, sy) in slots.iter().enumerate() {
            if y == x {
                continue;
            }
            let cached = common_prefix(sy.session.tokens(), prompt).min(limit);
            if cached >= have + MIN_SHARED_PREFIX && best.is_none_or(|(_, b)| cached > b) {
                best = Some((y, cached));
            }
            if let Some(ay) = &sy.active
                && ay.seq < ax.seq
                && ay.next.is_none()
                && !ay.pending.is_empty()
            {
                // Wait for the whole shared prefix rather than copy it piece by piece.
                let shared = common_prefix(&ay.job.req.prompt, prompt).min(limit);
                if shared >= have + MIN_SHARED_PREFIX && sy.session.len() < shared {
                    wait = true;
                    if wait_on.is_none_or(|(_, w)| shared > w) {
                        wait_on = Some((y, shared));
                    }
                }
            }
        }
        if let Some((y, shared)) = wait_on
            && slots[y].session.is_recurrent()
        {
            cuts[y] = Some(cuts[y].map_or(shared, |c| c.min(shared)));
        }
        // Copy when some cache already holds everything shared; wait rather than copy part of
        // a prefix an earlier request is still prefilling.
        let awaited = wait_on.map_or(0, |(_, shared)| shared);
        match best {
            Some((from, len)) if len >= awaited => decisions.push((x, Sharing::Copy { from, len })),
            _ if wait => decisions.push((x, Sharing::Wait)),
            Some((from, len)) => decisions.push((x, Sharing::Copy { from, len })),
            None => {}
        }
    }
    let mut waiting = vec![false; slots.len()];
    for (x, d) in decisions {
        match d {
            Sharing::Wait => waiting[x] = true,
            Sharing::Copy { from, len } => {
                let mut copy = slots[from].session.clone();
                // A recurrent session can only go back to a checkpoint: it may keep less.
                let kept = copy.truncate(len);
                let slot = &mut slots[x];
                let have = slot.session.len();
                let Some(a) = slot.active.as_mut() else { continue };
                if kept <= have {
                    continue;
                }
                slot.session = copy;
                if let Some(disk) = disk {
                    // Two requests were seen to share this prefix: worth keeping across restarts.
                    disk.store(&slot.session, kept);
                }
                a.pending = a.job.req.prompt[kept..].iter().copied().collect();
                a.reused = kept;
                metrics.prefix_hits_total.fetch_add(1, Ordering::Relaxed);
                metrics
                    .prefix_tokens_saved_total
                    .fetch_add((kept - have) as u64, Ordering::Relaxed);
                metrics
                    .reused_tokens_total
                    .fetch_add((kept - have) as u64, Ordering::Relaxed);
            }
        }
    }
    (waiting, cuts)
}

/// End the slot's request (the session keeps its cache for reuse). Its stream has finished,
/// or it is cancelled here.
fn finish(slot: &mut Slot<'_>, metrics: &Metrics) {
    let Some(mut a) = slot.active.take() else {
        return;
    };
    a.stream.cancel(); // no-op when the stream finished by itself
    let reason = a.stream.finished().unwrap_or(FinishReason::Cancelled);
    metrics.busy_sessions.fetch_sub(1, Ordering::Relaxed);
    metrics.requests_finished.fetch_add(1, Ordering::Relaxed);
    if reason == FinishReason::Cancelled {
        metrics.requests_cancelled.fetch_add(1, Ordering::Relaxed);
    }
    let now = Instant::now();
    let submitted = a.job.submitted;
    let done = Completion {
        finish: reason,
        stop_string: a.stream.stop_string().map(str::to_string),
        prompt_tokens: a.job.req.prompt.len(),
        reused_tokens: a.reused,
        tokens: a.stream.generated().to_vec(),
        queued: a.admitted - submitted,
        time_to_first_token: a.first_token.map_or(Duration::ZERO, |t| t - submitted),
        total: now - submitted,
    };
    (a.job.sink)(Event::Done(done));
}

fn fail(slot: &mut Slot<'_>, msg: String, metrics: &Metrics) {
    if let Some(mut a) = slot.active.take() {
        metrics.busy_sessions.fetch_sub(1, Ordering::Relaxed);
        metrics.requests_finished.fetch_add(1, Ordering::Relaxed);
        (a.job.sink)(Event::Failed(msg));
    }
    // The cache may be half-written: forget it.
    slot.session.clear();
}

/// One session's share of a step.
struct Feed {
    slot: usize,
    /// A decode token and its drafts, or a prompt chunk.
    tokens: Vec<u32>,
    logits: LogitsMode,
    /// A decode pass (else a prefill chunk).
    decode: bool,
}

impl Feed {
    /// Logit rows the item gets back.
    fn rows(&self) -> usize {
        match self.logits {
            LogitsMode::None => 0,
            LogitsMode::Last => 1,
            LogitsMode::All => self.tokens.len(),
        }
    }
}

/// One batched forward for every active session, then sampling and streaming.
fn step(model: &dyn crate::model::LanguageModel, slots: &mut [Slot<'_>], cfg: &SchedulerConfig, metrics: &Metrics) {
    let t0 = Instant::now();
    let (waiting, mut cuts) = if cfg.share_prefixes {
        share_prefixes(slots, metrics, cfg.prompt_cache.as_deref())
    } else {
        (vec![false; slots.len()], vec![None; slots.len()])
    };
    if let Some(disk) = &cfg.prompt_cache {
        prompt_cache_hook::checkpoint_cuts(disk, slots, &mut cuts);
    }
    // While an interactive request prefills, background streams sit the step out: the prompt's
    // chunk runs alone, so its first token comes as fast as on an idle server (they resume at
    // the next step, unchanged).
    // (One that waits for another request's prefill of a shared prefix does not count: that
    // request may be a background one, which must then run.)
    let interactive_prefill = slots.iter().enumerate().any(|(i, s)| {
        !waiting[i]
            && s.active
                .as_ref()
                .is_some_and(|a| a.job.priority == Priority::Interactive && a.next.is_none() && !a.pending.is_empty())
    });
    let sits_out = |slot: &Slot<'_>| {
        interactive_prefill
            && slot
                .active
                .as_ref()
                .is_some_and(|a| a.job.priority == Priority::Background)
    };
    // Decide each slot's tokens: decoders first (their token and its drafts), then prefill
    // chunks within budget.
    let mut budget = cfg.max_step_tokens;
    let mut feed: Vec<Feed> = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        if sits_out(slot) {
            continue;
        }
        if let Some(a) = &slot.active
            && let Some(t) = a.next
        {
            let mut tokens = Vec::with_capacity(1 + a.drafts.len());
            tokens.push(t);
            tokens.extend_from_slice(&a.drafts);
            budget = budget.saturating_sub(tokens.len());
            let logits = if a.drafts.is_empty() {
                LogitsMode::Last
            } else {
                LogitsMode::All
            };
            feed.push(Feed {
                slot: i,
                tokens,
                logits,
                decode: true,
            });
        }
    }
    for (i, slot) in slots.iter().enumerate() {
        if sits_out(slot) {
            continue;
        }
        if let Some(a) = &slot.active
            && a.next.is_none()
            && !a.pending.is_empty()
            && !waiting[i]
        {
            // Always let a prefilling stream move, even when decoders used the budget.
            let mut n = a.pending.len().min(cfg.prefill_chunk).min(budget.max(16));
            // End the chunk where a waiting request needs a recurrent checkpoint.
            if let Some(cut) = cuts[i]
                && cut > slot.session.len()
            {
                n = n.min(cut - slot.session.len());
            }
            budget = budget.saturating_sub(n);
            let tokens: Vec<u32> = a.pending.iter().take(n).copied().collect();
            let last = n == a.pending.len();
            feed.push(Feed {
                slot: i,
                tokens,
                logits: if last { LogitsMode::Last } else { LogitsMode::None },
                decode: false,
            });
        }
    }
    if feed.is_empty() {
        return;
    }
    // What undoes each speculative pass's rejected positions (a hybrid session's recurrent
    // state is copied here).
    let mut rollbacks: Vec<Option<Rollback>> = (0..slots.len()).map(|_| None).collect();
    for f in feed.iter().filter(|f| f.logits == LogitsMode::All) {
        rollbacks[f.slot] = Some(Rollback::before(&mut slots[f.slot].session));
    }
    // One forward over all of them.
    let result = {
        let mut sessions: Vec<Option<&mut Session>> = slots.iter_mut().map(|s| Some(&mut s.session)).collect();
        let mut items: Vec<StepItem<'_>> = Vec::with_capacity(feed.len());
        for f in &feed {
            let Some(session) = sessions[f.slot].take() else {
                continue;
            };
            items.push(StepItem {
                session,
                tokens: &f.tokens,
                logits: f.logits,
            });
        }
        model.forward(&mut items)
    };
    let mut out = match result {
        Ok(out) => out,
        Err(e) => {
            for f in &feed {
                fail(&mut slots[f.slot], format!("forward pass failed: {e}"), metrics);
            }
            return;
        }
    };
    // Each item's first logits row.
    let mut first_row = vec![None; slots.len()];
    let mut rows = 0;
    for f in &feed {
        if f.rows() > 0 {
            first_row[f.slot] = Some(rows);
        }
        rows += f.rows();
    }
    // Constrained streams' grammar work (the first draw's check, and the full mask where the
    // grammar refuses it), done across the kernel pool's threads before the serial loop: its
    // workers are still spinning from the forward, so they start at once (a second pool would
    // have to wait for those cores). A speculative pass prepares its first row.
    {
        let mut drafted = vec![0; slots.len()];
        for f in &feed {
            drafted[f.slot] = f.rows().saturating_sub(1);
        }
        let out_ref = &out;
        let constrained: Vec<std::sync::Mutex<(&mut Stream<'_>, &[u32], usize)>> = slots
            .iter_mut()
            .zip(first_row.iter().zip(&drafted))
            .filter_map(|(slot, (row, &drafted))| {
                let Slot { session, active, .. } = slot;
                let a = active.as_mut()?;
                (a.stream.is_constrained()).then_some(())?;
                let history = &session.tokens()[..session.len() - drafted];
                Some(std::sync::Mutex::new((&mut a.stream, history, (*row)?)))
            })
            .collect();
        if constrained.len() > 1 {
            anelm_kernels::pool::global().run(constrained.len(), &|i| {
                if let Ok(mut guard) = constrained[i].lock() {
                    let (stream, history, row) = &mut *guard;
                    stream.prepare(out_ref.lane(*row), history);
                }
            });
        }
    }
    let mut generated_now = 0u64;
    // Streams that draft with the draft model: (slot, history, most drafts), drafted together
    // after the loop.
    let mut by_model: Vec<(usize, Vec<u32>, usize)> = Vec::new();
    for f in feed {
        let i = f.slot;
        let slot = &mut slots[i];
        let Some(a) = slot.active.as_mut() else {
            continue;
        };
        if f.decode {
            a.next = None;
            a.drafts.clear();
            metrics.decode_passes_total.fetch_add(1, Ordering::Relaxed);
        } else {
            a.pending.drain(..f.tokens.len());
            metrics
                .prompt_tokens_total
                .fetch_add(f.tokens.len() as u64, Ordering::Relaxed);
            if a.pending.is_empty() || cuts[i] == Some(slot.session.len()) {
                // Hybrid models: save the recurrent state at the end of the prompt, so the next
                // turn of this conversation can rewind here rather than to position 0, and
                // where a waiting request shares this prefix, so it can copy it.
                slot.session.checkpoint();
            }
            if let Some(disk) = &cfg.prompt_cache {
                prompt_cache_hook::after_prefill_chunk(disk, &slot.session, &a.job.req.prompt, a.job.cache_hint);
            }
        }
        let Some(row0) = first_row[i] else {
            continue;
        };
        // The stream takes tokens from the rows while its draws agree with the drafts.
        let n = f.rows();
        let fed = &f.tokens[f.tokens.len() - n..];
        let constrained = a.stream.is_constrained();
        let (first_token, sink) = (&mut a.first_token, &mut a.job.sink);
        let verified = verify(
            &mut a.stream,
            &mut out,
            row0,
            fed,
            slot.session.tokens(),
            slot.session.ctx_size(),
            &mut |s| {
                first_token.get_or_insert_with(Instant::now);
                if constrained {
                    metrics.constrained_steps_total.fetch_add(1, Ordering::Relaxed);
                    metrics
                        .constraint_masks_total
                        .fetch_add(u64::from(s.masked), Ordering::Relaxed);
                }
                if s.token.is_some() {
                    generated_now += 1;
                    metrics.generated_tokens_total.fetch_add(1, Ordering::Relaxed);
                }
                let mut listening = true;
                if let Some(lp) = s.logprob {
                    listening = sink(Event::Logprob(lp));
                }
                if listening && !s.text.is_empty() {
                    listening = sink(Event::Text(s.text));
                }
                listening
            },
        );
        let verified = match verified {
            Ok(v) => v,
            Err(e) => {
                fail(slot, format!("sampling failed: {e}"), metrics);
                continue;
            }
        };
        if f.decode {
            metrics.draft_tokens_total.fetch_add(n as u64 - 1, Ordering::Relaxed);
            metrics
                .draft_accepted_total
                .fetch_add(verified.accepted as u64, Ordering::Relaxed);
            a.draft_budget.update(n - 1, verified.accepted);
        }
        // Drop the positions of drafts whose rows went unused.
        if let Some(r) = rollbacks[i].take()
            && let Err(e) = r.keep(model, &mut slot.session, verified.used)
        {
            fail(slot, format!("speculative rollback failed: {e}"), metrics);
            continue;
        }
        let Some(t) = verified.next else {
            finish(slot, metrics);
            continue;
        };
        a.next = Some(t);
        let left = a.job.req.stream.max_tokens.saturating_sub(a.stream.generated().len());
        match a.drafting {
            None => {}
            Some(Drafting::Lookup(mut lookup)) => {
                match next_drafts(
                    &mut lookup,
                    &a.draft_budget,
                    &slot.session,
                    t,
                    left,
                    cfg.max_step_tokens / 4,
                ) {
                    Ok(d) => a.drafts = d,
                    Err(e) => fail(slot, format!("drafting failed: {e}"), metrics),
                }
            }
            Some(Drafting::Model) => {
                let limit = draft_limit(&a.draft_budget, &slot.session, left, cfg.max_step_tokens / 4);
                if limit > 0 {
                    by_model.push((i, draft_history(&slot.session, t), limit));
                }
            }
        }
    }
    if let Some(draft) = &cfg.draft_model
        && !by_model.is_empty()
    {
        draft_with_model(draft, slots, &by_model, cfg.ctx_size, model.info().vocab_size);
    }
    if let Some(budget) = cfg.cache_mem {
        evict_idle(slots, budget, metrics);
    }
    let dt = t0.elapsed();
    let cache_bytes: usize = slots.iter().map(Slot::reserved_bytes).sum();
    metrics.session_cache_bytes.store(cache_bytes as u64, Ordering::Relaxed);
    metrics.steps_total.fetch_add(1, Ordering::Relaxed);
    metrics
        .step_time_us_total
        .fetch_add(dt.as_micros() as u64, Ordering::Relaxed);
    if generated_now > 0 && !dt.is_zero() {
        let rate = generated_now as f64 / dt.as_secs_f64();
        metrics
            .last_step_gen_tok_s_milli
            .store((rate * 1000.0) as u64, Ordering::Relaxed);
    }
}
