//! Speculative decoding by prompt lookup gives the output decoding without it gives: greedy and
//! seeded sampling, on SmolLM2 (GGUF, attention only), the tiny Gemma 3 fixture (sliding-window
//! rings that must rewind) and the tiny Qwen3.5 fixture (DeltaNet state that must roll back), with
//! drafts both accepted and rejected along the way. The session afterwards holds what a plain run
//! leaves, so the next turn reuses it the same way. The scheduler behind `anelm serve` does the
//! same with speculating and plain streams batched in one step.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use anelm_ane::{EmuAne, WeightMode};
use anelm_engine::default_model::default_model_location;
use anelm_engine::{
    AneBackend, AneOptions, CancelToken, CpuBackend, DraftConfig, DraftModel, Drafter, Drafting, Event,
    GenerateOptions, LanguageModel, LoadedModel, LookupOptions, Request, SamplerParams, Scheduler, SchedulerConfig,
    Session, Speculation, StreamOptions, generate, generate_with_drafter, load_model, load_model_weights,
};
use anelm_model::tokenizer::Tokenizer;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

/// A prompt that repeats itself, so lookup finds drafts, in the model's vocabulary.
fn repetitive_prompt(vocab: usize) -> Vec<u32> {
    let phrase: Vec<u32> = (0..12u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) % vocab as u32)
        .collect();
    let mut p = Vec::new();
    for r in 0..4u32 {
        p.extend_from_slice(&phrase);
        p.push((r * 7 + 3) % vocab as u32);
    }
    p
}

struct Run {
    tokens: Vec<u32>,
    session: Vec<u32>,
    passes: usize,
    drafted: usize,
    accepted: usize,
}

/// Drafts the reference continuation with one token in each draft made wrong, at a position
/// that moves from pass to pass (and some passes all right), so every depth of rollback runs.
struct Forced {
    truth: Vec<u32>,
    vocab: u32,
    calls: usize,
}

impl Drafter for Forced {
    fn draft(&mut self, history: &[u32], limit: usize) -> anelm_engine::Result<Vec<u32>> {
        assert_eq!(history, &self.truth[..history.len()], "the stream left the reference");
        let limit = limit.min(6);
        let from = history.len().min(self.truth.len());
        let mut d = self.truth[from..(from + limit).min(self.truth.len())].to_vec();
        let wrong = self.calls % (limit + 2);
        if let Some(t) = d.get_mut(wrong) {
            *t = (*t + 1) % self.vocab;
        }
        self.calls += 1;
        Ok(d)
    }
}

fn options(sampler: SamplerParams, speculate: Option<LookupOptions>) -> GenerateOptions {
    GenerateOptions {
        stream: StreamOptions {
            sampler,
            ignore_eos: true,
            ..StreamOptions::greedy(48)
        },
        prefill_chunk: 16,
        speculate,
    }
}

/// Generate after `prompt` in a fresh session, with `drafter` when given.
fn decode(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    drafter: Option<&mut dyn Drafter>,
) -> Run {
    let mut session: Session = model.new_session(256);
    let (tokens, stats) = match drafter {
        Some(d) => generate_with_drafter(model, tokenizer, &mut session, prompt, opts, d, &mut |_| true),
        None => generate(model, tokenizer, &mut session, prompt, opts, &mut |_| true),
    }
    .expect("generate");
    Run {
        tokens,
        session: session.tokens().to_vec(),
        passes: stats.speculation.passes,
        drafted: stats.speculation.drafted,
        accepted: stats.speculation.accepted,
    }
}

/// 48 tokens after `prompt` with `sampler` (end-of-generation ignored).
fn run(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    sampler: SamplerParams,
    speculate: Option<LookupOptions>,
    forced: Option<&mut Forced>,
) -> Run {
    let out = decode(
        model,
        tokenizer,
        prompt,
        &options(sampler, speculate),
        forced.map(|f| f as &mut dyn Drafter),
    );
    assert_eq!(out.tokens.len(), 48);
    out
}

/// Submit every request to `sched`; one event receiver each.
fn submit_all(sched: &Scheduler, requests: &[Request]) -> Vec<Receiver<Event>> {
    requests
        .iter()
        .map(|r| {
            let (tx, rx) = channel();
            sched
                .submit(r.clone(), Box::new(move |e| tx.send(e).is_ok()), CancelToken::new())
                .expect("accepted");
            rx
        })
        .collect()
}

