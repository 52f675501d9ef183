//! A decoder reranker (Qwen3-Reranker style): a causal language model asked, in a fixed
//! prompt, whether a document meets a query, scored by its next-token logits for "yes" and
//! "no" at the prompt's last position: score = e^yes / (e^yes + e^no), the softmax over the
//! two. The prompt is [`RerankPrompt`]: Qwen3-Reranker's by default, any other by template.

use std::path::Path;

use crate::backend::Backend;
use crate::cross_encoder::{Logits, softmax};
use crate::error::{EngineError, Result};
use crate::last_logits::last_logits;
use crate::loader::{LoadedModel, load_model};

/// Qwen3-Reranker's prompt (its model card's `prefix`, `format_instruction` and `suffix`).
pub const QWEN3_RERANKER_TEMPLATE: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

/// Qwen3-Reranker's default instruction.
pub const QWEN3_RERANKER_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

/// How a decoder reranker's prompt is written and read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RerankPrompt {
    /// The prompt, with `{instruction}`, `{query}` and `{document}` put in (one pass: text
    /// that a query or document brings is never substituted again). Special tokens written in
    /// it (`<|im_start|>`) are read as those tokens.
    pub template: String,
    /// What `{instruction}` becomes.
    pub instruction: String,
    /// The token whose probability is the score (one token of the vocabulary).
    pub yes: String,
    /// The token it is weighed against.
    pub no: String,
}

impl Default for RerankPrompt {
    fn default() -> Self {
        Self {
            template: QWEN3_RERANKER_TEMPLATE.into(),
            instruction: QWEN3_RERANKER_INSTRUCTION.into(),
            yes: "yes".into(),
            no: "no".into(),
        }
    }
}

impl RerankPrompt {
    /// The prompt for one pair.
    pub fn render(&self, query: &str, document: &str) -> String {
        let mut out = String::with_capacity(self.template.len() + query.len() + document.len());
        let mut rest = self.template.as_str();
        while let Some(at) = rest.find('{') {
            out.push_str(&rest[..at]);
            let tail = &rest[at..];
            let (value, len) = [
                ("{instruction}", self.instruction.as_str()),
                ("{query}", query),
                ("{document}", document),
            ]
            .into_iter()
            .find(|(name, _)| tail.starts_with(name))
            .map_or(("{", 1), |(name, v)| (v, name.len()));
            out.push_str(value);
            rest = &tail[len..];
        }
        out.push_str(rest);
        out
    }
}

/// A loaded decoder reranker.
pub struct DecoderReranker {
    model: LoadedModel,
    prompt: RerankPrompt,
    yes: u32,
    no: u32,
}

impl std::fmt::Debug for DecoderReranker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderReranker")
            .field("prompt", &self.prompt)
            .finish_non_exhaustive()
    }
}

/// The single token `text` is in `model`'s vocabulary.
pub fn single_token(model: &LoadedModel, text: &str) -> Result<u32> {
    match model.tokenizer.encode_no_special(text)?.as_slice() {
        [id] => Ok(*id),
        ids => Err(EngineError::Config(format!(
            "'{text}' is {} tokens in this model's vocabulary, not one: give the reranker a yes/no pair of single tokens",
            ids.len()
        ))),
    }
}

impl DecoderReranker {
    /// Load a causal language model (a directory or a GGUF) as a reranker with `prompt`.
    pub fn load(
        path: &Path,
        backend: &dyn Backend,
        prompt: RerankPrompt,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        Self::new(load_model(path, backend, progress)?, prompt)
    }

    /// A reranker over a loaded model.
    pub fn new(model: LoadedModel, prompt: RerankPrompt) -> Result<Self> {
        let yes = single_token(&model, &prompt.yes)?;
        let no = single_token(&model, &prompt.no)?;
        Ok(Self { model, prompt, yes, no })
    }

    /// The prompt.
    pub fn prompt(&self) -> &RerankPrompt {
        &self.prompt
    }

    /// The model.
    pub fn model(&self) -> &LoadedModel {
        &self.model
    }

    /// Longest prompt in tokens (the model's context).
    pub fn max_tokens(&self) -> usize {
        self.model.model.info().context_length
    }

    /// Token ids of the prompt for each document (BOS first when the model adds one).
    pub fn tokenize(&self, query: &str, documents: &[&str]) -> Result<Vec<Vec<u32>>> {
        documents
            .iter()
            .map(|d| Ok(self.model.tokenizer.encode(&self.prompt.render(query, d))?))
            .collect()
    }

    /// P(yes) of each document: one batched pass over every prompt. A prompt longer than the
    /// model's context is refused.
    pub fn rerank(&self, query: &str, documents: &[&str]) -> Result<Vec<Logits>> {
        let prompts = self.tokenize(query, documents)?;
        last_logits(self.model.model.as_ref(), &prompts, |i, row| {
            let pick = |id: u32| row.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY);
            let pair = softmax(&[pick(self.no), pick(self.yes)]);
            Logits {
                logits: vec![pair[1]],
                tokens: prompts[i].len(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_substitutes_once() {
        let p = RerankPrompt {
            template: "[{instruction}|{query}|{document}|{other}]".into(),
            instruction: "I".into(),
            ..RerankPrompt::default()
        };
        assert_eq!(p.render("q {document}", "d"), "[I|q {document}|d|{other}]");
        let q = RerankPrompt::default().render("Q", "D");
        assert!(q.contains("<Query>: Q\n<Document>: D<|im_end|>"), "{q}");
        assert!(q.contains(QWEN3_RERANKER_INSTRUCTION));
    }
}
