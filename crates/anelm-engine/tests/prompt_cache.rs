//! The on-disk prompt cache through the scheduler, on the tiny random-weight fixtures: a Llama
//! (`tests/fixtures/hf/llama`, with the Qwen3.5 fixture's tokenizer for the stream's text) and
//! the hybrid Qwen3.5 (`tests/fixtures/gguf/qwen3_5_text.gguf`). A prefix restored after a
//! restart (a new `PromptCache` on the same directory and a new scheduler) gives the same greedy
//! tokens, and the same log-probabilities bit for bit, as computing it afresh; and whatever bytes sit
//! in an entry file, the cache never panics and never uses them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anelm_engine::prompt_cache_file::{EXTENSION, file_name, final_crc, header_bytes};
use anelm_engine::{
    CancelToken, CpuBackend, Event, LoadedModel, ModelIdentity, ModelSource, PromptCache, PromptCacheOptions, Request,
    Scheduler, SchedulerConfig, StreamOptions, load_model, load_model_weights,
};
use anelm_model::chat_template::ChatTemplate;
use proptest::prelude::*;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn qwen35() -> Arc<LoadedModel> {
    let path = fixtures().join("gguf/qwen3_5_text.gguf");
    Arc::new(load_model(&path, &CpuBackend::new(), &mut |_, _| {}).expect("Qwen3.5 fixture"))
}

/// The Llama fixture's weights (no tokenizer of its own) with the Qwen3.5 fixture's tokenizer
/// (the same 512-token vocabulary size), so the scheduler can stream text.
fn llama() -> Arc<LoadedModel> {
    let dir = fixtures().join("hf/llama");
    let model = load_model_weights(&dir, &CpuBackend::new(), &mut |_, _| {}).expect("Llama fixture");
    let LoadedModel { tokenizer, .. } = load_model(
        &fixtures().join("gguf/qwen3_5_text.gguf"),
        &CpuBackend::new(),
        &mut |_, _| {},
    )
    .expect("tokenizer");
    assert_eq!(model.info().vocab_size, 512);
    Arc::new(LoadedModel {
        model,
        tokenizer,
        template: ChatTemplate::fallback(),
        has_own_template: false,
        source: ModelSource::SafetensorsDir(dir),
        constraint_factory: OnceLock::new(),
    })
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "anelm-pc-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MIN_TOKENS: usize = 64;

fn open_cache(dir: &Path, lm: &LoadedModel) -> Arc<PromptCache> {
    open_cache_with(dir, lm, true)
}

/// The cache for `lm` under `dir`, saving whole prompts or only shared prefixes.
fn open_cache_with(dir: &Path, lm: &LoadedModel, save_prompts: bool) -> Arc<PromptCache> {
    let key = ModelIdentity::of(lm)
        .expect("identity")
        .with("backend", "cpu")
        .with("ctx", 256);
    let opts = PromptCacheOptions {
        max_bytes: 64 << 20,
        min_tokens: MIN_TOKENS,
        queue: 8,
        save_prompts,
    };
    Arc::new(PromptCache::open(dir, key, opts).expect("open the prompt cache"))
}

fn config(cache: Option<Arc<PromptCache>>) -> SchedulerConfig {
    SchedulerConfig {
        sessions: 2,
        queue: 8,
        ctx_size: 256,
        prefill_chunk: 64,
        max_step_tokens: 128,
        threads: 2,
        share_prefixes: true,
        cache_mem: None,
        prompt_cache: cache,
        speculate: None,
        draft_model: None,
    }
}

/// Token ids 3.. of a deterministic pseudo-random sequence.
fn ids(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 7 + seed * 131 + i * i * 3) % 509)
        .collect()
}

fn request(prompt: Vec<u32>) -> Request {
    request_for(prompt, 8)
}

/// A greedy request for `tokens` generated tokens, recording log-probabilities.
fn request_for(prompt: Vec<u32>, tokens: usize) -> Request {
    Request {
        prompt,
        stream: StreamOptions {
            ignore_eos: true,
            logprobs: Some(0),
            ..StreamOptions::greedy(tokens)
        },
        speculate: Default::default(),
    }
}

