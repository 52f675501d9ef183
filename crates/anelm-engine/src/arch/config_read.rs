//! Reading and checking a model's hyper-parameters, shared by every architecture's config: a
//! required key that is missing is an error naming it, GGUF keys are read under the file's
//! architecture prefix, and the checks every decoder makes (heads, positive sizes, plausible
//! counts) have one wording.

use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;

use crate::error::{EngineError, Result};

/// `v`, or an error saying the model's metadata lacks `key`.
pub(crate) fn need<T>(v: Option<T>, key: &str) -> Result<T> {
    v.ok_or_else(|| EngineError::Config(format!("missing '{key}' in the model's metadata")))
}

/// A GGUF file's hyper-parameters under its architecture prefix (`llama.block_count`).
pub(crate) struct GgufMeta<'a> {
    g: &'a GgufFile,
    arch: String,
}

impl<'a> GgufMeta<'a> {
    /// Keys under the file's `general.architecture`, or `default_arch` when it has none.
    pub(crate) fn new(g: &'a GgufFile, default_arch: &str) -> Self {
        Self {
            g,
            arch: g.architecture().unwrap_or(default_arch).to_string(),
        }
    }

    /// The architecture prefix.
    pub(crate) fn arch(&self) -> &str {
        &self.arch
    }

    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required unsigned key.
    pub(crate) fn usize(&self, k: &str) -> Result<usize> {
        let key = self.key(k);
        need(self.g.get_u64(&key), &key).map(|v| v as usize)
    }

    /// An optional unsigned key.
    pub(crate) fn opt_usize(&self, k: &str) -> Option<usize> {
        self.g.get_u64(&self.key(k)).map(|v| v as usize)
    }

    /// An optional float key.
    pub(crate) fn opt_f32(&self, k: &str) -> Option<f32> {
        self.g.get_f32(&self.key(k))
    }

    /// An optional boolean-array key.
    pub(crate) fn opt_bool_array(&self, k: &str) -> Option<&'a [bool]> {
        self.g.get_bool_array(&self.key(k))
    }

    /// Which of `n_layers` layers attend within the sliding window, as llama.cpp's
    /// `load_swa_pattern` reads `attention.sliding_window_pattern`: one flag per layer, or a
    /// period `p` (`default_period` when absent) in which one layer is global — the last of each
    /// `p`, or with `dense_first` the first.
    pub(crate) fn sliding_layers(
        &self,
        n_layers: usize,
        default_period: usize,
        dense_first: bool,
    ) -> Result<Vec<bool>> {
        const KEY: &str = "attention.sliding_window_pattern";
        if let Some(flags) = self.opt_bool_array(KEY) {
            if flags.len() != n_layers {
                return Err(EngineError::Config(format!(
                    "{KEY} flags {} layers but the model has {n_layers}",
                    flags.len()
                )));
            }
            return Ok(flags.to_vec());
        }
        let p = self.opt_usize(KEY).unwrap_or(default_period).max(1);
        Ok((0..n_layers)
            .map(|i| if dense_first { i % p != 0 } else { (i + 1) % p != 0 })
            .collect())
    }

    /// Query heads (`attention.head_count`, required and non-zero).
    pub(crate) fn heads(&self) -> Result<usize> {
        let n = self.usize("attention.head_count")?;
        if n == 0 {
            return Err(EngineError::Config("attention.head_count is 0".into()));
        }
        Ok(n)
    }

    /// Width of one head: `attention.key_length`, else hidden / heads.
    pub(crate) fn head_dim(&self, hidden: usize, heads: usize) -> usize {
        self.opt_usize("attention.key_length").unwrap_or(hidden / heads.max(1))
    }

    /// The vocabulary: `vocab_size`, else the tokenizer's token count.
    pub(crate) fn vocab(&self) -> Result<usize> {
        match self.opt_usize("vocab_size") {
            Some(v) => Ok(v),
            None => Ok(need(
                self.g.get_string_array("tokenizer.ggml.tokens"),
                "tokenizer.ggml.tokens",
            )?
            .len()),
        }
    }
}

/// An error unless `n_heads` is a positive multiple of a positive `n_kv_heads` (GQA).
pub(crate) fn check_heads(n_heads: usize, n_kv_heads: usize) -> Result<()> {
    if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(EngineError::Config(
            "query heads must be a positive multiple of key/value heads".into(),
        ));
    }
    Ok(())
}

/// An error unless the hidden size, vocabulary and layer count are positive.
pub(crate) fn check_sizes(hidden: usize, vocab: usize, layers: usize) -> Result<()> {
    if hidden == 0 || vocab == 0 || layers == 0 {
        return Err(EngineError::Config(
            "hidden size, vocabulary and layer count must be positive".into(),
        ));
    }
    Ok(())
}

/// An error when the counts are too large for any real model: the file is corrupt, and
/// allocating for it would exhaust memory.
pub(crate) fn check_plausible(layers: usize, heads: usize, head_dim: usize) -> Result<()> {
    if layers > 4096 || heads > 4096 || head_dim > 8192 {
        return Err(EngineError::Config(
            "implausibly large layer/head counts: the file is corrupt".into(),
        ));
    }
    Ok(())
}

/// Query heads of a `config.json` (`num_attention_heads`, required and non-zero).
pub(crate) fn hf_heads(c: &HfConfig) -> Result<usize> {
    let n = need(c.num_attention_heads, "num_attention_heads")?;
    if n == 0 {
        return Err(EngineError::Config("num_attention_heads is 0".into()));
    }
    Ok(n)
}

/// Per layer, whether `config.json`'s `layer_types` names it `marked` (`sliding_attention`,
/// `linear_attention`, `conv`): `None` when the config lists no layer types, an error when it
/// lists another number of layers than `n_layers`.
pub(crate) fn hf_layer_flags(c: &HfConfig, n_layers: usize, marked: &str) -> Result<Option<Vec<bool>>> {
    if c.layer_types.is_empty() {
        return Ok(None);
    }
    if c.layer_types.len() != n_layers {
        return Err(EngineError::Config(format!(
            "layer_types lists {} layers but num_hidden_layers is {n_layers}",
            c.layer_types.len()
        )));
    }
    Ok(Some(c.layer_types.iter().map(|t| t == marked).collect()))
}
