//! all-MiniLM-L6-v2 against sentence-transformers: the fixture `fixtures/embeddings/minilm.json`
//! (made by scripts/make-embedding-fixtures.sh) holds, for 25 texts (non-ASCII, accents,
//! whitespace-only, three past max_seq_length), the token ids Hugging Face tokenizers gives and
//! the embedding sentence-transformers 6.2 computes on torch CPU in fp32. anelm must give the
//! same ids and an embedding with cosine ≥ 0.9999 to each. The model comes from
//! scripts/fetch-minilm.sh (run by scripts/test.sh).

use std::path::PathBuf;
use std::sync::Arc;

use anelm_engine::backend::Backend;
use anelm_engine::default_model::cache_dir;
use anelm_engine::{CpuBackend, Embedder, EngineError};
use serde_json::Value;

mod common;
use common::{NarrowCpu, cosine, embedding_cases};

const FETCH: &str = "scripts/fetch-minilm.sh";

fn model_dir() -> PathBuf {
    let dir = cache_dir().expect("a home directory").join("models/all-MiniLM-L6-v2");
    assert!(
        Embedder::is_embedding_dir(&dir),
        "{} is missing: run {FETCH} (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/embeddings/minilm.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read the fixture")).expect("fixture JSON")
}

/// The exact CPU backend (f32 weights × f32 activations).
#[test]
fn minilm_matches_sentence_transformers() {
    check_against_fixture(&CpuBackend::new(), "f32");
}

/// The embedding backend (bf16 × bf16 through AVX512_BF16 where the CPU has it; on other CPUs
/// it is the f32 backend again, and the test says so).
#[test]
fn minilm_on_the_bf16_fast_path_matches_sentence_transformers() {
    let backend = CpuBackend::for_embeddings();
    if !backend.bf16() {
        eprintln!("minilm: this CPU has no AVX512_BF16 (or ANELM_BF16=0): the embedding backend is the f32 one");
    }
    check_against_fixture(&backend, if backend.bf16() { "bf16" } else { "f32" });
}

fn check_against_fixture(backend: &dyn Backend, label: &str) {
    let fx = fixture();
    let cases = embedding_cases(&fx["texts"]);
    assert!(cases.len() >= 20, "the fixture should hold at least 20 texts");
    let max = fx["max_seq_length"].as_u64().expect("max_seq_length") as usize;
    assert!(
        cases.iter().filter(|c| c.ids.len() == max).count() >= 2,
        "the fixture should hold texts past max_seq_length"
    );
    let emb = Embedder::load(&model_dir(), backend).expect("load all-MiniLM-L6-v2");
    assert_eq!(emb.info().dimensions, 384);
    assert_eq!(emb.info().max_tokens, max);
    assert!(emb.info().normalize);

    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let ids = emb.tokenize(&texts).expect("tokenize");
    for (c, got) in cases.iter().zip(&ids) {
        assert_eq!(got, &c.ids, "token ids of {:?}", c.text);
    }

    // All texts in one call: one packed forward.
    let got = emb.embed(&texts).expect("embed");
    assert_eq!(got.len(), cases.len());
    let mut worst = (f64::INFINITY, "");
    for (c, v) in cases.iter().zip(&got) {
        let cos = cosine(v, &c.embedding);
        assert!(cos >= 0.9999, "cosine {cos:.7} for {:?}", c.text);
        if cos < worst.0 {
            worst = (cos, &c.text);
        }
        let norm: f64 = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm} for {:?}", c.text);
    }
    eprintln!(
        "minilm ({label}): lowest cosine 1 - {:.2e} ({:?}) over {} texts",
        1.0 - worst.0,
        worst.1,
        cases.len()
    );

    // Alone, each text gives the same vector as packed with the others (attention stays inside
    // each input), and token inputs give what their text gives.
    for (i, text) in texts.iter().enumerate().step_by(4) {
        let alone = emb.embed(&[text]).expect("embed one");
        let cos = cosine(&alone[0], &got[i]);
        assert!(cos > 0.999_999, "text {i} alone vs packed: cosine {cos}");
    }
    let from_ids = emb.embed_tokens(&ids).expect("embed tokens");
    for (i, (a, b)) in from_ids.iter().zip(&got).enumerate() {
        assert!(cosine(a, b) > 0.999_999, "token input {i} differs from its text");
    }
}

