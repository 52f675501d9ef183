//! Pooling token states into one vector per input (sentence-transformers' Pooling module), and
//! the Normalize module's L2 normalisation.

use std::ops::Range;

pub use anelm_model::sentence_config::PoolingMode;

use crate::batch::Batch;
use crate::error::{EngineError, Result};

/// The pooling a GGUF embedding model asks for in its `<arch>.pooling_type` metadata, in
/// llama.cpp's numbering (`enum llama_pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank).
/// `None` and rank are refused: the first is a model without a sentence vector (a chat model),
/// the second a reranker, which scores pairs instead of embedding texts.
pub fn pooling_from_gguf(code: u64) -> Result<PoolingMode> {
    match code {
        1 => Ok(PoolingMode::Mean),
        2 => Ok(PoolingMode::Cls),
        3 => Ok(PoolingMode::LastToken),
        0 => Err(EngineError::Config(
            "the GGUF's pooling_type is 0 (none): it has no sentence embedding; use an embedding model's GGUF".into(),
        )),
        4 => Err(EngineError::Config(
            "the GGUF's pooling_type is 4 (rank): it is a reranker, which anelm does not serve; use an embedding model"
                .into(),
        )),
        other => Err(EngineError::Config(format!(
            "the GGUF's pooling_type is {other}, which llama.cpp does not define (0 none, 1 mean, 2 cls, 3 last, 4 rank)"
        ))),
    }
}

/// Pool the lanes `span` of `states` with each of `modes`, concatenated in the given order.
/// `span` must be non-empty.
pub fn pool(modes: &[PoolingMode], states: &Batch, span: Range<usize>) -> Vec<f32> {
    let h = states.channels();
    let mut out = Vec::with_capacity(h * modes.len());
    let len = span.len().max(1) as f32;
    for mode in modes {
        match mode {
            PoolingMode::Cls => out.extend_from_slice(states.lane(span.start)),
            PoolingMode::LastToken => out.extend_from_slice(states.lane(span.end.saturating_sub(1))),
            PoolingMode::Max => {
                let mut m = vec![f32::NEG_INFINITY; h];
                for lane in span.clone() {
                    for (m, &v) in m.iter_mut().zip(states.lane(lane)) {
                        *m = m.max(v);
                    }
                }
                out.extend(m);
            }
            PoolingMode::Mean | PoolingMode::MeanSqrtLen => {
                let mut sum = vec![0f32; h];
                for lane in span.clone() {
                    for (s, &v) in sum.iter_mut().zip(states.lane(lane)) {
                        *s += v;
                    }
                }
                let div = if *mode == PoolingMode::Mean { len } else { len.sqrt() };
                out.extend(sum.into_iter().map(|s| s / div));
            }
        }
    }
    out
}

/// Scale `v` to unit L2 length (as torch's `normalize`, with its 1e-12 floor on the norm).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
        .max(1e-12);
    for x in v.iter_mut() {
        *x = (f64::from(*x) / norm) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_pooling_codes_follow_llama_cpp() {
        assert_eq!(pooling_from_gguf(1).ok(), Some(PoolingMode::Mean));
        assert_eq!(pooling_from_gguf(2).ok(), Some(PoolingMode::Cls));
        assert_eq!(pooling_from_gguf(3).ok(), Some(PoolingMode::LastToken));
        for (code, says) in [(0, "none"), (4, "reranker"), (9, "does not define")] {
            let err = pooling_from_gguf(code).expect_err("refused").to_string();
            assert!(err.contains(says), "{code}: {err}");
        }
    }

    fn states() -> Batch {
        // Three lanes of two channels.
        Batch::from_vec(3, 2, vec![1.0, -2.0, 3.0, 4.0, -5.0, 0.5]).unwrap()
    }

    #[test]
    fn modes_pool_their_lanes() {
        let s = states();
        assert_eq!(pool(&[PoolingMode::Cls], &s, 1..3), vec![3.0, 4.0]);
        assert_eq!(pool(&[PoolingMode::LastToken], &s, 0..2), vec![3.0, 4.0]);
        assert_eq!(pool(&[PoolingMode::Max], &s, 0..3), vec![3.0, 4.0]);
        assert_eq!(pool(&[PoolingMode::Mean], &s, 0..2), vec![2.0, 1.0]);
        let msl = pool(&[PoolingMode::MeanSqrtLen], &s, 0..2);
        assert!((msl[0] - 4.0 / 2f32.sqrt()).abs() < 1e-6);
        assert_eq!(
            pool(&[PoolingMode::Cls, PoolingMode::Mean], &s, 2..3),
            vec![-5.0, 0.5, -5.0, 0.5]
        );
    }

    #[test]
    fn normalize_gives_unit_length() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        l2_normalize(&mut z);
        assert_eq!(z, vec![0.0, 0.0]);
    }
}
