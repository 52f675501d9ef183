//! Every format: matmul (activation quantised to the weight's dot format) against the f64
//! reference dot on random data, lanes agreeing exactly, and size errors instead of panics.

use anelm_kernels::{Activations, WeightFormat, dot_reference, matmul};

mod common;
use common::Rng;
use common::encode;

#[test]
fn matmul_matches_reference_dot_for_every_format() {
    let (rows, cols) = (37, 512);
    let mut rng = Rng(42);
    for fmt in WeightFormat::ALL {
        let w = encode(fmt, &rng.vec(rows * cols), rows, cols);
        let rb = fmt.row_bytes(cols).unwrap();
        for lanes in [1usize, 3, 8, 70] {
            let x = rng.vec(lanes * cols);
            let mut act = Activations::new();
            act.quantize(fmt, &x, lanes, cols).unwrap();
            let mut out = vec![0.0; lanes * rows];
            matmul(fmt, &w, rows, cols, &act, &mut out).unwrap();
            for lane in 0..lanes {
                // The same lane alone gives bit-identical results.
                let mut a1 = Activations::new();
                a1.quantize(fmt, &x[lane * cols..(lane + 1) * cols], 1, cols).unwrap();
                let mut o1 = vec![0.0; rows];
                matmul(fmt, &w, rows, cols, &a1, &mut o1).unwrap();
                for r in 0..rows {
                    assert_eq!(
                        o1[r].to_bits(),
                        out[lane * rows + r].to_bits(),
                        "{fmt} lane {lane} row {r}"
                    );
                    let want =
                        dot_reference(fmt, &w[r * rb..(r + 1) * rb], &x[lane * cols..(lane + 1) * cols]).unwrap();
                    // Activation quantisation error: per value at most half a step (amax/254 for
                    // int8; relative 2^-11 / 2^-8 for f16 / bf16); as a random walk over the row,
                    // 6σ of ‖w‖·step/√3.
                    let mut wr = vec![0.0f32; cols];
                    anelm_kernels::dequantize_row(fmt, &w[r * rb..(r + 1) * rb], &mut wr).unwrap();
                    let wnorm = wr.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
                    let step = match fmt {
                        WeightFormat::F32 => 1e-7,
                        WeightFormat::F16 => 2f64.powi(-11),
                        WeightFormat::BF16 => 2f64.powi(-8),
                        _ => 1.0 / 254.0,
                    };
                    let tol = 6.0 * wnorm * step / 3f64.sqrt() + 1e-4;
                    let got = f64::from(out[lane * rows + r]);
                    assert!((got - want).abs() < tol, "{fmt} lanes {lanes} row {r}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn mismatched_sizes_are_errors() {
    let fmt = WeightFormat::Q4_1;
    let mut act = Activations::new();
    assert!(act.quantize(fmt, &[0.0; 31], 1, 31).is_err(), "partial block");
    assert!(act.quantize(fmt, &[0.0; 64], 1, 32).is_err(), "length mismatch");
    act.quantize(fmt, &[0.5; 64], 2, 32).unwrap();
    let w = vec![0u8; 20 * 3];
    let mut out = vec![0.0; 6];
    matmul(fmt, &w, 3, 32, &act, &mut out).unwrap();
    assert!(matmul(fmt, &w[..59], 3, 32, &act, &mut out).is_err(), "short weights");
    assert!(matmul(fmt, &w, 3, 32, &act, &mut out[..5]).is_err(), "short output");
    assert!(
        matmul(WeightFormat::Q4_0, &w[..54], 3, 32, &act, &mut out).is_err(),
        "activations for another format"
    );
}
