//! Helpers shared by the real-model tests against llama.cpp's recorded greedy outputs
//! (`fixtures/llamacpp/*-llamacpp-greedy.json` at the repository root): reading the fixture, llama.cpp's top-2
//! log-probabilities, and our teacher-forced logits at llama.cpp's generated positions.
// Each test crate that includes this module uses a subset of it.
#![allow(dead_code)]

use std::path::PathBuf;

use anelm_engine::{
    Batch, GenerateOptions, LanguageModel, LoadedModel, LogitsMode, Session, StepItem, StreamOptions, generate,
};
use serde_json::Value;

/// `fixtures/llamacpp/<name>` at the repository root (made by `scripts/make-llamacpp-fixtures.sh`).
pub fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/llamacpp")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// llama.cpp's `[[id, logprob], [id, logprob]]` per generated position.
pub fn top2(case: &Value) -> Vec<[(u32, f64); 2]> {
    case["top2_logprobs"]
        .as_array()
        .expect("top2")
        .iter()
        .map(|pair| {
            let e = |i: usize| {
                (
                    pair[i][0].as_u64().expect("id") as u32,
                    pair[i][1].as_f64().expect("logprob"),
                )
            };
            [e(0), e(1)]
        })
        .collect()
}

pub fn log_softmax_at(logits: &[f32], id: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[id as usize] as f64 - max - sum.ln()
}

/// Cosine similarity of two equally long vectors, accumulated in f64.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "vector lengths differ");
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// One forward of `sessions`, each fed its own `tokens`: one lane of last-position logits per
/// session.
pub fn forward_last(model: &dyn LanguageModel, sessions: &mut [Session], tokens: &[Vec<u32>]) -> Batch {
    let mut items: Vec<StepItem<'_>> = sessions
        .iter_mut()
        .zip(tokens)
        .map(|(session, t)| StepItem {
            session,
            tokens: t,
            logits: LogitsMode::Last,
        })
        .collect();
    model.forward(&mut items).expect("forward")
}

