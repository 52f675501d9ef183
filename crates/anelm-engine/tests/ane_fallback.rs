//! The ANE fallback chain (issue 27 item 4) on the emulated Neural Engine. The emulator is told
//! to refuse one kernel form (`EmuConfig::refuse`, matched against the MIL text it receives); the
//! model must still load, report each fallback, and compute what the CPU backend computes:
//! - FFN resadd refused → plain (residual added on the host); resadd and plain refused → chunked;
//!   every FFN form refused → the load fails, saying to use `--device cpu`;
//! - an int8 program refused → the same program in fp16 (bit-identical to an fp16 load);
//! - the LM head refused → the CPU backend's kernel;
//! - a projection refused → the load fails (no fallback), and nothing stays loaded.
//!
//! The model is the tiny Llama fixture (`tests/fixtures/hf/llama`, f32 safetensors: hidden 64,
//! FFN 128, vocabulary 512, 2 layers).

use std::path::PathBuf;
use std::sync::Arc;

use anelm_ane::{AneKernel, EmuAne, EmuConfig, WeightMode, lower};
use anelm_engine::{
    AneBackend, AneOptions, Backend, CpuBackend, KernelFallback, LanguageModel, LogitsMode, StepItem,
    load_model_weights,
};

mod common;
use common::{argmax, cosine};

const LAYERS: usize = 2;
const HIDDEN: usize = 64;
const INTER: usize = 128;
const VOCAB: usize = 512;
const STEPS: usize = 8;
const PROMPT: [u32; 6] = [1, 17, 300, 42, 7, 99];

/// What refuses the fused FFN with its residual add (its inputs are `xnorm` and `xres`).
const RESADD: &str = "xnorm";
/// What refuses the plain FFN (its down projection is the output conv `out`; a chunk's `out` is
/// an add).
const PLAIN: &str = "> out = conv(";
/// What refuses an FFN chunk (its packed `x ‖ acc` input).
const CHUNK: &str = "> packed";
/// What refuses every int8 program.
const INT8: &str = "constexpr_blockwise_shift_scale";
/// What refuses the fused input projection (a concat of q, k, v).
const CONCAT: &str = "concat(";

/// What refuses the LM head: its `[1, 512, 1, 32]` output.
fn lm_head_marker() -> String {
    format!("[1, {VOCAB}, 1, 32]> y = conv(")
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama")
}

fn load(backend: &dyn Backend) -> Result<Box<dyn LanguageModel>, anelm_engine::EngineError> {
    load_model_weights(&fixture(), backend, &mut |_, _| {})
}

fn emulated(refuse: &[&str], mode: WeightMode) -> (Arc<EmuAne>, AneBackend<EmuAne>) {
    let device = Arc::new(EmuAne::new(EmuConfig {
        refuse: refuse.iter().map(|s| s.to_string()).collect(),
        ..EmuConfig::default()
    }));
    let backend = AneBackend::new(
        Arc::clone(&device),
        AneOptions {
            weights: mode,
            ..AneOptions::default()
        },
    );
    (device, backend)
}

/// Greedy-decode `STEPS` tokens after `PROMPT`: every step's last logits row.
fn run(model: &dyn LanguageModel) -> Vec<Vec<f32>> {
    let mut session = model.new_session(PROMPT.len() + STEPS + 1);
    let mut input = PROMPT.to_vec();
    let mut rows = Vec::new();
    for _ in 0..STEPS {
        let mut items = [StepItem {
            session: &mut session,
            tokens: &input,
            logits: LogitsMode::Last,
        }];
        let logits = model.forward(&mut items).expect("forward");
        let row = logits.lane(0).to_vec();
        input = vec![argmax(&row)];
        rows.push(row);
    }
    rows
}

/// The emulated model picks the CPU backend's greedy tokens with logits cosine ≥ 0.999.
fn assert_matches_cpu(name: &str, ane: &dyn LanguageModel) {
    let cpu = load(&CpuBackend::new()).expect("load on the CPU");
    let (want, got) = (run(cpu.as_ref()), run(ane));
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let c = cosine(w, g);
        assert!(
            c >= 0.999,
            "{name} step {i}: logits cosine to the CPU backend {c:.6} < 0.999"
        );
        assert_eq!(
            argmax(g),
            argmax(w),
            "{name} step {i}: greedy token differs from the CPU's"
        );
    }
}

