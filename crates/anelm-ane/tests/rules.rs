//! One program per hardware rule: each is refused by the emulated ANE with that rule's error.

use std::collections::HashSet;

use anelm_ane::{
    AneDevice, AneError, AneKernel, ChipProfile, EmuAne, EmuConfig, MAX_AXIS, Rule, Surface, WeightMode, lower,
};
use anelm_mil::{WeightFiles, write_fp16_blob};

const HEAD: &str = "program(1.0)\n[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{\"coremlc-version\", \"3505.4.1\"}})]\n{\n";

/// A hand-written program: `sig` is the parameter list, `body` the statements, `out` the outputs.
fn program(opset: &str, sig: &str, body: &str, out: &str) -> String {
    format!("{HEAD}    func main<{opset}>({sig}) {{\n{body}    }} -> ({out});\n}}\n")
}

fn s(name: &str) -> String {
    format!("[name = tensor<string, []>(\"{name}\")]")
}

/// The shared conv parameter consts.
fn conv_params(strides: &str, dilations: &str) -> String {
    let c = |ty: &str, name: &str, val: &str| {
        format!("        {ty} {name} = const()[name = tensor<string, []>(\"{name}\"), val = {ty}({val})];\n")
    };
    [
        c("tensor<string, []>", "pt", "\"valid\""),
        c("tensor<int32, [2]>", "st", strides),
        c("tensor<int32, [4]>", "pd", "[0, 0, 0, 0]"),
        c("tensor<int32, [2]>", "dl", dilations),
        c("tensor<int32, []>", "gr", "1"),
    ]
    .concat()
}

fn linear(rows: usize, cols: usize) -> (String, WeightFiles) {
    let w: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 * 0.01).collect();
    let low = lower(&AneKernel::Linear { rows, cols }, &[&w], WeightMode::Fp16).unwrap();
    (low.mil_text(), low.weights)
}

fn refused(ane: &EmuAne, text: &str, weights: &WeightFiles) -> Rule {
    match ane.compile(text, weights) {
        Err(AneError::Rule { rule, detail }) => {
            let msg = AneError::Rule { rule, detail }.to_string();
            assert!(msg.contains(rule.name()), "{msg}");
            assert!(msg.contains("Fix:"), "{msg}");
            rule
        }
        Err(e) => panic!("refused for another reason: {e}\n{text}"),
        Ok(_) => panic!("accepted:\n{text}"),
    }
}

