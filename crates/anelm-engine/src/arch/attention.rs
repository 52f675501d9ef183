//! Causal multi-head attention with grouped KV heads over each session's KV cache: the part of
//! every attention layer that runs on the CPU after the fused input projection. Optional sliding
//! window (Gemma 3 local layers) and score soft-capping.

use crate::arch::step::LaneRef;
use crate::batch::Batch;
use crate::kv_cache::{KvCache, KvLayer};
use crate::model::StepItem;
use crate::ops::{AttendParams, AttendScratch, AttentionPrecision, Tile, attend_group, attend_tile};

/// Most query heads one attention task handles.
const MAX_TASK_HEADS: usize = 8;

/// Query heads per attention task: the largest divisor of the GQA `group` (≤ [`MAX_TASK_HEADS`])
/// that still gives at least two tasks per thread for `total_heads` (lanes × heads), else 1.
fn heads_per_task(group: usize, total_heads: usize, threads: usize) -> usize {
    (1..=group.clamp(1, MAX_TASK_HEADS))
        .rev()
        .find(|&s| group % s == 0 && total_heads / s >= 2 * threads.max(1))
        .unwrap_or(1)
}

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
    /// Each position attends to the earlier ones only (a language model); false: to every
    /// position of its step's input, later ones too (an encoder such as EmbeddingGemma, whose
    /// input must then come in one step), within `window` either side.
    pub causal: bool,
}

impl Attention {
    /// Full causal attention over every position, scores scaled by `head_dim^-½`.
    pub fn causal(n_heads: usize, n_kv_heads: usize, head_dim: usize, precision: AttentionPrecision) -> Self {
        Self {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
            precision,
            causal: true,
        }
    }

    /// The cached positions position `pos` attends to, of a cache holding `len`: up to itself
    /// (causal) or every one (bidirectional), within the window either side
    /// (transformers: `|q − k| < window` for Gemma 3's bidirectional local layers).
    fn span(&self, pos: usize, len: usize) -> (usize, usize) {
        let start = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let end = if self.causal {
            pos + 1
        } else {
            self.window.map_or(len, |w| len.min(pos + w))
        };
        (start, end)
    }

    /// Floats per cached position: all KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// An empty KV cache for this attention, one layer per entry of `windows` (`Some(w)`: a ring
    /// for a `w`-position window): one plane per KV head, stored as this attention rounds K/V.
    pub fn cache(&self, windows: &[Option<usize>]) -> KvCache {
        KvCache::with_windows(windows, self.kv_dim())
            .with_storage(self.precision.kv_storage())
            .with_heads(self.n_kv_heads)
    }

