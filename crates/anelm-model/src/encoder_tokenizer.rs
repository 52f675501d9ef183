//! The tokenizer of an encoder (embedding) model: `tokenizer.json` run through the `tokenizers`
//! crate with its post-processor (`[CLS] … [SEP]` for BERT), no padding, and truncation to the
//! model's longest input, exactly as Hugging Face tokenizers does when sentence-transformers calls
//! it with `truncation="longest_first", max_length=max_seq_length`.

use std::path::Path;

use tokenizers::{TruncationDirection, TruncationParams, TruncationStrategy};

use crate::tokenizer::TokenizerError;

/// A loaded encoder tokenizer. `Send + Sync`.
pub struct EncoderTokenizer {
    inner: tokenizers::Tokenizer,
    max_len: usize,
    lower_case: bool,
}

impl std::fmt::Debug for EncoderTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderTokenizer")
            .field("max_len", &self.max_len)
            .field("lower_case", &self.lower_case)
            .finish_non_exhaustive()
    }
}

impl EncoderTokenizer {
    /// `dir/tokenizer.json`, truncating every encoding to `max_len` tokens (special tokens
    /// included). `lower_case` lower-cases texts first (sentence-transformers' `do_lower_case`).
    pub fn from_dir(dir: &Path, max_len: usize, lower_case: bool) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|source| TokenizerError::Io {
            path: path.clone(),
            source,
        })?;
        let mut inner: tokenizers::Tokenizer = text.parse().map_err(|e| TokenizerError::Json {
            path: path.clone(),
            message: format!("{e}"),
        })?;
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        Ok(Self {
            inner,
            max_len,
            lower_case,
        })
    }

    /// Longest encoding in tokens.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of each text (trimmed, as sentence-transformers does), special tokens added,
    /// truncated to [`Self::max_len`].
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let inputs: Vec<String> = texts
            .iter()
            .map(|t| {
                // sentence-transformers strips each text before tokenizing.
                let t = t.trim();
                if self.lower_case {
                    t.to_lowercase()
                } else {
                    t.to_string()
                }
            })
            .collect();
        let encodings = self
            .inner
            .encode_batch_fast(inputs, true)
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        Ok(encodings.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// Token ids and type ids of each text pair (a cross-encoder's query and document), laid
    /// out by the tokenizer's post-processor (`[CLS] a [SEP] b [SEP]`, types 0 then 1 for
    /// BERT), truncated to [`Self::max_len`] longest-first (the longer text loses tokens
    /// first), as Hugging Face tokenizers does when a CrossEncoder calls it. Texts are used as
    /// given (sentence-transformers' CrossEncoder does not strip them).
    pub fn encode_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<PairEncoding>, TokenizerError> {
        let case = |t: &str| {
            if self.lower_case {
                t.to_lowercase()
            } else {
                t.to_string()
            }
        };
        let inputs: Vec<tokenizers::EncodeInput> = pairs.iter().map(|(a, b)| (case(a), case(b)).into()).collect();
        let encodings = self
            .inner
            .encode_batch_fast(inputs, true)
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        Ok(encodings
            .into_iter()
            .map(|e| PairEncoding {
                ids: e.get_ids().to_vec(),
                type_ids: e.get_type_ids().to_vec(),
            })
            .collect())
    }
}

/// One encoded text pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairEncoding {
    /// Token ids, special tokens included.
    pub ids: Vec<u32>,
    /// The segment of each token (0: first text, 1: second).
    pub type_ids: Vec<u32>,
}
