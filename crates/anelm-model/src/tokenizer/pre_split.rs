//! Pre-tokenizer regexes per `tokenizer.ggml.pre`, following the table in
//! llama.cpp's `llama-vocab.cpp`. Each regex of the list splits every piece the
//! previous one produced, keeping matches and the text between them as pieces.

/// GPT-2's word regex.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3 / tiktoken cl100k style: digits in groups of up to three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: like Llama 3 but single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2 with combining marks kept inside words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer family a `tokenizer.ggml.pre` name selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreKind {
    /// llama.cpp's default BPE split (unknown names fall back to it, as llama.cpp does).
    Default,
    /// Plain GPT-2 regex.
    Gpt2,
    /// Llama 3 (tiktoken-style); also takes whole words found in the vocab without merging.
    Llama3,
    /// Qwen2 family.
    Qwen2,
    /// Qwen3.5.
    Qwen35,
    /// Every digit on its own, then the GPT-2 regex (SmolLM, StarCoder, ...).
    DigitsThenGpt2,
    /// DeepSeek coder split.
    DeepseekCoder,
    /// Falcon split.
    Falcon,
}

impl PreKind {
    /// Map a `tokenizer.ggml.pre` value (None: absent) to its family.
    pub fn from_name(pre: Option<&str>) -> Self {
        match pre.unwrap_or("default") {
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" => {
                Self::Llama3
            }
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de"
            | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "exaone4" | "trillion" | "granite-docling" => {
                Self::Gpt2
            }
            "qwen2" | "stablelm2" | "megrez" | "hunyuan" | "grok-2" => Self::Qwen2,
            "qwen35" => Self::Qwen35,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
                Self::DigitsThenGpt2
            }
            "deepseek-coder" => Self::DeepseekCoder,
            "falcon" => Self::Falcon,
            _ => Self::Default,
        }
    }

    /// The regexes applied in order.
    pub fn regexes(self) -> Vec<&'static str> {
        match self {
            Self::Default => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            Self::Gpt2 => vec![GPT2],
            Self::Llama3 => vec![LLAMA3],
            Self::Qwen2 => vec![QWEN2],
            Self::Qwen35 => vec![QWEN35],
            Self::DigitsThenGpt2 => vec![r"\p{N}", GPT2],
            Self::DeepseekCoder => vec![r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
            Self::Falcon => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
        }
    }

    /// Whether a whole pre-tokenized word that is itself in the vocab is taken
    /// as one token without running merges (llama.cpp `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        self == Self::Llama3
    }

    /// Whether BOS is added by default when the GGUF has no `add_bos_token`.
    pub fn default_add_bos(self) -> bool {
        self == Self::Llama3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_families() {
        assert_eq!(PreKind::from_name(Some("smollm")), PreKind::DigitsThenGpt2);
        assert_eq!(PreKind::from_name(Some("llama-bpe")), PreKind::Llama3);
        assert_eq!(PreKind::from_name(Some("qwen2")), PreKind::Qwen2);
        assert_eq!(PreKind::from_name(Some("gpt-2")), PreKind::Gpt2);
        assert_eq!(PreKind::from_name(None), PreKind::Default);
        assert_eq!(PreKind::from_name(Some("no-such")), PreKind::Default);
    }

    #[test]
    fn every_regex_compiles() {
        for kind in [
            PreKind::Default,
            PreKind::Gpt2,
            PreKind::Llama3,
            PreKind::Qwen2,
            PreKind::Qwen35,
            PreKind::DigitsThenGpt2,
            PreKind::DeepseekCoder,
            PreKind::Falcon,
        ] {
            for re in kind.regexes() {
                let split = tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                );
                assert!(split.is_ok(), "{kind:?}: {re}");
            }
        }
    }
}
