//! `config.json` of a Hugging Face model: the common hyper-parameters, typed,
//! plus the merged raw object for architecture-specific keys.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::ModelError;

/// config.json of a HF model. For multimodal checkpoints whose text model sits
/// under `text_config`, the text part is used (keys of `text_config` override
/// the top level; `model_type` of the text config wins).
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// `model_type`, e.g. `llama`, `qwen3`, `qwen3_5_text`.
    pub model_type: String,
    /// `architectures`, e.g. `["LlamaForCausalLM"]` (empty if absent).
    pub architectures: Vec<String>,
    /// Model width.
    pub hidden_size: Option<usize>,
    /// FFN inner width.
    pub intermediate_size: Option<usize>,
    /// Number of decoder layers.
    pub num_hidden_layers: Option<usize>,
    /// Number of query heads.
    pub num_attention_heads: Option<usize>,
    /// Number of key/value heads (GQA).
    pub num_key_value_heads: Option<usize>,
    /// Per-head dimension, when not `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: Option<f64>,
    /// RoPE base (`rope_theta`, or `rope_parameters.rope_theta`).
    pub rope_theta: Option<f64>,
    /// Fraction of each head that is rotated (`partial_rotary_factor`, also
    /// under `rope_parameters`).
    pub partial_rotary_factor: Option<f64>,
    /// Vocabulary size.
    pub vocab_size: Option<usize>,
    /// Whether the LM head shares the embedding matrix.
    pub tie_word_embeddings: Option<bool>,
    /// Trained context length.
    pub max_position_embeddings: Option<usize>,
    /// Sliding-window size for local attention layers.
    pub sliding_window: Option<usize>,
    /// Beginning-of-sequence token id.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token ids (`eos_token_id` may be an int or a list).
    pub eos_token_ids: Vec<u32>,
    /// Padding token id.
    pub pad_token_id: Option<u32>,
    /// Activation function name, e.g. `silu`.
    pub hidden_act: Option<String>,
    /// Stored weight dtype (`torch_dtype`, or `dtype` in newer configs).
    pub torch_dtype: Option<String>,
    /// Per-layer kinds (`layer_types`, e.g. `linear_attention` / `full_attention`).
    pub layer_types: Vec<String>,
    raw: Value,
}

impl HfConfig {
    /// Reads and parses `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses the text of a `config.json`.
    pub fn from_json_str(s: &str) -> Result<Self, ModelError> {
        Self::parse(s, Path::new("config.json"))
    }

    /// The merged text-model object, for architecture-specific keys.
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    fn parse(text: &str, path: &Path) -> Result<Self, ModelError> {
        let value: Value = serde_json::from_str(text).map_err(|source| ModelError::Json {
            path: PathBuf::from(path),
            source,
        })?;
        let Value::Object(top) = value else {
            return Err(ModelError::Invalid {
                file: path.display().to_string(),
                what: "the top level is not a JSON object; this is not a model config".to_string(),
            });
        };
        let merged = merge_text_config(top, path)?;
        let m = &merged;
        let model_type = string(m, "model_type")?.ok_or_else(|| ModelError::MissingKey {
            key: "model_type".to_string(),
        })?;
        let rope_params = m.get("rope_parameters").and_then(Value::as_object);
        let rope_theta = match float(m, "rope_theta")? {
            Some(t) => Some(t),
            None => match rope_params {
                Some(p) => rope_param(p, "rope_theta")?,
                None => None,
            },
        };
        let partial_rotary_factor = match float(m, "partial_rotary_factor")? {
            Some(t) => Some(t),
            None => match rope_params {
                Some(p) => rope_param(p, "partial_rotary_factor")?,
                None => None,
            },
        };
        let torch_dtype = match string(m, "torch_dtype")? {
            Some(d) => Some(d),
            None => string(m, "dtype")?,
        };
        Ok(Self {
            model_type,
            architectures: string_list(m, "architectures")?,
            hidden_size: uint(m, "hidden_size")?,
            intermediate_size: uint(m, "intermediate_size")?,
            num_hidden_layers: uint(m, "num_hidden_layers")?,
            num_attention_heads: uint(m, "num_attention_heads")?,
            num_key_value_heads: uint(m, "num_key_value_heads")?,
            head_dim: uint(m, "head_dim")?,
            rms_norm_eps: float(m, "rms_norm_eps")?,
            rope_theta,
            partial_rotary_factor,
            vocab_size: uint(m, "vocab_size")?,
            tie_word_embeddings: boolean(m, "tie_word_embeddings")?,
            max_position_embeddings: uint(m, "max_position_embeddings")?,
            sliding_window: uint(m, "sliding_window")?,
            bos_token_id: token_id(m, "bos_token_id")?,
            eos_token_ids: token_ids(m, "eos_token_id")?,
            pad_token_id: token_id(m, "pad_token_id")?,
            hidden_act: string(m, "hidden_act")?,
            torch_dtype,
            layer_types: string_list(m, "layer_types")?,
            raw: Value::Object(merged),
        })
    }
}

