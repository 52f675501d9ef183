//! Per-session KV cache for attention layers: values rounded as the model's attention precision
//! asks, in f32 storage. A full layer grows on demand up to the session's context size; a
//! sliding-window layer (Gemma 3 local layers) is a ring buffer that keeps only the positions a
//! later query can still see, so its memory is bounded by the window, not the context.
//!
//! Ring layout: position `p` lives in slot `p % slots`. A step that appends `n` positions to a
//! layer with window `w` needs `w − 1 + n` slots (its first query looks `w − 1` positions back and
//! every appended position must survive until the step's attention ran), so the ring grows to
//! that plus [`REWIND_SLACK`] before the step; in steady decode (`n = 1`) it holds `w + 64`
//! positions. The slack lets a session rewind up to 64 positions (a prompt cache re-rendering the
//! end of a chat turn) without starting over.

use std::ops::Range;

use anelm_kernels::f32_to_f16;

/// Extra ring slots beyond what a step needs, so short rewinds keep the session.
pub const REWIND_SLACK: usize = 64;

/// Positions a full layer's buffers grow by when they run out (see `KvLayer::reserve_step`).
const GROW_POSITIONS: usize = 64;

/// How a cache stores its values: f32, or f16 bits when the model's attention rounds K and V
/// to f16 anyway (llama.cpp's f16 cache), which halves the memory and the bytes attention reads
/// for the same numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvStorage {
    /// Full-precision floats.
    #[default]
    F32,
    /// Half-precision bits; values must already be f16-representable to be stored exactly.
    F16,
}

/// Cached rows in their storage type, as attention reads them.
pub type KvRows<'a> = anelm_kernels::CacheRows<'a>;

/// One growable buffer of cached values in either storage type.
#[derive(Clone, Debug)]
enum Buf {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl Default for Buf {
    fn default() -> Self {
        Buf::F32(Vec::new())
    }
}

impl Buf {
    fn empty(storage: KvStorage) -> Self {
        match storage {
            KvStorage::F32 => Buf::F32(Vec::new()),
            KvStorage::F16 => Buf::F16(Vec::new()),
        }
    }

    fn zeros(storage: KvStorage, n: usize) -> Self {
        match storage {
            KvStorage::F32 => Buf::F32(vec![0.0; n]),
            KvStorage::F16 => Buf::F16(vec![0; n]),
        }
    }

    fn storage(&self) -> KvStorage {
        match self {
            Buf::F32(_) => KvStorage::F32,
            Buf::F16(_) => KvStorage::F16,
        }
    }

    fn len(&self) -> usize {
        match self {
            Buf::F32(b) => b.len(),
            Buf::F16(b) => b.len(),
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Buf::F32(b) => b.capacity(),
            Buf::F16(b) => b.capacity(),
        }
    }

    fn element_bytes(&self) -> usize {
        match self {
            Buf::F32(_) => 4,
            Buf::F16(_) => 2,
        }
    }

    fn reserve_exact(&mut self, n: usize) {
        match self {
            Buf::F32(b) => b.reserve_exact(n),
            Buf::F16(b) => b.reserve_exact(n),
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Buf::F32(b) => b.truncate(n),
            Buf::F16(b) => b.truncate(n),
        }
    }

    fn extend(&mut self, x: &[f32]) {
        match self {
            Buf::F32(b) => b.extend_from_slice(x),
            Buf::F16(b) => b.extend(x.iter().map(|&e| f32_to_f16(e))),
        }
    }

    fn write(&mut self, at: usize, x: &[f32]) {
        match self {
            Buf::F32(b) => b[at..at + x.len()].copy_from_slice(x),
            Buf::F16(b) => b[at..at + x.len()]
                .iter_mut()
                .zip(x)
                .for_each(|(d, &e)| *d = f32_to_f16(e)),
        }
    }

