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

use anelm_kernels::f32_to_f16_slice;

use crate::byte_codec::{Reader, put_f32s, put_u8, put_u16s, put_usize};
use crate::session_snapshot::SnapshotError;

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

    fn write(&mut self, at: usize, x: &[f32]) {
        match self {
            Buf::F32(b) => b[at..at + x.len()].copy_from_slice(x),
            Buf::F16(b) => f32_to_f16_slice(x, &mut b[at..at + x.len()]),
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

/// Base pointer of one buffer, in its storage type.
#[derive(Clone, Copy)]
enum PlaneBase {
    F32(*mut f32),
    F16(*mut u16),
}

impl PlaneBase {
    fn of(b: &mut Buf) -> Self {
        match b {
            Buf::F32(v) => PlaneBase::F32(v.as_mut_ptr()),
            Buf::F16(v) => PlaneBase::F16(v.as_mut_ptr()),
        }
    }
}

/// A layer's K and V buffers split into one plane per KV head, so parallel tasks can each
/// write and read their own head's rows (see [`KvLayer::planes`]). Holds the layer mutably
/// borrowed.
pub(crate) struct Planes<'a> {
    k: PlaneBase,
    v: PlaneBase,
    plane_len: usize,
    heads: usize,
    _held: std::marker::PhantomData<&'a mut KvLayer>,
}

// SAFETY: the pointers address the borrowed layer's buffers (alive for `'a`); `head` hands out
// one plane per head, and its contract makes each plane single-owner.
unsafe impl Sync for Planes<'_> {}
// SAFETY: as above.
unsafe impl Send for Planes<'_> {}

/// One KV head's plane of keys or values, mutable.
pub(crate) enum PlaneMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [u16]),
}

impl PlaneMut<'_> {
    /// Store `x` at `at` (converting to f16 bits for an f16 plane, which rounds).
    pub(crate) fn write(&mut self, at: usize, x: &[f32]) {
        match self {
            PlaneMut::F32(b) => b[at..at + x.len()].copy_from_slice(x),
            PlaneMut::F16(b) => f32_to_f16_slice(x, &mut b[at..at + x.len()]),
        }
    }

    /// The plane as attention reads it.
    pub(crate) fn rows(&self) -> KvRows<'_> {
        match self {
            PlaneMut::F32(b) => KvRows::F32(b),
            PlaneMut::F16(b) => KvRows::F16(b),
        }
    }
}

impl Planes<'_> {
    /// Head `h`'s key and value planes (`slots` rows of the head width each, slot-major).
    ///
    /// # Safety
    /// While the returned planes live, no other call may hand out head `h` again.
    pub(crate) unsafe fn head(&self, h: usize) -> (PlaneMut<'_>, PlaneMut<'_>) {
        assert!(h < self.heads, "head {h} of {}", self.heads);
        let at = h * self.plane_len;
        let one = |b: PlaneBase| match b {
            // SAFETY: head `h`'s plane `at..at + plane_len` lies inside the buffer (`heads`
            // planes of `plane_len`), is disjoint from every other head's, and the caller hands
            // it out once.
            PlaneBase::F32(p) => PlaneMut::F32(unsafe { std::slice::from_raw_parts_mut(p.add(at), self.plane_len) }),
            // SAFETY: as above.
            PlaneBase::F16(p) => PlaneMut::F16(unsafe { std::slice::from_raw_parts_mut(p.add(at), self.plane_len) }),
        };
        (one(self.k), one(self.v))
    }
}

/// Keys and values of one attention layer: for each KV head a plane of `slots` rows of
/// `head_dim` values (head-major), so attention for one head reads contiguous memory. A full
/// layer's slot is its position (`slots` is its capacity); a ring's is `position % slots`.
#[derive(Clone, Debug)]
pub struct KvLayer {
    k: Buf,
    v: Buf,
    /// Positions appended so far (the next position is `len`).
    len: usize,
    /// `Some(w)`: keep only what a query with a `w`-position window needs (ring buffer).
    window: Option<usize>,
    /// Rows each plane holds.
    slots: usize,
    /// The first position still held (ring layers only).
    first: usize,
    /// Planes (KV heads; 1 keeps whole positions together).
    heads: usize,
    /// Values per position, all heads (known from the first append).
    kv_dim: usize,
}

impl Default for KvLayer {
    fn default() -> Self {
        Self {
            k: Buf::default(),
            v: Buf::default(),
            len: 0,
            window: None,
            slots: 0,
            first: 0,
            heads: 1,
            kv_dim: 0,
        }
    }
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

