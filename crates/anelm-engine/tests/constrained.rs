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

/// The prompt's token ids, rendered as one user turn by the model's chat template.
fn prompt_ids(lm: &LoadedModel, prompt: &str) -> Vec<u32> {
    let msgs = [anelm_model::chat_template::ChatMessage::new("user", prompt)];
    let text = lm
        .template
        .render(&msgs, true, &serde_json::Map::new())
        .expect("template");
    lm.tokenizer.encode(&text).expect("encode")
}

/// Generate from `prompt` with `stream`: the token ids, the text and why it ended.
fn generate_from(lm: &LoadedModel, prompt: &str, stream: StreamOptions) -> (Vec<u32>, String, FinishReason) {
    let opts = GenerateOptions {
        stream,
        prefill_chunk: 128,
        speculate: None,
    };
    let mut session = lm.model.new_session(1024);
    let mut out = String::new();
    let (tokens, stats) = generate(
        lm.model.as_ref(),
        &lm.tokenizer,
        &mut session,
        &prompt_ids(lm, prompt),
        &opts,
        &mut |t| {
            out.push_str(t);
            true
        },
    )
    .expect("generate");
    (tokens, out, stats.finish)
}

/// Plain sampling at temperature 1 (no top-k, top-p or min-p) with `seed`, under `constraint`.
fn temperature_one(seed: u64, constraint: anelm_engine::Constraint, max_tokens: usize) -> StreamOptions {
    StreamOptions {
        sampler: SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerParams::default()
        },
        constraint: Some(constraint),
        ..StreamOptions::greedy(max_tokens)
    }
}

/// Generate `max_tokens` at most under `grammar`, sampling at temperature 1 with `seed`.
fn run(lm: &LoadedModel, prompt: &str, grammar: &Grammar, seed: u64, max_tokens: usize) -> (String, FinishReason) {
    let stream = temperature_one(seed, lm.constraint(grammar).expect("compiles"), max_tokens);
    let (_, text, finish) = generate_from(lm, prompt, stream);
    (text, finish)
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

/// [`run`] greedily, with the grammar's mask computed at every step or only where the greedy
/// draw from the raw logits is refused; the generated token ids.
fn greedy_tokens(lm: &LoadedModel, prompt: &str, grammar: &Grammar, mask_every_step: bool) -> Vec<u32> {
    let mut constraint = lm.constraint(grammar).expect("compiles");
    if mask_every_step {
        constraint.mask_every_step();
    }
    let stream = StreamOptions {
        constraint: Some(constraint),
        ..StreamOptions::greedy(80)
    };
    generate_from(lm, prompt, stream).0
}

#[test]
fn checking_the_greedy_draw_first_takes_the_tokens_masking_every_step_takes() {
    let lm = model();
    let schema = json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "year": {"type": "integer"},
            "genres": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
        },
        "required": ["title", "year", "genres"]
    });
    for (prompt, grammar) in [
        ("Describe a film as JSON.", Grammar::JsonSchema(schema)),
        ("Any JSON object.", Grammar::JsonObject),
        ("A code?", Grammar::Regex("[0-9]{3}-[a-z]{2,6}".into())),
    ] {
        let checked = greedy_tokens(&lm, prompt, &grammar, false);
        let masked = greedy_tokens(&lm, prompt, &grammar, true);
        assert!(!checked.is_empty(), "{grammar:?}");
        assert_eq!(checked, masked, "{grammar:?}");
    }
}

/// The id of a text that is one token.
fn single_token(lm: &LoadedModel, s: &str) -> u32 {
    match lm.tokenizer.encode(s).expect("encode").as_slice() {
        [t] => *t,
        other => panic!("{s:?} is {} tokens", other.len()),
    }
}

