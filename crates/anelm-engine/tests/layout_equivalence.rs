//! The same random Llama stored two ways — a Hugging Face safetensors directory (rotate-half RoPE)
//! and a GGUF file whose Q/K rows are permuted the way llama.cpp's converter does (adjacent-pair
//! RoPE) — must give the same logits. This pins the RoPE pairing of each layout to the other; the
//! GGUF path itself is pinned to llama.cpp by the SmolLM2 fixture test.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anelm_engine::arch::llama::{Llama, LlamaConfig};
use anelm_engine::arch::tensor_names::{Family, TensorNames};
use anelm_engine::{CpuBackend, LanguageModel, LogitsMode, StepItem};
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::safetensors_dir::SafetensorsDir;
use anelm_model::tensor_store::TensorStore;

mod common;
use common::{GgufTensor, TinyLlama, write_llama_gguf};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FFN: usize = 96;
const LAYERS: usize = 2;
const VOCAB: usize = 128;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// (HF name, GGUF name, shape [rows, cols] or [n], data in HF layout)
type Tensor = (String, String, Vec<usize>, Vec<f32>);

fn random_model() -> Vec<Tensor> {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut t: Vec<Tensor> = Vec::new();
    fn mat(t: &mut Vec<Tensor>, hf: &str, gg: &str, rows: usize, cols: usize, rng: &mut Rng) {
        t.push((hf.into(), gg.into(), vec![rows, cols], rng.vec(rows * cols, 0.3)));
    }
    mat(
        &mut t,
        "model.embed_tokens.weight",
        "token_embd.weight",
        VOCAB,
        HIDDEN,
        &mut rng,
    );
    for i in 0..LAYERS {
        let hf = |s: &str| format!("model.layers.{i}.{s}.weight");
        let gg = |s: &str| format!("blk.{i}.{s}.weight");
        mat(
            &mut t,
            &hf("self_attn.q_proj"),
            &gg("attn_q"),
            HEADS * HEAD_DIM,
            HIDDEN,
            &mut rng,
        );
        mat(
            &mut t,
            &hf("self_attn.k_proj"),
            &gg("attn_k"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
            &mut rng,
        );
        mat(
            &mut t,
            &hf("self_attn.v_proj"),
            &gg("attn_v"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
            &mut rng,
        );
        mat(
            &mut t,
            &hf("self_attn.o_proj"),
            &gg("attn_output"),
            HIDDEN,
            HEADS * HEAD_DIM,
            &mut rng,
        );
        mat(&mut t, &hf("mlp.gate_proj"), &gg("ffn_gate"), FFN, HIDDEN, &mut rng);
        mat(&mut t, &hf("mlp.up_proj"), &gg("ffn_up"), FFN, HIDDEN, &mut rng);
        mat(&mut t, &hf("mlp.down_proj"), &gg("ffn_down"), HIDDEN, FFN, &mut rng);
        for (h, g) in [
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
        ] {
            let w: Vec<f32> = rng.vec(HIDDEN, 0.2).into_iter().map(|v| 1.0 + v).collect();
            t.push((hf(h), gg(g), vec![HIDDEN], w));
        }
    }
    let w: Vec<f32> = rng.vec(HIDDEN, 0.2).into_iter().map(|v| 1.0 + v).collect();
    t.push(("model.norm.weight".into(), "output_norm.weight".into(), vec![HIDDEN], w));
    mat(&mut t, "lm_head.weight", "output.weight", VOCAB, HIDDEN, &mut rng);
    t
}

/// llama.cpp's converter permutation of Q/K rows: per head, HF row (half j, index i) → row 2i + j.
fn permute_rows(data: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..HEAD_DIM / 2 {
                let src = h * HEAD_DIM + j * HEAD_DIM / 2 + i;
                let dst = h * HEAD_DIM + 2 * i + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn write_gguf(path: &Path, tensors: &[Tensor]) {
    let tensors: Vec<GgufTensor> = tensors
        .iter()
        .map(|(hf, gg, shape, values)| {
            let values = if hf.ends_with("q_proj.weight") {
                permute_rows(values, HEADS, HIDDEN)
            } else if hf.ends_with("k_proj.weight") {
                permute_rows(values, KV_HEADS, HIDDEN)
            } else {
                values.clone()
            };
            let (rows, cols) = match shape[..] {
                [rows, cols] => (rows, cols),
                _ => (1, shape[0]),
            };
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (gg.clone(), rows, cols, 0, bytes) // 0: F32
        })
        .collect();
    let shape = TinyLlama {
        hidden: HIDDEN,
        ffn: FFN,
        layers: LAYERS,
        heads: HEADS,
        kv_heads: KV_HEADS,
        vocab: VOCAB,
    };
    write_llama_gguf(path, &shape, &tensors);
}

fn write_hf_dir(dir: &Path, tensors: &[Tensor]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (hf, _, shape, values) in tensors {
        let start = data.len();
        for v in values {
            data.extend(v.to_le_bytes());
        }
        header.insert(
            hf.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.extend(data);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "vocab_size": VOCAB, "max_position_embeddings": 256,
        "tie_word_embeddings": false
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

fn logits(model: &dyn LanguageModel, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut s = model.new_session(256);
    let out = model
        .forward(&mut [StepItem {
            session: &mut s,
            tokens,
            logits: LogitsMode::All,
        }])
        .unwrap();
    (0..out.lanes()).map(|i| out.lane(i).to_vec()).collect()
}

#[test]
fn gguf_and_safetensors_layouts_agree() {
    let dir: PathBuf = std::env::temp_dir().join(format!("anelm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tensors = random_model();
    let gguf_path = dir.join("tiny.gguf");
    write_gguf(&gguf_path, &tensors);
    write_hf_dir(&dir, &tensors);

    let backend = CpuBackend::new();
    let gguf = Arc::new(GgufFile::open(&gguf_path).unwrap());
    let gcfg = LlamaConfig::from_gguf(&gguf).unwrap();
    let gcfg_precision = gcfg.attention_precision;
    let gstore: Arc<dyn TensorStore> = gguf;
    let gmodel = Llama::load(
        gcfg,
        &gstore,
        &TensorNames::gguf(Family::Llama),
        &backend,
        &mut |_, _| {},
    )
    .unwrap();

    let mut hcfg = LlamaConfig::from_hf(&HfConfig::from_file(&dir.join("config.json")).unwrap()).unwrap();
    // Same attention rounding on both sides, so only the layouts differ.
    hcfg.attention_precision = gcfg_precision;
    let hstore: Arc<dyn TensorStore> = Arc::new(SafetensorsDir::open(&dir).unwrap());
    let hmodel = Llama::load(
        hcfg,
        &hstore,
        &TensorNames::hugging_face(Family::Llama),
        &backend,
        &mut |_, _| {},
    )
    .unwrap();

    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % VOCAB as u32).collect();
    let a = logits(&gmodel, &tokens);
    let b = logits(&hmodel, &tokens);
    let mut worst = 0.0f32;
    for (ra, rb) in a.iter().zip(&b) {
        for (x, y) in ra.iter().zip(rb) {
            worst = worst.max((x - y).abs());
        }
    }
    // Same f32 weights and arithmetic up to summation order: tight agreement. A wrong pairing
    // in either layout moves logits by O(0.1) after a few positions.
    assert!(worst < 1e-3, "layouts disagree by {worst}");
    // And the positions are really mixed by RoPE: the logits change along the sequence.
    assert!(a[1].iter().zip(&a[20]).any(|(x, y)| (x - y).abs() > 1e-2));
    std::fs::remove_dir_all(&dir).ok();
}