    /// This layer keeping each of `heads` KV heads in its own plane (only before the first
    /// append; `kv_dim` must be a multiple of `heads`).
    pub fn with_heads(mut self, heads: usize) -> Self {
        debug_assert!(self.is_empty());
        self.heads = heads.max(1);
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

    /// Planes (KV heads kept apart; 1 keeps whole positions together).
    pub(crate) fn heads(&self) -> usize {
        self.heads
    }

    /// Values per position, all heads (0 before the first append).
    pub(crate) fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Values per plane row.
    fn plane_dim(&self) -> usize {
        self.kv_dim / self.heads
    }

    /// Where KV head `kv_head` (of `head_dim` values) sits in [`KvLayer::keys`] and
    /// [`KvLayer::values`]: slot `s`'s values start at `offset + s · stride`.
    pub fn row_layout(&self, kv_head: usize, head_dim: usize) -> (usize, usize) {
        let pd = self.plane_dim().max(1);
        let at = kv_head * head_dim;
        (pd, (at / pd) * self.slots * pd + at % pd)
    }

    /// Make room for a step that appends `n_new` positions of `kv_dim` values: a full layer
    /// grows by an eighth of its length (at least [`GROW_POSITIONS`], at least the step); a ring
    /// grows to `window − 1 + n_new + REWIND_SLACK` slots (never shrinks). Held positions stay.
    pub fn reserve_step(&mut self, n_new: usize, kv_dim: usize) {
        debug_assert!(self.kv_dim == 0 || self.kv_dim == kv_dim);
        self.kv_dim = kv_dim;
        let (need, grow_to) = match self.window {
            // Grow by an eighth rather than by doubling: a long session then holds at most
            // ~12 % unused positions per layer, and appends stay amortised O(1).
            None => (self.len + n_new, self.len + n_new.max(GROW_POSITIONS).max(self.len / 8)),
            Some(w) => (w - 1 + n_new.max(1), w - 1 + n_new.max(1) + REWIND_SLACK),
        };
        if need <= self.slots {
            return;
        }
        let (old, oldest, storage, pd) = (self.slots, self.oldest(), self.storage(), self.plane_dim());
        let mut k = Buf::zeros(storage, grow_to * kv_dim);
        let mut v = Buf::zeros(storage, grow_to * kv_dim);
        for h in 0..self.heads {
            for p in oldest..self.len {
                let (from, to) = ((h * old + p % old) * pd, (h * grow_to + p % grow_to) * pd);
                k.copy_from(&self.k, from, to, pd);
                v.copy_from(&self.v, from, to, pd);
            }
        }
        (self.k, self.v, self.slots) = (k, v, grow_to);
    }

    /// Append the next position's key and value (`kv_dim` values each). The layer should have
    /// been given room by [`KvLayer::reserve_step`] for the step; without it, it grows here.
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len(), v.len());
        let d = k.len();
        let room = match self.window {
            None => self.len < self.slots,
            Some(w) => self.slots >= w,
        };
        if !room || self.kv_dim != d {
            self.reserve_step(1, d);
        }
        let (pd, slot) = (self.plane_dim(), self.len % self.slots);
        for h in 0..self.heads {
            let at = (h * self.slots + slot) * pd;
            self.k.write(at, &k[h * pd..(h + 1) * pd]);
            self.v.write(at, &v[h * pd..(h + 1) * pd]);
        }
        if self.window.is_some() {
            self.first = self.first.max((self.len + 1).saturating_sub(self.slots));
        }
        self.len += 1;
    }

    /// Open the next position for per-head writes through [`KvLayer::planes`]: room is made
    /// (as [`KvLayer::push`] makes it), the length grows by one and the position's slot is
    /// returned. Its values are unspecified until every head's plane row is written.
    pub(crate) fn open_position(&mut self, kv_dim: usize) -> usize {
        let room = match self.window {
            None => self.len < self.slots,
            Some(w) => self.slots >= w,
        };
        if !room || self.kv_dim != kv_dim {
            self.reserve_step(1, kv_dim);
        }
        let slot = self.len % self.slots;
        if self.window.is_some() {
            self.first = self.first.max((self.len + 1).saturating_sub(self.slots));
        }
        self.len += 1;
        slot
    }

    /// The key and value buffers as per-KV-head planes for tasks that each own one head
    /// (`None` unless every head has its own plane: built `with_heads` for all KV heads).
    pub(crate) fn planes(&mut self, kv_heads: usize) -> Option<Planes<'_>> {
        if self.heads != kv_heads || self.slots == 0 || self.kv_dim == 0 {
            return None;
        }
        let plane_len = self.slots * self.plane_dim();
        Some(Planes {
            k: PlaneBase::of(&mut self.k),
            v: PlaneBase::of(&mut self.v),
            plane_len,
            heads: self.heads,
            _held: std::marker::PhantomData,
        })
    }

    /// Keys, by plane then slot (see [`KvLayer::row_layout`] and [`KvLayer::segments`]).
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

    /// Drop every position at or after `len` (see [`KvLayer::can_truncate`]); a full layer
    /// keeps its buffers for the positions that follow.
    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if self.window.is_some() && len == 0 {
            let storage = self.storage();
            (self.k, self.v) = (Buf::empty(storage), Buf::empty(storage));
            (self.slots, self.first) = (0, 0);
        }
        self.len = len;
    }

    /// Append this layer's state for the first `len` positions to `out`: the rows a query at
    /// position `len` reads (every row of a full layer, the last `window − 1` of a ring), plane by
    /// plane, in the storage type's own bits. False when the layer no longer holds them.
    pub(crate) fn encode_prefix(&self, len: usize, out: &mut Vec<u8>) -> bool {
        let storage_code = match self.storage() {
            KvStorage::F32 => 0,
            KvStorage::F16 => 1,
        };
        let (start, end) = if self.len == 0 {
            (0, 0) // a layer the model never writes (a hybrid model's recurrent layers)
        } else {
            match self.window {
                None => (0, len),
                Some(w) => (len.saturating_sub(w - 1), len),
            }
        };
        if end > self.len || (end > 0 && start < self.oldest()) {
            return false;
        }
        let kv_dim = if end == 0 { 0 } else { self.kv_dim };
        put_u8(out, storage_code);
        put_usize(out, self.window.unwrap_or(0));
        put_usize(out, self.heads);
        put_usize(out, kv_dim);
        put_usize(out, start);
        put_usize(out, end);
        let pd = self.plane_dim();
        for buf in [&self.k, &self.v] {
            for h in 0..self.heads {
                for range in self.segments(start..end) {
                    let at = (h * self.slots + range.start) * pd;
                    let n = range.len() * pd;
                    match buf {
                        Buf::F32(b) => put_f32s(out, &b[at..at + n]),
                        Buf::F16(b) => put_u16s(out, &b[at..at + n]),
                    }
                }
            }
        }
        true
    }

    /// Replace this layer's contents with saved rows (checked by [`LayerPrefix::check_fits`]):
    /// afterwards it holds `p.end()` positions and serves the next query as the layer that was
    /// saved did.
    pub(crate) fn restore_prefix(&mut self, p: LayerPrefix) {
        self.release();
        if p.end == 0 {
            return;
        }
        // Room as for a step appending the rows after position 0 (a ring: its window plus slack).
        match self.window {
            None => self.reserve_step(p.end, p.kv_dim),
            Some(_) => self.reserve_step(1, p.kv_dim),
        }
        let (pd, rows) = (self.plane_dim(), p.end - p.start);
        self.len = p.end;
        self.first = p.start;
        for (dst, src) in [(&mut self.k, &p.k), (&mut self.v, &p.v)] {
            for h in 0..self.heads {
                for (i, pos) in (p.start..p.end).enumerate() {
                    let slot = pos % self.slots;
                    dst.copy_from(src, (h * rows + i) * pd, (h * self.slots + slot) * pd, pd);
                }
            }
        }
    }

    /// Forget every position and free the buffers.
    fn release(&mut self) {
        let storage = self.storage();
        (self.k, self.v) = (Buf::empty(storage), Buf::empty(storage));
        (self.slots, self.first, self.len) = (0, 0, 0);
    }

    /// Bytes of the positions held (a ring: all its slots).
    fn bytes(&self) -> usize {
        let rows = match self.window {
            None => self.len,
            Some(_) => self.slots,
        };
        2 * self.k.element_bytes() * rows * self.kv_dim
    }

    fn reserved_bytes(&self) -> usize {
        self.k.element_bytes() * (self.k.capacity() + self.v.capacity())
    }
}

