//! Building a [`Tokenizer`] from GGUF `tokenizer.ggml.*` metadata.

use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::pre_split::PreKind;
use super::specials::SpecialMatcher;
use super::spm::SpmEncoder;
use super::{Engine, Parts, TokenKind, Tokenizer, TokenizerError, byte_level};

/// Tokenizer metadata as a GGUF file carries it (`tokenizer.ggml.*` keys); the engine
/// fills this from the GGUF reader.
#[derive(Clone, Copy, Debug, Default)]
pub struct GgufVocab<'a> {
    /// tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece-style with scores).
    pub model: &'a str,
    /// tokenizer.ggml.pre: "smollm", "llama-bpe", "qwen2", "gpt-2", "default", ...
    pub pre: Option<&'a str>,
    /// tokenizer.ggml.tokens: entry per id.
    pub tokens: &'a [String],
    /// tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<&'a [i32]>,
    /// tokenizer.ggml.merges: "a b" pairs (gpt2).
    pub merges: Option<&'a [String]>,
    /// tokenizer.ggml.scores: merge priority per id (llama/SPM).
    pub scores: Option<&'a [f32]>,
    /// tokenizer.ggml.bos_token_id.
    pub bos: Option<u32>,
    /// tokenizer.ggml.eos_token_id.
    pub eos: Option<u32>,
    /// tokenizer.ggml.eot_token_id.
    pub eot: Option<u32>,
    /// tokenizer.ggml.eom_token_id.
    pub eom: Option<u32>,
    /// tokenizer.ggml.unknown_token_id.
    pub unk: Option<u32>,
    /// tokenizer.ggml.padding_token_id.
    pub pad: Option<u32>,
    /// tokenizer.ggml.add_bos_token.
    pub add_bos: Option<bool>,
    /// tokenizer.ggml.add_eos_token.
    pub add_eos: Option<bool>,
    /// tokenizer.ggml.add_space_prefix.
    pub add_space_prefix: Option<bool>,
}

/// Check that an optional special id lies inside the vocabulary.
fn check_id(name: &str, id: Option<u32>, n: usize) -> Result<(), TokenizerError> {
    match id {
        Some(i) if usize::try_from(i).map_or(true, |i| i >= n) => Err(TokenizerError::Vocab(format!(
            "{name} token id {i} is outside the vocabulary of {n} tokens"
        ))),
        _ => Ok(()),
    }
}

/// Parse a `<0xNN>` byte-token name.
pub(super) fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Build a tokenizer from GGUF metadata.
pub(super) fn build(v: &GgufVocab<'_>) -> Result<Tokenizer, TokenizerError> {
    let n = v.tokens.len();
    if n == 0 {
        return Err(TokenizerError::Vocab("tokenizer.ggml.tokens is empty".into()));
    }
    if u32::try_from(n).is_err() {
        return Err(TokenizerError::Vocab(format!("{n} tokens do not fit u32 ids")));
    }
    let mut kinds: Vec<TokenKind> = match v.token_types {
        Some(t) if t.len() != n => {
            return Err(TokenizerError::Vocab(format!(
                "tokenizer.ggml.token_type has {} entries but there are {n} tokens",
                t.len()
            )));
        }
        Some(t) => t.iter().map(|&c| TokenKind::from_gguf(c)).collect(),
        None => vec![TokenKind::Normal; n],
    };
    if let Some(s) = v.scores
        && s.len() != n
    {
        return Err(TokenizerError::Vocab(format!(
            "tokenizer.ggml.scores has {} entries but there are {n} tokens",
            s.len()
        )));
    }
    for (name, id) in [
        ("bos", v.bos),
        ("eos", v.eos),
        ("eot", v.eot),
        ("eom", v.eom),
        ("unknown", v.unk),
        ("padding", v.pad),
    ] {
        check_id(name, id, n)?;
    }
    // The sequence markers are control tokens even if the type array says otherwise.
    for id in [v.bos, v.eos, v.eot, v.eom].into_iter().flatten() {
        if let Some(k) = usize::try_from(id).ok().and_then(|i| kinds.get_mut(i))
            && *k == TokenKind::Normal
        {
            *k = TokenKind::Control;
        }
    }
    let extra_stops: Vec<u32> = [v.eot, v.eom].into_iter().flatten().collect();
    match v.model {
        "gpt2" => build_bpe(v, kinds, extra_stops),
        "llama" => {
            if v.token_types.is_none() {
                for (k, t) in kinds.iter_mut().zip(v.tokens) {
                    if *k == TokenKind::Normal && parse_byte_token(t).is_some() {
                        *k = TokenKind::Byte;
                    }
                }
            }
            Ok(build_spm(v, kinds, extra_stops))
        }
        other => Err(TokenizerError::UnsupportedModel(other.to_string())),
    }
}