    /// Floats of one lane's attention output: all query heads.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Scoring of rows `stride` apart whose KV head starts at `offset`.
    fn params(&self, stride: usize, offset: usize) -> AttendParams {
        AttendParams {
            stride,
            offset,
            scale: self.scale,
            softcap: self.softcap,
            precision: self.precision,
        }
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
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (lane, l) in lanes.iter().enumerate() {
            let row = rows.lane(lane);
            let (k_row, v_row) = (&row[k_off..k_off + kv_dim], &row[v_off..v_off + kv_dim]);
            let cache = &mut items[l.item].session.kv.layers[layer];
            debug_assert_eq!(cache.len(), l.pos, "lanes append in position order");
            if cache.storage() == p.kv_storage() {
                // The storage itself rounds as the precision asks (f16 bits, or f32 as is):
                // rounding first as well would change nothing.
                cache.push(k_row, v_row);
            } else {
                for (dst, src) in [(&mut k, k_row), (&mut v, v_row)] {
                    dst.clear();
                    dst.extend(src.iter().map(|&e| p.store(e)));
                }
                cache.push(&k, &v);
            }
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
        let tiles = tiles(lanes, self.tile_tokens());
        let threads = anelm_kernels::pool::global().threads();
        if self.tiles_pay(tiles.len(), lanes.len(), threads) {
            self.run_tiles(&caches, lanes, &tiles, rows, q_off, q_stride, out);
            return;
        }
        // On the kernel pool (spinning workers shared with the matmuls), one task per lane and
        // run of `heads` query heads of one KV head, which read each cached row once; the runs
        // are the whole group unless that leaves too few tasks to keep the threads busy.
        let pool = anelm_kernels::pool::global();
        let heads = heads_per_task(group, lanes.len() * self.n_heads, pool.threads());
        pool.for_each_chunk_mut(out.as_mut_slice(), heads * hd, &|idx, o| {
            let per_lane = self.n_heads / heads;
            let (lane, first) = (idx / per_lane, (idx % per_lane) * heads);
            let l = &lanes[lane];
            let row = rows.lane(lane);
            let mut qs = [&row[..0]; MAX_TASK_HEADS];
            for (h, q) in qs.iter_mut().enumerate().take(heads) {
                let at = q_off + (first + h) * q_stride;
                *q = &row[at..at + hd];
            }
            let c = caches[l.item];
            let (start, end) = self.span(l.pos, c.len());
            let slots = c.segments(start..end);
            let (stride, offset) = c.row_layout(first / group, hd);
            let p = self.params(stride, offset);
            SCRATCH.with(|sc| {
                attend_group(
                    &qs[..heads],
                    c.keys(),
                    c.values(),
                    &slots,
                    &p,
                    &mut sc.borrow_mut().0,
                    o,
                )
            });
        });
    }
}

/// Query floats (tokens × heads of one KV head × head width) one tile task holds (32 KB, an
/// L1 cache): more queries per tile spread each block's transpose over more scores (with 256-wide
/// heads, 8 tokens × 4 heads against 4 × 4: +6 % on a Gemma 3 pp4096; SmolLM2's 64-wide heads,
/// 32 tokens against 21: no change; docs/field-guide.md).
const TILE_QUERY_FLOATS: usize = 8192;

/// Most tokens in one tile.
const MAX_TILE_TOKENS: usize = 32;

/// The lanes attended as tiles ([`Attention::run_tiles`]): runs of consecutive lanes of one
/// item at consecutive positions (a prefill chunk, an encoder's input), at most `max` each.
fn tiles(lanes: &[LaneRef], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, l) in lanes.iter().enumerate() {
        match out.last_mut() {
            Some(t) if t.len() < max && lanes[t.end - 1].item == l.item && lanes[t.end - 1].pos + 1 == l.pos => {
                t.end = i + 1;
            }
            _ => out.push(i..i + 1),
        }
    }
    out
}

impl Attention {
    /// Most tokens of one tile: [`TILE_QUERY_FLOATS`] of query heads sharing a KV head.
    fn tile_tokens(&self) -> usize {
        let group = self.n_heads / self.n_kv_heads.max(1);
        (TILE_QUERY_FLOATS / (group * self.head_dim).max(1)).clamp(1, MAX_TILE_TOKENS)
    }

    /// Whether [`Attention::run`] attends `lanes` lanes grouped in `tiles` tiles by tiles: when
    /// the lanes come in runs (prefill chunks, an encoder's input: two lanes a tile or more) and
    /// there are tasks enough to keep the pool's `threads` busy. A few lanes per item (a
    /// speculative verify step) keep one task per lane, whose heads split across the threads.
    fn tiles_pay(&self, tiles: usize, lanes: usize, threads: usize) -> bool {
        self.n_kv_heads >= 1
            && self.n_heads % self.n_kv_heads == 0
            && 2 * tiles <= lanes
            && tiles * self.n_kv_heads >= 2 * threads
    }

