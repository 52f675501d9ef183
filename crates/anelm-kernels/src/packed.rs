//! Weights repacked for the x86 integer-dot path: eight rows interleaved per block, so one
//! 256-bit `u8 × i8` dot computes four products for each of eight rows against one broadcast
//! activation group. A row's whole block dot then stays in one integer register across the
//! block (no horizontal sums), and each block's scales are applied to eight rows at once.
//!
//! The row-major tile (`simd_x86::dot_rows4`) pays, for every (row, lane, block), a convert, a
//! scale multiply-broadcast, an FMA and Q4_1's scalar minimum term beside the dot itself; here
//! that work is per (8 rows, lane, block). Single-stream decode and batched lanes both gain.
//!
//! Every format's layout is in `packed_layout.rs`; the Q4_1 and Q8_0 ones as an example.
//! Layout (Q4_1, rows in groups of 8, `nb = cols / 32` blocks per row): group `g`, block `b` is
//! 160 bytes at `(g · nb + b) · 160`:
//! - `[0, 16)`: the 8 rows' f16 scales `d`; `[16, 32)`: their f16 minimums `m`;
//! - `[32 + 32k, 64 + 32k)` for `k < 4`: bytes `4k .. 4k+4` of each row's 16 quant bytes, row
//!   after row. Low nibbles are then elements `4k .. 4k+4` of the 8 rows, high nibbles elements
//!   `16 + 4k .. 16 + 4k + 4` (ggml's Q4_1 puts element `i` in the low nibble of byte `i` and
//!   element `i + 16` in its high nibble).
//!
//! Q8_0 likewise, 272 bytes per (group, block): the 8 f16 scales, then for `k < 8` bytes
//! `4k .. 4k+4` of each row's 32 quants, row after row. Its signed weights go through the usual
//! sign transfer (`|w|`, `sign(x, w)`) so the unsigned × signed dot applies.
//!
//! Where the CPU has AVX-512 VNNI, matrices whose rows are a multiple of 16 are packed in groups
//! of 16 rows instead ([`WIDE_GROUP_ROWS`]), the same layout with every 8 replaced by 16 (320
//! bytes per Q4_1 group-block, 544 per Q8_0, whose quants are stored offset by 128 as unsigned
//! bytes), so one 512-bit dot serves 16 rows: the batched
//! step's lanes then cost half the instructions (`packed_x86_wide`). Both widths give the same
//! values.
//!
//! On aarch64 the same 8-row layout runs NEON kernels (`packed_neon*.rs`): `sdot` by element
//! takes one register of 4 rows × 4 bytes against one 4-byte activation group, exactly the
//! layout's vector halves; `smull` where the CPU lacks dotprod. Their results have the row-major
//! kernels' bits for every format.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::activations::{Activations, BlockWriter};
use crate::error::{KernelError, check_len};
use crate::format::WeightFormat;
use crate::packed_packer::Packer;
use crate::weight_memory::WeightBytes;

/// Rows per interleaved group of the AVX2 layout (the unit [`Combine`] works in).
pub const PACK_ROWS: usize = 8;

/// Rows per group of the AVX-512 layout.
pub const WIDE_GROUP_ROWS: usize = 16;

/// What [`PackedMatrix::pack_filled`] calls to make row-major rows: `(first_row, dst)`.
pub type RowFill<'a> = dyn FnMut(usize, &mut [u8]) -> Result<(), KernelError> + 'a;

/// A matrix in the interleaved layout (see the module docs); same bytes as the stored form.
pub struct PackedMatrix {
    fmt: WeightFormat,
    rows: usize,
    cols: usize,
    /// Rows per interleaved group: [`PACK_ROWS`] or [`WIDE_GROUP_ROWS`].
    group_rows: usize,
    /// In a shared huge-page mapping (see `weight_memory`).
    data: WeightBytes,
    /// Where the weights of the matrix that ran after this one last time are (see
    /// `RUN_ORDER`).
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
    successor: Arc<Successor>,
}

