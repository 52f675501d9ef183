//! `anelm embed`: texts from arguments, `--file` and stdin become JSON lines
//! `{"index", "embedding"}` equal to sentence-transformers' vectors (the fixture of
//! crates/anelm-engine/tests/minilm.rs). Needs all-MiniLM-L6-v2 (`scripts/fetch-minilm.sh`;
//! `scripts/test.sh` runs it first).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn minilm() -> String {
    let dir = anelm_engine::default_model::default_embedding_model_location().expect("a home directory");
    assert!(
        dir.join("modules.json").is_file(),
        "{} is missing: run scripts/fetch-minilm.sh (scripts/test.sh does)",
        dir.display()
    );
    dir.to_string_lossy().into_owned()
}

fn embed(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .arg("embed")
        .args(args)
        .args(["--threads", "2", "--device", "cpu"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run anelm");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.unwrap_or("").as_bytes()).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("anelm output")
}

/// (text, sentence-transformers embedding) of every fixture case.
fn fixture() -> Vec<(String, Vec<f64>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../anelm-engine/tests/fixtures/embeddings/minilm.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    v["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|c| {
            let e = c["embedding"].as_array().expect("embedding");
            (
                c["text"].as_str().expect("text").to_string(),
                e.iter().map(|x| x.as_f64().expect("number")).collect(),
            )
        })
        .collect()
}

fn lines(o: &Output) -> Vec<(u64, Vec<f64>)> {
    assert!(
        o.status.success(),
        "anelm embed failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            let e = v["embedding"].as_array().expect("embedding");
            (
                v["index"].as_u64().expect("index"),
                e.iter().map(|x| x.as_f64().expect("number")).collect(),
            )
        })
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt())
}

/// Every line's index counts up from 0 and its vector matches the fixture's for `cases`.
fn check(got: &[(u64, Vec<f64>)], cases: &[&(String, Vec<f64>)]) {
    assert_eq!(got.len(), cases.len(), "one line per text");
    for (i, ((index, v), (text, want))) in got.iter().zip(cases.iter().map(|c| (&c.0, &c.1))).enumerate() {
        assert_eq!(*index, i as u64);
        let cos = cosine(v, want);
        assert!(cos >= 0.9999, "cosine {cos} for {text:?}");
    }
}

#[test]
fn texts_from_arguments_file_and_stdin() {
    let fx = fixture();
    let model = minilm();
    // Arguments (with the default model: no --model).
    let picked: Vec<&(String, Vec<f64>)> = [0, 6, 9].iter().map(|&i| &fx[i]).collect();
    let args: Vec<&str> = picked.iter().map(|c| c.0.as_str()).collect();
    check(&lines(&embed(&args, None)), &picked);

    // A file, one text per line, fed through in batches of 4 (the fixture's single-line texts).
    let single: Vec<&(String, Vec<f64>)> = fx
        .iter()
        .filter(|c| !c.0.contains('\n') && !c.0.trim().is_empty())
        .collect();
    assert!(single.len() >= 15);
    let path = std::env::temp_dir().join(format!("anelm-embed-test-{}.txt", std::process::id()));
    let body: String = single.iter().map(|c| format!("{}\n", c.0)).collect();
    std::fs::write(&path, &body).expect("write the text file");
    let out = embed(
        &[
            "--model",
            &model,
            "--file",
            path.to_str().expect("path"),
            "--batch",
            "4",
        ],
        None,
    );
    let _ = std::fs::remove_file(&path);
    check(&lines(&out), &single);

    // Stdin lines.
    check(&lines(&embed(&["--model", &model], Some(&body))), &single);
}

#[test]
fn dimensions_truncate_and_renormalise() {
    let fx = fixture();
    let out = lines(&embed(&["--model", &minilm(), "--dimensions", "32", &fx[1].0], None));
    assert_eq!(out.len(), 1);
    let v = &out[0].1;
    assert_eq!(v.len(), 32);
    assert!((v.iter().map(|x| x * x).sum::<f64>().sqrt() - 1.0).abs() < 1e-5);
    assert!(cosine(v, &fx[1].1[..32]) > 0.9999);
}

#[test]
fn a_directory_that_is_not_an_embedding_model_is_a_one_line_error() {
    let dir = std::env::temp_dir();
    let o = embed(&["--model", dir.to_str().expect("path"), "hello"], None);
    assert_eq!(o.status.code(), Some(1), "exit code (101 would be a panic)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one-line error, got: {err}");
    assert!(err.contains("modules.json"), "{err}");
    // A path that is not there says so, rather than asking for a modules.json.
    let missing = dir.join("anelm-no-such-embedder.gguf");
    let o = embed(&["--model", missing.to_str().expect("path"), "hello"], None);
    assert_eq!(o.status.code(), Some(1), "exit code (101 would be a panic)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one-line error, got: {err}");
    assert!(err.contains("no such file"), "{err}");
}

/// The tiny Qwen3 decoder embedder: `--embedding-prompt query` and `--embedding-instruction`
/// with the same text give sentence-transformers' query embeddings; an unknown prompt name is a
/// one-line error naming the model's prompts.
#[test]
fn a_decoder_embedder_takes_its_prompt_by_name_or_text() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../anelm-engine/tests/fixtures/embeddings/qwen3-embedder");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).expect("reference")).expect("json");
    let prompt = v["query_prompt"].as_str().expect("query_prompt");
    let case = &v["query_texts"][1];
    let text = case["text"].as_str().expect("text");
    let want = embedding_of(case);
    let model = dir.to_str().expect("utf-8 path");
    for flags in [["--embedding-prompt", "query"], ["--embedding-instruction", prompt]] {
        let out = lines(&embed(&["--model", model, flags[0], flags[1], text], None));
        assert_eq!(out.len(), 1);
        let cos = cosine(&out[0].1, &want);
        assert!(cos >= 0.9999, "{flags:?}: cosine {cos}");
    }
    // Without the prompt the vector is another one.
    let plain = lines(&embed(&["--model", model, text], None));
    assert!(
        cosine(&plain[0].1, &want) < 0.9999,
        "the prompt should change the embedding"
    );
    let o = embed(&["--model", model, "--embedding-prompt", "nope", text], None);
    assert_eq!(o.status.code(), Some(1), "exit code (101 would be a panic)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one-line error, got: {err}");
    assert!(err.contains("no prompt 'nope'") && err.contains("query"), "{err}");
}

/// An embedding model's GGUF (the tiny Qwen3 embedder with `qwen3.pooling_type` = last):
/// `anelm embed` takes it like a directory and writes sentence-transformers' vectors.
#[test]
fn an_embedding_gguf_embeds_like_its_directory() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../anelm-engine/tests/fixtures/embeddings");
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("qwen3-embedder/reference.json")).expect("reference"),
    )
    .expect("json");
    let cases: Vec<&Value> = v["texts"].as_array().expect("texts").iter().take(3).collect();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().expect("text")).collect();
    let gguf = fixtures.join("qwen3-embedder.gguf");
    let mut args = vec!["--model", gguf.to_str().expect("utf-8 path")];
    args.extend(&texts);
    let out = lines(&embed(&args, None));
    assert_eq!(out.len(), cases.len());
    for ((index, got), case) in out.iter().zip(&cases) {
        let cos = cosine(got, &embedding_of(case));
        assert!(cos >= 0.9999, "text {index}: cosine {cos}");
    }
}

/// The `embedding` array of a reference case.
fn embedding_of(case: &Value) -> Vec<f64> {
    case["embedding"]
        .as_array()
        .expect("embedding")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}
