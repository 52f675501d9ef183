//! `CrossEncoder`: a sequence classifier (the files of a sentence-transformers CrossEncoder
//! directory) that reads a query and a document together (`[CLS] query [SEP] document [SEP]`)
//! and gives `num_labels` logits. Two encoders are read:
//! - `BertForSequenceClassification`: token types 0 then 1, the pooler and classifier over
//!   `[CLS]` ([`ClassifierHead`]);
//! - `ModernBertForSequenceClassification` (gte-reranker-modernbert and ModernBERT classifiers):
//!   the encoder on the shared trunk, its states pooled as `classifier_pooling` says, then the
//!   prediction head and classifier ([`ModernBertHead`]).
//!
//! Pairs longer than the model's limit are truncated longest-first, as sentence-transformers
//! truncates them. Many pairs are packed into each forward, unpadded, as the embedder packs texts.

use std::path::Path;
use std::sync::Arc;

use anelm_model::encoder_tokenizer::{EncoderTokenizer, PairEncoding};
use anelm_model::hf_config::HfConfig;
use anelm_model::safetensors_dir::SafetensorsDir;
use anelm_model::tensor_store::TensorStore;
use serde_json::Value;

use crate::arch::bert::{Bert, BertConfig, spans, tensor_prefix};
use crate::arch::bert_head::ClassifierHead;
use crate::arch::modernbert_head::ModernBertHead;
use crate::backend::Backend;
use crate::decoder_embedder::DecoderTrunk;
use crate::embedder::TOKENS_PER_FORWARD;
use crate::error::{EngineError, Result};

/// What turns a one-label cross-encoder's logit into its score (sentence-transformers'
/// `activation_fn`, read from `config.json`'s `sentence_transformers.activation_fn`; its
/// default is the sigmoid for one label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreActivation {
    /// 1 / (1 + e^-x): a relevance probability.
    Sigmoid,
    /// The raw logit.
    Identity,
    /// tanh(x).
    Tanh,
}

impl ScoreActivation {
    /// Apply to one logit.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Self::Sigmoid => sigmoid(x),
            Self::Identity => x,
            Self::Tanh => x.tanh(),
        }
    }
}

/// 1 / (1 + e^-x), computed in f64.
pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-f64::from(x)).exp())) as f32
}

/// Softmax of `logits`, computed in f64.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits.iter().map(|&l| (f64::from(l) - f64::from(max)).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|&e| (e / sum) as f32).collect()
}

/// What a cross-encoder is.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEncoderInfo {
    /// The architecture in `config.json` (`BertForSequenceClassification`,
    /// `ModernBertForSequenceClassification`).
    pub architecture: String,
    /// Label names in logit order (`id2label`).
    pub labels: Vec<String>,
    /// Longest pair in tokens (special tokens included); longer pairs are truncated.
    pub max_tokens: usize,
    /// The activation of a one-label model's score.
    pub activation: ScoreActivation,
}

/// A pair's or text's logits and how many tokens the model read for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    /// One logit per label.
    pub logits: Vec<f32>,
    /// Tokens read (after truncation).
    pub tokens: usize,
}

/// The encoder under the classification head.
enum Network {
    /// BERT, with token types; the pooler and classifier over `[CLS]`.
    Bert {
        model: Box<Bert>,
        head: ClassifierHead,
        /// Most tokens per forward (as the BERT embedder packs them).
        forward_tokens: usize,
    },
    /// ModernBERT on the shared trunk (which packs inputs into forwards itself); token types
    /// are not an input of it.
    ModernBert {
        model: Box<DecoderTrunk>,
        head: ModernBertHead,
    },
}

/// A loaded cross-encoder.
pub struct CrossEncoder {
    network: Network,
    tokenizer: EncoderTokenizer,
    info: CrossEncoderInfo,
}

impl std::fmt::Debug for CrossEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrossEncoder")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// The `architectures` entry of a sequence classifier in `dir/config.json`, if it has one.
pub fn sequence_classifier_architecture(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("architectures")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find(|a| a.ends_with("ForSequenceClassification"))
        .map(str::to_string)
}

