//! Token sampling: turns one row of logits into the next token of one stream.
//!
//! A [`Sampler`] owns its parameters, its seeded RNG and reusable candidate buffers, so a
//! stream's steady-state sampling does not allocate. The chain it applies is documented on
//! [`Sampler::sample`].

pub mod rng;

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

pub use rng::Rng;

/// Temperatures below this are treated as 0: greedy argmax.
pub const GREEDY_TEMPERATURE: f32 = 1e-6;

/// Slack when comparing cumulative probability mass with `top_p`, so that a prefix whose
/// mass equals `top_p` mathematically (e.g. 0.5 + 0.3 vs 0.8) is not lost to rounding.
const TOP_P_EPSILON: f64 = 1e-6;

/// The seed used when a request does not give one.
pub const DEFAULT_SEED: u64 = 0x5EED;

/// Sampling parameters of one request. Defaults follow llama.cpp's CLI defaults where
/// they exist. Missing fields deserialize to their default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplerParams {
    /// Softmax temperature; 0 (or < 1e-6) means greedy argmax, which is deterministic and
    /// ignores top-k, top-p, min-p and the seed (but not the penalties).
    pub temperature: f32,
    /// Keep only the `top_k` highest logits; 0 = off.
    pub top_k: usize,
    /// Nucleus sampling: over candidates sorted by probability (descending), keep the
    /// smallest prefix whose mass is ≥ `top_p` (at least one); 1.0 = off.
    pub top_p: f32,
    /// Drop candidates whose probability is below `min_p · p_max`; 0 = off.
    pub min_p: f32,
    /// CTRL/llama.cpp repetition penalty for tokens in the window: a positive logit is
    /// divided by it, a non-positive one multiplied; 1.0 = off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token that appears in the window; 0 = off.
    pub presence_penalty: f32,
    /// Subtracted `count` times from the logit of a token seen `count` times in the
    /// window; 0 = off.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the three penalties look at; 0 = off.
    pub penalty_last_n: usize,
    /// Seed of the stream's RNG; the same seed and inputs give the same tokens.
    pub seed: u64,
    /// Added to a token's logit before anything else (OpenAI's `logit_bias`): `(token, bias)`
    /// with bias in [-100, 100]; -100 bans the token. Empty = off.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: DEFAULT_SEED,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerParams {
    /// Deterministic argmax decoding with every filter and penalty off.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Self::default()
        }
    }

    /// Checks every field is in its allowed range, naming the first bad field.
    pub fn validate(&self) -> Result<(), SamplerError> {
        fn bad(name: &'static str, value: f32, allowed: &'static str) -> SamplerError {
            SamplerError::InvalidParam {
                name,
                value: value.to_string(),
                allowed,
            }
        }
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(bad("temperature", t, "a finite number >= 0 (0 = greedy)"));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(bad("top_p", p, "(0, 1] (1 = off)"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(bad("min_p", m, "[0, 1] (0 = off)"));
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(bad("repeat_penalty", r, "a finite number > 0 (1 = off)"));
        }
        if !self.presence_penalty.is_finite() {
            return Err(bad(
                "presence_penalty",
                self.presence_penalty,
                "a finite number (0 = off)",
            ));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(bad(
                "frequency_penalty",
                self.frequency_penalty,
                "a finite number (0 = off)",
            ));
        }
        if let Some(&(_, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return Err(bad("logit_bias", b, "[-100, 100] per token"));
        }
        Ok(())
    }

    /// Whether `temperature` selects greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    /// Whether any of the three penalties would change a logit.
    fn penalties_active(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }
}

/// Why a sampler could not be built or could not pick a token.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// A sampling parameter is outside its allowed range.
    #[error("invalid sampler parameter `{name}` = {value}: allowed is {allowed}; fix the request's sampling settings")]
    InvalidParam {
        /// Field name, as in [`SamplerParams`].
        name: &'static str,
        /// The rejected value, formatted.
        value: String,
        /// Human-readable allowed range.
        allowed: &'static str,
    },
    /// Every logit was NaN or infinite, so no token can be chosen.
    #[error(
        "the logits row has no finite value (all NaN or infinite), so no token can be sampled; the model forward produced garbage — check the weights and the backend"
    )]
    NoFiniteLogits,
    /// The logits row had no entries.
    #[error("the logits row is empty; the model must return one logit per vocabulary token")]
    EmptyLogits,
    /// The logits row is longer than the `u32` token-id space.
    #[error("the logits row has {len} entries, more than fit in a u32 token id; the vocabulary size is wrong")]
    VocabTooLarge {
        /// Length of the row.
        len: usize,
    },
}