/// Every rule's case: (rule, device config, MIL text, weights).
fn cases() -> Vec<(Rule, EmuConfig, String, WeightFiles)> {
    let d = EmuConfig::default;
    let (text, weights) = linear(64, 64);
    let none = WeightFiles::new();
    let mut v = Vec::new();

    // refused-form (a test knob): the emulator told to refuse int8 programs refuses one.
    let w: Vec<f32> = (0..64 * 64).map(|i| (i % 5) as f32 * 0.01).collect();
    let int8 = lower(
        &AneKernel::Linear { rows: 64, cols: 64 },
        &[&w],
        WeightMode::INT8_PER_ROW,
    )
    .unwrap();
    v.push((
        Rule::Refused,
        EmuConfig {
            refuse: vec!["constexpr_blockwise_shift_scale".into()],
            ..d()
        },
        int8.mil_text(),
        int8.weights,
    ));

    // mil-dialect: no coremlc-version; program(1.3) with ios16; ios17.
    v.push((
        Rule::Dialect,
        d(),
        text.replace("coremlc-version", "coremlc-build"),
        weights.clone(),
    ));
    v.push((
        Rule::Dialect,
        d(),
        text.replace("program(1.0)", "program(1.3)"),
        weights.clone(),
    ));
    v.push((
        Rule::Dialect,
        d(),
        text.replace("main<ios16>", "main<ios17>"),
        weights.clone(),
    ));

    // io-fp16: an fp32 input (and an fp32 output).
    let io32 = program(
        "ios16",
        "tensor<fp32, [1, 64, 1, 32]> x",
        &format!(
            "        tensor<fp32, [1, 64, 1, 32]> y = add(x = x, y = x){};\n",
            s("y")
        ),
        "y",
    );
    v.push((Rule::IoFp16, d(), io32, none.clone()));

    // io-lanes-32: the whole Linear kernel at W = 16.
    v.push((Rule::IoLanes, d(), text.replace("1, 32]", "1, 16]"), weights.clone()));
    let lanes1 = program(
        "ios16",
        "tensor<fp16, [1, 64, 1, 1]> x",
        &format!("        tensor<fp16, [1, 64, 1, 1]> y = add(x = x, y = x){};\n", s("y")),
        "y",
    );
    v.push((Rule::IoLanes, d(), lanes1, none.clone()));

    // io-shape: a rank-3 input.
    let rank3 = program(
        "ios16",
        "tensor<fp16, [1, 64, 32]> x",
        &format!("        tensor<fp16, [1, 64, 32]> y = add(x = x, y = x){};\n", s("y")),
        "y",
    );
    v.push((Rule::IoShape, d(), rank3, none.clone()));

    // no-tile: tile, even with its result added back in the usual way.
    let tile = program(
        "ios16",
        "tensor<fp16, [1, 64, 1, 32]> x",
        &format!(
            "        tensor<int32, [4]> reps = const()[name = tensor<string, []>(\"reps\"), val = tensor<int32, [4]>([1, 2, 1, 1])];\n\
             \x20       tensor<fp16, [1, 128, 1, 32]> y = tile(reps = reps, x = x){};\n",
            s("y")
        ),
        "y",
    );
    v.push((Rule::NoTile, d(), tile, none.clone()));

    // op-whitelist: sqrt (typed, but unverified on hardware) and an unknown op.
    let sqrt = program(
        "ios16",
        "tensor<fp16, [1, 64, 1, 32]> x",
        &format!("        tensor<fp16, [1, 64, 1, 32]> y = sqrt(x = x){};\n", s("y")),
        "y",
    );
    v.push((Rule::OpWhitelist, d(), sqrt, none.clone()));
    let gelu = program(
        "ios16",
        "tensor<fp16, [1, 64, 1, 32]> x",
        &format!("        tensor<fp16, [1, 64, 1, 32]> y = gelu(x = x){};\n", s("y")),
        "y",
    );
    v.push((Rule::OpWhitelist, d(), gelu, none.clone()));

    // conv-const-weight: the weight is a reshaped runtime input.
    let runtime_w = program(
        "ios16",
        "tensor<fp16, [1, 128, 1, 32]> w, tensor<fp16, [1, 64, 1, 32]> x",
        &format!(
            "        tensor<int32, [4]> ws = const()[name = tensor<string, []>(\"ws\"), val = tensor<int32, [4]>([64, 64, 1, 1])];\n\
             \x20       tensor<fp16, [64, 64, 1, 1]> wr = reshape(shape = ws, x = w){};\n{}\
             \x20       tensor<fp16, [1, 64, 1, 32]> y = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = wr, x = x){};\n",
            s("wr"),
            conv_params("[1, 1]", "[1, 1]"),
            s("y")
        ),
        "y",
    );
    v.push((Rule::ConvConstWeight, d(), runtime_w, none.clone()));

    // conv-1x1: dilations [2, 2] (and a bias).
    v.push((
        Rule::ConvForm,
        d(),
        text.replace(
            "val = tensor<int32, [2]>([1, 1])];\n        tensor<int32, []> gr",
            "val = tensor<int32, [2]>([2, 2])];\n        tensor<int32, []> gr",
        ),
        weights.clone(),
    ));

    // fp16-compute: an fp32 constant; fp16 data fed to constexpr_blockwise_shift_scale.
    let fp32 = program(
        "ios16",
        "tensor<fp16, [1, 64, 1, 32]> x",
        &format!(
            "        tensor<fp32, []> c = const()[name = tensor<string, []>(\"c\"), val = tensor<fp32, []>(1.5)];\n\
             \x20       tensor<fp16, [1, 64, 1, 32]> y = add(x = x, y = x){};\n",
            s("y")
        ),
        "y",
    );
    v.push((Rule::Fp16Compute, d(), fp32, none.clone()));
    let mut fp16_data = weights.clone();
    fp16_data.insert(
        "@model_path/weights/ws.bin",
        write_fp16_blob(&[anelm_mil::f16::ONE; 64]).unwrap(),
    );
    let not_int8 = text.replace("main<ios16>", "main<ios18>").replace(
        "tensor<fp16, [64, 64, 1, 1]> weight = const()",
        "tensor<fp16, [64, 1, 1, 1]> ws = const()[name = tensor<string, []>(\"ws\"), val = tensor<fp16, [64, 1, 1, 1]>(BLOBFILE(path = tensor<string, []>(\"@model_path/weights/ws.bin\"), offset = tensor<uint64, []>(64)))];\n        tensor<fp16, [64, 64, 1, 1]> wf = const()",
    ).replace("[name = tensor<string, []>(\"weight\")", "[name = tensor<string, []>(\"wf\")").replace(
        "        tensor<string, []> pt",
        "        tensor<fp16, [64, 64, 1, 1]> weight = constexpr_blockwise_shift_scale(data = wf, scale = ws)[name = tensor<string, []>(\"weight\")];\n        tensor<string, []> pt",
    );
    v.push((Rule::Fp16Compute, d(), not_int8, fp16_data));

    // blob-header: corrupted magic; missing file; offset other than 64; payload of the wrong size.
    let mut bad_magic = WeightFiles::new();
    for (p, b) in weights.iter() {
        let mut b = b.to_vec();
        b[64] ^= 0xFF;
        bad_magic.insert(p, b);
    }
    v.push((Rule::BlobHeader, d(), text.clone(), bad_magic));
    v.push((Rule::BlobHeader, d(), text.clone(), WeightFiles::new()));
    v.push((
        Rule::BlobHeader,
        d(),
        text.replace("uint64, []>(64)", "uint64, []>(128)"),
        weights.clone(),
    ));
    let (_, small) = linear(32, 64);
    v.push((Rule::BlobHeader, d(), text.clone(), small));

    // dim-cap: 65,537 output channels; conv input over a lowered conv cap.
    let (wide, wide_w) = linear(65_537, 1);
    v.push((Rule::DimCap, d(), wide, wide_w));
    let small_cap = EmuConfig {
        limits: anelm_ane::Limits {
            max_conv_input_channels: 32,
            ..anelm_ane::Limits::default()
        },
        ..d()
    };
    v.push((Rule::DimCap, small_cap, text.clone(), weights.clone()));
    let zero = program(
        "ios16",
        "tensor<fp16, [1, 0, 1, 32]> x",
        &format!("        tensor<fp16, [1, 0, 1, 32]> y = add(x = x, y = x){};\n", s("y")),
        "y",
    );
    v.push((Rule::DimCap, d(), zero, none.clone()));
    let few_elements = EmuConfig {
        limits: anelm_ane::Limits {
            max_tensor_elements: 1000,
            ..anelm_ane::Limits::default()
        },
        ..d()
    };
    v.push((Rule::DimCap, few_elements, text.clone(), weights.clone()));

    // kernel-size: 8 KiB of constants against a 4 KiB limit.
    let tiny_limit = EmuConfig {
        limits: anelm_ane::Limits {
            max_kernel_const_bytes: 4096,
            ..anelm_ane::Limits::default()
        },
        ..d()
    };
    v.push((Rule::KernelSize, tiny_limit, text.clone(), weights.clone()));

    // io-outputs-2: three outputs.
    v.push((Rule::OutputCount, d(), outputs(3), none.clone()));

    // m5-align-128: a 3-channel surface (192 bytes) on M5.
    v.push((Rule::M5Alignment, m5(), three_channels(), none.clone()));

    // program-weights-2gb: 8 KiB of weight files against a 1000-byte limit.
    let small_weights = EmuConfig {
        limits: anelm_ane::Limits {
            max_program_weight_bytes: 1000,
            ..anelm_ane::Limits::default()
        },
        ..d()
    };
    v.push((Rule::ProgramWeights, small_weights, text.clone(), weights.clone()));

    // io-sorted-names: inputs declared `b` before `a`.
    v.push((Rule::IoSortedNames, d(), difference("b", "a"), none.clone()));
    v
}

