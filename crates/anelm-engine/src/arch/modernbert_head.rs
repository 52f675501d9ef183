//! The sequence-classification head of `ModernBertForSequenceClassification` (rerankers such as
//! gte-reranker-modernbert, and classifiers): the encoder's final states pooled
//! (`classifier_pooling`: the `[CLS]` state or the mean over the input), then transformers'
//! prediction head — `dense` (bias when `classifier_bias`), `classifier_activation`, a LayerNorm
//! — and the `classifier` layer to `num_labels` logits. One row per input, so it runs on the
//! CPU in f32.

use std::sync::Arc;

use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;
use serde_json::Value;

use crate::arch::bert_head::affine;
use crate::arch::trunk::f32_matrix;
use crate::error::{EngineError, Result};
use crate::ops::{gelu_erf, gelu_tanh, layer_norm, silu};
use crate::pooling::PoolingMode;

const DENSE_WEIGHT: &str = "head.dense.weight";
const DENSE_BIAS: &str = "head.dense.bias";
const NORM_WEIGHT: &str = "head.norm.weight";
const NORM_BIAS: &str = "head.norm.bias";
const CLASSIFIER_WEIGHT: &str = "classifier.weight";
const CLASSIFIER_BIAS: &str = "classifier.bias";

/// `classifier_activation`, as transformers' `ACT2FN` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Activation {
    GeluErf,
    GeluTanh,
    Relu,
    Silu,
    Tanh,
}

impl Activation {
    fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "gelu" => Self::GeluErf,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Self::GeluTanh,
            "relu" => Self::Relu,
            "silu" | "swish" => Self::Silu,
            "tanh" => Self::Tanh,
            other => {
                return Err(EngineError::Config(format!(
                    "classifier_activation '{other}' is not supported (gelu, gelu_pytorch_tanh, gelu_new, relu, silu, tanh)"
                )));
            }
        })
    }

    fn apply(self, x: f32) -> f32 {
        match self {
            Self::GeluErf => gelu_erf(x),
            Self::GeluTanh => gelu_tanh(x),
            Self::Relu => x.max(0.0),
            Self::Silu => silu(x),
            Self::Tanh => x.tanh(),
        }
    }
}

/// A loaded ModernBERT classification head.
pub struct ModernBertHead {
    hidden: usize,
    pooling: PoolingMode,
    activation: Activation,
    eps: f32,
    dense_w: Vec<f32>,
    dense_b: Vec<f32>,
    norm_w: Vec<f32>,
    norm_b: Vec<f32>,
    classifier_w: Vec<f32>,
    classifier_b: Vec<f32>,
}

impl ModernBertHead {
    /// Read the head's settings from `config.json` and its tensors from `store`, checking their
    /// shapes against `hidden` and `labels`. An absent `head.dense.bias` / `head.norm.bias` is
    /// zero (`classifier_bias` and `norm_bias` false, as the published models have them); a
    /// config that asks for one the checkpoint lacks is refused.
    pub fn load(hf: &HfConfig, store: &Arc<dyn TensorStore>, hidden: usize, labels: usize) -> Result<Self> {
        let raw = hf.raw();
        let pooling = match raw.get("classifier_pooling").and_then(Value::as_str).unwrap_or("cls") {
            "cls" => PoolingMode::Cls,
            "mean" => PoolingMode::Mean,
            other => {
                return Err(EngineError::Config(format!(
                    "classifier_pooling '{other}' is not one transformers defines (cls or mean)"
                )));
            }
        };
        let activation = Activation::from_name(
            raw.get("classifier_activation")
                .and_then(Value::as_str)
                .unwrap_or("gelu"),
        )?;
        let eps = raw.get("norm_eps").and_then(Value::as_f64).unwrap_or(1e-5) as f32;
        let read = |name: &str, rows: usize, cols: usize| f32_matrix(store, name, rows, cols);
        let optional = |name: &str, flag: &str| -> Result<Vec<f32>> {
            let wanted = raw.get(flag).and_then(Value::as_bool) == Some(true);
            match (store.contains(name), wanted) {
                (true, _) => read(name, 1, hidden),
                (false, false) => Ok(vec![0.0; hidden]),
                (false, true) => Err(EngineError::Config(format!(
                    "config.json sets {flag} but the checkpoint has no {name}"
                ))),
            }
        };
        Ok(Self {
            hidden,
            pooling,
            activation,
            eps,
            dense_w: read(DENSE_WEIGHT, hidden, hidden)?,
            dense_b: optional(DENSE_BIAS, "classifier_bias")?,
            norm_w: read(NORM_WEIGHT, 1, hidden)?,
            norm_b: optional(NORM_BIAS, "norm_bias")?,
            classifier_w: read(CLASSIFIER_WEIGHT, labels, hidden)?,
            classifier_b: read(CLASSIFIER_BIAS, 1, labels)?,
        })
    }

    /// How the encoder's states are pooled before the head.
    pub fn pooling(&self) -> PoolingMode {
        self.pooling
    }

    /// The logits of one input from its pooled state: `W_c · LayerNorm(act(W_d · x + b_d)) + b_c`.
    pub fn logits(&self, pooled: &[f32]) -> Vec<f32> {
        let dense: Vec<f32> = affine(&self.dense_w, &self.dense_b, pooled, self.hidden)
            .into_iter()
            .map(|v| self.activation.apply(v))
            .collect();
        let mut normed = vec![0.0; self.hidden];
        layer_norm(&dense, &self.norm_w, &self.norm_b, self.eps, &mut normed);
        affine(&self.classifier_w, &self.classifier_b, &normed, self.hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_follow_transformers_names() {
        assert_eq!(Activation::from_name("gelu").unwrap(), Activation::GeluErf);
        assert_eq!(
            Activation::from_name("gelu_pytorch_tanh").unwrap(),
            Activation::GeluTanh
        );
        assert_eq!(Activation::Relu.apply(-2.0), 0.0);
        assert!((Activation::Tanh.apply(0.5) - 0.5f32.tanh()).abs() < 1e-7);
        let err = Activation::from_name("softsign").unwrap_err().to_string();
        assert!(err.contains("softsign") && err.contains("gelu"), "{err}");
    }
}
