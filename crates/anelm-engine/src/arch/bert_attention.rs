//! The encoder's bidirectional attention over packed sequences: every token attends to every
//! token of its own sequence (what a padding mask does for a padded batch). One pool task per
//! sequence, all heads; results written in place.
//!
//! Per head, K is laid out transposed (`kt[d][j]`), so a query's scores are `hd` multiply-adds
//! along the keys, and its output `len` along the head: every inner loop runs over contiguous
//! values and vectorises (the loops are compiled for AVX2/AVX-512 where the CPU has them,
//! `wide.rs`), with `anelm_kernels::exp_f32` in the softmax.

use std::ops::Range;
use std::sync::Mutex;

use anelm_kernels::{exp_f32, pool};

use crate::batch::Batch;
use crate::wide::multiversion;

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Hidden width (q, k and v each; the qkv rows are `3 · hidden` wide).
    pub hidden: usize,
    /// Heads.
    pub heads: usize,
}

/// `out` (lanes × hidden) = softmax(Q·Kᵀ/√d)·V per head over each span's lanes of `qkv` (lanes
/// × 3·hidden, q then k then v).
pub fn attend_packed(spans: &[Range<usize>], qkv: &Batch, shape: AttentionShape, out: &mut Batch) {
    let h = shape.hidden;
    let lanes = spans.last().map_or(0, |r| r.end);
    out.resize(lanes, h);
    // Each sequence's part of `out`, handed to the task that owns it.
    let mut parts = Vec::with_capacity(spans.len());
    let mut rest = out.as_mut_slice();
    for span in spans {
        let (part, tail) = rest.split_at_mut(span.len() * h);
        parts.push(Mutex::new(part));
        rest = tail;
    }
    // Longest sequences first (their cost grows with the square of the length), so a long one
    // does not start last while the other threads wait.
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(spans[s].len()));
    pool::global().run(spans.len(), &|t| {
        let s = order[t];
        let span = spans[s].clone();
        let rows = &qkv.as_slice()[span.start * 3 * h..span.end * 3 * h];
        let mut guard = parts[s].lock().unwrap_or_else(|e| e.into_inner());
        let mut scratch = Vec::new();
        for head in 0..shape.heads {
            attend_head(rows, span.len(), shape, head, &mut scratch, &mut guard);
        }
    });
}

/// Keys per vector step of the score loop (one 512-bit register of f32).
const KEY_STEP: usize = 16;

/// Queries scored and weighted together: each transposed key vector and each value chunk is
/// loaded once for all of them.
const QUERY_STEP: usize = 4;

multiversion! {
    /// One head of one sequence: `rows` are its `len` qkv rows, `out` its `len` output rows.
    /// The keys are padded to a multiple of [`KEY_STEP`] (zero keys, whose probabilities are
    /// set to zero), so every score loop is whole fixed-width steps, with no scalar tail.
    /// Products accumulate by fused multiply-add (one instruction where the CPU has FMA, as
    /// every AVX2 one does; a software `fmaf` on the x86 baseline).
    fn attend_head(
        rows: &[f32],
        len: usize,
        shape: AttentionShape,
        head: usize,
        scratch: &mut Vec<f32>,
        out: &mut [f32],
    ) = attend_head_body {
        let (h, hd) = (shape.hidden, shape.hidden / shape.heads);
        let lp = len.next_multiple_of(KEY_STEP);
        let scale = 1.0 / (hd as f32).sqrt();
        // kt: hd × lp (K transposed, zero-padded); p: QUERY_STEP × lp probabilities.
        scratch.clear();
        scratch.resize(hd * lp + QUERY_STEP * lp, 0.0);
        let (kt, p) = scratch.split_at_mut(hd * lp);
        for (j, row) in rows.chunks_exact(3 * h).enumerate() {
            for (d, &k) in row[h + head * hd..h + (head + 1) * hd].iter().enumerate() {
                kt[d * lp + j] = k;
            }
        }
        let mut i0 = 0;
        while i0 < len {
            let at = Queries { i0, lp, len, hd, h, head, scale };
            if len - i0 >= QUERY_STEP {
                at.attend::<QUERY_STEP>(rows, kt, p, out);
                i0 += QUERY_STEP;
            } else {
                at.attend::<1>(rows, kt, p, out);
                i0 += 1;
            }
        }
    }
}

/// A run of consecutive queries of one head: the first, and the head's shape.
#[derive(Clone, Copy)]
struct Queries {
    i0: usize,
    lp: usize,
    len: usize,
    hd: usize,
    h: usize,
    head: usize,
    scale: f32,
}

