//! The packed Q4_0, Q5_0 and IQ4_NL kernels (layouts in `packed_layout.rs`), one kernel written
//! over the register width (`lanes_x86_int::IntLanes`) and the format's weight decode: 8-row
//! groups on AVX2 and AVX-512 VNNI (ymm), 16-row groups on AVX-512 VNNI (zmm), all
//! **accumulating in ggml's AVX2 order**, so their results are bit-identical to the row-major
//! tile's (`simd_x86::dot_rows4`), which follows llama.cpp.
//!
//! That order keeps, per row, eight f32 partial sums: partial `k` gathers, block after block,
//! `(Σ of the products of elements 4k .. 4k+4) · (d·dx)` by FMA, and the eight are added at the
//! end as `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`. A packed vector `k` holds exactly elements
//! `4k .. 4k+4` of the 8 rows, so one `vpdpbusd` yields partial `k`'s integer for all 8 rows and
//! the same FMA follows row-wise. Why not one f32 sum per block (a third of the FMAs): that
//! order moved Gemma 3's greedy output at one of llama.cpp's near-ties (docs/field-guide.md,
//! 2026-12-03, second pass, item 10), and this one cannot.
//!
//! The weights are read unsigned (Q4_0's nibble, Q5_0's nibble plus fifth bit), without the
//! format's offset of 8 or 16; each 4-product sum starts at `−offset·Σ` of its 4 activations
//! (`Activations::quad_offsets`, a broadcast load), so it comes out exact. IQ4_NL's nibbles are
//! indices into ggml's 16-level table, looked up by one byte shuffle (`vpshufb`) per vector:
//! `vpdpbusd` reads the levels as `level + 128` (sums starting at `−128·Σ`); AVX2's `maddubs`
//! would saturate on those (2·241·127 > 32767), so there the signed levels' sign moves onto the
//! activations instead (`|w| · sign(x, w)`, sums starting at 0).

use crate::activations::Activations;
use crate::blocks::IQ4_NL_VALUES;
use crate::lanes_x86_int::{IntLanes, Ymm, Zmm};
use crate::packed_x86::{LaneBlocks, lane_entry};
use crate::packed_x86_wide::{WIDE_ROWS, weight_prefetch_nta};

/// Format codes of [`ggml_order_kernel`].
const Q4_0: u8 = 0;
const Q5_0: u8 = 1;
const IQ4_NL: u8 = 2;

/// Bytes per (group, block) of format `F` for `rows`-row groups, and where its quant bytes start
/// (after the scales and, for Q5_0, the fifth bits).
#[inline(always)]
fn block_layout<const F: u8>(rows: usize) -> (usize, usize) {
    if F == Q5_0 {
        (22 * rows, 6 * rows)
    } else {
        (18 * rows, 2 * rows)
    }
}

/// The fifth bits of a block `p` of format `F` (Q5_0; zero for the others), which
/// [`block_weight`] takes for every vector of the block.
#[inline(always)]
fn fifth_bits<K: IntLanes, const F: u8>(k: K, p: &[u8]) -> K::I {
    let r = K::ROWS;
    if F == Q5_0 {
        k.load(&p[2 * r..6 * r])
    } else {
        k.zero_i()
    }
}