    /// [`Attention::run`] by tiles of lanes (see [`tiles`]): one task per tile and KV head, whose
    /// tokens × query heads attend together ([`attend_tile`]: each cached row read once per
    /// tile, not per lane), heaviest tiles (the latest positions) first. The same values as one
    /// task per lane, bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn run_tiles(
        &self,
        caches: &[&KvLayer],
        lanes: &[LaneRef],
        tiles: &[std::ops::Range<usize>],
        rows: &Batch,
        q_off: usize,
        q_stride: usize,
        out: &mut Batch,
    ) {
        let hd = self.head_dim;
        let group = self.n_heads / self.n_kv_heads.max(1);
        let longest = tiles.iter().map(|t| t.len()).max().unwrap_or(0);
        let per_task = longest * group * hd;
        let n_kv = self.n_kv_heads.max(1);
        // Kept from step to step (a fresh buffer each layer cost the kernel's page zeroing: 3 %
        // of a 4,096-token prefill).
        let mut results = RESULTS.with(|r| std::mem::take(&mut *r.borrow_mut()));
        results.resize(tiles.len() * n_kv * per_task, 0.0);
        // Task `idx`: (tile, KV head), the latest tiles first.
        let task = |idx: usize| (tiles.len() - 1 - idx / n_kv, idx % n_kv);
        let pool = anelm_kernels::pool::global();
        pool.for_each_chunk_mut(&mut results, per_task, &|idx, o| {
            let (tile, kh) = task(idx);
            let lanes = &lanes[tiles[tile].clone()];
            let c = caches[lanes[0].item];
            let (stride, offset) = c.row_layout(kh, hd);
            let p = self.params(stride, offset);
            let spans: Vec<std::ops::Range<usize>> = lanes
                .iter()
                .map(|l| {
                    let (start, end) = self.span(l.pos, c.len());
                    start..end
                })
                .collect();
            let segments = |r: std::ops::Range<usize>| c.segments(r);
            SCRATCH.with(|sc| {
                let (scratch, qs) = &mut *sc.borrow_mut();
                qs.clear();
                for lane in tiles[tile].clone() {
                    let row = rows.lane(lane);
                    for h in kh * group..(kh + 1) * group {
                        let at = q_off + h * q_stride;
                        qs.extend_from_slice(&row[at..at + hd]);
                    }
                }
                let tile = Tile {
                    qs,
                    heads: group,
                    head_dim: hd,
                    spans: &spans,
                };
                attend_tile(&tile, &segments, c.keys(), c.values(), &p, scratch, o);
            });
        });
        for (idx, o) in results.chunks(per_task).enumerate() {
            let (tile, kh) = task(idx);
            for (i, lane) in tiles[tile].clone().enumerate() {
                let src = &o[i * group * hd..(i + 1) * group * hd];
                out.lane_mut(lane)[kh * group * hd..(kh + 1) * group * hd].copy_from_slice(src);
            }
        }
        RESULTS.with(|r| *r.borrow_mut() = results);
    }
}

thread_local! {
    /// The tile tasks' outputs of [`Attention::run_tiles`] on the thread that runs the step.
    static RESULTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };

    /// Each thread's buffers for attention tasks: the scores, and the heads a fused decode task
    /// prepares.
    static SCRATCH: std::cell::RefCell<(AttendScratch, Vec<f32>)> =
        std::cell::RefCell::new((AttendScratch::default(), Vec::new()));
}

/// How [`Attention::run_decode_fused`] prepares one head of a lane before use: `(lane, head,
/// is_query)`, in place (QK-norm and RoPE).
pub(crate) type HeadPrep<'a> = dyn Fn(usize, &mut [f32], bool) + Sync + 'a;