crate::wide::multiversion! {
    /// Greedy argmax: the index of the largest finite value, the first one on ties.
    ///
    /// NaN and ±∞ are ignored (an infinite logit is an overflow, not a preference), so the
    /// result is `None` for an empty row or one with no finite value. Shared by the sampler
    /// and by tests.
    pub fn argmax(logits: &[f32]) -> Option<usize> = argmax_body {
        // Two passes the compiler vectorises (the largest finite value, then the first chunk
        // holding it) instead of one branchy scan: a greedy step reads the whole vocabulary for
        // every lane, on the caller's thread while the kernel pool waits (a plain `position`
        // scan for the index was half of ~19 µs per SmolLM2 lane).
        const LANES: usize = 16;
        let finite = |x: f32| if x.is_finite() { x } else { f32::NEG_INFINITY };
        let mut acc = [f32::NEG_INFINITY; LANES];
        let chunks = logits.chunks_exact(LANES);
        let tail = chunks.remainder();
        for c in chunks {
            for (a, &x) in acc.iter_mut().zip(c) {
                let x = finite(x);
                *a = if x > *a { x } else { *a };
            }
        }
        let max = acc.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &x| {
            let x = finite(x);
            if x > m { x } else { m }
        });
        if max == f32::NEG_INFINITY {
            return None;
        }
        // `max` is finite, so only an equal finite value matches.
        let mut chunks = logits.chunks_exact(LANES);
        let mut base = 0;
        for c in chunks.by_ref() {
            if c.iter().fold(false, |hit, &x| hit | (x == max)) {
                return c.iter().position(|&x| x == max).map(|i| base + i);
            }
            base += LANES;
        }
        chunks.remainder().iter().position(|&x| x == max).map(|i| base + i)
    }
}

fn argmax_iter<I: Iterator<Item = (usize, f32)>>(values: I) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, x) in values {
        if !x.is_finite() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map(|(i, _)| i)
}

/// One candidate token: its id and its current logit (later: its probability).
#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    value: f32,
}

/// The `k` best finite logits as candidates (all finite ones when there are at most `k`) under
/// [`by_value_desc`], in no particular order. One pass: a candidate enters the buffer only when
/// it beats the k-th best kept so far (ids come in increasing order, so a tie with it loses), and
/// the buffer is cut back to `k` whenever it reaches `2k`.
fn top_k_finite(logits: &[f32], k: usize, out: &mut Vec<Candidate>) {
    out.clear();
    let cap = 2 * k.max(1);
    let mut threshold = f32::NEG_INFINITY;
    // Chunks with no value above the threshold are skipped by one branch-free test the compiler
    // vectorises (most of a 262,144-entry row once the threshold has risen); the others go
    // value by value exactly as before, so the candidates are the same.
    for (c, chunk) in logits.chunks(TOP_K_CHUNK).enumerate() {
        if !chunk.iter().fold(false, |any, &v| any | (v > threshold)) {
            continue;
        }
        let first = (c * TOP_K_CHUNK) as u32;
        for (&value, id) in chunk.iter().zip(first..) {
            if value.is_finite() && value > threshold {
                out.push(Candidate { id, value });
                if out.len() == cap {
                    out.select_nth_unstable_by(k - 1, by_value_desc);
                    out.truncate(k);
                    threshold = out.iter().fold(f32::INFINITY, |m, c| m.min(c.value));
                }
            }
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_value_desc);
        out.truncate(k);
    }
}

/// Logits [`top_k_finite`] tests against its threshold at once.
const TOP_K_CHUNK: usize = 64;

/// Descending by value, ascending by id on ties: a total order on finite values.
fn by_value_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.value.total_cmp(&a.value).then(a.id.cmp(&b.id))
}

/// One stream's sampler: owns its RNG (seeded from `params.seed`) and reusable buffers,
/// so steady-state sampling does not allocate.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: Rng,
    candidates: Vec<Candidate>,
    window: Vec<u32>,
}

