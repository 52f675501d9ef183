//! Causal multi-head attention with grouped KV heads over each session's KV cache: the part of
//! every attention layer that runs on the CPU after the fused input projection. Optional sliding
//! window (Gemma 3 local layers) and score soft-capping.

use crate::arch::step::LaneRef;
use crate::batch::Batch;
use crate::kv_cache::KvLayer;
use crate::model::StepItem;
use crate::ops::{AttendParams, AttentionPrecision, attend};

/// Shape and scoring of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (each serves `n_heads / n_kv_heads` consecutive query heads).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Score multiplier.
    pub scale: f32,
    /// Attend only to the last `window` positions, the current one included.
    pub window: Option<usize>,
    /// `cap · tanh(score / cap)` on the scaled scores.
    pub softcap: Option<f32>,
    /// How K/V, q and probabilities are rounded.
    pub precision: AttentionPrecision,
}

impl Attention {
    /// Floats per cached position: all KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Floats of one lane's attention output: all query heads.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Append each lane's key and value (at `k_off` / `v_off` of its row in `rows`, `kv_dim`
    /// floats each) to its session's cache of layer `layer`. Lanes must come in position order.
    pub(crate) fn append(
        &self,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        layer: usize,
        rows: &Batch,
        k_off: usize,
        v_off: usize,
    ) {
        let kv_dim = self.kv_dim();
        for it in items.iter_mut() {
            it.session.kv.layers[layer].reserve_step(it.tokens.len(), kv_dim);
        }
        let p = self.precision;
        let (mut k, mut v) = (vec![0.0; kv_dim], vec![0.0; kv_dim]);
        for (lane, l) in lanes.iter().enumerate() {
            let row = rows.lane(lane);
            for (dst, src) in [
                (&mut k, &row[k_off..k_off + kv_dim]),
                (&mut v, &row[v_off..v_off + kv_dim]),
            ] {
                dst.iter_mut().zip(src).for_each(|(d, &e)| *d = p.store(e));
            }
            let cache = &mut items[l.item].session.kv.layers[layer];
            debug_assert_eq!(cache.len(), l.pos, "lanes append in position order");
            cache.push(&k, &v);
        }
    }

    /// Every lane's query heads (head `h` at `q_off + h·q_stride` of its row in `rows`) over its
    /// session's cache of layer `layer`, up to and including its own position (already
    /// appended). Writes `out` as lanes × `q_dim`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        items: &[StepItem<'_>],
        lanes: &[LaneRef],
        layer: usize,
        rows: &Batch,
        q_off: usize,
        q_stride: usize,
        out: &mut Batch,
    ) {
        let hd = self.head_dim;
        let group = self.n_heads / self.n_kv_heads.max(1);
        out.resize(lanes.len(), self.q_dim());
        let caches: Vec<&KvLayer> = items.iter().map(|it| &it.session.kv.layers[layer]).collect();
        // On the kernel pool (spinning workers shared with the matmuls), one task per
        // (lane, head); the score buffer is per thread, so the hot path does not allocate.
        thread_local! {
            static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        anelm_kernels::pool::global().for_each_chunk_mut(out.as_mut_slice(), hd, &|idx, o| {
            let (lane, head) = (idx / self.n_heads, idx % self.n_heads);
            let l = &lanes[lane];
            let at = q_off + head * q_stride;
            let q = &rows.lane(lane)[at..at + hd];
            let c = caches[l.item];
            let end = l.pos + 1;
            let start = self.window.map_or(0, |w| end.saturating_sub(w));
            let slots = c.segments(start..end);
            let p = AttendParams {
                stride: self.kv_dim(),
                offset: (head / group) * hd,
                scale: self.scale,
                softcap: self.softcap,
                precision: self.precision,
            };
            SCORES.with(|sc| attend(q, c.keys(), c.values(), &slots, &p, &mut sc.borrow_mut(), o));
        });
    }
}
