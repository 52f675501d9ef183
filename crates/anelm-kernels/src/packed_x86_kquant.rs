//! The packed Q4_K, Q5_K and Q6_K kernels (layouts in `packed_layout.rs`), each written once
//! over the register width (`lanes_x86_int::IntLanes`) and compiled for 8-row groups on AVX2
//! (`maddubs` + `madd`) and AVX-512 VNNI (`vpdpbusd` on ymm registers), and 16-row groups on
//! AVX-512 VNNI (zmm registers). Every byte offset of a layout is a multiple of the group's rows
//! `R` (`20R`, `4R` per vector of four bytes of each row, …), so one kernel reads both.
//!
//! **Bit-exact with the row-major kernels** (scalar and SIMD alike): those reduce each 256-value
//! super-block to exact integers — `Σ_j scale_j · (sub-block dot)`, and for Q4_K
//! `Σ_j min_j · (sub-block Σx)` — then add `d·dx·sumi − dmin·dx·summins` to the row's f32 sum,
//! super-block after super-block. Here the same integers come out of vector arithmetic for 8
//! rows at once (every partial sum fits an i32, so their order does not matter), and the same
//! f32 operations follow in the same order, separately rounded (no FMA).
//!
//! The weights are read unsigned: Q4_K's nibbles are already, and Q6_K's 6-bit values are taken
//! without their offset of 32, which each sub-block sum gets back by starting at
//! `−32·Σx` (`Activations::sub_offsets`, a broadcast load).

use crate::activations::Activations;
use crate::lanes_x86_int::{IntLanes, Ymm, Zmm};
use crate::packed_x86::{LaneBlocks, lane_entry};
use crate::packed_x86_wide::{WIDE_ROWS, weight_prefetch_nta};

/// Bytes per row of a Q4_K super-block in the packed layout (Q5_K: 32 more, its fifth bits).
const Q4_K_ROW_BYTES: usize = 148;
/// Where a group's fifth bits start in the Q5_K layout, per row of the group.
const Q5_K_HIGH_BITS: usize = 148;
/// Bytes per row of a Q6_K super-block (as stored).
const Q6_K_ROW_BYTES: usize = 210;

/// Q4_K, or with `FIFTH` Q5_K (the same layout plus, at `148R`, for `k < 8` bytes `4k .. +4`
/// of each row's 32 `qh` bytes: bit `2c + half` of a byte is the fifth bit of the value that
/// vector `k` of chunk `c` holds at that byte, low nibbles for `half` 0, high for 1), for `L`
/// lanes from `lane`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn q45_k_kernel<K: IntLanes, const L: usize, const FIFTH: bool>(
    k: K,
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [K::Out],
) {
    let r = K::ROWS;
    let nb = x.cols / 256;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xp = LaneBlocks::new(&x.kpairs, lane, L, 4 * nb);
    let (mask, five) = (k.splat8(0x0F), k.splat8(0x10));
    let group_bytes = r * (Q4_K_ROW_BYTES + if FIFTH { 32 } else { 0 });
    let mut acc = [k.zero_f(); L];
    for (b, p) in blk.chunks_exact(group_bytes).enumerate().take(nb) {
        let mut sumi = [k.zero_i(); L];
        for c in 0..4 {
            k.prefetch_stream(&p[20 * r + 32 * r * c..], r / 2);
            if FIFTH && c == 0 {
                k.prefetch_t0(&p[r * Q5_K_HIGH_BITS..], r / 2);
            }
            for half in 0..2 {
                // Sub-block 2c (low nibbles) or 2c + 1 (high nibbles): elements
                // 64c + 32·half + 4v .. +4 of the R rows in vector v.
                let mut w = [k.zero_i(); 8];
                for v in 0..8 {
                    let bytes = k.load(&p[20 * r + 4 * r * (8 * c + v)..]);
                    w[v] = if half == 0 {
                        k.and(bytes, mask)
                    } else {
                        k.and(k.shr16::<4>(bytes), mask)
                    };
                    if FIFTH {
                        // Bit 2c + half of each byte to bit 4 (16-bit shifts: what crosses into
                        // the neighbouring byte lands outside bit 4).
                        let qh = k.load(&p[r * Q5_K_HIGH_BITS + 4 * r * v..]);
                        let bit = (2 * c + half) as i32;
                        let h = if bit <= 4 {
                            k.shl16_by(qh, 4 - bit)
                        } else {
                            k.shr16_by(qh, bit - 4)
                        };
                        w[v] = k.or(w[v], k.and(h, five));
                    }
                }
                let sc = k.u8_to_i32(&p[4 * r + r * (2 * c + half)..]);
                let base = 256 * b + 64 * c + 32 * half;
                for j in 0..L {
                    let mut s0 = k.dot(k.zero_i(), w[0], k.splat32(xq.quad(j, base)));
                    let mut s1 = k.dot(k.zero_i(), w[1], k.splat32(xq.quad(j, base + 4)));
                    for v in (2..8).step_by(2) {
                        s0 = k.dot(s0, w[v], k.splat32(xq.quad(j, base + 4 * v)));
                        s1 = k.dot(s1, w[v + 1], k.splat32(xq.quad(j, base + 4 * v + 4)));
                    }
                    sumi[j] = k.add32(sumi[j], k.mul32(k.add32(s0, s1), sc));
                }
            }
        }
        // Minimum pairs `(m[2p], m[2p+1])` per row as i16, against each lane's pair of 32-value
        // sums.
        let mut mins = [k.zero_i(); 4];
        for q in 0..4 {
            mins[q] = k.u8_to_i16(&p[12 * r + 2 * r * q..]);
        }
        let d = k.f16s(&p[0..2 * r]);
        let dmin = k.f16s(&p[2 * r..4 * r]);
        for j in 0..L {
            let mut summins = k.madd16(mins[0], k.splat32(xp.get(j, 4 * b)));
            for q in 1..4 {
                summins = k.add32(summins, k.madd16(mins[q], k.splat32(xp.get(j, 4 * b + q))));
            }
            let dx = k.splat_f(xd.get(j, b));
            let t = k.mul_f(k.mul_f(d, dx), k.to_f32(sumi[j]));
            let m = k.mul_f(k.mul_f(dmin, dx), k.to_f32(summins));
            acc[j] = k.add_f(acc[j], k.sub_f(t, m));
        }
    }
    for j in 0..L {
        k.store(&mut out[j], acc[j]);
    }
}

