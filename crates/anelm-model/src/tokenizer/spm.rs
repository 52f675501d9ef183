//! SentencePiece-style BPE by scores (llama.cpp's `llm_tokenizer_spm`): start
//! from UTF-8 chars, repeatedly merge the adjacent pair whose concatenation is
//! the highest-scoring vocabulary entry, and fall back to `<0xNN>` byte tokens
//! for whatever is left that is not in the vocabulary.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::TokenizerError;
use super::specials::{Fragment, SpecialMatcher};

/// The SentencePiece encoder state that does not change between calls.
#[derive(Debug)]
pub struct SpmEncoder {
    /// Score per token id (merge priority).
    pub scores: Vec<f32>,
    /// Token id of each `<0xNN>` byte token, if present.
    pub byte_ids: Vec<Option<u32>>,
    /// The unknown token, used when a byte has no byte token.
    pub unk: Option<u32>,
    /// Prepend a space to text at the start and after each special token.
    pub add_space_prefix: bool,
    /// Special tokens recognised in raw text.
    pub specials: SpecialMatcher,
}

/// One symbol of the working sequence: a byte range of the text plus links.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
#[derive(Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Higher score first; on ties the leftmost pair first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmEncoder {
    /// Encode `text` (special tokens in it are matched verbatim), appending ids to `out`.
    pub fn encode(&self, text: &str, vocab: &HashMap<String, u32>, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut prev_special = true;
        for fragment in self.specials.split(text) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let mut s = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && prev_special {
                        s.push(' ');
                    }
                    s.push_str(t);
                    let escaped = s.replace(' ', "\u{2581}");
                    self.encode_piece(&escaped, vocab, out)?;
                    prev_special = false;
                }
            }
        }
        Ok(())
    }

    /// Merge-by-score over one whitespace-escaped piece of text.
    fn encode_piece(&self, text: &str, vocab: &HashMap<String, u32>, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let index = symbols.len();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: index.checked_sub(1),
                next: None,
            });
            if let Some(p) = index.checked_sub(1).and_then(|p| symbols.get_mut(p)) {
                p.next = Some(index);
            }
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.try_bigram(text, &symbols, Some(i - 1), Some(i), vocab, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (Some(&left), Some(&right)) = (symbols.get(bigram.left), symbols.get(bigram.right)) else {
                continue;
            };
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.size {
                continue;
            }
            if let Some(l) = symbols.get_mut(bigram.left) {
                l.len += right.len;
                l.next = right.next;
            }
            if let Some(r) = symbols.get_mut(bigram.right) {
                r.len = 0;
            }
            if let Some(n) = right.next.and_then(|n| symbols.get_mut(n)) {
                n.prev = Some(bigram.left);
            }
            self.try_bigram(text, &symbols, left.prev, Some(bigram.left), vocab, &mut queue);
            self.try_bigram(text, &symbols, Some(bigram.left), right.next, vocab, &mut queue);
        }
        let mut cursor = if symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = cursor {
            let Some(sym) = symbols.get(i) else { break };
            let piece = text.get(sym.start..sym.start + sym.len).unwrap_or("");
            if let Some(&id) = vocab.get(piece) {
                out.push(id);
            } else {
                for &b in piece.as_bytes() {
                    let id = self
                        .byte_ids
                        .get(usize::from(b))
                        .copied()
                        .flatten()
                        .or(self.unk)
                        .ok_or(TokenizerError::Unencodable(b))?;
                    out.push(id);
                }
            }
            cursor = sym.next;
        }
        Ok(())
    }

    /// Queue the merge of `left` and `right` if their concatenation is a token.
    fn try_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: Option<usize>,
        right: Option<usize>,
        vocab: &HashMap<String, u32>,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (Some(ls), Some(rs)) = (symbols.get(l), symbols.get(r)) else {
            return;
        };
        let size = ls.len + rs.len;
        let Some(joined) = text.get(ls.start..ls.start + size) else {
            return;
        };
        let Some(&id) = vocab.get(joined) else {
            return;
        };
        let score = usize::try_from(id)
            .ok()
            .and_then(|i| self.scores.get(i))
            .copied()
            .unwrap_or(0.0);
        queue.push(Bigram {
            score,
            left: l,
            right: r,
            size,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> (SpmEncoder, HashMap<String, u32>) {
        // id: 0 <unk>, 1 <s>, 2 </s>, 3..=258 bytes, then pieces.
        let mut pieces: Vec<(String, f32)> = vec![("<unk>".into(), 0.0), ("<s>".into(), 0.0), ("</s>".into(), 0.0)];
        for b in 0..=255u8 {
            pieces.push((format!("<0x{b:02X}>"), 0.0));
        }
        for (p, s) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("e", -2.0),
            ("l", -2.0),
            ("o", -2.0),
            ("▁h", -3.0),
            ("ll", -1.5),
            ("he", -4.0),
            ("▁he", -2.5),
            ("▁hell", -2.0),
            ("▁hello", -0.5),
        ] {
            pieces.push((p.into(), s));
        }
        let vocab: HashMap<String, u32> = pieces
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (p.clone(), i as u32))
            .collect();
        let mut byte_ids = vec![None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = Some(3 + b as u32);
        }
        let enc = SpmEncoder {
            scores: pieces.iter().map(|(_, s)| *s).collect(),
            byte_ids,
            unk: Some(0),
            add_space_prefix: true,
            specials: SpecialMatcher::new([("<s>".to_string(), 1)]),
        };
        (enc, vocab)
    }

    #[test]
    fn merges_to_whole_word_and_falls_back_to_bytes() {
        let (enc, vocab) = toy();
        let mut out = Vec::new();
        enc.encode("hello", &vocab, &mut out).unwrap();
        assert_eq!(out, vec![vocab["▁hello"]]);

        let mut out = Vec::new();
        enc.encode("hé", &vocab, &mut out).unwrap();
        // "▁h" merges; "é" is not a token → its two UTF-8 bytes.
        assert_eq!(out, vec![vocab["▁h"], 3 + 0xC3, 3 + 0xA9]);
    }

    #[test]
    fn special_tokens_split_and_reprefix() {
        let (enc, vocab) = toy();
        let mut out = Vec::new();
        enc.encode("hello<s>hello", &vocab, &mut out).unwrap();
        assert_eq!(out, vec![vocab["▁hello"], 1, vocab["▁hello"]]);
    }

    #[test]
    fn missing_byte_token_uses_unk_or_errors() {
        let (mut enc, vocab) = toy();
        enc.byte_ids = vec![None; 256];
        let mut out = Vec::new();
        enc.encode("é", &vocab, &mut out).unwrap();
        assert_eq!(out, vec![vocab["▁"], 0, 0]);
        enc.unk = None;
        let mut out = Vec::new();
        assert!(matches!(
            enc.encode("é", &vocab, &mut out),
            Err(TokenizerError::Unencodable(0xC3))
        ));
    }
}
