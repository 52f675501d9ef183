//! `Reranker`: what `/v1/rerank` serves, a cross-encoder ([`CrossEncoder`]: BERT or ModernBERT) or a decoder
//! that scores a yes/no token ([`DecoderReranker`]), chosen by the model's config: a
//! `…ForSequenceClassification` directory is a cross-encoder, anything else a causal language
//! model read as a decoder reranker.

use std::path::Path;

use crate::backend::Backend;
use crate::cross_encoder::{CrossEncoder, Logits};
use crate::decoder_reranker::{DecoderReranker, RerankPrompt};
use crate::error::Result;

/// A loaded reranker.
#[derive(Debug)]
pub enum Reranker {
    /// A BERT or ModernBERT sequence classifier over (query, document) pairs.
    Cross(Box<CrossEncoder>),
    /// A causal language model's P(yes).
    Decoder(Box<DecoderReranker>),
}

impl Reranker {
    /// Load `path`: a sequence classifier's directory as a cross-encoder, otherwise a causal
    /// language model (directory or GGUF) as a decoder reranker with `prompt`.
    pub fn load(
        path: &Path,
        backend: &dyn Backend,
        prompt: RerankPrompt,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        if CrossEncoder::is_cross_encoder_dir(path) {
            return Ok(Self::Cross(Box::new(CrossEncoder::load_with_progress(
                path, backend, progress,
            )?)));
        }
        Ok(Self::Decoder(Box::new(DecoderReranker::load(
            path, backend, prompt, progress,
        )?)))
    }

    /// `cross-encoder` or `decoder`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Cross(_) => "cross-encoder",
            Self::Decoder(_) => "decoder",
        }
    }

    /// Longest input in tokens: a cross-encoder truncates longer pairs to it, a decoder
    /// reranker refuses longer prompts.
    pub fn max_tokens(&self) -> usize {
        match self {
            Self::Cross(c) => c.info().max_tokens,
            Self::Decoder(d) => d.max_tokens(),
        }
    }

    /// The relevance score of each document to `query` (in `logits[0]`), with the tokens read.
    pub fn rerank(&self, query: &str, documents: &[&str]) -> Result<Vec<Logits>> {
        match self {
            Self::Cross(c) => c.rerank(query, documents),
            Self::Decoder(d) => d.rerank(query, documents),
        }
    }
}
