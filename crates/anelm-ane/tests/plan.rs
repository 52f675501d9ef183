//! The planner's kernel choices for SmolLM2-135M and Qwen3.5-4B / 9B, and the modelled decode
//! rate against the C++ system's measured figures.

use std::time::Instant;

use anelm_ane::{
    AneDevice, AneKernel, ChipProfile, EmuAne, HostOptions, HostRuntime, KernelRole, LayerKind, LinearAttention,
    ModelDims, Plan, PlanError, PlanOptions, ServeLoad, WeightMode, lower,
};

/// Plan a model described by hand: a hybrid's layers as Qwen3.5 lays them out (three DeltaNet
/// layers, then one attention layer), every layer attention otherwise.
fn plan(dims: &ModelDims, opts: &PlanOptions) -> Result<Plan, PlanError> {
    let kinds = if dims.linear_attention.is_some() {
        LayerKind::every_nth(dims.layers, 4, LayerKind::Attention, LayerKind::LinearAttention)
    } else {
        vec![LayerKind::Attention; dims.layers]
    };
    anelm_ane::plan(dims, &kinds, opts)
}

fn smollm2_135m() -> ModelDims {
    ModelDims::dense(576, 1536, 9, 3, 64, 49152, 30)
}

/// `landscape.md` §6: hidden 2560, 32 layers (24 DeltaNet + 8 attention, every 4th), 16/4 heads
/// × 256 with an output gate, inter 9216, DeltaNet 16 key / 32 value heads × 128, vocab 248,320.
fn qwen35_4b() -> ModelDims {
    ModelDims {
        attn_output_gate: true,
        linear_attention: Some(LinearAttention {
            key_heads: 16,
            value_heads: 32,
            key_head_dim: 128,
            value_head_dim: 128,
        }),
        ..ModelDims::dense(2560, 9216, 16, 4, 256, 248_320, 32)
    }
}

/// The same family at 9B: hidden 4096, inter 12288 (untied LM head; the planner does not care).
fn qwen35_9b() -> ModelDims {
    ModelDims {
        hidden: 4096,
        intermediate: 12288,
        ..qwen35_4b()
    }
}

#[test]
fn smollm2_135m_plan() {
    let p = plan(&smollm2_135m(), &PlanOptions::default()).unwrap();
    assert_eq!(p.layers.len(), 30);
    for l in &p.layers {
        assert_eq!(l.kind, LayerKind::Attention);
        let ks: Vec<_> = l.kernels.iter().map(|k| (k.role, k.kernel.clone())).collect();
        assert_eq!(
            ks,
            vec![
                (
                    KernelRole::InputProj,
                    AneKernel::FusedLinear {
                        parts: vec![576, 192, 192],
                        cols: 576
                    }
                ),
                (
                    KernelRole::OutputProjResidual,
                    AneKernel::LinearResidual { rows: 576, cols: 576 }
                ),
                (
                    KernelRole::FfnResidual,
                    AneKernel::SwiGluFfnResidual {
                        hidden: 576,
                        inter: 1536
                    }
                ),
            ]
        );
    }
    assert_eq!(p.lm_head.len(), 1);
    assert_eq!(p.lm_head[0].kernel, AneKernel::LmHeadChunk { rows: 49152, cols: 576 });
    assert_eq!(p.kernel_count(), 91);
    assert_eq!(p.dispatches_per_token(), 91);
    // (960 + 576 + 3·1536)·576·2 B per layer × 30 + 49152·576·2 B.
    assert_eq!(p.weight_bytes_per_token(), 30 * 3_538_944 * 2 + 49152 * 576 * 2);
    assert!(p.layers[0].kernels[0].reason.contains("1 dispatch instead of 3"));
    assert!(p.layers[0].kernels[2].reason.contains("one kernel"));
    assert!(p.lm_head[0].reason.contains("one LM-head kernel"));
    // int8 halves the weight bytes (plus one fp16 scale per row).
    let q = plan(&smollm2_135m(), &PlanOptions::with_weights(WeightMode::INT8_PER_ROW)).unwrap();
    let rows_per_token: u64 = 30 * (960 + 576 + 1536 * 2 + 576) + 49152;
    assert_eq!(
        q.weight_bytes_per_token(),
        p.weight_bytes_per_token() / 2 + rows_per_token * 2
    );
}

