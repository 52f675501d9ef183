//! The packed Q3_K and IQ4_XS kernels (layouts in `packed_layout.rs`), written once over the
//! register width (`lanes_x86_int::IntLanes`): 8-row groups on AVX2 (`maddubs` + `madd`) and
//! AVX-512 VNNI (`vpdpbusd` on ymm registers), 16-row groups on AVX-512 VNNI (zmm registers).
//!
//! **Bit-exact with the row-major kernels** (`scaled_blocks.rs`, portable and AVX2 alike): those
//! reduce each 256-value block to one exact integer, `sumi = Σ_s scale_s · Σ_{e ∈ s} q_e · x_e`
//! (Q8_K activations `x`), then add `dx · d · sumi` to the row's f32 sum, block after block,
//! from 0. Here the same integer comes out of vector arithmetic for every row of the group
//! (each partial sum is exact in i32, so their order does not matter), and the same f32
//! operations follow in the same order, separately rounded (no FMA): `acc += (d · dx) ·
//! float(sumi)` (`d · dx` and `dx · d` are one rounding of the same product). So every output
//! has the row-major kernels' bits — the guarantee `tests/packed.rs` checks on every layout and
//! instruction set, including blocks at the ends of their ranges.
//!
//! The weights go into the dot unsigned. Q3_K's `q + 4` (`0 ..= 7`: its two low bits with the
//! `hmask` bit above them) against each 16-value sub-block's activations, the sum starting at
//! `−4 · Σx` (`Activations::bsums`); the largest pair sum `maddubs` forms is 2 · 7 · 127, far
//! from saturating. IQ4_XS's nibbles are indices into IQ4_NL's 16 levels, looked up by one byte
//! shuffle per vector: `vpdpbusd` reads `level + 128` with sums starting at `−128 · Σx` of the
//! 32-value sub-block; AVX2's `maddubs` would saturate on those (2 · 241 · 127 > 32767), so
//! there the levels' sign moves onto the activations (`|w| · sign(x, w)`, sums from 0), as in
//! the IQ4_NL kernels. Each sub-block's sum is then multiplied by its scale (`vpmulld`) into the
//! block's `sumi`; bounds: |sub-block sum| ≤ 32 · 127 · 127, |sumi| < 256 · 127 · 127 · 32 < 2³¹.

use crate::activations::Activations;
use crate::blocks::IQ4_NL_VALUES;
use crate::lanes_x86_int::{IntLanes, Ymm, Zmm};
use crate::packed_layout::{IQ4_XS_ROW_BLOCK, Q3_K_ROW_BLOCK};
use crate::packed_x86::{LaneBlocks, lane_entry};
use crate::packed_x86_wide::{WIDE_ROWS, weight_prefetch_nta};

/// Bits `2j, 2j + 1` of every byte of `v` moved to bits 0 and 1 (other bits not cleared).
#[inline(always)]
fn crumb_down<K: IntLanes>(k: K, v: K::I, j: usize) -> K::I {
    match j {
        0 => v,
        1 => k.shr16::<2>(v),
        2 => k.shr16::<4>(v),
        _ => k.shr16::<6>(v),
    }
}

/// Bit `bit` of every byte of `v` moved to bit 2 (other bits not cleared). The 16-bit shifts
/// move a byte's bit 2 only within that byte (they shift by at most 5).
#[inline(always)]
fn bit_to_2<K: IntLanes>(k: K, v: K::I, bit: usize) -> K::I {
    match bit {
        0 => k.shl16::<2>(v),
        1 => k.shl16::<1>(v),
        2 => v,
        3 => k.shr16::<1>(v),
        4 => k.shr16::<2>(v),
        5 => k.shr16::<3>(v),
        6 => k.shr16::<4>(v),
        _ => k.shr16::<5>(v),
    }
}