/// Unsigned weight vector `v` (0..8) of one block `p` of format `F`: elements `4v .. 4v + 4` of
/// the group's rows (Q4_0's nibble, Q5_0's nibble plus fifth bit, IQ4_NL's level as read by the
/// dot — see the module docs). A plain function the callers loop over, not a callback: a closure
/// defined in these generic helpers does not take the calling kernel's target features, so its
/// intrinsics were calls (the AVX2 kernels ran 7–10× slower than the row-major ones; field guide,
/// 2026-12-07 night).
#[inline(always)]
fn block_weight<K: IntLanes, const F: u8>(k: K, p: &[u8], table: K::I, fifth: K::I, v: usize) -> K::I {
    let r = K::ROWS;
    let (_, qs) = block_layout::<F>(r);
    let (mask, five) = (k.splat8(0x0F), k.splat8(0x10));
    let packed = k.load(&p[qs + 4 * r * (v % 4)..]);
    let mut w = if v < 4 {
        k.and(packed, mask)
    } else {
        k.high_nibbles(packed, mask)
    };
    if F == Q5_0 {
        // Bit v of each byte to bit 4 (16-bit shifts: what crosses into the neighbouring
        // byte lands outside bit 4 and is masked off).
        let h = match v {
            0 => k.shl16::<4>(fifth),
            1 => k.shl16::<3>(fifth),
            2 => k.shl16::<2>(fifth),
            3 => k.shl16::<1>(fifth),
            4 => fifth,
            5 => k.shr16::<1>(fifth),
            6 => k.shr16::<2>(fifth),
            _ => k.shr16::<3>(fifth),
        };
        w = k.or(w, k.and(h, five));
    }
    if F == IQ4_NL {
        w = k.lookup16(table, w);
    }
    w
}

/// IQ4_NL's level table as [`block_weight`] reads it (`signed`: AVX2's saturating dot).
#[inline(always)]
fn level_table<K: IntLanes>(k: K, signed: bool) -> K::I {
    k.table16(&IQ4_NL_VALUES.map(|v| if signed { v as u8 } else { (v as u8) ^ 0x80 }))
}

/// Partial `v` of block `b` for each of the `L` lanes: the unsigned weight vector `w` dotted with
/// the lane's quad, starting at its offset sum, then `acc[j][v] += float(sum) · ddx[j]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn quad_sums<K: IntLanes, const L: usize>(
    k: K,
    w: K::I,
    xq: &LaneBlocks<i8>,
    xo: &LaneBlocks<i32>,
    b: usize,
    v: usize,
    ddx: &[K::F; L],
    acc: &mut [[K::F; 8]; L],
) {
    for j in 0..L {
        let start = k.splat32(xo.get(j, 8 * b + v));
        let sum = k.dot(start, w, k.splat32(xq.quad(j, 32 * b + 4 * v)));
        acc[j][v] = k.fmadd_f(k.to_f32(sum), ddx[j], acc[j][v]);
    }
}

/// The end of a tile: each lane's eight partials added in ggml's order and stored.
#[inline(always)]
fn finish_lanes<K: IntLanes, const L: usize>(k: K, acc: &[[K::F; 8]; L], out: &mut [K::Out]) {
    for j in 0..L {
        let a = &acc[j];
        let lo = k.add_f(k.add_f(a[0], a[4]), k.add_f(a[2], a[6]));
        let hi = k.add_f(k.add_f(a[1], a[5]), k.add_f(a[3], a[7]));
        // `+ 0.0` as the row-major tile adds its (zero) minimum term: −0.0 becomes +0.0.
        k.store(&mut out[j], k.add_f(k.add_f(lo, hi), k.zero_f()));
    }
}

/// `L` lanes from `lane` against one group of `K::ROWS` rows of the format `F` ([`Q4_0`],
/// [`Q5_0`] or [`IQ4_NL`]).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn ggml_order_kernel<K: IntLanes, const L: usize, const F: u8>(
    k: K,
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [K::Out],
) {
    let r = K::ROWS;
    let (bytes, _) = block_layout::<F>(r);
    // IQ4_NL's sign moves onto the activations where the dot saturates (see the module docs).
    let signed = F == IQ4_NL && K::SATURATING_DOT;
    let nb = x.cols / 32;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xo = LaneBlocks::new(&x.quad_offsets, lane, L, 8 * nb);
    let table = level_table(k, signed);
    let mut acc = [[k.zero_f(); 8]; L];
    for (b, p) in blk.chunks_exact(bytes).enumerate().take(nb) {
        k.prefetch_stream(p, bytes.div_ceil(64));
        let d = k.f16s(&p[0..2 * r]);
        let mut ddx = [k.zero_f(); L];
        for j in 0..L {
            ddx[j] = k.mul_f(d, k.splat_f(xd.get(j, b)));
        }
        let fifth = fifth_bits::<K, F>(k, p);
        for v in 0..8 {
            let w = block_weight::<K, F>(k, p, table, fifth, v);
            if signed {
                let mag = k.abs8(w);
                for j in 0..L {
                    let xv = k.sign8(k.splat32(xq.quad(j, 32 * b + 4 * v)), w);
                    let sum = k.dot(k.zero_i(), mag, xv);
                    acc[j][v] = k.fmadd_f(k.to_f32(sum), ddx[j], acc[j][v]);
                }
            } else {
                quad_sums::<K, L>(k, w, &xq, &xo, b, v, &ddx, &mut acc);
            }
        }
    }
    finish_lanes::<K, L>(k, &acc, out);
}