/// Q6_K for `L` lanes from `lane`: per (group, super-block) `R` f16 `d`, the 16 int8 sub-block
/// scales sub-block after sub-block, then `ql` and `qh` four bytes of each row at a time (see
/// `packed_layout.rs`).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn q6_k_kernel<K: IntLanes, const L: usize>(k: K, blk: &[u8], x: &Activations, lane: usize, out: &mut [K::Out]) {
    let r = K::ROWS;
    let group_bytes = r * Q6_K_ROW_BYTES;
    let nb = x.cols / 256;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xo = LaneBlocks::new(&x.sub_offsets, lane, L, 16 * nb);
    let (low, two) = (k.splat8(0x0F), k.splat8(0x30));
    let mut acc = [k.zero_f(); L];
    for (b, p) in blk.chunks_exact(group_bytes).enumerate().take(nb) {
        if r == 8 {
            k.prefetch_stream(&p[18 * r..], 8);
        }
        let mut sumi = [k.zero_i(); L];
        for h in 0..2 {
            if r == 8 {
                k.prefetch_stream(&p[18 * r + 512 * h + 512..], 8);
            } else {
                // The whole super-block two ahead, half of it per `h` (a fixed distance past the
                // `ql` and `qh` reads left a third of each block to the hardware prefetcher: the
                // 1-lane 9216 × 2560 bench ran at 20 GB/s, half the 8-row kernel's rate).
                for line in (0..group_bytes / 2).step_by(64) {
                    k.prefetch_line(p.as_ptr().wrapping_add(2 * group_bytes + h * group_bytes / 2 + line));
                }
            }
            for kk in 0..2 {
                // Stream `st`: elements 128h + 32st + 4v .. +4 (v = 4kk .. 4kk + 4), all of
                // sub-block 8h + 2st + kk: the low (st < 2) or high nibbles of `ql` part st & 1,
                // and bits 2st, 2st + 1 of `qh` as bits 4 and 5.
                for st in 0..4 {
                    // Plain loops, not closures: a closure is compiled on its own, without the
                    // target features, and called per vector (the kernel ran at a tenth of its
                    // speed).
                    let mut w = [k.zero_i(); 4];
                    for i in 0..4 {
                        let v = 4 * kk + i;
                        let ql = k.load(&p[18 * r + 4 * r * ((2 * h + (st & 1)) * 8 + v)..]);
                        let qh = k.load(&p[146 * r + 4 * r * (8 * h + v)..]);
                        let nib = if st < 2 {
                            k.and(ql, low)
                        } else {
                            k.and(k.shr16::<4>(ql), low)
                        };
                        let high = match st {
                            0 => k.shl16::<4>(qh),
                            1 => k.shl16::<2>(qh),
                            2 => qh,
                            _ => k.shr16::<2>(qh),
                        };
                        w[i] = k.or(nib, k.and(high, two));
                    }
                    let s = 8 * h + 2 * st + kk;
                    let sc = k.i8_to_i32(&p[2 * r + r * s..]);
                    let base = 256 * b + 128 * h + 32 * st + 16 * kk;
                    for j in 0..L {
                        let start = k.splat32(xo.get(j, 16 * b + s));
                        let s0 = k.dot(start, w[0], k.splat32(xq.quad(j, base)));
                        let s1 = k.dot(k.zero_i(), w[1], k.splat32(xq.quad(j, base + 4)));
                        let s0 = k.dot(s0, w[2], k.splat32(xq.quad(j, base + 8)));
                        let s1 = k.dot(s1, w[3], k.splat32(xq.quad(j, base + 12)));
                        sumi[j] = k.add32(sumi[j], k.mul32(k.add32(s0, s1), sc));
                    }
                }
            }
        }
        let d = k.f16s(&p[0..2 * r]);
        for j in 0..L {
            let dx = k.splat_f(xd.get(j, b));
            acc[j] = k.add_f(acc[j], k.mul_f(k.mul_f(d, dx), k.to_f32(sumi[j])));
        }
    }
    for j in 0..L {
        k.store(&mut out[j], acc[j]);
    }
}

