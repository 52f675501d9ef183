//! The sentence-transformers files of an embedding model directory: `modules.json` (the module
//! pipeline), the pooling module's `config.json`, and `sentence_bert_config.json`
//! (`max_seq_length`, `do_lower_case`). Read here, interpreted by the engine's embedder.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::ModelError;

/// One way of pooling token states into a sentence vector (sentence-transformers' pooling modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first token's state (`[CLS]`).
    Cls,
    /// Element-wise maximum over the tokens.
    Max,
    /// Mean over the tokens.
    Mean,
    /// Sum over the tokens divided by the square root of their count.
    MeanSqrtLen,
    /// The last token's state (decoder embedders).
    LastToken,
}

impl PoolingMode {
    /// The modes in the order sentence-transformers concatenates them when several are on.
    pub const ORDER: [PoolingMode; 5] = [Self::Cls, Self::Max, Self::Mean, Self::MeanSqrtLen, Self::LastToken];

    /// The `pooling_mode_*` flag of this mode in `1_Pooling/config.json`.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Cls => "pooling_mode_cls_token",
            Self::Max => "pooling_mode_max_tokens",
            Self::Mean => "pooling_mode_mean_tokens",
            Self::MeanSqrtLen => "pooling_mode_mean_sqrt_len_tokens",
            Self::LastToken => "pooling_mode_lasttoken",
        }
    }

    /// The short name (`pooling_mode` in newer configs, GGUF `pooling_type` names).
    pub fn name(self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Max => "max",
            Self::Mean => "mean",
            Self::MeanSqrtLen => "mean_sqrt_len_tokens",
            Self::LastToken => "lasttoken",
        }
    }
}

/// What a sentence-transformers directory says about turning token states into embeddings.
#[derive(Clone, Debug, PartialEq)]
pub struct SentenceConfig {
    /// Pooling modes that are on, in concatenation order (never empty).
    pub pooling: Vec<PoolingMode>,
    /// Dense projections after pooling, in order (EmbeddingGemma's 768 → 3072 → 768).
    pub dense: Vec<DenseLayer>,
    /// Whether a `Normalize` module follows pooling (unit-length vectors).
    pub normalize: bool,
    /// Longest input in tokens (special tokens included); longer inputs are truncated.
    pub max_seq_length: Option<usize>,
    /// Lower-case texts before tokenizing (`do_lower_case`).
    pub do_lower_case: bool,
    /// Named prompts (instruction prefixes) of `config_sentence_transformers.json`, e.g.
    /// `query` → "Instruct: …\nQuery: ", sorted by name.
    pub prompts: Vec<(String, String)>,
    /// The prompt sentence-transformers prepends when the caller names none
    /// (`default_prompt_name`).
    pub default_prompt_name: Option<String>,
    /// Whether the pooling module pools over a prompt's tokens too (`include_prompt`, default
    /// true).
    pub include_prompt: bool,
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, what: impl Into<String>) -> ModelError {
    ModelError::Invalid {
        file: path.display().to_string(),
        what: what.into(),
    }
}

impl SentenceConfig {
    /// Read `modules.json` and the files it points to in `dir`. `Ok(None)` when the directory
    /// has no `modules.json` (not a sentence-transformers directory).
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, ModelError> {
        let modules_path = dir.join("modules.json");
        if !modules_path.is_file() {
            return Ok(None);
        }
        let modules = read_json(&modules_path)?;
        let modules = modules
            .as_array()
            .ok_or_else(|| invalid(&modules_path, "expected a list of modules"))?;
        let mut pooling_dir: Option<PathBuf> = None;
        let mut normalize = false;
        let mut saw_transformer = false;
        let mut dense = Vec::new();
        for m in modules {
            let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
            let kind = ty.rsplit('.').next().unwrap_or_default();
            let sub = m.get("path").and_then(Value::as_str).unwrap_or_default();
            if sub.split(['/', '\\']).any(|part| part == "..") {
                return Err(invalid(
                    &modules_path,
                    format!("module path '{sub}' leaves the directory"),
                ));
            }
            match kind {
                "Transformer" => saw_transformer = true,
                "Pooling" => pooling_dir = Some(dir.join(sub)),
                "Dense" if pooling_dir.is_some() && !normalize => dense.push(DenseLayer::read(&dir.join(sub))?),
                "Dense" => {
                    return Err(invalid(
                        &modules_path,
                        "a Dense module must come after Pooling and before Normalize",
                    ));
                }
                "Normalize" => normalize = true,
                other => {
                    return Err(invalid(
                        &modules_path,
                        format!(
                            "module type '{other}' is not supported (anelm runs Transformer, Pooling, Dense and Normalize); use a model without it"
                        ),
                    ));
                }
            }
        }
        if !saw_transformer {
            return Err(invalid(&modules_path, "no Transformer module"));
        }
        let pooling_dir =
            pooling_dir.ok_or_else(|| invalid(&modules_path, "no Pooling module: anelm needs one to make a vector"))?;
        let pooling_config = pooling_dir.join("config.json");
        let pooling = read_pooling(&pooling_config)?;
        let include_prompt = read_json(&pooling_config)?
            .get("include_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let sbert = dir.join("sentence_bert_config.json");
        let (max_seq_length, do_lower_case) = if sbert.is_file() {
            let v = read_json(&sbert)?;
            let max = match v.get("max_seq_length") {
                None | Some(Value::Null) => None,
                Some(x) => Some(
                    x.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| n >= 2)
                        .ok_or_else(|| invalid(&sbert, "max_seq_length must be an integer of at least 2"))?,
                ),
            };
            (max, v.get("do_lower_case").and_then(Value::as_bool).unwrap_or(false))
        } else {
            (None, false)
        };
        let (prompts, default_prompt_name) = read_prompts(&dir.join("config_sentence_transformers.json"))?;
        Ok(Some(Self {
            pooling,
            dense,
            normalize,
            max_seq_length,
            do_lower_case,
            prompts,
            default_prompt_name,
            include_prompt,
        }))
    }
}