/// `a − b` over two `[1, 64, 1, 32]` inputs declared in the order `first`, `second`.
fn difference(first: &str, second: &str) -> String {
    program(
        "ios16",
        &format!("tensor<fp16, [1, 64, 1, 32]> {first}, tensor<fp16, [1, 64, 1, 32]> {second}"),
        &format!(
            "        tensor<fp16, [1, 64, 1, 32]> y = sub(x = a, y = b){};\n",
            s("y")
        ),
        "y",
    )
}

/// A program returning `n` outputs, each `x + x`.
fn outputs(n: usize) -> String {
    let body: String = (0..n)
        .map(|i| {
            format!(
                "        tensor<fp16, [1, 64, 1, 32]> y{i} = add(x = x, y = x){};\n",
                s(&format!("y{i}"))
            )
        })
        .collect();
    let outs: Vec<String> = (0..n).map(|i| format!("y{i}")).collect();
    program("ios16", "tensor<fp16, [1, 64, 1, 32]> x", &body, &outs.join(", "))
}

/// `x + x` over a `[1, 3, 1, 32]` surface (192 bytes: not a multiple of 128).
fn three_channels() -> String {
    program(
        "ios16",
        "tensor<fp16, [1, 3, 1, 32]> x",
        &format!("        tensor<fp16, [1, 3, 1, 32]> y = add(x = x, y = x){};\n", s("y")),
        "y",
    )
}