fn lowered(kernel: &AneKernel, mode: WeightMode) -> String {
    let weights: Vec<Vec<f32>> = kernel
        .weights()
        .iter()
        .map(|w| (0..w.rows * w.cols).map(|i| (i % 7) as f32 * 0.01).collect())
        .collect();
    let refs: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
    lower(kernel, &refs, mode).expect("lower").mil_text()
}

/// The markers above pick out exactly the form they name (so a test cannot pass by refusing
/// nothing, or everything).
#[test]
fn refusal_markers_name_one_form_each() {
    let (h, f) = (HIDDEN, INTER);
    let kernels = [
        ("resadd", AneKernel::SwiGluFfnResidual { hidden: h, inter: f }),
        ("plain", AneKernel::SwiGluFfn { hidden: h, inter: f }),
        (
            "chunk",
            AneKernel::FfnChunk {
                hidden: h,
                chunk: f / 2,
            },
        ),
        ("lm_head", AneKernel::Linear { rows: VOCAB, cols: h }),
        (
            "qkv",
            AneKernel::FusedLinear {
                parts: vec![64, 32, 32],
                cols: h,
            },
        ),
        ("oproj", AneKernel::LinearResidual { rows: h, cols: h }),
    ];
    let lm = lm_head_marker();
    let markers = [
        ("resadd", RESADD),
        ("plain", PLAIN),
        ("chunk", CHUNK),
        ("lm_head", lm.as_str()),
        ("qkv", CONCAT),
    ];
    for (name, k) in &kernels {
        let text = lowered(k, WeightMode::Fp16);
        assert!(!text.contains(INT8), "{name} fp16 has int8 data");
        assert!(lowered(k, WeightMode::INT8_PER_ROW).contains(INT8), "{name} int8");
        for (target, m) in markers {
            assert_eq!(text.contains(m), *name == target, "marker {m:?} on {name}:\n{text}");
        }
    }
}

fn fallbacks_of(backend: &AneBackend<EmuAne>) -> Vec<KernelFallback> {
    let list = backend.monitor().fallbacks();
    assert_eq!(backend.stats().fallbacks as usize, list.len());
    list
}

#[test]
fn refused_ffn_resadd_runs_plain_and_matches_the_cpu() {
    let (device, backend) = emulated(&[RESADD], WeightMode::Fp16);
    let ane = load(&backend).expect("the model loads with the FFN in its plain form");
    let list = fallbacks_of(&backend);
    assert_eq!(list.len(), LAYERS, "{list:?}");
    for f in &list {
        assert!(f.kernel.starts_with("ffn ") && f.kernel.contains("gate_proj"), "{f}");
        assert_eq!((f.from.as_str(), f.to.as_str()), ("ffn resadd", "ffn plain"), "{f}");
        assert!(f.reason.contains("refused-form") && f.reason.contains(RESADD), "{f}");
    }
    // The first refusal is remembered: the second layer's resadd is not compiled again.
    assert!(list[1].reason.contains("refused earlier"), "{}", list[1]);
    let s = device.stats();
    // Per layer qkv, o_proj + r, plain FFN; plus the LM head.
    assert_eq!(s.loaded, 3 * LAYERS + 1);
    assert_eq!(s.compile_attempts as usize, 3 * LAYERS + 1 + 1);
    assert_matches_cpu("FFN plain", ane.as_ref());
}

#[test]
fn refused_resadd_and_plain_ffn_runs_chunked_and_matches_the_cpu() {
    let (device, backend) = emulated(&[RESADD, PLAIN], WeightMode::Fp16);
    let ane = load(&backend).expect("the model loads with the FFN in chunks");
    let list = fallbacks_of(&backend);
    let hops: Vec<(&str, &str)> = list.iter().map(|f| (f.from.as_str(), f.to.as_str())).collect();
    assert_eq!(
        hops,
        [("ffn resadd", "ffn plain"), ("ffn plain", "ffn chunked")].repeat(LAYERS),
        "{list:?}"
    );
    // Two chunks per FFN.
    assert_eq!(device.stats().loaded, 2 * LAYERS + 2 * LAYERS + 1);
    assert_matches_cpu("FFN chunked", ane.as_ref());
}

#[test]
fn every_ffn_form_refused_fails_the_load_and_says_what_to_do() {
    let (device, backend) = emulated(&[RESADD, PLAIN, CHUNK], WeightMode::Fp16);
    let e = load(&backend).err().expect("no FFN form is left").to_string();
    assert!(e.contains("--device cpu") && e.contains("chunked"), "{e}");
    assert_eq!(device.stats().loaded, 0, "a failed load leaves nothing loaded");
}

