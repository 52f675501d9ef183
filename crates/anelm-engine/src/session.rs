//! `Session`: the state of one stream — its tokens so far and the per-layer caches — so a
//! conversation can continue without re-reading its history.

use crate::kv_cache::KvCache;

/// One stream's state. Positions `0..len()` are in the caches.
#[derive(Clone, Debug)]
pub struct Session {
    pub(crate) kv: KvCache,
    tokens: Vec<u32>,
    ctx_size: usize,
}

impl Session {
    /// A fresh session holding up to `ctx_size` positions.
    pub fn new(kv: KvCache, ctx_size: usize) -> Self {
        Self {
            kv,
            tokens: Vec::new(),
            ctx_size,
        }
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

    /// Forget every position at or after `len` (rewind to a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.kv.truncate(len);
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Bytes of cached state.
    pub fn state_bytes(&self) -> usize {
        self.kv.bytes()
    }

    pub(crate) fn push_tokens(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }
}
