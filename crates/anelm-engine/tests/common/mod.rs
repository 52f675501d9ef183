//! Helpers shared by the real-model tests against llama.cpp's recorded greedy outputs
//! (`../shared/fixtures/*-llamacpp-greedy.json`): reading the fixture, llama.cpp's top-2
//! log-probabilities, and our teacher-forced logits at llama.cpp's generated positions.
// Each test crate that includes this module uses a subset of it.
#![allow(dead_code)]

use std::path::PathBuf;

use anelm_engine::{LoadedModel, LogitsMode, StepItem};
use serde_json::Value;

/// `../shared/fixtures/<name>` (the project's read-only fixtures beside the repository).
pub fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
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
