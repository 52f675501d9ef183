//! Load-time quantisation (`--quantize`, `CpuBackend::quantizing`) against Hugging Face
//! transformers: every tiny fp32 fixture of `tests/fixtures/hf/` (see `hf_transformers.rs`)
//! loaded with its matrices re-encoded to Q8_0 (and to Q4_K, which falls back to Q8_0 for the
//! fixtures' 64-wide rows) must stay close to transformers' fp32 logits at every position, and
//! must differ from the unquantised load (so the matrices really were re-encoded).
//!
//! Tolerance, from what was measured (Q8_0 weights and Q8_0 activations each round to 1/254 of a
//! block's largest value):
//! - Llama, Qwen3, Gemma 3: `max |Δlogit| / max |logit| ≤ 3.5e-2` and every position's cosine
//!   ≥ 0.999 (measured 2.25–2.29e-2, cosine ≥ 0.99944);
//! - Qwen3.5 (`qwen3_5_text`, `qwen3_5`): ≤ 0.35 and cosine ≥ 0.93 (measured 0.156 and 0.256,
//!   cosine 0.970 and 0.955). The random DeltaNet layers amplify rounding: every projection
//!   contributes (leaving any one of qkv, z, out unquantised still leaves 10–15 %). This is the
//!   format, not the encoder: on the 0.8B-shaped random Qwen3.5 (scripts/make-qwen35-bench-gguf.sh)
//!   llama.cpp's own `llama-quantize` Q8_0 moves the logits of the F16 file by 0.314 of their
//!   scale (cosine 0.950), `--quantize q8_0` by 0.291 (cosine 0.952).
//!
//! A wrong block layout, scale or row order is off by the whole scale.

mod common;

use std::path::PathBuf;

use anelm_engine::{CpuBackend, LoadQuantization, load_model_weights};
use common::matrix;
use serde_json::Value;

/// (max |Δ| / max |logit|, lowest cosine) allowed for the attention-only fixtures.
const ATTENTION_TOL: (f64, f64) = (3.5e-2, 0.999);
/// The same for the Qwen3.5 fixtures, whose random DeltaNet layers amplify the rounding.
const DELTANET_TOL: (f64, f64) = (0.35, 0.93);

/// max |Δ| over all rows ÷ the reference's largest |logit|, and the lowest row cosine.
fn compare(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f64, f64) {
    assert_eq!(got.len(), want.len(), "row count");
    let scale = want.iter().flatten().fold(0.0f64, |m, &x| m.max(f64::from(x.abs())));
    assert!(scale > 0.0, "reference logits are all zero");
    let mut worst = (0.0f64, 1.0f64);
    for (g, w) in got.iter().zip(want) {
        let d = g
            .iter()
            .zip(w)
            .fold(0.0f64, |m, (&a, &b)| m.max(f64::from((a - b).abs())));
        worst = (worst.0.max(d / scale), worst.1.min(common::cosine(g, w)));
    }
    worst
}

fn check(name: &str, q: LoadQuantization) {
    let (rel_tol, min_cos) = if name.starts_with("qwen3_5") {
        DELTANET_TOL
    } else {
        ATTENTION_TOL
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name);
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let reference: Value = serde_json::from_str(&text).expect("reference.json is JSON");
    let tokens = common::ids(&reference["sequence"]["tokens"]);
    let want = matrix(&reference["sequence"]["logits"]);

    let exact = load_model_weights(&dir, &CpuBackend::new(), &mut |_, _| {}).expect("load");
    let quantized = load_model_weights(&dir, &CpuBackend::quantizing(q), &mut |_, _| {}).expect("load quantised");
    let (exact_err, _) = compare(&common::all_logits(exact.as_ref(), &tokens), &want);
    let (err, cos) = compare(&common::all_logits(quantized.as_ref(), &tokens), &want);
    eprintln!(
        "{name} --quantize {}: max |Δ| / max |logit| = {err:.2e} (unquantised {exact_err:.2e}), lowest cosine {cos:.6}",
        q.name()
    );
    assert!(
        err <= rel_tol && cos >= min_cos,
        "{name} --quantize {}: {err:.3e} of the logit scale (tolerance {rel_tol:e}), cosine {cos:.6} (≥ {min_cos})",
        q.name()
    );
    assert!(
        err > 10.0 * exact_err.max(1e-7),
        "{name} --quantize {}: logits as close as the fp32 load ({err:.2e} vs {exact_err:.2e}): nothing was re-encoded",
        q.name()
    );
}

#[test]
fn q8_0_stays_close_to_transformers() {
    for name in ["llama", "qwen3", "qwen3_5_text", "qwen3_5", "gemma3"] {
        check(name, LoadQuantization::Q8_0);
    }
}

#[test]
fn q4_k_falls_back_to_q8_0_on_narrow_rows() {
    check("qwen3_5_text", LoadQuantization::Q4K);
}
