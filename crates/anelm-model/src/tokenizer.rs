//! Tokenizer: text ↔ token ids for GGUF vocabularies (byte-level BPE and
//! SentencePiece) and Hugging Face `tokenizer.json` directories, plus a
//! streaming detokeniser.
//!
//! Encoding of byte-level BPE runs through the `tokenizers` crate (built
//! programmatically for GGUF, with llama.cpp's pre-tokenizer regexes); the
//! SentencePiece path is a direct port of llama.cpp's merge-by-score rules.
//! Decoding is done here from per-token byte strings so that [`Tokenizer::decode`],
//! [`Tokenizer::token_bytes`] and [`StreamDecoder`] agree byte for byte.

mod byte_level;
mod error;
mod gguf_vocab;
mod hf_dir;
mod pre_split;
mod specials;
mod spm;
mod stream;

use std::collections::HashMap;
use std::path::Path;

pub use error::TokenizerError;
pub use gguf_vocab::GgufVocab;
pub use pre_split::PreKind;
pub use stream::StreamDecoder;

/// What kind of vocabulary entry a token is (GGUF `tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// Ordinary text piece.
    Normal,
    /// The unknown token.
    Unknown,
    /// Control / special token (BOS, EOS, chat markers): matched in text, dropped on decode.
    Control,
    /// User-defined added token: matched in text, decoded as its text.
    UserDefined,
    /// Unused slot.
    Unused,
    /// Byte-fallback token `<0xNN>`.
    Byte,
}

impl TokenKind {
    /// Map a GGUF token type code (1..=6) to a kind; other codes are taken as normal.
    pub fn from_gguf(code: i32) -> Self {
        match code {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// The encoder behind a tokenizer.
enum Engine {
    /// A `tokenizers` pipeline (byte-level BPE from GGUF, or any HF tokenizer.json).
    Hf(Box<tokenizers::Tokenizer>),
    /// SentencePiece-style merge by scores.
    Spm(spm::SpmEncoder),
}

/// A loaded tokenizer. Cheap to share between threads (`Send + Sync`).
pub struct Tokenizer {
    engine: Engine,
    /// Vocabulary entry per id as stored (None for holes in an HF vocab).
    pieces: Vec<Option<String>>,
    piece_to_id: HashMap<String, u32>,
    kinds: Vec<TokenKind>,
    /// Bytes each token stands for (empty for control tokens).
    bytes: Vec<Box<[u8]>>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// Remove one leading space from [`Tokenizer::decode`] output (SentencePiece space prefix).
    strip_leading_space: bool,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

/// Parts every constructor fills; [`Tokenizer::assemble`] derives the rest.
struct Parts {
    engine: Engine,
    pieces: Vec<Option<String>>,
    kinds: Vec<TokenKind>,
    bytes: Vec<Box<[u8]>>,
    bos: Option<u32>,
    eos: Option<u32>,
    extra_stops: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    strip_leading_space: bool,
}

impl Tokenizer {
    /// Build from GGUF `tokenizer.ggml.*` metadata.
    pub fn from_gguf_vocab(v: &GgufVocab<'_>) -> Result<Self, TokenizerError> {
        gguf_vocab::build(v)
    }

    /// tokenizer.json (+ tokenizer_config.json for bos/eos tokens and add_bos_token,
    /// + generation_config.json eos ids if present) in a HF model dir.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        hf_dir::load(dir)
    }

    /// Finish construction: reverse map and stop ids.
    fn assemble(p: Parts) -> Self {
        let mut piece_to_id = HashMap::with_capacity(p.pieces.len());
        for (i, piece) in p.pieces.iter().enumerate() {
            if let (Some(piece), Ok(id)) = (piece, u32::try_from(i)) {
                piece_to_id.insert(piece.clone(), id);
            }
        }
        let mut stop_ids: Vec<u32> = Vec::new();
        let mut add_stop = |id: u32| {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        };
        if let Some(e) = p.eos {
            add_stop(e);
        }
        for &id in &p.extra_stops {
            add_stop(id);
        }
        for name in specials::END_OF_TURN_NAMES {
            if let Some(&id) = piece_to_id.get(*name) {
                let kind = usize::try_from(id).ok().and_then(|i| p.kinds.get(i));
                if matches!(kind, Some(TokenKind::Control | TokenKind::UserDefined)) {
                    add_stop(id);
                }
            }
        }
        Self {
            engine: p.engine,
            pieces: p.pieces,
            piece_to_id,
            kinds: p.kinds,
            bytes: p.bytes,
            bos: p.bos,
            eos: p.eos,
            add_bos: p.add_bos,
            add_eos: p.add_eos,
            strip_leading_space: p.strip_leading_space,
            stop_ids,
        }
    }

    /// Text → ids as the model expects them: BOS prepended when the model's metadata asks
    /// for it; special/control tokens written in the text (e.g. "<|im_start|>") are parsed
    /// as those tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        if let (true, Some(b)) = (self.add_bos, self.bos) {
            out.push(b);
        }
        self.encode_into(text, &mut out)?;
        if let (true, Some(e)) = (self.add_eos, self.eos) {
            out.push(e);
        }
        Ok(out)
    }

    /// Same as [`Tokenizer::encode`], without adding BOS/EOS (special tokens in the text
    /// are still parsed).
    pub fn encode_no_special(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        self.encode_into(text, &mut out)?;
        Ok(out)
    }

    /// Encode `text` and append the ids.
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        match &self.engine {
            Engine::Hf(tk) => {
                let enc = tk
                    .encode_fast(text, false)
                    .map_err(|e| TokenizerError::Backend(e.to_string()))?;
                out.extend_from_slice(enc.get_ids());
                Ok(())
            }
            Engine::Spm(spm) => spm.encode(text, &self.piece_to_id, out),
        }
    }

