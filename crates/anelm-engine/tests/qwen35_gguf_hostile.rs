//! A malformed GGUF `qwen35` file is an error, never a panic: the committed fixture
//! (`tests/fixtures/gguf/qwen3_5_text.gguf`) with one metadata value or the file length corrupted.

use std::path::PathBuf;

use anelm_engine::{CpuBackend, load_model_weights};

fn fixture() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3_5_text.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Overwrite the u32 value of metadata key `key` (GGUF: key string, u32 type tag 4, value).
fn set_u32(bytes: &mut [u8], key: &str, value: u32) {
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_bytes())
        .unwrap_or_else(|| panic!("key {key} not in the fixture"));
    let tag = at + key.len();
    assert_eq!(&bytes[tag..tag + 4], &4u32.to_le_bytes(), "{key} is a u32");
    bytes[tag + 4..tag + 8].copy_from_slice(&value.to_le_bytes());
}

/// Load `bytes` as a model file; `Err` text, or "loaded".
fn load(bytes: &[u8], label: &str) -> String {
    let path = std::env::temp_dir().join(format!("anelm-qwen35-hostile-{}-{label}.gguf", std::process::id()));
    std::fs::write(&path, bytes).expect("write temp file");
    let result = load_model_weights(&path, &CpuBackend::new(), &mut |_, _| {});
    let _ = std::fs::remove_file(&path);
    match result {
        Ok(_) => "loaded".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_fixture_itself_loads() {
    assert_eq!(load(&fixture(), "ok"), "loaded");
}

#[test]
fn corrupted_metadata_is_an_error() {
    let cases: &[(&str, u32)] = &[
        ("qwen35.ssm.time_step_rank", 0),
        ("qwen35.ssm.time_step_rank", 3),
        ("qwen35.ssm.time_step_rank", 1 << 30),
        ("qwen35.ssm.group_count", 0),
        ("qwen35.ssm.group_count", 3),
        ("qwen35.ssm.state_size", 1 << 31),
        ("qwen35.ssm.inner_size", 7),
        ("qwen35.ssm.conv_kernel", 0),
        ("qwen35.ssm.conv_kernel", u32::MAX),
        ("qwen35.block_count", 3),
        ("qwen35.block_count", u32::MAX),
        ("qwen35.embedding_length", 65),
        ("qwen35.attention.head_count", 0),
        ("qwen35.attention.head_count", 1 << 20),
        ("qwen35.attention.head_count_kv", 3),
        ("qwen35.attention.key_length", 0),
        ("qwen35.attention.key_length", 1 << 30),
        ("qwen35.rope.dimension_count", 9),
        ("qwen35.rope.dimension_count", 1000),
        ("qwen35.feed_forward_length", 63),
    ];
    for &(key, value) in cases {
        let mut bytes = fixture();
        set_u32(&mut bytes, key, value);
        let got = load(&bytes, &format!("{key}-{value}"));
        assert_ne!(got, "loaded", "{key} = {value} must not load");
        println!("{key} = {value}: {got}");
    }
}

#[test]
fn truncated_files_are_an_error() {
    let bytes = fixture();
    for cut in [8, 100, 2000, bytes.len() / 2, bytes.len() - 1] {
        let got = load(&bytes[..cut], &format!("cut-{cut}"));
        assert_ne!(got, "loaded", "a file cut at {cut} bytes must not load");
    }
}