/// The unsigned weight vectors (`q + 4`) of sub-block `8n + 2j + half` of one Q3_K block `p`
/// (`nj = 4n + j`): elements `128n + 32j + 16·half + 4i .. +4` of the rows in vector `i`, from
/// `qs` vector `8n + 4·half + i` (crumb `j`) and `hmask` vector `4·half + i` (bit `4n + j`).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `i` names the vector in the comment's formula
fn q3_k_weights<K: IntLanes>(k: K, p: &[u8], nj: usize, half: usize) -> [K::I; 4] {
    let r = K::ROWS;
    let (n, j) = (nj / 4, nj % 4);
    let (three, four) = (k.splat8(3), k.splat8(4));
    let mut w = [k.zero_i(); 4];
    for i in 0..4 {
        let v = 4 * half + i;
        let qs = k.load(&p[18 * r + 4 * r * (8 * n + v)..]);
        let hm = k.load(&p[82 * r + 4 * r * v..]);
        let low = k.and(crumb_down(k, qs, j), three);
        w[i] = k.or(low, k.and(bit_to_2(k, hm, nj), four));
    }
    w
}

/// One Q3_K block's crumb `J` of `qs` half `N` (`NJ = 4N + J`): sub-blocks `8N + 2J` and
/// `8N + 2J + 1` of every row, for `L` lanes, added to `sumi`. `NJ` is a constant so that the
/// shifts are immediates (a loop over it compiled to a jump table per vector).
#[inline(always)]
fn q3_k_crumb<K: IntLanes, const L: usize, const NJ: usize>(
    k: K,
    p: &[u8],
    b: usize,
    xq: &LaneBlocks<i8>,
    xs: &LaneBlocks<i32>,
    sumi: &mut [K::I; L],
) {
    q3_k_crumb_at::<K, L, false>(k, NJ, p, &[], b, xq, xs, sumi);
}

/// [`q3_k_crumb`] for crumb `nj` (= `NJ`), a constant once inlined there; a loop variable in
/// the many-lane tiles, where the shifts then go through a jump table. With `DEC` the weight
/// vectors are loaded from `dec` (this block's, as [`q3_k_decode_group`] stores them) instead.
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // `l` indexes sums and lanes
fn q3_k_crumb_at<K: IntLanes, const L: usize, const DEC: bool>(
    k: K,
    nj: usize,
    p: &[u8],
    dec: &[u8],
    b: usize,
    xq: &LaneBlocks<i8>,
    xs: &LaneBlocks<i32>,
    sumi: &mut [K::I; L],
) {
    let r = K::ROWS;
    let (n, j) = (nj / 4, nj % 4);
    if !DEC {
        // The whole block two ahead, an eighth per crumb.
        k.prefetch_part_ahead(p, Q3_K_ROW_BLOCK * r, nj, 8);
    }
    for half in 0..2 {
        let w = if DEC {
            let mut w = [k.zero_i(); 4];
            for i in 0..4 {
                w[i] = k.load(&dec[4 * r * (4 * (2 * nj + half) + i)..]);
            }
            w
        } else {
            q3_k_weights(k, p, nj, half)
        };
        let s = 8 * n + 2 * j + half;
        let sc = k.i8s_to_i32(&p[2 * r + s * r..]);
        let base = 256 * b + 128 * n + 32 * j + 16 * half;
        for l in 0..L {
            let start = k.splat32(-4 * xs.get(l, 16 * b + s));
            let s0 = k.dot(start, w[0], k.splat32(xq.quad(l, base)));
            let s1 = k.dot(k.zero_i(), w[1], k.splat32(xq.quad(l, base + 4)));
            let s0 = k.dot(s0, w[2], k.splat32(xq.quad(l, base + 8)));
            let s1 = k.dot(s1, w[3], k.splat32(xq.quad(l, base + 12)));
            sumi[l] = k.add32(sumi[l], k.mullo32(k.add32(s0, s1), sc));
        }
    }
}