/// Decode every block of a group of format `F` once into `dec` (`nb · 8` vectors of
/// `4 · K::ROWS` bytes, block after block), for [`decoded_kernel`]: a call with many lanes then
/// pays the nibble, fifth-bit and table work once instead of once per lane tile.
#[inline(always)]
fn decode_group<K: IntLanes, const F: u8>(k: K, blk: &[u8], nb: usize, dec: &mut Vec<u8>) {
    let (bytes, _) = block_layout::<F>(K::ROWS);
    let vec_bytes = 4 * K::ROWS;
    dec.resize(nb * 8 * vec_bytes, 0);
    let table = level_table(k, false);
    for (b, (p, out)) in blk
        .chunks_exact(bytes)
        .zip(dec.chunks_exact_mut(8 * vec_bytes))
        .enumerate()
    {
        if b >= nb {
            break;
        }
        k.prefetch_stream(p, bytes.div_ceil(64));
        let fifth = fifth_bits::<K, F>(k, p);
        for v in 0..8 {
            k.store_i(&mut out[v * vec_bytes..], block_weight::<K, F>(k, p, table, fifth, v));
        }
    }
}

/// [`ggml_order_kernel`] reading the weight vectors [`decode_group`] made (`dec`) instead of
/// decoding them: the same integers and f32 operations in the same order, so the same bits. A
/// width whose dot does not saturate only ([`IntLanes::SATURATING_DOT`] false).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn decoded_kernel<K: IntLanes, const L: usize, const F: u8>(
    k: K,
    dec: &[u8],
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [K::Out],
) {
    debug_assert!(!K::SATURATING_DOT);
    let r = K::ROWS;
    let (bytes, _) = block_layout::<F>(r);
    let vec_bytes = 4 * r;
    let nb = x.cols / 32;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xo = LaneBlocks::new(&x.quad_offsets, lane, L, 8 * nb);
    let mut acc = [[k.zero_f(); 8]; L];
    for (b, (p, wb)) in blk
        .chunks_exact(bytes)
        .zip(dec.chunks_exact(8 * vec_bytes))
        .enumerate()
        .take(nb)
    {
        let d = k.f16s(&p[0..2 * r]);
        let mut ddx = [k.zero_f(); L];
        for j in 0..L {
            ddx[j] = k.mul_f(d, k.splat_f(xd.get(j, b)));
        }
        for v in 0..8 {
            quad_sums::<K, L>(k, k.load(&wb[v * vec_bytes..]), &xq, &xo, b, v, &ddx, &mut acc);
        }
    }
    finish_lanes::<K, L>(k, &acc, out);
}

/// Lanes from which a 16-row call decodes its group once ([`decode_group`]) rather than per
/// two-lane tile.
const DECODE_FROM_LANES: usize = 4;

thread_local! {
    /// The decoded weight vectors of the group a 16-row call is working on.
    static DECODED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An 8-row tile function for [`lane_entry`]: format `$f` on the `Ymm<$vnni>` width.
macro_rules! ymm_tile {
    ($tile:ident, $features:literal, $vnni:literal, $f:ident) => {
        #[inline]
        #[target_feature(enable = $features)]
        fn $tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
            // SAFETY: this function is compiled with the width's features and reached only
            // through `packed`'s dispatch, after they were detected.
            let k = unsafe { Ymm::<$vnni>::assume() };
            ggml_order_kernel::<_, L, $f>(k, blk, x, lane, out)
        }
    };
}

