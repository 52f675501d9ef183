//! The packed Q4_1 kernel (layout in `packed_layout.rs`: per (group, block) `R` f16 scales, `R`
//! f16 minimums, then for `k < 4` bytes `4k .. 4k+4` of each row's 16 quant bytes), written once
//! over the register width (`lanes_x86_int::IntLanes`): 8-row groups on AVX2 and AVX-512 VNNI
//! (ymm), 16-row groups on AVX-512 VNNI (zmm, with GFNI's nibble extraction where the CPU has it;
//! the 16-row entry points are in `packed_x86_wide.rs`).
//!
//! Per (row, lane) the exact integer dot of the block, then the same two FMAs in block order as
//! the row-major kernels, so every width gives the same bits.

use crate::activations::Activations;
use crate::lanes_x86_int::{IntLanes, Ymm, Zmm};
use crate::packed_x86::{LaneBlocks, lane_entry};
use crate::packed_x86_wide::WIDE_ROWS;

/// `L` lanes from `lane` against one group of `K::ROWS` rows.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn q4_1_kernel<K: IntLanes, const L: usize>(k: K, blk: &[u8], x: &Activations, lane: usize, out: &mut [K::Out]) {
    let r = K::ROWS;
    let nb = x.cols / 32;
    // The L lanes' quants, scales and sums, checked once here; the block loop reads them
    // through `LaneBlocks` without a bounds check per (lane, block).
    let xq = LaneBlocks::new(&x.q, lane, L, 32 * nb);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xs = LaneBlocks::new(&x.s, lane, L, nb);
    let mask = k.splat8(0x0F);
    let mut acc = [k.zero_f(); L];
    for (b, p) in blk.chunks_exact(20 * r).enumerate().take(nb) {
        k.prefetch_stream(p, (20 * r).div_ceil(64));
        let d = k.f16s(&p[0..2 * r]);
        let m = k.f16s(&p[2 * r..4 * r]);
        let mut v = [k.zero_i(); 8];
        for q in 0..4 {
            let packed = k.load(&p[4 * r + 4 * r * q..]);
            v[q] = k.and(packed, mask);
            v[q + 4] = k.high_nibbles(packed, mask);
        }
        // Group by group across the lanes, in two chains per lane: consecutive dots belong to
        // different chains, so the scheduler always holds ready ones.
        let mut s0 = [k.zero_i(); L];
        let mut s1 = [k.zero_i(); L];
        for g in (0..8).step_by(2) {
            for j in 0..L {
                s0[j] = k.dot(s0[j], v[g], k.splat32(xq.quad(j, 32 * b + 4 * g)));
                s1[j] = k.dot(s1[j], v[g + 1], k.splat32(xq.quad(j, 32 * b + 4 * g + 4)));
            }
        }
        let mut sums = [k.zero_i(); L];
        for j in 0..L {
            sums[j] = k.add32(s0[j], s1[j]);
        }
        for j in 0..L {
            let isum = k.to_f32(sums[j]);
            acc[j] = k.fmadd_f(isum, k.mul_f(d, k.splat_f(xd.get(j, b))), acc[j]);
            acc[j] = k.fmadd_f(m, k.splat_f(xs.get(j, b)), acc[j]);
        }
    }
    for j in 0..L {
        k.store(&mut out[j], acc[j]);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
    // SAFETY: compiled with the width's features and reached only through `packed`'s dispatch,
    // after they were detected.
    let k = unsafe { Ymm::<false>::assume() };
    q4_1_kernel::<_, L>(k, blk, x, lane, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
fn q4_1_tile_vnni<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as in `q4_1_tile`.
    let k = unsafe { Ymm::<true>::assume() };
    q4_1_kernel::<_, L>(k, blk, x, lane, out)
}

/// The 16-row tile, the high nibbles by shift and mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn q4_1_tile_wide<const L: usize, const NTA: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    // SAFETY: as in `q4_1_tile`.
    let k = unsafe { Zmm::<NTA, false>::assume() };
    q4_1_kernel::<_, L>(k, blk, x, lane, out)
}

/// The 16-row tile, the high nibbles by one GFNI affine transform.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
pub(crate) fn q4_1_tile_wide_gfni<const L: usize, const NTA: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    // SAFETY: as in `q4_1_tile`, GFNI included.
    let k = unsafe { Zmm::<NTA, true>::assume() };
    q4_1_kernel::<_, L>(k, blk, x, lane, out)
}

lane_entry!(q4_1_group, q4_1_tile, "avx2,fma,f16c", 2);
lane_entry!(q4_1_group_vnni, q4_1_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 4);