    /// Copy `n` values from `from` in `src` to `to` in `self` (same storage type).
    fn copy_from(&mut self, src: &Buf, from: usize, to: usize, n: usize) {
        match (self, src) {
            (Buf::F32(d), Buf::F32(s)) => d[to..to + n].copy_from_slice(&s[from..from + n]),
            (Buf::F16(d), Buf::F16(s)) => d[to..to + n].copy_from_slice(&s[from..from + n]),
            _ => unreachable!("a layer's buffers share one storage type"),
        }
    }

    fn rows(&self) -> KvRows<'_> {
        match self {
            Buf::F32(b) => KvRows::F32(b),
            Buf::F16(b) => KvRows::F16(b),
        }
    }
}

/// Keys and values of one attention layer, one row of `kv_dim` values per position.
#[derive(Clone, Debug, Default)]
pub struct KvLayer {
    k: Buf,
    v: Buf,
    /// Positions appended so far (the next position is `len`).
    len: usize,
    /// `Some(w)`: keep only what a query with a `w`-position window needs (ring buffer).
    window: Option<usize>,
    /// Ring slots allocated (ring layers only).
    slots: usize,
    /// The first position still held (ring layers only).
    first: usize,
}

impl KvLayer {
    /// A layer that keeps every position.
    pub fn full() -> Self {
        Self::default()
    }

    /// A ring-buffer layer for attention over the last `window` positions (the current one
    /// included). `window` 0 is treated as 1.
    pub fn sliding(window: usize) -> Self {
        Self {
            window: Some(window.max(1)),
            ..Self::default()
        }
    }

    /// This layer storing its values as `storage` (only before the first append).
    pub fn with_storage(mut self, storage: KvStorage) -> Self {
        debug_assert!(self.is_empty());
        (self.k, self.v) = (Buf::empty(storage), Buf::empty(storage));
        self
    }

    /// How the values are stored.
    pub fn storage(&self) -> KvStorage {
        self.k.storage()
    }

    /// The window, for a sliding layer.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Positions appended so far (including those a ring has dropped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first append.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first position still held (0 for a full layer).
    pub fn oldest(&self) -> usize {
        match self.window {
            Some(_) => self.first,
            None => 0,
        }
    }

    /// Make room for a step that appends `n_new` positions of `kv_dim` floats: a ring grows to
    /// `window − 1 + n_new + REWIND_SLACK` slots (never shrinks), keeping every position it holds.
    pub fn reserve_step(&mut self, n_new: usize, kv_dim: usize) {
        let Some(w) = self.window else {
            // Grow by an eighth (at least GROW_POSITIONS positions) rather than by doubling: a
            // long session then holds at most ~12 % unused positions per layer, not up to as
            // many as it has used, and appends stay amortised O(1).
            let extra = n_new.max(GROW_POSITIONS).max(self.len / 8) * kv_dim;
            for buf in [&mut self.k, &mut self.v] {
                if buf.capacity() < buf.len() + n_new * kv_dim {
                    buf.reserve_exact(extra);
                }
            }
            return;
        };
        let need = w - 1 + n_new.max(1) + REWIND_SLACK;
        if w - 1 + n_new.max(1) <= self.slots {
            return;
        }
        let (old_slots, oldest, storage) = (self.slots, self.oldest(), self.storage());
        let mut k = Buf::zeros(storage, need * kv_dim);
        let mut v = Buf::zeros(storage, need * kv_dim);
        for p in oldest..self.len {
            let (from, to) = ((p % old_slots) * kv_dim, (p % need) * kv_dim);
            k.copy_from(&self.k, from, to, kv_dim);
            v.copy_from(&self.v, from, to, kv_dim);
        }
        (self.k, self.v, self.slots) = (k, v, need);
    }