impl CrossEncoder {
    /// Whether `path` is a sequence classifier's directory (its `config.json` names a
    /// `…ForSequenceClassification` architecture): the directories [`CrossEncoder::load`] takes
    /// (other encoders than BERT and ModernBERT are refused there, with a message).
    pub fn is_cross_encoder_dir(path: &Path) -> bool {
        path.is_dir() && sequence_classifier_architecture(path).is_some()
    }

    /// Load a sequence classifier's directory, compiling its kernels on `backend`.
    pub fn load(dir: &Path, backend: &dyn Backend) -> Result<Self> {
        Self::load_with_progress(dir, backend, &mut |_, _| {})
    }

    /// [`CrossEncoder::load`], calling `progress(done, total)` after each layer.
    pub fn load_with_progress(
        dir: &Path,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        crate::loader::require_exists(dir)?;
        let architecture = sequence_classifier_architecture(dir).ok_or_else(|| {
            EngineError::Config(format!(
                "{} is not a sequence classifier: its config.json names no …ForSequenceClassification architecture",
                dir.display()
            ))
        })?;
        let hf = HfConfig::from_file(&dir.join("config.json"))?;
        let labels = read_labels(hf.raw())?;
        let activation = read_activation(hf.raw(), labels.len())?;
        let store: Arc<dyn TensorStore> = Arc::new(SafetensorsDir::open(dir)?);
        if !ClassifierHead::present(store.as_ref()) {
            return Err(EngineError::Config(format!(
                "{} has no classifier.weight: it is not a sequence classifier's checkpoint",
                dir.display()
            )));
        }
        let (network, max_tokens, vocab_size) = match hf.model_type.as_str() {
            "bert" => {
                let cfg = BertConfig::from_hf(&hf)?;
                let prefix = tensor_prefix(store.as_ref());
                let head = ClassifierHead::load(&store, prefix, cfg.hidden_size, labels.len())?;
                let model = Bert::load(cfg, &store, backend, progress)?;
                let cfg = model.config();
                let max_tokens = crate::embedder::tokenizer_max_length(dir)
                    .unwrap_or(cfg.max_positions)
                    .min(cfg.max_positions);
                let lanes = model.max_lanes();
                let forward_tokens = if lanes >= max_tokens { lanes } else { TOKENS_PER_FORWARD };
                let vocab = cfg.vocab_size;
                let network = Network::Bert {
                    model: Box::new(model),
                    head,
                    forward_tokens,
                };
                (network, max_tokens, vocab)
            }
            "modernbert" => {
                let model = DecoderTrunk::load(&hf, store.clone(), backend, progress)?;
                let head = ModernBertHead::load(&hf, &store, model.hidden_size(), labels.len())?;
                let ctx = model.context_length().max(2);
                let max_tokens = crate::embedder::tokenizer_max_length(dir).unwrap_or(ctx).min(ctx);
                let vocab = model.vocab_size();
                let network = Network::ModernBert {
                    model: Box::new(model),
                    head,
                };
                (network, max_tokens, vocab)
            }
            other => {
                return Err(EngineError::Config(format!(
                    "cross-encoders of type '{other}' ({architecture}) are not supported: anelm runs \
                     BertForSequenceClassification and ModernBertForSequenceClassification"
                )));
            }
        };
        // No lower-casing of our own: `tokenizer.json`'s normaliser applies `do_lower_case`, as
        // it does for sentence-transformers' CrossEncoder (which adds none either; doing it
        // twice would differ where `str::to_lowercase` does, e.g. a final sigma).
        let tokenizer = EncoderTokenizer::from_dir(dir, max_tokens, false)?;
        crate::embedder::check_vocab(tokenizer.vocab_size(), vocab_size)?;
        Ok(Self {
            network,
            tokenizer,
            info: CrossEncoderInfo {
                architecture,
                labels,
                max_tokens,
                activation,
            },
        })
    }

    /// What the model is.
    pub fn info(&self) -> &CrossEncoderInfo {
        &self.info
    }

    /// Token and type ids of `(query, document)` for each document, truncated longest-first to
    /// `max_tokens`.
    pub fn tokenize_pairs(&self, query: &str, documents: &[&str]) -> Result<Vec<PairEncoding>> {
        let pairs: Vec<(&str, &str)> = documents.iter().map(|d| (query, *d)).collect();
        Ok(self.tokenizer.encode_pairs(&pairs)?)
    }

