//! The interleaved (packed) kernels against the row-major ones: Q4_1 and Q8_0 against the scalar
//! reference with the tolerance rule of `simd_vs_scalar.rs` (integer block dots are exact, only
//! the f32 accumulation order differs), Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS, Q5_0 and Q4_0 bit for bit
//! (see their test). Shapes cover several pool tasks, lane counts across the kernel's lane tiles
//! (1, 2, 4 and remainders, more than one call's `MAX_LANES`), and a width that is not a multiple
//! of 256. Packing refuses what it has no kernel for. On aarch64 every format is bit for bit
//! against the scalar reference, on both NEON paths (`smull` and, where the CPU has dotprod,
//! `sdot`); `scripts/test-aarch64.sh` runs these tests there under qemu.

use anelm_kernels::{
    Activations, Isa, PACK_ROWS, PackedMatrix, WIDE_GROUP_ROWS, WeightFormat, matmul_with, wide_kernel_available,
};

mod common;
use common::Rng;
use common::encode;

/// The instruction sets the packed kernels run on, on this CPU.
fn packed_isas() -> Vec<Isa> {
    [Isa::Avx2, Isa::Avx2Vnni, Isa::Neon, Isa::NeonDot]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

/// Whether `isa` runs a layout of `group_rows` (16-row groups need AVX-512 VNNI).
fn runs_layout(isa: Isa, group_rows: usize) -> bool {
    group_rows == PACK_ROWS || isa == Isa::Avx2Vnni
}

/// The NEON packed kernels apply each block's scales in the scalar reference's order without
/// fused multiply-adds, so they match it bit for bit in every format.
fn exact_to_scalar(isa: Isa) -> bool {
    matches!(isa, Isa::Neon | Isa::NeonDot)
}

#[test]
fn packed_kernels_match_the_scalar_reference() {
    let mut rng = Rng(5);
    for fmt in [WeightFormat::Q4_1, WeightFormat::Q8_0] {
        for (rows, cols) in [(8usize, 32usize), (16, 32), (64, 576), (200, 1536), (208, 1536)] {
            let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
            let Some(packed) = PackedMatrix::pack(fmt, &w, rows, cols).expect("pack") else {
                assert!(
                    packed_isas().is_empty(),
                    "this CPU has packed kernels, so {fmt:?} with rows % 8 == 0 must pack"
                );
                println!("no packed kernel on this CPU");
                return;
            };
            assert_eq!(packed.bytes(), w.len(), "packing keeps the size");
            let wide_expected = wide_kernel_available() && rows % WIDE_GROUP_ROWS == 0;
            assert_eq!(
                packed.group_rows(),
                if wide_expected { WIDE_GROUP_ROWS } else { PACK_ROWS },
                "{rows} rows"
            );
            // Both group heights, on every instruction set each runs on.
            let layouts: Vec<PackedMatrix> = [PACK_ROWS, WIDE_GROUP_ROWS]
                .into_iter()
                .filter_map(|g| PackedMatrix::pack_with_group_rows(fmt, &w, rows, cols, g).expect("pack"))
                .collect();
            for lanes in [1usize, 2, 3, 4, 5, 7, 17, 40] {
                let x: Vec<f32> = rng.vec(lanes * cols).iter().map(|v| v * 3.0).collect();
                let mut act = Activations::new();
                act.quantize(fmt, &x, lanes, cols).expect("quantize activations");
                let want = row_major(Isa::Scalar, fmt, &w, rows, cols, &act);
                let mut first: Option<Vec<f32>> = None;
                for p in &layouts {
                    for isa in packed_isas() {
                        let mut got = vec![f32::NAN; lanes * rows];
                        if !runs_layout(isa, p.group_rows()) {
                            assert!(p.matmul_with(isa, &act, &mut got).is_err(), "wide layout on AVX2");
                            continue;
                        }
                        p.matmul_with(isa, &act, &mut got).expect("packed");
                        if exact_to_scalar(isa) {
                            assert!(
                                same_bits(&got, &want),
                                "{} {fmt:?} {rows}x{cols} lanes {lanes}: differs from the scalar reference",
                                isa.name()
                            );
                        }
                        assert_within_tolerance(
                            &got,
                            &want,
                            cols,
                            &format!(
                                "{} {fmt:?} {rows}x{cols} groups of {} lanes {lanes}",
                                isa.name(),
                                p.group_rows()
                            ),
                        );
                        // The same integer block dots and FMAs in the same order: both group
                        // heights and both instruction sets give identical bits.
                        match &first {
                            None => first = Some(got),
                            Some(f) => assert!(
                                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{} {fmt:?} {rows}x{cols} groups of {} lanes {lanes}: differs from the first layout",
                                isa.name(),
                                p.group_rows()
                            ),
                        }
                    }
                }
            }
        }
    }
}

/// `matmul_with` on the row-major weights.
fn row_major(isa: Isa, fmt: WeightFormat, w: &[u8], rows: usize, cols: usize, act: &Activations) -> Vec<f32> {
    let mut out = vec![f32::NAN; act.lanes() * rows];
    matmul_with(isa, fmt, w, rows, cols, act, &mut out).expect("row-major matmul");
    out
}

/// The tolerance rule of `simd_vs_scalar.rs`: integer block dots are exact, only the f32
/// accumulation order may differ from the scalar reference.
fn assert_within_tolerance(got: &[f32], want: &[f32], cols: usize, what: &str) {
    for (i, (g, s)) in got.iter().zip(want).enumerate() {
        let tol = 1e-5 * (s.abs() + (cols as f32).sqrt() * 3.0);
        assert!((g - s).abs() <= tol, "{what} [{i}]: {g} vs scalar {s}");
    }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The K-quant and legacy formats, each layout against its row-major kernels: Q4_K, Q5_K and
/// Q6_K bit for bit against the scalar reference and every SIMD path (their row-major kernels reduce
/// each super-block to exact integers, as the packed ones do); Q4_0 and Q5_0 bit for bit
/// against the row-major SIMD tile (ggml's AVX2 accumulation order, which they keep) and within
/// the usual tolerance of the scalar reference. Column counts at several multiples of the block,
/// rows that are and are not a multiple of 8 (the latter must refuse to pack: the row-major
/// kernels serve them), lane counts across every tile width and more than one call's lanes.
#[test]
fn packed_k_quant_and_legacy_kernels_match_their_row_major_kernels() {
    let mut rng = Rng(17);
    let simd = packed_isas();
    for fmt in [
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::Q5_0,
        WeightFormat::Q4_0,
        WeightFormat::IQ4_NL,
        WeightFormat::Q3_K,
        WeightFormat::IQ4_XS,
    ] {
        let block = fmt.block_elems();
        for (rows, blocks) in [(8usize, 1usize), (16, 2), (24, 3), (64, 5), (200, 4), (13, 2), (100, 1)] {
            let cols = blocks * block;
            let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
            let packed = PackedMatrix::pack(fmt, &w, rows, cols).expect("pack");
            if rows % PACK_ROWS != 0 {
                assert!(packed.is_none(), "{fmt:?} {rows} rows: no group layout, must not pack");
                continue;
            }
            // IQ4_NL has packed kernels on x86-64 only; aarch64 keeps it row-major.
            if cfg!(target_arch = "aarch64") && x86_only(fmt) {
                assert!(
                    packed.is_none(),
                    "the NEON kernels do not read {fmt:?}: it must not pack"
                );
                continue;
            }
            let Some(packed) = packed else {
                assert!(
                    simd.is_empty(),
                    "this CPU has packed kernels, so {fmt:?} with rows % 8 == 0 must pack"
                );
                println!("no packed kernel on this CPU");
                return;
            };
            // 16-row groups where the CPU has the wide kernels and the rows allow.
            let wide_expected = wide_kernel_available() && rows % WIDE_GROUP_ROWS == 0;
            let want_rows = if wide_expected { WIDE_GROUP_ROWS } else { PACK_ROWS };
            assert_eq!(packed.group_rows(), want_rows, "{fmt:?} {rows} rows");
            let layouts: Vec<PackedMatrix> = [PACK_ROWS, WIDE_GROUP_ROWS]
                .into_iter()
                .filter_map(|g| PackedMatrix::pack_with_group_rows(fmt, &w, rows, cols, g).expect("pack"))
                .collect();
            assert_eq!(layouts.len(), if wide_expected { 2 } else { 1 }, "{fmt:?} {rows} rows");
            // Q4_K, Q5_K and Q3_K unpack their 12 bytes of 6-bit scales into 16; IQ4_XS its 6
            // bytes into 8. No layout grows by more than 4 %.
            let unpacked = match fmt {
                WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q3_K => 4,
                WeightFormat::IQ4_XS => 2,
                _ => 0,
            };
            let stored_per_row_block = fmt.block_bytes() + unpacked;
            assert_eq!(packed.bytes(), rows * blocks * stored_per_row_block, "{fmt:?} size");
            assert!(packed.bytes() * 100 <= w.len() * 104, "{fmt:?} grows by more than 4 %");
            for lanes in [1usize, 2, 3, 4, 5, 7, 17, 40] {
                let x: Vec<f32> = rng.vec(lanes * cols).iter().map(|v| v * 3.0).collect();
                let mut act = Activations::new();
                act.quantize(fmt, &x, lanes, cols).expect("quantize activations");
                let scalar = row_major(Isa::Scalar, fmt, &w, rows, cols, &act);
                assert!(scalar.iter().any(|v| *v != 0.0), "a test of zeros proves nothing");
                for p in &layouts {
                    for &isa in &simd {
                        let mut got = vec![f32::NAN; lanes * rows];
                        if !runs_layout(isa, p.group_rows()) {
                            assert!(p.matmul_with(isa, &act, &mut got).is_err(), "wide layout on AVX2");
                            continue;
                        }
                        p.matmul_with(isa, &act, &mut got).expect("packed");
                        let what = format!(
                            "{} {fmt:?} {rows}x{cols} groups of {} lanes {lanes}",
                            isa.name(),
                            p.group_rows()
                        );
                        let tile = row_major(isa, fmt, &w, rows, cols, &act);
                        assert!(
                            same_bits(&got, &tile),
                            "{what}: differs from the row-major {} kernel",
                            isa.name()
                        );
                        if exact_to_scalar(isa) || exact_integer_blocks(fmt) {
                            assert!(same_bits(&got, &scalar), "{what}: differs from the scalar reference");
                        } else {
                            assert_within_tolerance(&got, &scalar, cols, &what);
                        }
                    }
                }
            }
        }
    }
}

/// The formats packed on x86-64 only (the NEON kernels do not read them).
fn x86_only(fmt: WeightFormat) -> bool {
    fmt == WeightFormat::IQ4_NL
}

/// The formats whose packed and row-major kernels alike reduce each block to one exact integer
/// and apply its scales in the same f32 operations: bit for bit on every instruction set.
fn exact_integer_blocks(fmt: WeightFormat) -> bool {
    matches!(
        fmt,
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K | WeightFormat::Q3_K | WeightFormat::IQ4_XS
    )
}

/// `rows × cols` of `fmt` (Q3_K or IQ4_XS) as random bytes — every scale, index, low and high
/// bit pattern the format can hold, not only those its encoder picks — with each block's `d`
/// set to a finite f16 (±2⁻⁷).
fn raw_blocks(fmt: WeightFormat, rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let len = fmt.row_bytes(cols).expect("row bytes") * rows;
    let mut w: Vec<u8> = (0..len).map(|_| ((rng.f() + 1.0) * 128.0) as u8).collect();
    let d_at = if fmt == WeightFormat::Q3_K { 108 } else { 0 };
    for (i, b) in w.chunks_exact_mut(fmt.block_bytes()).enumerate() {
        let d: u16 = if i % 3 == 0 { 0xA000 } else { 0x2000 };
        b[d_at..d_at + 2].copy_from_slice(&d.to_le_bytes());
    }
    w
}

/// Extreme blocks (every weight at the top or bottom of its range, activations at ±127) keep
/// the packed kernels' integer sums exact: a saturating or overflowing path would differ.
#[test]
fn packed_kernels_stay_exact_at_the_ends_of_the_ranges() {
    let mut rng = Rng(23);
    let (rows, cols) = (16usize, 512usize);
    for fmt in [
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::Q5_0,
        WeightFormat::Q4_0,
        WeightFormat::IQ4_NL,
        WeightFormat::Q3_K,
        WeightFormat::IQ4_XS,
    ] {
        // Q3_K and IQ4_XS also as random raw bytes (every scale from −32 to 31, every level).
        let patterns = if matches!(fmt, WeightFormat::Q3_K | WeightFormat::IQ4_XS) {
            5
        } else {
            3
        };
        for pattern in 0..patterns {
            // Weights: alternating ±1 (each block's extremes), all +1, random, or raw bytes.
            let wf: Vec<f32> = match pattern {
                0 => (0..rows * cols)
                    .map(|i| if (i / 3) % 2 == 0 { 1.0 } else { -1.0 })
                    .collect(),
                1 => vec![1.0; rows * cols],
                _ => rng.vec(rows * cols),
            };
            let w = if pattern >= 3 {
                raw_blocks(fmt, &mut rng, rows, cols)
            } else {
                encode(fmt, &wf, rows, cols)
            };
            // 9 lanes: the 4-, 2- and 1-lane tiles, and the many-lane paths (Q3_K's 16-row
            // kernel decodes a group once from 8 lanes).
            let lanes = 9;
            let x: Vec<f32> = (0..lanes * cols).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
            let mut act = Activations::new();
            act.quantize(fmt, &x, lanes, cols).expect("quantize");
            for g in [PACK_ROWS, WIDE_GROUP_ROWS] {
                let Some(packed) = PackedMatrix::pack_with_group_rows(fmt, &w, rows, cols, g).expect("pack") else {
                    continue;
                };
                for isa in packed_isas() {
                    if !runs_layout(isa, g) {
                        continue;
                    }
                    let mut got = vec![f32::NAN; lanes * rows];
                    packed.matmul_with(isa, &act, &mut got).expect("packed");
                    let tile = row_major(isa, fmt, &w, rows, cols, &act);
                    assert!(
                        same_bits(&got, &tile),
                        "{} {fmt:?} groups of {g} pattern {pattern}",
                        isa.name()
                    );
                    if exact_integer_blocks(fmt) {
                        let scalar = row_major(Isa::Scalar, fmt, &w, rows, cols, &act);
                        // (All +1 against alternating ±1 sums to 0; the other patterns do not.)
                        assert!(
                            pattern == 1 || scalar.iter().any(|v| *v != 0.0),
                            "{fmt:?} pattern {pattern}: all zero"
                        );
                        assert!(
                            same_bits(&got, &scalar),
                            "{} {fmt:?} groups of {g} pattern {pattern}: differs from the scalar reference",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}

/// Whatever packs on this CPU has a kernel behind it: every format of `WeightFormat::ALL` that
/// `pack` accepts gives the scalar reference's values (bit for bit on NEON) on every packed ISA.
/// A layout added for one architecture without kernels on another would pack there and fail here.
#[test]
fn every_format_that_packs_runs() {
    let mut rng = Rng(29);
    let (rows, lanes) = (16usize, 5usize);
    for fmt in WeightFormat::ALL {
        let cols = 2 * fmt.block_elems().max(32);
        let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
        let Some(packed) = PackedMatrix::pack(fmt, &w, rows, cols).expect("pack") else {
            continue;
        };
        let mut act = Activations::new();
        act.quantize(fmt, &rng.vec(lanes * cols), lanes, cols)
            .expect("quantize activations");
        let want = row_major(Isa::Scalar, fmt, &w, rows, cols, &act);
        for isa in packed_isas()
            .into_iter()
            .filter(|&i| runs_layout(i, packed.group_rows()))
        {
            let mut got = vec![f32::NAN; lanes * rows];
            packed.matmul_with(isa, &act, &mut got).expect("packed");
            let what = format!("{} {fmt:?}", isa.name());
            assert_within_tolerance(&got, &want, cols, &what);
            if exact_to_scalar(isa) {
                assert!(same_bits(&got, &want), "{what}: differs from the scalar reference");
            }
        }
    }
}

#[test]
fn packing_refuses_what_it_cannot_serve() {
    let mut rng = Rng(9);
    let (rows, cols) = (12, 64);
    let q41 = encode(WeightFormat::Q4_1, &rng.vec(rows * cols), rows, cols);
    assert!(
        PackedMatrix::pack(WeightFormat::Q4_1, &q41, rows, cols)
            .expect("pack")
            .is_none(),
        "12 rows"
    );
    let f16 = encode(WeightFormat::F16, &rng.vec(16 * cols), 16, cols);
    assert!(
        PackedMatrix::pack(WeightFormat::F16, &f16, 16, cols)
            .expect("pack")
            .is_none(),
        "F16"
    );
    // Nor a Q6_K byte count that does not match the shape.
    let q6k = encode(WeightFormat::Q6_K, &rng.vec(8 * 256), 8, 256);
    assert!(PackedMatrix::pack(WeightFormat::Q6_K, &q6k[..q6k.len() - 2], 8, 256).is_err());
    // A byte count that does not match the shape is an error, not a panic.
    assert!(PackedMatrix::pack(WeightFormat::Q4_1, &q41[..q41.len() - 1], 8, cols).is_err());
}

#[test]
fn packed_matmul_checks_its_inputs() {
    let mut rng = Rng(3);
    let (rows, cols) = (16, 64);
    let w = encode(WeightFormat::Q4_1, &rng.vec(rows * cols), rows, cols);
    let Some(packed) = PackedMatrix::pack(WeightFormat::Q4_1, &w, rows, cols).expect("pack") else {
        return;
    };
    let mut act = Activations::new();
    act.quantize(WeightFormat::Q8_0, &rng.vec(cols), 1, cols)
        .expect("quantize");
    assert!(
        packed.matmul(&act, &mut vec![0.0; rows]).is_err(),
        "activations for another format"
    );
    act.quantize(WeightFormat::Q4_1, &rng.vec(cols), 1, cols)
        .expect("quantize");
    assert!(packed.matmul(&act, &mut vec![0.0; rows - 1]).is_err(), "short output");
    // An instruction set this CPU lacks, or that has no kernel for this layout, is an error, never
    // run: on aarch64 without dotprod, `NeonDot`; on x86-64, the NEON paths.
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx2Vnni, Isa::Neon, Isa::NeonDot] {
        let mut out = vec![0.0; rows];
        let served = isa.available() && isa != Isa::Scalar && runs_layout(isa, packed.group_rows());
        assert_eq!(
            packed.matmul_with(isa, &act, &mut out).is_ok(),
            served,
            "{}",
            isa.name()
        );
    }
}

/// Pack `rows × cols` random weights, or `None` on a CPU without the packed kernels.
fn packed(fmt: WeightFormat, rng: &mut Rng, rows: usize, cols: usize) -> Option<PackedMatrix> {
    let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
    PackedMatrix::pack(fmt, &w, rows, cols).expect("pack")
}

#[test]
fn fused_loops_give_exactly_the_separate_results() {
    let mut rng = Rng(11);
    for fmt in [WeightFormat::Q4_1, WeightFormat::Q8_0, WeightFormat::Q5_0] {
        let cols = 576;
        // q/k/v-like: unequal heights, one of them smaller than a task.
        let (Some(q), Some(k), Some(v)) = (
            packed(fmt, &mut rng, 576, cols),
            packed(fmt, &mut rng, 192, cols),
            packed(fmt, &mut rng, 8, cols),
        ) else {
            println!("no packed kernel on this CPU");
            return;
        };
        let (Some(gate), Some(up)) = (packed(fmt, &mut rng, 1536, cols), packed(fmt, &mut rng, 1536, cols)) else {
            return;
        };
        for lanes in [1usize, 3, 20] {
            let mut act = Activations::new();
            act.quantize(fmt, &rng.vec(lanes * cols), lanes, cols)
                .expect("quantize");
            let separate = |m: &PackedMatrix| {
                let mut out = vec![0.0; lanes * m.rows()];
                m.matmul(&act, &mut out).expect("matmul");
                out
            };
            let parts = [&q, &k, &v].map(separate);
            let width = 576 + 192 + 8;
            let mut fused = vec![f32::NAN; lanes * width];
            PackedMatrix::matmul_concat(&[&q, &k, &v], &act, &mut fused).expect("concat");
            for lane in 0..lanes {
                let mut want = Vec::new();
                for (m, p) in [&q, &k, &v].iter().zip(&parts) {
                    want.extend_from_slice(&p[lane * m.rows()..(lane + 1) * m.rows()]);
                }
                let got = &fused[lane * width..(lane + 1) * width];
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{fmt:?} lanes {lanes}"
                );
            }
            let (g, u) = (separate(&gate), separate(&up));
            let silu = |a: f32, b: f32| a / (1.0 + (-a).exp()) * b;
            let mut pair = vec![f32::NAN; lanes * 1536];
            let combine = |a: &mut [f32], b: &[f32]| a.iter_mut().zip(b).for_each(|(a, &b)| *a = silu(*a, b));
            PackedMatrix::matmul_pair(&gate, &up, &act, &mut pair, &combine, None).expect("pair");
            for (i, (p, (g, u))) in pair.iter().zip(g.iter().zip(&u)).enumerate() {
                assert_eq!(p.to_bits(), silu(*g, *u).to_bits(), "{fmt:?} lanes {lanes} [{i}]");
            }
            // Quantised for the next matmul by the tasks: exactly the serial quantisation, for
            // both block encodings (Q8_1 for Q4_1 weights, Q8_0 for Q8_0, Q5_0 and Q4_0 with
            // their 4-value offsets), and the same output.
            for next_fmt in [
                WeightFormat::Q4_1,
                WeightFormat::Q8_0,
                WeightFormat::Q5_0,
                WeightFormat::Q4_0,
                WeightFormat::IQ4_NL,
            ] {
                let mut by_tasks = Activations::new();
                let mut pair_q = vec![f32::NAN; lanes * 1536];
                PackedMatrix::matmul_pair(&gate, &up, &act, &mut pair_q, &combine, Some((next_fmt, &mut by_tasks)))
                    .expect("pair + quantise");
                assert!(pair_q.iter().zip(&pair).all(|(a, b)| a.to_bits() == b.to_bits()));
                let mut serial = Activations::new();
                serial.quantize(next_fmt, &pair, lanes, 1536).expect("quantize");
                assert!(by_tasks == serial, "{fmt:?} → {next_fmt:?} lanes {lanes}");
            }
        }
        // Mismatches are errors: heights of a pair, output width, too many matrices.
        let mut act = Activations::new();
        act.quantize(fmt, &rng.vec(cols), 1, cols).expect("quantize");
        assert!(PackedMatrix::matmul_pair(&q, &k, &act, &mut vec![0.0; 576], &|_, _| (), None).is_err());
        assert!(PackedMatrix::matmul_concat(&[&q, &k], &act, &mut vec![0.0; 576]).is_err());
        assert!(PackedMatrix::matmul_concat(&[], &act, &mut []).is_err());
        assert!(PackedMatrix::matmul_concat(&[&v, &v, &v, &v, &v], &act, &mut [0.0; 40]).is_err());
    }
}

/// A Q4_K_M layer fuses Q6_K and Q4_K projections (llama.cpp gives some layers' qkv or v six
/// bits): one set of Q8_K activations serves both in one loop, with exactly the separate results,
/// whichever K-quant the activations were quantised for; formats that pair with other
/// activations (Q8_0 beside Q4_K) stay an error.
#[test]
fn k_quants_of_different_formats_share_one_fused_loop() {
    let mut rng = Rng(29);
    let cols = 512;
    let (Some(qkv), Some(z), Some(b), Some(q8)) = (
        packed(WeightFormat::Q6_K, &mut rng, 96, cols),
        packed(WeightFormat::Q4_K, &mut rng, 64, cols),
        packed(WeightFormat::Q5_K, &mut rng, 16, cols),
        packed(WeightFormat::Q8_0, &mut rng, 32, cols),
    ) else {
        println!("no packed kernel on this CPU");
        return;
    };
    for quantised_for in [WeightFormat::Q6_K, WeightFormat::Q4_K, WeightFormat::Q5_K] {
        for lanes in [1usize, 5] {
            let x = rng.vec(lanes * cols);
            let mut act = Activations::new();
            act.quantize(quantised_for, &x, lanes, cols).expect("quantize");
            let width = 96 + 64 + 16;
            let mut fused = vec![f32::NAN; lanes * width];
            PackedMatrix::matmul_concat(&[&qkv, &z, &b], &act, &mut fused).expect("mixed K-quant concat");
            for (m, offset) in [(&qkv, 0), (&z, 96), (&b, 160)] {
                // Each matrix alone, with activations quantised for its own format.
                let mut own = Activations::new();
                own.quantize(m.format(), &x, lanes, cols).expect("quantize");
                let mut out = vec![0.0; lanes * m.rows()];
                m.matmul(&own, &mut out).expect("matmul");
                for lane in 0..lanes {
                    let got = &fused[lane * width + offset..lane * width + offset + m.rows()];
                    let want = &out[lane * m.rows()..(lane + 1) * m.rows()];
                    assert!(
                        got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?} in a loop quantised for {quantised_for:?}, lanes {lanes}",
                        m.format()
                    );
                }
            }
        }
    }
    let mut act = Activations::new();
    act.quantize(WeightFormat::Q4_K, &rng.vec(cols), 1, cols)
        .expect("quantize");
    assert!(PackedMatrix::matmul_concat(&[&z, &q8], &act, &mut [0.0; 96]).is_err());
    assert!(!WeightFormat::Q4_K.shares_activations(WeightFormat::Q8_0));
    assert!(!WeightFormat::Q4_0.shares_activations(WeightFormat::Q8_0));
    assert!(WeightFormat::Q6_K.shares_activations(WeightFormat::Q4_K));
}

/// A Q3_K_M-like layer: Q3_K, IQ4_XS, Q4_K and Q6_K projections in one fused loop on one set of
/// Q8_K activations, and a Q3_K gate/up pair, give exactly the separate results.
#[test]
fn q3_k_and_iq4_xs_fuse_with_the_other_k_quants() {
    let mut rng = Rng(31);
    let cols = 512;
    let (Some(a), Some(b), Some(c), Some(d)) = (
        packed(WeightFormat::Q3_K, &mut rng, 64, cols),
        packed(WeightFormat::IQ4_XS, &mut rng, 32, cols),
        packed(WeightFormat::Q4_K, &mut rng, 16, cols),
        packed(WeightFormat::Q6_K, &mut rng, 48, cols),
    ) else {
        println!("no packed kernel on this CPU");
        return;
    };
    let (Some(gate), Some(up)) = (
        packed(WeightFormat::Q3_K, &mut rng, 96, cols),
        packed(WeightFormat::Q3_K, &mut rng, 96, cols),
    ) else {
        return;
    };
    for lanes in [1usize, 6, 19] {
        let mut act = Activations::new();
        act.quantize(WeightFormat::Q3_K, &rng.vec(lanes * cols), lanes, cols)
            .expect("quantize");
        let separate = |m: &PackedMatrix| {
            let mut out = vec![0.0; lanes * m.rows()];
            m.matmul(&act, &mut out).expect("matmul");
            out
        };
        let width = 64 + 32 + 16 + 48;
        let mut fused = vec![f32::NAN; lanes * width];
        PackedMatrix::matmul_concat(&[&a, &b, &c, &d], &act, &mut fused).expect("concat");
        let mut offset = 0;
        for m in [&a, &b, &c, &d] {
            let own = separate(m);
            for lane in 0..lanes {
                let got = &fused[lane * width + offset..lane * width + offset + m.rows()];
                let want = &own[lane * m.rows()..(lane + 1) * m.rows()];
                assert!(same_bits(got, want), "{:?} lanes {lanes}", m.format());
            }
            offset += m.rows();
        }
        let (g, u) = (separate(&gate), separate(&up));
        let mut pair = vec![f32::NAN; lanes * 96];
        let combine = |a: &mut [f32], b: &[f32]| a.iter_mut().zip(b).for_each(|(a, &b)| *a = *a * 0.5 + b);
        PackedMatrix::matmul_pair(&gate, &up, &act, &mut pair, &combine, None).expect("pair");
        for (i, (p, (g, u))) in pair.iter().zip(g.iter().zip(&u)).enumerate() {
            assert_eq!(p.to_bits(), (*g * 0.5 + *u).to_bits(), "Q3_K pair lanes {lanes} [{i}]");
        }
    }
}
