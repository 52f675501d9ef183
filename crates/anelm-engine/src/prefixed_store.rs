//! A tensor store whose names gain a prefix: sentence-transformers saves a decoder embedder's
//! trunk as a bare `Qwen3Model` (`layers.0.…`, `embed_tokens.weight`), while the decoder
//! loaders read Hugging Face causal-LM names (`model.layers.0.…`). Wrapping the directory in a
//! `PrefixedStore` with `model.` lets the one loader read both.

use std::sync::Arc;

use anelm_model::error::ModelError;
use anelm_model::tensor_store::{TensorStore, TensorView};

/// `inner`'s tensors, each also reachable as `prefix + name`.
pub struct PrefixedStore {
    inner: Arc<dyn TensorStore>,
    prefix: String,
    names: Vec<String>,
}

impl PrefixedStore {
    /// Wrap `inner` so that `prefix + name` finds its tensor `name`.
    pub fn new(inner: Arc<dyn TensorStore>, prefix: &str) -> Self {
        let names = inner.tensor_names().iter().map(|n| format!("{prefix}{n}")).collect();
        Self {
            inner,
            prefix: prefix.to_string(),
            names,
        }
    }

    fn inner_name<'a>(&self, name: &'a str) -> &'a str {
        name.strip_prefix(self.prefix.as_str()).unwrap_or(name)
    }
}

impl TensorStore for PrefixedStore {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        self.inner.tensor(self.inner_name(name))
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(self.inner_name(name))
    }

    fn tensor_names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn read_into(&self, bytes: &[u8], out: &mut [u8]) {
        self.inner.read_into(bytes, out);
    }
}
