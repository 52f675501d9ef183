//! The planner's input (`anelm_ane::ModelKernels`) from a model's configuration alone: a Hugging
//! Face `config.json` (or its directory) or a GGUF file's metadata. Each architecture's registry
//! entry ([`crate::arch::registry`]) describes it: the kernels are its own list (`kernel_specs`,
//! which loading compiles), the host-work shapes (`ModelDims`) come from the same config.
//! No weights are read, so `anelm plan` works on configs of models that are not on disk.

use std::path::Path;

use anelm_ane::{EncoderDims, ModelDims, ModelKernel, ModelKernels};
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;

use crate::arch::bert::BertConfig;
use crate::arch::kernel_list::KernelDesc;
use crate::arch::registry;
use crate::error::{EngineError, Result};

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
    (registry::for_hf(&c.model_type)?.kernels_hf)(c)
}

/// [`model_kernels`] from a GGUF file's metadata (llama.cpp tensor names).
pub fn kernels_from_gguf(g: &GgufFile) -> Result<ModelKernels> {
    (registry::for_gguf(g.architecture().unwrap_or(""))?.kernels_gguf)(g)
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
