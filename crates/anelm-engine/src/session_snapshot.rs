//! A session's state for a prompt prefix as bytes, and back: the KV rows of every attention
//! layer (in their storage type's own bits) and, for a hybrid model, the recurrent DeltaNet and
//! conv state at exactly that length. Restoring gives the session the caches it had, bit for bit,
//! so the positions that follow compute the same numbers. What the on-disk prompt cache stores
//! (`prompt_cache.rs`); the tokens themselves travel beside the bytes.
//!
//! Layout (little endian): magic `SNP1`, the prefix length, the layer count, per layer
//! [`KvLayer::encode_prefix`](crate::kv_cache::KvLayer), the recurrent layer count, per
//! recurrent layer its conv and state lengths and floats.

use crate::byte_codec::{Reader, Truncated, put_f32s, put_usize};
use crate::kv_cache::LayerPrefix;
use crate::session::{RecurrentLayer, Session};

const MAGIC: &[u8; 4] = b"SNP1";

/// Why saved session state cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes end early.
    #[error("saved session state is truncated ({0}): discard it and prefill the prompt again")]
    Truncated(#[from] Truncated),
    /// The bytes are not session state (or are corrupt in a way the checksum missed).
    #[error("saved session state is malformed ({0}): discard it and prefill the prompt again")]
    Invalid(String),
    /// The state was saved from a session of another shape (another model or build).
    #[error(
        "saved session state does not fit this model's sessions (different {0}): it was saved by another model; discard it"
    )]
    Mismatch(String),
}

impl Session {
    /// Whether a saved prefix of this session stays usable at any shorter length: true for
    /// attention-only sessions without sliding windows (their KV rows for a shorter prefix are
    /// the first rows), false when there is recurrent state or a ring (only the saved length).
    pub fn prefix_rewindable(&self) -> bool {
        !self.is_recurrent() && self.kv.layers.iter().all(|l| l.window().is_none())
    }

    /// The state after the first `len` positions, as bytes for [`Session::restore_prefix`].
    /// `None` when the session no longer holds it: `len` is 0 or beyond its length, or it is a
    /// recurrent session and `len` is neither its length nor its checkpoint, or a ring has
    /// dropped rows the position after `len` would read.
    pub fn encode_prefix(&self, len: usize) -> Option<Vec<u8>> {
        if len == 0 || len > self.len() {
            return None;
        }
        let recurrent = self.recurrent_at(len)?;
        let rec_bytes: usize = recurrent.iter().map(|r| 4 * (r.conv.len() + r.state.len()) + 16).sum();
        let kv_bytes = self.kv.bytes() / self.len().max(1) * len;
        let mut out = Vec::with_capacity(kv_bytes + rec_bytes + 64 * (self.kv.layers.len() + 1));
        out.extend_from_slice(MAGIC);
        put_usize(&mut out, len);
        put_usize(&mut out, self.kv.layers.len());
        for layer in &self.kv.layers {
            if !layer.encode_prefix(len, &mut out) {
                return None;
            }
        }
        put_usize(&mut out, recurrent.len());
        for r in recurrent {
            put_usize(&mut out, r.conv.len());
            put_usize(&mut out, r.state.len());
            put_f32s(&mut out, &r.conv);
            put_f32s(&mut out, &r.state);
        }
        Some(out)
    }

