//! Special tokens written in raw text: splitting text around them (for the
//! SentencePiece path; the `tokenizers` path does this itself), and the names
//! of the usual end-of-turn tokens.

use std::collections::HashMap;

/// Vocabulary entries that end a turn in common chat formats; any of them that
/// is a special (control or user-defined) token of a vocabulary is a stop id.
pub const END_OF_TURN_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<EOT>",
    "<|EOT|>",
    "<end_of_utterance>",
];

/// A piece of input text: plain text to tokenize, or a special token found in it.
#[derive(Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    /// Text between special tokens.
    Text(&'a str),
    /// A special token matched verbatim.
    Token(u32),
}

/// Finds special-token strings in text, longest match first at each position.
#[derive(Debug, Default)]
pub struct SpecialMatcher {
    /// First byte → (token text, id), longest text first.
    by_first: HashMap<u8, Vec<(String, u32)>>,
}

impl SpecialMatcher {
    /// Build from (text, id) pairs; empty texts are ignored.
    pub fn new(tokens: impl IntoIterator<Item = (String, u32)>) -> Self {
        let mut by_first: HashMap<u8, Vec<(String, u32)>> = HashMap::new();
        for (text, id) in tokens {
            if let Some(&b) = text.as_bytes().first() {
                by_first.entry(b).or_default().push((text, id));
            }
        }
        for list in by_first.values_mut() {
            list.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        }
        Self { by_first }
    }

    /// Split `text` into plain-text and special-token fragments (no empty text fragments).
    pub fn split<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let mut out = Vec::new();
        if self.by_first.is_empty() {
            if !text.is_empty() {
                out.push(Fragment::Text(text));
            }
            return out;
        }
        let mut start = 0;
        let mut pos = 0;
        while pos < text.len() {
            let rest = text.get(pos..).unwrap_or("");
            let hit = rest
                .as_bytes()
                .first()
                .and_then(|b| self.by_first.get(b)?.iter().find(|(t, _)| rest.starts_with(t.as_str())));
            if let Some((t, id)) = hit {
                if let Some(before) = text.get(start..pos).filter(|s| !s.is_empty()) {
                    out.push(Fragment::Text(before));
                }
                out.push(Fragment::Token(*id));
                pos += t.len();
                start = pos;
            } else {
                pos += rest.chars().next().map_or(1, char::len_utf8);
            }
        }
        if let Some(tail) = text.get(start..).filter(|s| !s.is_empty()) {
            out.push(Fragment::Text(tail));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_longest_first_and_keeps_text() {
        let m = SpecialMatcher::new([
            ("<s>".to_string(), 1),
            ("<start_of_turn>".to_string(), 5),
            ("<st".to_string(), 9),
        ]);
        assert_eq!(
            m.split("a<start_of_turn>b<s>é<st"),
            vec![
                Fragment::Text("a"),
                Fragment::Token(5),
                Fragment::Text("b"),
                Fragment::Token(1),
                Fragment::Text("é"),
                Fragment::Token(9),
            ]
        );
        assert_eq!(m.split(""), vec![]);
        assert_eq!(m.split("<s><s>"), vec![Fragment::Token(1), Fragment::Token(1)]);
    }

    #[test]
    fn no_specials_is_one_fragment() {
        let m = SpecialMatcher::new([]);
        assert_eq!(m.split("héllo"), vec![Fragment::Text("héllo")]);
    }
}
