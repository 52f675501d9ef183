//! `Session`: the state of one stream — its tokens so far and the per-layer caches (KV for
//! attention layers, conv + recurrent state for linear-attention layers) — so a conversation can
//! continue without re-reading its history.

use crate::kv_cache::KvCache;

/// The state a linear-attention (Gated DeltaNet) layer carries from token to token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecurrentLayer {
    /// The last `kernel − 1` conv inputs, oldest first, `conv_dim` floats each.
    pub conv: Vec<f32>,
    /// Per value head a `[dk][dv]` matrix, heads in order.
    pub state: Vec<f32>,
}

impl RecurrentLayer {
    /// Zeroed state: `conv_len` conv floats and `state_len` recurrent floats.
    pub fn zeros(conv_len: usize, state_len: usize) -> Self {
        Self {
            conv: vec![0.0; conv_len],
            state: vec![0.0; state_len],
        }
    }

    fn reset(&mut self) {
        self.conv.fill(0.0);
        self.state.fill(0.0);
    }
}

/// One stream's state. Positions `0..len()` are in the caches.
#[derive(Clone, Debug)]
pub struct Session {
    pub(crate) kv: KvCache,
    /// One entry per layer for hybrid models (empty for attention layers), else empty.
    pub(crate) recurrent: Vec<RecurrentLayer>,
    tokens: Vec<u32>,
    ctx_size: usize,
}

impl Session {
    /// A fresh session holding up to `ctx_size` positions.
    pub fn new(kv: KvCache, ctx_size: usize) -> Self {
        Self::with_recurrent(kv, Vec::new(), ctx_size)
    }

    /// A fresh session of a hybrid model: KV cache plus per-layer recurrent state.
    pub fn with_recurrent(kv: KvCache, recurrent: Vec<RecurrentLayer>, ctx_size: usize) -> Self {
        Self {
            kv,
            recurrent,
            tokens: Vec::new(),
            ctx_size,
        }
    }

    /// Whether the session carries recurrent state, which cannot be rewound to an earlier
    /// position (only reset): see [`Session::truncate`].
    pub fn is_recurrent(&self) -> bool {
        self.recurrent.iter().any(|r| !r.state.is_empty())
    }

    /// Tokens whose state is cached.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Most positions this session holds.
    pub fn ctx_size(&self) -> usize {
        self.ctx_size
    }

    /// Forget every position at or after `len` (rewind to a shared prefix) and return how many
    /// positions are kept. Recurrent state cannot be rewound, so a recurrent session asked to
    /// drop anything starts over from position 0 (the return value says so).
    pub fn truncate(&mut self, len: usize) -> usize {
        let len = if len < self.tokens.len() && self.is_recurrent() {
            0
        } else {
            len
        };
        self.tokens.truncate(len);
        self.kv.truncate(len);
        if len == 0 {
            self.recurrent.iter_mut().for_each(RecurrentLayer::reset);
        }
        self.tokens.len()
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Bytes of cached state.
    pub fn state_bytes(&self) -> usize {
        self.kv.bytes()
            + self
                .recurrent
                .iter()
                .map(|r| 4 * (r.conv.len() + r.state.len()))
                .sum::<usize>()
    }

    pub(crate) fn push_tokens(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }
}
