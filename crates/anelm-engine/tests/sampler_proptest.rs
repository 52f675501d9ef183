//! Property test: for any row with at least one finite logit and any valid parameters,
//! `sample` returns an in-range token whose logit is finite, and never panics.

use anelm_engine::sampler::{Sampler, SamplerParams};
use proptest::prelude::*;

fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -50.0f32..50.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => prop_oneof![Just(f32::MAX), Just(f32::MIN), Just(0.0f32), Just(-0.0f32)],
    ]
}

/// A row of logits with at least one finite value at a random position.
fn row() -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(logit(), 0..64),
        -50.0f32..50.0,
        any::<prop::sample::Index>(),
    )
        .prop_map(|(mut v, finite, at)| {
            let i = at.index(v.len() + 1);
            v.insert(i, finite);
            v
        })
}

fn params() -> impl Strategy<Value = SamplerParams> {
    (
        prop_oneof![Just(0.0f32), Just(1e-7f32), 0.01f32..5.0, Just(1e6f32)],
        prop_oneof![Just(0usize), 1usize..80],
        prop_oneof![Just(1.0f32), 0.001f32..1.0],
        prop_oneof![Just(0.0f32), 0.0f32..=1.0],
        prop_oneof![Just(1.0f32), 0.01f32..10.0, Just(1e30f32)],
        -3.0f32..3.0,
        prop_oneof![-3.0f32..3.0, Just(1e38f32), Just(-1e38f32)],
        0usize..100,
        any::<u64>(),
    )
        .prop_map(
            |(temperature, top_k, top_p, min_p, repeat_penalty, presence, frequency, last_n, seed)| SamplerParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repeat_penalty,
                presence_penalty: presence,
                frequency_penalty: frequency,
                penalty_last_n: last_n,
                seed,
                logit_bias: Vec::new(),
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sample_returns_a_finite_in_range_token(
        logits in row(),
        p in params(),
        history in prop::collection::vec(0u32..80, 0..120),
    ) {
        prop_assert!(p.validate().is_ok());
        let mut s = Sampler::new(p).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for _ in 0..3 {
            let t = s.sample(&logits, &history)
                .map_err(|e| TestCaseError::fail(e.to_string()))? as usize;
            prop_assert!(t < logits.len());
            prop_assert!(logits[t].is_finite(), "picked non-finite logit {} at {t}", logits[t]);
        }
    }

    #[test]
    fn greedy_without_penalties_is_argmax(logits in row(), seed in any::<u64>()) {
        let mut s = Sampler::new(SamplerParams { seed, ..SamplerParams::greedy() })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let t = s.sample(&logits, &[]).map_err(|e| TestCaseError::fail(e.to_string()))? as usize;
        let best = logits.iter().copied().filter(|x| x.is_finite()).fold(f32::MIN, f32::max);
        prop_assert_eq!(logits[t], best);
        prop_assert!(logits[..t].iter().all(|&x| x != best));
    }
}

/// A row with ties (values from a small set), non-finite entries and at least one finite value.
fn tied_row() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(
        prop_oneof![
            8 => (-6i32..6).prop_map(|v| v as f32 * 0.5),
            1 => Just(f32::NAN),
            1 => Just(f32::NEG_INFINITY),
            1 => Just(f32::INFINITY),
        ],
        1..400,
    )
    .prop_map(|mut v| {
        v.push(1.25);
        v
    })
}

proptest! {
    /// The fast top-k + top-p path (no penalties, no logit bias) draws exactly what the general
    /// path draws: a logit bias on a token outside the row changes no logit but takes the
    /// general path, and both samplers, seeded alike, must give the same tokens.
    #[test]
    fn the_fast_top_k_path_draws_what_the_general_path_draws(
        logits in tied_row(),
        top_k in 1usize..60,
        top_p in 0.01f32..0.999,
        min_p in prop_oneof![Just(0.0f32), 0.0f32..0.5],
        temperature in 0.05f32..3.0,
        seed in any::<u64>(),
    ) {
        let fast = SamplerParams { temperature, top_k, top_p, min_p, seed, ..SamplerParams::default() };
        let general = SamplerParams { logit_bias: vec![(u32::MAX - 1, 0.0)], ..fast.clone() };
        let (mut a, mut b) = (Sampler::new(fast).unwrap(), Sampler::new(general).unwrap());
        for _ in 0..8 {
            let (x, y) = (a.sample(&logits, &[]), b.sample(&logits, &[]));
            prop_assert_eq!(x.is_ok(), y.is_ok());
            if let (Ok(x), Ok(y)) = (x, y) {
                prop_assert_eq!(x, y);
            }
        }
    }
}