/// Every position's logits of one fresh session over `tokens`, in one forward.
pub fn all_logits(model: &dyn LanguageModel, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut session = model.new_session(tokens.len() + 1);
    let out = model
        .forward(&mut [StepItem {
            session: &mut session,
            tokens,
            logits: LogitsMode::All,
        }])
        .expect("forward");
    (0..out.lanes()).map(|i| out.lane(i).to_vec()).collect()
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Our logits at each of llama.cpp's generated positions, teacher-forced on its completion in one
/// batched forward.
pub fn teacher_forced(lm: &LoadedModel, case: &Value) -> Vec<Vec<f32>> {
    let prompt_ids = ids(&case["prompt_ids"]);
    let completion = ids(&case["completion_ids"]);
    let mut tokens = prompt_ids.clone();
    tokens.extend_from_slice(&completion[..completion.len() - 1]);
    let mut session = lm.model.new_session(512);
    let out = lm
        .model
        .forward(&mut [StepItem {
            session: &mut session,
            tokens: &tokens,
            logits: LogitsMode::All,
        }])
        .expect("forward");
    (0..completion.len())
        .map(|pos| out.lane(prompt_ids.len() - 1 + pos).to_vec())
        .collect()
}

/// Every fixture prompt tokenizes to llama.cpp's ids, and llama.cpp's completion detokenizes
/// to its text.
pub fn check_tokenization(lm: &LoadedModel, fx: &Value) {
    for case in fx["cases"].as_array().expect("cases") {
        let prompt = case["prompt"].as_str().expect("prompt");
        let got = lm.tokenizer.encode(prompt).expect("encode");
        assert_eq!(got, ids(&case["prompt_ids"]), "tokenization of {prompt:?}");
        // And llama.cpp's completion detokenizes to its text.
        let text = lm.tokenizer.decode(&ids(&case["completion_ids"])).expect("decode");
        assert_eq!(text, case["completion_text"].as_str().expect("text"), "{prompt:?}");
    }
}

/// Free-running greedy decoding reproduces llama.cpp's tokens up to exactly the first position
/// where our batched teacher-forced argmax differs, and that position is a llama.cpp near-tie
/// (its top-two margin below `noise_margin`).
pub fn check_greedy_until_near_tie(lm: &LoadedModel, fx: &Value, noise_margin: f64) {
    for case in fx["cases"].as_array().expect("cases") {
        let prompt = case["prompt"].as_str().expect("prompt");
        let prompt_ids = ids(&case["prompt_ids"]);
        let want = ids(&case["completion_ids"]);
        let reference = top2(case);
        let opts = GenerateOptions {
            stream: StreamOptions {
                ignore_eos: true,
                ..StreamOptions::greedy(want.len())
            },
            prefill_chunk: 128,
            speculate: None,
        };
        let mut session = lm.model.new_session(512);
        let (got, _) = generate(
            lm.model.as_ref(),
            &lm.tokenizer,
            &mut session,
            &prompt_ids,
            &opts,
            &mut |_| true,
        )
        .expect("generate");
        assert_eq!(got.len(), want.len(), "{prompt:?}: generated {} tokens", got.len());
        // llama.cpp ran with ignore_eos (end-of-generation logits masked), so its completion is the
        // argmax over the other tokens; the generation here masks them the same way.
        let stops = lm.tokenizer.stop_ids();
        let first_flip = teacher_forced(lm, case)
            .into_iter()
            .zip(&want)
            .position(|(mut logits, &id)| {
                for &s in stops {
                    logits[s as usize] = f32::NEG_INFINITY;
                }
                argmax(&logits) != id
            })
            .unwrap_or(want.len());
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!("{prompt:?}: identical for {agree} tokens (first teacher-forced flip at {first_flip})");
        assert_eq!(
            agree,
            first_flip,
            "{prompt:?}: free-running decode parted from llama.cpp at {agree}, but the batched \
             teacher-forced pass first disagrees at {first_flip}: got {:?}, want {:?}",
            &got[agree.min(got.len())..],
            &want[agree.min(want.len())..]
        );
        if first_flip < want.len() {
            // llama.cpp's margin between the token it chose and the best other non-stop token.
            let [(id0, a), (_, b)] = reference[first_flip];
            assert_eq!(
                id0, want[first_flip],
                "{prompt:?}: flip at a position where llama.cpp masked its top-1"
            );
            assert!(
                a - b < noise_margin,
                "{prompt:?}: parted from llama.cpp at {first_flip} where its margin is {:.3}",
                a - b
            );
        }
    }
}

/// One text of an embedding fixture: its token ids and the reference embedding.
pub struct EmbeddingCase {
    pub text: String,
    pub ids: Vec<u32>,
    pub embedding: Vec<f32>,
}

/// The cases of an embedding fixture's array (each `{"text", "token_ids", "embedding"}`).
pub fn embedding_cases(cases: &Value) -> Vec<EmbeddingCase> {
    cases
        .as_array()
        .expect("an array of cases")
        .iter()
        .map(|c| EmbeddingCase {
            text: c["text"].as_str().expect("text").to_string(),
            ids: c["token_ids"]
                .as_array()
                .expect("token_ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as u32)
                .collect(),
            embedding: c["embedding"]
                .as_array()
                .expect("embedding")
                .iter()
                .map(|v| v.as_f64().expect("value") as f32)
                .collect(),
        })
        .collect()
}

/// `lm` teacher-forced along each case of a llama.cpp greedy fixture: the log-probabilities of
/// llama.cpp's top two within `max_dlogprob` of its own at every generated position, and the
/// same argmax wherever llama.cpp's margin exceeds `noise_margin`. `label` names the model in
/// messages; prints the largest difference.
pub fn check_llamacpp_log_probs(lm: &LoadedModel, fx: &Value, label: &str, max_dlogprob: f64, noise_margin: f64) {
    let mut worst = 0f64;
    for case in fx["cases"].as_array().expect("cases") {
        for (pos, (r, logits)) in top2(case).iter().zip(teacher_forced(lm, case)).enumerate() {
            for &(id, lp) in r {
                let d = (log_softmax_at(&logits, id) - lp).abs();
                worst = worst.max(d);
                assert!(
                    d <= max_dlogprob,
                    "{label} position {pos}: log p({id}) differs from llama.cpp by {d:.2e}"
                );
            }
            let [(id0, a), (_, b)] = *r;
            if a - b > noise_margin {
                assert_eq!(
                    argmax(&logits),
                    id0,
                    "{label} position {pos}: argmax differs where llama.cpp's margin is {:.3}",
                    a - b
                );
            }
        }
    }
    println!("{label}: largest |Δ log p| against llama.cpp: {worst:.2e}");
}

/// `emb` against a sentence-transformers reference: the same token ids for every text, each
/// text's embedding in one batch within cosine 0.9999 of the reference, and each text embedded
/// alone equal to its batched embedding (cosine > 1 − 1e-6). `label` names the model and the
/// text set in messages; prints the lowest cosine.
pub fn check_embedder(emb: &anelm_engine::Embedder, cases: &[EmbeddingCase], label: &str) {
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let ids = emb.tokenize(&texts).expect("tokenize");
    for (c, got) in cases.iter().zip(&ids) {
        assert_eq!(got, &c.ids, "{label}: token ids of {:?}", c.text);
    }
    let batch = emb.embed(&texts).expect("embed the batch");
    let mut worst = 1f64;
    for (i, (c, v)) in cases.iter().zip(&batch).enumerate() {
        let cos = cosine(v, &c.embedding);
        assert!(cos >= 0.9999, "{label}: cosine {cos:.7} for text {i} {:?}", c.text);
        worst = worst.min(cos);
        let alone = emb.embed(&[c.text.as_str()]).expect("embed alone");
        let same = cosine(&alone[0], v);
        assert!(same > 0.999_999, "{label}: text {i} alone vs in the batch: {same}");
    }
    eprintln!(
        "{label}: lowest cosine 1 - {:.2e} over {} texts",
        1.0 - worst,
        cases.len()
    );
}

/// An embedding model's GGUF (`tests/fixtures/gguf/<file>`) against the sentence-transformers
/// reference of the same weights: the embedder loads from the file, is the architecture and
/// width given, pools by mean, and embeds each reference text's token ids to cosine ≥ 0.9999.
/// Prints the lowest cosine.
pub fn check_gguf_embedder(file: &str, cases: &[EmbeddingCase], architecture: &str, dimensions: usize) {
    use anelm_engine::{CpuBackend, Embedder};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(file);
    assert!(
        Embedder::is_embedding_model(&path),
        "{file}: a GGUF with a pooling type is an embedding model"
    );
    let emb = Embedder::load(&path, &CpuBackend::new()).expect("load the GGUF");
    let info = emb.info();
    assert_eq!(info.architecture, architecture);
    assert_eq!(info.dimensions, dimensions);
    assert_eq!(info.pooling, [anelm_engine::pooling::PoolingMode::Mean]);
    let ids: Vec<Vec<u32>> = cases.iter().map(|c| c.ids.clone()).collect();
    let got = emb.embed_tokens(&ids).expect("embed the reference ids");
    let mut worst = 1f64;
    for (i, (c, v)) in cases.iter().zip(&got).enumerate() {
        let cos = cosine(v, &c.embedding);
        assert!(cos >= 0.9999, "{file}: cosine {cos:.7} for text {i} {:?}", c.text);
        worst = worst.min(cos);
    }
    eprintln!(
        "{file}: lowest cosine 1 - {:.2e} over {} texts",
        1.0 - worst,
        cases.len()
    );
}

/// The CPU backend with the Neural Engine's 32-lane dispatches, so a model's splitting of a
/// forward into backend-sized pieces is exercised.
pub struct NarrowCpu(pub anelm_engine::CpuBackend);

impl anelm_engine::backend::Backend for NarrowCpu {
    fn name(&self) -> &str {
        "cpu-32"
    }
    fn max_lanes(&self) -> usize {
        32
    }
    fn compile(
        &self,
        spec: &anelm_engine::backend::KernelSpec,
        weights: &std::sync::Arc<dyn anelm_model::tensor_store::TensorStore>,
    ) -> anelm_engine::Result<Box<dyn anelm_engine::backend::Kernel>> {
        self.0.compile(spec, weights)
    }
}

/// A JSON array of rows of numbers (a fixture's logits) as f32 rows.
pub fn matrix(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("logit rows")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("logit row")
                .iter()
                .map(|x| x.as_f64().expect("logit") as f32)
                .collect()
        })
        .collect()
}

