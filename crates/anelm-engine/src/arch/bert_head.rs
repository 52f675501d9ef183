//! The sequence-classification head of `BertForSequenceClassification` (cross-encoders):
//! the pooler (`dense` + tanh over the `[CLS]` state) and the `classifier` dense layer to
//! `num_labels` logits. Both are small (one row per input), so they run on the CPU in f32.

use std::sync::Arc;

use anelm_model::tensor_store::TensorStore;

use crate::arch::bert_tensors::BertTensor;
use crate::arch::trunk::f32_matrix;
use crate::error::Result;

/// `classifier.weight` / `classifier.bias`: outside the encoder's `bert.` prefix.
const CLASSIFIER_WEIGHT: &str = "classifier.weight";
const CLASSIFIER_BIAS: &str = "classifier.bias";

/// A loaded pooler + classifier.
pub struct ClassifierHead {
    hidden: usize,
    labels: usize,
    pooler_w: Vec<f32>,
    pooler_b: Vec<f32>,
    classifier_w: Vec<f32>,
    classifier_b: Vec<f32>,
}

impl ClassifierHead {
    /// Whether `store` holds a classification head (`classifier.weight`).
    pub fn present(store: &dyn TensorStore) -> bool {
        store.contains(CLASSIFIER_WEIGHT)
    }

    /// Load the pooler under `prefix` (`"bert."`) and the classifier, checking their shapes
    /// against `hidden` and `labels`.
    pub fn load(store: &Arc<dyn TensorStore>, prefix: &str, hidden: usize, labels: usize) -> Result<Self> {
        let read = |name: &str, rows: usize, cols: usize| f32_matrix(store, name, rows, cols);
        Ok(Self {
            hidden,
            labels,
            pooler_w: read(&BertTensor::PoolerWeight.hf_name(prefix), hidden, hidden)?,
            pooler_b: read(&BertTensor::PoolerBias.hf_name(prefix), 1, hidden)?,
            classifier_w: read(CLASSIFIER_WEIGHT, labels, hidden)?,
            classifier_b: read(CLASSIFIER_BIAS, 1, labels)?,
        })
    }

    /// Number of logits.
    pub fn labels(&self) -> usize {
        self.labels
    }

    /// The logits of one input from its `[CLS]` state: `W_c · tanh(W_p · cls + b_p) + b_c`.
    pub fn logits(&self, cls: &[f32]) -> Vec<f32> {
        let pooled: Vec<f32> = affine(&self.pooler_w, &self.pooler_b, cls, self.hidden)
            .into_iter()
            .map(f32::tanh)
            .collect();
        affine(&self.classifier_w, &self.classifier_b, &pooled, self.hidden)
    }
}

/// `W · x + b` for a row-major `W` of `b.len()` rows of `cols` values (f64 sums).
pub(crate) fn affine(w: &[f32], b: &[f32], x: &[f32], cols: usize) -> Vec<f32> {
    w.chunks_exact(cols)
        .zip(b)
        .map(|(row, &bias)| {
            let dot: f64 = row.iter().zip(x).map(|(&a, &v)| f64::from(a) * f64::from(v)).sum();
            (dot + f64::from(bias)) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_is_a_matrix_vector_product() {
        let w = [1.0, 2.0, -1.0, 0.5];
        assert_eq!(affine(&w, &[0.5, -1.0], &[3.0, 4.0], 2), vec![11.5, -2.0]);
    }
}