    /// The logits of each encoded input (pairs, or single texts with type ids all 0), packed
    /// into as few forwards as the token budget allows.
    pub fn logits_of(&self, inputs: &[PairEncoding]) -> Result<Vec<Logits>> {
        let (model, head, forward_tokens) = match &self.network {
            Network::Bert {
                model,
                head,
                forward_tokens,
            } => (model, head, *forward_tokens),
            Network::ModernBert { model, head } => {
                let ids: Vec<&[u32]> = inputs.iter().map(|e| e.ids.as_slice()).collect();
                let pooled = model.embed(&ids, &[head.pooling()])?;
                return Ok(pooled
                    .iter()
                    .zip(inputs)
                    .map(|(p, e)| Logits {
                        logits: head.logits(p),
                        tokens: e.ids.len(),
                    })
                    .collect());
            }
        };
        let mut out = Vec::with_capacity(inputs.len());
        let mut start = 0;
        while start < inputs.len() {
            let mut end = start + 1;
            let mut tokens = inputs[start].ids.len();
            while end < inputs.len() && tokens + inputs[end].ids.len() <= forward_tokens {
                tokens += inputs[end].ids.len();
                end += 1;
            }
            let group = &inputs[start..end];
            let ids: Vec<&[u32]> = group.iter().map(|e| e.ids.as_slice()).collect();
            let types: Vec<&[u32]> = group.iter().map(|e| e.type_ids.as_slice()).collect();
            let states = model.encode_typed(&ids, &types)?;
            for (span, e) in spans(&ids).into_iter().zip(group) {
                out.push(Logits {
                    logits: head.logits(states.lane(span.start)),
                    tokens: e.ids.len(),
                });
            }
            start = end;
        }
        Ok(out)
    }

    /// The logits of `(query, document)` for each document.
    pub fn pair_logits(&self, query: &str, documents: &[&str]) -> Result<Vec<Logits>> {
        let inputs = self.tokenize_pairs(query, documents)?;
        self.logits_of(&inputs)
    }

    /// The relevance score of each document to `query`: with one label, the activation of its
    /// logit (the sigmoid by default: what `CrossEncoder.predict` returns); with two, the
    /// softmax probability of label 1 (binary relevance classifiers put "relevant" there).
    /// Models with more labels have no single relevance score: use [`Self::classify_pairs`].
    pub fn rerank(&self, query: &str, documents: &[&str]) -> Result<Vec<Logits>> {
        let labels = self.info.labels.len();
        if labels > 2 {
            return Err(EngineError::InvalidRequest(format!(
                "this sequence classifier has {labels} labels, so no single relevance score: classify with it instead"
            )));
        }
        let mut out = self.pair_logits(query, documents)?;
        for l in &mut out {
            let score = match l.logits.as_slice() {
                [x] => self.info.activation.apply(*x),
                many => softmax(many).get(1).copied().unwrap_or(0.0),
            };
            l.logits = vec![score];
        }
        Ok(out)
    }

    /// Each label's probability for each text (one text, no pair): the softmax over the
    /// logits, or with one label the sigmoid of its logit.
    pub fn classify(&self, texts: &[&str]) -> Result<Vec<Logits>> {
        let ids = self.tokenizer.encode_batch(texts)?;
        let inputs: Vec<PairEncoding> = ids
            .into_iter()
            .map(|ids| PairEncoding {
                type_ids: vec![0; ids.len()],
                ids,
            })
            .collect();
        let mut out = self.logits_of(&inputs)?;
        for l in &mut out {
            l.logits = probabilities(&l.logits);
        }
        Ok(out)
    }

    /// [`Self::classify`] over `(query, document)` pairs.
    pub fn classify_pairs(&self, query: &str, documents: &[&str]) -> Result<Vec<Logits>> {
        let mut out = self.pair_logits(query, documents)?;
        for l in &mut out {
            l.logits = probabilities(&l.logits);
        }
        Ok(out)
    }
}

