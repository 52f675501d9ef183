//! `config.json` parsing: plain, nested multimodal, and the odd shapes real configs take.

use anelm_model::hf_config::HfConfig;

const LLAMA: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pad_token_id": 2,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 100000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 49152
}"#;

const QWEN35: &str = r#"{
  "architectures": ["Qwen3_5ForConditionalGeneration"],
  "model_type": "qwen3_5",
  "image_token_id": 248056,
  "tie_word_embeddings": false,
  "eos_token_id": 1,
  "text_config": {
    "model_type": "qwen3_5_text",
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "vocab_size": 248320,
    "eos_token_id": [248046, 248044],
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_num_value_heads": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": true
  },
  "vision_config": {"hidden_size": 768, "model_type": "qwen3_5_vision"}
}"#;

#[test]
fn plain_llama() {
    let c = HfConfig::from_json_str(LLAMA).unwrap();
    assert_eq!(c.model_type, "llama");
    assert_eq!(c.architectures, vec!["LlamaForCausalLM".to_string()]);
    assert_eq!(c.hidden_size, Some(576));
    assert_eq!(c.intermediate_size, Some(1536));
    assert_eq!(c.num_hidden_layers, Some(30));
    assert_eq!(c.num_attention_heads, Some(9));
    assert_eq!(c.num_key_value_heads, Some(3));
    assert_eq!(c.head_dim, None);
    assert_eq!(c.rms_norm_eps, Some(1e-5));
    assert_eq!(c.rope_theta, Some(100_000.0), "integer JSON accepted as float");
    assert_eq!(c.vocab_size, Some(49152));
    assert_eq!(c.tie_word_embeddings, Some(true));
    assert_eq!(c.max_position_embeddings, Some(8192));
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    assert_eq!(c.pad_token_id, Some(2));
    assert_eq!(c.hidden_act.as_deref(), Some("silu"));
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    assert!(c.layer_types.is_empty());
    assert_eq!(c.raw()["attention_bias"], serde_json::Value::Bool(false));
}

#[test]
fn qwen35_nested_text_config() {
    let c = HfConfig::from_json_str(QWEN35).unwrap();
    assert_eq!(c.model_type, "qwen3_5_text", "text config's model_type wins");
    assert_eq!(c.architectures, vec!["Qwen3_5ForConditionalGeneration".to_string()]);
    assert_eq!(c.hidden_size, Some(1024));
    assert_eq!(c.num_hidden_layers, Some(4));
    assert_eq!(c.head_dim, Some(256));
    assert_eq!(c.rms_norm_eps, Some(1e-6));
    assert_eq!(c.rope_theta, Some(10_000_000.0), "from rope_parameters");
    assert_eq!(c.partial_rotary_factor, Some(0.25));
    assert_eq!(
        c.eos_token_ids,
        vec![248046, 248044],
        "text config overrides, list form"
    );
    assert_eq!(c.tie_word_embeddings, Some(true), "text config overrides top level");
    assert_eq!(c.layer_types.len(), 4);
    assert_eq!(c.layer_types[3], "full_attention");
    // Architecture-specific keys from both levels are reachable through raw().
    assert_eq!(c.raw()["linear_num_value_heads"], 16);
    assert_eq!(c.raw()["image_token_id"], 248056);
    assert!(c.raw().get("text_config").is_none());
    // vision_config is not merged into the text model.
    assert_eq!(c.raw()["vision_config"]["model_type"], "qwen3_5_vision");
    assert_eq!(c.hidden_size, Some(1024));
}

#[test]
fn eos_list_at_top_level_and_top_level_rope_theta_wins() {
    let c = HfConfig::from_json_str(
        r#"{"model_type":"qwen3","eos_token_id":[151645,151643],"rope_theta":1000000.0,
            "rope_parameters":{"rope_theta":5.0}}"#,
    )
    .unwrap();
    assert_eq!(c.eos_token_ids, vec![151645, 151643]);
    assert_eq!(c.rope_theta, Some(1_000_000.0));
    assert!(c.architectures.is_empty());
}

#[test]
fn from_file_reads_and_reports_path() {
    let dir = std::env::temp_dir().join(format!("anelm-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("config.json");
    std::fs::write(&p, LLAMA).unwrap();
    let c = HfConfig::from_file(&p).unwrap();
    assert_eq!(c, HfConfig::from_json_str(LLAMA).unwrap());
    std::fs::write(&p, "{").unwrap();
    let e = HfConfig::from_file(&p).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.contains("config.json"), "{e}");
    let e = HfConfig::from_file(&dir.join("nope.json")).unwrap_err().to_string();
    assert!(e.contains("nope.json"), "{e}");
}