#[test]
fn qwen35_4b_plan() {
    let p = plan(&qwen35_4b(), &PlanOptions::default()).unwrap();
    let kinds: Vec<_> = p.layers.iter().map(|l| l.kind).collect();
    assert_eq!(kinds.iter().filter(|k| **k == LayerKind::LinearAttention).count(), 24);
    for (i, k) in kinds.iter().enumerate() {
        assert_eq!(*k == LayerKind::Attention, (i + 1) % 4 == 0, "layer {i}");
    }
    let la = &p.layers[0].kernels;
    assert_eq!(
        la[0].kernel,
        AneKernel::FusedLinear {
            parts: vec![8192, 4096, 32, 32],
            cols: 2560
        }
    );
    assert_eq!(la[1].kernel, AneKernel::LinearResidual { rows: 2560, cols: 4096 });
    let at = &p.layers[3].kernels;
    assert_eq!(
        at[0].kernel,
        AneKernel::FusedLinear {
            parts: vec![8192, 1024, 1024],
            cols: 2560
        }
    );
    assert_eq!(at[1].kernel, AneKernel::LinearResidual { rows: 2560, cols: 4096 });
    // 3·9216·2560·2 B = 141.6 MB ≤ 150 MiB: one FFN kernel (ane-runtime.md §3.5).
    for l in &p.layers {
        assert_eq!(l.kernels.len(), 3);
        assert_eq!(
            l.kernels[2].kernel,
            AneKernel::SwiGluFfnResidual {
                hidden: 2560,
                inter: 9216
            }
        );
    }
    // LM head: 3 × 65,536 + 51,712 rows (ane-runtime.md §3.4).
    let rows: Vec<usize> = p
        .lm_head
        .iter()
        .map(|k| match k.kernel {
            AneKernel::LmHeadChunk { rows, cols: 2560 } => rows,
            ref other => panic!("{other}"),
        })
        .collect();
    assert_eq!(rows, [65536, 65536, 65536, 51712]);
    // 100 kernels, as the C++ system loads for Qwen3.5-4B (ane-runtime.md §2.5).
    assert_eq!(p.kernel_count(), 100);
    assert_eq!(p.dispatches_per_token(), 100);
}

#[test]
fn qwen35_9b_splits_the_ffn_in_two_accumulating_chunks() {
    let p = plan(&qwen35_9b(), &PlanOptions::default()).unwrap();
    for l in &p.layers {
        let roles: Vec<_> = l.kernels.iter().map(|k| k.role).collect();
        assert_eq!(
            roles[2..],
            [
                KernelRole::FfnChunk { index: 0, count: 2 },
                KernelRole::FfnChunk { index: 1, count: 2 }
            ]
        );
        assert_eq!(
            l.kernels[2].kernel,
            AneKernel::FfnChunk {
                hidden: 4096,
                chunk: 6144
            }
        );
    }
    assert!(
        p.layers[0].kernels[2]
            .reason
            .contains("302.0 MB > the 157.3 MB FFN limit")
    );
    // The LM head in 40,960-row chunks: a 65,536-row fp16 chunk (536.9 MB) is over the
    // 335.5 MB kernel limit (DEFAULT_MAX_KERNEL_CONST_BYTES), so 7 chunks instead of 4.
    assert_eq!(p.lm_head.len(), 7);
    assert!(
        p.lm_head[0].reason.contains("40960 rows per chunk (what fits"),
        "{}",
        p.lm_head[0].reason
    );
    assert_eq!(p.dispatches_per_token(), 32 * 4 + 7);
}

