//! Every kernel kind, fp16 and int8, lowered to MIL text + blob bytes, run on the emulated ANE,
//! and compared with a plain f32 CPU reference on random inputs in 1, 7 and 32 lanes.
//!
//! Tolerances (relative L2 error per lane, ‖y_ane − y_ref‖ / ‖y_ref‖), derived from the
//! arithmetic: fp16 has unit roundoff u = 2⁻¹¹ ≈ 4.9e-4. A projection rounds its weights, its
//! input and its output once each, so each product carries ≤ 2u relative error and the sum ≤ u
//! more; with independent errors a dot product's relative error is about √(2·(u/√3)² + (u/√3)²)
//! ≈ 5e-4, and the FFN chains about six such roundings (gate, up, sigmoid, two muls, down), so
//! ≈ 1.2e-3. The bound used, **2e-3**, is the issue's fp16 tolerance and leaves ~1.5× headroom.
//! int8 adds a weight error of up to half a quantisation step, s/2 = max|w_row|/254; for
//! uniform weights that is a relative RMS weight error of (1/254)/√3 ÷ (1/√3) ≈ 3.9e-3 per
//! projection, ≈ 6e-3 through the three FFN projections: bound **1e-2** (the issue's int8 tolerance).
//! Measured here (hidden 128, inter 320, uniform weights): fp16 FFN mean 7e-4 / max 9e-4; int8
//! per-row FFN mean 7.0e-3 / max 8.8e-3, blocks of 16 mean 6.3e-3 / max 7.5e-3. The int8 bound
//! is therefore tight: weights with outliers (amax ≫ rms) need block scales to stay under it.
//!
//! For single-projection kernels we also check a rigorous per-element bound:
//! |Δy| ≤ Σ|Δw_i|·|x_i| + 2u·Σ|w_i|·|x_i| + u·|y| (+ the residual's own rounding u·|r|), with
//! |Δw_i| ≤ u·|w_i| for fp16 and ≤ s/2 + u·|w_i| for int8.

use anelm_ane::{AneDevice, AneKernel, EmuAne, Surface, WeightMode, ffn_chunk_weights, lower, quantize_int8};