#[test]
fn checking_the_temperature_draw_first_keeps_the_masked_distribution() {
    // A row where the grammar (one of "a" or "b") allows half the mass: "a" 1, "b" 3, the
    // refused "c" 4 (weights after exp), everything else negligible. Masked, "a" has 1/4.
    let lm = model();
    let (a, b, c) = (single_token(&lm, "a"), single_token(&lm, "b"), single_token(&lm, "c"));
    let mut row = vec![-40.0f32; lm.tokenizer.vocab_size()];
    row[a as usize] = 0.0;
    row[b as usize] = 3f32.ln();
    row[c as usize] = 4f32.ln();
    let grammar = lm.constraint(&Grammar::Regex("[ab]".into())).expect("compiles");
    let trials = 4000u64;
    for (mask_every_step, prepared) in [(false, false), (false, true), (true, false)] {
        let mut constraint = grammar.clone();
        if mask_every_step {
            constraint.mask_every_step();
        }
        let mut count_a = 0u64;
        for seed in 0..trials {
            let opts = temperature_one(seed, constraint.clone(), 4);
            let mut stream = anelm_engine::stream::Stream::new(&lm.tokenizer, &opts).expect("stream");
            let mut logits = row.clone();
            if prepared {
                stream.prepare(&logits, &[]);
            }
            let step = stream.advance(&mut logits, &[], true).expect("advance");
            let t = step.token.expect("a token");
            assert!(t == a || t == b, "refused token {t} taken");
            count_a += u64::from(t == a);
        }
        // Binomial(4000, 1/4): mean 1000, sd 27.4; five sd either way.
        assert!(
            (863..=1137).contains(&count_a),
            "mask_every_step {mask_every_step}, prepared {prepared}: \"a\" {count_a} of {trials}"
        );
    }
}

/// Whether the array's items are pairwise different JSON values.
fn all_different(items: &[Value]) -> bool {
    items.iter().enumerate().all(|(i, a)| items[..i].iter().all(|b| a != b))
}

#[test]
fn unique_arrays_stay_unique_whatever_the_sampler_draws() {
    let lm = model();
    // pydantic's `set[str]` (forced to several items) and `set[Literal[...]]` asking for every value.
    let schema = json!({
        "$defs": {"Color": {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"}},
        "type": "object",
        "properties": {
            "words": {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": true,
                      "minItems": 4, "maxItems": 5},
            "colors": {"type": "array", "items": {"$ref": "#/$defs/Color"}, "uniqueItems": true, "minItems": 3},
            "flags": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": true, "minItems": 2},
            "small": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2},
                      "uniqueItems": true, "minItems": 3}
        },
        "required": ["words", "colors", "flags", "small"],
        "additionalProperties": false
    });
    let grammar = Grammar::JsonSchema(schema);
    for seed in 0..4 {
        for every_step in [false, true] {
            let mut c = lm.constraint(&grammar).expect("compiles");
            if every_step {
                c.mask_every_step();
            }
            let (_, text, finish) = generate_from(&lm, "Some words and colors as JSON.", temperature_one(seed, c, 160));
            assert_eq!(finish, FinishReason::Stop, "seed {seed}: {text:?}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
            for key in ["words", "colors", "flags", "small"] {
                let items = v[key].as_array().unwrap_or_else(|| panic!("{key}: {text}"));
                assert!(all_different(items), "seed {seed} {key} repeats: {text}");
            }
            assert_eq!(v["colors"].as_array().map(Vec::len), Some(3), "{text}");
        }
    }
}

#[test]
fn every_format_pydantic_and_zod_write_compiles() {
    let lm = model();
    let formats = [
        "date",
        "date-time",
        "time",
        "duration",
        "email",
        "idn-email",
        "name-email",
        "uri",
        "iri",
        "uri-reference",
        "multi-host-uri",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "ipvanyaddress",
        "ipv4network",
        "ipv6network",
        "ipvanynetwork",
        "ipv4interface",
        "ipv6interface",
        "ipvanyinterface",
        "uuid",
        "uuid1",
        "uuid4",
        "uuid7",
        "base64",
        "base64url",
        "binary",
        "password",
        "path",
        "file-path",
        "directory-path",
        "color",
        "regex",
        "json-pointer",
        "relative-json-pointer",
        "no-such-format",
    ];
    let mut props = serde_json::Map::new();
    for f in formats {
        props.insert(f.into(), json!({"type": "string", "format": f}));
    }
    props.insert("i64".into(), json!({"type": "integer", "format": "int64"}));
    props.insert(
        "constrained".into(),
        json!({"type": "string", "format": "email", "pattern": "^a", "maxLength": 40}),
    );
    props.insert(
        "json".into(),
        json!({"type": "string", "contentMediaType": "application/json", "contentSchema": {"type": "integer"}}),
    );
    props.insert(
        "keys".into(),
        json!({"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"enum": ["a", "b"]}}),
    );
    let schema = json!({"type": "object", "properties": props, "not": false, "dependentRequired": {"uuid": ["email"]}});
    lm.constraint(&Grammar::JsonSchema(schema))
        .expect("every format compiles");
    let tagged = Grammar::TaggedJson {
        open: "<tool_call>\n".into(),
        schema: json!({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
            "s": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}),
        close: "\n</tool_call>".into(),
    };
    lm.constraint(&tagged).expect("a tagged schema compiles");
}