/// [`q3_k_kernel`] decoding as it goes.
#[inline(always)]
fn q3_k_kernel_plain<K: IntLanes, const L: usize>(k: K, blk: &[u8], x: &Activations, lane: usize, out: &mut [K::Out]) {
    q3_k_kernel::<K, L, false>(k, blk, &[], x, lane, out)
}

/// Decode crumb `NJ` of block `p` into `out` (vectors `8·NJ .. 8·NJ + 8` of the block).
#[inline(always)]
fn q3_k_decode_crumb<K: IntLanes, const NJ: usize>(k: K, p: &[u8], out: &mut [u8]) {
    let vec = 4 * K::ROWS;
    k.prefetch_part_ahead(p, Q3_K_ROW_BLOCK * K::ROWS, NJ, 8);
    for half in 0..2 {
        let w = q3_k_weights(k, p, NJ, half);
        for (i, &v) in w.iter().enumerate() {
            k.store_i(&mut out[vec * (4 * (2 * NJ + half) + i)..], v);
        }
    }
}

/// Decode the `nb` blocks of a Q3_K group once into `dec` (64 vectors of `4 · K::ROWS` bytes
/// per block), for the `DEC` kernels: a call with many lanes then pays the shifts and masks
/// once instead of once per lane tile.
#[inline(always)]
fn q3_k_decode_group<K: IntLanes>(k: K, blk: &[u8], nb: usize, dec: &mut Vec<u8>) {
    let vec = 4 * K::ROWS;
    dec.resize(nb * 64 * vec, 0);
    for (p, out) in blk
        .chunks_exact(Q3_K_ROW_BLOCK * K::ROWS)
        .zip(dec.chunks_exact_mut(64 * vec))
        .take(nb)
    {
        q3_k_decode_crumb::<K, 0>(k, p, out);
        q3_k_decode_crumb::<K, 1>(k, p, out);
        q3_k_decode_crumb::<K, 2>(k, p, out);
        q3_k_decode_crumb::<K, 3>(k, p, out);
        q3_k_decode_crumb::<K, 4>(k, p, out);
        q3_k_decode_crumb::<K, 5>(k, p, out);
        q3_k_decode_crumb::<K, 6>(k, p, out);
        q3_k_decode_crumb::<K, 7>(k, p, out);
    }
}

/// `L` lanes from `lane` against one group of `K::ROWS` Q3_K rows (with `DEC`, its weight
/// vectors read from `dec`, see [`q3_k_decode_group`]).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` indexes the accumulators and the lanes alike
fn q3_k_kernel<K: IntLanes, const L: usize, const DEC: bool>(
    k: K,
    blk: &[u8],
    dec: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [K::Out],
) {
    let r = K::ROWS;
    let bytes = Q3_K_ROW_BLOCK * r;
    let nb = x.cols / 256;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xs = LaneBlocks::new(&x.bsums, lane, L, 16 * nb);
    let mut acc = [k.zero_f(); L];
    for (b, p) in blk.chunks_exact(bytes).enumerate().take(nb) {
        let mut sumi = [k.zero_i(); L];
        if DEC {
            let dec_b = &dec[b * 256 * r..(b + 1) * 256 * r];
            for nj in 0..8 {
                q3_k_crumb_at::<K, L, true>(k, nj, p, dec_b, b, &xq, &xs, &mut sumi);
            }
        } else if L == 1 {
            // One lane is bound by the decode: immediate shifts, no jump table (25 % faster).
            q3_k_crumb::<K, L, 0>(k, p, b, &xq, &xs, &mut sumi);
            q3_k_crumb::<K, L, 1>(k, p, b, &xq, &xs, &mut sumi);
            q3_k_crumb::<K, L, 2>(k, p, b, &xq, &xs, &mut sumi);
            q3_k_crumb::<K, L, 3>(k, p, b, &xq, &xs, &mut sumi);
            q3_k_crumb::<K, L, 4>(k, p, b, &xq, &xs, &mut sumi);
            q3_k_crumb::<K, L, 5>(k, p, b, &xq, &xs, &mut sumi);
            q3_k_crumb::<K, L, 6>(k, p, b, &xq, &xs, &mut sumi);
            q3_k_crumb::<K, L, 7>(k, p, b, &xq, &xs, &mut sumi);
        } else {
            // Several lanes share each decoded vector: the eight crumbs as a loop (fully
            // unrolled, the 4-lane tile ran 30 % slower, its code eight times as long).
            for nj in 0..8 {
                q3_k_crumb_at::<K, L, false>(k, nj, p, &[], b, &xq, &xs, &mut sumi);
            }
        }
        let d = k.f16s(&p[..2 * r]);
        for l in 0..L {
            let t = k.mul_f(k.mul_f(d, k.splat_f(xd.get(l, b))), k.to_f32(sumi[l]));
            acc[l] = k.add_f(acc[l], t);
        }
    }
    for l in 0..L {
        k.store(&mut out[l], acc[l]);
    }
}

