//! Matrix × activations with lanes: every weight block is decoded once and dotted with all lanes,
//! rows are split across the kernel pool (`pool.rs`). Per-block arithmetic follows ggml's generic CPU dots.

use crate::activations::{ActKind, Activations};
use crate::blocks::*;
use crate::error::{KernelError, check_len};
use crate::format::WeightFormat;
use crate::fp16::{bf16_to_f32, f16_to_f32};

/// The instruction set of the matmul's inner loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, the reference every other path is tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 plus AVX-512 VNNI (256-bit `vpdpbusd` for the block dots); results equal `Avx2`'s.
    Avx2Vnni,
    /// aarch64 NEON.
    Neon,
    /// NEON plus the dotprod extension (`sdot` for the packed kernels' block dots); results
    /// equal `Neon`'s, and the row-major kernels are `Neon`'s.
    NeonDot,
}

impl Isa {
    /// The fastest path this CPU runs. `ANELM_KERNELS=<name>` (`scalar`, `avx2`, `avx2+vnni`, `neon`,
    /// `neon+dotprod`) forces a path for A/B measurements; a name this CPU cannot run falls back
    /// to the best one.
    pub fn best() -> Self {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let all = [Isa::Avx2Vnni, Isa::Avx2, Isa::NeonDot, Isa::Neon, Isa::Scalar];
            if let Some(v) = crate::Tuning::get().kernels.as_deref()
                && let Some(isa) = all.into_iter().find(|i| i.name().eq_ignore_ascii_case(v.trim()))
                && isa.available()
            {
                return isa;
            }
            all.into_iter().find(|i| i.available()).unwrap_or(Isa::Scalar)
        })
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => crate::simd_x86::available(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Vnni => crate::simd_x86::available() && crate::simd_x86::has_vnni(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => true,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => crate::Features::get().dotprod,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Short name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx2Vnni => "avx2+vnni",
            Isa::Neon => "neon",
            Isa::NeonDot => "neon+dotprod",
        }
    }
}