impl Clone for PackedMatrix {
    /// A copy with its own run-order record (it may run in another place than the original).
    fn clone(&self) -> Self {
        Self {
            fmt: self.fmt,
            rows: self.rows,
            cols: self.cols,
            group_rows: self.group_rows,
            data: self.data.clone(),
            successor: Arc::default(),
        }
    }
}

/// The weight bytes of a matrix's successor, as addresses for a prefetch hint only (see
/// `Pool::prefetch_range`: a stale range is harmless), so no lifetime ties two matrices.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
#[derive(Default)]
struct Successor {
    base: AtomicUsize,
    len: AtomicUsize,
}

/// Which packed matrix ran last. A decode step runs the same matrices in the same order every
/// time, so "the one after me last time" is the one after me next time: when a matrix's loop
/// ends, the pool's waiting workers prefetch its successor's first bytes while the caller does
/// the step's serial work (norms, RoPE, attention set-up) before that successor runs. When
/// several models interleave, the guess is merely wrong, which costs a little bandwidth.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
static RUN_ORDER: Mutex<Option<Arc<Successor>>> = Mutex::new(None);

impl PackedMatrix {
    /// Record that this matrix runs now (telling its predecessor where it is) and return its
    /// own successor's last known range.
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
    fn note_run(&self) -> (usize, usize) {
        if let Ok(mut last) = RUN_ORDER.lock() {
            if let Some(prev) = last.as_ref().filter(|p| !Arc::ptr_eq(p, &self.successor)) {
                prev.base.store(self.data.as_ptr() as usize, Ordering::Relaxed);
                prev.len.store(self.data.len(), Ordering::Relaxed);
            }
            *last = Some(self.successor.clone());
        }
        (
            self.successor.base.load(Ordering::Relaxed),
            self.successor.len.load(Ordering::Relaxed),
        )
    }
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({} {}×{}, groups of {})",
            self.fmt.name(),
            self.rows,
            self.cols,
            self.group_rows
        )
    }
}

impl PackedMatrix {
    /// Repack a row-major `rows × cols` matrix, when this CPU has a kernel for the packed form
    /// and the shape fits it (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS, or on x86-64
    /// IQ4_NL; rows a multiple of 8); `Ok(None)` otherwise, and the
    /// row-major kernels serve the matrix as before. Groups of 16 rows where the CPU has the
    /// AVX-512 kernels and the rows allow it (`ANELM_PACK_WIDE=0` keeps 8, for A/B runs).
    pub fn pack(fmt: WeightFormat, w: &[u8], rows: usize, cols: usize) -> Result<Option<Self>, KernelError> {
        Self::pack_releasing(fmt, w, rows, cols, &mut |_| {})
    }