/// Label probabilities from logits: sigmoid for one label, softmax otherwise.
fn probabilities(logits: &[f32]) -> Vec<f32> {
    match logits {
        [x] => vec![sigmoid(*x)],
        many => softmax(many),
    }
}

/// Label names in logit order: `id2label` (keys "0".."n-1"), or `num_labels` generic names
/// (`LABEL_i`, as transformers names them), or transformers' default of two.
fn read_labels(raw: &Value) -> Result<Vec<String>> {
    let bad = |m: String| Err(EngineError::Config(m));
    if let Some(map) = raw.get("id2label").and_then(Value::as_object) {
        let n = map.len();
        if n == 0 || n > 4096 {
            return bad(format!("config.json's id2label has {n} labels"));
        }
        let mut labels = vec![None; n];
        for (k, v) in map {
            let i = k.parse::<usize>().ok().filter(|&i| i < n);
            let name = v.as_str();
            match (i, name) {
                (Some(i), Some(name)) => labels[i] = Some(name.to_string()),
                _ => return bad(format!("config.json's id2label has a bad entry '{k}': {v}")),
            }
        }
        let labels: Option<Vec<String>> = labels.into_iter().collect();
        return labels.ok_or_else(|| EngineError::Config("config.json's id2label skips an index".into()));
    }
    let n = match raw.get("num_labels") {
        None | Some(Value::Null) => 2,
        Some(v) => match v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| (1..=4096).contains(n))
        {
            Some(n) => n,
            None => return bad(format!("config.json's num_labels {v} is not a count of labels")),
        },
    };
    Ok((0..n).map(|i| format!("LABEL_{i}")).collect())
}

/// `sentence_transformers.activation_fn` (or the pre-4.0 `sbert_ce_default_activation_function`)
/// of `config.json`; sentence-transformers' default otherwise (sigmoid for one label).
fn read_activation(raw: &Value, labels: usize) -> Result<ScoreActivation> {
    let path = raw
        .get("sentence_transformers")
        .and_then(|s| s.get("activation_fn"))
        .or_else(|| raw.get("sbert_ce_default_activation_function"))
        .and_then(Value::as_str);
    let Some(path) = path else {
        return Ok(if labels == 1 {
            ScoreActivation::Sigmoid
        } else {
            ScoreActivation::Identity
        });
    };
    match path.rsplit('.').next().unwrap_or_default() {
        "Sigmoid" => Ok(ScoreActivation::Sigmoid),
        "Identity" => Ok(ScoreActivation::Identity),
        "Tanh" => Ok(ScoreActivation::Tanh),
        other => Err(EngineError::Config(format!(
            "the cross-encoder's activation_fn '{other}' is not supported (Sigmoid, Identity, Tanh)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_come_from_id2label_or_num_labels() {
        let l = read_labels(&json!({"id2label": {"1": "yes", "0": "no"}})).unwrap();
        assert_eq!(l, ["no", "yes"]);
        assert_eq!(read_labels(&json!({"num_labels": 1})).unwrap(), ["LABEL_0"]);
        assert_eq!(read_labels(&json!({})).unwrap().len(), 2);
        assert!(read_labels(&json!({"id2label": {"0": "a", "2": "b"}})).is_err());
        assert!(read_labels(&json!({"num_labels": 0})).is_err());
    }

    #[test]
    fn activation_follows_sentence_transformers() {
        let sig = json!({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}});
        assert_eq!(read_activation(&sig, 1).unwrap(), ScoreActivation::Sigmoid);
        let id = json!({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"});
        assert_eq!(read_activation(&id, 1).unwrap(), ScoreActivation::Identity);
        assert_eq!(read_activation(&json!({}), 1).unwrap(), ScoreActivation::Sigmoid);
        assert_eq!(read_activation(&json!({}), 3).unwrap(), ScoreActivation::Identity);
        let odd = json!({"sentence_transformers": {"activation_fn": "torch.nn.Softsign"}});
        assert!(read_activation(&odd, 1).is_err());
    }

    #[test]
    fn softmax_and_sigmoid() {
        let p = softmax(&[0.0, 0.0]);
        assert_eq!(p, vec![0.5, 0.5]);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
        let p = softmax(&[1000.0, 0.0]);
        assert!((p[0] - 1.0).abs() < 1e-7);
    }
}