/// The 16-row entry point and tiles of format `$f`: two lanes per tile (16 accumulators, their
/// two scale vectors, the weight vector and the broadcasts fit the 32 zmm registers); from
/// [`DECODE_FROM_LANES`] lanes the group's weights are decoded once for all the tiles.
macro_rules! zmm_group {
    ($entry:ident, $tile:ident, $decoded_tile:ident, $f:ident) => {
        #[doc = "`out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
            let n = out.len();
            if n >= DECODE_FROM_LANES {
                DECODED.with(|dec| {
                    let mut dec = dec.borrow_mut();
                    // SAFETY: as in `ymm_tile` (this function carries the width's features).
                    let k = unsafe { Zmm::<false, false>::assume() };
                    decode_group::<_, $f>(k, blk, x.cols / 32, &mut dec);
                    let mut l = 0;
                    while l < n {
                        let m = (n - l).min(2);
                        let tile = &mut out[l..l + m];
                        if m == 2 {
                            $decoded_tile::<2>(&dec, blk, x, lane0 + l, tile)
                        } else {
                            $decoded_tile::<1>(&dec, blk, x, lane0 + l, tile)
                        }
                        l += m;
                    }
                });
                return;
            }
            let nta = weight_prefetch_nta();
            let mut l = 0;
            while l < n {
                let m = (n - l).min(2);
                let tile = &mut out[l..l + m];
                match (m, nta) {
                    (2, true) => $tile::<2, true>(blk, x, lane0 + l, tile),
                    (2, false) => $tile::<2, false>(blk, x, lane0 + l, tile),
                    (_, true) => $tile::<1, true>(blk, x, lane0 + l, tile),
                    (_, false) => $tile::<1, false>(blk, x, lane0 + l, tile),
                }
                l += m;
            }
        }

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
            ggml_order_kernel::<_, L, $f>(k, blk, x, lane, out)
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn $decoded_tile<const L: usize>(
            dec: &[u8],
            blk: &[u8],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; WIDE_ROWS]],
        ) {
            // SAFETY: as in `ymm_tile`.
            let k = unsafe { Zmm::<false, false>::assume() };
            decoded_kernel::<_, L, $f>(k, dec, blk, x, lane, out)
        }
    };
}

ymm_tile!(q4_0_tile, "avx2,fma,f16c", false, Q4_0);
ymm_tile!(q4_0_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", true, Q4_0);
ymm_tile!(q5_0_tile, "avx2,fma,f16c", false, Q5_0);
ymm_tile!(q5_0_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", true, Q5_0);
ymm_tile!(iq4_nl_tile, "avx2,fma,f16c", false, IQ4_NL);
ymm_tile!(iq4_nl_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", true, IQ4_NL);

// 8 accumulators per lane: one lane per tile on AVX2's 16 registers, two with AVX-512VL's 32.
lane_entry!(q4_0_group, q4_0_tile, "avx2,fma,f16c", 1);
lane_entry!(q4_0_group_vnni, q4_0_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 2);
lane_entry!(q5_0_group, q5_0_tile, "avx2,fma,f16c", 1);
lane_entry!(q5_0_group_vnni, q5_0_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 2);
lane_entry!(iq4_nl_group, iq4_nl_tile, "avx2,fma,f16c", 1);
lane_entry!(
    iq4_nl_group_vnni,
    iq4_nl_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    2
);

zmm_group!(q4_0_group_wide, q4_0_tile_wide, q4_0_tile_decoded, Q4_0);
zmm_group!(q5_0_group_wide, q5_0_tile_wide, q5_0_tile_decoded, Q5_0);
zmm_group!(iq4_nl_group_wide, iq4_nl_tile_wide, iq4_nl_tile_decoded, IQ4_NL);