    /// Append the next position's key and value (`kv_dim` floats each). A ring layer must have
    /// been given room by [`KvLayer::reserve_step`] for this step; without it the ring is grown
    /// here to hold the window.
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len(), v.len());
        match self.window {
            None => {
                self.k.extend(k);
                self.v.extend(v);
            }
            Some(_) => {
                let d = k.len();
                if self.slots == 0 || self.k.len() != self.slots * d {
                    self.reserve_step(1, d);
                }
                let at = (self.len % self.slots) * d;
                self.k.write(at, k);
                self.v.write(at, v);
                self.first = self.first.max((self.len + 1).saturating_sub(self.slots));
            }
        }
        self.len += 1;
    }

    /// Keys, rows of `kv_dim` values indexed by slot (see [`KvLayer::segments`]).
    pub fn keys(&self) -> KvRows<'_> {
        self.k.rows()
    }

    /// Values, laid out as [`KvLayer::keys`].
    pub fn values(&self) -> KvRows<'_> {
        self.v.rows()
    }

    /// The slot ranges holding `positions`, oldest first (two when a ring wraps; the second may
    /// be empty). `positions` must lie in `oldest()..len()`.
    pub fn segments(&self, positions: Range<usize>) -> [Range<usize>; 2] {
        debug_assert!(positions.start >= self.oldest() && positions.end <= self.len);
        if self.window.is_none() || positions.is_empty() {
            return [positions, 0..0];
        }
        let n = positions.end - positions.start;
        let start = positions.start % self.slots;
        if start + n <= self.slots {
            [start..start + n, 0..0]
        } else {
            [start..self.slots, 0..start + n - self.slots]
        }
    }

    /// Whether the layer can be rewound to `len` positions and still serve the queries that
    /// follow (a ring that has dropped positions the window before `len` needs cannot).
    pub fn can_truncate(&self, len: usize) -> bool {
        match self.window {
            None => true,
            Some(w) => len >= self.len || len == 0 || len.saturating_sub(w - 1) >= self.oldest(),
        }
    }

    /// Drop every position at or after `len` (see [`KvLayer::can_truncate`]).
    fn truncate(&mut self, len: usize, kv_dim: usize) {
        if len >= self.len {
            return;
        }
        match self.window {
            None => {
                self.k.truncate(len * kv_dim);
                self.v.truncate(len * kv_dim);
            }
            Some(_) if len == 0 => {
                let storage = self.storage();
                (self.k, self.v) = (Buf::empty(storage), Buf::empty(storage));
                (self.slots, self.first) = (0, 0);
            }
            Some(_) => {}
        }
        self.len = len;
    }

    fn bytes(&self) -> usize {
        self.k.element_bytes() * (self.k.len() + self.v.len())
    }

    fn reserved_bytes(&self) -> usize {
        self.k.element_bytes() * (self.k.capacity() + self.v.capacity())
    }
}