#[test]
fn refused_int8_programs_run_in_fp16() {
    let (device, backend) = emulated(&[INT8], WeightMode::INT8_PER_ROW);
    let ane = load(&backend).expect("the model loads in fp16");
    let list = fallbacks_of(&backend);
    // Every program: 2 × (qkv, o_proj, FFN) + the LM head.
    assert_eq!(list.len(), 3 * LAYERS + 1, "{list:?}");
    for f in &list {
        assert!(f.from.ends_with(" int8") && f.to.ends_with(" fp16"), "{f}");
        assert_eq!(f.from.trim_end_matches(" int8"), f.to.trim_end_matches(" fp16"), "{f}");
        assert!(f.reason.contains(INT8), "{f}");
    }
    assert!(list.iter().any(|f| f.from == "swiglu_ffn_residual int8"), "{list:?}");
    // int8 is tried once per distinct shape (qkv, o_proj, FFN, LM head), then remembered.
    let s = device.stats();
    assert_eq!(s.compile_attempts as usize, 4 + 3 * LAYERS + 1);
    assert_eq!(s.loaded, 3 * LAYERS + 1);
    // The same programs as an fp16 load: bit-identical logits.
    let (_, fp16) = emulated(&[], WeightMode::Fp16);
    let want = run(load(&fp16).expect("fp16 load").as_ref());
    assert_eq!(run(ane.as_ref()), want);
    assert_matches_cpu("int8 → fp16", ane.as_ref());
}

#[test]
fn refused_lm_head_runs_on_the_cpu_and_matches_the_cpu() {
    let marker = lm_head_marker();
    let (device, backend) = emulated(&[&marker], WeightMode::Fp16);
    let ane = load(&backend).expect("the model loads with the LM head on the CPU");
    let list = fallbacks_of(&backend);
    assert_eq!(list.len(), 1, "{list:?}");
    assert!(list[0].kernel.starts_with("lm_head "), "{}", list[0]);
    assert_eq!(
        (list[0].from.as_str(), list[0].to.as_str()),
        ("lm_head on ane-emu", "cpu")
    );
    assert_eq!(device.stats().loaded, 3 * LAYERS, "no LM-head program stays loaded");
    // 3 dispatches per layer and none for the LM head.
    let before = device.stats().dispatches;
    assert_matches_cpu("LM head on the CPU", ane.as_ref());
    let per_step = (device.stats().dispatches - before) as usize / STEPS;
    assert_eq!(per_step, 3 * LAYERS);
}

#[test]
fn a_refused_projection_fails_the_load_and_releases_everything() {
    let (device, backend) = emulated(&[CONCAT], WeightMode::Fp16);
    let e = load(&backend)
        .err()
        .expect("the input projection has no fallback")
        .to_string();
    assert!(
        e.contains("input_proj") && e.contains("--device cpu") && e.contains("refused-form"),
        "{e}"
    );
    assert_eq!(device.stats().loaded, 0);
    assert_eq!(backend.stats().fallbacks, 0);
}

/// The backend plans under the device's own limits (`AneDevice::limits`): an emulator whose FFN
/// threshold and kernel size are small gets FFN chunks and LM-head row chunks from the start —
/// no program is refused, so no fallback — and the model still computes what the CPU does.
#[test]
fn the_backend_plans_under_the_devices_own_limits() {
    let limits = anelm_ane::Limits {
        // The 64 → 128 → 64 FFN is 49,152 fp16 bytes: split in two.
        ffn_max_bytes: 30_000,
        // The 512 × 64 LM head is 65,536 fp16 bytes: rows of at most 320.
        max_kernel_const_bytes: 40_960,
        ..anelm_ane::Limits::default()
    };
    let device = Arc::new(EmuAne::new(EmuConfig {
        limits,
        ..EmuConfig::default()
    }));
    let backend = AneBackend::new(Arc::clone(&device), AneOptions::default());
    let model = load(&backend).expect("loads under the small limits");
    assert!(fallbacks_of(&backend).is_empty());
    // Per layer: qkv, output + residual, 2 FFN chunks; LM head: ⌈512 / 320⌉ = 2 chunks.
    assert_eq!(device.stats().loaded, 4 * LAYERS + 2);
    assert_matches_cpu("small limits", model.as_ref());
}
