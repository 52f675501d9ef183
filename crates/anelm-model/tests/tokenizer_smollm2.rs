//! The SmolLM2-135M-Instruct GGUF vocabulary (committed compact copy of its
//! `tokenizer.*` metadata) checked against llama.cpp's tokenization and
//! detokenization, plus round-trips of awkward strings.

use std::path::PathBuf;
use std::sync::OnceLock;

use anelm_model::tokenizer::{GgufVocab, StreamDecoder, Tokenizer};
use serde_json::Value;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} missing"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The tokenizer, built once per test binary.
fn shared() -> &'static Tokenizer {
    static TK: OnceLock<Tokenizer> = OnceLock::new();
    TK.get_or_init(smollm2)
}

fn smollm2() -> Tokenizer {
    let path = manifest().join("tests/fixtures/smollm2_tokenizer_meta.json");
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let tokens = strings(&meta, "tokenizer.ggml.tokens");
    let merges = strings(&meta, "tokenizer.ggml.merges");
    let types: Vec<i32> = meta["tokenizer.ggml.token_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap() as i32)
        .collect();
    let id = |k: &str| meta[k].as_u64().map(|v| v as u32);
    let v = GgufVocab {
        model: meta["tokenizer.ggml.model"].as_str().unwrap(),
        pre: meta["tokenizer.ggml.pre"].as_str(),
        tokens: &tokens,
        token_types: Some(&types),
        merges: Some(&merges),
        scores: None,
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
        eot: None,
        eom: None,
        unk: id("tokenizer.ggml.unknown_token_id"),
        pad: id("tokenizer.ggml.padding_token_id"),
        add_bos: meta["tokenizer.ggml.add_bos_token"].as_bool(),
        add_eos: None,
        add_space_prefix: meta["tokenizer.ggml.add_space_prefix"].as_bool(),
    };
    Tokenizer::from_gguf_vocab(&v).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn matches_llama_cpp_prompts_and_completions() {
    let path = manifest().join("../../fixtures/llamacpp/smollm2-llamacpp-greedy.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        panic!(
            "llama.cpp fixture not found at {} (fixtures/llamacpp/ is part of the repository)",
            path.display()
        );
    };
    let fixture: Value = serde_json::from_str(&text).unwrap();
    let tk = smollm2();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(
            tk.encode(prompt).unwrap(),
            ids(&case["prompt_ids"]),
            "prompt {prompt:?}"
        );
        let completion = ids(&case["completion_ids"]);
        let expected = case["completion_text"].as_str().unwrap();
        assert_eq!(tk.decode(&completion).unwrap(), expected);
        // Streaming gives the same text.
        let mut stream = StreamDecoder::new(&tk);
        let mut streamed: String = completion.iter().map(|&id| stream.push(id)).collect();
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, expected);
    }
}

#[test]
fn metadata_accessors() {
    let tk = smollm2();
    assert_eq!(tk.vocab_size(), 49152);
    assert!(!tk.adds_bos());
    assert_eq!(tk.bos_id(), Some(1));
    assert_eq!(tk.bos_token(), Some("<|im_start|>"));
    assert_eq!(tk.eos_token(), Some("<|im_end|>"));
    assert_eq!(tk.token_id("<|im_end|>"), Some(2));
    assert_eq!(tk.token_str(198), Some("Ċ"));
    assert_eq!(tk.token_bytes(198), b"\n");
    assert!(tk.token_bytes(1).is_empty());
    assert!(tk.is_special(1) && !tk.is_special(198));
    assert!(tk.stop_ids().contains(&2));
    assert!(tk.stop_ids().contains(&0), "<|endoftext|> ends generation");
    assert!(tk.token_str(49152).is_none());
    assert!(tk.decode(&[49152]).is_err());
    // Control tokens are dropped from text.
    assert_eq!(tk.decode(&[1, 4093, 198]).unwrap(), "user\n");
}

