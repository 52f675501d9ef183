//! The interleaved layouts of [`crate::packed::PackedMatrix`], format by format: how one block of
//! each of a group's rows (`R` rows, 8 or 16) is rearranged so a 32-byte (or 64-byte) load holds
//! the same four bytes of every row, for `vpdpbusd` against a broadcast 4-byte activation group.
//! Only byte moves and bit moves: nothing is rounded, so a packed matrix holds exactly the stored
//! weights. The kernels that read each layout are in `packed_x86*.rs`.
//!
//! Per (group, block), `R` rows (offsets in bytes; "4 bytes of each row, row after row" is one
//! `4R`-byte vector):
//! - **Q4_1** (`20R`): `R` f16 scales, `R` f16 minimums, then for `k < 4` bytes `4k .. 4k+4` of
//!   each row's 16 quant bytes.
//! - **Q8_0** (`34R`): `R` f16 scales, then for `k < 8` bytes `4k .. 4k+4` of each row's 32
//!   quants; the 16-row layout stores them as `w + 128` (`w ^ 0x80`, unsigned).
//! - **Q4_0** (`18R`): `R` f16 scales, then the quant bytes as Q4_1's. **IQ4_NL** the same (its
//!   nibbles are table indices, looked up by the kernel; x86 only).
//! - **Q5_0** (`22R`): `R` f16 scales; `4R` bytes of fifth bits, byte `4r + i` holding in bit `k`
//!   the fifth bit of element `4k + i` of row `r` (the element that vector `k` holds at that
//!   byte); then the quant bytes as Q4_1's.
//! - **Q4_K** (`148R`, 4 bytes per row more than stored: its 6-bit scales unpacked): `R` f16
//!   `d`, `R` f16 `dmin`; the 8 sub-block scales as bytes, sub-block after sub-block (`R` bytes
//!   each); the 8 minimums in pairs, pair `p` holding `(m[2p], m[2p+1])` of each row in turn (so
//!   one `madd` applies a pair of minimums to a pair of activation sums); then for chunk `c < 4`
//!   and `k < 8` bytes `32c + 4k .. +4` of each row's 128 quant bytes (low nibbles are
//!   sub-block `2c`, high nibbles sub-block `2c + 1`).
//! - **Q5_K** (`180R`): Q4_K's layout (its nibbles taken from bytes 48.. of the block), then
//!   for `k < 8` bytes `4k .. +4` of each row's 32 `qh` bytes (bit `2c + h` of a byte: the fifth
//!   bit of the value vector `k` of chunk `c` holds there, low nibble for `h = 0`, high for 1).
//! - **Q6_K** (`210R`, as stored): `R` f16 `d`; the 16 int8 sub-block scales, sub-block after
//!   sub-block; then `ql` for half `h < 2`, part `t < 2`, `k < 8`: bytes `64h + 32t + 4k .. +4`
//!   of each row; then `qh` for `h < 2`, `k < 8`: bytes `32h + 4k .. +4` of each row.
//! - **Q3_K** (`114R`, 4 bytes per row more than stored: its 6-bit scales unpacked):
//!   `R` f16 `d`; the 16 sub-block scales as signed bytes (`−32 ..= 31`, the offset of 32
//!   already taken off), sub-block after sub-block (`R` bytes each); then `qs` for `n < 2`,
//!   `k < 8`: bytes `32n + 4k .. +4` of each row (vector `8n + k`; bits `2j, 2j + 1` of a byte
//!   are the low two bits of element `128n + 32j + 4k + i`); then `hmask` for `k < 8`: bytes
//!   `4k .. +4` of each row (bit `4n + j` of a byte: the high bit of that same element). Both
//!   as stored, so the kernel forms `q + 4 = low | high << 2` (`0 ..= 7`, unsigned).
//! - **IQ4_XS** (`138R`, 2 bytes per row more than stored): `R` f16 `d`; the 8
//!   sub-block scales as signed bytes (`−32 ..= 31`), sub-block after sub-block; then for
//!   `k < 32` bytes `4k .. +4` of each row's 128 index bytes (vector `4j + m` holds in its low
//!   nibbles elements `32j + 4m ..+4`, in its high nibbles `32j + 16 + 4m ..+4`: IQ4_NL's
//!   order within each 32-element sub-block `j`).

use crate::format::WeightFormat;

/// Bytes of one row's Q3_K block in the packed layout (110 stored, its 12 bytes of scales as 16).
pub(crate) const Q3_K_ROW_BLOCK: usize = 114;

/// Bytes of one row's IQ4_XS block in the packed layout (136 stored, its scales as 8 bytes).
pub(crate) const IQ4_XS_ROW_BLOCK: usize = 138;

/// Bytes of one row's block in the packed layout, for the formats that pack; `None` otherwise.
pub(crate) fn row_block_bytes(fmt: WeightFormat) -> Option<usize> {
    match fmt {
        WeightFormat::Q4_1 => Some(20),
        WeightFormat::Q8_0 => Some(34),
        WeightFormat::Q4_0 => Some(18),
        // Only the x86 kernels read it (its table lookup is in `packed_x86_ggml_order.rs`).
        WeightFormat::IQ4_NL if cfg!(target_arch = "x86_64") => Some(18),
        WeightFormat::Q5_0 => Some(22),
        WeightFormat::Q4_K => Some(148),
        WeightFormat::Q5_K => Some(180),
        WeightFormat::Q6_K => Some(210),
        WeightFormat::Q3_K => Some(Q3_K_ROW_BLOCK),
        WeightFormat::IQ4_XS => Some(IQ4_XS_ROW_BLOCK),
        _ => None,
    }
}