/// A request's generated tokens and the log-probabilities it streamed.
fn tokens_and_logprobs(rx: &Receiver<Event>, what: &str) -> (Vec<u32>, Vec<f32>) {
    let mut logprobs = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(300)).expect("an event") {
            Event::Logprob(l) => logprobs.push(l.logprob),
            Event::Text(_) => {}
            Event::Done(c) => return (c.tokens, logprobs),
            Event::Failed(e) => panic!("{what} failed: {e}"),
        }
    }
}

fn check(name: &str, model: &dyn LanguageModel, tokenizer: &Tokenizer, prompt: &[u32]) {
    let lookup = LookupOptions {
        draft_tokens: 5,
        max_ngram: 2,
        min_ngram: 1,
    };
    let samplers = [
        ("greedy", SamplerParams::greedy()),
        (
            "sampled",
            SamplerParams {
                temperature: 0.9,
                seed: 7,
                ..SamplerParams::default()
            },
        ),
    ];
    for (kind, sampler) in samplers {
        let plain = run(model, tokenizer, prompt, sampler.clone(), None, None);
        assert_eq!(plain.drafted, 0);
        assert_eq!(plain.passes, 47, "{name}: one pass per token after the first");
        let mut forced = Forced {
            truth: [prompt, &plain.tokens].concat(),
            vocab: model.info().vocab_size as u32,
            calls: 0,
        };
        for (how, fast) in [
            (
                "lookup",
                run(model, tokenizer, prompt, sampler.clone(), Some(lookup), None),
            ),
            (
                "forced",
                run(model, tokenizer, prompt, sampler.clone(), None, Some(&mut forced)),
            ),
        ] {
            println!(
                "{name} {kind} {how}: {} passes for 48 tokens, {} of {} drafts accepted",
                fast.passes, fast.accepted, fast.drafted
            );
            assert_eq!(
                plain.tokens, fast.tokens,
                "{name} {kind} {how}: speculation changed the output"
            );
            assert_eq!(
                plain.session, fast.session,
                "{name} {kind} {how}: the sessions differ afterwards"
            );
            assert_eq!(
                fast.passes + fast.accepted,
                plain.passes,
                "{name} {kind} {how}: every pass yields one token plus its accepted drafts"
            );
            if how == "forced" {
                // Drafts kept (fewer passes) and drafts rolled back, at every depth.
                assert!(fast.accepted > 10, "{name} {kind}: too few forced drafts accepted");
                assert!(
                    fast.drafted - fast.accepted > 10,
                    "{name} {kind}: too few forced drafts rejected"
                );
            }
        }
    }
}

#[test]
fn lookup_speculation_keeps_the_output_of_plain_decoding() {
    anelm_kernels::pool::init_global(2);
    let backend = CpuBackend::new();
    let smollm2 = default_model_location().expect("a home directory");
    assert!(smollm2.is_file(), "default model missing at {}", smollm2.display());
    let lm = load_model(&smollm2, &backend, &mut |_, _| {}).expect("load SmolLM2");
    let prompt = lm
        .tokenizer
        .encode("Copy this list exactly: apples, pears, plums, apples, pears, plums, apples, pears, plums, apples,")
        .expect("encode");
    check("smollm2", lm.model.as_ref(), &lm.tokenizer, &prompt);
    // The fixtures carry no tokenizer: SmolLM2's decodes their ids (all below 512) and its
    // end-of-generation ids (0 and 2) are masked by ignore_eos as usual.
    for name in ["gemma3", "qwen3_5", "lfm2"] {
        let model = load_model_weights(&fixture(name), &backend, &mut |_, _| {}).expect("load fixture");
        let vocab = model.info().vocab_size;
        check(name, model.as_ref(), &lm.tokenizer, &repetitive_prompt(vocab));
    }
}

/// Through the scheduler: three requests batched in one step's lanes — the server's default
/// speculation, speculation off, and a request's own lookup options with seeded sampling — each
/// give the tokens plain single-stream decoding gives, with one (finite, non-positive)
/// log-probability per token, and the metrics add up (every token came from a prefill's last row, a decode pass, or an
/// accepted draft).
fn check_scheduler(name: &str, lm: Arc<LoadedModel>, prompts: [&str; 2], min_accepted: u64) {
    let cfg = SchedulerConfig {
        sessions: 3,
        ctx_size: 512,
        prefill_chunk: 16,
        threads: 2,
        speculate: Some(Drafting::Lookup(LookupOptions::default())),
        ..SchedulerConfig::default()
    };
    let sampled = SamplerParams {
        temperature: 0.8,
        seed: 9,
        ..SamplerParams::default()
    };
    let request = |prompt: &str, sampler: SamplerParams, speculate: Speculation| {
        scheduler_request(&lm, prompt, sampler, speculate)
    };
    let own = LookupOptions {
        draft_tokens: 3,
        max_ngram: 2,
        min_ngram: 1,
    };
    let requests = [
        request(prompts[0], SamplerParams::greedy(), Speculation::ServerDefault),
        request(prompts[0], SamplerParams::greedy(), Speculation::Off),
        request(prompts[1], sampled, Speculation::Lookup(own)),
    ];
    check_requests(name, &lm, cfg, &requests, min_accepted);
}

