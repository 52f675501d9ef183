//! A decode step of several sessions in one forward gives, bit for bit, the logits each session
//! gets alone. With SmolLM2 (9 query heads in groups of 3) and the tiny Qwen3 fixture (QK-norm,
//! groups of 2) on two threads, four lanes take the fused attention path (RoPE, QK-norm and the
//! cache append inside the attention tasks, `Attention::run_decode_fused`) while one lane takes
//! the serial one, so this pins the two paths to each other over several steps (each step reads
//! the rows the previous one wrote).

use std::path::{Path, PathBuf};

use anelm_engine::default_model::default_model_location;
use anelm_engine::{CpuBackend, LanguageModel, Session, load_model_weights};

mod common;

fn tokens(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503)) >> 7) % vocab as u32)
        .collect()
}

fn step(model: &dyn LanguageModel, sessions: &mut [Session], toks: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let out = common::forward_last(model, sessions, toks);
    (0..out.lanes())
        .map(|l| out.lane(l).iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn check(path: &Path) {
    let model = load_model_weights(path, &CpuBackend::new(), &mut |_, _| {}).expect("load");
    let vocab = model.info().vocab_size;
    // Four sessions with prompts of different lengths, each prefilled alone.
    let mut sessions: Vec<Session> = (0..4).map(|_| model.new_session(256)).collect();
    for (i, s) in sessions.iter_mut().enumerate() {
        step(
            model.as_ref(),
            std::slice::from_mut(s),
            &[tokens(i as u32, 3 + 5 * i, vocab)],
        );
    }
    let mut alone = sessions.clone();
    for t in 0..4u32 {
        let next: Vec<Vec<u32>> = (0..4).map(|i| tokens(100 + 10 * t + i, 1, vocab)).collect();
        let batched = step(model.as_ref(), &mut sessions, &next);
        for (i, s) in alone.iter_mut().enumerate() {
            let one = step(model.as_ref(), std::slice::from_mut(s), &next[i..i + 1]);
            assert!(
                one[0] == batched[i],
                "{}: step {t}, session {i}: batched logits differ from the session alone",
                path.display()
            );
        }
    }
}

#[test]
fn four_sessions_decode_together_exactly_as_alone() {
    anelm_kernels::pool::init_global(2);
    let smollm2 = default_model_location().expect("a home directory");
    assert!(smollm2.is_file(), "default model missing at {}", smollm2.display());
    check(&smollm2);
    check(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3"));
}
