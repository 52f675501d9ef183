//! Behaviour of the sampler: each parameter demonstrably does what it says.

use anelm_engine::sampler::{Sampler, SamplerError, SamplerParams, argmax};

/// Parameters with every filter and penalty off, at temperature `t`.
fn plain(t: f32) -> SamplerParams {
    SamplerParams {
        temperature: t,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        penalty_last_n: 64,
        seed: 1,
        logit_bias: Vec::new(),
    }
}

fn sampler(p: SamplerParams) -> Sampler {
    Sampler::new(p).unwrap_or_else(|e| panic!("valid params rejected: {e}"))
}

fn draw(s: &mut Sampler, logits: &[f32], history: &[u32]) -> u32 {
    s.sample(logits, history)
        .unwrap_or_else(|e| panic!("sample failed: {e}"))
}

/// Counts of each token over `n` draws.
fn histogram(p: SamplerParams, logits: &[f32], n: usize) -> Vec<usize> {
    let mut s = sampler(p);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        let t = draw(&mut s, logits, &[]) as usize;
        assert!(t < logits.len(), "token {t} out of range");
        counts[t] += 1;
    }
    counts
}

/// Deterministic pseudo-random logits for tests (independent of the sampler's RNG).
fn test_logits(n: usize, salt: u64) -> Vec<f32> {
    let mut x = salt.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 20.0 - 10.0
        })
        .collect()
}

fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let m = logits.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
    let e: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

// ---------------------------------------------------------------- greedy

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    let mut s = sampler(SamplerParams::greedy());
    assert_eq!(draw(&mut s, &[0.1, 2.0, -3.0, 2.0, 1.9], &[]), 1);
    assert_eq!(draw(&mut s, &[5.0, 5.0, 5.0], &[]), 0);
    for salt in 1..20 {
        let l = test_logits(300, salt);
        let want = argmax(&l).map(|i| i as u32);
        assert_eq!(Some(draw(&mut s, &l, &[])), want);
        // Independent check: nothing is larger, nothing earlier is equal.
        let best = draw(&mut s, &l, &[]) as usize;
        assert!(l.iter().all(|&x| x <= l[best]));
        assert!(l[..best].iter().all(|&x| x < l[best]));
    }
}

#[test]
fn tiny_temperature_is_greedy() {
    let l = [0.0, 1.0, 0.99];
    let mut s = sampler(plain(1e-7));
    for _ in 0..200 {
        assert_eq!(draw(&mut s, &l, &[]), 1);
    }
}

#[test]
fn greedy_ignores_seed_and_filters() {
    for salt in 1..10 {
        let l = test_logits(100, salt);
        let mut a = sampler(SamplerParams {
            seed: 1,
            ..SamplerParams::greedy()
        });
        let mut b = sampler(SamplerParams {
            seed: 999,
            top_k: 3,
            top_p: 0.1,
            min_p: 0.9,
            temperature: 0.0,
            ..SamplerParams::default()
        });
        assert_eq!(draw(&mut a, &l, &[]), draw(&mut b, &l, &[]));
    }
}

// ---------------------------------------------------------------- seeds

#[test]
fn same_seed_same_sequence_different_seed_different_sequence() {
    let l = test_logits(50, 3).iter().map(|x| x / 4.0).collect::<Vec<_>>();
    let run = |seed| {
        let mut s = sampler(SamplerParams { seed, ..plain(1.0) });
        (0..1000).map(|_| draw(&mut s, &l, &[])).collect::<Vec<_>>()
    };
    let a = run(42);
    assert_eq!(a, run(42));
    let b = run(43);
    assert_ne!(a, b);
    // The sequences differ in many places, not just one.
    let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert!(differing > 100, "only {differing} draws differ");
}

// ---------------------------------------------------------------- temperature

