//! `Session`: the state of one stream — its tokens so far and the per-layer caches (KV for
//! attention layers, conv + recurrent state for linear-attention layers) — so a conversation can
//! continue without re-reading its history.

use crate::arch::deltanet::LaneTrace;
use crate::kv_cache::KvCache;

/// The state a linear-attention (Gated DeltaNet) layer carries from token to token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecurrentLayer {
    /// The last `kernel − 1` conv inputs, oldest first, `conv_dim` floats each.
    pub conv: Vec<f32>,
    /// Per value head a `[dk][dv]` matrix, heads in order.
    pub state: Vec<f32>,
    /// While a speculative pass runs: each lane's inputs to the recurrence, so the state can be
    /// advanced again over only the lanes the pass keeps ([`LaneTrace`]).
    pub(crate) trace: Option<LaneTrace>,
}

impl RecurrentLayer {
    /// Zeroed state: `conv_len` conv floats and `state_len` recurrent floats.
    pub fn zeros(conv_len: usize, state_len: usize) -> Self {
        Self {
            conv: vec![0.0; conv_len],
            state: vec![0.0; state_len],
            trace: None,
        }
    }

    /// Whether the layer carries nothing from token to token (an attention layer's entry).
    pub fn is_stateless(&self) -> bool {
        self.conv.is_empty() && self.state.is_empty()
    }

    fn reset(&mut self) {
        self.conv.fill(0.0);
        self.state.fill(0.0);
        self.trace = None;
    }
}

/// The recurrent state as it was after the first `len` positions: recurrent state cannot be
/// rewound, so a hybrid session saves it at the end of each prompt and a later request sharing
/// at least that prefix (the next turn of a chat) restarts from there instead of from position 0.
#[derive(Clone, Debug)]
struct Checkpoint {
    len: usize,
    recurrent: Vec<RecurrentLayer>,
}