/// The activation of a Dense module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseActivation {
    /// `torch.nn.Identity` (EmbeddingGemma).
    Identity,
    /// `torch.nn.Tanh` (sentence-transformers' default).
    Tanh,
}

/// A sentence-transformers Dense module: `y = act(W·x + b)` on the pooled vector.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseLayer {
    /// Input width.
    pub in_features: usize,
    /// Output width.
    pub out_features: usize,
    /// `out_features × in_features`, row-major, f32.
    pub weight: Vec<f32>,
    /// `out_features` values, when the module has a bias.
    pub bias: Option<Vec<f32>>,
    /// The activation.
    pub activation: DenseActivation,
}

impl DenseLayer {
    /// The module in `dir`: `config.json` (`in_features`, `out_features`, `bias`,
    /// `activation_function`) and `model.safetensors` (`linear.weight`, `linear.bias`).
    pub fn read(dir: &Path) -> Result<Self, ModelError> {
        use crate::tensor_store::TensorStore;
        let config = dir.join("config.json");
        let v = read_json(&config)?;
        let size = |k: &str| {
            v.get(k)
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0 && n <= 1 << 20)
                .ok_or_else(|| invalid(&config, format!("{k} must be a positive integer")))
        };
        let (in_features, out_features) = (size("in_features")?, size("out_features")?);
        let activation = match v.get("activation_function").and_then(Value::as_str) {
            Some("torch.nn.modules.linear.Identity") => DenseActivation::Identity,
            None | Some("torch.nn.modules.activation.Tanh") => DenseActivation::Tanh,
            Some(other) => {
                return Err(invalid(
                    &config,
                    format!("activation_function '{other}' is not supported (Identity or Tanh)"),
                ));
            }
        };
        let store = crate::safetensors_dir::SafetensorsDir::open(dir)?;
        let read = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            let t = store.tensor(name)?;
            if t.n_elements() != len {
                return Err(invalid(
                    &dir.join("model.safetensors"),
                    format!("{name} has shape {:?}, expected {len} values", t.shape),
                ));
            }
            let mut out = vec![0f32; len];
            anelm_kernels::dequantize_row(t.format, t.data, &mut out)
                .map_err(|e| invalid(&dir.join("model.safetensors"), format!("{name}: {e}")))?;
            Ok(out)
        };
        let weight = read("linear.weight", out_features * in_features)?;
        let bias = if v.get("bias").and_then(Value::as_bool).unwrap_or(true) {
            Some(read("linear.bias", out_features)?)
        } else {
            None
        };
        Ok(Self {
            in_features,
            out_features,
            weight,
            bias,
            activation,
        })
    }

    /// `act(W·x + b)`; `x` must be `in_features` long.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        (self.weight.chunks_exact(self.in_features).enumerate())
            .map(|(o, w)| {
                let mut y: f32 = w.iter().zip(x).map(|(a, b)| a * b).sum();
                if let Some(b) = &self.bias {
                    y += b[o];
                }
                match self.activation {
                    DenseActivation::Identity => y,
                    DenseActivation::Tanh => y.tanh(),
                }
            })
            .collect()
    }
}

/// Named prompts: (name, text).
type Prompts = Vec<(String, String)>;