/// An 8-row tile function for [`lane_entry`]: `$kernel` (with its extra const arguments) on the
/// `Ymm<$vnni>` width.
macro_rules! ymm_tile {
    ($tile:ident, $features:literal, $vnni:literal, $kernel:ident $(, $extra:literal)?) => {
        #[inline]
        #[target_feature(enable = $features)]
        fn $tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
            // SAFETY: this function is compiled with the width's features and reached only
            // through `packed`'s dispatch, after they were detected.
            let k = unsafe { Ymm::<$vnni>::assume() };
            $kernel::<_, L $(, $extra)?>(k, blk, x, lane, out)
        }
    };
}

/// A 16-row tile function for [`wide_lanes`]: `$kernel` on the `Zmm<NTA, false>` width.
macro_rules! zmm_tile {
    ($tile:ident, $kernel:ident $(, $extra:literal)?) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn $tile<const L: usize, const NTA: bool>(
            blk: &[u8],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; WIDE_ROWS]],
        ) {
            // SAFETY: as in `ymm_tile`.
            let k = unsafe { Zmm::<NTA, false>::assume() };
            $kernel::<_, L $(, $extra)?>(k, blk, x, lane, out)
        }
    };
}

ymm_tile!(q4_k_tile, "avx2,fma,f16c", false, q45_k_kernel, false);
ymm_tile!(
    q4_k_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    true,
    q45_k_kernel,
    false
);
ymm_tile!(q5_k_tile, "avx2,fma,f16c", false, q45_k_kernel, true);
ymm_tile!(
    q5_k_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    true,
    q45_k_kernel,
    true
);
ymm_tile!(q6_k_tile, "avx2,fma,f16c", false, q6_k_kernel);
ymm_tile!(q6_k_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", true, q6_k_kernel);
zmm_tile!(q4_k_tile_wide, q45_k_kernel, false);
zmm_tile!(q5_k_tile_wide, q45_k_kernel, true);
zmm_tile!(q6_k_tile_wide, q6_k_kernel);

lane_entry!(q4_k_group, q4_k_tile, "avx2,fma,f16c", 2);
lane_entry!(q4_k_group_vnni, q4_k_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 4);
lane_entry!(q5_k_group, q5_k_tile, "avx2,fma,f16c", 2);
lane_entry!(q5_k_group_vnni, q5_k_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 4);
lane_entry!(q6_k_group, q6_k_tile, "avx2,fma,f16c", 2);
lane_entry!(q6_k_group_vnni, q6_k_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 4);

/// The entry of a 16-row kernel: tiles of 4 lanes, then 2, then 1, with the weight stream
/// prefetched as the other wide kernels do it (`weight_prefetch_nta`).
macro_rules! wide_lanes {
    ($entry:ident, $tile:ident) => {
        #[doc = "`out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
            let n = out.len();
            let nta = weight_prefetch_nta();
            let mut l = 0;
            while l < n {
                let m = if n - l >= 4 { 4 } else { (n - l).min(2) };
                let tile = &mut out[l..l + m];
                match (m, nta) {
                    (4, true) => $tile::<4, true>(blk, x, lane0 + l, tile),
                    (4, false) => $tile::<4, false>(blk, x, lane0 + l, tile),
                    (2, true) => $tile::<2, true>(blk, x, lane0 + l, tile),
                    (2, false) => $tile::<2, false>(blk, x, lane0 + l, tile),
                    (_, true) => $tile::<1, true>(blk, x, lane0 + l, tile),
                    (_, false) => $tile::<1, false>(blk, x, lane0 + l, tile),
                }
                l += m;
            }
        }
    };
}

wide_lanes!(q4_k_group_wide, q4_k_tile_wide);
wide_lanes!(q5_k_group_wide, q5_k_tile_wide);
wide_lanes!(q6_k_group_wide, q6_k_tile_wide);