impl Queries {
    /// Queries `i0 .. i0 + N` of the head: their scores against the transposed keys `kt`, their
    /// probabilities in `p` (`N × lp`), and their outputs in `out`. `N` is a constant so each
    /// query's accumulators stay in registers.
    #[inline(always)]
    fn attend<const N: usize>(self, rows: &[f32], kt: &[f32], p: &mut [f32], out: &mut [f32]) {
        let Self {
            i0,
            lp,
            len,
            hd,
            h,
            head,
            scale,
        } = self;
        let qs: [&[f32]; N] = std::array::from_fn(|qi| {
            let at = (i0 + qi) * 3 * h + head * hd;
            &rows[at..at + hd]
        });
        // Scores, sixteen keys at a time.
        for c in 0..lp / KEY_STEP {
            let mut acc = [[0f32; KEY_STEP]; N];
            for d in 0..hd {
                let kc: &[f32; KEY_STEP] = kt[d * lp + c * KEY_STEP..][..KEY_STEP].try_into().expect("16 keys");
                for (a, q) in acc.iter_mut().zip(&qs) {
                    let qd = q[d];
                    for (a, &k) in a.iter_mut().zip(kc) {
                        *a = qd.mul_add(k, *a);
                    }
                }
            }
            for (qi, a) in acc.iter().enumerate() {
                for (o, &a) in p[qi * lp + c * KEY_STEP..][..KEY_STEP].iter_mut().zip(a) {
                    *o = a * scale;
                }
            }
        }
        for pq in p.chunks_exact_mut(lp).take(N) {
            softmax_padded(pq, len);
        }
        // o = Σ_j p[j]·v[j], sixteen channels of every query held in registers across the keys.
        let v0 = 2 * h + head * hd;
        let mut c = 0;
        while c + KEY_STEP <= hd {
            let mut acc = [[0f32; KEY_STEP]; N];
            for (j, vrow) in rows.chunks_exact(3 * h).enumerate() {
                let vc: &[f32; KEY_STEP] = vrow[v0 + c..][..KEY_STEP].try_into().expect("16 channels");
                for (qi, a) in acc.iter_mut().enumerate() {
                    let pj = p[qi * lp + j];
                    for (a, &b) in a.iter_mut().zip(vc) {
                        *a = pj.mul_add(b, *a);
                    }
                }
            }
            for (qi, a) in acc.iter().enumerate() {
                let at = (i0 + qi) * h + head * hd + c;
                out[at..at + KEY_STEP].copy_from_slice(a);
            }
            c += KEY_STEP;
        }
        if c < hd {
            for qi in 0..N {
                let at = (i0 + qi) * h + head * hd;
                let o = &mut out[at + c..at + hd];
                o.fill(0.0);
                for (j, vrow) in rows.chunks_exact(3 * h).enumerate() {
                    let pj = p[qi * lp + j];
                    for (a, &b) in o.iter_mut().zip(&vrow[v0 + c..v0 + hd]) {
                        *a = pj.mul_add(b, *a);
                    }
                }
            }
        }
    }
}

/// Scaled scores of one query (`len` real keys, the rest padding) to probabilities in place:
/// padding keys get −∞ (which `exp_f32` takes to its smallest value, below 1e-37: nothing beside
/// the max key's 1 in the sum), then zero weight.
#[inline(always)]
fn softmax_padded(p: &mut [f32], len: usize) {
    p[len..].fill(f32::NEG_INFINITY);
    let mut maxes = [f32::NEG_INFINITY; KEY_STEP];
    for pc in p.chunks_exact(KEY_STEP) {
        for (m, &v) in maxes.iter_mut().zip(pc) {
            *m = m.max(v);
        }
    }
    let max = maxes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sums = [0f32; KEY_STEP];
    for pc in p.chunks_exact_mut(KEY_STEP) {
        for (v, s) in pc.iter_mut().zip(sums.iter_mut()) {
            *v = exp_f32(*v - max);
            *s += *v;
        }
    }
    p[len..].fill(0.0);
    let inv = 1.0 / sums.iter().sum::<f32>();
    for v in p.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straightforward f64 attention of one span.
    fn reference(qkv: &Batch, span: Range<usize>, shape: AttentionShape) -> Vec<f64> {
        let (h, hd) = (shape.hidden, shape.hidden / shape.heads);
        let mut out = vec![0f64; span.len() * h];
        for head in 0..shape.heads {
            for (i, li) in span.clone().enumerate() {
                let q = &qkv.lane(li)[head * hd..(head + 1) * hd];
                let scores: Vec<f64> = span
                    .clone()
                    .map(|lj| {
                        let k = &qkv.lane(lj)[h + head * hd..h + (head + 1) * hd];
                        q.iter().zip(k).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, lj) in span.clone().enumerate() {
                    let v = &qkv.lane(lj)[2 * h + head * hd..2 * h + (head + 1) * hd];
                    for d in 0..hd {
                        out[i * h + head * hd + d] += e[j] / sum * f64::from(v[d]);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn packed_attention_matches_a_reference_per_span() {
        // Heads of 8 (below one vector step), 20 (a step and a remainder) and 32 (MiniLM's).
        for (hidden, heads) in [(24, 3), (40, 2), (64, 2)] {
            check(AttentionShape { hidden, heads });
        }
    }

    fn check(shape: AttentionShape) {
        let spans = [0..1, 1..6, 6..23, 23..40];
        let lanes = 40;
        let mut seed = 7u64;
        let vals: Vec<f32> = (0..lanes * 3 * shape.hidden)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect();
        let qkv = Batch::from_vec(lanes, 3 * shape.hidden, vals).unwrap();
        let mut out = Batch::default();
        attend_packed(&spans, &qkv, shape, &mut out);
        for span in spans {
            let want = reference(&qkv, span.clone(), shape);
            for (i, lane) in span.clone().enumerate() {
                for (d, &got) in out.lane(lane).iter().enumerate() {
                    let w = want[i * shape.hidden + d];
                    assert!(
                        (f64::from(got) - w).abs() < 1e-5,
                        "{shape:?} lane {lane} channel {d}: {got} vs {w}"
                    );
                }
            }
        }
        // The same inputs through the portable body agree (the vector copies only widen it).
        let mut scratch = Vec::new();
        let mut one = vec![0f32; 17 * shape.hidden];
        let rows = &qkv.as_slice()[6 * 3 * shape.hidden..23 * 3 * shape.hidden];
        for head in 0..shape.heads {
            attend_head_body(rows, 17, shape, head, &mut scratch, &mut one);
        }
        for (i, lane) in (6..23).enumerate() {
            for (d, &v) in out.lane(lane).iter().enumerate() {
                assert!((v - one[i * shape.hidden + d]).abs() < 1e-6);
            }
        }
    }
}