fn check_frequencies(t: f32) {
    let logits = [1.0f32, 0.3, -0.4, -1.2];
    let n = 20_000;
    let counts = histogram(plain(t), &logits, n);
    let want = softmax(&logits, t as f64);
    let at_one = softmax(&logits, 1.0);
    for (i, (&c, &p)) in counts.iter().zip(&want).enumerate() {
        let freq = c as f64 / n as f64;
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (freq - p).abs() < 5.0 * sigma,
            "T={t} token {i}: frequency {freq:.4} vs softmax {p:.4} (5σ = {:.4})",
            5.0 * sigma
        );
    }
    // The bound is tight enough to tell T apart from 1.
    assert!(
        want.iter().zip(&at_one).any(|(a, b)| (a - b).abs() > 0.05),
        "test logits do not separate T={t} from T=1"
    );
}

#[test]
fn temperature_half_matches_softmax() {
    check_frequencies(0.5);
}

#[test]
fn temperature_two_matches_softmax() {
    check_frequencies(2.0);
}

// ---------------------------------------------------------------- top-k

#[test]
fn top_k_one_is_argmax_even_when_hot() {
    let l = [0.5, 0.2, 0.7, 0.69, -1.0];
    let mut s = sampler(SamplerParams {
        top_k: 1,
        ..plain(100.0)
    });
    for _ in 0..2000 {
        assert_eq!(draw(&mut s, &l, &[]), 2);
    }
}

#[test]
fn top_k_two_never_returns_third_best() {
    let l = [0.5, 0.7, 0.2, 0.69, -1.0];
    let counts = histogram(SamplerParams { top_k: 2, ..plain(5.0) }, &l, 4000);
    assert!(counts[1] > 0 && counts[3] > 0, "both top-2 seen: {counts:?}");
    assert_eq!(counts[0] + counts[2] + counts[4], 0, "{counts:?}");
}

// ---------------------------------------------------------------- top-p

/// Probabilities [0.5, 0.3, 0.15, 0.05] in shuffled id order: id 1 = 0.5, id 3 = 0.3,
/// id 0 = 0.15, id 2 = 0.05.
fn shuffled_probs() -> Vec<f32> {
    [0.15f32, 0.5, 0.05, 0.3].iter().map(|p| p.ln()).collect()
}

#[test]
fn top_p_point_eight_keeps_two_best() {
    let counts = histogram(
        SamplerParams {
            top_p: 0.8,
            ..plain(1.0)
        },
        &shuffled_probs(),
        5000,
    );
    assert!(counts[1] > 0 && counts[3] > 0, "{counts:?}");
    assert_eq!(counts[0] + counts[2], 0, "{counts:?}");
    // Renormalised 0.5 : 0.3 → 0.625.
    let f = counts[1] as f64 / 5000.0;
    assert!((f - 0.625).abs() < 0.035, "{counts:?}");
}

#[test]
fn top_p_point_eight_one_keeps_three_best() {
    let counts = histogram(
        SamplerParams {
            top_p: 0.81,
            ..plain(1.0)
        },
        &shuffled_probs(),
        5000,
    );
    assert!(counts[1] > 0 && counts[3] > 0 && counts[0] > 0, "{counts:?}");
    assert_eq!(counts[2], 0, "{counts:?}");
}

#[test]
fn tiny_top_p_keeps_at_least_one() {
    let mut s = sampler(SamplerParams {
        top_p: 1e-6,
        ..plain(1.0)
    });
    for _ in 0..500 {
        assert_eq!(draw(&mut s, &shuffled_probs(), &[]), 1);
    }
}

#[test]
fn top_p_combined_with_top_k() {
    // top_k=3 keeps ids 1, 3, 0; renormalised probs .526, .316, .158; top_p .8 → 1 and 3.
    let counts = histogram(
        SamplerParams {
            top_k: 3,
            top_p: 0.8,
            ..plain(1.0)
        },
        &shuffled_probs(),
        3000,
    );
    assert!(counts[1] > 0 && counts[3] > 0, "{counts:?}");
    assert_eq!(counts[0] + counts[2], 0, "{counts:?}");
}

// ---------------------------------------------------------------- min-p

