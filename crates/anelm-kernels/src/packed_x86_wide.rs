//! The 512-bit kernels of [`crate::packed`]: one group of 16 interleaved rows against up to
//! `MAX_LANES` activation lanes with AVX-512 VNNI (`vpdpbusd` on zmm registers).
//!
//! Why a second width: a batched decode step is compute-bound in these loops once several lanes
//! share each weight block, and on a core with full-width 512-bit units (AMD Zen 5, Intel) one
//! zmm instruction does the work of two ymm ones for the same issue slot. The per-(row, lane)
//! arithmetic is that of the 8-row kernels (exact integer block dots, then the same FMAs in block
//! order), so both widths give bit-identical results.

use std::arch::x86_64::*;

use crate::activations::Activations;
use crate::packed_x86::LaneBlocks;

/// Rows of one wide group.
pub(crate) const WIDE_ROWS: usize = 16;

/// Lanes per register tile: 8 accumulators, 8 weight vectors, the scales and each lane's two
/// partial sums fit the 32 zmm registers. Each tile decodes the weight block once, so wider
/// tiles spread the decode over more lanes (8 lanes: −6 to −10 % per lane-block against tiles
/// of 4, docs/field-guide.md).
const TILE_LANES: usize = 8;

/// Bytes ahead of the current block that the group stream prefetches.
pub(crate) const PREFETCH: usize = 2048;

/// Whether this CPU runs the wide kernels (on top of the AVX2 path's AVX2, FMA and F16C).
pub(crate) fn available() -> bool {
    let f = crate::Features::get();
    crate::simd_x86::available() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni
}

#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn load512(b: &[u8]) -> __m512i {
    assert!(b.len() >= 64);
    // SAFETY: the assertion guarantees 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// 16 f16 values as f32.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn f16x16(b: &[u8]) -> __m512 {
    assert!(b.len() >= 32);
    // SAFETY: the assertion guarantees 32 readable bytes; loadu has no alignment requirement.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(b.as_ptr().cast()) })
}

/// Whether the weight stream is prefetched non-temporally (`prefetchnta`) or into every cache
/// level (`prefetcht0`); decided once per process. Each weight line is used once per step, so
/// NTA keeps the stream from evicting what is reused (KV caches, activations). Measured in
/// docs/field-guide.md: on AMD Zen 4/5 (32 MB L3) NTA gave +7 % c1 and +10 % c4; on an Intel
/// Xeon (Emerald Rapids, 260 MB L3) it halved the stream rate (its NTA lines bypass L2, where
/// the streamer trains, and leave the L3 at once), even for weights four times the L3.
/// `ANELM_WEIGHT_PREFETCH=nta|t0` overrides the vendor default.
pub(crate) fn weight_prefetch_nta() -> bool {
    static NTA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NTA.get_or_init(|| match crate::Tuning::get().weight_prefetch.as_deref() {
        Some("nta") => true,
        Some("t0") => false,
        _ => is_amd(),
    })
}

/// Whether CPUID's vendor string is AMD's.
fn is_amd() -> bool {
    let id = __cpuid(0);
    let mut vendor = [0u8; 12];
    vendor[0..4].copy_from_slice(&id.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
    vendor[8..12].copy_from_slice(&id.ecx.to_le_bytes());
    &vendor == b"AuthenticAMD"
}

/// Prefetch the line at `a`, non-temporally when `nta` (see [`weight_prefetch_nta`]).
#[inline(always)]
pub(crate) fn prefetch_line(a: *const u8, nta: bool) {
    // SAFETY: `_mm_prefetch` is SSE (baseline on x86-64) and only hints: it never faults and
    // reads nothing architecturally, so any address will do.
    unsafe {
        if nta {
            _mm_prefetch::<_MM_HINT_NTA>(a.cast())
        } else {
            _mm_prefetch::<_MM_HINT_T0>(a.cast())
        }
    }
}

/// Prefetch `lines` lines from `ahead` bytes past `p` (the address may lie past the group's
/// end), non-temporally when `nta`.
#[inline(always)]
pub(crate) fn prefetch_lines(p: &[u8], ahead: usize, lines: usize, nta: bool) {
    for i in 0..lines {
        prefetch_line(p.as_ptr().wrapping_add(ahead + 64 * i), nta);
    }
}

/// Prefetch part `part` of `parts` of the `bytes`-long (group, super-block) two blocks past `p`:
/// called for parts 0..parts of each block, spread over its computation, it keeps the whole
/// stream two blocks ahead a few lines at a time (the K-quant kernels; their interleaved quant and
/// scale streams are more than the hardware prefetcher follows). Parts of `bytes / parts` bytes
/// from their own start, so neighbouring parts may hint a line twice: splitting by whole lines
/// instead, each once, measured slower (Q6_K 8-row 37–38 → 30–31 GB/s on one core).
#[inline(always)]
pub(crate) fn prefetch_part_ahead(p: &[u8], bytes: usize, part: usize, parts: usize, nta: bool) {
    let part_bytes = bytes.div_ceil(parts);
    prefetch_lines(p, 2 * bytes + part * part_bytes, part_bytes.div_ceil(64), nta);
}

/// `out[l][r] = row r of the group · x[lane0 + l]` for `l < out.len()`: tiles of
/// `TILE_LANES` lanes, then one of 4, then one tile of the remaining 1–3.
macro_rules! wide_entry {
    ($entry:ident, $tile:ident) => {
        #[doc = "`out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
            if weight_prefetch_nta() {
                tiles!($tile, true, blk, x, lane0, out)
            } else {
                tiles!($tile, false, blk, x, lane0, out)
            }
        }
    };
}