    /// [`PackedMatrix::pack`], handing each stretch of `w` it has finished reading (about 1 MB
    /// at a time) to `release`, so a caller can return the source pages while packing goes on
    /// (at most one stretch is then held twice, not the whole matrix).
    pub fn pack_releasing(
        fmt: WeightFormat,
        w: &[u8],
        rows: usize,
        cols: usize,
        release: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<Self>, KernelError> {
        Self::pack_in_groups(fmt, w, rows, cols, Self::default_group_rows(fmt, rows), release)
    }

    /// [`PackedMatrix::pack`] with a chosen group height ([`PACK_ROWS`] or [`WIDE_GROUP_ROWS`]),
    /// for tests and A/B measurements; `Ok(None)` where this CPU has no kernel for that height or
    /// the rows do not divide into it.
    pub fn pack_with_group_rows(
        fmt: WeightFormat,
        w: &[u8],
        rows: usize,
        cols: usize,
        group_rows: usize,
    ) -> Result<Option<Self>, KernelError> {
        let served = match group_rows {
            PACK_ROWS => true,
            WIDE_GROUP_ROWS => wide_kernel_available(),
            _ => false,
        };
        if !served {
            return Ok(None);
        }
        Self::pack_in_groups(fmt, w, rows, cols, group_rows, &mut |_| {})
    }

    /// [`PackedMatrix::pack`] for a matrix whose row-major bytes are made as packing goes, so
    /// they never exist all at once: `fill(first_row, dst)` writes the row-major bytes of rows
    /// `first_row ..` (`dst.len()` is a whole number of rows, about 1 MB of them) and is called
    /// for consecutive windows from row 0 to the end. `Ok(None)` (without calling `fill`) where
    /// [`PackedMatrix::pack`] would give `None`; `fill`'s error is returned as it is.
    pub fn pack_filled(
        fmt: WeightFormat,
        rows: usize,
        cols: usize,
        fill: &mut RowFill<'_>,
    ) -> Result<Option<Self>, KernelError> {
        let Some(mut packer) = Packer::new(fmt, rows, cols, Self::default_group_rows(fmt, rows))? else {
            return Ok(None);
        };
        let mut window = vec![0u8; packer.groups_per_window * packer.group_src];
        let mut g = 0;
        while g < packer.groups {
            let n = packer.groups_per_window.min(packer.groups - g);
            let src = &mut window[..n * packer.group_src];
            fill(g * packer.group_rows, src)?;
            packer.pack_groups(g, src);
            g += n;
        }
        Ok(Some(Self::assembled(fmt, rows, cols, packer)))
    }

    /// The group height [`PackedMatrix::pack`] picks for `fmt` with `rows` rows on this CPU.
    fn default_group_rows(fmt: WeightFormat, rows: usize) -> usize {
        let wide = wide_kernel_available() && crate::Tuning::get().pack_wide;
        if wide && rows.is_multiple_of(WIDE_GROUP_ROWS) && has_wide_kernel(fmt) {
            WIDE_GROUP_ROWS
        } else {
            PACK_ROWS
        }
    }

    fn pack_in_groups(
        fmt: WeightFormat,
        w: &[u8],
        rows: usize,
        cols: usize,
        group_rows: usize,
        release: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<Self>, KernelError> {
        // Bytes that do not match the shape are an error whether or not this CPU packs.
        let rb = fmt.row_bytes(cols)?;
        check_len(
            "weights",
            rb.checked_mul(rows).ok_or(KernelError::Overflow)?,
            w.len(),
            "bytes",
        )?;
        let Some(mut packer) = Packer::new(fmt, rows, cols, group_rows)? else {
            return Ok(None);
        };
        for (i, src) in w.chunks(packer.groups_per_window * packer.group_src).enumerate() {
            packer.pack_groups(i * packer.groups_per_window, src);
            release(src);
        }
        Ok(Some(Self::assembled(fmt, rows, cols, packer)))
    }

    fn assembled(fmt: WeightFormat, rows: usize, cols: usize, packer: Packer) -> Self {
        let group_rows = packer.group_rows;
        Self {
            fmt,
            rows,
            cols,
            group_rows,
            data: packer.finish(),
            successor: Arc::default(),
        }
    }

    /// Rows per interleaved group ([`PACK_ROWS`], or [`WIDE_GROUP_ROWS`] for the AVX-512 kernels).
    pub fn group_rows(&self) -> usize {
        self.group_rows
    }

    /// Storage format of the original rows.
    pub fn format(&self) -> WeightFormat {
        self.fmt
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (the stored matrix's, plus the unpacked sub-block scales of Q4_K and Q5_K, 4
    /// bytes per 256 weights, Q3_K, 4, and IQ4_XS, 2: see `packed_layout.rs`).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// `out[lane · rows + r] = W[r] · x[lane]`, the same contract as [`crate::matmul`]; `x` must
    /// be quantised for this matrix's format and width.
    pub fn matmul(&self, x: &Activations, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(crate::matmul::Isa::best(), x, out)
    }

    /// [`PackedMatrix::matmul`] on a chosen instruction set (`Avx2` or `Avx2Vnni`; `Neon` or
    /// `NeonDot` on aarch64), for tests and A/B measurements.
    pub fn matmul_with(&self, isa: crate::matmul::Isa, x: &Activations, out: &mut [f32]) -> Result<(), KernelError> {
        Self::fused(isa, &[self], None, None, x, out)
    }

    /// Several matrices of one format and width side by side in one parallel loop (q/k/v): lane
    /// `l` of `out` is `Σ rows` wide and holds each matrix's rows in turn at its column offset,
    /// the same values as separate [`PackedMatrix::matmul`] calls. One loop instead of one per
    /// matrix: a single barrier and tail, and the serial gaps between them go away.
    pub fn matmul_concat(mats: &[&PackedMatrix], x: &Activations, out: &mut [f32]) -> Result<(), KernelError> {
        Self::fused(crate::matmul::Isa::best(), mats, None, None, x, out)
    }

    /// Two matrices of one shape in one parallel loop, combined as they are made: `combine(a, b)`
    /// gets equal runs of values from each matrix (one row group of one or more lanes) and
    /// leaves the result in `a`; it must work element by element, so that
    /// `out[lane · rows + r] = combine(A[r] · x[lane], B[r] · x[lane])` (SwiGLU's
    /// `silu(gate) · up`): the same values as two [`PackedMatrix::matmul`] calls and a serial
    /// pass, with the combining spread over the threads.
    ///
    /// With `next = Some((fmt, act))` it also quantises `out` for the next matmul, whose weights
    /// are in `fmt`, into `act`: each task converts the 32-row blocks it made while they are in
    /// its cache, so the caller neither runs that serially nor reads the other threads' rows
    /// across cores (SwiGLU's down projection: ~3.7 µs per layer at four lanes). `act` ends up
    /// exactly as `act.quantize(fmt, out, lanes, rows)` leaves it, which is what runs instead
    /// when the rows are not a multiple of 32 or `fmt` does not pair with Q8_0/Q8_1 blocks.
    pub fn matmul_pair(
        a: &PackedMatrix,
        b: &PackedMatrix,
        x: &Activations,
        out: &mut [f32],
        combine: &Combine<'_>,
        next: Option<(WeightFormat, &mut Activations)>,
    ) -> Result<(), KernelError> {
        Self::check_pair(a, b)?;
        let isa = crate::matmul::Isa::best();
        let Some((fmt, act)) = next else {
            return Self::fused(isa, &[a, b], Some(combine), None, x, out);
        };
        let lanes = x.lanes;
        if a.rows.is_multiple_of(32)
            && let Some(writer) = act.block_writer(fmt, lanes, a.rows)?
        {
            return Self::fused(isa, &[a, b], Some(combine), Some(&writer), x, out);
        }
        Self::fused(isa, &[a, b], Some(combine), None, x, out)?;
        act.quantize(fmt, out, lanes, a.rows)
    }

    fn check_pair(a: &PackedMatrix, b: &PackedMatrix) -> Result<(), KernelError> {
        if a.rows != b.rows {
            return Err(KernelError::Size {
                what: "second matrix of a pair",
                expected: a.rows,
                got: b.rows,
                unit: "rows",
            });
        }
        if a.group_rows != b.group_rows {
            return Err(KernelError::Size {
                what: "group height of the second matrix of a pair",
                expected: a.group_rows,
                got: b.group_rows,
                unit: "rows",
            });
        }
        Ok(())
    }

    /// Shared checks of the entry points, then [`PackedMatrix::run`].
    fn fused(
        isa: crate::matmul::Isa,
        mats: &[&PackedMatrix],
        combine: Option<&Combine<'_>>,
        quantize: Option<&BlockWriter<'_>>,
        x: &Activations,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        use crate::matmul::Isa;
        if !matches!(isa, Isa::Avx2 | Isa::Avx2Vnni | Isa::Neon | Isa::NeonDot) || !isa.available() {
            return Err(KernelError::IsaUnavailable { isa: isa.name() });
        }
        if mats.is_empty() || mats.len() > MAX_FUSED {
            return Err(KernelError::Size {
                what: "matrices in one fused loop",
                expected: MAX_FUSED,
                got: mats.len(),
                unit: "at most",
            });
        }
        for m in mats {
            if m.group_rows != PACK_ROWS && isa != Isa::Avx2Vnni {
                return Err(KernelError::PackedLayout {
                    group_rows: m.group_rows,
                    isa: isa.name(),
                });
            }
            if !x.pairs_with(m.fmt) || x.cols != m.cols {
                return Err(KernelError::ActivationMismatch {
                    prepared_for: x.fmt.name(),
                    prepared_cols: x.cols,
                    wanted: m.fmt.name(),
                    wanted_cols: m.cols,
                });
            }
        }
        let width = match combine {
            Some(_) => mats[0].rows,
            None => mats.iter().map(|m| m.rows).sum(),
        };
        check_len(
            "output",
            x.lanes.checked_mul(width).ok_or(KernelError::Overflow)?,
            out.len(),
            "values",
        )?;
        if x.lanes == 0 {
            return Ok(());
        }
        // The dot-product extension: VNNI on x86-64, dotprod (`sdot`) on aarch64.
        Self::run(
            matches!(isa, Isa::Avx2Vnni | Isa::NeonDot),
            mats,
            combine,
            quantize,
            x,
            out,
            width,
        )
    }

    /// One parallel loop over the row groups of `mats`: without `combine`, matrix after matrix
    /// (each task inside one matrix), rows written side by side in `out`'s lanes of `width`
    /// values; with it, the groups of `mats[0]` and `mats[1]` together, combined.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn run(
        vnni: bool,
        mats: &[&PackedMatrix],
        combine: Option<&Combine<'_>>,
        quantize: Option<&BlockWriter<'_>>,
        x: &Activations,
        out: &mut [f32],
        width: usize,
    ) -> Result<(), KernelError> {
        let pool = crate::pool::global();
        // The loop's own groups, for a pair the first matrix's (the second runs in step), in
        // one space of 8-row units whatever a matrix's group height (a group belongs to the
        // unit it starts in), split into contiguous ranges: the caller streams from the front,
        // the workers from the back, each claim a share of what is left. Long contiguous
        // claims keep each thread's stream whole for the hardware prefetcher (16 short tasks
        // per loop, claimed alternately, broke every stream: single-stream decode was 18 %
        // slower), and the shrinking shares let a thread slowed by its neighbours on a shared
        // host hand its tail over instead of holding the loop up (docs/field-guide.md).
        let looped = if combine.is_some() { &mats[..1] } else { mats };
        let mut unit_start = [0usize; MAX_FUSED + 1];
        let mut column = [0usize; MAX_FUSED + 1];
        for (i, m) in looped.iter().enumerate() {
            unit_start[i + 1] = unit_start[i] + m.rows / PACK_ROWS;
            column[i + 1] = column[i] + m.rows;
        }
        let units = unit_start[looped.len()];
        let mut next = (0, 0);
        for m in mats {
            next = m.note_run();
        }
        let ptr = OutPtr(out.as_mut_ptr());
        let ptr = &ptr;
        // Quantising for the next matmul: claims of whole 32-row blocks (a pair loop is one
        // matrix; the caller checked that its rows are a multiple of 32), each task converting
        // its own blocks once it has made them.
        let per = if quantize.is_some() { 32 / PACK_ROWS } else { 1 };
        pool.run_split(
            units / per,
            SPLIT_MIN_UNITS.div_ceil(per),
            SPLIT_MAX_UNITS / per,
            &|r| {
                let r = r.start * per..r.end * per;
                for (i, m) in looped.iter().enumerate() {
                    let (u0, k) = (unit_start[i], m.group_rows / PACK_ROWS);
                    let n_groups = m.rows / m.group_rows;
                    let first = r.start.saturating_sub(u0).div_ceil(k).min(n_groups);
                    let end = r.end.saturating_sub(u0).div_ceil(k).min(n_groups);
                    if first >= end {
                        continue;
                    }
                    let task = TaskOut {
                        ptr,
                        width,
                        column: column[i],
                    };
                    let pair = combine.map(|f| (mats[1], f));
                    if m.group_rows == PACK_ROWS {
                        task.groups::<PACK_ROWS>(m, pair, x, first..end, &|m, g, lane0, tile| {
                            m.group(vnni, g, x, lane0, tile)
                        });
                    } else {
                        task.groups::<WIDE_GROUP_ROWS>(m, pair, x, first..end, &|m, g, lane0, tile| {
                            m.wide_group(g, x, lane0, tile)
                        });
                    }
                }
                if let Some(w) = quantize {
                    let blocks_per_lane = width / 32;
                    for lane in 0..x.lanes {
                        for blk in r.start / per..r.end / per {
                            let at = lane * width + 32 * blk;
                            // SAFETY: this task wrote rows `32·blk ..+32` of every lane just above
                            // (its claim covers whole blocks) and no other task touches them, so
                            // reading them through the shared base pointer races with nothing;
                            // `at + 32 ≤ lanes · width = out.len()`.
                            let src = unsafe { std::slice::from_raw_parts(ptr.0.add(at), 32) };
                            // SAFETY: block `lane · width/32 + blk` belongs to this task alone.
                            unsafe { w.write(lane * blocks_per_lane + blk, src) };
                        }
                    }
                }
            },
        );
        if prefetch_enabled() {
            pool.prefetch_range(next.0, next.1);
        }
        Ok(())
    }

    /// The bytes of row group `g` (of this matrix's group height).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn group_bytes(&self, g: usize) -> &[u8] {
        let len = self.data.len() / (self.rows / self.group_rows);
        &self.data[g * len..(g + 1) * len]
    }

    /// Row group `g` of this 8-row-grouped matrix against lanes `lane0 ..` of `x`, into `tile`.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn group(&self, vnni: bool, g: usize, x: &Activations, lane0: usize, tile: &mut [[f32; PACK_ROWS]]) {
        debug_assert_eq!(self.group_rows, PACK_ROWS);
        let blk = self.group_bytes(g);
        // SAFETY: `kernel_available()` held when this matrix was packed (AVX2, FMA, F16C; VNNI
        // only when detected); `tile.len() ≤ MAX_LANES` and the lanes exist (callers loop so).
        unsafe {
            use crate::{
                packed_x86 as p8, packed_x86_ggml_order as legacy, packed_x86_kquant as kq, packed_x86_scaled as sc,
            };
            match (self.fmt, vnni) {
                (WeightFormat::Q4_1, true) => p8::q4_1_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q4_1, false) => p8::q4_1_group(blk, x, lane0, tile),
                (WeightFormat::Q8_0, true) => p8::q8_0_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q8_0, false) => p8::q8_0_group(blk, x, lane0, tile),
                (WeightFormat::Q4_0, true) => legacy::q4_0_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q4_0, false) => legacy::q4_0_group(blk, x, lane0, tile),
                (WeightFormat::Q5_0, true) => legacy::q5_0_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q5_0, false) => legacy::q5_0_group(blk, x, lane0, tile),
                (WeightFormat::Q4_K, true) => kq::q4_k_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q4_K, false) => kq::q4_k_group(blk, x, lane0, tile),
                (WeightFormat::Q5_K, true) => kq::q5_k_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q5_K, false) => kq::q5_k_group(blk, x, lane0, tile),
                (WeightFormat::Q6_K, true) => kq::q6_k_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q6_K, false) => kq::q6_k_group(blk, x, lane0, tile),
                (WeightFormat::IQ4_NL, true) => legacy::iq4_nl_group_vnni(blk, x, lane0, tile),
                (WeightFormat::IQ4_NL, false) => legacy::iq4_nl_group(blk, x, lane0, tile),
                (WeightFormat::Q3_K, true) => sc::q3_k_group_vnni(blk, x, lane0, tile),
                (WeightFormat::Q3_K, false) => sc::q3_k_group(blk, x, lane0, tile),
                (WeightFormat::IQ4_XS, true) => sc::iq4_xs_group_vnni(blk, x, lane0, tile),
                (WeightFormat::IQ4_XS, false) => sc::iq4_xs_group(blk, x, lane0, tile),
                // `pack_in_groups` builds nothing else.
                _ => tile.iter_mut().for_each(|t| t.fill(f32::NAN)),
            }
        }
    }

    /// Row group `g` of this 16-row-grouped matrix against lanes `lane0 ..` of `x`, into `tile`.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn wide_group(&self, g: usize, x: &Activations, lane0: usize, tile: &mut [[f32; WIDE_GROUP_ROWS]]) {
        debug_assert_eq!(self.group_rows, WIDE_GROUP_ROWS);
        let blk = self.group_bytes(g);
        // SAFETY: a 16-row layout is only built where `wide_kernel_available()` held (AVX-512
        // F/BW/VL/VNNI besides AVX2, FMA, F16C); `tile.len() ≤ MAX_LANES`, the lanes exist.
        unsafe {
            use crate::{
                packed_x86_ggml_order as legacy, packed_x86_kquant as kq, packed_x86_scaled as sc,
                packed_x86_wide as wide,
            };
            match self.fmt {
                WeightFormat::Q4_K => kq::q4_k_group_wide(blk, x, lane0, tile),
                WeightFormat::Q5_K => kq::q5_k_group_wide(blk, x, lane0, tile),
                WeightFormat::Q6_K => kq::q6_k_group_wide(blk, x, lane0, tile),
                WeightFormat::Q8_0 => wide::q8_0_group_wide(blk, x, lane0, tile),
                WeightFormat::Q4_1 => wide::q4_1_group_wide(blk, x, lane0, tile),
                WeightFormat::Q4_0 => legacy::q4_0_group_wide(blk, x, lane0, tile),
                WeightFormat::Q5_0 => legacy::q5_0_group_wide(blk, x, lane0, tile),
                WeightFormat::IQ4_NL => legacy::iq4_nl_group_wide(blk, x, lane0, tile),
                WeightFormat::Q3_K => sc::q3_k_group_wide(blk, x, lane0, tile),
                WeightFormat::IQ4_XS => sc::iq4_xs_group_wide(blk, x, lane0, tile),
                // `pack_in_groups` builds no other 16-row layout (`has_wide_kernel`).
                _ => tile.iter_mut().for_each(|t| t.fill(f32::NAN)),
            }
        }
    }

    /// Row group `g` of this matrix against lanes `lane0 ..` of `x`, into `tile`, with `sdot`
    /// when `dotprod` (the caller's `Isa::NeonDot`, available only where the CPU has it).
    #[cfg(target_arch = "aarch64")]
    #[inline]
    fn group(&self, dotprod: bool, g: usize, x: &Activations, lane0: usize, tile: &mut [[f32; PACK_ROWS]]) {
        debug_assert_eq!(self.group_rows, PACK_ROWS);
        let blk = self.group_bytes(g);
        if dotprod {
            // SAFETY: `fused` passes `dotprod` only for `Isa::NeonDot`, after `available()`
            // confirmed the dotprod extension; NEON is in every aarch64 CPU.
            unsafe { crate::packed_neon::sdot::group(self.fmt, blk, x, lane0, tile) }
        } else {
            // SAFETY: NEON is in every aarch64 CPU (the targets' baseline).
            unsafe { crate::packed_neon::smull::group(self.fmt, blk, x, lane0, tile) }
        }
    }

    /// No 16-row layout is built on aarch64 (`wide_kernel_available` is false there); `run`
    /// names this only for x86-64's sake.
    #[cfg(target_arch = "aarch64")]
    fn wide_group(&self, _g: usize, _x: &Activations, _lane0: usize, tile: &mut [[f32; WIDE_GROUP_ROWS]]) {
        tile.iter_mut().for_each(|t| t.fill(f32::NAN));
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fn run(
        _vnni: bool,
        _mats: &[&PackedMatrix],
        _combine: Option<&Combine<'_>>,
        _quantize: Option<&BlockWriter<'_>>,
        _x: &Activations,
        _out: &mut [f32],
        _width: usize,
    ) -> Result<(), KernelError> {
        // `pack` never builds one where there is no kernel.
        Err(KernelError::IsaUnavailable { isa: "avx2" })
    }
}