/// A scheduler request of 40 tokens after `prompt` (end-of-generation ignored, two
/// log-probabilities per token).
fn scheduler_request(lm: &LoadedModel, prompt: &str, sampler: SamplerParams, speculate: Speculation) -> Request {
    Request {
        prompt: lm.tokenizer.encode(prompt).expect("encode"),
        stream: StreamOptions {
            sampler,
            ignore_eos: true,
            logprobs: Some(2),
            ..StreamOptions::greedy(40)
        },
        speculate,
    }
}

/// Run `requests` through a scheduler with `cfg`: each gives the tokens plain single-stream
/// decoding gives, with one log-probability per token, and the metrics add up.
fn check_requests(name: &str, lm: &Arc<LoadedModel>, cfg: SchedulerConfig, requests: &[Request], min_accepted: u64) {
    let sched = Scheduler::start(lm.clone(), cfg).expect("start");
    let receivers = submit_all(&sched, requests);
    for (k, (req, rx)) in requests.iter().zip(&receivers).enumerate() {
        let (tokens, logprobs) = tokens_and_logprobs(rx, &format!("{name} request {k}"));
        let opts = GenerateOptions {
            stream: req.stream.clone(),
            prefill_chunk: 16,
            speculate: None,
        };
        let plain = decode(lm.model.as_ref(), &lm.tokenizer, &req.prompt, &opts, None);
        assert_eq!(
            tokens, plain.tokens,
            "{name} request {k}: the scheduler's tokens differ from plain decoding"
        );
        assert_eq!(logprobs.len(), tokens.len());
        assert!(logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
    }
    let m = sched.metrics();
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let (drafted, accepted) = (get(&m.draft_tokens_total), get(&m.draft_accepted_total));
    println!(
        "{name}: {} tokens in {} decode passes, {accepted} of {drafted} drafts accepted",
        get(&m.generated_tokens_total),
        get(&m.decode_passes_total)
    );
    assert!(drafted > 0, "{name}: nothing was drafted");
    assert!(accepted >= min_accepted, "{name}: {accepted} drafts accepted");
    assert_eq!(
        get(&m.generated_tokens_total),
        requests.len() as u64 + get(&m.decode_passes_total) + accepted,
        "{name}: tokens = one per prefill + one per decode pass + accepted drafts"
    );
}

#[test]
fn the_scheduler_speculates_without_changing_any_answer() {
    anelm_kernels::pool::init_global(2);
    let smollm2 = default_model_location().expect("a home directory");
    let lm = Arc::new(load_model(&smollm2, &CpuBackend::new(), &mut |_, _| {}).expect("load SmolLM2"));
    check_scheduler(
        "smollm2",
        lm,
        [
            "Copy this list exactly: apples, pears, plums, apples, pears, plums, apples, pears,",
            "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat",
        ],
        10,
    );
    let qwen35 = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3_5_text.gguf");
    let lm = Arc::new(load_model(&qwen35, &CpuBackend::new(), &mut |_, _| {}).expect("load the Qwen3.5 fixture"));
    check_scheduler(
        "qwen3_5",
        lm,
        [
            "one two three one two three one two three one two",
            "a b a b a b a b a b a b a",
        ],
        0,
    );
}

/// The scheduler's draft model: requests drafting with it (the server's default, and a request's
/// own choice with seeded sampling) batched beside a plain request and a lookup one give the
/// tokens plain decoding gives — with SmolLM2 drafting for itself (nearly every draft kept), the
/// tiny Llama fixture drafting for SmolLM2 (ids of a 512-token vocabulary: nearly all rejected),
/// and the Qwen3.5 fixture drafting for itself (a hybrid draft session returning to its
/// checkpoint). A request for a draft model the scheduler does not have fails, saying so.
#[test]
fn the_scheduler_drafts_with_a_draft_model_without_changing_any_answer() {
    anelm_kernels::pool::init_global(2);
    let backend = CpuBackend::new();
    let load = |path: &std::path::Path| load_model(path, &backend, &mut |_, _| {}).expect("load");
    let smollm2 = default_model_location().expect("a home directory");
    let qwen35 = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3_5_text.gguf");
    let tiny_llama: Arc<dyn LanguageModel> =
        Arc::from(load_model_weights(&fixture("llama"), &backend, &mut |_, _| {}).expect("load the Llama fixture"));
    /// A name, the target, the draft model, two prompts, the fewest drafts kept.
    type Case<'a> = (&'a str, &'a std::path::Path, Arc<dyn LanguageModel>, [&'a str; 2], u64);
    let cases: [Case<'_>; 3] = [
        (
            "smollm2 drafted by itself",
            &smollm2,
            Arc::from(load(&smollm2).model),
            [
                "Copy this list exactly: apples, pears, plums, apples, pears, plums, apples, pears,",
                "Write a short story about a lighthouse keeper who finds a message in a bottle.",
            ],
            // The greedy request's 39 decoded tokens come nearly all from accepted drafts.
            30,
        ),
        (
            "smollm2 drafted by the tiny llama",
            &smollm2,
            tiny_llama,
            [
                "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat",
                "List three colours:",
            ],
            0,
        ),
        (
            "qwen3_5 drafted by itself",
            &qwen35,
            Arc::from(load(&qwen35).model),
            [
                "one two three one two three one two three one two",
                "a b a b a b a b a b a b a",
            ],
            30,
        ),
    ];
    for (name, target, draft, prompts, min_accepted) in cases {
        let lm = Arc::new(load(target));
        let cfg = SchedulerConfig {
            sessions: 4,
            ctx_size: 512,
            prefill_chunk: 16,
            threads: 2,
            speculate: Some(Drafting::Model),
            draft_model: Some(DraftConfig {
                model: draft,
                draft_tokens: 6,
            }),
            ..SchedulerConfig::default()
        };
        let request = |prompt: &str, sampler: SamplerParams, speculate: Speculation| {
            scheduler_request(&lm, prompt, sampler, speculate)
        };
        let sampled = SamplerParams {
            temperature: 0.8,
            seed: 5,
            ..SamplerParams::default()
        };
        let requests = [
            request(prompts[0], SamplerParams::greedy(), Speculation::ServerDefault),
            request(prompts[0], SamplerParams::greedy(), Speculation::Off),
            request(prompts[1], sampled, Speculation::Model),
            request(
                prompts[1],
                SamplerParams::greedy(),
                Speculation::Lookup(LookupOptions::default()),
            ),
        ];
        check_requests(name, &lm, cfg, &requests, min_accepted);
    }
    // Without a draft model, a request asking for one is refused; the server default cannot be one.
    let lm = Arc::new(load(&qwen35));
    let sched = Scheduler::start(lm.clone(), SchedulerConfig::default()).expect("start");
    let req = Request {
        prompt: lm.tokenizer.encode("a b a b").expect("encode"),
        stream: StreamOptions::greedy(4),
        speculate: Speculation::Model,
    };
    let rx = submit_all(&sched, std::slice::from_ref(&req)).remove(0);
    match rx.recv_timeout(Duration::from_secs(60)).expect("an event") {
        Event::Failed(e) => assert!(e.contains("no draft model"), "{e}"),
        other => panic!("a request for a missing draft model was served: {other:?}"),
    }
    let no_draft = SchedulerConfig {
        speculate: Some(Drafting::Model),
        ..SchedulerConfig::default()
    };
    let err = Scheduler::start(lm, no_draft).err().expect("refused").to_string();
    assert!(err.contains("draft model"), "{err}");
}

