//! bf16 weights × bf16 activations with f32 sums, through AVX512_BF16's `vdpbf16ps` (two
//! products and their sum per f32 lane per instruction: twice the multiply rate of f32 FMAs).
//!
//! For many-lane matmuls over f32-stored weights (an encoder's packed texts), where the f32 tile
//! is bound by the FMA rate (docs/field-guide.md, 2026-12-06 evening). Weights are rounded to
//! bf16 once at load, activations at each run (round to nearest even both times), and every
//! product is summed in f32.
//!
//! Layout: rows in panels of [`PANEL_ROWS`] (zero rows pad the last panel), and inside a panel,
//! for each pair of columns `(2k, 2k+1)`, one u32 per row holding `bf16(w[2k])` in its low half
//! and `bf16(w[2k+1])` in its high half (an odd last column is paired with zero). One panel
//! step is then two 512-bit loads of weights against a broadcast column pair of each lane: an
//! outer product whose sums land as 16 consecutive output rows of a lane, so there is no
//! horizontal reduction. Each lane's sums run in the same order whatever the batch, so a lane's
//! result does not depend on the lanes beside it.
//!
//! Elsewhere (no AVX512_BF16, or not x86-64) [`Bf16Matrix::available`] is false and callers
//! keep their f32 path; [`Bf16Matrix::matmul_reference`] is the portable reference the tests
//! hold the vector path to.

use crate::error::{KernelError, check_len};
use crate::fp16::{bf16_to_f32, f32_to_bf16};

/// Output rows per weight panel (two 512-bit registers of f32 sums).
pub const PANEL_ROWS: usize = 32;

/// Lanes per pass over a panel: 2 × 12 accumulators plus two weight registers of the 32.
#[cfg(target_arch = "x86_64")]
const LANE_BLOCK: usize = 12;

/// One f32 pair rounded to bf16 and packed as `vdpbf16ps` reads it (even column low).
#[inline]
fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(f32_to_bf16(lo)) | (u32::from(f32_to_bf16(hi)) << 16)
}

/// A `rows × cols` weight matrix rounded to bf16, in the panel layout of this module.
#[derive(Clone, Debug)]
pub struct Bf16Matrix {
    rows: usize,
    cols: usize,
    /// Column pairs per row, `ceil(cols / 2)`.
    pairs: usize,
    /// `[panel][pair][row in panel]`.
    data: Vec<u32>,
}

/// Activations rounded to bf16 for [`Bf16Matrix::matmul`]: `lanes` rows of column pairs.
#[derive(Clone, Debug, Default)]
pub struct Bf16Activations {
    lanes: usize,
    cols: usize,
    pairs: usize,
    /// `[lane][pair]`.
    data: Vec<u32>,
}

impl Bf16Activations {
    /// No lanes yet (buffers grow on the first [`Bf16Activations::quantize`] and are reused).
    pub fn new() -> Self {
        Self::default()
    }

    /// Round `x` (`lanes × cols`, lane-major f32) to bf16 pairs.
    pub fn quantize(&mut self, x: &[f32], lanes: usize, cols: usize) -> Result<(), KernelError> {
        check_len(
            "activations",
            lanes.checked_mul(cols).ok_or(KernelError::Overflow)?,
            x.len(),
            "values",
        )?;
        let pairs = cols.div_ceil(2);
        self.lanes = lanes;
        self.cols = cols;
        self.pairs = pairs;
        self.data.resize(lanes * pairs, 0);
        if cols == 0 {
            return Ok(());
        }
        for (src, dst) in x.chunks_exact(cols).zip(self.data.chunks_exact_mut(pairs)) {
            let done = quantize_row_simd(src, dst);
            for (k, d) in dst.iter_mut().enumerate().skip(done) {
                let hi = src.get(2 * k + 1).copied().unwrap_or(0.0);
                *d = pair(src[2 * k], hi);
            }
        }
        Ok(())
    }

    /// Lanes held.
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Columns per lane.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Value `k` of lane `lane` as rounded (for references and tests).
    pub fn value(&self, lane: usize, k: usize) -> f32 {
        let p = self.data[lane * self.pairs + k / 2];
        bf16_to_f32(if k.is_multiple_of(2) {
            p as u16
        } else {
            (p >> 16) as u16
        })
    }
}