#[test]
fn min_p_drops_tokens_below_threshold() {
    // min_p 0.2 → threshold 0.1: only the 0.05 token (id 2) goes.
    let counts = histogram(
        SamplerParams {
            min_p: 0.2,
            ..plain(1.0)
        },
        &shuffled_probs(),
        5000,
    );
    assert!(counts[0] > 0 && counts[1] > 0 && counts[3] > 0, "{counts:?}");
    assert_eq!(counts[2], 0, "{counts:?}");
    // min_p 0.5 → threshold 0.25: only 0.5 (id 1) and 0.3 (id 3) stay.
    let counts = histogram(
        SamplerParams {
            min_p: 0.5,
            ..plain(1.0)
        },
        &shuffled_probs(),
        5000,
    );
    assert!(counts[1] > 0 && counts[3] > 0, "{counts:?}");
    assert_eq!(counts[0] + counts[2], 0, "{counts:?}");
}

// ---------------------------------------------------------------- penalties

fn greedy_with(f: impl FnOnce(&mut SamplerParams)) -> Sampler {
    let mut p = SamplerParams::greedy();
    f(&mut p);
    sampler(p)
}

#[test]
fn repeat_penalty_flips_greedy_choice() {
    let l = [2.0, 1.9, 0.0];
    assert_eq!(draw(&mut greedy_with(|_| {}), &l, &[0]), 0);
    // 2.0 / 1.3 = 1.54 < 1.9.
    let mut s = greedy_with(|p| p.repeat_penalty = 1.3);
    assert_eq!(draw(&mut s, &l, &[0]), 1);
    assert_eq!(draw(&mut s, &l, &[2]), 0, "unseen token is not penalised");
    // Negative logits are multiplied: -1.0 · 1.3 = -1.3 < -1.1.
    assert_eq!(draw(&mut s, &[-1.0, -1.1], &[0]), 1);
    // A penalty below 1 rewards repeats.
    let mut s = greedy_with(|p| p.repeat_penalty = 0.5);
    assert_eq!(draw(&mut s, &[2.0, 3.0], &[0]), 0);
}

#[test]
fn presence_penalty_subtracts_once() {
    let l = [2.0, 1.5];
    let mut s = greedy_with(|p| p.presence_penalty = 0.6);
    assert_eq!(draw(&mut s, &l, &[0]), 1);
    let mut s = greedy_with(|p| p.presence_penalty = 0.4);
    // 2.0 - 0.4 = 1.6 > 1.5, however often the token appeared.
    assert_eq!(draw(&mut s, &l, &[0, 0, 0, 0]), 0);
}

#[test]
fn frequency_penalty_scales_with_count() {
    let l = [2.0, 1.5];
    let mut s = greedy_with(|p| p.frequency_penalty = 0.2);
    assert_eq!(draw(&mut s, &l, &[0]), 0, "2.0 - 0.2 > 1.5");
    assert_eq!(draw(&mut s, &l, &[0, 0, 0]), 1, "2.0 - 0.6 < 1.5");
    assert_eq!(draw(&mut s, &l, &[0, 1, 0, 0]), 0, "2.0 - 0.6 > 1.5 - 0.2");
}

#[test]
fn tokens_older_than_the_window_are_not_penalised() {
    let l = [2.0, 1.9, 0.0, 0.0, 0.0];
    let history = [0, 4, 4, 4];
    for set in [
        (|p: &mut SamplerParams| p.repeat_penalty = 1.3) as fn(&mut SamplerParams),
        |p| p.presence_penalty = 0.5,
        |p| p.frequency_penalty = 0.5,
    ] {
        let mut s = greedy_with(|p| {
            set(p);
            p.penalty_last_n = 3;
        });
        assert_eq!(draw(&mut s, &l, &history), 0, "token 0 is outside the last 3");
        let mut s = greedy_with(|p| {
            set(p);
            p.penalty_last_n = 4;
        });
        assert_eq!(draw(&mut s, &l, &history), 1, "token 0 is inside the last 4");
        let mut s = greedy_with(|p| {
            set(p);
            p.penalty_last_n = 0;
        });
        assert_eq!(draw(&mut s, &l, &history), 0, "last_n 0 disables penalties");
    }
}

