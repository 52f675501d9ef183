//! Every decoder architecture anelm runs, one [`Architecture`] entry each: the names its files
//! carry and what to do with them — load it (with or without its LM head, so any decoder can be
//! an embedder or a reranker), and describe its kernels and host shapes for `anelm plan`. The
//! loader, the planner's input and the embedders all look architectures up here; adding one is
//! its own file (its config reader, layers and entry) and a line in [`ARCHITECTURES`].

use std::sync::Arc;

use anelm_ane::{ModelDims, ModelKernels};
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;

use crate::arch::decoder::{Decoder, DecoderLayers};
use crate::arch::kernel_list::KernelList;
use crate::arch::tensor_names::{Family, Layout, TensorNames};
use crate::arch::{gemma3, lfm2, llama, modernbert, qwen3_5};
use crate::backend::Backend;
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::expert_slices::ExpertSlices;
use crate::model::{LanguageModel, StepItem};

/// A loaded decoder: a language model whose trunk can also give its final hidden states.
pub trait DecoderModel: LanguageModel {
    /// The final-normed hidden states of the rows the items ask for (what an embedder pools).
    fn hidden_states(&self, items: &mut [StepItem<'_>]) -> Result<Batch>;

    /// Whether attention sees later positions too (an encoder such as EmbeddingGemma).
    fn bidirectional(&self) -> bool;
}

impl<L: DecoderLayers> DecoderModel for Decoder<L> {
    fn hidden_states(&self, items: &mut [StepItem<'_>]) -> Result<Batch> {
        Decoder::hidden_states(self, items)
    }

    fn bidirectional(&self) -> bool {
        Decoder::bidirectional(self)
    }
}

/// Whether to compile the LM head (a chat model) or stop at the final norm (an embedder's trunk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// With the LM head.
    Logits,
    /// Without it: [`LanguageModel::forward`] fails, [`DecoderModel::hidden_states`] works.
    HiddenStates,
}

/// Progress callback of a load: `(done, total)` after each layer.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize);

/// A loaded decoder, or why not.
pub type Loaded = Result<Box<dyn DecoderModel>>;

/// Loads a GGUF file: `(file, backend, head, progress)`.
pub type LoadGguf = fn(&Arc<GgufFile>, &dyn Backend, Head, Progress<'_>) -> Loaded;

/// Loads a Hugging Face directory's tensors: `(config, tensors, backend, head, progress)`.
pub type LoadHf = fn(&HfConfig, &Arc<dyn TensorStore>, &dyn Backend, Head, Progress<'_>) -> Loaded;

/// One architecture.
pub struct Architecture {
    /// Its name as users know it (for messages).
    pub name: &'static str,
    /// The `general.architecture` values of its GGUF files.
    pub gguf_names: &'static [&'static str],
    /// The `model_type` values of its Hugging Face configs.
    pub hf_model_types: &'static [&'static str],
    /// Load a GGUF file.
    pub load_gguf: LoadGguf,
    /// Load a Hugging Face directory's tensors with its parsed `config.json`.
    pub load_hf: LoadHf,
    /// The kernels and host shapes `anelm plan` plans, from a GGUF file's metadata.
    pub kernels_gguf: fn(&GgufFile) -> Result<ModelKernels>,
    /// The same from a `config.json`.
    pub kernels_hf: fn(&HfConfig) -> Result<ModelKernels>,
}

/// What an architecture's configuration gives the registry's shared loaders ([`load_gguf`],
/// [`load_hf`], [`kernels_gguf`], [`kernels_hf`]), so an entry is only its names and these.
pub trait DecoderConfig: Sized {
    /// The architecture's layers.
    type Layers: DecoderLayers + 'static;
    /// Its tensor-name family.
    fn family(&self) -> Family;
    /// From a GGUF file's metadata.
    fn read_gguf(g: &GgufFile) -> Result<Self>;
    /// From a Hugging Face `config.json`.
    fn read_hf(c: &HfConfig) -> Result<Self>;
    /// The kernels loading compiles and the planner plans.
    fn kernels(&self, names: &TensorNames) -> Result<KernelList>;
    /// The planner's host-work shapes, or why the planner does not take this model.
    fn host_dims(&self) -> Result<ModelDims>;
    /// Load the model from `store`.
    fn load(
        self,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        head: Head,
        progress: Progress<'_>,
    ) -> Result<Decoder<Self::Layers>>;
}

/// `impl DecoderConfig` for a configuration type `$cfg` whose inherent `from_gguf`, `from_hf`,
/// `kernel_specs` and `plan_dims` have the trait's signatures and whose model type
/// `Decoder<$layers>` has `load_with`: the one spelling of that glue for every architecture.
macro_rules! decoder_config {
    ($cfg:ty, $layers:ty, $family:expr) => {
        impl $crate::arch::registry::DecoderConfig for $cfg {
            type Layers = $layers;
            fn family(&self) -> $crate::arch::tensor_names::Family {
                ($family)(self)
            }

            fn read_gguf(g: &anelm_model::gguf::GgufFile) -> $crate::error::Result<Self> {
                Self::from_gguf(g)
            }

            fn read_hf(c: &anelm_model::hf_config::HfConfig) -> $crate::error::Result<Self> {
                Self::from_hf(c)
            }

            fn kernels(
                &self,
                names: &$crate::arch::tensor_names::TensorNames,
            ) -> $crate::error::Result<$crate::arch::kernel_list::KernelList> {
                self.kernel_specs(names)
            }

            fn host_dims(&self) -> $crate::error::Result<anelm_ane::ModelDims> {
                self.plan_dims()
            }

            fn load(
                self,
                store: &std::sync::Arc<dyn anelm_model::tensor_store::TensorStore>,
                names: &$crate::arch::tensor_names::TensorNames,
                backend: &dyn $crate::backend::Backend,
                head: $crate::arch::registry::Head,
                progress: $crate::arch::registry::Progress<'_>,
            ) -> $crate::error::Result<$crate::arch::decoder::Decoder<$layers>> {
                $crate::arch::decoder::Decoder::<$layers>::load_with(self, store, names, backend, head, progress)
            }
        }
    };
}
pub(crate) use decoder_config;

/// [`Architecture::load_gguf`] for configurations of type `C`.
pub fn load_gguf<C: DecoderConfig>(
    g: &Arc<GgufFile>,
    backend: &dyn Backend,
    head: Head,
    progress: Progress<'_>,
) -> Loaded {
    let cfg = C::read_gguf(g)?;
    // llama.cpp stacks a mixture of experts' matrices into 3-D tensors: each expert is then
    // also its own matrix.
    let store = ExpertSlices::over(g.clone());
    let names = TensorNames::gguf(cfg.family());
    Ok(Box::new(cfg.load(&store, &names, backend, head, progress)?))
}

/// [`Architecture::load_hf`] for configurations of type `C` (the text model under
/// `model.language_model.` in a multimodal checkpoint, else `model.`).
pub fn load_hf<C: DecoderConfig>(
    c: &HfConfig,
    store: &Arc<dyn TensorStore>,
    backend: &dyn Backend,
    head: Head,
    progress: Progress<'_>,
) -> Loaded {
    let cfg = C::read_hf(c)?;
    let names = TensorNames::new(cfg.family(), Layout::HuggingFace(hf_text_prefix(store).into()));
    Ok(Box::new(cfg.load(store, &names, backend, head, progress)?))
}

/// [`Architecture::kernels_gguf`] for configurations of type `C`.
pub fn kernels_gguf<C: DecoderConfig>(g: &GgufFile) -> Result<ModelKernels> {
    let cfg = C::read_gguf(g)?;
    Ok(cfg
        .kernels(&TensorNames::gguf(cfg.family()))?
        .model_kernels(cfg.host_dims()?))
}

/// [`Architecture::kernels_hf`] for configurations of type `C`.
pub fn kernels_hf<C: DecoderConfig>(c: &HfConfig) -> Result<ModelKernels> {
    let cfg = C::read_hf(c)?;
    Ok(cfg
        .kernels(&TensorNames::hugging_face(cfg.family()))?
        .model_kernels(cfg.host_dims()?))
}

/// Every decoder architecture, in the order messages list them.
pub static ARCHITECTURES: &[&Architecture] = &[
    &llama::ARCHITECTURE,
    &gemma3::ARCHITECTURE,
    &qwen3_5::ARCHITECTURE,
    &lfm2::ARCHITECTURE,
    &modernbert::ARCHITECTURE,
];

/// The architecture of a GGUF file's `general.architecture`.
pub fn for_gguf(name: &str) -> Result<&'static Architecture> {
    ARCHITECTURES
        .iter()
        .copied()
        .find(|a| a.gguf_names.contains(&name))
        .ok_or_else(|| unsupported(name))
}

/// The architecture of a Hugging Face `model_type`.
pub fn for_hf(model_type: &str) -> Result<&'static Architecture> {
    ARCHITECTURES
        .iter()
        .copied()
        .find(|a| a.hf_model_types.contains(&model_type))
        .ok_or_else(|| unsupported(model_type))
}

/// Whether `model_type` names a decoder architecture anelm runs.
pub fn is_hf_decoder(model_type: &str) -> bool {
    for_hf(model_type).is_ok()
}

/// The error for an architecture no entry names, listing the ones that exist.
fn unsupported(name: &str) -> EngineError {
    let known: Vec<String> = ARCHITECTURES
        .iter()
        .map(|a| format!("{} ({})", a.name, a.hf_model_types.join(", ")))
        .collect();
    EngineError::UnsupportedArchitecture {
        name: name.to_string(),
        known: known.join("; "),
    }
}

/// Where a Hugging Face checkpoint keeps its text model's tensors: under `model.language_model.`
/// in a multimodal checkpoint, `model.` in a causal LM's, and at the top for a bare base model
/// (a sentence-transformers encoder such as ModernBERT).
pub(crate) fn hf_text_prefix(store: &Arc<dyn TensorStore>) -> &'static str {
    if store.contains("model.language_model.embed_tokens.weight") {
        "model.language_model."
    } else if store.tensor_names().iter().any(|n| n.starts_with("model.")) {
        "model."
    } else {
        ""
    }
}