#[test]
fn minilm_splits_forwards_and_lanes() {
    let fx = fixture();
    let cases = embedding_cases(&fx["texts"]);
    let narrow = Embedder::load(&model_dir(), &NarrowCpu(CpuBackend::for_embeddings())).expect("load");
    // 250 texts, about 10k tokens: several forwards of TOKENS_PER_FORWARD tokens, each run in
    // 32-lane pieces.
    let texts: Vec<&str> = (0..10).flat_map(|_| cases.iter().map(|c| c.text.as_str())).collect();
    let got = narrow.embed(&texts).expect("embed");
    assert_eq!(got.len(), texts.len());
    for (i, v) in got.iter().enumerate() {
        let c = &cases[i % cases.len()];
        let cos = cosine(v, &c.embedding);
        assert!(cos >= 0.9999, "text {i}: cosine {cos:.7} for {:?}", c.text);
    }
}

#[test]
fn minilm_rejects_bad_token_inputs() {
    let emb = Embedder::load(&model_dir(), &CpuBackend::new()).expect("load");
    let bad = |seqs: Vec<Vec<u32>>| match emb.embed_tokens(&seqs) {
        Err(EngineError::InvalidRequest(m)) => m,
        other => panic!("expected an invalid-request error, got {other:?}"),
    };
    assert!(bad(vec![vec![101, 102], vec![]]).contains("input 1 has no tokens"));
    assert!(bad(vec![vec![101; 257]]).contains("at most 256"));
    assert!(bad(vec![vec![101, 40_000, 102]]).contains("outside the vocabulary"));
    assert!(emb.embed(&[]).expect("no inputs").is_empty());
}

/// The emulated Neural Engine (fp16 weights and activations, 32 tokens per dispatch) against
/// the CPU backend: cosine ≥ 0.999 per text.
#[test]
fn minilm_on_the_emulated_neural_engine_matches_the_cpu() {
    use anelm_ane::EmuAne;
    use anelm_engine::{AneBackend, AneOptions};
    let fx = fixture();
    let cases = embedding_cases(&fx["texts"]);
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let cpu = Embedder::load(&model_dir(), &CpuBackend::new()).expect("load on the CPU");
    let backend = AneBackend::new(Arc::new(EmuAne::default()), AneOptions::default());
    assert_eq!(backend.max_lanes(), 32);
    let ane = Embedder::load(&model_dir(), &backend).expect("load on ane-emu");
    let want = cpu.embed(&texts).expect("embed on the CPU");
    let got = ane.embed(&texts).expect("embed on ane-emu");
    let mut worst = f64::INFINITY;
    for ((a, b), c) in got.iter().zip(&want).zip(&cases) {
        let cos = cosine(a, b);
        assert!(cos >= 0.999, "ane-emu vs cpu: cosine {cos:.6} for {:?}", c.text);
        worst = worst.min(cos);
    }
    eprintln!("minilm: ane-emu vs cpu lowest cosine {worst:.6}");
}

/// `anelm plan`'s encoder model counts what the emulated Neural Engine issues: 32 tokens (one
/// W-lane step) cost `dispatches_per_step` dispatches, 33 tokens two steps' worth.
#[test]
fn the_encoder_plan_counts_the_emulators_dispatches() {
    use anelm_ane::{EmuAne, PlanOptions, plan_encoder};
    use anelm_engine::arch::bert::BertConfig;
    use anelm_engine::{AneBackend, AneOptions};
    let dir = model_dir();
    let hf = anelm_model::hf_config::HfConfig::from_file(&dir.join("config.json")).expect("config.json");
    let c = BertConfig::from_hf(&hf).expect("bert config");
    let dims = c.encoder_dims();
    let plan = plan_encoder(&dims, &PlanOptions::default()).expect("plan");
    let backend = AneBackend::new(Arc::new(EmuAne::default()), AneOptions::default());
    let monitor = backend.monitor();
    let emb = Embedder::load(&dir, &backend).expect("load on ane-emu");
    assert_eq!(
        monitor.stats().programs as usize,
        plan.kernel_count(),
        "programs loaded"
    );
    for (tokens, steps) in [(32usize, 1usize), (33, 2)] {
        monitor.reset_dispatch_stats();
        // [CLS] word × (tokens − 2) [SEP]: one input of exactly `tokens` tokens.
        let mut ids = vec![101u32];
        ids.extend(std::iter::repeat_n(2773u32, tokens - 2));
        ids.push(102);
        emb.embed_tokens(&[ids]).expect("embed");
        assert_eq!(
            monitor.stats().dispatches as usize,
            steps * plan.dispatches_per_step(),
            "{tokens} tokens"
        );
    }
}