    /// Replace this session's contents with saved state (from [`Session::encode_prefix`] on a
    /// session of the same model) for the prefix `tokens`, keeping its first `keep` positions:
    /// all of them, or fewer when the state is [rewindable](Session::prefix_rewindable). Every
    /// check is done before anything changes: on error the session is as it was. Returns the
    /// positions now held (`keep`).
    pub fn restore_prefix(&mut self, tokens: &[u32], bytes: &[u8], keep: usize) -> Result<usize, SnapshotError> {
        let mut r = Reader::new(bytes);
        if r.take(4)? != MAGIC {
            return Err(SnapshotError::Invalid("not session state (bad magic)".into()));
        }
        let len = r.usize()?;
        if len != tokens.len() {
            return Err(SnapshotError::Invalid(format!(
                "state for {len} positions given with {} tokens",
                tokens.len()
            )));
        }
        if keep > self.ctx_size() {
            return Err(SnapshotError::Mismatch(format!(
                "context: {keep} positions, the session holds {}",
                self.ctx_size()
            )));
        }
        let n_layers = r.usize()?;
        if n_layers != self.kv.layers.len() {
            return Err(SnapshotError::Mismatch(format!(
                "layer count: {n_layers} saved, {} here",
                self.kv.layers.len()
            )));
        }
        let mut layers = Vec::with_capacity(n_layers);
        for target in &self.kv.layers {
            let p = LayerPrefix::decode(&mut r)?;
            p.check_fits(target)?;
            if p.end() != 0 && p.end() != len {
                return Err(SnapshotError::Invalid(format!(
                    "a layer holds {} positions of {len}",
                    p.end()
                )));
            }
            layers.push(p);
        }
        let n_rec = r.usize()?;
        if n_rec != self.recurrent.len() {
            return Err(SnapshotError::Mismatch(format!(
                "recurrent layer count: {n_rec} saved, {} here",
                self.recurrent.len()
            )));
        }
        let mut recurrent = Vec::with_capacity(n_rec);
        for target in &self.recurrent {
            let (conv_len, state_len) = (r.usize()?, r.usize()?);
            if conv_len != target.conv.len() || state_len != target.state.len() {
                return Err(SnapshotError::Mismatch("recurrent state size".into()));
            }
            recurrent.push(RecurrentLayer {
                conv: r.f32s(conv_len)?,
                state: r.f32s(state_len)?,
                trace: None,
            });
        }
        if r.remaining() != 0 {
            return Err(SnapshotError::Invalid(format!("{} bytes after the end", r.remaining())));
        }
        let rewindable = recurrent.iter().all(|l| l.is_stateless()) && self.prefix_rewindable();
        if keep == 0 || keep > len || (keep < len && !rewindable) {
            return Err(SnapshotError::Invalid(format!(
                "cannot keep {keep} of {len} saved positions (only all of a recurrent or windowed state)"
            )));
        }
        // Checked: now replace.
        for (layer, p) in self.kv.layers.iter_mut().zip(layers) {
            layer.restore_prefix(p);
        }
        for (layer, saved) in self.recurrent_mut().iter_mut().zip(recurrent) {
            *layer = saved;
        }
        let kept = self.kv.truncate(keep);
        self.set_restored(&tokens[..kept]);
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvCache, KvRows, KvStorage};

    fn bits(r: KvRows<'_>) -> Vec<u32> {
        match r {
            KvRows::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            KvRows::F16(v) => v.iter().map(|&x| u32::from(x)).collect(),
        }
    }

    fn row(p: usize, layer: usize) -> Vec<f32> {
        (0..4)
            .map(|i| (p * 10 + i) as f32 * 0.37 - layer as f32 * 1.3)
            .collect()
    }

    /// A session of two KV layers (`windows`) and optionally recurrent state, after `n` positions.
    fn filled(windows: &[Option<usize>], storage: KvStorage, recurrent: bool, n: usize) -> Session {
        let kv = KvCache::with_windows(windows, 4).with_storage(storage).with_heads(2);
        let rec = if recurrent {
            vec![RecurrentLayer::zeros(3, 5), RecurrentLayer::default()]
        } else {
            Vec::new()
        };
        let mut s = Session::with_recurrent(kv, rec, 512);
        for p in 0..n {
            for (li, l) in s.kv.layers.iter_mut().enumerate() {
                l.reserve_step(1, 4);
                l.push(&row(p, li), &row(p, li).iter().map(|x| -x).collect::<Vec<_>>());
            }
            if recurrent {
                s.recurrent[0].state.iter_mut().for_each(|x| *x += p as f32 * 0.1);
                s.recurrent[0].conv.iter_mut().for_each(|x| *x -= p as f32);
            }
            s.push_tokens(&[p as u32 + 1]);
        }
        s
    }

    /// The next position's query sees the same rows in both sessions.
    fn same_visible_state(a: &Session, b: &Session) {
        assert_eq!(a.tokens(), b.tokens());
        for (la, lb) in a.kv.layers.iter().zip(&b.kv.layers) {
            assert_eq!(la.len(), lb.len());
            let from = la.window().map_or(0, |w| la.len().saturating_sub(w - 1));
            for h in 0..2 {
                let read = |l: &crate::kv_cache::KvLayer| {
                    let (stride, offset) = l.row_layout(h, 2);
                    let slots: Vec<usize> = l
                        .segments(from..l.len())
                        .into_iter()
                        .flat_map(|r| r.map(|s| offset + s * stride))
                        .collect();
                    let (k, v) = (bits(l.keys()), bits(l.values()));
                    slots
                        .iter()
                        .flat_map(|&at| [k[at], k[at + 1], v[at], v[at + 1]])
                        .collect::<Vec<_>>()
                };
                assert_eq!(read(la), read(lb), "head {h}");
            }
        }
        assert_eq!(a.recurrent, b.recurrent);
    }

