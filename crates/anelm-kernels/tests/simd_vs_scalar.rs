//! Every SIMD path against the scalar reference on random data. Block integer dots are exact on
//! every path; what may differ is the order of the f32 accumulation across blocks (AVX2 keeps
//! eight partial sums like llama.cpp), so results must agree to within f32 summation error:
//! 1e-5 relative to the magnitude of the sum plus its terms' scale. A wrong block, scale, nibble
//! order or sign is off by whole units and fails.

use anelm_kernels::{Activations, Isa, WeightFormat, matmul_with};

mod common;
use common::Rng;
use common::encode;

fn simd_isas() -> Vec<Isa> {
    [Isa::Avx2, Isa::Avx2Vnni, Isa::Neon]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

#[test]
fn vnni_tiles_equal_avx2_tiles_bit_for_bit() {
    if !(Isa::Avx2.available() && Isa::Avx2Vnni.available()) {
        println!("no AVX-512 VNNI on this CPU: nothing to compare");
        return;
    }
    let mut rng = Rng(11);
    for fmt in [
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q5_0,
    ] {
        let (rows, cols, lanes) = (21, 512, 5);
        let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
        let mut act = Activations::new();
        act.quantize(fmt, &rng.vec(lanes * cols), lanes, cols)
            .expect("activations");
        let (mut a, mut b) = (vec![0.0; lanes * rows], vec![1.0; lanes * rows]);
        matmul_with(Isa::Avx2, fmt, &w, rows, cols, &act, &mut a).expect("avx2");
        matmul_with(Isa::Avx2Vnni, fmt, &w, rows, cols, &act, &mut b).expect("vnni");
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{fmt:?}");
    }
}

#[test]
fn best_isa_is_available() {
    assert!(Isa::best().available());
    assert!(Isa::Scalar.available());
}

#[test]
fn simd_matches_scalar_for_every_format() {
    let isas = simd_isas();
    if isas.is_empty() {
        println!("no SIMD path on this CPU: only the scalar path exists to test");
    }
    let mut rng = Rng(7);
    // 768 columns: three Q8_K super-blocks; also a float shape with a ragged tail (cols % 16 != 0).
    for fmt in WeightFormat::ALL {
        let shapes: &[(usize, usize)] = if !fmt.is_quantized() {
            &[(19, 768), (5, 83)]
        } else {
            &[(19, 768)]
        };
        for &(rows, cols) in shapes {
            let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
            for lanes in [1usize, 2, 5, 65] {
                let x: Vec<f32> = rng.vec(lanes * cols).iter().map(|v| v * 3.0).collect();
                let mut act = Activations::new();
                act.quantize(fmt, &x, lanes, cols).expect("quantize activations");
                let mut want = vec![0.0; lanes * rows];
                matmul_with(Isa::Scalar, fmt, &w, rows, cols, &act, &mut want).expect("scalar");
                for &isa in &isas {
                    let mut got = vec![f32::NAN; lanes * rows];
                    matmul_with(isa, fmt, &w, rows, cols, &act, &mut got).expect("simd");
                    for (i, (g, s)) in got.iter().zip(&want).enumerate() {
                        let tol = 1e-5 * (s.abs() + (cols as f32).sqrt() * 3.0);
                        assert!(
                            (g - s).abs() <= tol,
                            "{} {fmt:?} {rows}x{cols} lanes {lanes} [{i}]: {g} vs scalar {s}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}

/// A float matmul gives each lane the same bits whatever lanes share its batch: the register
/// tiles of several lanes and the row-by-row path of a lone lane (decode) sum every (row, lane)
/// in one order, so a stream's output does not depend on the streams decoding beside it.
#[test]
fn float_matmuls_give_a_lane_the_same_bits_in_any_batch() {
    let mut rng = Rng(13);
    for fmt in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for &(rows, cols) in &[(22usize, 770usize), (9, 83)] {
            let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
            let lanes = 7;
            let x = rng.vec(lanes * cols);
            for isa in simd_isas().into_iter().chain([Isa::Scalar]) {
                let mut act = Activations::new();
                act.quantize(fmt, &x, lanes, cols).expect("activations");
                let mut all = vec![0.0; lanes * rows];
                matmul_with(isa, fmt, &w, rows, cols, &act, &mut all).expect("batch");
                for lane in 0..lanes {
                    let mut one = Activations::new();
                    one.quantize(fmt, &x[lane * cols..(lane + 1) * cols], 1, cols)
                        .expect("one lane");
                    let mut alone = vec![0.0; rows];
                    matmul_with(isa, fmt, &w, rows, cols, &one, &mut alone).expect("alone");
                    let batch = &all[lane * rows..(lane + 1) * rows];
                    assert!(
                        batch.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} {fmt:?} {rows}x{cols} lane {lane}: {batch:?} vs alone {alone:?}",
                        isa.name()
                    );
                }
            }
        }
    }
}