/// The KV cache of one session across all attention layers.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// One entry per layer (unused for layers without attention).
    pub layers: Vec<KvLayer>,
    kv_dim: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` full layers of `kv_dim` floats per position.
    pub fn new(n_layers: usize, kv_dim: usize) -> Self {
        Self {
            layers: vec![KvLayer::full(); n_layers],
            kv_dim,
        }
    }

    /// An empty cache with one layer per entry of `windows`: `None` keeps every position,
    /// `Some(w)` is a ring buffer for a `w`-position sliding window.
    pub fn with_windows(windows: &[Option<usize>], kv_dim: usize) -> Self {
        Self {
            layers: windows
                .iter()
                .map(|w| w.map_or_else(KvLayer::full, KvLayer::sliding))
                .collect(),
            kv_dim,
        }
    }

    /// This cache storing every layer's values as `storage` (only while empty).
    pub fn with_storage(mut self, storage: KvStorage) -> Self {
        self.layers = self.layers.into_iter().map(|l| l.with_storage(storage)).collect();
        self
    }

    /// Floats per position per layer.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Drop every position at or after `len` and return how many positions are kept: `len`, or
    /// 0 (everything dropped) when a sliding layer no longer holds the window before `len`.
    pub fn truncate(&mut self, len: usize) -> usize {
        let len = if self.layers.iter().all(|l| l.can_truncate(len)) {
            len
        } else {
            0
        };
        for l in &mut self.layers {
            l.truncate(len, self.kv_dim);
        }
        len
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(KvLayer::bytes).sum()
    }

    /// Bytes allocated, spare capacity included (what the cache costs in memory).
    pub fn reserved_bytes(&self) -> usize {
        self.layers.iter().map(KvLayer::reserved_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p: usize) -> [f32; 2] {
        [p as f32, -(p as f32)]
    }

    /// The positions `segments` yields, read back through the keys.
    fn read(l: &KvLayer, positions: Range<usize>) -> Vec<f32> {
        l.segments(positions)
            .into_iter()
            .flat_map(|s| {
                s.map(|slot| match l.keys() {
                    KvRows::F32(k) => k[slot * 2],
                    KvRows::F16(k) => anelm_kernels::f16_to_f32(k[slot * 2]),
                })
            })
            .collect()
    }

    #[test]
    fn ring_keeps_the_window_and_reads_in_position_order() {
        for storage in [KvStorage::F32, KvStorage::F16] {
            ring_keeps_the_window(storage);
        }
    }

    fn ring_keeps_the_window(storage: KvStorage) {
        let mut l = KvLayer::sliding(4).with_storage(storage);
        let elem = if storage == KvStorage::F16 { 2 } else { 4 };
        for p in 0..11 {
            l.reserve_step(1, 2);
            l.push(&row(p), &row(p));
            let start = (p + 1).saturating_sub(4);
            let want: Vec<f32> = (start..=p).map(|q| q as f32).collect();
            assert_eq!(read(&l, start..p + 1), want, "after position {p}");
        }
        let slots = 4 + REWIND_SLACK;
        assert_eq!(l.bytes(), elem * 2 * slots * 2, "window + slack slots of k and v");
        // Wrap the ring a few times.
        for p in 11..3 * slots {
            l.reserve_step(1, 2);
            l.push(&row(p), &row(p));
        }
        let end = 3 * slots;
        assert_eq!(
            read(&l, end - 4..end),
            (end - 4..end).map(|q| q as f32).collect::<Vec<_>>()
        );
        assert_eq!(l.oldest(), end - slots);
        // A step larger than the slack grows the ring and keeps what it held.
        l.reserve_step(100, 2);
        assert_eq!(
            read(&l, end - slots..end),
            (end - slots..end).map(|q| q as f32).collect::<Vec<_>>()
        );
        for p in end..end + 100 {
            l.push(&row(p), &row(p));
        }
        let want: Vec<f32> = (end - 3..end + 100).map(|q| q as f32).collect();
        assert_eq!(read(&l, end - 3..end + 100), want);
    }

    #[test]
    fn truncation_within_the_window_keeps_and_beyond_it_resets() {
        for storage in [KvStorage::F32, KvStorage::F16] {
            truncation_keeps_or_resets(storage);
        }
    }

    fn truncation_keeps_or_resets(storage: KvStorage) {
        let mut c = KvCache::with_windows(&[Some(4), None], 2).with_storage(storage);
        let slots = 4 + REWIND_SLACK;
        let len = 200;
        for p in 0..len {
            for l in &mut c.layers {
                l.reserve_step(1, 2);
                l.push(&row(p), &row(p));
            }
        }
        let oldest = len - slots;
        assert_eq!(c.layers[0].oldest(), oldest);
        // Rewinding to `oldest + 3` needs `oldest..oldest + 3` — held.
        assert_eq!(c.truncate(oldest + 3), oldest + 3);
        assert_eq!(
            read(&c.layers[0], oldest..oldest + 3),
            (oldest..oldest + 3).map(|q| q as f32).collect::<Vec<_>>()
        );
        // One further back would need `oldest − 1`, gone.
        assert!(!c.layers[0].can_truncate(oldest + 2));
        assert!(c.layers[0].can_truncate(oldest + 3));
        // Rewinding far back: everything goes.
        assert_eq!(c.truncate(5), 0);
        assert!(c.layers.iter().all(|l| l.is_empty() && l.storage() == storage));
        assert_eq!(c.bytes(), 0);
    }
}