/// The same on the emulated Neural Engine (every matmul a lowered fp16 program, a speculative
/// pass's drafts as lanes of its dispatches): the tiny Llama, Gemma 3 and Qwen3.5 fixtures.
#[test]
fn lookup_speculation_keeps_the_output_on_the_emulated_neural_engine() {
    anelm_kernels::pool::init_global(2);
    let smollm2 = default_model_location().expect("a home directory");
    let tokenizer = load_model(&smollm2, &CpuBackend::new(), &mut |_, _| {})
        .expect("load SmolLM2")
        .tokenizer;
    for name in ["llama", "gemma3", "qwen3_5", "lfm2"] {
        let backend = AneBackend::new(
            Arc::new(EmuAne::default()),
            AneOptions {
                weights: WeightMode::Fp16,
                ..AneOptions::default()
            },
        );
        let model = load_model_weights(&fixture(name), &backend, &mut |_, _| {}).expect("load fixture on ane-emu");
        let vocab = model.info().vocab_size;
        check(
            &format!("{name} (ane-emu)"),
            model.as_ref(),
            &tokenizer,
            &repetitive_prompt(vocab),
        );
    }
}

/// Counts the forward passes of the model it wraps.
struct Counting<'m> {
    inner: &'m dyn LanguageModel,
    passes: std::sync::atomic::AtomicUsize,
}