/// The lane tiles of one group call: tiles of `TILE_LANES` lanes, a tile of 4 if that many are
/// left, then the remainder in one tile of its own width (single-lane passes would decode each weight block once per lane, and
/// a step of 2 or 3 sessions is common: sessions start and finish at different steps).
macro_rules! tiles {
    ($tile:ident, $nta:literal, $blk:ident, $x:ident, $lane0:ident, $out:ident) => {{
        let n = $out.len();
        let mut l = 0;
        while l + TILE_LANES <= n {
            $tile::<TILE_LANES, $nta>($blk, $x, $lane0 + l, &mut $out[l..l + TILE_LANES]);
            l += TILE_LANES;
        }
        if n - l >= 4 {
            $tile::<4, $nta>($blk, $x, $lane0 + l, &mut $out[l..l + 4]);
            l += 4;
        }
        match n - l {
            3 => $tile::<3, $nta>($blk, $x, $lane0 + l, &mut $out[l..n]),
            2 => $tile::<2, $nta>($blk, $x, $lane0 + l, &mut $out[l..n]),
            1 => $tile::<1, $nta>($blk, $x, $lane0 + l, &mut $out[l..n]),
            _ => {}
        }
    }};
}

wide_entry!(q4_1_group_wide_plain, q4_1_tile_wide);
wide_entry!(q8_0_group_wide, q8_0_tile_wide);

/// `out[l][r] = row r of the 16-row Q4_1 group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`,
/// with GFNI's nibble extraction where the CPU has it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn q4_1_group_wide(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
    if !gfni() {
        return q4_1_group_wide_plain(blk, x, lane0, out);
    }
    // SAFETY: GFNI was detected at run time; the other features are this function's own.
    unsafe {
        if weight_prefetch_nta() {
            tiles!(q4_1_tile_wide_gfni, true, blk, x, lane0, out)
        } else {
            tiles!(q4_1_tile_wide_gfni, false, blk, x, lane0, out)
        }
    }
}

/// Whether this CPU has GFNI (detected once; `ANELM_GFNI=0` turns its use off, for A/B runs).
fn gfni() -> bool {
    crate::Features::get().gfni && crate::Tuning::get().gfni
}

/// The exact i32 dots of block `$b` of each of `L` lanes with the 16 rows whose 32 weights
/// are `$w` (vector `g` holding bytes `4g .. 4g + 4` of every row), each lane's sum starting at
/// `$start[j]`. Group by group across the lanes, not lane by lane, in two chains per lane:
/// consecutive `vpdpbusd`s belong to different chains, so the scheduler always holds ready
/// ones (−10 % per lane-block at 4 lanes, docs/field-guide.md). A macro, not a function, so
/// the register arrays never go through memory.
macro_rules! block_sums {
    ($L:ident, $w:expr, $xq:expr, $b:expr, $start:expr) => {{
        let group = |j: usize, g: usize| _mm512_set1_epi32($xq.quad(j, 32 * $b + 4 * g));
        let mut s0: [__m512i; $L] = $start;
        let mut s1 = [_mm512_setzero_si512(); $L];
        for g in (0..8).step_by(2) {
            for j in 0..$L {
                s0[j] = _mm512_dpbusd_epi32(s0[j], $w[g], group(j, g));
                s1[j] = _mm512_dpbusd_epi32(s1[j], $w[g + 1], group(j, g + 1));
            }
        }
        let sums: [__m512i; $L] = std::array::from_fn(|j| _mm512_add_epi32(s0[j], s1[j]));
        sums
    }};
}

