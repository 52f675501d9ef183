//! Pooling token states into one vector per input (sentence-transformers' Pooling module), and
//! the Normalize module's L2 normalisation.

use std::ops::Range;

pub use anelm_model::sentence_config::PoolingMode;

use crate::batch::Batch;

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
