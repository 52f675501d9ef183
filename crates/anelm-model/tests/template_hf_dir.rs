//! Finding the chat template in a Hugging Face model directory.

use std::path::PathBuf;

use anelm_model::chat_template::{TemplateError, load_hf_chat_template};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anelm-tpl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn jinja_file_wins_over_config() {
    let dir = temp_dir("jinja");
    std::fs::write(dir.join("chat_template.jinja"), "FROM FILE").unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": "FROM CONFIG"}"#).unwrap();
    assert_eq!(load_hf_chat_template(&dir).unwrap().as_deref(), Some("FROM FILE"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn config_string_and_list_forms() {
    let dir = temp_dir("config");
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": "T"}"#).unwrap();
    assert_eq!(load_hf_chat_template(&dir).unwrap().as_deref(), Some("T"));
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]}"#,
    )
    .unwrap();
    assert_eq!(load_hf_chat_template(&dir).unwrap().as_deref(), Some("DEFAULT"));
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "rag", "template": "RAG"}, {"name": "tool_use", "template": "TOOLS"}]}"#,
    )
    .unwrap();
    assert!(matches!(load_hf_chat_template(&dir), Err(TemplateError::Config { .. })));
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": 5}"#).unwrap();
    assert!(load_hf_chat_template(&dir).is_err());
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"bos_token": "<s>"}"#).unwrap();
    assert_eq!(load_hf_chat_template(&dir).unwrap(), None);
    std::fs::write(dir.join("tokenizer_config.json"), "{oops").unwrap();
    let err = load_hf_chat_template(&dir).unwrap_err();
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn empty_dir_has_no_template() {
    let dir = temp_dir("empty");
    assert_eq!(load_hf_chat_template(&dir).unwrap(), None);
    std::fs::remove_dir_all(dir).ok();
}