impl Sampler {
    /// A sampler for `params`, after [`SamplerParams::validate`].
    pub fn new(params: SamplerParams) -> Result<Self, SamplerError> {
        params.validate()?;
        Ok(Self {
            rng: Rng::seed_from_u64(params.seed),
            window: Vec::with_capacity(params.penalty_last_n.min(4096)),
            candidates: Vec::new(),
            params,
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Pick the next token from one row of logits.
    ///
    /// `history` is the stream's tokens so far (prompt + generated); the penalties look at
    /// its last `penalty_last_n` tokens (ids outside the row are ignored). The exact chain:
    ///
    /// 1. NaN and ±∞ logits are excluded (treated as −∞); none finite → `NoFiniteLogits`.
    ///    `logit_bias` is added (a bias of -100 bans the token).
    /// 2. Penalties, per distinct token in the window seen `count` times: repeat penalty
    ///    (`l > 0 → l / r`, else `l · r`), then `l -= count · frequency + presence`.
    ///    Results are clamped to the finite `f32` range.
    /// 3. Greedy (temperature < 1e-6): argmax of the penalised logits, lowest id on ties;
    ///    the remaining steps, and the RNG, are skipped.
    /// 4. Top-k (partial selection, ties broken by lower id).
    /// 5. Softmax of `logit / temperature`.
    /// 6. Top-p over candidates sorted by probability, descending.
    /// 7. Min-p: drop `p < min_p · p_max`.
    /// 8. Renormalise and draw one candidate with the stream's RNG.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplerError> {
        if logits.is_empty() {
            return Err(SamplerError::EmptyLogits);
        }
        if u32::try_from(logits.len() - 1).is_err() {
            return Err(SamplerError::VocabTooLarge { len: logits.len() });
        }
        let params = &self.params;
        let penalise = params.penalties_active() && !history.is_empty();
        if params.is_greedy() && !penalise && params.logit_bias.is_empty() {
            return greedy_id(argmax(logits));
        }
        let greedy = params.is_greedy();
        let top_p_on = params.top_p < 1.0;
        // (Greedy without penalties or bias returned above.)
        if params.top_k > 0 && top_p_on && !penalise && params.logit_bias.is_empty() {
            // The common sampled case (top-k and top-p, nothing else touching the logits): the
            // top-k candidates straight from the logits — the same candidates the general path
            // keeps, sorted into the same order below, without building and partitioning a
            // vocabulary-sized candidate list.
            top_k_finite(logits, params.top_k, &mut self.candidates);
            if self.candidates.is_empty() {
                return Err(SamplerError::NoFiniteLogits);
            }
        } else {
            self.general_candidates(logits, history, penalise)?;
            if greedy {
                return greedy_id(argmax_iter(self.candidates.iter().map(|c| (c.id as usize, c.value))));
            }
        }
        // Top-p needs the candidates by probability, descending.
        if top_p_on {
            self.candidates.sort_unstable_by(by_value_desc);
        }
        self.draw()
    }

    /// Every finite logit as a candidate, with the logit bias and penalties applied, cut to the
    /// top k (in no particular order).
    fn general_candidates(&mut self, logits: &[f32], history: &[u32], penalise: bool) -> Result<(), SamplerError> {
        let params = &self.params;
        let cands = &mut self.candidates;
        cands.clear();
        // The length check in `sample` makes every index fit in a u32.
        cands.extend(logits.iter().zip(0u32..).map(|(&x, id)| Candidate {
            id,
            value: if x.is_finite() { x } else { f32::NEG_INFINITY },
        }));
        for &(token, bias) in &params.logit_bias {
            if let Some(c) = cands.get_mut(token as usize) {
                c.value = if bias <= -100.0 {
                    f32::NEG_INFINITY
                } else if c.value.is_finite() {
                    (c.value + bias).clamp(f32::MIN, f32::MAX)
                } else {
                    c.value // a masked (or non-finite) logit stays out
                };
            }
        }
        if penalise {
            let start = history.len().saturating_sub(params.penalty_last_n);
            let window = &mut self.window;
            window.clear();
            window.extend_from_slice(history.get(start..).unwrap_or_default());
            window.sort_unstable();
            for run in window.chunk_by(|a, b| a == b) {
                let Some(&token) = run.first() else { continue };
                if let Some(c) = cands.get_mut(token as usize) {
                    c.value = penalised(c.value, run.len(), params);
                }
            }
        }
        if params.is_greedy() {
            return Ok(());
        }
        cands.retain(|c| c.value.is_finite());
        if cands.is_empty() {
            return Err(SamplerError::NoFiniteLogits);
        }
        // Top-k.
        if params.top_k > 0 && params.top_k < cands.len() {
            cands.select_nth_unstable_by(params.top_k - 1, by_value_desc);
            cands.truncate(params.top_k);
        }
        Ok(())
    }

    /// Softmax with temperature, top-p (the candidates are sorted by value when it is on),
    /// min-p, and the draw.
    fn draw(&mut self) -> Result<u32, SamplerError> {
        let params = &self.params;
        let cands = &mut self.candidates;
        let top_p_on = params.top_p < 1.0;
        // Softmax with temperature.
        let max = if top_p_on {
            cands.first().map_or(0.0, |c| c.value)
        } else {
            cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.value))
        };
        let inv_t = 1.0 / f64::from(params.temperature);
        let mut sum = 0.0f64;
        for c in cands.iter_mut() {
            let p = ((f64::from(c.value) - f64::from(max)) * inv_t).exp();
            c.value = p as f32;
            sum += p;
        }
        // sum >= 1 because the maximum contributes exp(0).
        for c in cands.iter_mut() {
            c.value = (f64::from(c.value) / sum) as f32;
        }

        // Top-p over the sorted candidates.
        if top_p_on {
            let target = f64::from(params.top_p) - TOP_P_EPSILON;
            let mut cum = 0.0f64;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                cum += f64::from(c.value);
                if cum >= target {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep);
        }

        // Min-p.
        if params.min_p > 0.0 {
            let p_max = cands.iter().fold(0.0f32, |m, c| m.max(c.value));
            let threshold = params.min_p * p_max;
            cands.retain(|c| c.value >= threshold);
        }

        // Renormalise and draw.
        let total: f64 = cands.iter().map(|c| f64::from(c.value)).sum();
        let r = self.rng.next_f64() * total;
        let mut cum = 0.0f64;
        let mut last_positive = None;
        for c in cands.iter() {
            if c.value > 0.0 {
                cum += f64::from(c.value);
                last_positive = Some(c.id);
                if r < cum {
                    return Ok(c.id);
                }
            }
        }
        // Only reachable through rounding at the very top of the range.
        last_positive
            .or_else(|| cands.first().map(|c| c.id))
            .ok_or(SamplerError::NoFiniteLogits)
    }
}