/// One layer's saved rows for a session prefix (see [`KvLayer::encode_prefix`]), decoded and
/// not yet checked against a layer.
#[derive(Debug)]
pub(crate) struct LayerPrefix {
    storage: KvStorage,
    window: Option<usize>,
    heads: usize,
    kv_dim: usize,
    /// Positions `start..end` are held, plane by plane (`heads` planes of `end − start` rows).
    start: usize,
    end: usize,
    k: Buf,
    v: Buf,
}

impl LayerPrefix {
    /// Read one layer written by [`KvLayer::encode_prefix`].
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, SnapshotError> {
        let storage = match r.u8()? {
            0 => KvStorage::F32,
            1 => KvStorage::F16,
            other => return Err(SnapshotError::Invalid(format!("unknown KV storage code {other}"))),
        };
        let window = match r.usize()? {
            0 => None,
            w => Some(w),
        };
        let (heads, kv_dim, start, end) = (r.usize()?, r.usize()?, r.usize()?, r.usize()?);
        if heads == 0 || (kv_dim > 0 && kv_dim % heads != 0) || start > end {
            return Err(SnapshotError::Invalid(format!(
                "KV layer of {heads} heads, {kv_dim} values, positions {start}..{end}"
            )));
        }
        let n = (end - start)
            .checked_mul(kv_dim)
            .ok_or_else(|| SnapshotError::Invalid("KV layer size overflows".into()))?;
        let read = |r: &mut Reader<'_>| -> Result<Buf, SnapshotError> {
            Ok(match storage {
                KvStorage::F32 => Buf::F32(r.f32s(n)?),
                KvStorage::F16 => Buf::F16(r.u16s(n)?),
            })
        };
        let k = read(r)?;
        let v = read(r)?;
        Ok(Self {
            storage,
            window,
            heads,
            kv_dim,
            start,
            end,
            k,
            v,
        })
    }

    /// Positions this layer's saved rows reach (0 for a layer that was never used).
    pub(crate) fn end(&self) -> usize {
        self.end
    }

    /// Why `layer` cannot take these rows, if it cannot.
    pub(crate) fn check_fits(&self, layer: &KvLayer) -> Result<(), SnapshotError> {
        let mismatch = |what: &str| Err(SnapshotError::Mismatch(format!("KV {what}")));
        if self.end == 0 {
            return Ok(());
        }
        if self.storage != layer.storage() {
            return mismatch("storage type");
        }
        if self.window != layer.window {
            return mismatch("window");
        }
        if self.heads != layer.heads {
            return mismatch("head planes");
        }
        if layer.kv_dim != 0 && layer.kv_dim != self.kv_dim {
            return mismatch("width");
        }
        if let Some(w) = self.window
            && self.start != self.end.saturating_sub(w - 1)
        {
            return mismatch("window rows");
        }
        if self.window.is_none() && self.start != 0 {
            return mismatch("rows");
        }
        Ok(())
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

    /// This cache keeping each of `heads` KV heads in its own plane (only while empty).
    pub fn with_heads(mut self, heads: usize) -> Self {
        self.layers = self.layers.into_iter().map(|l| l.with_heads(heads)).collect();
        self
    }

    /// Floats per position per layer.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Whether [`KvCache::truncate`] to `len` keeps `len` positions (every sliding layer still
    /// holds the window before `len`).
    pub fn can_truncate(&self, len: usize) -> bool {
        self.layers.iter().all(|l| l.can_truncate(len))
    }

    /// Drop every position at or after `len` and return how many positions are kept: `len`, or
    /// 0 (everything dropped) when a sliding layer no longer holds the window before `len`.
    pub fn truncate(&mut self, len: usize) -> usize {
        let len = if self.can_truncate(len) { len } else { 0 };
        for l in &mut self.layers {
            l.truncate(len);
        }
        len
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(KvLayer::bytes).sum()
    }

    /// Forget every position and give the buffers' memory back.
    pub fn release(&mut self) {
        self.layers.iter_mut().for_each(KvLayer::release);
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
    fn head_planes_read_back_each_head_in_both_layer_kinds() {
        // Two KV heads of 2 values: position p stores [p, -p] for head 0 and [10p, -10p] for 1.
        let row = |p: usize| [p as f32, -(p as f32), 10.0 * p as f32, -10.0 * p as f32];
        for storage in [KvStorage::F32, KvStorage::F16] {
            for mut l in [KvLayer::full(), KvLayer::sliding(5)] {
                l = l.with_heads(2).with_storage(storage);
                for p in 0..150 {
                    l.reserve_step(1, 4);
                    l.push(&row(p), &row(p));
                }
                let start = l.window().map_or(0, |w| 150 - w);
                for head in 0..2 {
                    let (stride, offset) = l.row_layout(head, 2);
                    let got: Vec<f32> = l
                        .segments(start..150)
                        .into_iter()
                        .flat_map(|r| r.map(|slot| offset + slot * stride))
                        .map(|at| match l.values() {
                            KvRows::F32(v) => v[at + 1],
                            KvRows::F16(v) => anelm_kernels::f16_to_f32(v[at + 1]),
                        })
                        .collect();
                    let scale = if head == 0 { -1.0 } else { -10.0 };
                    let want: Vec<f32> = (start..150).map(|p| scale * p as f32).collect();
                    assert_eq!(got, want, "{storage:?} window {:?} head {head}", l.window());
                }
            }
        }
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