/// One stream's state. Positions `0..len()` are in the caches.
#[derive(Clone, Debug)]
pub struct Session {
    pub(crate) kv: KvCache,
    /// One entry per layer for hybrid models (empty for attention layers), else empty.
    pub(crate) recurrent: Vec<RecurrentLayer>,
    tokens: Vec<u32>,
    ctx_size: usize,
    checkpoint: Option<Checkpoint>,
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
            checkpoint: None,
        }
    }

    /// Whether the session carries recurrent state, which cannot be rewound to an earlier
    /// position (only reset): see [`Session::truncate`].
    pub fn is_recurrent(&self) -> bool {
        self.recurrent.iter().any(|r| !r.is_stateless())
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
    /// positions are kept. Recurrent state cannot be rewound: a recurrent session asked to drop
    /// anything goes back to its [checkpoint](Session::checkpoint) when that lies within `len`,
    /// else starts over from position 0 (the return value says which). So does a session whose
    /// sliding-window KV ring has already dropped positions the window before `len` needs.
    pub fn truncate(&mut self, len: usize) -> usize {
        let mut len = len.min(self.tokens.len());
        if len < self.tokens.len() && self.is_recurrent() {
            match &self.checkpoint {
                Some(cp) if cp.len <= len => {
                    len = cp.len;
                    self.recurrent.clone_from(&cp.recurrent);
                }
                _ => len = 0,
            }
        }
        // A sliding-window KV ring that no longer holds the window before `len` keeps nothing.
        let len = self.kv.truncate(len);
        self.tokens.truncate(len);
        if len == 0 {
            self.recurrent.iter_mut().for_each(RecurrentLayer::reset);
        }
        if self.checkpoint.as_ref().is_some_and(|cp| cp.len > len) {
            self.checkpoint = None;
        }
        self.tokens.len()
    }

    /// Save the recurrent state at the current position, replacing the previous checkpoint, so
    /// a later [`truncate`](Session::truncate) to this length or beyond can return here. A no-op
    /// for attention-only sessions (their KV cache rewinds to any position).
    pub fn checkpoint(&mut self) {
        if !self.is_recurrent() {
            return;
        }
        let len = self.tokens.len();
        match &mut self.checkpoint {
            Some(cp) => {
                cp.len = len;
                cp.recurrent.clone_from(&self.recurrent);
            }
            None => {
                self.checkpoint = Some(Checkpoint {
                    len,
                    recurrent: self.recurrent.clone(),
                })
            }
        }
    }

    /// The position of the saved recurrent state, if any.
    pub fn checkpoint_len(&self) -> Option<usize> {
        self.checkpoint.as_ref().map(|cp| cp.len)
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Forget everything and give the caches' memory back (the KV buffers and the checkpoint;
    /// the fixed-size recurrent state stays allocated).
    pub fn release(&mut self) {
        self.truncate(0);
        self.kv.release();
        self.checkpoint = None;
    }

    /// Bytes of cached state (the checkpoint included).
    pub fn state_bytes(&self) -> usize {
        let recurrent = |r: &[RecurrentLayer]| r.iter().map(|r| 4 * (r.conv.len() + r.state.len())).sum::<usize>();
        self.kv.bytes() + recurrent(&self.recurrent) + self.checkpoint.as_ref().map_or(0, |cp| recurrent(&cp.recurrent))
    }

    /// Bytes the session's caches have allocated (spare KV capacity included): the memory it
    /// keeps between requests for prompt reuse.
    pub fn reserved_bytes(&self) -> usize {
        let recurrent = |r: &[RecurrentLayer]| {
            r.iter()
                .map(|r| 4 * (r.conv.capacity() + r.state.capacity()))
                .sum::<usize>()
        };
        self.kv.reserved_bytes()
            + recurrent(&self.recurrent)
            + self.checkpoint.as_ref().map_or(0, |cp| recurrent(&cp.recurrent))
            + 4 * self.tokens.capacity()
    }

    /// The recurrent state after the first `len` positions, when the session still has it: the
    /// live state at its current length, or its checkpoint. An attention-only session's (empty)
    /// layers at any length.
    pub(crate) fn recurrent_at(&self, len: usize) -> Option<&[RecurrentLayer]> {
        if !self.is_recurrent() || len == self.tokens.len() {
            return Some(&self.recurrent);
        }
        match &self.checkpoint {
            Some(cp) if cp.len == len => Some(&cp.recurrent),
            _ => None,
        }
    }

    /// Record each recurrent layer's lane inputs from now on ([`LaneTrace`]), for
    /// [`Session::rollback_recurrent`].
    pub(crate) fn start_trace(&mut self) {
        for r in self.recurrent.iter_mut().filter(|r| !r.state.is_empty()) {
            r.trace.get_or_insert_with(LaneTrace::default).clear();
        }
    }

    /// Stop recording lane inputs.
    pub(crate) fn stop_trace(&mut self) {
        for r in &mut self.recurrent {
            r.trace = None;
        }
    }

    /// Keep `keep` of the positions a speculative pass appended after `len`: go back to
    /// `before`, the recurrent state copied when the session was `len` long (recurrent state
    /// cannot rewind), and advance it over the first `keep` lanes the pass recorded
    /// ([`Session::start_trace`]), bit for bit as the pass did. Returns the positions kept:
    /// `len + keep`, or fewer when the KV cache could not rewind or a layer has no trace of
    /// those lanes (the caller runs the rest again).
    pub(crate) fn rollback_recurrent(&mut self, len: usize, keep: usize, mut before: Vec<RecurrentLayer>) -> usize {
        let target = len + keep;
        let traced = self
            .recurrent
            .iter()
            // A layer with recurrent state (DeltaNet) or only a conv history (LFM2's short
            // convolutions, which record no trace) must be replayable, else the kept tokens run
            // again.
            .all(|r| r.is_stateless() || r.trace.as_ref().is_some_and(|t| t.lanes() >= keep));
        if target > self.tokens.len() || before.len() != self.recurrent.len() || self.kv.truncate(target) != target {
            self.stop_trace();
            return self.truncate(0);
        }
        let target = if traced {
            for (b, r) in before.iter_mut().zip(&self.recurrent) {
                if let Some(t) = &r.trace {
                    t.replay(b, keep);
                }
            }
            target
        } else {
            // No record to advance by: back to `len`, and the caller runs the kept tokens.
            self.kv.truncate(len);
            len
        };
        self.tokens.truncate(target);
        self.recurrent = before;
        if self.checkpoint.as_ref().is_some_and(|cp| cp.len > target) {
            self.checkpoint = None;
        }
        target
    }

    /// The recurrent layers, to be overwritten by a restore.
    pub(crate) fn recurrent_mut(&mut self) -> &mut [RecurrentLayer] {
        &mut self.recurrent
    }

    /// Take `tokens` as the positions the caches now hold (just restored) and checkpoint there,
    /// so a later request can rewind to the restored prefix.
    pub(crate) fn set_restored(&mut self, tokens: &[u32]) {
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        self.checkpoint = None;
        self.checkpoint();
    }

    pub(crate) fn push_tokens(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid() -> Session {
        Session::with_recurrent(KvCache::new(2, 4), vec![RecurrentLayer::zeros(2, 3)], 64)
    }

    fn advance(s: &mut Session, tokens: &[u32], value: f32) {
        s.push_tokens(tokens);
        s.recurrent[0].state.fill(value);
        s.recurrent[0].conv.fill(value);
    }

    #[test]
    fn recurrent_session_rewinds_to_its_checkpoint() {
        let mut s = hybrid();
        advance(&mut s, &[1, 2, 3, 4], 1.0);
        s.checkpoint();
        advance(&mut s, &[5, 6, 7], 2.0);
        assert_eq!(s.truncate(6), 4, "back to the checkpoint at 4");
        assert_eq!(s.tokens(), &[1, 2, 3, 4]);
        assert!(s.recurrent[0].state.iter().all(|&v| v == 1.0));
        // Still there for the next rewind.
        advance(&mut s, &[9], 3.0);
        assert_eq!(s.truncate(4), 4);
        assert!(s.recurrent[0].conv.iter().all(|&v| v == 1.0));
        // Below the checkpoint: start over, and the checkpoint is gone.
        assert_eq!(s.truncate(3), 0);
        assert!(s.recurrent[0].state.iter().all(|&v| v == 0.0));
        assert_eq!(s.checkpoint_len(), None);
    }

    #[test]
    fn keeping_everything_keeps_the_live_state() {
        let mut s = hybrid();
        advance(&mut s, &[1, 2], 1.0);
        s.checkpoint();
        advance(&mut s, &[3], 2.0);
        assert_eq!(s.truncate(10), 3);
        assert!(s.recurrent[0].state.iter().all(|&v| v == 2.0));
        assert_eq!(s.checkpoint_len(), Some(2));
    }

    #[test]
    fn attention_only_sessions_ignore_checkpoints() {
        let mut s = Session::new(KvCache::new(1, 4), 16);
        s.push_tokens(&[1, 2, 3]);
        s.checkpoint();
        assert_eq!(s.checkpoint_len(), None);
        assert_eq!(s.truncate(1), 1);
    }
}