/// How [`PackedMatrix::matmul_pair`] merges its two results, element by element, in place into
/// the first. Called once per row group for all the lanes of a tile (64 values at four lanes
/// on the 16-row layout), so a vectorised combine fills its registers and the indirect call is
/// rare (it was called per 8 values, where a 512-bit SiLU had nothing to fill).
pub type Combine<'a> = dyn Fn(&mut [f32], &[f32]) + Sync + 'a;

/// Most matrices one fused loop takes (q/k/v, or a SwiGLU pair).
pub const MAX_FUSED: usize = 4;

/// Smallest claim of a matmul loop, in 8-row units (64 rows, ~23 KB of Q4_1 at 576 columns):
/// the most a thread that finished can wait on another's last claim.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SPLIT_MIN_UNITS: usize = 8;

/// Largest claim (~370 KB of Q4_1 at 576 columns), so a long matrix still spreads evenly.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SPLIT_MAX_UNITS: usize = 128;

/// Whether `fmt` has 16-row kernels (the others pack in 8-row groups on every CPU).
pub(crate) fn has_wide_kernel(fmt: WeightFormat) -> bool {
    matches!(
        fmt,
        WeightFormat::Q4_1
            | WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q5_0
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::IQ4_NL
            | WeightFormat::Q3_K
            | WeightFormat::IQ4_XS
    )
}

