//! `anelm bench --rerank`: documents reranked per second by a cross-encoder, for one query and a
//! fixed set of documents (the embedding benchmark's seeded 10–60-word texts), median over
//! repetitions after a warm-up. With `--vs-sentence-transformers PY` the same pairs go through
//! sentence-transformers' `CrossEncoder.predict` on torch CPU (same thread count, batch 32).

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::args::{ModelArgs, RerankPromptArgs};
use crate::bench_embed::{bench_texts, median};
use crate::runtime::{load_reranker, model_path};

const ST_SCRIPT: &str = include_str!("bench_rerank_st.py");

/// The query every document is scored against.
const QUERY: &str = "which notes are about travel plans with friends in spring?";

/// Run the rerank benchmark.
pub fn run(model: &ModelArgs, n_docs: usize, repetitions: usize, st_python: Option<&std::path::Path>) -> Result<()> {
    if n_docs == 0 || repetitions == 0 {
        bail!("--texts and --repetitions must be at least 1");
    }
    if model.model.is_none() {
        bail!("give --model: a cross-encoder directory (scripts/make-rerank-bench-model.sh makes a MiniLM-sized one)");
    }
    let dir = model_path(model)?;
    let docs = bench_texts(n_docs);
    let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
    let threads = model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rr = load_reranker(model, &RerankPromptArgs::default())?;
    rr.rerank(QUERY, &refs[..refs.len().min(64)])?; // warm-up
    let mut seconds = Vec::with_capacity(repetitions);
    let mut tokens = 0;
    for _ in 0..repetitions {
        let t = Instant::now();
        let scores = rr.rerank(QUERY, &refs)?;
        seconds.push(t.elapsed().as_secs_f64());
        if scores.len() != refs.len() {
            bail!(
                "the model returned {} scores for {} documents",
                scores.len(),
                refs.len()
            );
        }
        tokens = scores.iter().map(|s| s.tokens).sum();
    }
    let mut rows = vec![(format!("anelm ({}, cpu f32)", rr.kind()), tokens, median(&seconds))];

    if let Some(py) = st_python {
        let tmp = std::env::temp_dir().join(format!("anelm-bench-rerank-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).with_context(|| format!("could not create {}", tmp.display()))?;
        let script = tmp.join("bench_rerank_st.py");
        let job = tmp.join("job.json");
        std::fs::write(&script, ST_SCRIPT)?;
        std::fs::write(
            &job,
            serde_json::to_string(&json!({"query": QUERY, "documents": docs}))?,
        )?;
        let out = Command::new(py)
            .arg(&script)
            .arg(&dir)
            .arg(&job)
            .arg(repetitions.to_string())
            .arg(threads.to_string())
            .env("HF_HUB_OFFLINE", "1")
            .env("OMP_NUM_THREADS", threads.to_string())
            .output()
            .with_context(|| format!("could not run {}", py.display()))?;
        let _ = std::fs::remove_dir_all(&tmp);
        if !out.status.success() {
            bail!(
                "sentence-transformers run failed (scripts/make-embedding-fixtures.sh sets up a virtualenv with it): {}",
                String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
            );
        }
        let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or(""))
            .context("sentence-transformers run printed no result")?;
        let secs: Vec<f64> = v["seconds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect();
        if secs.is_empty() {
            bail!("sentence-transformers run printed no timings");
        }
        let name = format!(
            "sentence-transformers {} CrossEncoder (torch {} cpu)",
            v["version"].as_str().unwrap_or("?"),
            v["torch"].as_str().unwrap_or("?")
        );
        rows.push((name, v["tokens"].as_u64().unwrap_or(0) as usize, median(&secs)));
    }

    println!(
        "1 query, {n_docs} documents of 10-60 words, {tokens} pair tokens, {threads} threads, median of {repetitions}"
    );
    println!();
    println!("| engine | documents/s | tokens/s | x sentence-transformers |");
    println!("| --- | ---: | ---: | ---: |");
    let st_rate = rows.get(1).map(|r| n_docs as f64 / r.2);
    for (name, toks, secs) in &rows {
        let rate = n_docs as f64 / secs;
        let ratio = st_rate.map_or("-".to_string(), |s| format!("{:.2}", rate / s));
        println!("| {name} | {rate:.1} | {:.0} | {ratio} |", *toks as f64 / secs);
    }
    Ok(())
}
