//! The GGUF types added for the files users download (Q5_1, Q2_K, Q3_K, IQ4_XS, MXFP4) load and run
//! end to end: a random Llama whose matrices are stored in each type (and one mixing them with
//! the older types, as a Q3_K_M file does) gives the logits of the same model stored as the f32
//! values those blocks decode to. The block layouts themselves are pinned to the PyPI `gguf`
//! package (`anelm-kernels/tests/dequant_vs_gguf_py.rs`) and the kernels to the dequantised
//! rows (`matmul_vs_reference.rs`); this checks the loader, the embedding lookup, the CPU
//! backend's choice of kernel and the activations shared between formats, and the emulated
//! Neural Engine's lowering of these types.

use std::path::Path;
use std::sync::Arc;

use anelm_ane::EmuAne;
use anelm_engine::{
    AneBackend, AneOptions, Backend, CpuBackend, LanguageModel, LogitsMode, StepItem, load_model_weights,
};
use anelm_kernels::{WeightFormat, dequantize_row, quantize_row};

mod common;
use common::{TinyLlama, cosine, write_llama_gguf};

const HIDDEN: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const FFN: usize = 512;
const LAYERS: usize = 2;
const VOCAB: usize = 96;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A tensor of the model: GGUF name, shape (rows, cols), f32 values, and the format to store.
struct Tensor {
    name: String,
    rows: usize,
    cols: usize,
    values: Vec<f32>,
    format: WeightFormat,
}

/// The random model with each matrix stored as `format_of(name)` (norms stay f32).
fn random_model(format_of: &dyn Fn(&str) -> WeightFormat) -> Vec<Tensor> {
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut t = Vec::new();
    let mut mat = |t: &mut Vec<Tensor>, name: String, rows: usize, cols: usize| {
        let values = (0..rows * cols).map(|_| rng.next() * 0.15).collect();
        let format = format_of(&name);
        t.push(Tensor {
            name,
            rows,
            cols,
            values,
            format,
        });
    };
    mat(&mut t, "token_embd.weight".into(), VOCAB, HIDDEN);
    for i in 0..LAYERS {
        mat(&mut t, format!("blk.{i}.attn_q.weight"), HEADS * HEAD_DIM, HIDDEN);
        mat(&mut t, format!("blk.{i}.attn_k.weight"), KV_HEADS * HEAD_DIM, HIDDEN);
        mat(&mut t, format!("blk.{i}.attn_v.weight"), KV_HEADS * HEAD_DIM, HIDDEN);
        mat(&mut t, format!("blk.{i}.attn_output.weight"), HIDDEN, HEADS * HEAD_DIM);
        mat(&mut t, format!("blk.{i}.ffn_gate.weight"), FFN, HIDDEN);
        mat(&mut t, format!("blk.{i}.ffn_up.weight"), FFN, HIDDEN);
        mat(&mut t, format!("blk.{i}.ffn_down.weight"), HIDDEN, FFN);
        for norm in ["attn_norm", "ffn_norm"] {
            t.push(Tensor {
                name: format!("blk.{i}.{norm}.weight"),
                rows: 1,
                cols: HIDDEN,
                values: vec![1.0; HIDDEN],
                format: WeightFormat::F32,
            });
        }
    }
    t.push(Tensor {
        name: "output_norm.weight".into(),
        rows: 1,
        cols: HIDDEN,
        values: vec![1.0; HIDDEN],
        format: WeightFormat::F32,
    });
    mat(&mut t, "output.weight".into(), VOCAB, HIDDEN);
    t
}

/// Each tensor's bytes in its format, and the f32 values those bytes decode to.
fn encode(t: &Tensor) -> (Vec<u8>, Vec<f32>) {
    let rb = t.format.row_bytes(t.cols).expect("whole blocks");
    let mut bytes = vec![0u8; rb * t.rows];
    let mut decoded = vec![0f32; t.rows * t.cols];
    for r in 0..t.rows {
        let (src, dst) = (
            &t.values[r * t.cols..(r + 1) * t.cols],
            &mut bytes[r * rb..(r + 1) * rb],
        );
        quantize_row(t.format, src, dst).expect("encode");
        dequantize_row(t.format, dst, &mut decoded[r * t.cols..(r + 1) * t.cols]).expect("decode");
    }
    (bytes, decoded)
}

const SHAPE: TinyLlama = TinyLlama {
    hidden: HIDDEN,
    ffn: FFN,
    layers: LAYERS,
    heads: HEADS,
    kv_heads: KV_HEADS,
    vocab: VOCAB,
};

/// Logits at every position of `tokens`.
fn logits(model: &dyn LanguageModel, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut s = model.new_session(256);
    let out = model
        .forward(&mut [StepItem {
            session: &mut s,
            tokens,
            logits: LogitsMode::All,
        }])
        .expect("forward");
    (0..out.lanes()).map(|i| out.lane(i).to_vec()).collect()
}

fn load(path: &Path, backend: &dyn Backend) -> Box<dyn LanguageModel> {
    load_model_weights(path, backend, &mut |_, _| {}).unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
}