fn m5() -> EmuConfig {
    EmuConfig {
        chip: ChipProfile::by_name("m5").unwrap(),
        ..EmuConfig::default()
    }
}

#[test]
fn every_rule_has_a_refused_program() {
    let mut covered = HashSet::new();
    for (rule, cfg, text, weights) in cases() {
        let ane = EmuAne::new(cfg);
        assert_eq!(refused(&ane, &text, &weights), rule, "{text}");
        covered.insert(rule);
    }
    // Tested below or elsewhere: process-level rules, and the Apple device's surface rule
    // (src/apple/tests.rs, `every_error_path_releases_what_it_made`).
    for r in [
        Rule::LoadBudget,
        Rule::LoadedBytes,
        Rule::CompileBudget,
        Rule::SurfaceMinBytes,
        Rule::SurfaceEqualAlloc,
    ] {
        covered.insert(r);
    }
    for r in Rule::ALL {
        assert!(covered.contains(&r), "no test program for rule {r}");
    }
}

#[test]
fn the_unbroken_program_is_accepted() {
    let (text, weights) = linear(64, 64);
    let ane = EmuAne::default();
    ane.compile(&text, &weights).unwrap();
}

#[test]
fn load_budget_is_per_process_and_reclaimed_by_unload() {
    let ane = EmuAne::new(EmuConfig {
        max_loaded_programs: 2,
        ..EmuConfig::default()
    });
    let (text, weights) = linear(64, 64);
    let hs: Vec<_> = (0..3).map(|_| ane.compile(&text, &weights).unwrap()).collect();
    ane.load(hs[0]).unwrap();
    ane.load(hs[1]).unwrap();
    let e = ane.load(hs[2]).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::LoadBudget), "{e}");
    assert!(e.to_string().contains("load-budget"));
    ane.unload(hs[0]).unwrap();
    ane.load(hs[2]).unwrap();
    assert_eq!(ane.stats().loaded, 2);
    // A byte budget too.
    let ane = EmuAne::new(EmuConfig {
        max_loaded_bytes: Some(10_000),
        ..EmuConfig::default()
    });
    let a = ane.compile(&text, &weights).unwrap();
    let b = ane.compile(&text, &weights).unwrap();
    ane.load(a).unwrap();
    let e = ane.load(b).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::LoadedBytes), "{e}");
    assert!(e.to_string().contains("the budget is 10000"), "{e}");
    // Unloading reclaims it.
    ane.unload(a).unwrap();
    ane.load(b).unwrap();
    assert_eq!(ane.stats().loaded_bytes, 8192);
}

/// Issue 37 item 3: names in sorted order are accepted, the emulator binds surfaces by sorted
/// name, and outputs must be sorted too.
#[test]
fn surfaces_bind_by_sorted_name() {
    let ane = EmuAne::default();
    let h = ane.compile(&difference("a", "b"), &WeightFiles::new()).unwrap();
    ane.load(h).unwrap();
    let a = Surface::pack(64, &[&[3.0; 64]]).unwrap();
    let b = Surface::pack(64, &[&[1.0; 64]]).unwrap();
    let mut y = [Surface::new(64)];
    ane.evaluate(h, &[&a, &b], &mut y).unwrap();
    assert_eq!(y[0].read_lane(0).unwrap(), vec![2.0; 64], "a − b with a bound first");
    let e = ane.compile(&difference("b", "a"), &WeightFiles::new()).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::IoSortedNames), "{e}");
    assert!(e.to_string().contains("`b` before `a`"), "{e}");
    // A cache load skips the rules but still binds by sorted name: the surface given first is `a`.
    let h = ane
        .load_without_compile(&difference("b", "a"), &WeightFiles::new())
        .unwrap();
    ane.evaluate(h, &[&a, &b], &mut y).unwrap();
    assert_eq!(y[0].read_lane(0).unwrap(), vec![2.0; 64]);
    // Outputs: `y1, y0` is refused, `y0, y1` accepted.
    let body = format!(
        "        tensor<fp16, [1, 64, 1, 32]> y0 = add(x = x, y = x){};\n        tensor<fp16, [1, 64, 1, 32]> y1 = add(x = x, y = x){};\n",
        s("y0"),
        s("y1")
    );
    let swapped = program("ios16", "tensor<fp16, [1, 64, 1, 32]> x", &body, "y1, y0");
    assert_eq!(
        ane.compile(&swapped, &WeightFiles::new()).unwrap_err().rule(),
        Some(Rule::IoSortedNames)
    );
    // Every kernel anelm lowers declares its surfaces sorted (checked per kind in tests/kernels.rs
    // by compiling them); the residual kernels are the multi-input ones.
    for k in [
        AneKernel::LinearResidual { rows: 96, cols: 64 },
        AneKernel::SwiGluFfnResidual { hidden: 64, inter: 128 },
    ] {
        let w: Vec<Vec<f32>> = k.weights().iter().map(|w| vec![0.01; w.rows * w.cols]).collect();
        let refs: Vec<&[f32]> = w.iter().map(Vec::as_slice).collect();
        let low = lower(&k, &refs, WeightMode::Fp16).unwrap();
        ane.compile(&low.mil_text(), &low.weights).unwrap();
    }
}