/// The shape of a tiny Llama written by [`write_llama_gguf`].
pub struct TinyLlama {
    pub hidden: usize,
    pub ffn: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
}

/// One tensor for [`write_llama_gguf`]: name, rows (1 for a vector), columns, ggml type id, bytes.
pub type GgufTensor = (String, usize, usize, u32, Vec<u8>);

/// A GGUF file (version 3) of a Llama with `shape`'s metadata (RoPE base 10000, RMSNorm ε 1e-5,
/// context 256) and `tensors`, each 32-byte aligned.
pub fn write_llama_gguf(path: &std::path::Path, shape: &TinyLlama, tensors: &[GgufTensor]) {
    fn put_str(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }
    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    let kv_u32: [(&str, u32); 7] = [
        ("llama.embedding_length", shape.hidden as u32),
        ("llama.feed_forward_length", shape.ffn as u32),
        ("llama.block_count", shape.layers as u32),
        ("llama.attention.head_count", shape.heads as u32),
        ("llama.attention.head_count_kv", shape.kv_heads as u32),
        ("llama.context_length", 256),
        ("llama.vocab_size", shape.vocab as u32),
    ];
    let kv_f32: [(&str, f32); 2] = [
        ("llama.rope.freq_base", 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", 1e-5),
    ];
    b.extend(((kv_u32.len() + kv_f32.len() + 1) as u64).to_le_bytes());
    put_str(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    put_str(&mut b, "llama");
    for (k, v) in kv_u32 {
        put_str(&mut b, k);
        b.extend(4u32.to_le_bytes());
        b.extend(v.to_le_bytes());
    }
    for (k, v) in kv_f32 {
        put_str(&mut b, k);
        b.extend(6u32.to_le_bytes());
        b.extend(v.to_le_bytes());
    }
    let mut data = Vec::new();
    for (name, rows, cols, ggml_type, bytes) in tensors {
        put_str(&mut b, name);
        let dims: Vec<u64> = if *rows == 1 {
            vec![*cols as u64]
        } else {
            vec![*cols as u64, *rows as u64]
        };
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ggml_type.to_le_bytes());
        b.extend((data.len() as u64).to_le_bytes());
        data.extend(bytes);
        while data.len() % 32 != 0 {
            data.push(0);
        }
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend(data);
    std::fs::write(path, b).expect("write the GGUF");
}
