//! Opening a model from disk: a GGUF file or a Hugging Face safetensors directory, with its
//! tokenizer and chat template, compiled on a backend.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anelm_model::chat_template::{ChatMessage, ChatTemplate, load_hf_chat_template};
use anelm_model::error::ModelError;
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::safetensors_dir::SafetensorsDir;
use anelm_model::tensor_store::TensorStore;
use anelm_model::tokenizer::{GgufVocab, Tokenizer};

use crate::arch::registry::{self, Head};
use crate::backend::Backend;
use crate::constraint::{Constraint, ConstraintError, ConstraintFactory, Grammar};
use crate::error::{EngineError, Result};
use crate::model::LanguageModel;
use crate::tools::{self, ToolSpec};

/// What kind of file a model came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A single GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face directory with safetensors shards.
    SafetensorsDir(PathBuf),
}

/// A model ready to run: forward, tokenizer, chat template.
pub struct LoadedModel {
    /// The forward pass on its backend.
    pub model: Box<dyn LanguageModel>,
    /// Text ↔ tokens.
    pub tokenizer: Tokenizer,
    /// Renders conversations into prompts.
    pub template: ChatTemplate,
    /// Whether `template` came from the model (false: the plain fallback).
    pub has_own_template: bool,
    /// Where it came from.
    pub source: ModelSource,
    /// The grammar compiler for this tokenizer, built on first use (see [`Self::constraints`]).
    pub constraint_factory: OnceLock<std::result::Result<ConstraintFactory, String>>,
}

impl LoadedModel {
    /// The grammar compiler for this model's vocabulary (constrained decoding), built on first use:
    /// it indexes the whole vocabulary once.
    pub fn constraints(&self) -> Result<&ConstraintFactory> {
        self.constraint_factory
            .get_or_init(|| ConstraintFactory::new(&self.tokenizer).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| EngineError::Constraint(ConstraintError::Tokenizer(e.clone())))
    }

    /// The prompt for a conversation (ending in the assistant's turn): the chat template with
    /// `kwargs` (e.g. `enable_thinking`), and `tools` laid out by the template where it takes
    /// them, otherwise by anelm's generic tool prompt (see [`crate::tools`]). The one place
    /// every front end assembles a chat prompt.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        if !tools.is_empty() && !self.template.takes_tools() {
            return Ok(self
                .template
                .render(&tools::with_generic_tool_prompt(messages, tools), true, kwargs)?);
        }
        let list: Vec<serde_json::Value> = tools.iter().map(ToolSpec::to_openai).collect();
        let listed = (!list.is_empty()).then_some(list.as_slice());
        Ok(self
            .template
            .render_with_tools(&tools::with_argument_objects(messages), listed, true, kwargs)?)
    }

    /// A fresh constraint for one stream that must match `grammar`.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint> {
        Ok(self.constraints()?.compile(grammar)?)
    }
}

/// Build the tokenizer a GGUF file describes.
pub fn gguf_tokenizer(g: &GgufFile) -> Result<Tokenizer> {
    let tokens = g
        .get_string_array("tokenizer.ggml.tokens")
        .ok_or_else(|| EngineError::Config("the GGUF file has no tokenizer (tokenizer.ggml.tokens missing)".into()))?;
    let token_types = g.get_i32_array("tokenizer.ggml.token_type");
    let scores = g.get_f32_array("tokenizer.ggml.scores");
    let id = |k: &str| g.get_u32(k);
    let vocab = GgufVocab {
        model: g.get_str("tokenizer.ggml.model").unwrap_or("gpt2"),
        pre: g.get_str("tokenizer.ggml.pre"),
        tokens,
        token_types: token_types.as_deref(),
        merges: g.get_string_array("tokenizer.ggml.merges"),
        scores: scores.as_deref(),
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
        eot: id("tokenizer.ggml.eot_token_id"),
        eom: id("tokenizer.ggml.eom_token_id"),
        unk: id("tokenizer.ggml.unknown_token_id"),
        pad: id("tokenizer.ggml.padding_token_id"),
        add_bos: g.get_bool("tokenizer.ggml.add_bos_token"),
        add_eos: g.get_bool("tokenizer.ggml.add_eos_token"),
        add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix"),
    };
    Ok(Tokenizer::from_gguf_vocab(&vocab)?)
}

fn template_or_fallback(source: Option<String>, tok: &Tokenizer) -> Result<(ChatTemplate, bool)> {
    match source {
        Some(s) => Ok((ChatTemplate::new(&s, tok.bos_token(), tok.eos_token())?, true)),
        None => Ok((ChatTemplate::fallback(), false)),
    }
}

/// Open the model at `path` (GGUF file or safetensors directory) and compile it on `backend`.
/// `progress(done, total)` reports compilation per layer.
pub fn load_model(path: &Path, backend: &dyn Backend, progress: &mut dyn FnMut(usize, usize)) -> Result<LoadedModel> {
    if path.is_dir() {
        let config = HfConfig::from_file(&path.join("config.json"))?;
        let tokenizer = Tokenizer::from_hf_dir(path)?;
        let (template, has_own_template) = template_or_fallback(load_hf_chat_template(path)?, &tokenizer)?;
        let model = hf_model(path, &config, backend, progress)?;
        return Ok(LoadedModel {
            model,
            tokenizer,
            template,
            has_own_template,
            source: ModelSource::SafetensorsDir(path.to_path_buf()),
            constraint_factory: OnceLock::new(),
        });
    }
    let gguf = open_gguf(path)?;
    let tokenizer = gguf_tokenizer(&gguf)?;
    let (template, has_own_template) =
        template_or_fallback(gguf.get_str("tokenizer.chat_template").map(str::to_string), &tokenizer)?;
    let model = gguf_model(&gguf, backend, progress)?;
    Ok(LoadedModel {
        model,
        tokenizer,
        template,
        has_own_template,
        source: ModelSource::Gguf(path.to_path_buf()),
        constraint_factory: OnceLock::new(),
    })
}

/// Open only the forward pass of the model at `path`, without its tokenizer or chat template:
/// enough for token-id-level work such as `anelm logits` and numerical tests, and the way to run
/// a safetensors directory that has no `tokenizer.json`.
pub fn load_model_weights(
    path: &Path,
    backend: &dyn Backend,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn LanguageModel>> {
    if path.is_dir() {
        let config = HfConfig::from_file(&path.join("config.json"))?;
        return hf_model(path, &config, backend, progress);
    }
    gguf_model(&open_gguf(path)?, backend, progress)
}

fn open_gguf(path: &Path) -> Result<Arc<GgufFile>> {
    require_exists(path)?;
    Ok(Arc::new(GgufFile::open(path)?))
}

/// A "no such file or directory" error naming `path` when nothing is there (before anything
/// tries to read it as one kind of model or another).
pub(crate) fn require_exists(path: &Path) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    Err(EngineError::Model(ModelError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
    }))
}

fn gguf_model(
    gguf: &Arc<GgufFile>,
    backend: &dyn Backend,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn LanguageModel>> {
    let arch = registry::for_gguf(gguf.architecture().unwrap_or(""))?;
    Ok((arch.load_gguf)(gguf, backend, Head::Logits, progress)?)
}

fn hf_model(
    dir: &Path,
    config: &HfConfig,
    backend: &dyn Backend,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn LanguageModel>> {
    let arch = registry::for_hf(&config.model_type)?;
    let store: Arc<dyn TensorStore> = Arc::new(SafetensorsDir::open(dir)?);
    Ok((arch.load_hf)(config, &store, backend, Head::Logits, progress)?)
}
