//! An activation read from a table indexed by the f16 bits of its input, times a second row:
//! ggml computes GELU that way on the CPU (its 65,536-entry f16 table), and Gemma 3's FFN
//! (`GELU(gate) · up`, millions of values per prefill) follows it. With AVX-512 the sixteen
//! inputs of a vector are rounded to f16 together and their table entries gathered, where a
//! scalar loop converts, bounds-checks and loads one value at a time.

/// Entries of a table indexed by f16 bits.
pub const F16_TABLE_LEN: usize = 1 << 16;

/// `out[i] = f(g[i]) · u[i]`, where `f(x)` is 0 for `x ≤ lo`, `x` itself for `x ≥ hi`, and
/// `table[f16 bits of x]` otherwise (round to nearest even). The vector path gives the same bits
/// as the scalar one (a NaN input gives a NaN, whose payload may differ).
///
/// # Panics
/// If `table` does not hold [`F16_TABLE_LEN`] entries or the rows' lengths differ.
pub fn f16_table_mul(table: &[f32], lo: f32, hi: f32, g: &[f32], u: &[f32], out: &mut [f32]) {
    assert_eq!(table.len(), F16_TABLE_LEN, "f16_table_mul: a table of 65,536 entries");
    assert!(
        g.len() == u.len() && g.len() == out.len(),
        "f16_table_mul: rows of different lengths"
    );
    #[cfg(target_arch = "x86_64")]
    let done = if crate::vector::avx512() {
        // SAFETY: AVX-512F/DQ/BW/VL were detected at run time; the lengths and the
        // table size were checked above.
        unsafe { f16_table_mul_avx512(table, lo, hi, g, u, out) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for ((o, &x), &y) in out[done..].iter_mut().zip(&g[done..]).zip(&u[done..]) {
        *o = lookup(table, lo, hi, x) * y;
    }
}

/// `f(x)` of [`f16_table_mul`].
#[inline(always)]
fn lookup(table: &[f32], lo: f32, hi: f32, x: f32) -> f32 {
    if x <= lo {
        0.0
    } else if x >= hi {
        x
    } else {
        table[usize::from(crate::f32_to_f16(x))]
    }
}

/// The whole vectors of [`f16_table_mul`]; returns how many values it did.
///
/// # Safety
/// AVX-512F/BW/VL must be available; `table` must hold [`F16_TABLE_LEN`] entries and
/// `g`, `u`, `out` the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn f16_table_mul_avx512(table: &[f32], lo: f32, hi: f32, g: &[f32], u: &[f32], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let n = g.len() / 16 * 16;
    let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
    for i in (0..n).step_by(16) {
        // SAFETY: `i + 16 ≤ n ≤` each row's length (unaligned loads and stores); every gather
        // index is an f16 bit pattern, below the table's 65,536 entries.
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let idx = _mm512_cvtepu16_epi32(h);
            let t = _mm512_i32gather_ps::<4>(idx, table.as_ptr().cast());
            let above = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi);
            let below = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, lo);
            let f = _mm512_maskz_mov_ps(!below, _mm512_mask_blend_ps(above, t, x));
            let y = _mm512_mul_ps(f, _mm512_loadu_ps(u.as_ptr().add(i)));
            _mm512_storeu_ps(out.as_mut_ptr().add(i), y);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_path_equals_the_scalar_lookup_bit_for_bit() {
        // A table whose entries differ for every index (so a wrong index shows).
        let table: Vec<f32> = (0..F16_TABLE_LEN).map(|i| (i as f32) * 0.5 - 7.0).collect();
        let mut x: Vec<f32> = Vec::new();
        for bits in (0..=u32::MAX).step_by(4_000_037) {
            let v = f32::from_bits(bits);
            if !v.is_nan() {
                x.push(v);
            }
        }
        // The bounds themselves, beside them, and f16 rounding ties.
        x.extend([
            -10.0,
            10.0,
            -10.000001,
            9.999999,
            0.0,
            -0.0,
            1.0 + 1.0 / 2048.0,
            65520.0,
            f32::INFINITY,
        ]);
        x.extend([f32::NEG_INFINITY, 1e-8, -1e-8, 6.1e-5, 2.9802322e-8]);
        let u: Vec<f32> = (0..x.len()).map(|i| if i % 7 == 0 { -1.5 } else { 0.75 }).collect();
        let mut got = vec![0.0; x.len()];
        f16_table_mul(&table, -10.0, 10.0, &x, &u, &mut got);
        for ((&gx, &ux), &o) in x.iter().zip(&u).zip(&got) {
            let want = lookup(&table, -10.0, 10.0, gx) * ux;
            assert_eq!(o.to_bits(), want.to_bits(), "x = {gx:e}");
        }
    }
}