/// Rearrange block `b` of the `R = dst.len() / row_block_bytes` rows `rows` (each a whole stored
/// row) into `dst`, one (group, block) of the layout above. `offset_q8` stores Q8_0 quants as
/// `w + 128` (the 16-row kernels' form).
pub(crate) fn pack_block(fmt: WeightFormat, rows: &[&[u8]], b: usize, dst: &mut [u8], offset_q8: bool) {
    let r_n = rows.len();
    let bb = fmt.block_bytes();
    let src = |r: usize| &rows[r][b * bb..(b + 1) * bb];
    // `count` consecutive 4-byte groups of each row's block from byte `from`, as vectors
    // `0 .. count` at `to` (each vector 4 bytes of every row, row after row), XOR `flip`.
    let interleave = |dst: &mut [u8], to: usize, from: usize, count: usize, flip: u8| {
        for r in 0..r_n {
            let s = &src(r)[from..from + 4 * count];
            for (k, q) in s.chunks_exact(4).enumerate() {
                let at = to + 4 * r_n * k + 4 * r;
                for (d, &v) in dst[at..at + 4].iter_mut().zip(q) {
                    *d = v ^ flip;
                }
            }
        }
    };
    // The f16 `d` at byte `at` of every row, as the group's first `2R` bytes (or at `to`).
    let halves = |dst: &mut [u8], to: usize, at: usize| {
        for r in 0..r_n {
            dst[to + 2 * r..to + 2 * r + 2].copy_from_slice(&src(r)[at..at + 2]);
        }
    };
    match fmt {
        WeightFormat::Q4_1 => {
            halves(dst, 0, 0);
            halves(dst, 2 * r_n, 2);
            interleave(dst, 4 * r_n, 4, 4, 0);
        }
        WeightFormat::Q8_0 => {
            halves(dst, 0, 0);
            let flip = if offset_q8 { 0x80 } else { 0 };
            interleave(dst, 2 * r_n, 2, 8, flip);
        }
        WeightFormat::Q4_0 | WeightFormat::IQ4_NL => {
            halves(dst, 0, 0);
            interleave(dst, 2 * r_n, 2, 4, 0);
        }
        WeightFormat::Q5_0 => {
            halves(dst, 0, 0);
            for r in 0..r_n {
                let s = src(r);
                let qh = u32::from_le_bytes([s[2], s[3], s[4], s[5]]);
                for i in 0..4 {
                    let byte = (0..8).fold(0u8, |acc, k| acc | ((((qh >> (4 * k + i)) & 1) as u8) << k));
                    dst[2 * r_n + 4 * r + i] = byte;
                }
            }
            interleave(dst, 6 * r_n, 6, 4, 0);
        }
        WeightFormat::Q4_K | WeightFormat::Q5_K => {
            halves(dst, 0, 0);
            halves(dst, 2 * r_n, 2);
            for r in 0..r_n {
                let s = src(r);
                let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
                for j in 0..8 {
                    (sc[j], mn[j]) = crate::blocks::scale_min_k4(j, &s[4..16]);
                    dst[4 * r_n + j * r_n + r] = sc[j];
                }
                for p in 0..4 {
                    let at = 12 * r_n + 2 * r_n * p + 2 * r;
                    dst[at] = mn[2 * p];
                    dst[at + 1] = mn[2 * p + 1];
                }
            }
            // Q5_K's nibbles follow its 32 `qh` bytes; those go after the Q4_K layout.
            let qs = if fmt == WeightFormat::Q5_K { 48 } else { 16 };
            // Vector `8c + k` holds bytes `32c + 4k .. +4`: 32 consecutive groups.
            interleave(dst, 20 * r_n, qs, 32, 0);
            if fmt == WeightFormat::Q5_K {
                interleave(dst, 148 * r_n, 16, 8, 0);
            }
        }
        WeightFormat::Q6_K => {
            halves(dst, 0, 208);
            for r in 0..r_n {
                for s in 0..16 {
                    dst[2 * r_n + s * r_n + r] = src(r)[192 + s];
                }
            }
            // `ql` vector `(2h + t)·8 + k` holds bytes `64h + 32t + 4k`: 32 consecutive groups;
            // `qh` vector `8h + k` bytes `128 + 32h + 4k`: 16.
            interleave(dst, 18 * r_n, 0, 32, 0);
            interleave(dst, 146 * r_n, 128, 16, 0);
        }
        WeightFormat::Q3_K => {
            halves(dst, 0, 108);
            for r in 0..r_n {
                for (s, &v) in crate::blocks::q3_k_scales(src(r)).iter().enumerate() {
                    dst[2 * r_n + s * r_n + r] = v as u8;
                }
            }
            // `qs` vector `8n + k` holds bytes `32 + 32n + 4k`: 16 consecutive groups; `hmask`
            // vector `k` bytes `4k`: 8.
            interleave(dst, 18 * r_n, 32, 16, 0);
            interleave(dst, 82 * r_n, 0, 8, 0);
        }
        WeightFormat::IQ4_XS => {
            halves(dst, 0, 0);
            for r in 0..r_n {
                for (j, &v) in crate::blocks::iq4_xs_scales(src(r)).iter().enumerate() {
                    dst[2 * r_n + j * r_n + r] = v as u8;
                }
            }
            interleave(dst, 10 * r_n, 8, 32, 0);
        }
        // `pack_in_groups` calls this only for formats with a `row_block_bytes`.
        _ => debug_assert!(false, "{fmt:?} has no packed layout"),
    }
}
