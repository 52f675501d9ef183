//! The interleaved (packed) Q4_1 and Q8_0 kernels against the scalar row-major reference, with the same
//! tolerance rule as `simd_vs_scalar.rs`: integer block dots are exact, only the f32 accumulation
//! order differs. Shapes cover several pool tasks, lane counts across the kernel's lane tiles
//! (1, 2, 4 and remainders, more than one call's `MAX_LANES`), and a width that is not a multiple
//! of 256. Packing refuses what it has no kernel for.

use anelm_kernels::{
    Activations, Isa, PACK_ROWS, PackedMatrix, WIDE_GROUP_ROWS, WeightFormat, matmul_with, quantize_row,
    wide_kernel_available,
};

struct Rng(u64);
impl Rng {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

fn encode(fmt: WeightFormat, w: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let rb = fmt.row_bytes(cols).expect("row bytes");
    let mut out = vec![0u8; rb * rows];
    for r in 0..rows {
        quantize_row(fmt, &w[r * cols..(r + 1) * cols], &mut out[r * rb..(r + 1) * rb]).expect("quantize");
    }
    out
}

#[test]
fn packed_kernels_match_the_scalar_reference() {
    let mut rng = Rng(5);
    for fmt in [WeightFormat::Q4_1, WeightFormat::Q8_0] {
        for (rows, cols) in [(8usize, 32usize), (16, 32), (64, 576), (200, 1536), (208, 1536)] {
            let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
            let Some(packed) = PackedMatrix::pack(fmt, &w, rows, cols).expect("pack") else {
                assert!(
                    !Isa::Avx2.available(),
                    "this CPU has AVX2, so {fmt:?} with rows % 8 == 0 must pack"
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
                let mut want = vec![0.0; lanes * rows];
                matmul_with(Isa::Scalar, fmt, &w, rows, cols, &act, &mut want).expect("scalar");
                let mut first: Option<Vec<f32>> = None;
                for p in &layouts {
                    for isa in [Isa::Avx2, Isa::Avx2Vnni].into_iter().filter(|i| i.available()) {
                        let mut got = vec![f32::NAN; lanes * rows];
                        if p.group_rows() == WIDE_GROUP_ROWS && isa == Isa::Avx2 {
                            assert!(p.matmul_with(isa, &act, &mut got).is_err(), "wide layout on AVX2");
                            continue;
                        }
                        p.matmul_with(isa, &act, &mut got).expect("packed");
                        for (i, (g, s)) in got.iter().zip(&want).enumerate() {
                            let tol = 1e-5 * (s.abs() + (cols as f32).sqrt() * 3.0);
                            assert!(
                                (g - s).abs() <= tol,
                                "{} {fmt:?} {rows}x{cols} groups of {} lanes {lanes} [{i}]: {g} vs scalar {s}",
                                isa.name(),
                                p.group_rows()
                            );
                        }
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
    let q40 = encode(WeightFormat::Q4_0, &rng.vec(16 * cols), 16, cols);
    assert!(
        PackedMatrix::pack(WeightFormat::Q4_0, &q40, 16, cols)
            .expect("pack")
            .is_none(),
        "Q4_0"
    );
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
}

/// Pack `rows × cols` random weights, or `None` on a CPU without the packed kernels.
fn packed(fmt: WeightFormat, rng: &mut Rng, rows: usize, cols: usize) -> Option<PackedMatrix> {
    let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
    PackedMatrix::pack(fmt, &w, rows, cols).expect("pack")
}

#[test]
fn fused_loops_give_exactly_the_separate_results() {
    let mut rng = Rng(11);
    for fmt in [WeightFormat::Q4_1, WeightFormat::Q8_0] {
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
            // both block encodings (Q8_1 for Q4_1 weights, Q8_0 for Q8_0), and the same output.
            for next_fmt in [WeightFormat::Q4_1, WeightFormat::Q8_0] {
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
