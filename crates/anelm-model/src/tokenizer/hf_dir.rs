//! Loading a [`Tokenizer`] from a Hugging Face model directory.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::gguf_vocab::parse_byte_token;
use super::{Engine, Parts, TokenKind, Tokenizer, TokenizerError, byte_level};

/// Read a file to a string.
fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parse a JSON file.
fn parse_json(path: &Path, text: &str) -> Result<Value, TokenizerError> {
    serde_json::from_str(text).map_err(|e| TokenizerError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Read an optional JSON file (absent → None).
fn read_optional_json(path: PathBuf) -> Result<Option<Value>, TokenizerError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = read(&path)?;
    parse_json(&path, &text).map(Some)
}

/// Whether a component (or any step of a `Sequence`) has `"type": ty`.
fn has_type(v: &Value, ty: &str) -> bool {
    match v {
        Value::Object(map) => {
            map.get("type").and_then(Value::as_str) == Some(ty)
                || ["decoders", "pretokenizers", "normalizers"]
                    .iter()
                    .filter_map(|k| map.get(*k))
                    .any(|inner| has_type(inner, ty))
        }
        Value::Array(items) => items.iter().any(|i| has_type(i, ty)),
        _ => false,
    }
}

/// Whether the decoder removes the SentencePiece space prefix from the first token.
fn strips_prefix(decoder: &Value) -> bool {
    match decoder {
        Value::Object(map) => match map.get("type").and_then(Value::as_str) {
            Some("Strip") => map.get("start").and_then(Value::as_u64).unwrap_or(0) > 0,
            Some("Metaspace") => {
                map.get("prepend_scheme").and_then(Value::as_str) != Some("never")
                    && map.get("add_prefix_space").and_then(Value::as_bool) != Some(false)
            }
            Some("Sequence") => map.get("decoders").is_some_and(strips_prefix),
            _ => false,
        },
        Value::Array(items) => items.iter().any(strips_prefix),
        _ => false,
    }
}

/// A token given in tokenizer_config.json as a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(m) => m.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// Ids from generation_config.json `eos_token_id` (an int or a list of ints).
fn id_list(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).into_iter().collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| i.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Load tokenizer.json plus the optional config files of `dir`.
pub(super) fn load(dir: &Path) -> Result<Tokenizer, TokenizerError> {
    let tj_path = dir.join("tokenizer.json");
    let text = read(&tj_path)?;
    let json = parse_json(&tj_path, &text)?;
    let tk: tokenizers::Tokenizer = text.parse().map_err(|e| TokenizerError::Json {
        path: tj_path.clone(),
        message: format!("{e}"),
    })?;
    let config = read_optional_json(dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let gen_config = read_optional_json(dir.join("generation_config.json"))?.unwrap_or(Value::Null);

    let null = Value::Null;
    let decoder = json.get("decoder").unwrap_or(&null);
    let byte_level =
        has_type(decoder, "ByteLevel") || has_type(json.get("pre_tokenizer").unwrap_or(&null), "ByteLevel");

    let vocab = tk.get_vocab(true);
    let size = vocab
        .values()
        .max()
        .map_or(0, |&m| m as usize + 1)
        .max(tk.get_vocab_size(true));
    let mut pieces: Vec<Option<String>> = vec![None; size];
    for (piece, &id) in &vocab {
        if let Some(slot) = pieces.get_mut(id as usize) {
            *slot = Some(piece.clone());
        }
    }
    let mut kinds = vec![TokenKind::Normal; size];
    let added = tk.get_added_tokens_decoder();
    for (&id, tok) in &added {
        if let Some(k) = kinds.get_mut(id as usize) {
            *k = if tok.special {
                TokenKind::Control
            } else {
                TokenKind::UserDefined
            };
        }
        if let Some(slot) = pieces.get_mut(id as usize) {
            *slot = Some(tok.content.clone());
        }
    }
    let bytes: Vec<Box<[u8]>> = pieces
        .iter()
        .zip(kinds.iter_mut())
        .map(|(p, k)| {
            let Some(p) = p else { return Box::default() };
            match *k {
                TokenKind::Control => Box::default(),
                TokenKind::UserDefined => p.as_bytes().into(),
                _ if byte_level => byte_level::decode_piece(p).into_boxed_slice(),
                _ => {
                    if let Some(b) = parse_byte_token(p) {
                        *k = TokenKind::Byte;
                        Box::new([b])
                    } else {
                        p.replace('\u{2581}', " ").into_bytes().into_boxed_slice()
                    }
                }
            }
        })
        .collect();

    let id_of = |name: &str| token_text(config.get(name)).and_then(|t| tk.token_to_id(t));
    let gen_eos = id_list(gen_config.get("eos_token_id"));
    // An encoder's tokenizer (ModernBERT's) names its text delimiters `cls_token` / `sep_token`
    // instead: they are what the post-processor puts around a text, as BOS and EOS are.
    let bos = id_of("bos_token")
        .or_else(|| id_list(gen_config.get("bos_token_id")).first().copied())
        .or_else(|| id_of("cls_token"));
    let eos = id_of("eos_token")
        .or_else(|| gen_eos.first().copied())
        .or_else(|| id_of("sep_token"));
    for id in [bos, eos].into_iter().flatten() {
        if let Some(k) = kinds.get_mut(id as usize)
            && *k == TokenKind::Normal
        {
            *k = TokenKind::Control;
        }
    }

    // Without explicit flags, ask the post-processor whether it adds BOS/EOS.
    let probe = |special: bool| -> Vec<u32> {
        tk.encode("a", special)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    };
    let (with, without) = (probe(true), probe(false));
    let add_bos = config
        .get("add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or_else(|| bos.is_some() && with.first() == bos.as_ref() && without.first() != bos.as_ref());
    let add_eos = config
        .get("add_eos_token")
        .and_then(Value::as_bool)
        .unwrap_or_else(|| eos.is_some() && with.last() == eos.as_ref() && without.last() != eos.as_ref());

    Ok(Tokenizer::assemble(Parts {
        engine: Engine::Hf(Box::new(tk)),
        pieces,
        kinds,
        bytes,
        bos,
        eos,
        extra_stops: gen_eos,
        add_bos,
        add_eos,
        strip_leading_space: !byte_level && strips_prefix(decoder),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn component_detection() {
        let d = json!({"type": "Sequence", "decoders": [
            {"type": "Replace"}, {"type": "ByteFallback"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]});
        assert!(strips_prefix(&d));
        assert!(!has_type(&d, "ByteLevel"));
        let gemma = json!({"type": "Sequence", "decoders": [{"type": "Replace"}, {"type": "ByteFallback"}]});
        assert!(!strips_prefix(&gemma));
        assert!(has_type(&json!({"type": "ByteLevel"}), "ByteLevel"));
        assert!(strips_prefix(&json!({"type": "Metaspace", "prepend_scheme": "always"})));
        assert!(!strips_prefix(&json!({"type": "Metaspace", "prepend_scheme": "never"})));
    }

    #[test]
    fn config_values() {
        assert_eq!(token_text(Some(&json!("<s>"))), Some("<s>"));
        assert_eq!(token_text(Some(&json!({"content": "</s>"}))), Some("</s>"));
        assert_eq!(token_text(Some(&json!(null))), None);
        assert_eq!(id_list(Some(&json!(7))), vec![7]);
        assert_eq!(id_list(Some(&json!([1, 106]))), vec![1, 106]);
        assert!(id_list(None).is_empty());
    }

    #[test]
    fn missing_dir_is_io_error() {
        let err = load(Path::new("/nonexistent/anelm-model-dir")).unwrap_err();
        assert!(matches!(err, TokenizerError::Io { .. }), "{err}");
    }
}