    /// Ids → text. Control/special tokens are dropped from the output; invalid UTF-8 is
    /// replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let b = usize::try_from(id)
                .ok()
                .and_then(|i| self.bytes.get(i))
                .ok_or(TokenizerError::BadId {
                    id,
                    vocab_size: self.bytes.len(),
                })?;
            bytes.extend_from_slice(b);
        }
        let mut slice = bytes.as_slice();
        if self.strip_leading_space {
            slice = slice.strip_prefix(b" ").unwrap_or(slice);
        }
        Ok(String::from_utf8_lossy(slice).into_owned())
    }

    /// The raw bytes a token stands for (byte-level BPE decoded to bytes, SPM ▁ → space,
    /// <0xNN> byte tokens → that byte; control tokens and unknown ids → empty).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes_ref(id).to_vec()
    }

    /// Borrowed form of [`Tokenizer::token_bytes`].
    pub fn token_bytes_ref(&self, id: u32) -> &[u8] {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.bytes.get(i))
            .map_or(&[], |b| b)
    }

    /// The vocabulary entry as stored.
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.pieces.get(usize::try_from(id).ok()?)?.as_deref()
    }

    /// Id of a vocabulary entry (as stored, e.g. "Ġthe" or "▁the" or "<|im_end|>").
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.piece_to_id.get(piece).copied()
    }

    /// Number of ids (the embedding table's row count the vocab needs).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Kind of a token, or None for an out-of-range id.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(usize::try_from(id).ok()?).copied()
    }

    /// Beginning-of-sequence token id.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether [`Tokenizer::encode`] appends the end-of-sequence token (the model's
    /// post-processor does, e.g. a Qwen3-Embedding tokenizer).
    pub fn adds_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    /// BOS token text (for chat templates' `bos_token`).
    pub fn bos_token(&self) -> Option<&str> {
        self.token_str(self.bos?)
    }

    /// EOS token text (for chat templates' `eos_token`).
    pub fn eos_token(&self) -> Option<&str> {
        self.token_str(self.eos?)
    }

    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Ids that end generation: eos, eot, eom, plus the usual end-of-turn specials present
    /// in the vocab (<|im_end|>, <|eot_id|>, <end_of_turn>, <|endoftext|>...).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether `id` is a control/special token (dropped from decoded text).
    pub fn is_special(&self, id: u32) -> bool {
        self.token_kind(id) == Some(TokenKind::Control)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tokenizer_is_send_sync() {
        assert_send_sync::<Tokenizer>();
    }

    #[test]
    fn gguf_kinds_map() {
        assert_eq!(TokenKind::from_gguf(3), TokenKind::Control);
        assert_eq!(TokenKind::from_gguf(6), TokenKind::Byte);
        assert_eq!(TokenKind::from_gguf(1), TokenKind::Normal);
        assert_eq!(TokenKind::from_gguf(99), TokenKind::Normal);
    }
}