/// Maps an argmax result to a token id.
fn greedy_id(index: Option<usize>) -> Result<u32, SamplerError> {
    let index = index.ok_or(SamplerError::NoFiniteLogits)?;
    u32::try_from(index).map_err(|_| SamplerError::VocabTooLarge { len: index + 1 })
}

/// A finite logit after the repeat, frequency and presence penalties for a token seen
/// `count` (≥ 1) times; non-finite logits stay excluded.
fn penalised(logit: f32, count: usize, params: &SamplerParams) -> f32 {
    if !logit.is_finite() {
        return f32::NEG_INFINITY;
    }
    let mut l = logit;
    if params.repeat_penalty != 1.0 {
        l = if l > 0.0 {
            l / params.repeat_penalty
        } else {
            l * params.repeat_penalty
        };
    }
    l -= count as f32 * params.frequency_penalty + params.presence_penalty;
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l.clamp(f32::MIN, f32::MAX)
    }
}

#[cfg(test)]
mod logit_bias_tests {
    use super::*;

    #[test]
    fn a_bias_moves_the_choice_and_minus_100_bans() {
        let logits = [1.0f32, 3.0, 2.0, f32::NEG_INFINITY];
        let mut greedy = SamplerParams::greedy();
        assert_eq!(Sampler::new(greedy.clone()).unwrap().sample(&logits, &[]).unwrap(), 1);
        greedy.logit_bias = vec![(2, 1.5)];
        assert_eq!(Sampler::new(greedy.clone()).unwrap().sample(&logits, &[]).unwrap(), 2);
        greedy.logit_bias = vec![(1, -100.0), (2, -100.0)];
        assert_eq!(Sampler::new(greedy.clone()).unwrap().sample(&logits, &[]).unwrap(), 0);
        // A masked token stays masked whatever its bias.
        greedy.logit_bias = vec![(3, 100.0)];
        assert_eq!(Sampler::new(greedy.clone()).unwrap().sample(&logits, &[]).unwrap(), 1);
        // Sampling never draws a banned token.
        let mut p = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerParams::default()
        };
        p.logit_bias = vec![(1, -100.0)];
        let mut s = Sampler::new(p.clone()).unwrap();
        for _ in 0..200 {
            assert_ne!(s.sample(&logits, &[]).unwrap(), 1);
        }
        p.logit_bias = vec![(0, 101.0)];
        assert!(p.validate().is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn argmax_equals_the_first_largest_finite_value(
            v in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => -4.0f32..4.0,
                    1 => proptest::sample::select(vec![
                        f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.0, 3.0
                    ]),
                ],
                0..80,
            )
        ) {
            proptest::prop_assert_eq!(argmax(&v), argmax_iter(v.iter().copied().enumerate()));
        }
    }

    fn params(temperature: f32) -> SamplerParams {
        SamplerParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerParams::default()
        }
    }

    #[test]
    fn argmax_first_on_ties_and_skips_non_finite() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, -5.0, f32::INFINITY, -7.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), None);
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn penalised_follows_ctrl_rule() {
        let p = SamplerParams {
            repeat_penalty: 2.0,
            ..params(1.0)
        };
        assert_eq!(penalised(4.0, 1, &p), 2.0);
        assert_eq!(penalised(-4.0, 1, &p), -8.0);
        let p = SamplerParams {
            frequency_penalty: 0.5,
            presence_penalty: 1.0,
            ..params(1.0)
        };
        assert_eq!(penalised(4.0, 3, &p), 4.0 - 1.5 - 1.0);
        let p = SamplerParams {
            repeat_penalty: 10.0,
            ..params(1.0)
        };
        assert_eq!(penalised(f32::MIN, 1, &p), f32::MIN);
        assert_eq!(penalised(f32::NAN, 1, &p), f32::NEG_INFINITY);
    }

    #[test]
    fn defaults_are_valid_and_match_llama_cpp() {
        let d = SamplerParams::default();
        assert!(d.validate().is_ok());
        assert_eq!((d.temperature, d.top_k, d.top_p, d.min_p), (0.8, 40, 0.95, 0.05));
        assert_eq!(d.penalty_last_n, 64);
        assert!(SamplerParams::greedy().is_greedy());
        assert!(!d.is_greedy());
    }

    #[test]
    fn serde_fills_missing_fields_with_defaults() {
        let p: SamplerParams =
            serde_json::from_str(r#"{"temperature":0.0,"seed":7}"#).unwrap_or_else(|e| panic!("parse: {e}"));
        assert_eq!(p.temperature, 0.0);
        assert_eq!(p.seed, 7);
        assert_eq!(p.top_k, 40);
        let round: SamplerParams = serde_json::from_str(&serde_json::to_string(&p).unwrap_or_default())
            .unwrap_or_else(|e| panic!("round trip: {e}"));
        assert_eq!(round, p);
    }

    #[test]
    fn steady_state_reuses_buffers() {
        let mut s = Sampler::new(SamplerParams {
            repeat_penalty: 1.1,
            ..SamplerParams::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let logits: Vec<f32> = (0..1000).map(|i| (i % 17) as f32 * 0.1).collect();
        let history: Vec<u32> = (0..200).collect();
        s.sample(&logits, &history).unwrap_or_else(|e| panic!("{e}"));
        let (cap_c, ptr_c) = (s.candidates.capacity(), s.candidates.as_ptr());
        let (cap_w, ptr_w) = (s.window.capacity(), s.window.as_ptr());
        for _ in 0..50 {
            s.sample(&logits, &history).unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!((s.candidates.capacity(), s.candidates.as_ptr()), (cap_c, ptr_c));
        assert_eq!((s.window.capacity(), s.window.as_ptr()), (cap_w, ptr_w));
    }
}