const U: f32 = 1.0 / 2048.0;

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        (v as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn matvec(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
        .collect()
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn swiglu(g: &[f32], u: &[f32], d: &[f32], hidden: usize, inter: usize, x: &[f32]) -> Vec<f32> {
    let gate = matvec(g, inter, hidden, x);
    let up = matvec(u, inter, hidden, x);
    let fused: Vec<f32> = gate.iter().zip(&up).map(|(&a, &b)| silu(a) * b).collect();
    matvec(d, hidden, inter, &fused)
}

fn rel_l2(got: &[f32], want: &[f32]) -> f32 {
    let num: f32 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f32 = want.iter().map(|b| b * b).sum();
    (num / den.max(1e-30)).sqrt()
}

fn tolerance(mode: WeightMode) -> f32 {
    match mode {
        WeightMode::Fp16 => 2e-3,
        WeightMode::Int8 { .. } => 1e-2,
    }
}

/// Compile, load and run one lowered kernel; returns the output surface.
fn run(ane: &EmuAne, kernel: &AneKernel, weights: &[&[f32]], mode: WeightMode, inputs: &[Surface]) -> Surface {
    let low = lower(kernel, weights, mode).unwrap();
    let text = low.mil_text();
    let h = ane.compile(&text, &low.weights).unwrap();
    ane.load(h).unwrap();
    let mut out = ane.signature(h).unwrap().output_surfaces();
    let refs: Vec<&Surface> = inputs.iter().collect();
    let t = ane.evaluate(h, &refs, &mut out).unwrap();
    // The emulator charges exactly the bytes the planner models for this kernel.
    assert_eq!(t.bytes as usize, kernel.dispatch_bytes(mode), "{kernel} {mode}");
    assert!(t.ane > std::time::Duration::ZERO);
    ane.unload(h).unwrap();
    out.remove(0)
}

const MODES: [WeightMode; 3] = [
    WeightMode::Fp16,
    WeightMode::Int8 { block: None },
    WeightMode::Int8 { block: Some(16) },
];
const LANE_COUNTS: [usize; 3] = [1, 7, 32];

/// Per-element rigorous bound for y = r + W·x (r optional).
fn check_elementwise_bound(
    w: &[f32],
    rows: usize,
    cols: usize,
    mode: WeightMode,
    x: &[f32],
    r: Option<&[f32]>,
    y: &[f32],
) {
    let dw: Vec<f32> = match mode {
        WeightMode::Fp16 => w.iter().map(|v| U * v.abs()).collect(),
        WeightMode::Int8 { block } => {
            let q = quantize_int8(w, rows, cols, block).unwrap();
            (0..rows * cols)
                .map(|i| (q.dequant(cols, i / cols, i % cols) - w[i]).abs() + U * w[i].abs())
                .collect()
        }
    };
    let reference = matvec(w, rows, cols, x);
    for o in 0..rows {
        let mut bound = 0.0f32;
        for c in 0..cols {
            bound += dw[o * cols + c] * x[c].abs() + 2.0 * U * w[o * cols + c].abs() * x[c].abs();
        }
        let want = reference[o] + r.map_or(0.0, |r| r[o]);
        bound += U * want.abs() + r.map_or(0.0, |r| 2.0 * U * r[o].abs());
        let err = (y[o] - want).abs();
        assert!(
            err <= bound * 1.01 + 1e-7,
            "row {o}: |Δ| = {err} > bound {bound} ({mode})"
        );
    }
}

#[test]
fn linear_and_lm_head_chunk() {
    let ane = EmuAne::default();
    let mut rng = Rng(1);
    let (rows, cols) = (80, 64);
    let w = rng.vec(rows * cols, 1.0 / 8.0);
    for mode in MODES {
        for kernel in [AneKernel::Linear { rows, cols }, AneKernel::LmHeadChunk { rows, cols }] {
            for lanes in LANE_COUNTS {
                let xs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(cols, 1.0)).collect();
                let refs: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
                let x = Surface::pack(cols, &refs).unwrap();
                let y = run(&ane, &kernel, &[&w], mode, &[x]);
                for (lane, xv) in xs.iter().enumerate() {
                    let got = y.read_lane(lane).unwrap();
                    let want = matvec(&w, rows, cols, xv);
                    let e = rel_l2(&got, &want);
                    assert!(e <= tolerance(mode), "{kernel} {mode} lane {lane}: rel err {e}");
                    // The bound is in terms of the fp16 input actually fed.
                    let xq: Vec<f32> = xv.iter().map(|&v| anelm_ane::f32_to_fp16(v).to_f32()).collect();
                    check_elementwise_bound(&w, rows, cols, mode, &xq, None, &got);
                }
                for lane in lanes..32 {
                    assert!(y.read_lane(lane).unwrap().iter().all(|&v| v == 0.0));
                }
            }
        }
    }
}

#[test]
fn fused_linear() {
    let ane = EmuAne::default();
    let mut rng = Rng(2);
    let (parts, cols) = (vec![64, 32, 32], 96);
    let ws: Vec<Vec<f32>> = parts.iter().map(|&r| rng.vec(r * cols, 0.1)).collect();
    let wrefs: Vec<&[f32]> = ws.iter().map(Vec::as_slice).collect();
    let kernel = AneKernel::FusedLinear {
        parts: parts.clone(),
        cols,
    };
    for mode in MODES {
        for lanes in LANE_COUNTS {
            let xs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(cols, 1.0)).collect();
            let refs: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            let y = run(&ane, &kernel, &wrefs, mode, &[Surface::pack(cols, &refs).unwrap()]);
            assert_eq!(y.channels(), 128);
            for (lane, xv) in xs.iter().enumerate() {
                let got = y.read_lane(lane).unwrap();
                let want: Vec<f32> = ws
                    .iter()
                    .zip(&parts)
                    .flat_map(|(w, &r)| matvec(w, r, cols, xv))
                    .collect();
                let e = rel_l2(&got, &want);
                assert!(e <= tolerance(mode), "{mode} lanes {lanes} lane {lane}: rel err {e}");
            }
        }
    }
}