impl Attention {
    /// [`Attention::append`] and [`Attention::run`] in one parallel loop, for a decode step (each
    /// item one new position) whose tasks each own a whole GQA group of one lane: a task
    /// prepares (`prep`: QK-norm, RoPE) its query heads and its KV head from `rows` (q at 0, k
    /// at `k_off`, v at `v_off`), writes that head's key and value into its plane of the cache,
    /// and attends. The serial per-lane RoPE and cache writes before the loop go away, and each
    /// cache row is written by the thread that reads it next. Same values as preparing `rows`
    /// in place, `append` and `run` (the preparation and rounding are the same calls).
    /// Returns false, having done nothing, when the step or the cache layout does not qualify.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_decode_fused(
        &self,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        layer: usize,
        rows: &Batch,
        k_off: usize,
        v_off: usize,
        prep: &HeadPrep<'_>,
        out: &mut Batch,
    ) -> bool {
        let hd = self.head_dim;
        let group = self.n_heads / self.n_kv_heads.max(1);
        let pool = anelm_kernels::pool::global();
        let single = lanes.len() == items.len() && items.iter().all(|it| it.tokens.len() == 1);
        if !single
            || !self.causal
            || group == 0
            || group > MAX_TASK_HEADS
            || self.n_heads % self.n_kv_heads.max(1) != 0
            || heads_per_task(group, lanes.len() * self.n_heads, pool.threads()) != group
            || items.iter().any(|it| {
                // One plane per KV head, stored as the precision rounds (as `cache` builds it).
                let c = &it.session.kv.layers[layer];
                c.heads() != self.n_kv_heads
                    || c.storage() != self.precision.kv_storage()
                    || (!c.is_empty() && c.kv_dim() != self.kv_dim())
            })
        {
            return false;
        }
        let kv_dim = self.kv_dim();
        // Serially, per lane: open its position, then find the rows its query attends to.
        let mut slot_of = Vec::with_capacity(lanes.len());
        let mut segments = Vec::with_capacity(lanes.len());
        for l in lanes {
            let c = &mut items[l.item].session.kv.layers[layer];
            debug_assert_eq!(c.len(), l.pos, "lanes append in position order");
            slot_of.push(c.open_position(kv_dim));
            let end = l.pos + 1;
            let start = self.window.map_or(0, |w| end.saturating_sub(w));
            segments.push(c.segments(start..end));
        }
        let mut planes = Vec::with_capacity(items.len());
        for it in items.iter_mut() {
            match it.session.kv.layers[layer].planes(self.n_kv_heads) {
                Some(pl) => planes.push(pl),
                None => unreachable!("checked above: one plane per KV head, a position just opened"),
            }
        }
        out.resize(lanes.len(), self.q_dim());
        let params = self.params(hd, 0);
        pool.for_each_chunk_mut(out.as_mut_slice(), group * hd, &|idx, o| {
            let (lane, kh) = (idx / self.n_kv_heads, idx % self.n_kv_heads);
            let first = kh * group;
            let l = &lanes[lane];
            let row = rows.lane(lane);
            SCRATCH.with(|sc| {
                let (scratch, heads) = &mut *sc.borrow_mut();
                // The group's query heads, then the key and the value head, prepared locally.
                heads.clear();
                heads.extend_from_slice(&row[first * hd..(first + group) * hd]);
                heads.extend_from_slice(&row[k_off + kh * hd..k_off + (kh + 1) * hd]);
                heads.extend_from_slice(&row[v_off + kh * hd..v_off + (kh + 1) * hd]);
                let (qs_flat, kv) = heads.split_at_mut(group * hd);
                for q in qs_flat.chunks_mut(hd) {
                    prep(lane, q, true);
                }
                let (k, v) = kv.split_at_mut(hd);
                prep(lane, k, false);
                // The storage rounds as the precision asks (f16 bits, or f32 as is; checked).
                // SAFETY: task `idx` is the only one for (this lane's item, head `kh`): each
                // item has one lane in a decode step, and tasks are (lane, KV head) pairs.
                let (mut kp, mut vp) = unsafe { planes[l.item].head(kh) };
                let at = slot_of[lane] * hd;
                kp.write(at, k);
                vp.write(at, v);
                let mut qs = [&qs_flat[..0]; MAX_TASK_HEADS];
                for (h, q) in qs.iter_mut().enumerate().take(group) {
                    *q = &qs_flat[h * hd..(h + 1) * hd];
                }
                attend_group(&qs[..group], kp.rows(), vp.rows(), &segments[lane], &params, scratch, o);
            });
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::KvRows;
    use crate::model::LogitsMode;
    use crate::ops::AttentionPrecision;
    use crate::session::Session;

    /// Deterministic values in [−1, 1).
    fn val(i: usize, seed: u32) -> f32 {
        ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 9) as f32 / 4.2e6 - 1.0
    }

    fn lanes_of(sessions: &[Session]) -> Vec<LaneRef> {
        (0..sessions.len())
            .map(|item| LaneRef {
                item,
                pos: sessions[item].kv.layers[0].len(),
                ctx: sessions[item].ctx_size(),
            })
            .collect()
    }

    fn items<'a>(sessions: &'a mut [Session], tok: &'a [u32]) -> Vec<StepItem<'a>> {
        sessions
            .iter_mut()
            .map(|session| StepItem {
                session,
                tokens: tok,
                logits: LogitsMode::Last,
            })
            .collect()
    }

    /// Positions `0 .. n` appended to `session` one at a time, position `p`'s q‖k‖v row being
    /// `row(p)`.
    fn append_history(att: &Attention, session: &mut Session, n: usize, row: impl Fn(usize) -> Vec<f32>) {
        let (q_dim, kv_dim) = (att.q_dim(), att.kv_dim());
        let ctx = session.ctx_size();
        for pos in 0..n {
            let rows = Batch::from_vec(1, q_dim + 2 * kv_dim, row(pos)).expect("one lane");
            let lane = [LaneRef { item: 0, pos, ctx }];
            let mut its = items(std::slice::from_mut(session), &[0]);
            att.append(&mut its, &lane, 0, &rows, q_dim, q_dim + kv_dim);
        }
    }

    fn bits(rows: KvRows<'_>) -> Vec<u32> {
        match rows {
            KvRows::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            KvRows::F16(v) => v.iter().map(|&x| u32::from(x)).collect(),
        }
    }

    /// The fused decode loop against the serial preparation, `append` and `run`: the same
    /// outputs and cache contents bit for bit, for both precisions, and it does take the fused
    /// path whenever its tasks own whole groups on this pool.
    #[test]
    fn fused_decode_equals_prepare_append_run() {
        let lanes_n = 8;
        for precision in [AttentionPrecision::F16, AttentionPrecision::F32] {
            let att = Attention {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 32,
                scale: 0.17,
                window: None,
                softcap: None,
                precision,
                causal: true,
            };
            let (q_dim, kv_dim) = (att.q_dim(), att.kv_dim());
            let width = q_dim + 2 * kv_dim;
            let mut sessions: Vec<Session> = (0..lanes_n).map(|_| Session::new(att.cache(&[None]), 64)).collect();
            // Histories of different lengths, appended one position at a time.
            let tok = [0u32];
            for (i, s) in sessions.iter_mut().enumerate() {
                append_history(&att, s, 3 + 2 * i, |p| {
                    (0..width).map(|k| val(k + 1000 * p, i as u32)).collect()
                });
            }
            let data: Vec<f32> = (0..lanes_n * width).map(|k| val(k, 77) * 3.0).collect();
            let rows = Batch::from_vec(lanes_n, width, data).expect("rows");
            // A preparation that depends on the lane and on the head kind.
            let prep = |lane: usize, head: &mut [f32], is_query: bool| {
                let f = if is_query { 0.5 } else { 1.5 } + lane as f32;
                head.iter_mut().for_each(|x| *x *= f);
            };
            let mut serial = sessions.clone();
            let lanes = lanes_of(&serial);
            let mut prepared = rows.clone();
            for lane in 0..lanes_n {
                let row = prepared.lane_mut(lane);
                row[..q_dim].chunks_mut(32).for_each(|h| prep(lane, h, true));
                row[q_dim..q_dim + kv_dim]
                    .chunks_mut(32)
                    .for_each(|h| prep(lane, h, false));
            }
            let mut want = Batch::default();
            att.append(
                &mut items(&mut serial, &tok),
                &lanes,
                0,
                &prepared,
                q_dim,
                q_dim + kv_dim,
            );
            att.run(&items(&mut serial, &tok), &lanes, 0, &prepared, 0, 32, &mut want);
            let mut got = Batch::default();
            let fused = att.run_decode_fused(
                &mut items(&mut sessions, &tok),
                &lanes,
                0,
                &rows,
                q_dim,
                q_dim + kv_dim,
                &prep,
                &mut got,
            );
            let threads = anelm_kernels::pool::global().threads();
            assert_eq!(fused, heads_per_task(2, lanes_n * 4, threads) == 2, "{threads} threads");
            if !fused {
                continue;
            }
            let out_bits = |b: &Batch| b.as_slice().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(out_bits(&got), out_bits(&want), "{precision:?} outputs");
            for (a, b) in sessions.iter().zip(&serial) {
                let (a, b) = (&a.kv.layers[0], &b.kv.layers[0]);
                assert_eq!(a.len(), b.len());
                assert_eq!(bits(a.keys()), bits(b.keys()), "{precision:?} keys");
                assert_eq!(bits(a.values()), bits(b.values()), "{precision:?} values");
            }
        }
    }

    /// A step of several items, each a run of consecutive lanes (prefill chunks of different
    /// lengths after histories of different lengths, and a single decode lane), attended by
    /// tiles against each lane attended alone: the same outputs bit for bit, over full and
    /// sliding-window caches (rings that wrap), both precisions, soft-capping, GQA groups of 3
    /// and 4, head widths off the 16-lane grid, and a bidirectional layer.
    #[test]
    fn tiles_equal_each_lane_alone() {
        let configs = [
            (9, 3, 64, None, None, AttentionPrecision::F16, true),
            (8, 2, 40, Some(23), Some(30.0), AttentionPrecision::F32, true),
            (4, 1, 256, Some(50), None, AttentionPrecision::F16, true),
            (6, 2, 32, None, Some(20.0), AttentionPrecision::F32, false),
            (6, 2, 32, Some(9), None, AttentionPrecision::F16, false),
        ];
        for (n_heads, n_kv_heads, head_dim, window, softcap, precision, causal) in configs {
            let att = Attention {
                n_heads,
                n_kv_heads,
                head_dim,
                scale: 0.11,
                window,
                softcap,
                precision,
                causal,
            };
            let (q_dim, kv_dim) = (att.q_dim(), att.kv_dim());
            let width = q_dim + 2 * kv_dim;
            // (history, chunk) per item; a bidirectional layer attends within its one input.
            let shape: &[(usize, usize)] = if causal {
                &[(0, 70), (41, 37), (90, 1), (3, 2)]
            } else {
                &[(0, 45), (0, 1), (0, 19)]
            };
            let mut sessions: Vec<Session> = shape.iter().map(|_| Session::new(att.cache(&[window]), 256)).collect();
            let tok = [0u32];
            let row =
                |i: usize, p: usize| -> Vec<f32> { (0..width).map(|k| val(k + 1000 * p, i as u32) * 2.0).collect() };
            for (i, (s, &(history, _))) in sessions.iter_mut().zip(shape).enumerate() {
                append_history(&att, s, history, |p| row(i, p));
            }
            let mut lanes = Vec::new();
            let mut data = Vec::new();
            for (i, &(history, chunk)) in shape.iter().enumerate() {
                sessions[i].kv.layers[0].reserve_step(chunk, kv_dim);
                for p in history..history + chunk {
                    lanes.push(LaneRef {
                        item: i,
                        pos: p,
                        ctx: 256,
                    });
                    data.extend(row(i, p));
                }
            }
            let rows = Batch::from_vec(lanes.len(), width, data).expect("rows");
            att.append(&mut items(&mut sessions, &tok), &lanes, 0, &rows, q_dim, q_dim + kv_dim);
            let max = att.tile_tokens();
            let its = items(&mut sessions, &tok);
            let caches: Vec<&KvLayer> = its.iter().map(|it| &it.session.kv.layers[0]).collect();
            let mut tiled = Batch::default();
            tiled.resize(lanes.len(), q_dim);
            att.run_tiles(&caches, &lanes, &tiles(&lanes, max), &rows, 0, head_dim, &mut tiled);
            for (at, l) in lanes.iter().enumerate() {
                let mut alone = Batch::default();
                let one = Batch::from_vec(1, width, rows.lane(at).to_vec()).expect("one lane");
                att.run(&its, std::slice::from_ref(l), 0, &one, 0, head_dim, &mut alone);
                let b = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    b(tiled.lane(at)),
                    b(alone.lane(0)),
                    "{n_heads}/{n_kv_heads}x{head_dim} window {window:?} causal {causal}: lane {at} (item {}, pos {})",
                    l.item,
                    l.pos
                );
            }
        }
    }

    #[test]
    fn tiles_are_taken_for_runs_of_lanes_with_tasks_enough() {
        let att = Attention::causal(8, 2, 64, AttentionPrecision::F16);
        // A 512-token prefill chunk in 16-token tiles on 2 threads.
        assert!(att.tiles_pay(32, 512, 2));
        // One lane per item (batched decode), or a 4-token verify step: per-lane tasks.
        assert!(!att.tiles_pay(8, 8, 2));
        assert!(!att.tiles_pay(1, 4, 2));
        // Runs, but too few tasks for 16 threads.
        assert!(!att.tiles_pay(4, 64, 16));
    }

    #[test]
    fn tiles_are_runs_of_one_item_at_consecutive_positions() {
        let l = |item, pos| LaneRef { item, pos, ctx: 64 };
        let lanes = [l(0, 5), l(0, 6), l(0, 7), l(1, 0), l(1, 2), l(1, 3), l(2, 9)];
        assert_eq!(tiles(&lanes, 8), vec![0..3, 3..4, 4..6, 6..7]);
        assert_eq!(tiles(&lanes, 2), vec![0..2, 2..3, 3..4, 4..6, 6..7]);
    }

    #[test]
    fn tasks_share_rows_when_there_are_enough_of_them() {
        // SmolLM2 (9 heads, groups of 3) on 2 threads: one lane keeps one head per task, four
        // lanes take whole groups.
        assert_eq!(heads_per_task(3, 9, 2), 1);
        assert_eq!(heads_per_task(3, 36, 2), 3);
        // Groups of 4 (Gemma 3 270M, one KV head): halves when a whole group would leave too few.
        assert_eq!(heads_per_task(4, 4, 2), 1);
        assert_eq!(heads_per_task(4, 8, 2), 2);
        assert_eq!(heads_per_task(4, 64, 2), 4);
        // Beyond MAX_TASK_HEADS, the largest divisor that fits; no GQA: one head.
        assert_eq!(heads_per_task(16, 1024, 2), 8);
        assert_eq!(heads_per_task(1, 100, 2), 1);
    }
}
