//! Gemma 3's sliding-window layers keep their keys and values in ring buffers that hold only the
//! window: far past the window, decode through the rings must give the logits of the full
//! computation with the window as a mask, and the session's memory must stay bounded.
//!
//! The tiny transformers fixture (`tests/fixtures/hf/gemma3`, window 6, three local layers and one
//! global) goes past its window within its 32 reference positions, so `hf_transformers.rs` holds
//! the window (as a mask) to transformers; its rings are still larger than 32 positions. Here the
//! sequence is 200 tokens (33 windows), so the rings wrap:
//! - the reference is one forward over all 200 tokens: the rings grow to hold the whole step
//!   (`window − 1 + 200` slots), so nothing is ever dropped and the window acts as a mask only;
//! - one token at a time (rings of `window + REWIND_SLACK` slots, wrapped twice) and uneven chunks
//!   (rings of `window − 1 + chunk + REWIND_SLACK` slots) must agree with it to fp32 summation
//!   noise;
//! - the session holds `window + REWIND_SLACK` positions per local layer and every position per
//!   global one;
//! - rewinding within what the rings hold keeps the session, rewinding past it starts it over,
//!   and both continue correctly.

use std::path::PathBuf;

use anelm_engine::kv_cache::REWIND_SLACK;
use anelm_engine::{CpuBackend, LanguageModel, LogitsMode, Session, StepItem, load_model_weights};
use serde_json::Value;

const LEN: usize = 200;
/// fp32 summation order only (matmul lane tiling); a dropped or misplaced ring row moves logits by
/// percent.
const REL_TOL: f64 = 1e-5;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/gemma3")
}

fn model() -> Box<dyn LanguageModel> {
    load_model_weights(&fixture_dir(), &CpuBackend::new(), &mut |_, _| {}).expect("load the gemma3 fixture")
}

fn config() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("config.json")).expect("config.json");
    serde_json::from_str(&text).expect("config is JSON")
}

/// A fixed pseudo-random token sequence inside the fixture's vocabulary.
fn tokens(vocab: u32) -> Vec<u32> {
    let mut s = 0x2545_f491_u32;
    (0..LEN)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s % vocab
        })
        .collect()
}

fn run(model: &dyn LanguageModel, session: &mut Session, tokens: &[u32]) -> Vec<Vec<f32>> {
    let out = model
        .forward(&mut [StepItem {
            session,
            tokens,
            logits: LogitsMode::All,
        }])
        .expect("forward");
    (0..tokens.len()).map(|i| out.lane(i).to_vec()).collect()
}

/// Max |Δ| over all rows relative to the reference's max |logit|.
fn rel_err(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().flatten().fold(0.0f64, |m, &x| m.max(f64::from(x.abs())));
    let err = got
        .iter()
        .zip(want)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(&x, &y)| f64::from((x - y).abs())))
        .fold(0.0f64, f64::max);
    err / scale
}

#[test]
fn ring_buffers_match_the_masked_full_computation_far_past_the_window() {
    let cfg = config();
    let window = cfg["sliding_window"].as_u64().expect("sliding_window") as usize;
    let layer_types: Vec<&str> = cfg["layer_types"]
        .as_array()
        .expect("layer_types")
        .iter()
        .map(|t| t.as_str().expect("layer type"))
        .collect();
    let kv_dim =
        (cfg["num_key_value_heads"].as_u64().expect("kv heads") * cfg["head_dim"].as_u64().expect("head_dim")) as usize;
    assert!(LEN > 10 * window, "the sequence must go far past the window");
    let model = model();
    let toks = tokens(model.info().vocab_size as u32);

    let mut full = model.new_session(LEN);
    let reference = run(model.as_ref(), &mut full, &toks);

    let mut one = model.new_session(LEN);
    let mut stepped = Vec::new();
    for t in &toks {
        stepped.extend(run(model.as_ref(), &mut one, std::slice::from_ref(t)));
    }
    let e1 = rel_err(&stepped, &reference);
    println!("one token at a time: max rel err {e1:.2e}");
    assert!(e1 <= REL_TOL, "one token at a time: {e1:.2e}");

    // Memory: `window + REWIND_SLACK` positions per local layer, all of them per global layer
    // (k and v, f32).
    let local = layer_types.iter().filter(|t| **t == "sliding_attention").count();
    let global = layer_types.len() - local;
    assert!(local > 0 && global > 0, "the fixture has both layer kinds");
    let ring = window + REWIND_SLACK;
    assert!(LEN > 2 * ring, "the rings must wrap");
    let bounded = 4 * 2 * kv_dim * (local * ring + global * LEN);
    assert_eq!(one.state_bytes(), bounded, "decode-only session bytes");

    let mut chunked = model.new_session(LEN);
    let mut got = Vec::new();
    let mut at = 0;
    for (i, n) in [1usize, 5, 13, 2, 7, 31, 3].iter().cycle().enumerate() {
        if at == LEN {
            break;
        }
        let end = (at + n + i % 2).min(LEN);
        got.extend(run(model.as_ref(), &mut chunked, &toks[at..end]));
        at = end;
    }
    let ec = rel_err(&got, &reference);
    println!("uneven chunks: max rel err {ec:.2e}");
    assert!(ec <= REL_TOL, "uneven chunks: {ec:.2e}");

    // Rewind as far as the rings allow (the slack plus one: the new last position still needs
    // `window − 1` before it): kept, and the continuation is still right.
    let back = LEN - 1 - REWIND_SLACK;
    let mut one_further = one.clone();
    assert_eq!(one.truncate(back), back);
    let again = run(model.as_ref(), &mut one, &toks[back..]);
    let er = rel_err(&again, &reference[back..]);
    assert!(er <= REL_TOL, "after a rewind within the slack: {er:.2e}");
    // One further back needs a position the rings dropped; far back even more: the session
    // starts over (the rings no longer hold that window).
    assert_eq!(
        one_further.truncate(back - 1),
        0,
        "a rewind past the ring must start over"
    );
    assert_eq!(one.truncate(LEN / 2), 0, "a rewind past the ring must start over");
    assert_eq!(one.len(), 0);
    let restart = run(model.as_ref(), &mut one, &toks[..LEN / 2 + 1]);
    let es = rel_err(&restart, &reference[..LEN / 2 + 1]);
    assert!(es <= REL_TOL, "after a restart: {es:.2e}");
}

#[test]
fn cloned_sessions_continue_independently_through_the_rings() {
    let model = model();
    let toks = tokens(model.info().vocab_size as u32);
    let mut full = model.new_session(LEN);
    let reference = run(model.as_ref(), &mut full, &toks);
    let mut a = model.new_session(LEN);
    for t in &toks[..150] {
        run(model.as_ref(), &mut a, std::slice::from_ref(t));
    }
    let mut b = a.clone();
    // `b` decodes a different continuation; `a` must not see it.
    for t in toks[150..170].iter().rev() {
        run(model.as_ref(), &mut b, std::slice::from_ref(t));
    }
    let mut got = Vec::new();
    for t in &toks[150..] {
        got.extend(run(model.as_ref(), &mut a, std::slice::from_ref(t)));
    }
    let e = rel_err(&got, &reference[150..]);
    assert!(e <= REL_TOL, "clone disturbed the original: {e:.2e}");
    // And the clone, cleared, replays the sequence like a fresh session.
    b.clear();
    let replay = run(model.as_ref(), &mut b, &toks);
    let e = rel_err(&replay, &reference);
    assert!(e <= REL_TOL, "cleared clone: {e:.2e}");
}
