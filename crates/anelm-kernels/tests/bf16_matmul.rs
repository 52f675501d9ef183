//! The AVX512_BF16 matmul against its portable reference (the same rounded values summed in
//! f64): shapes with partial panels (rows not a multiple of 32), odd widths (a column paired
//! with zero), widths past the 32-value vector rounding, lane counts around the 12-lane block;
//! the fused form against the matrices one by one; the rounding of the weights and activations
//! against scalar round-to-nearest-even; bad shapes refused. On a CPU without AVX512_BF16 the
//! kernel must refuse to run (and the reference tests still run).

use anelm_kernels::{Bf16Activations, Bf16Matrix, KernelError, round_bf16};

mod common;
use common::Rng;

/// |got − want| within f32 summation error: a few ulps of the sum of |terms|.
fn close(got: f32, want: f32, abs_sum: f64, cols: usize) -> bool {
    let tol = abs_sum * f64::from(f32::EPSILON) * (cols as f64).sqrt() * 4.0 + 1e-30;
    (f64::from(got) - f64::from(want)).abs() <= tol
}

#[test]
fn rounding_is_round_to_nearest_even_and_the_layout_keeps_every_value() {
    let mut rng = Rng(3);
    for (rows, cols) in [(1usize, 1usize), (5, 7), (33, 65), (64, 96)] {
        let w: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 3.7).collect();
        let m = Bf16Matrix::from_f32(&w, rows, cols).expect("pack");
        assert_eq!((m.rows(), m.cols()), (rows, cols));
        for r in 0..rows {
            for k in 0..cols {
                assert_eq!(
                    m.value(r, k),
                    round_bf16(w[r * cols + k]),
                    "w[{r},{k}] of {rows}×{cols}"
                );
            }
        }
        // Activations: the vector rounding (whole groups of 32) and the scalar tail agree with
        // the scalar rounding everywhere.
        let lanes = 3;
        let x: Vec<f32> = rng.vec(lanes * cols).iter().map(|v| v * 1e3).collect();
        let mut a = Bf16Activations::new();
        a.quantize(&x, lanes, cols).expect("quantize");
        for l in 0..lanes {
            for k in 0..cols {
                assert_eq!(a.value(l, k), round_bf16(x[l * cols + k]), "x[{l},{k}] of width {cols}");
            }
        }
    }
}

#[test]
fn bf16_kernel_matches_the_reference() {
    if !Bf16Matrix::available() {
        // The kernel must say so instead of computing anything.
        let m = Bf16Matrix::from_f32(&[1.0; 4], 2, 2).expect("pack");
        let mut a = Bf16Activations::new();
        a.quantize(&[1.0, 2.0], 1, 2).expect("quantize");
        let mut out = [0f32; 2];
        assert!(matches!(
            m.matmul(&a, &mut out),
            Err(KernelError::IsaUnavailable { .. })
        ));
        eprintln!("no AVX512_BF16 on this CPU: only the refusal was tested");
        return;
    }
    let mut rng = Rng(11);
    for (rows, cols) in [
        (1usize, 2usize),
        (32, 32),
        (31, 33),
        (45, 64),
        (384, 384),
        (100, 1537),
        (1536, 384),
    ] {
        let w = rng.vec(rows * cols);
        let m = Bf16Matrix::from_f32(&w, rows, cols).expect("pack");
        for lanes in [1usize, 2, 11, 12, 13, 25, 40] {
            let x = rng.vec(lanes * cols);
            let mut a = Bf16Activations::new();
            a.quantize(&x, lanes, cols).expect("quantize");
            let mut got = vec![f32::NAN; lanes * rows];
            let mut want = vec![0f32; lanes * rows];
            m.matmul(&a, &mut got).expect("matmul");
            m.matmul_reference(&a, &mut want).expect("reference");
            for l in 0..lanes {
                for r in 0..rows {
                    let abs: f64 = (0..cols).map(|k| f64::from(m.value(r, k) * a.value(l, k)).abs()).sum();
                    let (g, e) = (got[l * rows + r], want[l * rows + r]);
                    assert!(
                        close(g, e, abs, cols),
                        "{rows}×{cols}, lane {l}/{lanes}, row {r}: {g} vs {e}"
                    );
                }
            }
            // A lane's result does not depend on the lanes beside it.
            let mut one = Bf16Activations::new();
            one.quantize(&x[(lanes - 1) * cols..], 1, cols).expect("quantize one");
            let mut alone = vec![0f32; rows];
            m.matmul(&one, &mut alone).expect("matmul one");
            assert_eq!(
                alone,
                got[(lanes - 1) * rows..],
                "last lane alone vs in a batch of {lanes}"
            );
        }
    }
}

#[test]
fn fused_matrices_write_side_by_side() {
    if !Bf16Matrix::available() {
        return;
    }
    let mut rng = Rng(19);
    let cols = 77;
    let shapes = [40usize, 32, 7];
    let mats: Vec<Bf16Matrix> = shapes
        .iter()
        .map(|&rows| Bf16Matrix::from_f32(&rng.vec(rows * cols), rows, cols).expect("pack"))
        .collect();
    let lanes = 14;
    let mut a = Bf16Activations::new();
    a.quantize(&rng.vec(lanes * cols), lanes, cols).expect("quantize");
    let total: usize = shapes.iter().sum();
    let mut fused = vec![f32::NAN; lanes * total];
    let refs: Vec<&Bf16Matrix> = mats.iter().collect();
    Bf16Matrix::matmul_concat(&refs, &a, &mut fused).expect("fused");
    let mut offset = 0;
    for m in &mats {
        let mut alone = vec![0f32; lanes * m.rows()];
        m.matmul(&a, &mut alone).expect("alone");
        for l in 0..lanes {
            assert_eq!(
                fused[l * total + offset..l * total + offset + m.rows()],
                alone[l * m.rows()..(l + 1) * m.rows()],
                "lane {l}, matrix at offset {offset}"
            );
        }
        offset += m.rows();
    }
}

#[test]
fn bad_shapes_are_errors() {
    assert!(Bf16Matrix::from_f32(&[0.0; 5], 2, 3).is_err());
    let mut a = Bf16Activations::new();
    assert!(a.quantize(&[0.0; 5], 2, 3).is_err());
    let m = Bf16Matrix::from_f32(&[0.0; 6], 2, 3).expect("pack");
    a.quantize(&[0.0; 8], 2, 4).expect("quantize");
    let mut out = [0f32; 4];
    assert!(m.matmul(&a, &mut out).is_err(), "width mismatch");
    a.quantize(&[0.0; 6], 2, 3).expect("quantize");
    let mut short = [0f32; 3];
    assert!(m.matmul(&a, &mut short).is_err(), "output too short");
}