    #[test]
    fn a_prefix_round_trips_bit_for_bit_in_every_layer_kind() {
        for storage in [KvStorage::F32, KvStorage::F16] {
            for windows in [[None, None], [Some(5), None]] {
                for recurrent in [false, true] {
                    let src = filled(&windows, storage, recurrent, 150);
                    let bytes = src.encode_prefix(150).expect("the current length is held");
                    let mut dst = filled(&windows, storage, recurrent, 0);
                    assert_eq!(dst.restore_prefix(src.tokens(), &bytes, 150).expect("restore"), 150);
                    same_visible_state(&src, &dst);
                    assert_eq!(dst.checkpoint_len(), recurrent.then_some(150));
                    // Restored state keeps growing like the original.
                    let mut a = src.clone();
                    for s in [&mut a, &mut dst] {
                        for (li, l) in s.kv.layers.iter_mut().enumerate() {
                            l.reserve_step(1, 4);
                            l.push(&row(150, li), &row(150, li));
                        }
                        s.push_tokens(&[7]);
                    }
                    same_visible_state(&a, &dst);
                }
            }
        }
    }

    #[test]
    fn only_held_prefixes_are_encoded_and_rewindable_ones_restore_shorter() {
        // Recurrent: the current length and the checkpoint only.
        let mut s = filled(&[None, None], KvStorage::F32, true, 20);
        s.checkpoint();
        let at_20 = s.recurrent[0].clone();
        s.kv.layers.iter_mut().for_each(|l| {
            l.reserve_step(1, 4);
            l.push(&row(20, 0), &row(20, 0));
        });
        s.recurrent[0].state.fill(9.0);
        s.push_tokens(&[99]);
        assert!(s.encode_prefix(10).is_none());
        assert!(s.encode_prefix(22).is_none());
        let bytes = s.encode_prefix(20).expect("checkpoint");
        let mut d = filled(&[None, None], KvStorage::F32, true, 0);
        assert!(
            d.restore_prefix(&s.tokens()[..20], &bytes, 10).is_err(),
            "recurrent: all or nothing"
        );
        d.restore_prefix(&s.tokens()[..20], &bytes, 20).expect("restore");
        assert_eq!(d.recurrent[0], at_20);
        // Attention only: any shorter prefix of a saved one.
        let s = filled(&[None, None], KvStorage::F16, false, 40);
        let bytes = s.encode_prefix(40).expect("held");
        let mut d = filled(&[None, None], KvStorage::F16, false, 3);
        assert_eq!(d.restore_prefix(s.tokens(), &bytes, 25).expect("restore"), 25);
        let mut want = s.clone();
        want.truncate(25);
        same_visible_state(&want, &d);
        // A ring that has dropped the rows a query after position 10 needs.
        let s = filled(&[Some(5), None], KvStorage::F32, false, 200);
        assert!(s.encode_prefix(100).is_none());
        assert!(s.encode_prefix(198).is_some());
    }

    #[test]
    fn state_of_another_shape_or_damaged_bytes_is_refused_and_changes_nothing() {
        let s = filled(&[None, None], KvStorage::F32, true, 30);
        let bytes = s.encode_prefix(30).expect("held");
        let before = filled(&[None, None], KvStorage::F32, true, 4);
        // Other storage, other layer kinds, no recurrent state.
        for mut other in [
            filled(&[None, None], KvStorage::F16, true, 4),
            filled(&[Some(5), None], KvStorage::F32, true, 4),
            filled(&[None, None], KvStorage::F32, false, 4),
            filled(&[None], KvStorage::F32, true, 4),
        ] {
            let was = other.clone();
            let e = other.restore_prefix(s.tokens(), &bytes, 30).expect_err("another shape");
            assert!(matches!(e, SnapshotError::Mismatch(_)), "{e}");
            same_visible_state(&was, &other);
        }
        // Every truncation is an error, never a panic.
        for cut in 0..bytes.len() {
            let mut d = before.clone();
            assert!(d.restore_prefix(s.tokens(), &bytes[..cut], 30).is_err(), "cut at {cut}");
            same_visible_state(&before, &d);
        }
        // Wrong token count.
        let mut d = before.clone();
        assert!(d.restore_prefix(&s.tokens()[..29], &bytes, 29).is_err());
    }
}