impl LanguageModel for Counting<'_> {
    fn info(&self) -> &anelm_engine::ModelInfo {
        self.inner.info()
    }
    fn new_session(&self, ctx_size: usize) -> Session {
        self.inner.new_session(ctx_size)
    }
    fn forward_with_cost(
        &self,
        items: &mut [anelm_engine::StepItem<'_>],
    ) -> anelm_engine::Result<(anelm_engine::Batch, anelm_engine::ForwardCost)> {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.inner.forward_with_cost(items)
    }
}

/// A Qwen3.5 session rolled back after a pass of five lanes keeps `keep` of them without another
/// forward pass (the DeltaNet state is advanced over the recorded lanes), and the next token's
/// logits are bit for bit those of a session that decoded the kept tokens one at a time.
#[test]
fn a_deltanet_rollback_advances_the_state_without_a_forward_pass() {
    use anelm_engine::speculate::Rollback;
    use anelm_engine::{LogitsMode, StepItem};
    anelm_kernels::pool::init_global(2);
    let inner = load_model_weights(&fixture("qwen3_5"), &CpuBackend::new(), &mut |_, _| {}).expect("load");
    let model = Counting {
        inner: inner.as_ref(),
        passes: Default::default(),
    };
    let run = |session: &mut Session, tokens: &[u32]| -> Vec<u32> {
        let mut items = [StepItem {
            session,
            tokens,
            logits: LogitsMode::Last,
        }];
        model
            .forward(&mut items)
            .expect("forward")
            .lane(0)
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let prompt = repetitive_prompt(512);
    let pass = [17u32, 230, 5, 99, 402];
    for keep in 1..pass.len() {
        let mut one_by_one = model.new_session(128);
        run(&mut one_by_one, &prompt);
        for &t in &pass[..keep] {
            run(&mut one_by_one, &[t]);
        }
        let mut speculative = model.new_session(128);
        run(&mut speculative, &prompt);
        let rollback = Rollback::before(&mut speculative);
        run(&mut speculative, &pass);
        let before = model.passes.load(Ordering::Relaxed);
        rollback.keep(&model, &mut speculative, keep).expect("rollback");
        assert_eq!(
            model.passes.load(Ordering::Relaxed),
            before,
            "keep {keep}: a forward pass ran again"
        );
        assert_eq!(speculative.tokens(), one_by_one.tokens());
        assert!(
            run(&mut speculative, &[7]) == run(&mut one_by_one, &[7]),
            "keep {keep}: the next logits differ from decoding one token at a time"
        );
    }
}

/// A draft model's greedy continuation, verified by the target: the same greedy and sampled
/// output as without speculation, with the draft being the target itself (nearly every draft
/// kept) or another model over the same vocabulary (most rejected; a hybrid Qwen3.5 draft
/// returns to its checkpoint after each rejection).
#[test]
fn a_draft_model_keeps_the_output_of_plain_decoding() {
    anelm_kernels::pool::init_global(2);
    let backend = CpuBackend::new();
    let smollm2 = default_model_location().expect("a home directory");
    let tokenizer = load_model(&smollm2, &backend, &mut |_, _| {})
        .expect("load SmolLM2")
        .tokenizer;
    let load = |name: &str| load_model_weights(&fixture(name), &backend, &mut |_, _| {}).expect("load fixture");
    let (llama, qwen35, gemma3) = (load("llama"), load("qwen3_5"), load("gemma3"));
    let prompt = repetitive_prompt(512);
    let sampled = SamplerParams {
        temperature: 0.9,
        seed: 11,
        ..SamplerParams::default()
    };
    for (target_name, target) in [("llama", &llama), ("gemma3", &gemma3)] {
        for (draft_name, draft) in [("itself", target), ("qwen3_5", &qwen35), ("llama", &llama)] {
            for (kind, sampler) in [("greedy", SamplerParams::greedy()), ("sampled", sampled.clone())] {
                let plain = run(target.as_ref(), &tokenizer, &prompt, sampler.clone(), None, None);
                let mut drafter = DraftModel::new(draft.as_ref(), 256, target.info().vocab_size, 8);
                let s = decode(
                    target.as_ref(),
                    &tokenizer,
                    &prompt,
                    &options(sampler, None),
                    Some(&mut drafter),
                );
                println!(
                    "{target_name} drafted by {draft_name}, {kind}: {} passes, {} of {} drafts kept",
                    s.passes, s.accepted, s.drafted
                );
                assert_eq!(s.tokens, plain.tokens, "{target_name} drafted by {draft_name}, {kind}");
                assert_eq!(s.session, plain.session, "{target_name}/{draft_name}: sessions");
                assert_eq!(s.passes + s.accepted, plain.passes);
                if draft_name == "itself" && kind == "greedy" {
                    assert!(s.passes <= 47 / 9 + 1, "8 drafts a pass: {} passes", s.passes);
                    assert!(
                        s.accepted * 10 >= s.drafted * 9,
                        "the target drafting for itself kept only {} of {}",
                        s.accepted,
                        s.drafted
                    );
                }
            }
        }
    }
}

/// Under a grammar (a JSON schema) speculation keeps the output too, in `generate` and in the
/// scheduler, where two constrained streams take the parallel grammar path (`Stream::prepare`
/// on a speculative pass's first row) beside a plain one.
#[test]
fn speculation_under_a_grammar_keeps_the_output() {
    anelm_kernels::pool::init_global(2);
    let smollm2 = default_model_location().expect("a home directory");
    let lm = Arc::new(load_model(&smollm2, &CpuBackend::new(), &mut |_, _| {}).expect("load SmolLM2"));
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "maxItems": 6}},
        "required": ["fruits"],
        "additionalProperties": false
    });
    let grammar = anelm_engine::Grammar::JsonSchema(schema);
    let prompt = lm
        .tokenizer
        .encode(
            "List the fruits as JSON: apples, pears, plums. {\"fruits\": [\"apples\", \"pears\", \"plums\"]} Again:",
        )
        .expect("encode");
    let stream = |sampler: SamplerParams| StreamOptions {
        sampler,
        constraint: Some(lm.constraint(&grammar).expect("the schema compiles")),
        ..StreamOptions::greedy(40)
    };
    let samplers = [
        SamplerParams::greedy(),
        SamplerParams {
            temperature: 0.7,
            seed: 3,
            ..SamplerParams::default()
        },
    ];
    let lookup = LookupOptions::default();
    let mut expected = Vec::new();
    for sampler in &samplers {
        let mut outputs = Vec::new();
        for speculate in [None, Some(lookup)] {
            let opts = GenerateOptions {
                stream: stream(sampler.clone()),
                prefill_chunk: 32,
                speculate,
            };
            let out = decode(lm.model.as_ref(), &lm.tokenizer, &prompt, &opts, None);
            println!(
                "grammar, speculate {}: {} tokens, {} of {} drafts kept",
                speculate.is_some(),
                out.tokens.len(),
                out.accepted,
                out.drafted
            );
            outputs.push(out.tokens);
        }
        assert_eq!(outputs[0], outputs[1], "speculation changed a constrained output");
        let text = lm.tokenizer.decode(&outputs[0]).expect("decode");
        serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        expected.push(outputs.swap_remove(0));
    }
    // The scheduler: both constrained requests speculate, a plain one rides along.
    let cfg = SchedulerConfig {
        sessions: 3,
        ctx_size: 256,
        prefill_chunk: 16,
        threads: 2,
        speculate: Some(Drafting::Lookup(lookup)),
        ..SchedulerConfig::default()
    };
    let sched = Scheduler::start(lm.clone(), cfg).expect("start");
    let mut reqs: Vec<Request> = samplers
        .iter()
        .map(|s| Request {
            prompt: prompt.clone(),
            stream: stream(s.clone()),
            speculate: Speculation::ServerDefault,
        })
        .collect();
    reqs.push(Request {
        prompt: prompt.clone(),
        stream: StreamOptions::greedy(20),
        speculate: Speculation::Off,
    });
    let rxs = submit_all(&sched, &reqs);
    for (k, rx) in rxs.iter().enumerate().take(samplers.len()) {
        let (tokens, _) = tokens_and_logprobs(rx, &format!("request {k}"));
        assert_eq!(tokens, expected[k], "scheduler request {k} under a grammar");
    }
    assert!(sched.metrics().draft_tokens_total.load(Ordering::Relaxed) > 0);
}