#[test]
fn device_limits_shape_the_plan() {
    // A smaller FFN limit splits SmolLM2's 5.3 MB FFN; n grows until it divides 1536.
    let opts = PlanOptions {
        limits: anelm_ane::Limits {
            ffn_max_bytes: 2_000_000,
            ..anelm_ane::Limits::default()
        },
        ..PlanOptions::default()
    };
    let p = plan(&smollm2_135m(), &opts).unwrap();
    assert_eq!(p.layers[0].kernels[2].role, KernelRole::FfnChunk { index: 0, count: 3 });
    // A smaller kernel limit shortens the LM-head chunks.
    let opts = PlanOptions {
        limits: anelm_ane::Limits {
            max_kernel_const_bytes: 20_000_000,
            ..anelm_ane::Limits::default()
        },
        ..PlanOptions::default()
    };
    let p = plan(&smollm2_135m(), &opts).unwrap();
    assert_eq!(p.lm_head.len(), 49152usize.div_ceil(20_000_000 / (2 * 576)));
    assert!(p.lm_head[0].reason.contains("what fits"));
    let bad = ModelDims {
        heads: 0,
        ..smollm2_135m()
    };
    assert!(matches!(
        plan(&bad, &PlanOptions::default()),
        Err(PlanError::BadDims(_))
    ));
}

/// One figure the C++ system measured on an M3 Max (`docs/reference/ane-runtime.md` §11,
/// "Performance facts", README `7c61e4e`: warmed 5-run medians at 500 generated tokens; serve:
/// 8 requests × 100 tokens, 3 repeats, `--sessions 4`, aggregate generation tok/s).
struct Row {
    what: &'static str,
    dims: fn() -> ModelDims,
    mode: WeightMode,
    /// Concurrent streams, or `None` for prefill.
    streams: Option<usize>,
    measured: f64,
    tolerance: f64,
}

const INT8: WeightMode = WeightMode::INT8_PER_ROW;