/// `prompts` and `default_prompt_name` of `config_sentence_transformers.json` (none when the
/// file is absent).
fn read_prompts(path: &Path) -> Result<(Prompts, Option<String>), ModelError> {
    if !path.is_file() {
        return Ok((Vec::new(), None));
    }
    let v = read_json(path)?;
    let mut prompts = Vec::new();
    match v.get("prompts") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, text) in map {
                let text = text
                    .as_str()
                    .ok_or_else(|| invalid(path, format!("prompt '{name}' is not a string")))?;
                prompts.push((name.clone(), text.to_string()));
            }
        }
        Some(_) => return Err(invalid(path, "prompts must be an object of name → text")),
    }
    let default = match v.get("default_prompt_name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => {
            if !prompts.iter().any(|(n, _)| n == name) {
                return Err(invalid(path, format!("default_prompt_name '{name}' names no prompt")));
            }
            Some(name.clone())
        }
        Some(_) => return Err(invalid(path, "default_prompt_name must be a string")),
    };
    Ok((prompts, default))
}

/// The pooling modes of a Pooling module's `config.json`: the `pooling_mode_*` flags, or a
/// `pooling_mode` name.
fn read_pooling(path: &Path) -> Result<Vec<PoolingMode>, ModelError> {
    let v = read_json(path)?;
    if v.get("pooling_mode_weightedmean_tokens").and_then(Value::as_bool) == Some(true) {
        return Err(invalid(path, "weighted-mean pooling is not supported"));
    }
    let mut modes: Vec<PoolingMode> = PoolingMode::ORDER
        .into_iter()
        .filter(|m| v.get(m.flag()).and_then(Value::as_bool) == Some(true))
        .collect();
    if modes.is_empty()
        && let Some(name) = v.get("pooling_mode").and_then(Value::as_str)
    {
        let mode = PoolingMode::ORDER
            .into_iter()
            .find(|m| m.name() == name || (name == "mean_sqrt_len" && *m == PoolingMode::MeanSqrtLen))
            .ok_or_else(|| invalid(path, format!("pooling_mode '{name}' is not supported")))?;
        modes.push(mode);
    }
    if modes.is_empty() {
        return Err(invalid(path, "no pooling mode is on"));
    }
    Ok(modes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A throwaway model directory with these modules (each `(type, path)`).
    fn model_dir(tag: &str, modules: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("anelm-st-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1_Pooling")).expect("mkdir");
        std::fs::write(
            dir.join("1_Pooling/config.json"),
            r#"{"pooling_mode_mean_tokens": true}"#,
        )
        .expect("write");
        let list: Vec<Value> = (modules.iter().enumerate())
            .map(|(i, (ty, path))| serde_json::json!({"idx": i, "name": i.to_string(), "path": path, "type": ty}))
            .collect();
        std::fs::write(dir.join("modules.json"), Value::Array(list).to_string()).expect("write");
        dir
    }

    fn dense_dir(dir: &Path, sub: &str, activation: &str) {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).expect("mkdir");
        let cfg =
            serde_json::json!({"in_features": 2, "out_features": 1, "bias": true, "activation_function": activation});
        std::fs::write(d.join("config.json"), cfg.to_string()).expect("write");
        // safetensors: linear.weight [1, 2] = (0.5, -1), linear.bias [1] = 0.25, F32.
        let header = r#"{"linear.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"linear.bias":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend(header.as_bytes());
        for v in [0.5f32, -1.0, 0.25] {
            file.extend(v.to_le_bytes());
        }
        std::fs::write(d.join("model.safetensors"), file).expect("write");
    }

    #[test]
    fn dense_modules_load_in_order_and_apply() {
        let dir = model_dir(
            "dense",
            &[
                ("Transformer", ""),
                ("Pooling", "1_Pooling"),
                ("Dense", "2_Dense"),
                ("Normalize", "3_Normalize"),
            ],
        );
        dense_dir(&dir, "2_Dense", "torch.nn.modules.activation.Tanh");
        let c = SentenceConfig::from_dir(&dir)
            .expect("config")
            .expect("a sentence-transformers dir");
        assert_eq!(c.dense.len(), 1);
        let y = c.dense[0].apply(&[2.0, 0.5]);
        assert!((y[0] - (0.5f32 * 2.0 - 0.5 + 0.25).tanh()).abs() < 1e-7, "{y:?}");
        assert!(c.normalize);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_dense_module_out_of_place_or_with_an_unknown_activation_is_refused() {
        let dir = model_dir(
            "order",
            &[("Transformer", ""), ("Dense", "2_Dense"), ("Pooling", "1_Pooling")],
        );
        dense_dir(&dir, "2_Dense", "torch.nn.modules.linear.Identity");
        let err = SentenceConfig::from_dir(&dir)
            .expect_err("Dense before Pooling")
            .to_string();
        assert!(err.contains("after Pooling"), "{err}");
        let dir2 = model_dir(
            "act",
            &[("Transformer", ""), ("Pooling", "1_Pooling"), ("Dense", "2_Dense")],
        );
        dense_dir(&dir2, "2_Dense", "torch.nn.modules.activation.ReLU");
        let err = SentenceConfig::from_dir(&dir2).expect_err("ReLU").to_string();
        assert!(err.contains("ReLU"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&dir2);
    }
}