// Q4_1's 16-row tiles (plain and GFNI), written once with its 8-row ones.
use crate::packed_x86_q4_1::{q4_1_tile_wide, q4_1_tile_wide_gfni};

/// Q8_0, 544 bytes per (group, block): 16 f16 scales, then for `k < 8` bytes `4k .. 4k+4` of
/// each row's 32 quants, row after row, each stored as `w + 128` (`w ^ 0x80`, an unsigned
/// byte). The unsigned × signed dot then needs no sign transfer per lane:
/// `Σ (w + 128)·x = Σ w·x + 128·Σx`, and the activations carry each block's `Σx`, so one
/// subtraction per (lane, block) makes the sum exact again (no i32 sum can overflow:
/// 32 · 255 · 127 < 2^31). The subtraction is folded into the start of the sums
/// (`Activations::neg_offsets`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes' blocks alike
fn q8_0_tile_wide<const L: usize, const NTA: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    let nb = x.cols / 32;
    let xq = LaneBlocks::new(&x.q, lane, L, 32 * nb);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xoff = LaneBlocks::new(&x.neg_offsets, lane, L, nb);
    let mut acc = [_mm512_setzero_ps(); L];
    for (b, p) in blk.chunks_exact(544).enumerate().take(nb) {
        prefetch_lines(p, PREFETCH, 9, NTA);
        let d = f16x16(&p[0..32]);
        let w: [__m512i; 8] = std::array::from_fn(|k| load512(&p[32 + 64 * k..96 + 64 * k]));
        // Each lane's sum starts at −128·Σx (a broadcast load), so it comes out exact.
        let sums = block_sums!(L, w, xq, b, std::array::from_fn(|j| _mm512_set1_epi32(xoff.get(j, b))));
        for j in 0..L {
            let isum = _mm512_cvtepi32_ps(sums[j]);
            acc[j] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(xd.get(j, b))), acc[j]);
        }
    }
    for j in 0..L {
        // SAFETY: `out[j]` holds exactly 16 f32; unaligned store.
        unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::WeightFormat;

    #[test]
    fn gfni_nibbles_give_the_shift_and_mask_results_bit_for_bit() {
        if !(available() && crate::Features::get().gfni) {
            eprintln!("skipped: this CPU lacks AVX-512 VNNI or GFNI (the dispatch never takes this path)");
            return;
        }
        let (cols, lanes) = (96usize, 4usize);
        let nb = cols / 32;
        let mut seed = 99u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        // One 16-row group of Q4_1 blocks: f16 scales and minimums, then every byte pattern.
        let mut blk = vec![0u8; 320 * nb];
        for b in 0..nb {
            let p = &mut blk[320 * b..320 * (b + 1)];
            for r in 0..32 {
                let v = (next() % 2000) as f32 / 1000.0 - 1.0;
                p[2 * r..2 * r + 2].copy_from_slice(&crate::fp16::f32_to_f16(v).to_le_bytes());
            }
            for byte in &mut p[64..] {
                *byte = next() as u8;
            }
        }
        let x: Vec<f32> = (0..lanes * cols)
            .map(|_| (next() % 4000) as f32 / 1000.0 - 2.0)
            .collect();
        let mut act = Activations::new();
        act.quantize(WeightFormat::Q4_1, &x, lanes, cols).expect("quantize");
        let (mut plain, mut gfni) = ([[0f32; WIDE_ROWS]; 4], [[0f32; WIDE_ROWS]; 4]);
        // SAFETY: AVX-512 VNNI (with AVX2, FMA, F16C) and GFNI were detected above.
        unsafe {
            q4_1_tile_wide::<4, false>(&blk, &act, 0, &mut plain);
            q4_1_tile_wide_gfni::<4, false>(&blk, &act, 0, &mut gfni);
        }
        let bits = |t: &[[f32; WIDE_ROWS]; 4]| t.iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&gfni), bits(&plain));
        assert!(
            plain.iter().flatten().any(|v| *v != 0.0),
            "a test of zeros proves nothing"
        );
    }
}
