//! Loading a tokenizer from a Hugging Face model directory (a small hand-made
//! byte-level BPE tokenizer.json plus the config files).

use std::path::PathBuf;

use anelm_model::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
use serde_json::{Value, json};

/// A fresh empty directory under the system temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anelm-tok-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// GPT-2's bytes_to_unicode, written out independently of the crate.
fn byte_chars() -> Vec<char> {
    let direct: Vec<u32> = (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut out = vec!['\0'; 256];
    let mut extra = 256;
    for b in 0..256u32 {
        let c = if direct.contains(&b) {
            b
        } else {
            extra += 1;
            extra - 1
        };
        out[b as usize] = char::from_u32(c).unwrap();
    }
    out
}

fn added(id: u32, content: &str, special: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": special})
}

/// Writes the model dir; returns it with the ids of "Ġhi" and "Ġh".
fn write_dir(name: &str, config: Option<Value>, gen_config: Option<Value>) -> PathBuf {
    let dir = temp_dir(name);
    let mut vocab = serde_json::Map::new();
    vocab.insert("<s>".into(), json!(0));
    vocab.insert("<|im_end|>".into(), json!(1));
    vocab.insert("<think>".into(), json!(2));
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(3 + i));
    }
    vocab.insert("Ġh".into(), json!(259));
    vocab.insert("Ġhi".into(), json!(260));
    let tj = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<s>", true), added(1, "<|im_end|>", true), added(2, "<think>", false)],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": ["Ġ h", "Ġh i"]}
    });
    std::fs::write(dir.join("tokenizer.json"), tj.to_string()).unwrap();
    if let Some(c) = config {
        std::fs::write(dir.join("tokenizer_config.json"), c.to_string()).unwrap();
    }
    if let Some(g) = gen_config {
        std::fs::write(dir.join("generation_config.json"), g.to_string()).unwrap();
    }
    dir
}

#[test]
fn loads_specials_flags_and_stops() {
    let dir = write_dir(
        "full",
        Some(json!({"bos_token": "<s>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": true})),
        Some(json!({"eos_token_id": [1, 2]})),
    );
    let tk = Tokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(tk.vocab_size(), 261);
    assert!(tk.adds_bos());
    assert_eq!(tk.bos_token(), Some("<s>"));
    assert_eq!(tk.eos_token(), Some("<|im_end|>"));
    let ids = tk.encode(" hi<|im_end|><think> h").unwrap();
    assert_eq!(ids, vec![0, 260, 1, 2, 259]);
    assert_eq!(tk.encode_no_special(" hi").unwrap(), vec![260]);
    // Control tokens drop out; the non-special added token stays as text.
    assert_eq!(tk.decode(&ids).unwrap(), " hi<think> h");
    assert!(tk.is_special(0) && tk.is_special(1) && !tk.is_special(2));
    assert_eq!(tk.stop_ids(), &[1, 2]);
    let mut s = StreamDecoder::new(&tk);
    let streamed: String = ids.iter().map(|&i| s.push(i)).collect();
    assert_eq!(streamed, " hi<think> h");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn config_files_are_optional() {
    let dir = write_dir("bare", None, None);
    let tk = Tokenizer::from_hf_dir(&dir).unwrap();
    assert!(!tk.adds_bos());
    assert_eq!(tk.bos_id(), None);
    assert_eq!(tk.encode(" hi").unwrap(), vec![260]);
    // <|im_end|> is a special token of the vocab, so it still ends generation.
    assert_eq!(tk.stop_ids(), &[1]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn malformed_files_are_errors() {
    let dir = write_dir("bad", None, None);
    std::fs::write(dir.join("tokenizer_config.json"), "{not json").unwrap();
    assert!(matches!(Tokenizer::from_hf_dir(&dir), Err(TokenizerError::Json { .. })));
    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = Tokenizer::from_hf_dir(&dir).unwrap_err();
    assert!(matches!(err, TokenizerError::Json { .. }), "{err}");
    std::fs::remove_dir_all(dir).ok();
}
