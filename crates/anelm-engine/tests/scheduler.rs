//! The continuous-batching scheduler on the default model (SmolLM2-135M Q4_1, CPU): batching
//! must not change results, the queue bound holds, cancellation frees sessions, and a request
//! that extends a finished conversation reuses its session's cache.
//!
//! Needs the default model (`scripts/fetch-default-model.sh`; `scripts/test.sh` runs it first).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use anelm_engine::default_model::{FETCH_COMMAND, default_model_location};
use anelm_engine::{
    CancelToken, Completion, CpuBackend, Event, FinishReason, GenerateOptions, LoadedModel, LogitsMode, Request,
    Scheduler, SchedulerConfig, StepItem, StreamOptions, SubmitError, generate, load_model,
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

fn config(sessions: usize, queue: usize) -> SchedulerConfig {
    SchedulerConfig {
        sessions,
        queue,
        ctx_size: 512,
        prefill_chunk: 16,
        max_step_tokens: 64,
        threads: 2,
        share_prefixes: true,
        cache_mem: None,
        prompt_cache: None,
        speculate: None,
        draft_model: None,
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

fn submit(s: &Scheduler, req: Request) -> Receiver<Event> {
    let (tx, rx) = channel();
    s.submit(req, Box::new(move |e| tx.send(e).is_ok()), CancelToken::new())
        .expect("accepted");
    rx
}

/// All text and the completion of one request.
fn collect(rx: &Receiver<Event>) -> (String, Completion) {
    let mut text = String::new();
    loop {
        match rx
            .recv_timeout(Duration::from_secs(120))
            .expect("an event within 120 s")
        {
            Event::Text(t) => text.push_str(&t),
            Event::Logprob(_) => {}
            Event::Done(c) => return (text, c),
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
}

/// A request's generated tokens and the bits of their log-probabilities (it must record them).
fn tokens_and_logprob_bits(rx: &Receiver<Event>) -> Answer {
    let mut lps = Vec::new();
    loop {
        match rx
            .recv_timeout(Duration::from_secs(300))
            .expect("an event within 300 s")
        {
            Event::Logprob(l) => lps.push(l.logprob.to_bits()),
            Event::Text(_) => {}
            Event::Done(c) => return (c.tokens, lps),
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
}

/// The tokens `req` generates alone, through the single-stream generation loop.
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

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at",
    "My favourite programming language is",
    "The quick brown fox",
    "In 1969, the first humans",
];

#[test]
fn eight_concurrent_greedy_streams_equal_each_run_alone() {
    let lm = model();
    // Alone: the single-stream generation loop, one request at a time.
    let alone: Vec<Vec<u32>> = PROMPTS.iter().map(|p| run_alone(&lm, &request(&lm, p, 20))).collect();
    // Together: eight sessions, prompts of different lengths prefilling in 16-token chunks while
    // others decode, all in shared batched steps.
    let sched = Scheduler::start(lm.clone(), config(8, 16)).expect("start");
    let rxs: Vec<_> = PROMPTS.iter().map(|p| submit(&sched, request(&lm, p, 20))).collect();
    for (i, rx) in rxs.iter().enumerate() {
        let (text, done) = collect(rx);
        assert_eq!(done.finish, FinishReason::Length);
        assert_eq!(
            done.tokens, alone[i],
            "{:?}: batched tokens differ from running alone",
            PROMPTS[i]
        );
        assert_eq!(
            text,
            lm.tokenizer.decode(&alone[i]).expect("decode"),
            "{:?}",
            PROMPTS[i]
        );
    }
    let m = sched.metrics();
    assert_eq!(m.busy_sessions.load(Ordering::Relaxed), 0);
    assert_eq!(m.generated_tokens_total.load(Ordering::Relaxed), 8 * 20);
    // Fewer steps than running the eight one after another: they were batched.
    assert!(
        m.steps_total.load(Ordering::Relaxed) < 8 * 20,
        "steps {}",
        m.steps_total.load(Ordering::Relaxed)
    );
}

#[test]
fn a_full_queue_is_refused_at_once_and_cancelled_clients_free_their_session() {
    let lm = model();
    let sched = Scheduler::start(lm.clone(), config(1, 1)).expect("start");
    // The first occupies the only session; the client stops listening after one piece.
    let cancel = CancelToken::new();
    let (tx, rx) = channel();
    sched
        .submit(
            request(&lm, "Tell me a very long story about dragons.", 400),
            Box::new(move |e| {
                let _ = tx.send(e);
                false
            }),
            cancel,
        )
        .expect("first accepted");
    // Wait until it is admitted (its first event), so the queue is empty again.
    let first = rx.recv_timeout(Duration::from_secs(60)).expect("first event");
    assert!(matches!(first, Event::Text(_)));
    let done = rx.recv_timeout(Duration::from_secs(60)).expect("cancel completes");
    match done {
        Event::Done(c) => assert_eq!(c.finish, FinishReason::Cancelled),
        other => panic!("expected Done(Cancelled), got {other:?}"),
    }
    // Now hold the session with a long request and fill the one queue place.
    let busy = submit(&sched, request(&lm, "Count from one to a thousand:", 300));
    assert!(
        matches!(busy.recv_timeout(Duration::from_secs(60)), Ok(Event::Text(_))),
        "busy is generating"
    );
    let queued = submit(&sched, request(&lm, "Hello", 2));
    let third = sched.submit(request(&lm, "Hi", 2), Box::new(|_| true), CancelToken::new());
    assert!(matches!(third, Err(SubmitError::QueueFull(1))), "got {third:?}");
    assert_eq!(sched.metrics().requests_rejected.load(Ordering::Relaxed), 1);
    drop(busy); // its sink now fails: the scheduler cancels it at the next piece of text
    let (_, c) = collect(&queued);
    assert_eq!(c.tokens.len(), 2);
    let m = sched.metrics();
    assert_eq!(m.busy_sessions.load(Ordering::Relaxed), 0);
    assert_eq!(m.queue_depth.load(Ordering::Relaxed), 0);
    assert_eq!(m.requests_cancelled.load(Ordering::Relaxed), 2);
}

/// A request that shows in `queue_depth` already holds its queue place: a later request cannot
/// take it (the server's 429 test relies on this), and concurrent submitters never hold more
/// places than the queue has.
#[test]
fn a_counted_request_holds_its_queue_place_against_later_and_concurrent_ones() {
    let lm = model();
    let sched = Arc::new(Scheduler::start(lm.clone(), config(1, 1)).expect("start"));
    // The only session's request blocks the scheduler in its sink until released, so nothing is
    // admitted from the queue while the test runs, however slow the machine.
    let (started_tx, started) = channel();
    let (release, released) = channel::<()>();
    sched
        .submit(
            request(&lm, "Count from one to a thousand:", 400),
            Box::new(move |_| {
                let _ = started_tx.send(());
                let _ = released.recv_timeout(Duration::from_secs(120));
                false
            }),
            CancelToken::new(),
        )
        .expect("busy accepted");
    started
        .recv_timeout(Duration::from_secs(60))
        .expect("busy is generating");
    // One request from another thread; as soon as it is counted, ours must be refused and it
    // must have been accepted.
    let first = {
        let (sched, req) = (sched.clone(), request(&lm, "Hello", 2));
        std::thread::spawn(move || sched.submit(req, Box::new(|_| true), CancelToken::new()))
    };
    let t = std::time::Instant::now();
    while sched.metrics().queue_depth.load(Ordering::Acquire) < 1 {
        assert!(t.elapsed() < Duration::from_secs(30), "the first request never queued");
        std::thread::yield_now();
    }
    let later = sched.submit(request(&lm, "Hi", 2), Box::new(|_| true), CancelToken::new());
    assert!(matches!(later, Err(SubmitError::QueueFull(1))), "got {later:?}");
    assert!(
        first.join().expect("thread").is_ok(),
        "the counted request lost its place"
    );
    // Eight more at once while the place is held: all refused, and the depth stays at 1.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let (sched, req) = (sched.clone(), request(&lm, "Hi", 2));
            std::thread::spawn(move || sched.submit(req, Box::new(|_| true), CancelToken::new()).is_ok())
        })
        .collect();
    let accepted = racers
        .into_iter()
        .map(|h| h.join().expect("racer"))
        .filter(|&ok| ok)
        .count();
    assert_eq!(accepted, 0);
    assert_eq!(sched.metrics().queue_depth.load(Ordering::Acquire), 1);
    assert_eq!(sched.metrics().requests_rejected.load(Ordering::Relaxed), 9);
    drop(release);
}

#[test]
fn extending_a_conversation_reuses_the_session_cache_and_stop_strings_end_early() {
    let lm = model();
    let sched = Scheduler::start(lm.clone(), config(2, 4)).expect("start");
    let first = request(&lm, "The capital of France is", 8);
    let (_, c1) = collect(&submit(&sched, first.clone()));
    // The follow-up prompt extends the first prompt and its answer.
    let mut follow = first.prompt.clone();
    follow.extend_from_slice(&c1.tokens);
    follow.extend(
        lm.tokenizer
            .encode(" And of Italy?")
            .expect("encode")
            .iter()
            .skip(usize::from(lm.tokenizer.adds_bos())),
    );
    let mut req = first.clone();
    req.prompt = follow.clone();
    let (_, c2) = collect(&submit(&sched, req));
    // Everything but the last generated token (never fed) was cached.
    assert_eq!(c2.reused_tokens, first.prompt.len() + c1.tokens.len() - 1);
    // Stop strings: the greedy continuation of this prompt contains " Paris"; stop before it.
    let mut req = request(&lm, "The capital of France is", 16);
    let (full, _) = collect(&submit(&sched, req.clone()));
    let cut = full.find("Paris").expect("the model names Paris");
    req.stream.stop = vec!["Paris".into()];
    let (text, c) = collect(&submit(&sched, req));
    assert_eq!(c.finish, FinishReason::Stop);
    assert_eq!(text, full[..cut]);
}

/// Log-probabilities a stream records are the log-softmax of the model's own logits at each
/// generated position (teacher-forced in one forward here), with the alternatives sorted and the
/// taken token first under greedy decoding.
#[test]
fn recorded_logprobs_are_the_log_softmax_of_the_models_logits() {
    let lm = model();
    let sched = Scheduler::start(lm.clone(), config(1, 4)).expect("start");
    let prompt = lm.tokenizer.encode("The capital of France is").expect("encode");
    let req = Request {
        prompt: prompt.clone(),
        stream: StreamOptions {
            logprobs: Some(5),
            ..StreamOptions::greedy(12)
        },
        speculate: Default::default(),
    };
    let rx = submit(&sched, req);
    let mut recorded = Vec::new();
    let done = loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
            Event::Logprob(lp) => recorded.push(lp),
            Event::Text(_) => {}
            Event::Done(c) => break c,
            Event::Failed(e) => panic!("failed: {e}"),
        }
    };
    assert_eq!(
        recorded.iter().map(|l| l.token).collect::<Vec<_>>(),
        done.tokens,
        "one record per generated token, in order"
    );
    assert!(!recorded.is_empty());
    let mut tokens = prompt.clone();
    tokens.extend_from_slice(&done.tokens[..done.tokens.len() - 1]);
    let mut session = lm.model.new_session(512);
    let out = lm
        .model
        .forward(&mut [StepItem {
            session: &mut session,
            tokens: &tokens,
            logits: LogitsMode::All,
        }])
        .expect("forward");
    let mut worst = 0f64;
    for (i, rec) in recorded.iter().enumerate() {
        let logits = out.lane(prompt.len() - 1 + i);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let norm = logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
        let want = |id: u32| logits[id as usize] as f64 - max - norm;
        worst = worst.max((f64::from(rec.logprob) - want(rec.token)).abs());
        assert_eq!(rec.top.len(), 5);
        assert_eq!(rec.top[0].0, rec.token, "greedy takes the most likely token");
        assert!(rec.top.windows(2).all(|w| w[0].1 >= w[1].1), "sorted");
        for &(id, lp) in &rec.top {
            worst = worst.max((f64::from(lp) - want(id)).abs());
        }
    }
    println!("largest |recorded - teacher-forced log p|: {worst:.2e}");
    assert!(worst < 1e-4, "recorded log-probabilities differ by up to {worst}");
}

/// A request's generated tokens and the bits of their log-probabilities.
type Answer = (Vec<u32>, Vec<u32>);

/// What `requests`, submitted together to a fresh scheduler with prefix sharing on or off, give:
/// each answer's tokens and log-probability bits, then the prompt tokens prefilled, the prefix
/// copies and the tokens they saved.
fn run_together(
    lm: &Arc<LoadedModel>,
    cfg: &SchedulerConfig,
    share: bool,
    requests: &[Request],
) -> (Vec<Answer>, u64, u64, u64) {
    let cfg = SchedulerConfig {
        share_prefixes: share,
        ..cfg.clone()
    };
    let sched = Scheduler::start(lm.clone(), cfg).expect("start");
    let rxs: Vec<_> = requests.iter().map(|r| submit(&sched, r.clone())).collect();
    let answers = rxs.iter().map(tokens_and_logprob_bits).collect();
    let m = sched.metrics();
    (
        answers,
        m.prompt_tokens_total.load(Ordering::Relaxed),
        m.prefix_hits_total.load(Ordering::Relaxed),
        m.prefix_tokens_saved_total.load(Ordering::Relaxed),
    )
}

/// Four concurrent requests sharing a ~1,000-token prefix: with prefix sharing the prefix is
/// prefilled once (three copies, counted in the metrics) and every answer — tokens and their
/// log-probabilities, bit for bit — is what it is without sharing.
#[test]
fn concurrent_requests_sharing_a_long_prefix_prefill_it_once_and_answer_the_same() {
    let lm = model();
    let prefix = "You are a careful assistant for a library. Follow the house rules: be brief, cite the shelf, \
                  never invent a title, prefer paper books to e-books, and answer in English. "
        .repeat(28);
    let questions = [
        "Where are the atlases?",
        "Who wrote Emma?",
        "Is there a café?",
        "When do you close?",
    ];
    let requests: Vec<Request> = questions
        .iter()
        .map(|q| {
            let mut req = request(&lm, &format!("{prefix}\nQuestion: {q}\nAnswer:"), 12);
            req.stream.logprobs = Some(0);
            req
        })
        .collect();
    let cfg = SchedulerConfig {
        ctx_size: 2048,
        prefill_chunk: 128,
        max_step_tokens: 256,
        ..config(4, 8)
    };
    let prefix_len = lm.tokenizer.encode(&prefix).expect("encode").len() as u64;
    assert!(prefix_len > 900, "the shared prefix has {prefix_len} tokens");
    let (alone, prefilled_alone, hits_alone, _) = run_together(&lm, &cfg, false, &requests);
    let (shared, prefilled_shared, hits, saved) = run_together(&lm, &cfg, true, &requests);
    assert_eq!(hits_alone, 0);
    assert_eq!(
        shared, alone,
        "answers and log-probabilities with and without prefix sharing"
    );
    assert_eq!(hits, 3, "three requests copy the first one's prefix");
    assert!(saved >= 3 * (prefix_len - 64), "saved {saved} of 3 × {prefix_len}");
    assert_eq!(
        prefilled_shared + saved,
        prefilled_alone,
        "every saved token is one not prefilled"
    );
}

/// The same on a hybrid model (the tiny random-weight Qwen3.5 fixture in llama.cpp's GGUF
/// layout): the recurrent state can only be copied where it was saved, so the first request
/// checkpoints at the shared length for the others. Prompts are token ids.
#[test]
fn a_hybrid_model_shares_a_prefix_through_a_checkpoint_and_answers_the_same() {
    let fixture = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3_5_text.gguf");
    let lm = Arc::new(load_model(&fixture, &CpuBackend::new(), &mut |_, _| {}).expect("Qwen3.5 fixture"));
    let vocab = lm.model.info().vocab_size as u32;
    let prefix: Vec<u32> = (0..150u32).map(|i| 3 + (i * 7) % (vocab - 3)).collect();
    let requests: Vec<Request> = (0..4u32)
        .map(|q| {
            let mut prompt = prefix.clone();
            prompt.extend((0..6).map(|j| 3 + (q * 11 + j * 5) % (vocab - 3)));
            let stream = StreamOptions {
                ignore_eos: true,
                logprobs: Some(0),
                ..StreamOptions::greedy(8)
            };
            Request {
                prompt,
                stream,
                speculate: Default::default(),
            }
        })
        .collect();
    let cfg = SchedulerConfig {
        ctx_size: 256,
        prefill_chunk: 64,
        max_step_tokens: 128,
        ..config(4, 8)
    };
    let (alone, _, _, _) = run_together(&lm, &cfg, false, &requests);
    let (shared, _, hits, saved) = run_together(&lm, &cfg, true, &requests);
    assert_eq!(
        shared, alone,
        "answers and log-probabilities with and without prefix sharing"
    );
    assert_eq!(hits, 3, "three requests copy the first one's checkpointed prefix");
    assert_eq!(saved, 3 * 150, "each copies exactly the 150 shared positions");
}

/// Under a memory budget idle sessions give their cache back, least recently used first, and a
/// later request then prefills what it would otherwise have reused.
#[test]
fn a_cache_budget_releases_idle_sessions() {
    let lm = model();
    let conversation = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is";
    let run = |budget: Option<usize>| {
        let sched = Scheduler::start(
            lm.clone(),
            SchedulerConfig {
                cache_mem: budget,
                ..config(2, 4)
            },
        )
        .expect("start");
        let (_, first) = collect(&submit(&sched, request(&lm, conversation, 4)));
        let mut again = lm.tokenizer.encode(conversation).expect("encode");
        again.extend(&first.tokens);
        again.extend(lm.tokenizer.encode(" and of Portugal").expect("encode"));
        let req = Request {
            prompt: again,
            stream: StreamOptions::greedy(2),
            speculate: Default::default(),
        };
        let (_, second) = collect(&submit(&sched, req));
        let m = sched.metrics();
        // The step that finished the request stores its figures just after sending `Done`.
        let t = std::time::Instant::now();
        while budget.is_some()
            && m.session_cache_bytes.load(Ordering::Relaxed) >= 64 * 1024
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        (
            second.reused_tokens,
            m.cache_evictions_total.load(Ordering::Relaxed),
            m.session_cache_bytes.load(Ordering::Relaxed),
        )
    };
    let (reused, evictions, _) = run(None);
    assert!(reused > 10, "without a budget the conversation is reused ({reused})");
    assert_eq!(evictions, 0);
    let (reused, evictions, kept) = run(Some(1));
    assert_eq!(reused, 0, "with a 1-byte budget nothing idle is kept");
    assert!(evictions >= 1);
    assert!(kept < 64 * 1024, "idle caches released: {kept} bytes kept");
}

#[test]
fn concurrent_constrained_streams_take_the_tokens_of_masking_every_step_alone() {
    let lm = model();
    let grammar = anelm_engine::Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"]
    }));
    let constrained = |prompt: &str, mask_every_step: bool| {
        let mut c = lm.constraint(&grammar).expect("compiles");
        if mask_every_step {
            c.mask_every_step();
        }
        Request {
            prompt: lm.tokenizer.encode(prompt).expect("encode"),
            stream: StreamOptions {
                constraint: Some(c),
                ..StreamOptions::greedy(40)
            },
            speculate: Default::default(),
        }
    };
    let prompts = &PROMPTS[..4];
    // Alone, the full mask at every step.
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| run_alone(&lm, &constrained(p, true))).collect();
    // Together: the four streams' grammar work runs in parallel on the kernel pool, each
    // checking its greedy draw before computing a mask.
    let sched = Scheduler::start(lm.clone(), config(4, 8)).expect("start");
    let rxs: Vec<_> = prompts.iter().map(|p| submit(&sched, constrained(p, false))).collect();
    for (i, rx) in rxs.iter().enumerate() {
        let (_, done) = collect(rx);
        assert_eq!(done.tokens, alone[i], "{:?}", prompts[i]);
    }
    let m = sched.metrics();
    let steps = m.constrained_steps_total.load(Ordering::Relaxed);
    let masks = m.constraint_masks_total.load(Ordering::Relaxed);
    let generated: usize = alone.iter().map(Vec::len).sum();
    assert!(steps >= generated as u64, "steps {steps}, tokens {generated}");
    assert!(masks > 0 && masks < steps, "masks {masks} of {steps} steps");
}