/// The top level with `text_config`'s keys laid over it (and `text_config`
/// itself removed).
fn merge_text_config(mut top: Map<String, Value>, path: &Path) -> Result<Map<String, Value>, ModelError> {
    match top.remove("text_config") {
        None | Some(Value::Null) => Ok(top),
        Some(Value::Object(text)) => {
            for (k, v) in text {
                top.insert(k, v);
            }
            Ok(top)
        }
        Some(other) => Err(ModelError::Invalid {
            file: path.display().to_string(),
            what: format!("`text_config` is {other}, not an object; the config is corrupt"),
        }),
    }
}

fn bad(key: &str, what: impl Into<String>) -> ModelError {
    ModelError::BadValue {
        key: key.to_string(),
        what: what.into(),
    }
}

/// A present, non-null value.
fn present<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn uint(m: &Map<String, Value>, key: &str) -> Result<Option<usize>, ModelError> {
    present(m, key)
        .map(|v| {
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad(key, format!("{v} is not a non-negative integer")))
        })
        .transpose()
}

fn float(m: &Map<String, Value>, key: &str) -> Result<Option<f64>, ModelError> {
    present(m, key)
        .map(|v| v.as_f64().ok_or_else(|| bad(key, format!("{v} is not a number"))))
        .transpose()
}

fn rope_param(p: &Map<String, Value>, key: &str) -> Result<Option<f64>, ModelError> {
    let full_key = format!("rope_parameters.{key}");
    if let Some(v) = present(p, key) {
        return v
            .as_f64()
            .map(Some)
            .ok_or_else(|| bad(&full_key, format!("{v} is not a number")));
    }
    // Per-layer-kind parameters (e.g. Gemma 3: `full_attention`, `sliding_attention`):
    // the global (full attention) one describes the model.
    match p.get("full_attention").and_then(Value::as_object) {
        Some(full) => float(full, key),
        None => Ok(None),
    }
}

fn boolean(m: &Map<String, Value>, key: &str) -> Result<Option<bool>, ModelError> {
    present(m, key)
        .map(|v| v.as_bool().ok_or_else(|| bad(key, format!("{v} is not true or false"))))
        .transpose()
}

fn string(m: &Map<String, Value>, key: &str) -> Result<Option<String>, ModelError> {
    present(m, key)
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(key, format!("{v} is not a string")))
        })
        .transpose()
}

fn string_list(m: &Map<String, Value>, key: &str) -> Result<Vec<String>, ModelError> {
    match present(m, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(key, format!("element {v} is not a string")))
            })
            .collect(),
        Some(v) => Err(bad(key, format!("{v} is not a list of strings"))),
    }
}

fn as_token_id(key: &str, v: &Value) -> Result<u32, ModelError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(key, format!("{v} is not a token id (a non-negative 32-bit integer)")))
}

fn token_id(m: &Map<String, Value>, key: &str) -> Result<Option<u32>, ModelError> {
    present(m, key).map(|v| as_token_id(key, v)).transpose()
}

fn token_ids(m: &Map<String, Value>, key: &str) -> Result<Vec<u32>, ModelError> {
    match present(m, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|v| as_token_id(key, v)).collect(),
        Some(v) => Ok(vec![as_token_id(key, v)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_types_are_errors_naming_the_key() {
        let e = HfConfig::from_json_str(r#"{"model_type":"llama","hidden_size":"big"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_size"), "{e}");
        let e = HfConfig::from_json_str(r#"{"model_type":"llama","eos_token_id":[1,-2]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("eos_token_id"), "{e}");
    }

    #[test]
    fn missing_model_type_is_missing_key() {
        let e = HfConfig::from_json_str(r#"{"hidden_size":8}"#).unwrap_err();
        assert!(
            matches!(e, ModelError::MissingKey { ref key } if key == "model_type"),
            "{e}"
        );
    }

    #[test]
    fn non_object_and_bad_json_are_errors() {
        assert!(matches!(
            HfConfig::from_json_str("[1,2]"),
            Err(ModelError::Invalid { .. })
        ));
        assert!(matches!(
            HfConfig::from_json_str("{\"model_type\":"),
            Err(ModelError::Json { .. })
        ));
        assert!(matches!(
            HfConfig::from_json_str(r#"{"model_type":"x","text_config":3}"#),
            Err(ModelError::Invalid { .. })
        ));
    }

    #[test]
    fn nulls_are_absent_and_dtype_fallback() {
        let c =
            HfConfig::from_json_str(r#"{"model_type":"qwen3","head_dim":null,"eos_token_id":null,"dtype":"bfloat16"}"#)
                .unwrap();
        assert_eq!(c.head_dim, None);
        assert!(c.eos_token_ids.is_empty());
        assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn gemma_style_per_layer_rope_parameters() {
        let c = HfConfig::from_json_str(
            r#"{"model_type":"gemma3_text","rope_parameters":{
                "full_attention":{"rope_theta":1000000.0},
                "sliding_attention":{"rope_theta":10000.0}}}"#,
        )
        .unwrap();
        assert_eq!(c.rope_theta, Some(1_000_000.0));
    }
}