/// Writes the model stored as `format_of` and as the f32 its blocks decode to; returns the
/// worst cosine between their logits over a prompt (CPU backend), and the emulated ANE's worst
/// cosine to the decoded f32 model on the CPU.
fn compare(label: &str, format_of: &dyn Fn(&str) -> WeightFormat) -> (f64, f64) {
    let dir = std::env::temp_dir().join(format!("anelm-gguf-types-{}-{label}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = random_model(format_of);
    let (mut stored, mut decoded) = (Vec::new(), Vec::new());
    for t in &model {
        let (bytes, values) = encode(t);
        stored.push((t.name.clone(), t.rows, t.cols, t.format.ggml_type(), bytes));
        let f32_bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        decoded.push((t.name.clone(), t.rows, t.cols, WeightFormat::F32.ggml_type(), f32_bytes));
    }
    let (stored_path, decoded_path) = (dir.join("stored.gguf"), dir.join("decoded.gguf"));
    write_llama_gguf(&stored_path, &SHAPE, &stored);
    write_llama_gguf(&decoded_path, &SHAPE, &decoded);

    let cpu = CpuBackend::new();
    let tokens = [3u32, 17, 42, 5, 88, 61, 0, 29];
    let want = logits(&*load(&decoded_path, &cpu), &tokens);
    let got = logits(&*load(&stored_path, &cpu), &tokens);
    let ane = AneBackend::new(Arc::new(EmuAne::default()), AneOptions::default());
    let on_ane = logits(&*load(&stored_path, &ane), &tokens);
    let _ = std::fs::remove_dir_all(&dir);
    let worst = |a: &[Vec<f32>]| {
        a.iter()
            .zip(&want)
            .map(|(g, w)| cosine(g, w))
            .fold(f64::INFINITY, f64::min)
    };
    let (cpu_cos, ane_cos) = (worst(&got), worst(&on_ane));
    eprintln!("{label}: worst cosine to the decoded f32 model {cpu_cos:.6} (CPU), {ane_cos:.6} (emulated ANE)");
    (cpu_cos, ane_cos)
}

/// The int8 activations (Q8_K / Q8_1, as ggml's CPU dots) change each matmul's input by up to
/// half a step in 127; this random model's near-flat logits feel that: measured 0.9991–0.9995
/// for the new types, as for the old (Q4_K 0.99937, Q4_1 0.99956, Q8_0 0.99972). A misread
/// block scrambles its weights and gives cosines near 0.
const MIN_COSINE: f64 = 0.998;
/// The emulated ANE runs the decoded weights in fp16 with fp16 activations, much closer to the
/// f32 model (measured 0.99999).
const MIN_COSINE_ANE: f64 = 0.9999;

#[test]
fn each_new_type_runs_as_the_values_it_decodes_to() {
    for fmt in [
        WeightFormat::Q5_1,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::IQ4_XS,
        WeightFormat::MXFP4,
    ] {
        let (cpu, ane) = compare(fmt.name(), &|_| fmt);
        assert!(cpu >= MIN_COSINE, "{fmt}: cosine {cpu} on the CPU");
        assert!(ane >= MIN_COSINE_ANE, "{fmt}: cosine {ane} on the emulated ANE");
    }
}

#[test]
fn a_file_mixing_old_and_new_types_runs_as_its_decoded_values() {
    // As llama.cpp's Q3_K_M and IQ4_XS mixes: most matrices in the small type, V and the FFN's
    // down projection a size up, the output in Q6_K; Q/K/V share one set of Q8_K activations.
    let format_of = |name: &str| {
        if name.contains("attn_v") {
            WeightFormat::Q4_K
        } else if name.contains("ffn_down") {
            WeightFormat::Q5_1
        } else if name.contains("attn_k") {
            WeightFormat::IQ4_XS
        } else if name.contains("attn_output") {
            WeightFormat::Q2_K
        } else if name == "output.weight" {
            WeightFormat::Q6_K
        } else {
            WeightFormat::Q3_K
        }
    };
    let (cpu, ane) = compare("mixed", &format_of);
    assert!(cpu >= MIN_COSINE, "mixed: cosine {cpu} on the CPU");
    assert!(ane >= MIN_COSINE_ANE, "mixed: cosine {ane} on the emulated ANE");
}

#[test]
fn an_mxfp4_moe_style_file_runs_as_its_decoded_values() {
    // As llama.cpp's MXFP4_MOE files: the FFN matrices in MXFP4, attention and the output in Q8_0
    // (two formats with their own Q8_0 activations each, not shared).
    let format_of = |name: &str| {
        if name.contains("ffn_") {
            WeightFormat::MXFP4
        } else {
            WeightFormat::Q8_0
        }
    };
    let (cpu, ane) = compare("mxfp4-moe", &format_of);
    assert!(cpu >= MIN_COSINE, "MXFP4_MOE-style: cosine {cpu} on the CPU");
    assert!(
        ane >= MIN_COSINE_ANE,
        "MXFP4_MOE-style: cosine {ane} on the emulated ANE"
    );
}
