//! Per-session KV cache for attention layers: f16-rounded values in f32 storage, grown on demand
//! up to the session's context size.

/// Keys and values of one attention layer, one row of `kv_dim` floats per position.
#[derive(Clone, Debug, Default)]
pub struct KvLayer {
    /// Keys, position-major.
    pub k: Vec<f32>,
    /// Values, position-major.
    pub v: Vec<f32>,
}

/// The KV cache of one session across all attention layers.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// One entry per attention layer.
    pub layers: Vec<KvLayer>,
    kv_dim: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of `kv_dim` floats per position.
    pub fn new(n_layers: usize, kv_dim: usize) -> Self {
        Self {
            layers: vec![KvLayer::default(); n_layers],
            kv_dim,
        }
    }

    /// Floats per position per layer.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Drop every position at or after `len`.
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.k.truncate(len * self.kv_dim);
            l.v.truncate(len * self.kv_dim);
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| 4 * (l.k.len() + l.v.len())).sum()
    }
}
