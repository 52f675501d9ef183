//! Priorities in the continuous-batching scheduler on the default model (SmolLM2-135M Q4_1,
//! CPU): an interactive request takes a background request's session at once when every
//! session is busy, the background request is parked and resumes exactly where it stopped (the
//! same tokens as running alone), and waiting interactive requests go before waiting background
//! ones.
//!
//! Needs the default model (`scripts/fetch-default-model.sh`; `scripts/test.sh` runs it first).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anelm_engine::default_model::{FETCH_COMMAND, default_model_location};
use anelm_engine::{
    CancelToken, CpuBackend, Event, GenerateOptions, LoadedModel, Priority, Request, Scheduler, SchedulerConfig,
    StreamOptions, generate, load_model,
};

fn model() -> Arc<LoadedModel> {
    let path = default_model_location().expect("a home directory");
    assert!(
        path.is_file(),
        "default model missing at {}: run {FETCH_COMMAND}",
        path.display()
    );
    Arc::new(load_model(&path, &CpuBackend::new(), &mut |_, _| {}).expect("load SmolLM2"))
}

fn config(sessions: usize) -> SchedulerConfig {
    SchedulerConfig {
        sessions,
        queue: 16,
        ctx_size: 512,
        prefill_chunk: 16,
        max_step_tokens: 64,
        threads: 2,
        ..SchedulerConfig::default()
    }
}

fn request(lm: &LoadedModel, prompt: &str, max_tokens: usize) -> Request {
    Request {
        prompt: lm.tokenizer.encode(prompt).expect("encode"),
        stream: StreamOptions {
            ignore_eos: true,
            ..StreamOptions::greedy(max_tokens)
        },
        speculate: Default::default(),
    }
}

/// Events of one request, with the instant each arrived.
type Timed = Receiver<(Instant, Event)>;

fn submit(s: &Scheduler, req: Request, priority: Priority) -> Timed {
    let (tx, rx) = channel();
    s.submit_as(
        req,
        priority,
        Box::new(move |e| tx.send((Instant::now(), e)).is_ok()),
        CancelToken::new(),
    )
    .expect("accepted");
    rx
}

/// The generated tokens, and when the first text and the end arrived.
fn collect(rx: &Timed) -> (Vec<u32>, Instant, Instant) {
    let mut first = None;
    loop {
        let (at, e) = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("an event within 300 s");
        match e {
            Event::Text(_) | Event::Logprob(_) => {
                first.get_or_insert(at);
            }
            Event::Done(c) => return (c.tokens, first.unwrap_or(at), at),
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
}

fn run_alone(lm: &LoadedModel, req: &Request) -> Vec<u32> {
    let mut session = lm.model.new_session(512);
    let opts = GenerateOptions {
        stream: req.stream.clone(),
        prefill_chunk: 128,
        speculate: None,
    };
    generate(
        lm.model.as_ref(),
        &lm.tokenizer,
        &mut session,
        &req.prompt,
        &opts,
        &mut |_| true,
    )
    .expect("generate")
    .0
}

#[test]
fn interactive_preempts_background_which_resumes_exactly() {
    let lm = model();
    let sched = Scheduler::start(lm.clone(), config(1)).expect("scheduler");
    let bg = request(&lm, "Once upon a time, in a small village,", 64);
    let fg = request(&lm, "The capital of France is", 8);
    let bg_rx = submit(&sched, bg.clone(), Priority::Background);
    // Wait until the background request is generating: it holds the only session.
    let (_, first) = bg_rx.recv_timeout(Duration::from_secs(120)).expect("background starts");
    assert!(matches!(first, Event::Text(_)), "background started with {first:?}");
    let fg_rx = submit(&sched, fg.clone(), Priority::Interactive);
    let (fg_tokens, _, fg_done) = collect(&fg_rx);
    let (bg_tokens, _, bg_done) = collect(&bg_rx);
    assert!(
        fg_done < bg_done,
        "the interactive request finished only after the background one"
    );
    assert_eq!(sched.metrics().preemptions_total.load(Ordering::Relaxed), 1);
    assert_eq!(sched.metrics().parked.load(Ordering::Relaxed), 0);
    // Parking kept every bit of the background request's state.
    assert_eq!(bg_tokens.len(), 64);
    assert_eq!(bg_tokens, run_alone(&lm, &bg), "the parked request resumed differently");
    assert_eq!(fg_tokens, run_alone(&lm, &fg));
}

#[test]
fn waiting_interactive_goes_before_waiting_background() {
    let lm = model();
    // Two sessions, both busy with interactive work: nothing to preempt. They end at different
    // steps, so one session frees at a time.
    let sched = Scheduler::start(lm.clone(), config(2)).expect("scheduler");
    let a = submit(&sched, request(&lm, "Water boils at", 24), Priority::Interactive);
    let b = submit(&sched, request(&lm, "The quick brown fox", 48), Priority::Interactive);
    std::thread::sleep(Duration::from_millis(50));
    let bg = submit(&sched, request(&lm, "def fibonacci(n):", 8), Priority::Background);
    let c = submit(
        &sched,
        request(&lm, "The three primary colors are", 8),
        Priority::Interactive,
    );
    let (_, _, _) = collect(&a);
    let (_, _, _) = collect(&b);
    let (_, c_first, _) = collect(&c);
    let (_, bg_first, _) = collect(&bg);
    assert!(
        c_first <= bg_first,
        "the background request started before the interactive one queued after it"
    );
    assert_eq!(sched.metrics().preemptions_total.load(Ordering::Relaxed), 0);
    assert_eq!(sched.metrics().background_requests_total.load(Ordering::Relaxed), 1);
}