#[test]
fn linear_residual() {
    let ane = EmuAne::default();
    let mut rng = Rng(3);
    let (rows, cols) = (64, 96);
    let w = rng.vec(rows * cols, 0.1);
    let kernel = AneKernel::LinearResidual { rows, cols };
    for mode in MODES {
        for lanes in LANE_COUNTS {
            let xs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(cols, 1.0)).collect();
            let rs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(rows, 1.0)).collect();
            let xr: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            let rr: Vec<&[f32]> = rs.iter().map(Vec::as_slice).collect();
            let inputs = [Surface::pack(cols, &xr).unwrap(), Surface::pack(rows, &rr).unwrap()];
            let y = run(&ane, &kernel, &[&w], mode, &inputs);
            for lane in 0..lanes {
                let got = y.read_lane(lane).unwrap();
                let want: Vec<f32> = matvec(&w, rows, cols, &xs[lane])
                    .iter()
                    .zip(&rs[lane])
                    .map(|(a, b)| a + b)
                    .collect();
                let e = rel_l2(&got, &want);
                assert!(e <= tolerance(mode), "{mode} lane {lane}: rel err {e}");
                let q = |v: &[f32]| {
                    v.iter()
                        .map(|&v| anelm_ane::f32_to_fp16(v).to_f32())
                        .collect::<Vec<_>>()
                };
                // Bound for add(r, conv): the conv output's own bound plus the add's rounding.
                let (xq, rq) = (q(&xs[lane]), q(&rs[lane]));
                check_elementwise_bound(&w, rows, cols, mode, &xq, Some(&rq), &got);
            }
        }
    }
}

fn ffn_case(mode: WeightMode, residual: bool, seed: u64) {
    let ane = EmuAne::default();
    let mut rng = Rng(seed);
    let (hidden, inter) = (128, 320);
    let g = rng.vec(inter * hidden, 0.25);
    let u = rng.vec(inter * hidden, 0.25);
    let d = rng.vec(hidden * inter, 0.15);
    let kernel = if residual {
        AneKernel::SwiGluFfnResidual { hidden, inter }
    } else {
        AneKernel::SwiGluFfn { hidden, inter }
    };
    for lanes in LANE_COUNTS {
        let xs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(hidden, 1.0)).collect();
        let rs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(hidden, 1.0)).collect();
        let xr: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
        let rr: Vec<&[f32]> = rs.iter().map(Vec::as_slice).collect();
        let mut inputs = vec![Surface::pack(hidden, &xr).unwrap()];
        if residual {
            inputs.push(Surface::pack(hidden, &rr).unwrap());
        }
        let y = run(&ane, &kernel, &[&g, &u, &d], mode, &inputs);
        for lane in 0..lanes {
            let got = y.read_lane(lane).unwrap();
            let mut want = swiglu(&g, &u, &d, hidden, inter, &xs[lane]);
            if residual {
                want.iter_mut().zip(&rs[lane]).for_each(|(a, b)| *a += b);
            }
            let e = rel_l2(&got, &want);
            assert!(
                e <= tolerance(mode),
                "{kernel} {mode} lanes {lanes} lane {lane}: rel err {e}"
            );
        }
    }
}

#[test]
fn swiglu_ffn() {
    for (i, mode) in MODES.into_iter().enumerate() {
        ffn_case(mode, false, 10 + i as u64);
    }
}

#[test]
fn swiglu_ffn_residual() {
    for (i, mode) in MODES.into_iter().enumerate() {
        ffn_case(mode, true, 20 + i as u64);
    }
}

/// A split FFN: chunk outputs feed the next chunk's accumulator half; chunk 0 gets the residual.
#[test]
fn ffn_chunks_accumulate_to_the_whole_ffn_plus_residual() {
    let ane = EmuAne::default();
    let mut rng = Rng(30);
    let (hidden, inter, n) = (64, 192, 3);
    let chunk = inter / n;
    let g = rng.vec(inter * hidden, 0.25);
    let u = rng.vec(inter * hidden, 0.25);
    let d = rng.vec(hidden * inter, 0.15);
    for mode in MODES {
        let mut programs = Vec::new();
        for c in 0..n {
            let cw = ffn_chunk_weights(&g, &u, &d, hidden, inter, c, chunk).unwrap();
            let low = lower(
                &AneKernel::FfnChunk { hidden, chunk },
                &[&cw.gate, &cw.up, &cw.down],
                mode,
            )
            .unwrap();
            let h = ane.compile(&low.mil_text(), &low.weights).unwrap();
            ane.load(h).unwrap();
            programs.push(h);
        }
        for lanes in LANE_COUNTS {
            let xs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(hidden, 1.0)).collect();
            let rs: Vec<Vec<f32>> = (0..lanes).map(|_| rng.vec(hidden, 1.0)).collect();
            let xr: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            let rr: Vec<&[f32]> = rs.iter().map(Vec::as_slice).collect();
            let x = Surface::pack(hidden, &xr).unwrap();
            let mut acc = Surface::pack(hidden, &rr).unwrap();
            for &h in &programs {
                let mut packed = Surface::new(2 * hidden);
                packed.copy_channels_from(0, &x).unwrap();
                packed.copy_channels_from(hidden, &acc).unwrap();
                let mut out = [Surface::new(hidden)];
                ane.evaluate(h, &[&packed], &mut out).unwrap();
                acc = out[0].clone();
            }
            for lane in 0..lanes {
                let got = acc.read_lane(lane).unwrap();
                let mut want = swiglu(&g, &u, &d, hidden, inter, &xs[lane]);
                want.iter_mut().zip(&rs[lane]).for_each(|(a, b)| *a += b);
                let e = rel_l2(&got, &want);
                assert!(e <= tolerance(mode), "{mode} lanes {lanes} lane {lane}: rel err {e}");
            }
        }
    }
}