/// Run one row on `isa` (which the caller has checked is available).
#[inline]
fn dot_row_on(isa: Isa, fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    if crate::scaled_blocks::handles(fmt) {
        return if isa == Isa::Scalar {
            crate::scaled_blocks::dot_row_portable(fmt, row, x, lane0, acc)
        } else {
            crate::scaled_blocks::dot_row(fmt, row, x, lane0, acc)
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul_with` only passes Avx2 when `Isa::available` confirmed AVX2, FMA, F16C.
        Isa::Avx2 | Isa::Avx2Vnni => unsafe { crate::simd_x86::dot_row(fmt, row, x, lane0, acc) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON is part of every aarch64 target Rust supports here.
        Isa::Neon | Isa::NeonDot => unsafe { crate::simd_neon::dot_row(fmt, row, x, lane0, acc) },
        _ => dot_row(fmt, row, x, lane0, acc),
    }
}

/// Lanes handled per pass over a row (an on-stack accumulator, so the hot path does not allocate).
const LANE_GROUP: usize = 64;

#[inline]
fn idot32(a: &[i8; 32], b: &[i8]) -> i32 {
    let mut s = 0i32;
    for (x, y) in a.iter().zip(&b[..32]) {
        s += i32::from(*x) * i32::from(*y);
    }
    s
}

#[inline]
fn idot(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum()
}

/// acc[l] += W_row · x[lane0 + l] for l < acc.len().
fn dot_row(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    let cols = x.cols;
    let bb = fmt.block_bytes();
    match x.kind {
        ActKind::F32 | ActKind::F16 | ActKind::BF16 => {
            let es = fmt.block_bytes();
            for (k, c) in row.chunks_exact(es).enumerate() {
                let w = match fmt {
                    WeightFormat::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    WeightFormat::F16 => f16_to_f32(u16::from_le_bytes([c[0], c[1]])),
                    _ => bf16_to_f32(u16::from_le_bytes([c[0], c[1]])),
                };
                for (l, a) in acc.iter_mut().enumerate() {
                    *a += w * x.f[(lane0 + l) * cols + k];
                }
            }
        }
        ActKind::Q8_0 => {
            let nb = cols / 32;
            let mut q = [0i8; 32];
            for (ib, b) in row.chunks_exact(bb).enumerate() {
                let dw = match fmt {
                    WeightFormat::Q8_0 => unpack_q8_0(b, &mut q),
                    WeightFormat::Q4_0 => unpack_q4_0(b, &mut q),
                    WeightFormat::IQ4_NL => unpack_iq4_nl(b, &mut q),
                    WeightFormat::MXFP4 => unpack_mxfp4(b, &mut q),
                    _ => unpack_q5_0(b, &mut q),
                };
                for (l, a) in acc.iter_mut().enumerate() {
                    let blk = (lane0 + l) * nb + ib;
                    let sumi = idot32(&q, &x.q[32 * blk..]);
                    *a += sumi as f32 * (dw * x.d[blk]);
                }
            }
        }
        ActKind::Q8_1 => {
            let nb = cols / 32;
            let mut q = [0i8; 32];
            for (ib, b) in row.chunks_exact(bb).enumerate() {
                let (dw, mw) = if fmt == WeightFormat::Q5_1 {
                    unpack_q5_1(b, &mut q)
                } else {
                    unpack_q4_1(b, &mut q)
                };
                for (l, a) in acc.iter_mut().enumerate() {
                    let blk = (lane0 + l) * nb + ib;
                    let sumi = idot32(&q, &x.q[32 * blk..]);
                    *a += (dw * x.d[blk]) * sumi as f32 + mw * x.s[blk];
                }
            }
        }
        ActKind::Q8K => {
            let nb = cols / 256;
            let mut q = [0i8; 256];
            if matches!(fmt, WeightFormat::Q4_K | WeightFormat::Q5_K) {
                let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
                for (ib, b) in row.chunks_exact(bb).enumerate() {
                    let (d, dmin) = if fmt == WeightFormat::Q5_K {
                        unpack_q5_k(b, &mut q, &mut sc, &mut mn)
                    } else {
                        unpack_q4_k(b, &mut q, &mut sc, &mut mn)
                    };
                    for (l, a) in acc.iter_mut().enumerate() {
                        let blk = (lane0 + l) * nb + ib;
                        let xq = &x.q[256 * blk..256 * blk + 256];
                        let bs = &x.bsums[16 * blk..16 * blk + 16];
                        let mut sumi = 0i32;
                        let mut summins = 0i32;
                        for j in 0..8 {
                            sumi += i32::from(sc[j]) * idot(&q[32 * j..32 * j + 32], &xq[32 * j..32 * j + 32]);
                            summins += i32::from(mn[j]) * (bs[2 * j] + bs[2 * j + 1]);
                        }
                        let dx = x.d[blk];
                        *a += d * dx * sumi as f32 - dmin * dx * summins as f32;
                    }
                }
            } else {
                let mut sc = [0i8; 16];
                for (ib, b) in row.chunks_exact(bb).enumerate() {
                    let d = unpack_q6_k(b, &mut q, &mut sc);
                    for (l, a) in acc.iter_mut().enumerate() {
                        let blk = (lane0 + l) * nb + ib;
                        let xq = &x.q[256 * blk..256 * blk + 256];
                        let mut sumi = 0i32;
                        for j in 0..16 {
                            sumi += i32::from(sc[j]) * idot(&q[16 * j..16 * j + 16], &xq[16 * j..16 * j + 16]);
                        }
                        *a += d * x.d[blk] * sumi as f32;
                    }
                }
            }
        }
    }
}

/// Output pointer shared by the row tasks; each task writes only its own rows.
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (distinct rows r → indices lane*rows + r), and the
// borrow of `out` outlives the parallel loop that uses the pointer.
unsafe impl Sync for OutPtr {}
// SAFETY: see `Sync`.
unsafe impl Send for OutPtr {}

/// out[lane*rows + r] = Σ_k W[r,k]·x[lane,k] for a row-major `rows × cols` matrix stored in `fmt`.
/// Rows are split across the kernel pool ([`crate::pool::global`]); each weight row is read once
/// for all lanes.
/// Uses the fastest instruction set of this CPU ([`Isa::best`]).
pub fn matmul(
    fmt: WeightFormat,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &Activations,
    out: &mut [f32],
) -> Result<(), KernelError> {
    matmul_with(Isa::best(), fmt, w, rows, cols, x, out)
}

/// [`matmul`] on a chosen instruction set (tests and benchmarks compare them).
pub fn matmul_with(
    isa: Isa,
    fmt: WeightFormat,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &Activations,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let rb = fmt.row_bytes(cols)?;
    check_len(
        "weights",
        rb.checked_mul(rows).ok_or(KernelError::Overflow)?,
        w.len(),
        "bytes",
    )?;
    if !x.pairs_with(fmt) || x.cols != cols {
        return Err(KernelError::ActivationMismatch {
            prepared_for: x.fmt.name(),
            prepared_cols: x.cols,
            wanted: fmt.name(),
            wanted_cols: cols,
        });
    }
    if !isa.available() {
        return Err(KernelError::IsaUnavailable { isa: isa.name() });
    }
    let lanes = x.lanes;
    check_len("output", lanes * rows, out.len(), "values")?;
    if rows == 0 || lanes == 0 {
        return Ok(());
    }

    let pool = crate::pool::global();
    let threads = pool.threads();
    // Chunks of whole 4-row tiles, several per thread so uneven progress evens out.
    let chunk = rows.div_ceil(threads * 8).clamp(4, 256).next_multiple_of(4);
    let ptr = OutPtr(out.as_mut_ptr());
    let ptr = &ptr;
    pool.run(rows.div_ceil(chunk), &|c| {
        let mut acc = [0f32; LANE_GROUP];
        let end = ((c + 1) * chunk).min(rows);
        let mut r = c * chunk;
        #[cfg(target_arch = "x86_64")]
        let float = matches!(fmt, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16);
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::Avx2Vnni) && (crate::simd_x86::tiles(fmt) || float) {
            use crate::simd_x86::TILE_ROWS;
            let mut tile = [[0f32; TILE_ROWS]; LANE_GROUP];
            while r + TILE_ROWS <= end {
                let rows4: [&[u8]; TILE_ROWS] = std::array::from_fn(|i| &w[(r + i) * rb..(r + i + 1) * rb]);
                let mut lane0 = 0;
                while lane0 < lanes {
                    let n = (lanes - lane0).min(LANE_GROUP);
                    // SAFETY: these ISAs are only used after `available()` confirmed their features.
                    unsafe {
                        if float {
                            crate::simd_x86::dot_rows4_float(fmt, rows4, x, lane0, &mut tile[..n])
                        } else if isa == Isa::Avx2Vnni {
                            crate::simd_x86::dot_rows4_vnni(fmt, rows4, x, lane0, &mut tile[..n])
                        } else {
                            crate::simd_x86::dot_rows4(fmt, rows4, x, lane0, &mut tile[..n])
                        }
                    };
                    for (l, t) in tile[..n].iter().enumerate() {
                        for (i, v) in t.iter().enumerate() {
                            // SAFETY: (lane0+l)*rows + r+i < lanes*rows = out.len(); rows r..r+4
                            // belong to this task alone (see OutPtr).
                            unsafe { *ptr.0.add((lane0 + l) * rows + r + i) = *v };
                        }
                    }
                    lane0 += n;
                }
                r += TILE_ROWS;
            }
        }
        while r < end {
            let row = &w[r * rb..(r + 1) * rb];
            let mut lane0 = 0;
            while lane0 < lanes {
                let n = (lanes - lane0).min(LANE_GROUP);
                let acc = &mut acc[..n];
                acc.fill(0.0);
                dot_row_on(isa, fmt, row, x, lane0, acc);
                for (l, v) in acc.iter().enumerate() {
                    // SAFETY: index (lane0+l)*rows + r < lanes*rows = out.len(); row r belongs
                    // to this task alone (see OutPtr).
                    unsafe { *ptr.0.add((lane0 + l) * rows + r) = *v };
                }
                lane0 += n;
            }
            r += 1;
        }
    });
    Ok(())
}
