//! The planner's input (`anelm_ane::ModelKernels`) from a model's configuration alone: a Hugging
//! Face `config.json` (or its directory) or a GGUF file's metadata. The kernels are the
//! architecture's own description (`kernel_specs`, which loading compiles); the host-work shapes
//! (`ModelDims`: heads, DeltaNet sizes, sliding window, block layout) come from the same config.
//! No weights are read, so `anelm plan` works on configs of models that are not on disk.

use std::path::Path;

use anelm_ane::{BlockLayout, EncoderDims, LinearAttention, ModelDims, ModelKernel, ModelKernels, SlidingWindow};
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;

use crate::arch::bert::BertConfig;
use crate::arch::gemma3::Gemma3Config;
use crate::arch::kernel_list::KernelDesc;
use crate::arch::llama::LlamaConfig;
use crate::arch::qwen3_5::Qwen35Config;
use crate::arch::tensor_names::{Family, TensorNames};
use crate::error::{EngineError, Result};

/// Architectures the planner's kernel layout describes: every one the loader runs.
const PLANNABLE: &str = "llama (incl. SmolLM2, mistral), qwen3, qwen3_5 (qwen35 in GGUF) and gemma3";

/// What `anelm plan` plans for a model directory, a `config.json`, or a GGUF file: the kernels
/// the architecture's loader compiles (its `kernel_specs`) and the host-work shapes.
pub fn model_kernels(path: &Path) -> Result<ModelKernels> {
    let config = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let is_json = config.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json {
        return kernels_from_hf(&HfConfig::from_file(&config)?);
    }
    kernels_from_gguf(&GgufFile::open(&config)?)
}

/// The host-work shapes of [`model_kernels`] alone.
pub fn model_dims(path: &Path) -> Result<ModelDims> {
    Ok(model_kernels(path)?.dims)
}

/// [`model_kernels`] from a parsed `config.json` (Hugging Face tensor names).
pub fn kernels_from_hf(c: &HfConfig) -> Result<ModelKernels> {
    match c.model_type.as_str() {
        "llama" | "mistral" | "qwen3" => {
            let cfg = LlamaConfig::from_hf(c)?;
            Ok(cfg
                .kernel_specs(&TensorNames::hugging_face(Family::Llama))?
                .model_kernels(dense(&cfg)))
        }
        "qwen3_5" | "qwen3_5_text" => {
            let cfg = Qwen35Config::from_hf(c)?;
            Ok(cfg
                .kernel_specs(&TensorNames::hugging_face(Family::Qwen35))?
                .model_kernels(qwen35(&cfg)?))
        }
        "gemma3" | "gemma3_text" => {
            let cfg = Gemma3Config::from_hf(c)?;
            Ok(cfg
                .kernel_specs(&TensorNames::hugging_face(Family::Gemma3))?
                .model_kernels(gemma3(&cfg)?))
        }
        other => Err(unplannable(other)),
    }
}

/// [`model_kernels`] from a GGUF file's metadata (llama.cpp tensor names).
pub fn kernels_from_gguf(g: &GgufFile) -> Result<ModelKernels> {
    match g.architecture().unwrap_or("") {
        "llama" | "qwen3" => {
            let cfg = LlamaConfig::from_gguf(g)?;
            Ok(cfg
                .kernel_specs(&TensorNames::gguf(Family::Llama))?
                .model_kernels(dense(&cfg)))
        }
        "qwen35" => {
            let cfg = Qwen35Config::from_gguf(g)?;
            Ok(cfg
                .kernel_specs(&TensorNames::gguf(Family::Qwen35))?
                .model_kernels(qwen35(&cfg)?))
        }
        "gemma3" => {
            let cfg = Gemma3Config::from_gguf(g)?;
            Ok(cfg
                .kernel_specs(&TensorNames::gguf(Family::Gemma3))?
                .model_kernels(gemma3(&cfg)?))
        }
        other => Err(unplannable(other)),
    }
}

fn unplannable(arch: &str) -> EngineError {
    EngineError::Config(format!(
        "the ANE planner knows the kernel layout of {PLANNABLE}, not '{arch}'"
    ))
}

fn dense(c: &LlamaConfig) -> ModelDims {
    ModelDims::dense(
        c.hidden_size,
        c.intermediate_size,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.vocab_size,
        c.n_layers,
    )
}

/// The interval of a layer pattern where every `interval`-th layer is the odd one out
/// (`special[i]` false): the planner describes hybrid and sliding-window models this way.
fn pattern_interval(special: &[bool], what: &str) -> Result<usize> {
    let n = special.len();
    let interval = special.iter().position(|&l| !l).map_or(n + 1, |i| i + 1);
    if let Some(i) = (0..n).find(|&i| special[i] != ((i + 1) % interval != 0)) {
        return Err(EngineError::Config(format!(
            "layer {i} breaks the every-{interval}th-layer {what} pattern the planner models; plan a model whose \
             layer_types repeat with one period"
        )));
    }
    Ok(interval)
}

fn gemma3(c: &Gemma3Config) -> Result<ModelDims> {
    let global_every = pattern_interval(&c.sliding, "global-attention")?;
    Ok(ModelDims {
        sliding_window: Some(SlidingWindow {
            window: c.sliding_window,
            global_every,
        }),
        block: BlockLayout::Sandwich,
        ..ModelDims::dense(
            c.hidden_size,
            c.intermediate_size,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab_size,
            c.n_layers(),
        )
    })
}

fn qwen35(c: &Qwen35Config) -> Result<ModelDims> {
    // The planner describes the layer pattern by its full-attention interval.
    let n = c.linear.len();
    let interval = pattern_interval(&c.linear, "full-attention")?;
    let d = c.deltanet;
    Ok(ModelDims {
        attn_output_gate: true,
        linear_attention: Some(LinearAttention {
            key_heads: d.n_k_heads,
            value_heads: d.n_v_heads,
            key_head_dim: d.k_dim,
            value_head_dim: d.v_dim,
            full_attention_interval: interval,
        }),
        ..ModelDims::dense(
            c.hidden_size,
            c.intermediate_size,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab_size,
            n,
        )
    })
}

/// What `anelm plan` plans for a BERT encoder: its shapes and the kernels every layer compiles
/// (`BertConfig::kernel_specs`, which loading compiles), for `anelm_ane::plan_encoder_kernels`.
pub fn encoder_kernels(c: &BertConfig) -> Result<(EncoderDims, Vec<ModelKernel>)> {
    let dims = c.encoder_dims();
    let layers: Vec<Vec<ModelKernel>> = (c.kernel_specs("").iter())
        .map(|l| l.kernels.iter().map(KernelDesc::model_kernel).collect())
        .collect();
    let first = layers
        .first()
        .cloned()
        .ok_or_else(|| EngineError::Config("an encoder with no layers".into()))?;
    // The encoder plan is one layer's kernels times the layer count.
    if layers.iter().any(|l| *l != first) {
        return Err(EngineError::Config(
            "the encoder's layers compile different kernels; the encoder planner models identical layers".into(),
        ));
    }
    Ok((dims, first))
}