#[test]
fn two_outputs_are_accepted_three_are_not() {
    let ane = EmuAne::default();
    let h = ane.compile(&outputs(2), &WeightFiles::new()).unwrap();
    assert_eq!(ane.signature(h).unwrap().outputs.len(), 2);
    ane.compile(&outputs(1), &WeightFiles::new()).unwrap();
    let e = ane.compile(&outputs(3), &WeightFiles::new()).unwrap_err();
    assert!(e.to_string().contains("returns 3 outputs (y0, y1, y2)"), "{e}");
}

#[test]
fn m5_alignment_applies_to_m5_only() {
    // The same 192-byte surface is fine on M3 Max; on M5 128-byte multiples pass.
    EmuAne::default()
        .compile(&three_channels(), &WeightFiles::new())
        .unwrap();
    let (text, weights) = linear(64, 64);
    EmuAne::new(m5()).compile(&text, &weights).unwrap();
    let e = EmuAne::new(m5())
        .compile(&three_channels(), &WeightFiles::new())
        .unwrap_err();
    assert!(e.to_string().contains("192 bytes"), "{e}");
    assert!(ChipProfile::by_name("m5-max").unwrap().aligns_io_to_128());
    assert!(!ChipProfile::m3_max().aligns_io_to_128());
}

#[test]
fn the_axis_cap_is_65536_inclusive() {
    assert_eq!(MAX_AXIS, 65_536);
    let ane = EmuAne::default();
    let (text, weights) = linear(MAX_AXIS, 1);
    ane.compile(&text, &weights).unwrap();
    let (text, weights) = linear(MAX_AXIS + 1, 1);
    let e = ane.compile(&text, &weights).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::DimCap), "{e}");
    assert!(e.to_string().contains("65537"), "{e}");
}

#[test]
fn program_weights_count_the_files_handed_to_the_compiler() {
    let (text, weights) = linear(64, 64);
    let bytes: usize = weights.iter().map(|(_, b)| b.len()).sum();
    let at = |max: usize| {
        EmuAne::new(EmuConfig {
            limits: anelm_ane::Limits {
                max_program_weight_bytes: max as u64,
                ..anelm_ane::Limits::default()
            },
            ..EmuConfig::default()
        })
        .compile(&text, &weights)
    };
    at(bytes).unwrap();
    let e = at(bytes - 1).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::ProgramWeights), "{e}");
    assert_eq!(EmuConfig::default().limits.max_program_weight_bytes, 2_000_000_000);
}

