//! Constrained decoding on the default model (SmolLM2-135M Q4_1): whatever the sampler draws, the
//! output matches the grammar; an invalid grammar is refused with llguidance's reason.
//!
//! Needs the default model (`scripts/fetch-default-model.sh`; `scripts/test.sh` runs it first).

use anelm_engine::default_model::{FETCH_COMMAND, default_model_location};
use anelm_engine::{
    ConstraintError, CpuBackend, EngineError, FinishReason, GenerateOptions, Grammar, LoadedModel, SamplerParams,
    StreamOptions, generate, load_model,
};
use serde_json::{Value, json};

fn model() -> LoadedModel {
    let path = default_model_location().expect("a home directory");
    assert!(
        path.is_file(),
        "default model missing at {}: run {FETCH_COMMAND}",
        path.display()
    );
    load_model(&path, &CpuBackend::new(), &mut |_, _| {}).expect("load SmolLM2")
}

/// Generate `max_tokens` at most under `grammar`, sampling at temperature 1 with `seed`.
fn run(lm: &LoadedModel, prompt: &str, grammar: &Grammar, seed: u64, max_tokens: usize) -> (String, FinishReason) {
    let msgs = [anelm_model::chat_template::ChatMessage::new("user", prompt)];
    let text = lm
        .template
        .render(&msgs, true, &serde_json::Map::new())
        .expect("template");
    let ids = lm.tokenizer.encode(&text).expect("encode");
    let opts = GenerateOptions {
        stream: StreamOptions {
            sampler: SamplerParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..SamplerParams::default()
            },
            constraint: Some(lm.constraint(grammar).expect("compiles")),
            ..StreamOptions::greedy(max_tokens)
        },
        prefill_chunk: 128,
    };
    let mut session = lm.model.new_session(1024);
    let mut out = String::new();
    let (_, stats) = generate(lm.model.as_ref(), &lm.tokenizer, &mut session, &ids, &opts, &mut |t| {
        out.push_str(t);
        true
    })
    .expect("generate");
    (out, stats.finish)
}

#[test]
fn sampled_output_always_matches_the_schema_and_the_regex() {
    let lm = model();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    });
    let grammar = Grammar::JsonSchema(schema);
    for seed in 0..4 {
        let (text, finish) = run(&lm, "Describe a person as JSON.", &grammar, seed, 120);
        assert_eq!(
            finish,
            FinishReason::Stop,
            "seed {seed}: the grammar completes: {text:?}"
        );
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
        let o = v.as_object().expect("an object");
        assert_eq!(o.len(), 3, "{text}");
        assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 20), "{text}");
        assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
        let tags = o["tags"].as_array().expect("tags");
        assert!((1..=3).contains(&tags.len()), "{text}");
        assert!(
            tags.iter().all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap_or(""))),
            "{text}"
        );
    }
    let (text, _) = run(&lm, "Any JSON object.", &Grammar::JsonObject, 7, 60);
    if !text.is_empty() {
        assert!(text.starts_with('{'), "{text:?}");
    }
    for seed in 0..3 {
        let (text, finish) = run(&lm, "A number?", &Grammar::Regex("[0-9]{3}-[a-z]{2}".into()), seed, 20);
        assert_eq!(finish, FinishReason::Stop, "{text:?}");
        let b = text.as_bytes();
        assert!(
            b.len() == 6
                && b[..3].iter().all(u8::is_ascii_digit)
                && b[3] == b'-'
                && b[4..].iter().all(u8::is_ascii_lowercase),
            "{text:?}"
        );
    }
}

#[test]
fn invalid_grammars_are_refused_with_a_reason() {
    let lm = model();
    for bad in [
        Grammar::JsonSchema(json!({"type": "no-such-type"})),
        Grammar::Lark("start: undefined_rule".into()),
        Grammar::Regex("(".into()),
    ] {
        match lm.constraint(&bad) {
            Err(EngineError::Constraint(ConstraintError::Invalid(reason))) => {
                assert!(!reason.is_empty(), "{bad:?}");
            }
            other => panic!("{bad:?}: expected Invalid, got {:?}", other.map(|_| ())),
        }
    }
}