/// Generated tokens and the bits of their log-probabilities.
type Answer = (Vec<u32>, Vec<u32>);

fn submit(s: &Scheduler, req: Request) -> Receiver<Event> {
    let (tx, rx) = channel();
    s.submit(req, Box::new(move |e| tx.send(e).is_ok()), CancelToken::new())
        .expect("accepted");
    rx
}

fn answer(rx: &Receiver<Event>) -> Answer {
    let mut lps = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("an event") {
            Event::Logprob(l) => lps.push(l.logprob.to_bits()),
            Event::Text(_) => {}
            Event::Done(c) => return (c.tokens, lps),
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
}

/// Each request alone, one after another, on a fresh scheduler; with its cache flushed after
/// each so the next one can find what it wrote.
fn run(lm: &Arc<LoadedModel>, cache: Option<Arc<PromptCache>>, requests: &[Vec<u32>]) -> Vec<Answer> {
    let sched = Scheduler::start(lm.clone(), config(cache.clone())).expect("start");
    requests
        .iter()
        .map(|p| {
            let a = answer(&submit(&sched, request(p.clone())));
            if let Some(c) = &cache {
                c.flush();
            }
            a
        })
        .collect()
}

/// A 150-token prompt, then its continuation (the prompt, an answer, a new question), through a
/// cache written by one scheduler and read by a new cache and scheduler on the same directory.
fn a_restored_prefix_answers_like_a_cold_run(lm: &Arc<LoadedModel>, tag: &str) {
    let dir = TempDir::new(tag);
    let first = ids(1, 150);
    let mut follow = first.clone();
    follow.extend(ids(2, 20));
    let cold = run(lm, None, &[first.clone(), follow.clone()]);

    // Warm-up process: computes the first prompt and saves it (less its last token).
    let cache = open_cache(&dir.0, lm);
    let written = run(lm, Some(cache.clone()), std::slice::from_ref(&first));
    let s = cache.stats();
    assert_eq!(s.hits, 0);
    assert!(s.writes >= 1 && s.entries >= 1, "{s:?}");
    assert!(cache.contains(&first[..149]));
    drop(cache);

    // After a restart: a new cache on the same directory, a new scheduler.
    let cache = open_cache(&dir.0, lm);
    assert_eq!(cache.longest_prefix(&first, 149), Some(149));
    let sched = Scheduler::start(lm.clone(), config(Some(cache.clone()))).expect("start");
    let again = answer(&submit(&sched, request(first.clone())));
    let m = sched.metrics();
    assert_eq!(cache.stats().hits, 1);
    assert_eq!(cache.stats().tokens_restored, 149);
    assert_eq!(
        m.prompt_tokens_total.load(Ordering::Relaxed),
        1,
        "only the last token prefilled"
    );
    assert!(cache.stats().bytes > 0);
    assert_eq!(
        again, written[0],
        "{tag}: restored state gives the saved run's tokens and logits bit for bit"
    );
    assert_eq!(
        again.0, cold[0].0,
        "{tag}: greedy tokens as computing the prefix afresh"
    );
    drop(sched);

    // A continuation on yet another scheduler: restores the first prompt's prefix (or, where
    // it can, more) and prefills the rest.
    let sched = Scheduler::start(lm.clone(), config(Some(cache.clone()))).expect("start");
    let cont = answer(&submit(&sched, request(follow.clone())));
    let m = sched.metrics();
    assert_eq!(cache.stats().hits, 2);
    assert!(m.prompt_tokens_total.load(Ordering::Relaxed) <= (follow.len() - 149) as u64);
    assert_eq!(cont.0, cold[1].0, "{tag}: continuation after a restored prefix");
    // The rows are computed alone whatever the chunking, so the logits are bit-equal too.
    assert_eq!(
        again.1, cold[0].1,
        "{tag}: log-probabilities bit for bit as the cold run"
    );
    assert_eq!(cont.1, cold[1].1, "{tag}: continuation log-probabilities bit for bit");
}

#[test]
fn llama_restored_prefix_after_a_restart_answers_like_a_cold_run() {
    a_restored_prefix_answers_like_a_cold_run(&llama(), "llama");
}

#[test]
fn qwen35_restored_prefix_after_a_restart_answers_like_a_cold_run() {
    a_restored_prefix_answers_like_a_cold_run(&qwen35(), "qwen35");
}

/// Two concurrent requests sharing a 120-token prefix, with whole prompts not saved: the shared
/// prefix alone is (for the hybrid model, at the checkpoint the copy used), and after a restart
/// a third prompt with the same prefix and another question restores it.
fn a_shared_prefix_is_saved_and_serves_a_new_question(lm: &Arc<LoadedModel>, tag: &str) {
    let dir = TempDir::new(tag);
    let prefix = ids(5, 120);
    let ask = |q: u32| {
        let mut p = prefix.clone();
        p.extend(ids(100 + q, 12));
        p
    };
    let cache = open_cache_with(&dir.0, lm, false);
    {
        let sched = Scheduler::start(lm.clone(), config(Some(cache.clone()))).expect("start");
        // The first request generates long enough to be still running when the second comes
        // (were it done, the second would take its slot and session: a reuse, not a share).
        let rxs: Vec<_> = [(ask(1), 96), (ask(2), 8)]
            .into_iter()
            .map(|(p, n)| submit(&sched, request_for(p, n)))
            .collect();
        rxs.iter().for_each(|rx| {
            answer(rx);
        });
        assert!(sched.metrics().prefix_hits_total.load(Ordering::Relaxed) >= 1);
    }
    cache.flush();
    assert!(cache.contains(&prefix), "{tag}: the shared prefix is stored");
    assert_eq!(cache.stats().entries, 1, "{tag}: and nothing else");
    drop(cache);
    let cold = run(lm, None, &[ask(3)]);
    let cache = open_cache_with(&dir.0, lm, false);
    let warm = run(lm, Some(cache.clone()), &[ask(3)]);
    let s = cache.stats();
    assert_eq!(s.hits, 1, "{tag}: {s:?}");
    assert!(s.tokens_restored >= 120, "{tag}: {s:?}");
    assert_eq!(
        warm[0], cold[0],
        "{tag}: tokens and log-probabilities as computing the prefix afresh"
    );
}

#[test]
fn llama_shared_prefix_is_saved_and_restored_for_a_new_question() {
    a_shared_prefix_is_saved_and_serves_a_new_question(&llama(), "llama-shared");
}

#[test]
fn qwen35_shared_prefix_is_saved_and_restored_for_a_new_question() {
    a_shared_prefix_is_saved_and_serves_a_new_question(&qwen35(), "qwen35-shared");
}

/// An entry written for another model identity (here: the other fixture) is discarded when a
/// cache for this model opens the directory, and never used.
#[test]
fn an_entry_of_another_model_is_discarded() {
    let dir = TempDir::new("foreign");
    let (qwen, llama) = (qwen35(), llama());
    let prompt = ids(9, 100);
    let cache = open_cache(&dir.0, &qwen);
    run(&qwen, Some(cache.clone()), std::slice::from_ref(&prompt));
    assert!(cache.stats().entries >= 1);
    drop(cache);
    let cache = open_cache(&dir.0, &llama);
    let s = cache.stats();
    assert_eq!(s.entries, 0);
    assert!(s.discarded >= 1);
    let sched = Scheduler::start(llama.clone(), config(Some(cache.clone()))).expect("start");
    answer(&submit(&sched, request(prompt)));
    assert_eq!(cache.stats().hits, 0);
}

/// A torn entry (the end of its write never landed) is discarded at open, and one with a flipped
/// byte when it is about to be used; either way the prompt is prefilled and answers as cold.
#[test]
fn torn_and_corrupted_entries_are_discarded_and_the_prompt_prefilled() {
    let lm = qwen35();
    for damage in ["torn", "flipped"] {
        let dir = TempDir::new(damage);
        let prompt = ids(11, 120);
        let cold = run(&lm, None, std::slice::from_ref(&prompt));
        let cache = open_cache(&dir.0, &lm);
        run(&lm, Some(cache.clone()), std::slice::from_ref(&prompt));
        assert_eq!(cache.stats().entries, 1);
        drop(cache);
        let file = std::fs::read_dir(&dir.0)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .find(|p| p.extension().is_some_and(|e| e == EXTENSION))
            .expect("the entry file");
        let mut bytes = std::fs::read(&file).expect("read");
        if damage == "torn" {
            bytes.truncate(bytes.len() * 2 / 3);
        } else {
            let at = bytes.len() * 2 / 3;
            bytes[at] ^= 0x01;
        }
        std::fs::write(&file, &bytes).expect("write");
        let cache = open_cache(&dir.0, &lm);
        let warm = run(&lm, Some(cache.clone()), std::slice::from_ref(&prompt));
        let s = cache.stats();
        assert_eq!((s.hits, s.discarded), (0, 1), "{damage}: {s:?}");
        assert_eq!(warm, cold, "{damage}: prefilled afresh");
        cache.flush();
        assert_eq!(cache.stats().entries, 1, "{damage}: written again");
    }
}

/// The Qwen3.5 fixture and a cache on a directory of its own, shared by the proptest cases.
fn shared_qwen() -> &'static Arc<LoadedModel> {
    static LM: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    LM.get_or_init(qwen35)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever bytes an entry file holds, opening the cache never panics and deletes it.
    #[test]
    fn arbitrary_bytes_as_an_entry_file_are_discarded(bytes in proptest::collection::vec(any::<u8>(), 0..2048), valid_prefix in any::<bool>()) {
        let dir = TempDir::new("fuzz-file");
        std::fs::create_dir_all(&dir.0).unwrap();
        let mut content = if valid_prefix { b"ANELM-PC\x01\0\0\0".to_vec() } else { Vec::new() };
        content.extend(&bytes);
        let f = dir.0.join(format!("0123456789abcdef.{EXTENSION}"));
        std::fs::write(&f, &content).unwrap();
        let cache = PromptCache::open(&dir.0, b"key", PromptCacheOptions::default()).unwrap();
        prop_assert_eq!(cache.stats().entries, 0);
        prop_assert_eq!(cache.stats().discarded, 1);
        prop_assert!(!f.exists());
    }

    /// An entry whose header and checksums are valid but whose payload is arbitrary bytes is
    /// refused by the session when used, deleted, and leaves the session as it was.
    #[test]
    fn arbitrary_state_behind_valid_checksums_is_refused_when_used(payload in proptest::collection::vec(any::<u8>(), 0..4096), snp in any::<bool>(), layers in 0u64..=32) {
        let lm = shared_qwen();
        let dir = TempDir::new("fuzz-payload");
        std::fs::create_dir_all(&dir.0).unwrap();
        let key = b"key";
        let tokens = ids(3, 80);
        // With `snp`, a state that passes the snapshot's own first checks (magic, the prefix
        // length of the entry, a plausible layer count), so the hostile bytes reach the layers'
        // decoders.
        let mut body = Vec::new();
        if snp {
            body.extend(b"SNP1");
            body.extend(80u64.to_le_bytes());
            body.extend(layers.to_le_bytes());
        }
        body.extend(&payload);
        let header = header_bytes(key, &tokens, false, body.len());
        let mut file = header.clone();
        file.extend(&body);
        file.extend(final_crc(&header, &body).to_le_bytes());
        let path = dir.0.join(file_name(key, &tokens));
        std::fs::write(&path, &file).unwrap();
        let opts = PromptCacheOptions { min_tokens: 16, ..PromptCacheOptions::default() };
        let cache = PromptCache::open(&dir.0, key, opts).unwrap();
        prop_assert_eq!(cache.stats().entries, 1, "a valid header is indexed");
        let mut session = lm.model.new_session(256);
        let mut prompt = tokens.clone();
        prompt.push(7);
        prop_assert_eq!(cache.restore_into(&mut session, &prompt, 80, 0), None);
        prop_assert!(session.is_empty());
        prop_assert_eq!(cache.stats().discarded, 1);
        prop_assert!(!path.exists());
    }
}