#[test]
fn penalties_apply_when_sampling_too() {
    let l = [2.0, 1.9, -5.0];
    let mut s = sampler(SamplerParams {
        top_k: 1,
        repeat_penalty: 1.3,
        ..plain(1.0)
    });
    for _ in 0..200 {
        assert_eq!(draw(&mut s, &l, &[0]), 1);
    }
}

#[test]
fn history_ids_outside_the_vocabulary_are_ignored() {
    let mut s = greedy_with(|p| p.repeat_penalty = 2.0);
    assert_eq!(draw(&mut s, &[1.0, 0.6], &[7, u32::MAX, 0]), 1);
    assert_eq!(draw(&mut s, &[1.0, 0.6], &[7, u32::MAX]), 0);
}

// ---------------------------------------------------------------- validation & bad logits

#[test]
fn validate_rejects_bad_params_naming_the_field() {
    type Set = fn(&mut SamplerParams);
    let cases: [(&str, Set); 14] = [
        ("temperature", |p| p.temperature = f32::NAN),
        ("temperature", |p| p.temperature = -0.1),
        ("temperature", |p| p.temperature = f32::INFINITY),
        ("top_p", |p| p.top_p = 0.0),
        ("top_p", |p| p.top_p = 1.01),
        ("top_p", |p| p.top_p = f32::NAN),
        ("min_p", |p| p.min_p = -0.01),
        ("min_p", |p| p.min_p = 1.5),
        ("min_p", |p| p.min_p = f32::NAN),
        ("repeat_penalty", |p| p.repeat_penalty = 0.0),
        ("repeat_penalty", |p| p.repeat_penalty = f32::NAN),
        ("repeat_penalty", |p| p.repeat_penalty = f32::INFINITY),
        ("presence_penalty", |p| p.presence_penalty = f32::NAN),
        ("frequency_penalty", |p| p.frequency_penalty = f32::NEG_INFINITY),
    ];
    for (field, set) in cases {
        let mut p = SamplerParams::default();
        set(&mut p);
        let err = p.validate().expect_err(field);
        let msg = err.to_string();
        assert!(msg.contains(field), "message {msg:?} does not name {field}");
        assert!(
            matches!(&err, SamplerError::InvalidParam { name, .. } if *name == field),
            "{err:?}"
        );
        assert!(Sampler::new(p).is_err(), "Sampler::new accepted bad {field}");
    }
    // Boundary values are accepted.
    let ok = SamplerParams {
        temperature: 0.0,
        top_p: 1.0,
        min_p: 1.0,
        repeat_penalty: 0.01,
        presence_penalty: -1.0,
        frequency_penalty: 2.0,
        ..SamplerParams::default()
    };
    assert!(ok.validate().is_ok());
}

#[test]
fn nan_logits_are_never_chosen() {
    let l = [f32::NAN, 1.0, f32::NAN, 0.5, f32::INFINITY, f32::NEG_INFINITY];
    assert_eq!(draw(&mut sampler(SamplerParams::greedy()), &l, &[]), 1);
    let counts = histogram(plain(1.0), &l, 2000);
    assert!(counts[1] > 0 && counts[3] > 0, "{counts:?}");
    assert_eq!(counts[0] + counts[2] + counts[4] + counts[5], 0, "{counts:?}");
}

#[test]
fn no_finite_logits_is_an_error() {
    let l = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
    for p in [
        SamplerParams::greedy(),
        SamplerParams::default(),
        SamplerParams {
            repeat_penalty: 1.5,
            ..SamplerParams::greedy()
        },
    ] {
        let r = sampler(p).sample(&l, &[0, 1]);
        assert!(matches!(r, Err(SamplerError::NoFiniteLogits)), "{r:?}");
    }
}

#[test]
fn empty_logits_is_an_error() {
    for p in [SamplerParams::greedy(), SamplerParams::default()] {
        let r = sampler(p).sample(&[], &[1, 2]);
        assert!(matches!(r, Err(SamplerError::EmptyLogits)), "{r:?}");
    }
}

#[test]
fn params_accessor_returns_what_was_given() {
    let p = SamplerParams {
        seed: 77,
        top_k: 5,
        ..SamplerParams::default()
    };
    assert_eq!(sampler(p.clone()).params(), &p);
}