#[test]
fn dispatches_are_charged_on_the_virtual_clock() {
    let ane = EmuAne::default();
    let (rows, cols) = (256, 128);
    let w = vec![0.01f32; rows * cols];
    let x = Surface::pack(cols, &[&vec![1.0; cols]]).unwrap();
    let y = run(&ane, &AneKernel::Linear { rows, cols }, &[&w], WeightMode::Fp16, &[x]);
    assert!((y.get(0, 0).unwrap() - 1.28).abs() < 0.01);
    let s = ane.stats();
    let bytes = (rows * cols * 2 + (rows + cols) * 32 * 2) as u64;
    assert_eq!(s.dispatches, 1);
    assert_eq!(s.bytes, bytes);
    let chip = ane.config().chip;
    let want = 119e-6 + bytes as f64 / 78e9;
    assert!((s.ane_time.as_secs_f64() - want).abs() < 1e-9, "{:?}", s.ane_time);
    assert_eq!(chip.name, "m3-max");
    assert_eq!(s.compiles, 1);
    assert_eq!(s.loaded, 0);
}

#[test]
fn golden_text_linear_fp16_and_int8() {
    let w = [0.5f32, -1.0, 2.0, 0.25];
    let fp16 = lower(&AneKernel::Linear { rows: 2, cols: 2 }, &[&w], WeightMode::Fp16)
        .unwrap()
        .mil_text();
    let expected = r#"program(1.0)
[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{"coremlc-version", "3505.4.1"}})]
{
    func main<ios16>(tensor<fp16, [1, 2, 1, 32]> x) {
        tensor<fp16, [2, 2, 1, 1]> weight = const()[name = tensor<string, []>("weight"), val = tensor<fp16, [2, 2, 1, 1]>(BLOBFILE(path = tensor<string, []>("@model_path/weights/weight.bin"), offset = tensor<uint64, []>(64)))];
        tensor<string, []> pt = const()[name = tensor<string, []>("pt"), val = tensor<string, []>("valid")];
        tensor<int32, [2]> st = const()[name = tensor<string, []>("st"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, [4]> pd = const()[name = tensor<string, []>("pd"), val = tensor<int32, [4]>([0, 0, 0, 0])];
        tensor<int32, [2]> dl = const()[name = tensor<string, []>("dl"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, []> gr = const()[name = tensor<string, []>("gr"), val = tensor<int32, []>(1)];
        tensor<fp16, [1, 2, 1, 32]> y = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = weight, x = x)[name = tensor<string, []>("y")];
    } -> (y);
}
"#;
    assert_eq!(fp16, expected);
    let low = lower(&AneKernel::Linear { rows: 2, cols: 2 }, &[&w], WeightMode::INT8_PER_ROW).unwrap();
    let int8 = low.mil_text();
    assert!(int8.contains("func main<ios18>"));
    assert!(int8.contains(
        "tensor<fp16, [2, 2, 1, 1]> weight = constexpr_blockwise_shift_scale(data = wq, scale = ws)[name = tensor<string, []>(\"weight\")];"
    ));
    assert!(int8.contains("tensor<fp16, [2, 1, 1, 1]> ws = const()"));
    let names: Vec<&str> = low.weights.iter().map(|(p, _)| p).collect();
    assert_eq!(names, ["@model_path/weights/wq.bin", "@model_path/weights/ws.bin"]);
}