/// Byte-level BPE through the `tokenizers` crate.
fn build_bpe(v: &GgufVocab<'_>, kinds: Vec<TokenKind>, extra_stops: Vec<u32>) -> Result<Tokenizer, TokenizerError> {
    let pre = PreKind::from_name(v.pre);
    let merge_lines = v
        .merges
        .ok_or_else(|| TokenizerError::Vocab("a gpt2 tokenizer needs tokenizer.ggml.merges".into()))?;
    let mut merges: Merges = Vec::with_capacity(merge_lines.len());
    for (i, line) in merge_lines.iter().enumerate() {
        // Split at the first space after the first char, as llama.cpp does.
        let at = line
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(p, _)| p)
            .ok_or_else(|| TokenizerError::Vocab(format!("merge {i} ({line:?}) is not of the form \"a b\"")))?;
        let (a, b) = (line.get(..at).unwrap_or(""), line.get(at + 1..).unwrap_or(""));
        merges.push((a.to_string(), b.to_string()));
    }
    let vocab: Vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges())
        .build()
        .map_err(|e| TokenizerError::Vocab(format!("BPE merges do not fit the vocabulary: {e}")))?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in pre.regexes() {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Backend(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(steps)));
    tk.with_decoder(Some(ByteLevel::default()));
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (t, k) in v.tokens.iter().zip(&kinds) {
        match k {
            TokenKind::Control | TokenKind::Unknown => {
                special.push(AddedToken::from(t.clone(), true).normalized(false));
            }
            TokenKind::UserDefined => {
                user.push(AddedToken::from(t.clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    tk.add_special_tokens(special)
        .map_err(|e| TokenizerError::Backend(e.to_string()))?;
    tk.add_tokens(user)
        .map_err(|e| TokenizerError::Backend(e.to_string()))?;
    let bytes = v
        .tokens
        .iter()
        .zip(&kinds)
        .map(|(t, k)| match k {
            TokenKind::Control => Box::default(),
            TokenKind::UserDefined => t.as_bytes().into(),
            _ => byte_level::decode_piece(t).into_boxed_slice(),
        })
        .collect();
    Ok(Tokenizer::assemble(Parts {
        engine: Engine::Hf(Box::new(tk)),
        pieces: v.tokens.iter().cloned().map(Some).collect(),
        kinds,
        bytes,
        bos: v.bos,
        eos: v.eos,
        extra_stops,
        add_bos: v.add_bos.unwrap_or(pre.default_add_bos()),
        add_eos: v.add_eos.unwrap_or(false),
        strip_leading_space: false,
    }))
}

/// SentencePiece-style vocabulary with scores.
fn build_spm(v: &GgufVocab<'_>, kinds: Vec<TokenKind>, extra_stops: Vec<u32>) -> Tokenizer {
    let add_space_prefix = v.add_space_prefix.unwrap_or(true);
    let mut byte_ids = vec![None; 256];
    let mut specials = Vec::new();
    let mut bytes: Vec<Box<[u8]>> = Vec::with_capacity(v.tokens.len());
    for (i, (t, k)) in v.tokens.iter().zip(&kinds).enumerate() {
        let id = i as u32;
        let byte = parse_byte_token(t);
        if let (TokenKind::Byte, Some(b)) = (k, byte)
            && let Some(slot) = byte_ids.get_mut(usize::from(b))
            && slot.is_none()
        {
            *slot = Some(id);
        }
        if matches!(k, TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown) {
            specials.push((t.clone(), id));
        }
        bytes.push(match (k, byte) {
            (TokenKind::Control, _) => Box::default(),
            (TokenKind::Byte, Some(b)) => Box::new([b]),
            _ => t.replace('\u{2581}', " ").into_bytes().into_boxed_slice(),
        });
    }
    let encoder = SpmEncoder {
        scores: v.scores.map_or_else(|| vec![0.0; v.tokens.len()], <[f32]>::to_vec),
        byte_ids,
        unk: v.unk,
        add_space_prefix,
        specials: SpecialMatcher::new(specials),
    };
    Tokenizer::assemble(Parts {
        engine: Engine::Spm(encoder),
        pieces: v.tokens.iter().cloned().map(Some).collect(),
        kinds,
        bytes,
        bos: v.bos,
        eos: v.eos,
        extra_stops,
        add_bos: v.add_bos.unwrap_or(true),
        add_eos: v.add_eos.unwrap_or(false),
        strip_leading_space: add_space_prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A tiny byte-level vocab: all 256 byte chars, a few merges, two specials.
    fn tiny_bpe() -> (Vec<String>, Vec<i32>, Vec<String>) {
        let mut tokens = strings(&["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
        let mut types = vec![3, 3, 3];
        for &c in byte_level::byte_to_char() {
            tokens.push(c.to_string());
            types.push(1);
        }
        let merges = strings(&["Ġ t", "h e", "Ġt he", "1 2"]);
        for m in &merges {
            tokens.push(m.replace(' ', ""));
            types.push(1);
        }
        (tokens, types, merges)
    }

    #[test]
    fn bpe_merges_specials_and_decode() {
        let (tokens, types, merges) = tiny_bpe();
        let v = GgufVocab {
            model: "gpt2",
            pre: Some("smollm"),
            tokens: &tokens,
            token_types: Some(&types),
            merges: Some(&merges),
            bos: Some(1),
            eos: Some(2),
            add_bos: Some(true),
            ..Default::default()
        };
        let tk = Tokenizer::from_gguf_vocab(&v).unwrap();
        let the = tk.token_id("Ġthe").unwrap();
        let ids = tk.encode("<|im_start|> the12").unwrap();
        // smollm splits digits one by one, so "12" does not merge.
        let one = tk.token_id("1").unwrap();
        let two = tk.token_id("2").unwrap();
        assert_eq!(ids, vec![1, 1, the, one, two]);
        assert_eq!(tk.decode(&ids).unwrap(), " the12");
        assert!(tk.is_special(1));
        assert!(tk.stop_ids().contains(&2));
        assert!(tk.stop_ids().contains(&0));
        assert_eq!(tk.bos_token(), Some("<|im_start|>"));
        assert!(tk.adds_bos());
        assert_eq!(tk.encode_no_special("12").unwrap(), vec![one, two]);
        // The GPT-2 pre-tokenizer keeps digit runs together.
        let v2 = GgufVocab {
            pre: Some("gpt-2"),
            ..v
        };
        let tk2 = Tokenizer::from_gguf_vocab(&v2).unwrap();
        assert_eq!(tk2.encode_no_special("12").unwrap(), vec![tk2.token_id("12").unwrap()]);
    }

    #[test]
    fn bad_metadata_is_an_error() {
        let (tokens, types, merges) = tiny_bpe();
        let base = GgufVocab {
            model: "gpt2",
            tokens: &tokens,
            token_types: Some(&types),
            merges: Some(&merges),
            ..Default::default()
        };
        assert!(Tokenizer::from_gguf_vocab(&base).is_ok());
        let short = &types[..3];
        let cases = [
            GgufVocab {
                token_types: Some(short),
                ..base
            },
            GgufVocab { merges: None, ..base },
            GgufVocab {
                eos: Some(1_000_000),
                ..base
            },
            GgufVocab { model: "bert", ..base },
            GgufVocab { tokens: &[], ..base },
        ];
        for c in cases {
            assert!(Tokenizer::from_gguf_vocab(&c).is_err(), "{c:?}");
        }
        let bad_merge = strings(&["nospace"]);
        let c = GgufVocab {
            merges: Some(&bad_merge),
            ..base
        };
        assert!(Tokenizer::from_gguf_vocab(&c).is_err());
        let unknown_merge = strings(&["zz qq"]);
        let c = GgufVocab {
            merges: Some(&unknown_merge),
            ..base
        };
        assert!(Tokenizer::from_gguf_vocab(&c).is_err());
    }

    #[test]
    fn spm_vocab_roundtrip() {
        let mut tokens = strings(&["<unk>", "<s>", "</s>", "<end_of_turn>"]);
        let mut types = vec![2, 3, 3, 3];
        let mut scores = vec![0.0, 0.0, 0.0, 0.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        for (p, s) in [("▁", -1.0), ("▁H", -3.0), ("i", -2.0), ("H", -2.0), ("▁Hi", -1.0)] {
            tokens.push(p.to_string());
            types.push(1);
            scores.push(s);
        }
        let v = GgufVocab {
            model: "llama",
            tokens: &tokens,
            token_types: Some(&types),
            scores: Some(&scores),
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            ..Default::default()
        };
        let tk = Tokenizer::from_gguf_vocab(&v).unwrap();
        let hi = tk.token_id("▁Hi").unwrap();
        let ids = tk.encode("Hi<end_of_turn>Hi é").unwrap();
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(ids.get(1..4), Some(&[hi, 3, hi][..]));
        assert!(tk.stop_ids().contains(&3));
        assert_eq!(tk.decode(&ids).unwrap(), "Hi Hi é");
        assert_eq!(tk.token_bytes(4 + 0xC3), vec![0xC3]);
        assert_eq!(tk.token_bytes(hi), b" Hi");
    }

    #[test]
    fn byte_token_names_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xFF>"), Some(255));
        assert_eq!(parse_byte_token("<0x100>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }
}