/// The vector part of one activation row's rounding: how many leading pairs it wrote (the
/// same bits as [`pair`] for normal values, both round to nearest even; tested. The
/// instruction flushes f32 subnormals to zero, as `vdpbf16ps` does with its inputs anyway).
fn quantize_row_simd(src: &[f32], dst: &mut [u32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if Bf16Matrix::available() {
        // SAFETY: AVX-512F/BF16 were detected; the function reads only whole groups of 32
        // values inside `src` and writes the matching 16 pairs inside `dst`.
        return unsafe { x86::quantize_row(src, dst) };
    }
    let _ = (src, dst);
    0
}

impl Bf16Matrix {
    /// Whether this CPU runs the `vdpbf16ps` kernel (AVX-512 F, BW and BF16; detected once).
    pub fn available() -> bool {
        let f = crate::Features::get();
        f.avx512f && f.avx512bw && f.avx512bf16
    }

    /// Round a row-major `rows × cols` f32 matrix to bf16 and lay it out in panels.
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_len(
            "weights",
            rows.checked_mul(cols).ok_or(KernelError::Overflow)?,
            w.len(),
            "values",
        )?;
        let pairs = cols.div_ceil(2);
        let panels = rows.div_ceil(PANEL_ROWS);
        let len = panels
            .checked_mul(pairs)
            .and_then(|n| n.checked_mul(PANEL_ROWS))
            .ok_or(KernelError::Overflow)?;
        let mut data = vec![0u32; len];
        for r in 0..rows {
            let (p, ri) = (r / PANEL_ROWS, r % PANEL_ROWS);
            let row = &w[r * cols..(r + 1) * cols];
            for k in 0..pairs {
                let hi = row.get(2 * k + 1).copied().unwrap_or(0.0);
                data[(p * pairs + k) * PANEL_ROWS + ri] = pair(row[2 * k], hi);
            }
        }
        Ok(Self {
            rows,
            cols,
            pairs,
            data,
        })
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the packed weights.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Weight `(r, k)` as rounded (for references and tests).
    pub fn value(&self, r: usize, k: usize) -> f32 {
        let p = self.data[((r / PANEL_ROWS) * self.pairs + k / 2) * PANEL_ROWS + r % PANEL_ROWS];
        bf16_to_f32(if k.is_multiple_of(2) {
            p as u16
        } else {
            (p >> 16) as u16
        })
    }

    /// `out[lane·rows + r] = Σ_k w[r,k]·x[lane,k]`, rows split across the kernel pool.
    pub fn matmul(&self, x: &Bf16Activations, out: &mut [f32]) -> Result<(), KernelError> {
        Self::matmul_concat(&[self], x, out)
    }

    /// Several matrices over the same input, their outputs side by side in each lane
    /// (`out[lane·Σrows + offset_i + r]`, a fused projection), in one parallel loop.
    pub fn matmul_concat(mats: &[&Bf16Matrix], x: &Bf16Activations, out: &mut [f32]) -> Result<(), KernelError> {
        let total: usize = mats.iter().map(|m| m.rows).sum();
        for m in mats {
            if m.cols != x.cols {
                return Err(KernelError::ActivationMismatch {
                    prepared_for: "bf16",
                    prepared_cols: x.cols,
                    wanted: "bf16",
                    wanted_cols: m.cols,
                });
            }
        }
        check_len("output", x.lanes * total, out.len(), "values")?;
        if !Self::available() {
            return Err(KernelError::IsaUnavailable { isa: "avx512bf16" });
        }
        if x.lanes == 0 || total == 0 {
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        {
            // (matrix, panel, row offset of the matrix in each output lane) of every task.
            let mut tasks = Vec::new();
            let mut offset = 0;
            for (i, m) in mats.iter().enumerate() {
                for p in 0..m.rows.div_ceil(PANEL_ROWS) {
                    tasks.push((i, p, offset));
                }
                offset += m.rows;
            }
            let ptr = OutPtr(out.as_mut_ptr());
            let ptr = &ptr;
            crate::pool::global().run(tasks.len(), &|t| {
                let (i, p, offset) = tasks[t];
                // SAFETY: `available()` confirmed the features; the panel and every lane hold
                // `pairs` values; each task writes only rows offset + p·32 .. of each lane,
                // which no other task writes, inside `out` (checked length lanes × total).
                unsafe { x86::panel(mats[i], p, x, ptr.0, total, offset) };
            });
        }
        Ok(())
    }

    /// The portable reference: `out[lane·rows + r] = Σ_k w[r,k]·x[lane,k]` over the rounded
    /// values, summed in f64.
    pub fn matmul_reference(&self, x: &Bf16Activations, out: &mut [f32]) -> Result<(), KernelError> {
        check_len("output", x.lanes * self.rows, out.len(), "values")?;
        if self.cols != x.cols {
            return Err(KernelError::ActivationMismatch {
                prepared_for: "bf16",
                prepared_cols: x.cols,
                wanted: "bf16",
                wanted_cols: self.cols,
            });
        }
        for lane in 0..x.lanes {
            for r in 0..self.rows {
                let s: f64 = (0..self.cols)
                    .map(|k| f64::from(self.value(r, k)) * f64::from(x.value(lane, k)))
                    .sum();
                out[lane * self.rows + r] = s as f32;
            }
        }
        Ok(())
    }
}

/// Output pointer shared by the panel tasks; each writes only its own rows.
#[cfg(target_arch = "x86_64")]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (distinct panels → distinct rows of every lane), and
// the borrow of `out` outlives the parallel loop that uses the pointer.
#[cfg(target_arch = "x86_64")]
unsafe impl Sync for OutPtr {}
// SAFETY: see `Sync`.
#[cfg(target_arch = "x86_64")]
unsafe impl Send for OutPtr {}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Bf16Activations, Bf16Matrix, LANE_BLOCK, PANEL_ROWS};

    /// Rows `p·32 ..` of `m` for every lane of `x`, written at `out[lane·stride + offset + r]`.
    ///
    /// # Safety
    /// AVX-512 F/BW/BF16; `p` is a panel of `m`; `m.cols == x.cols`; `out` holds
    /// `x.lanes · stride` values and `offset + m.rows <= stride`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn panel(
        m: &Bf16Matrix,
        p: usize,
        x: &Bf16Activations,
        out: *mut f32,
        stride: usize,
        offset: usize,
    ) {
        let pairs = m.pairs;
        let w = m.data[p * pairs * PANEL_ROWS..].as_ptr();
        let row0 = p * PANEL_ROWS;
        let valid = (m.rows - row0).min(PANEL_ROWS);
        // Store masks of the two halves (all ones but in the last, partial panel).
        let mask = |h: usize| -> __mmask16 {
            let n = valid.saturating_sub(16 * h).min(16);
            ((1u32 << n) - 1) as __mmask16
        };
        let masks = [mask(0), mask(1)];
        let store = |lane0: usize, acc: &[[__m512; 2]]| {
            for (j, a) in acc.iter().enumerate() {
                let base = (lane0 + j) * stride + offset + row0;
                for (h, &v) in a.iter().enumerate() {
                    if masks[h] != 0 {
                        // SAFETY: rows row0 + 16h + i for set mask bits are < m.rows, so the
                        // element lies inside lane lane0 + j's part of `out`.
                        unsafe { _mm512_mask_storeu_ps(out.add(base + 16 * h), masks[h], v) };
                    }
                }
            }
        };
        let lane = |l: usize| x.data[l * pairs..].as_ptr();
        let mut lane0 = 0;
        // Whole blocks of LANE_BLOCK lanes, then the rest in blocks of 4, 2 and 1, so a lone
        // lane (decode) does one lane's work. Each lane's sums run in the same order in every
        // block size, so a lane's result does not depend on the lanes beside it.
        while lane0 < x.lanes {
            let left = x.lanes - lane0;
            // SAFETY (each `block` call): as this function's contract; the panel holds
            // `pairs · 32` values and every lane pointer `pairs`.
            let n = if left >= LANE_BLOCK {
                store(lane0, &unsafe {
                    block::<LANE_BLOCK>(w, std::array::from_fn(|j| lane(lane0 + j)), pairs)
                });
                LANE_BLOCK
            } else if left >= 4 {
                store(lane0, &unsafe {
                    block::<4>(w, std::array::from_fn(|j| lane(lane0 + j)), pairs)
                });
                4
            } else if left >= 2 {
                store(lane0, &unsafe { block::<2>(w, [lane(lane0), lane(lane0 + 1)], pairs) });
                2
            } else {
                store(lane0, &unsafe { block::<1>(w, [lane(lane0)], pairs) });
                1
            };
            lane0 += n;
        }
    }

    /// The 32 rows of one panel × `L` lanes over all column pairs.
    ///
    /// # Safety
    /// AVX-512 F/BF16; `w` reaches `pairs · 32` u32 and every `xs[j]` `pairs` u32.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn block<const L: usize>(w: *const u32, xs: [*const u32; L], pairs: usize) -> [[__m512; 2]; L] {
        let mut acc = [[_mm512_setzero_ps(); 2]; L];
        for k in 0..pairs {
            // SAFETY: k < pairs, so every read is inside the ranges of the contract.
            unsafe {
                let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.add(k * PANEL_ROWS).cast()));
                let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.add(k * PANEL_ROWS + 16).cast()));
                for (a, x) in acc.iter_mut().zip(&xs) {
                    let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(*x.add(k) as i32));
                    a[0] = _mm512_dpbf16_ps(a[0], w0, xv);
                    a[1] = _mm512_dpbf16_ps(a[1], w1, xv);
                }
            }
        }
        acc
    }

    /// Round the whole groups of 32 values of `src` to bf16 pairs in `dst`; returns the pairs
    /// written.
    ///
    /// # Safety
    /// AVX-512 F/BF16; `dst` holds at least `src.len() / 2` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn quantize_row(src: &[f32], dst: &mut [u32]) -> usize {
        let groups = src.len() / 32;
        for g in 0..groups {
            // SAFETY: 32 values from 32·g are inside `src`, 16 pairs from 16·g inside `dst`.
            unsafe {
                let a = _mm512_loadu_ps(src.as_ptr().add(32 * g));
                let b = _mm512_loadu_ps(src.as_ptr().add(32 * g + 16));
                // `cvtne2ps2bf16` puts its second operand in the low 16 elements: element
                // 2j (the low half of pair j) is value 2j of the group.
                let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
                _mm512_storeu_si512(dst.as_mut_ptr().add(16 * g).cast(), v);
            }
        }
        groups * 16
    }
}