/// Whether this CPU has the 16-row (AVX-512 VNNI) kernels.
pub fn wide_kernel_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernel_available() && crate::packed_x86_wide::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `PackedMatrix::pack` can build anything on this CPU (x86-64 with AVX2, FMA, F16C;
/// every aarch64 CPU). `ANELM_KERNELS=scalar` (or, on x86-64, any non-x86 path), or
/// `ANELM_PACKED=0`, turns packing off for A/B runs.
pub fn kernel_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::matmul::Isa;
        matches!(Isa::best(), Isa::Avx2 | Isa::Avx2Vnni) && crate::Tuning::get().packed
    }
    #[cfg(target_arch = "aarch64")]
    {
        use crate::matmul::Isa;
        matches!(Isa::best(), Isa::Neon | Isa::NeonDot) && crate::Tuning::get().packed
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Whether finished loops hint their successor's weights to the pool (`ANELM_PREFETCH=0` turns
/// it off for A/B runs).
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
fn prefetch_enabled() -> bool {
    crate::Tuning::get().prefetch_successor
}

/// Base pointer of the output, shared by tasks that write disjoint rows.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint ranges (see `run`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe impl Sync for OutPtr {}

/// Where one task of [`PackedMatrix::run`] writes: the shared output, its lane width, and the
/// first column of the task's matrix.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
struct TaskOut<'a> {
    ptr: &'a OutPtr,
    width: usize,
    column: usize,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl TaskOut<'_> {
    /// Row groups `groups` (of `R` rows) of `m` against every lane of `x` through `kernel`;
    /// with `pair`, the second matrix's same groups too, merged by its combine a tile at a time.
    fn groups<const R: usize>(
        &self,
        m: &PackedMatrix,
        pair: Option<(&PackedMatrix, &Combine<'_>)>,
        x: &Activations,
        groups: std::ops::Range<usize>,
        kernel: &impl Fn(&PackedMatrix, usize, usize, &mut [[f32; R]]),
    ) {
        #[cfg(target_arch = "aarch64")]
        use crate::packed_neon::MAX_LANES;
        #[cfg(target_arch = "x86_64")]
        use crate::packed_x86::MAX_LANES;
        let mut tile = [[0f32; R]; MAX_LANES];
        let mut tile_b = [[0f32; R]; MAX_LANES];
        for g in groups {
            let mut lane0 = 0;
            while lane0 < x.lanes {
                let n = (x.lanes - lane0).min(MAX_LANES);
                kernel(m, g, lane0, &mut tile[..n]);
                if let Some((b, combine)) = pair {
                    kernel(b, g, lane0, &mut tile_b[..n]);
                    combine(tile[..n].as_flattened_mut(), tile_b[..n].as_flattened());
                }
                for (l, vals) in tile[..n].iter().enumerate() {
                    let at = (lane0 + l) * self.width + self.column + g * R;
                    // SAFETY: `at + R ≤ lanes · width = out.len()` (checked in `fused`); every
                    // task writes only its own groups' rows, so writes never overlap.
                    unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), self.ptr.0.add(at), R) };
                }
                lane0 += n;
            }
        }
    }
}