/// A measured figure printed for context: what, shapes, weights, streams (None: prefill), tok/s.
type ContextRow = (&'static str, fn() -> ModelDims, WeightMode, Option<usize>, f64);

const ROWS: [Row; 9] = [
    // ane-runtime.md §11, README table: Qwen3.5-4B fp16 gen 9.21 tok/s.
    Row {
        what: "4B fp16 single stream",
        dims: qwen35_4b,
        mode: WeightMode::Fp16,
        streams: Some(1),
        measured: 9.21,
        tolerance: 0.15,
    },
    // ane-runtime.md §11, README table: Qwen3.5-4B int8 gen 11.66 tok/s.
    Row {
        what: "4B int8 single stream",
        dims: qwen35_4b,
        mode: INT8,
        streams: Some(1),
        measured: 11.66,
        tolerance: 0.15,
    },
    // ane-runtime.md §11, README table: Qwen3.5-9B fp16 gen 4.27 tok/s.
    Row {
        what: "9B fp16 single stream",
        dims: qwen35_9b,
        mode: WeightMode::Fp16,
        streams: Some(1),
        measured: 4.27,
        tolerance: 0.15,
    },
    // ane-runtime.md §11, README table: Qwen3.5-9B int8 gen 7.01 tok/s.
    Row {
        what: "9B int8 single stream",
        dims: qwen35_9b,
        mode: INT8,
        streams: Some(1),
        measured: 7.01,
        tolerance: 0.15,
    },
    // ane-runtime.md §11, serve table: Qwen3.5-4B int8 c1 10.53 tok/s.
    Row {
        what: "4B int8 serve c1",
        dims: qwen35_4b,
        mode: INT8,
        streams: Some(1),
        measured: 10.53,
        tolerance: 0.15,
    },
    // ane-runtime.md §11, serve table: Qwen3.5-4B int8 c2 15.95 tok/s.
    Row {
        what: "4B int8 serve c2",
        dims: qwen35_4b,
        mode: INT8,
        streams: Some(2),
        measured: 15.95,
        tolerance: 0.20,
    },
    // ane-runtime.md §11, serve table: Qwen3.5-4B int8 c4 28.62 tok/s.
    Row {
        what: "4B int8 serve c4",
        dims: qwen35_4b,
        mode: INT8,
        streams: Some(4),
        measured: 28.62,
        tolerance: 0.20,
    },
    // ane-runtime.md §11, README table: Qwen3.5-4B int8 prompt 30.08 tok/s.
    Row {
        what: "4B int8 prefill",
        dims: qwen35_4b,
        mode: INT8,
        streams: None,
        measured: 30.08,
        tolerance: 0.25,
    },
    // ane-runtime.md §11, README table: Qwen3.5-4B fp16 prompt 18.93 tok/s.
    Row {
        what: "4B fp16 prefill",
        dims: qwen35_4b,
        mode: WeightMode::Fp16,
        streams: None,
        measured: 18.93,
        tolerance: 0.25,
    },
];

/// The plan with host work, modelling the C++ runtime on the m3-max profile, against every row
/// of the C++ system's published table; prints the table, then asserts each tolerance.
#[test]
fn plan_with_host_matches_the_cpp_table() {
    let chip = ChipProfile::m3_max();
    let host = HostOptions {
        runtime: HostRuntime::AneCpp,
        ..HostOptions::default()
    };
    let mut failed = Vec::new();
    eprintln!(
        "| row | modelled tok/s | measured tok/s | error | ANE alone, emulator clock |\n| --- | ---: | ---: | ---: | ---: |"
    );
    for r in &ROWS {
        let p = plan(&(r.dims)(), &PlanOptions::with_weights(r.mode)).unwrap();
        let (modelled, ane_only) = match r.streams {
            Some(n) => (p.decode_tok_s(&chip, &host, n), p.ane_decode_tok_s(&chip, n)),
            None => (p.prefill_tok_s(&chip, &host), f64::NAN),
        };
        let off = modelled / r.measured - 1.0;
        eprintln!(
            "| {} | {modelled:.2} | {:.2} | {:+.1} % | {ane_only:.2} |",
            r.what,
            r.measured,
            off * 100.0
        );
        if off.abs() > r.tolerance {
            failed.push(format!(
                "{}: {modelled:.2} vs {} ({:+.1} %, tolerance ±{:.0} %)",
                r.what,
                r.measured,
                off * 100.0,
                r.tolerance * 100.0
            ));
        }
    }
    // The rest of the published table, printed for context and not asserted (the task's targets
    // are the rows above; see the field guide, 2026-12-06, for why these err as they do).
    let context: [ContextRow; 11] = [
        // ane-runtime.md §11 serve table, Qwen3.5-4B fp16 c1 / c2 / c4.
        ("4B fp16 serve c1", qwen35_4b, WeightMode::Fp16, Some(1), 8.62),
        ("4B fp16 serve c2", qwen35_4b, WeightMode::Fp16, Some(2), 12.59),
        ("4B fp16 serve c4", qwen35_4b, WeightMode::Fp16, Some(4), 20.75),
        // ane-runtime.md §11 serve table, Qwen3.5-9B int8 c1 / c2 / c4.
        ("9B int8 serve c1", qwen35_9b, INT8, Some(1), 5.76),
        ("9B int8 serve c2", qwen35_9b, INT8, Some(2), 5.81),
        ("9B int8 serve c4", qwen35_9b, INT8, Some(4), 6.57),
        // ane-runtime.md §11 serve table, Qwen3.5-9B fp16 c1 / c2 / c4.
        ("9B fp16 serve c1", qwen35_9b, WeightMode::Fp16, Some(1), 3.62),
        ("9B fp16 serve c2", qwen35_9b, WeightMode::Fp16, Some(2), 4.44),
        ("9B fp16 serve c4", qwen35_9b, WeightMode::Fp16, Some(4), 4.89),
        // ane-runtime.md §11 README table, Qwen3.5-9B prompt tok/s.
        ("9B fp16 prefill", qwen35_9b, WeightMode::Fp16, None, 6.49),
        ("9B int8 prefill", qwen35_9b, INT8, None, 7.39),
    ];
    for (what, dims, mode, streams, measured) in context {
        let p = plan(&dims(), &PlanOptions::with_weights(mode)).unwrap();
        let modelled = match streams {
            Some(n) => p.decode_tok_s(&chip, &host, n),
            None => p.prefill_tok_s(&chip, &host),
        };
        eprintln!(
            "| {what} (not asserted) | {modelled:.2} | {measured:.2} | {:+.1} % | |",
            (modelled / measured - 1.0) * 100.0
        );
    }
    for (what, dims, n) in [
        ("4B int8 c1", qwen35_4b as fn() -> ModelDims, 1),
        ("4B int8 c4", qwen35_4b, 4),
    ] {
        let p = plan(&dims(), &PlanOptions::with_weights(INT8)).unwrap();
        eprintln!("{what}:\n{}", p.decode_cost(&chip, &host, n).explain());
    }
    assert!(failed.is_empty(), "outside tolerance:\n{}", failed.join("\n"));
}

/// Without host work the plan is the ANE alone and streams share each dispatch's lanes for free;
/// with it, every stream adds its own work, in either runtime.
#[test]
fn host_work_keeps_streams_from_scaling_for_free() {
    let chip = ChipProfile::by_name("m3-max").unwrap();
    let p = plan(&qwen35_4b(), &PlanOptions::default()).unwrap();
    let one = p.ane_decode_tok_s(&chip, 1);
    assert!((p.ane_decode_tok_s(&chip, 4) / one - 4.0).abs() < 1e-9);
    for runtime in HostRuntime::ALL {
        let host = HostOptions {
            runtime,
            ..HostOptions::default()
        };
        let (h1, h4) = (p.decode_tok_s(&chip, &host, 1), p.decode_tok_s(&chip, &host, 4));
        // anelm's parallel host sections leave less per stream than the C++ serial loop.
        let most = if runtime == HostRuntime::Anelm { 3.95 } else { 3.8 };
        assert!(h4 < most * h1 && h4 > h1, "{runtime}: {h1} → {h4}");
        // Done serially, the same host work costs more and scales worse.
        let serial = HostOptions { serial: true, ..host };
        let (s1, s4) = (p.decode_tok_s(&chip, &serial, 1), p.decode_tok_s(&chip, &serial, 4));
        match runtime {
            HostRuntime::Anelm => assert!(s1 < h1 && s4 / s1 < h4 / h1, "{s1} → {s4} vs {h1} → {h4}"),
            HostRuntime::AneCpp => assert_eq!((s1, s4), (h1, h4)),
        }
    }
}

#[test]
fn report_lists_every_kernel_with_its_reason() {
    let p = plan(&qwen35_4b(), &PlanOptions::default()).unwrap();
    let r = p.report(&ChipProfile::m3_max());
    assert!(r.contains("24 × linear-attention layer (0-2, 4-6"));
    assert!(r.contains("8 × attention layer (3, 7, 11"));
    assert!(r.contains("why: "));
    assert!(r.contains("dispatches/token: 100"));
    assert!(r.contains("decode tok/s:"));
    assert!(r.contains("lm_head 4/4"));
}

fn lower_and_compile(ane: &EmuAne, k: &AneKernel, mode: WeightMode) -> anelm_ane::ProgramHandle {
    let ws: Vec<Vec<f32>> = k
        .weights()
        .iter()
        .map(|w| (0..w.rows * w.cols).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect())
        .collect();
    let refs: Vec<&[f32]> = ws.iter().map(Vec::as_slice).collect();
    let low = lower(k, &refs, mode).unwrap();
    let h = ane.compile(&low.mil_text(), &low.weights).unwrap();
    ane.load(h).unwrap();
    h
}

/// Every distinct kernel of the SmolLM2 plan lowers and compiles on the emulator: the layer
/// kernels in fp16 and int8, the full 49,152-row LM head in fp16.
#[test]
fn smollm2_kernels_lower_and_compile_on_the_emulator() {
    let p = plan(&smollm2_135m(), &PlanOptions::default()).unwrap();
    let ane = EmuAne::default();
    for mode in [WeightMode::Fp16, WeightMode::INT8_PER_ROW] {
        for k in &p.layers[0].kernels {
            let h = lower_and_compile(&ane, &k.kernel, mode);
            ane.release(h).unwrap();
        }
    }
    let h = lower_and_compile(&ane, &p.lm_head[0].kernel, WeightMode::Fp16);
    let sig = ane.signature(h).unwrap();
    assert_eq!(sig.inputs, [(576, 32)]);
    assert_eq!(sig.outputs, [(49152, 32)]);
}

/// Lower, compile and load all 91 kernels of SmolLM2-135M (run with
/// `cargo test --release -p anelm-ane --test plan -- --ignored --nocapture`).
#[test]
#[ignore = "timing run: the whole 135M model, best in release"]
fn smollm2_full_model_compile_time() {
    let p = plan(&smollm2_135m(), &PlanOptions::default()).unwrap();
    for mode in [WeightMode::Fp16, WeightMode::INT8_PER_ROW] {
        let ane = EmuAne::default();
        let start = Instant::now();
        for k in p.kernels() {
            lower_and_compile(&ane, &k.kernel, mode);
        }
        let s = ane.stats();
        assert_eq!(s.loaded, 91);
        eprintln!(
            "SmolLM2-135M {mode}: {} kernels lowered + compiled + loaded in {:?}",
            s.compiles,
            start.elapsed()
        );
    }
}

/// A serve row of the C++ README: model, weights, and aggregate tok/s at c1, c2 and c4.
type ServeRow = (&'static str, fn() -> ModelDims, WeightMode, [f64; 3]);

/// The serve table as `benchmark_parallel.py` measured it: Σ generated tokens ÷ wall time, where
/// the wall also holds each request's inline prefill (`ane-runtime.md` §7.2, §10.1). The prompt
/// length is not published, so it is fitted on one row (4B int8 c1) and must come out as a
/// chat-templated one-sentence prompt (10–60 tokens); with it, every other serve row must fall
/// in the bands (c1 ±15 %, c2 and c4 ±20 %) — the 9B int8 rows, which the decode-only
/// plan put at +17 / +30 / +39 %, included.
#[test]
fn serve_rows_with_each_requests_prefill() {
    let chip = ChipProfile::m3_max();
    let host = HostOptions {
        runtime: HostRuntime::AneCpp,
        ..HostOptions::default()
    };
    let p4_int8 = plan(&qwen35_4b(), &PlanOptions::with_weights(INT8)).unwrap();
    let prompt = ServeLoad::cpp_readme(0.0)
        .fit_prompt_tokens(&p4_int8, &chip, &host, 1, 10.53)
        .expect("decode alone is faster than the measured aggregate");
    eprintln!("fitted prompt length: {prompt:.1} tokens (on 4B int8 serve c1)");
    assert!((10.0..=60.0).contains(&prompt), "prompt {prompt:.1} tokens");
    let load = ServeLoad::cpp_readme(prompt);
    let rows: [ServeRow; 4] = [
        ("4B int8", qwen35_4b, INT8, [10.53, 15.95, 28.62]),
        ("4B fp16", qwen35_4b, WeightMode::Fp16, [8.62, 12.59, 20.75]),
        ("9B int8", qwen35_9b, INT8, [5.76, 5.81, 6.57]),
        ("9B fp16", qwen35_9b, WeightMode::Fp16, [3.62, 4.44, 4.89]),
    ];
    eprintln!("| serve row | decode only | with prefill | measured | error |\n| --- | ---: | ---: | ---: | ---: |");
    let mut failed = Vec::new();
    for (what, dims, mode, measured) in rows {
        let p = plan(&dims(), &PlanOptions::with_weights(mode)).unwrap();
        for (c, m) in [1usize, 2, 4].into_iter().zip(measured) {
            let decode = p.decode_tok_s(&chip, &host, c);
            let served = load.aggregate_tok_s(&p, &chip, &host, c);
            let off = served / m - 1.0;
            eprintln!(
                "| {what} c{c} | {decode:.2} ({:+.1} %) | {served:.2} | {m:.2} | {:+.1} % |",
                (decode / m - 1.0) * 100.0,
                off * 100.0
            );
            let band = if c == 1 { 0.15 } else { 0.20 };
            if off.abs() > band {
                failed.push(format!(
                    "{what} c{c}: {served:.2} vs {m} ({:+.1} %, ±{:.0} %)",
                    off * 100.0,
                    band * 100.0
                ));
            }
        }
    }
    assert!(failed.is_empty(), "outside the bands:\n{}", failed.join("\n"));
}