/// Token ids of the SmolLM2 tokenizer for a few strings, as asserted by an
/// independent public implementation's self-check (not produced by this code).
#[test]
fn matches_independent_reference_ids() {
    let tk = smollm2();
    let cases: &[(&str, &[u32])] = &[
        ("Hello, we can use", &[19556, 28, 392, 416, 722]),
        ("\n", &[198]),
        ("Hello world! 123", &[19556, 905, 17, 216, 33, 34, 35]),
        ("Café déjà vu.", &[51, 1939, 2756, 32564, 90, 16739, 386, 101, 30]),
        ("  multiple   spaces", &[216, 2701, 256, 5600]),
    ];
    for (text, expected) in cases {
        assert_eq!(&tk.encode(text).unwrap(), expected, "{text:?}");
    }
}

#[test]
fn tricky_strings_round_trip() {
    let tk = smollm2();
    let samples = [
        "",
        " ",
        "   leading and trailing   ",
        "multiple    spaces\tand\ttabs",
        "lines\n\n\nand\r\nwindows\r\n",
        "digits 1234567890 and 3.14159 and -42",
        "unicode: naïve café Ωμέγα 日本語 한국어 עברית",
        "emoji 😀🎉👩‍👩‍👧 flags 🇫🇷",
        "<|im_start|>user\nhi<|im_end|>",
        "x<|im_end|>y<|endoftext|>z",
        "code: fn main() { println!(\"{}\", a[0]); }",
        "it's they're we've I'm you'll he'd",
        "\u{0}\u{1}\u{7f} control bytes",
    ];
    for s in samples {
        let ids = tk.encode(s).unwrap();
        let specials_removed = s
            .replace("<|im_start|>", "")
            .replace("<|im_end|>", "")
            .replace("<|endoftext|>", "");
        assert_eq!(tk.decode(&ids).unwrap(), specials_removed, "{s:?} → {ids:?}");
        // Specials written in the text are single tokens.
        for (name, id) in [("<|im_start|>", 1u32), ("<|im_end|>", 2), ("<|endoftext|>", 0)] {
            assert_eq!(
                s.matches(name).count(),
                ids.iter().filter(|&&i| i == id).count(),
                "{s:?}"
            );
        }
        // Byte-wise concatenation of token bytes is the text itself.
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| tk.token_bytes(i)).collect();
        assert_eq!(bytes, specials_removed.as_bytes());
    }
}

#[test]
fn stream_holds_back_split_chars() {
    let tk = smollm2();
    // An emoji is several byte tokens in this vocab; no partial char may come out.
    let text = "a😀b日本";
    let ids = tk.encode(text).unwrap();
    let mut stream = StreamDecoder::new(&tk);
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        let piece = stream.push(id);
        held += usize::from(piece.is_empty());
        assert!(!piece.contains('\u{FFFD}'), "split char in {piece:?}");
        out.push_str(&piece);
    }
    out.push_str(&stream.finish());
    assert_eq!(out, text);
    assert!(held > 0, "expected some multi-token chars in {ids:?}");
    // A dangling lead byte is flushed lossily by finish.
    let lead = (0..tk.vocab_size() as u32)
        .find(|&i| tk.token_bytes(i) == [0xF0])
        .unwrap();
    let mut stream = StreamDecoder::new(&tk);
    assert_eq!(stream.push(lead), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Any text (no special-token markup) encodes without panicking and decodes back exactly,
    /// and streaming gives the same text.
    #[test]
    fn arbitrary_text_round_trips(s in "\\PC{0,40}|[ \\t\\n0-9a-zé日😀]{0,40}") {
        let tk = shared();
        let ids = tk.encode(&s).unwrap();
        proptest::prop_assert_eq!(tk.decode(&ids).unwrap(), s.clone());
        let mut stream = StreamDecoder::new(tk);
        let mut out: String = ids.iter().map(|&i| stream.push(i)).collect();
        out.push_str(&stream.finish());
        proptest::prop_assert_eq!(out, s);
    }

    /// Arbitrary ids (in range) decode without panicking; out-of-range ids are errors.
    #[test]
    fn arbitrary_ids_decode(ids in proptest::collection::vec(0u32..49152, 0..32), bad in 49152u32..) {
        let tk = shared();
        let text = tk.decode(&ids).unwrap();
        let mut stream = StreamDecoder::new(tk);
        let mut out: String = ids.iter().map(|&i| stream.push(i)).collect();
        out.push_str(&stream.finish());
        proptest::prop_assert_eq!(out, text);
        proptest::prop_assert!(tk.decode(&[bad]).is_err());
    }
}