#[test]
fn the_compile_budget_refuses_the_next_compile_and_cache_loads_do_not_count() {
    let (text, weights) = linear(64, 64);
    assert_eq!(EmuConfig::default().max_compiles, Some(119));
    let ane = EmuAne::new(EmuConfig {
        max_compiles: Some(2),
        ..EmuConfig::default()
    });
    ane.compile(&text, &weights).unwrap();
    // Text that does not parse never reaches the compiler; a program refused by a rule did, and
    // counts.
    assert!(matches!(ane.compile("program(", &weights), Err(AneError::Parse(_))));
    let refused = ane.compile(&outputs(3), &WeightFiles::new()).unwrap_err();
    assert_eq!(refused.rule(), Some(Rule::OutputCount));
    let e = ane.compile(&text, &weights).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::CompileBudget), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("2 compiles") && msg.contains("run anelm again"), "{msg}");
    assert!(msg.contains("compile cache"), "{msg}");
    assert_eq!(ane.stats().compiles, 1);
    // A new "process" resumes from the cache: loads without compiling are not counted.
    let h = ane.load_without_compile(&text, &weights).unwrap();
    ane.evaluate(h, &[&Surface::new(64)], &mut [Surface::new(64)]).unwrap();
    assert_eq!(ane.stats().compile_attempts, 2);
    // No budget: no limit.
    let free = EmuAne::new(EmuConfig {
        max_compiles: None,
        ..EmuConfig::default()
    });
    for _ in 0..3 {
        free.compile(&text, &weights).unwrap();
    }
}

#[test]
fn lifecycle_and_surface_errors_say_what_to_do() {
    let ane = EmuAne::default();
    let (text, weights) = linear(64, 64);
    let h = ane.compile(&text, &weights).unwrap();
    let x = Surface::new(64);
    let mut y = [Surface::new(64)];
    let e = ane.evaluate(h, &[&x], &mut y).unwrap_err();
    assert!(matches!(e, AneError::State { call: "evaluate", .. }), "{e}");
    assert!(ane.unload(h).is_err());
    ane.load(h).unwrap();
    assert!(ane.load(h).is_err());
    let e = ane.evaluate(h, &[], &mut y).unwrap_err();
    assert!(matches!(e, AneError::Surfaces(_)), "{e}");
    let wrong = Surface::new(32);
    let e = ane.evaluate(h, &[&wrong], &mut y).unwrap_err();
    assert!(e.to_string().contains("signature()"), "{e}");
    ane.evaluate(h, &[&x], &mut y).unwrap();
    ane.release(h).unwrap();
    assert!(matches!(ane.load(h), Err(AneError::UnknownHandle(_))));
    assert!(matches!(ane.compile("program(", &weights), Err(AneError::Parse(_))));
}

#[test]
fn reload_after_unload_keeps_the_compiled_weights() {
    let ane = EmuAne::default();
    let (text, mut weights) = linear(64, 64);
    let h = ane.compile(&text, &weights).unwrap();
    // Changing the caller's weight files after compile must not change the program.
    weights.insert(
        "@model_path/weights/weight.bin",
        write_fp16_blob(&[anelm_mil::f16::ZERO; 4096]).unwrap(),
    );
    ane.load(h).unwrap();
    let x = Surface::pack(64, &[&[1.0; 64]]).unwrap();
    let mut a = [Surface::new(64)];
    ane.evaluate(h, &[&x], &mut a).unwrap();
    ane.unload(h).unwrap();
    ane.load(h).unwrap();
    let mut b = [Surface::new(64)];
    ane.evaluate(h, &[&x], &mut b).unwrap();
    assert_eq!(a, b);
    assert!(a[0].get(1, 0).unwrap() != 0.0);
}

/// The refusal knob refuses only what it names: the fp16 form of the same kernel compiles, a
/// refused compile counts as an attempt, and the knob is part of the cache salt.
#[test]
fn refuse_knob_refuses_only_the_named_form() {
    let cfg = EmuConfig {
        refuse: vec!["constexpr_blockwise_shift_scale".into()],
        ..EmuConfig::default()
    };
    let ane = EmuAne::new(cfg);
    let w: Vec<f32> = (0..64 * 64).map(|i| (i % 5) as f32 * 0.01).collect();
    let k = AneKernel::Linear { rows: 64, cols: 64 };
    let int8 = lower(&k, &[&w], WeightMode::INT8_PER_ROW).unwrap();
    let e = ane.compile(&int8.mil_text(), &int8.weights).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::Refused), "{e}");
    assert!(e.to_string().contains("constexpr_blockwise_shift_scale"), "{e}");
    assert!(ane.load_without_compile(&int8.mil_text(), &int8.weights).is_err());
    let fp16 = lower(&k, &[&w], WeightMode::Fp16).unwrap();
    ane.compile(&fp16.mil_text(), &fp16.weights).unwrap();
    assert_eq!(ane.stats().compile_attempts, 2);
    assert_eq!(ane.stats().compiles, 1);
    assert_ne!(ane.cache_salt(), EmuAne::default().cache_salt());
}