/// IQ4_XS's level table as the dot reads it (`signed`: AVX2's saturating dot, module docs).
#[inline(always)]
fn iq4_xs_table<K: IntLanes>(k: K, signed: bool) -> K::I {
    k.table16(&IQ4_NL_VALUES.map(|v| if signed { v as u8 } else { (v as u8) ^ 0x80 }))
}

/// The weight vectors of sub-block `j` of one IQ4_XS block `p`: `w[t]` holds elements
/// `32j + 4t .. +4` of the rows (low nibbles of vector `4j + t` for `t < 4`, high nibbles of
/// vector `4j + t − 4` after), looked up in `table`.
#[inline(always)]
fn iq4_xs_weights<K: IntLanes>(k: K, p: &[u8], j: usize, table: K::I) -> [K::I; 8] {
    let r = K::ROWS;
    let mask = k.splat8(0x0F);
    let mut w = [k.zero_i(); 8];
    for m in 0..4 {
        let v = k.load(&p[10 * r + 4 * r * (4 * j + m)..]);
        w[m] = k.lookup16(table, k.and(v, mask));
        w[4 + m] = k.lookup16(table, k.high_nibbles(v, mask));
    }
    w
}

/// `L` lanes from `lane` against one group of `K::ROWS` IQ4_XS rows. (Decoding a 16-row group
/// once for many lanes, as Q3_K does, made 32 lanes slower here, 165 → 177–200 µs at
/// 576 × 1536: its decode is two or three ops per vector, less than the stores and reloads.)
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` indexes the accumulators and the lanes alike
fn iq4_xs_kernel<K: IntLanes, const L: usize>(k: K, blk: &[u8], x: &Activations, lane: usize, out: &mut [K::Out]) {
    let r = K::ROWS;
    let bytes = IQ4_XS_ROW_BLOCK * r;
    // The levels' sign moves onto the activations where the dot saturates (module docs).
    let signed = K::SATURATING_DOT;
    let nb = x.cols / 256;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xs = LaneBlocks::new(&x.bsums, lane, L, 16 * nb);
    let table = iq4_xs_table(k, signed);
    let mut acc = [k.zero_f(); L];
    for (b, p) in blk.chunks_exact(bytes).enumerate().take(nb) {
        let mut sumi = [k.zero_i(); L];
        for j in 0..8 {
            k.prefetch_part_ahead(p, bytes, j, 8);
            let w = iq4_xs_weights(k, p, j, table);
            let sc = k.i8s_to_i32(&p[2 * r + j * r..]);
            let base = 256 * b + 32 * j;
            if signed {
                let mut mag = [k.zero_i(); 8];
                for t in 0..8 {
                    mag[t] = k.abs8(w[t]);
                }
                for l in 0..L {
                    let mut s0 = k.zero_i();
                    let mut s1 = k.zero_i();
                    for t in (0..8).step_by(2) {
                        let x0 = k.sign8(k.splat32(xq.quad(l, base + 4 * t)), w[t]);
                        let x1 = k.sign8(k.splat32(xq.quad(l, base + 4 * t + 4)), w[t + 1]);
                        s0 = k.dot(s0, mag[t], x0);
                        s1 = k.dot(s1, mag[t + 1], x1);
                    }
                    sumi[l] = k.add32(sumi[l], k.mullo32(k.add32(s0, s1), sc));
                }
            } else {
                for l in 0..L {
                    let sum32 = xs.get(l, 16 * b + 2 * j) + xs.get(l, 16 * b + 2 * j + 1);
                    let mut s0 = k.dot(k.splat32(-128 * sum32), w[0], k.splat32(xq.quad(l, base)));
                    let mut s1 = k.dot(k.zero_i(), w[1], k.splat32(xq.quad(l, base + 4)));
                    for t in (2..8).step_by(2) {
                        s0 = k.dot(s0, w[t], k.splat32(xq.quad(l, base + 4 * t)));
                        s1 = k.dot(s1, w[t + 1], k.splat32(xq.quad(l, base + 4 * t + 4)));
                    }
                    sumi[l] = k.add32(sumi[l], k.mullo32(k.add32(s0, s1), sc));
                }
            }
        }
        let d = k.f16s(&p[..2 * r]);
        for l in 0..L {
            let t = k.mul_f(k.mul_f(d, k.splat_f(xd.get(l, b))), k.to_f32(sumi[l]));
            acc[l] = k.add_f(acc[l], t);
        }
    }
    for l in 0..L {
        k.store(&mut out[l], acc[l]);
    }
}

/// An 8-row tile function for [`lane_entry`]: `$kernel` on the `Ymm<$vnni>` width.
macro_rules! ymm_tile {
    ($tile:ident, $features:literal, $vnni:literal, $kernel:ident) => {
        #[inline]
        #[target_feature(enable = $features)]
        fn $tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
            // SAFETY: this function is compiled with the width's features and reached only
            // through `packed`'s dispatch, after they were detected.
            let k = unsafe { Ymm::<$vnni>::assume() };
            $kernel::<_, L>(k, blk, x, lane, out)
        }
    };
}

/// Lanes from which a 16-row Q3_K call decodes its group once ([`q3_k_decode_group`]) rather
/// than per lane tile (32 lanes at 576 × 1536: 218 → 197 µs).
const Q3_K_DECODE_FROM_LANES: usize = 8;

thread_local! {
    /// The decoded weight vectors of the group a 16-row call is working on.
    static DECODED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The 16-row entry point and tiles of `$kernel`: tiles of 4 lanes, then 2, then 1, the weight
/// stream prefetched as the other 16-row kernels do it (`weight_prefetch_nta`); with
/// `decoded:`, from `$decode_from` lanes the group is decoded once (`$decode`) for
/// `$decoded_kernel`'s tiles.
macro_rules! zmm_group {
    ($entry:ident, $tile:ident, $kernel:ident) => {
        #[doc = "`out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
            zmm_group!(@tiles $tile, blk, x, lane0, out);
        }
        zmm_group!(@tile $tile, $kernel);
    };
    (
        $entry:ident,
        $tile:ident,
        $kernel:ident,
        decoded: $decode_from:expr,
        $decoded_tile:ident,
        $decoded_kernel:ident,
        $decode:ident
    ) => {
        #[doc = "`out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
            let n = out.len();
            if n < $decode_from {
                zmm_group!(@tiles $tile, blk, x, lane0, out);
                return;
            }
            // The buffer is taken out of its cell and put back, not borrowed in a closure (a
            // closure may be compiled without this function's target features).
            let mut dec = DECODED.take();
            let nb = x.cols / 256;
            if weight_prefetch_nta() {
                // SAFETY: this function carries the width's features (see `$tile`).
                $decode(unsafe { Zmm::<true, false>::assume() }, blk, nb, &mut dec);
            } else {
                // SAFETY: as just above.
                $decode(unsafe { Zmm::<false, false>::assume() }, blk, nb, &mut dec);
            }
            let mut l = 0;
            while l < n {
                let m = if n - l >= 4 { 4 } else { (n - l).min(2) };
                let tile = &mut out[l..l + m];
                match m {
                    4 => $decoded_tile::<4>(&dec, blk, x, lane0 + l, tile),
                    2 => $decoded_tile::<2>(&dec, blk, x, lane0 + l, tile),
                    _ => $decoded_tile::<1>(&dec, blk, x, lane0 + l, tile),
                }
                l += m;
            }
            DECODED.set(dec);
        }
        zmm_group!(@tile $tile, $kernel);

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn $decoded_tile<const L: usize>(
            dec: &[u8],
            blk: &[u8],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; WIDE_ROWS]],
        ) {
            // SAFETY: as in `$tile`.
            let k = unsafe { Zmm::<false, false>::assume() };
            $decoded_kernel::<_, L, true>(k, blk, dec, x, lane, out)
        }
    };
    (@tiles $tile:ident, $blk:ident, $x:ident, $lane0:ident, $out:ident) => {
        let n = $out.len();
        let nta = weight_prefetch_nta();
        let mut l = 0;
        while l < n {
            let m = if n - l >= 4 { 4 } else { (n - l).min(2) };
            let tile = &mut $out[l..l + m];
            match (m, nta) {
                (4, true) => $tile::<4, true>($blk, $x, $lane0 + l, tile),
                (4, false) => $tile::<4, false>($blk, $x, $lane0 + l, tile),
                (2, true) => $tile::<2, true>($blk, $x, $lane0 + l, tile),
                (2, false) => $tile::<2, false>($blk, $x, $lane0 + l, tile),
                (_, true) => $tile::<1, true>($blk, $x, $lane0 + l, tile),
                (_, false) => $tile::<1, false>($blk, $x, $lane0 + l, tile),
            }
            l += m;
        }
    };
    (@tile $tile:ident, $kernel:ident) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn $tile<const L: usize, const NTA: bool>(
            blk: &[u8],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; WIDE_ROWS]],
        ) {
            // SAFETY: this function is compiled with the width's features and reached only
            // through `packed`'s dispatch, after they were detected.
            let k = unsafe { Zmm::<NTA, false>::assume() };
            $kernel::<_, L>(k, blk, x, lane, out)
        }
    };
}

