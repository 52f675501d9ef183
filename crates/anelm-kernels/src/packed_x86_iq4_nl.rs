//! The packed IQ4_NL kernel (layout in `packed_layout.rs`: Q4_0's, `18R` bytes per (group,
//! block)), written once over the register width (`lanes_x86_int::IntLanes`): 8-row groups on
//! AVX2 and AVX-512 VNNI (ymm), 16-row groups on AVX-512 VNNI (zmm).
//!
//! Each 4-bit index becomes its level of ggml's table by one byte shuffle (`vpshufb`) of the
//! vector of indices. `vpdpbusd` reads the levels unsigned, as `level + 128` (a shifted table),
//! each 4-product sum starting at `−128·Σ` of its activations (`Activations::quad_offsets`), so
//! it comes out exact; AVX2's `maddubs` would saturate on such weights (2·241·127 > 32767), so
//! there the signed levels' sign moves onto the activations instead (`|w| · sign(x, w)`).
//!
//! The sums accumulate in ggml's AVX2 order, as the Q4_0 kernels (`packed_x86_ggml_order.rs`):
//! per row eight f32 partials, partial `k` gathering `(Σ of products 4k .. 4k+4) · (d·dx)` by
//! FMA, added at the end as `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`; the row-major register
//! tile (`simd_x86::dot_rows4`) does the same, so both give the same bits.

use crate::activations::Activations;
use crate::blocks::IQ4_NL_VALUES;
use crate::lanes_x86_int::{IntLanes, Ymm, Zmm};
use crate::packed_x86::{LaneBlocks, lane_entry};
use crate::packed_x86_wide::{WIDE_ROWS, weight_prefetch_nta};

/// `L` lanes from `lane` against one group of `K::ROWS` rows.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn iq4_nl_kernel<K: IntLanes, const L: usize>(k: K, blk: &[u8], x: &Activations, lane: usize, out: &mut [K::Out]) {
    let r = K::ROWS;
    // Bytes per (group, block); the index bytes start after the `R` f16 scales.
    let (bytes, qs) = (18 * r, 2 * r);
    let nb = x.cols / 32;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xo = LaneBlocks::new(&x.quad_offsets, lane, L, 8 * nb);
    let mask = k.splat8(0x0F);
    let table = k.table16(&IQ4_NL_VALUES.map(|v| if K::SATURATING_DOT { v as u8 } else { (v as u8) ^ 0x80 }));
    let mut acc = [[k.zero_f(); 8]; L];
    for (b, p) in blk.chunks_exact(bytes).enumerate().take(nb) {
        k.prefetch_stream(p, bytes.div_ceil(64));
        let d = k.f16s(&p[0..2 * r]);
        let mut ddx = [k.zero_f(); L];
        for j in 0..L {
            ddx[j] = k.mul_f(d, k.splat_f(xd.get(j, b)));
        }
        for v in 0..8 {
            let packed = k.load(&p[qs + 4 * r * (v % 4)..]);
            let idx = if v < 4 {
                k.and(packed, mask)
            } else {
                k.high_nibbles(packed, mask)
            };
            let w = k.lookup16(table, idx);
            if K::SATURATING_DOT {
                let mag = k.abs8(w);
                for j in 0..L {
                    let xv = k.sign8(k.splat32(xq.quad(j, 32 * b + 4 * v)), w);
                    let sum = k.dot(k.zero_i(), mag, xv);
                    acc[j][v] = k.fmadd_f(k.to_f32(sum), ddx[j], acc[j][v]);
                }
            } else {
                for j in 0..L {
                    let start = k.splat32(xo.get(j, 8 * b + v));
                    let sum = k.dot(start, w, k.splat32(xq.quad(j, 32 * b + 4 * v)));
                    acc[j][v] = k.fmadd_f(k.to_f32(sum), ddx[j], acc[j][v]);
                }
            }
        }
    }
    for j in 0..L {
        let a = &acc[j];
        let lo = k.add_f(k.add_f(a[0], a[4]), k.add_f(a[2], a[6]));
        let hi = k.add_f(k.add_f(a[1], a[5]), k.add_f(a[3], a[7]));
        // `+ 0.0` as the row-major tile adds its (zero) minimum term: −0.0 becomes +0.0.
        k.store(&mut out[j], k.add_f(k.add_f(lo, hi), k.zero_f()));
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
    // SAFETY: compiled with the width's features and reached only through `packed`'s dispatch,
    // after they were detected.
    let k = unsafe { Ymm::<false>::assume() };
    iq4_nl_kernel::<_, L>(k, blk, x, lane, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
fn iq4_nl_tile_vnni<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as in `iq4_nl_tile`.
    let k = unsafe { Ymm::<true>::assume() };
    iq4_nl_kernel::<_, L>(k, blk, x, lane, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn iq4_nl_tile_wide<const L: usize, const NTA: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    // SAFETY: as in `iq4_nl_tile`.
    let k = unsafe { Zmm::<NTA, false>::assume() };
    iq4_nl_kernel::<_, L>(k, blk, x, lane, out)
}

// 8 accumulators per lane: one lane per tile on AVX2's 16 registers, two with AVX-512VL's 32.
lane_entry!(iq4_nl_group, iq4_nl_tile, "avx2,fma,f16c", 1);
lane_entry!(
    iq4_nl_group_vnni,
    iq4_nl_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    2
);

/// `out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`, two
/// lanes per tile (16 accumulators, their scale vectors, the weights and the broadcasts fit the
/// 32 zmm registers).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn iq4_nl_group_wide(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
    let n = out.len();
    let nta = weight_prefetch_nta();
    let mut l = 0;
    while l < n {
        let m = (n - l).min(2);
        let tile = &mut out[l..l + m];
        match (m, nta) {
            (2, true) => iq4_nl_tile_wide::<2, true>(blk, x, lane0 + l, tile),
            (2, false) => iq4_nl_tile_wide::<2, false>(blk, x, lane0 + l, tile),
            (_, true) => iq4_nl_tile_wide::<1, true>(blk, x, lane0 + l, tile),
            (_, false) => iq4_nl_tile_wide::<1, false>(blk, x, lane0 + l, tile),
        }
        l += m;
    }
}