ymm_tile!(q3_k_tile, "avx2,fma,f16c", false, q3_k_kernel_plain);
ymm_tile!(
    q3_k_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    true,
    q3_k_kernel_plain
);
ymm_tile!(iq4_xs_tile, "avx2,fma,f16c", false, iq4_xs_kernel);
ymm_tile!(
    iq4_xs_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    true,
    iq4_xs_kernel
);

// Two registers per lane (the block's integer sum and the f32 sum): two lanes per tile on
// AVX2's 16 registers, four with AVX-512VL's 32.
lane_entry!(q3_k_group, q3_k_tile, "avx2,fma,f16c", 2);
lane_entry!(q3_k_group_vnni, q3_k_tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 4);
lane_entry!(iq4_xs_group, iq4_xs_tile, "avx2,fma,f16c", 2);
lane_entry!(
    iq4_xs_group_vnni,
    iq4_xs_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    4
);

zmm_group!(
    q3_k_group_wide,
    q3_k_tile_wide,
    q3_k_kernel_plain,
    decoded: Q3_K_DECODE_FROM_LANES,
    q3_k_tile_decoded,
    q3_k_kernel,
    q3_k_decode_group
);
zmm_group!(iq4_xs_group_wide, iq4_xs_tile_wide, iq4_xs_kernel);
