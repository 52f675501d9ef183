//! `anelm bench --rerank`: documents reranked per second by a cross-encoder, for one query and a
//! fixed set of documents (the embedding benchmark's seeded 10–60-word texts), median over
//! repetitions after a warm-up. With `--vs-sentence-transformers PY` the same pairs go through
//! sentence-transformers' `CrossEncoder.predict` on torch CPU (same thread count, batch 32).

use std::time::Instant;

use anyhow::{Result, bail};
use serde_json::json;

use crate::args::{ModelArgs, RerankPromptArgs};
use crate::bench_embed::{bench_texts, median, print_table, run_sentence_transformers};
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
        let job = json!({"query": QUERY, "documents": docs});
        let st = run_sentence_transformers(py, "rerank", ST_SCRIPT, &dir, &job, repetitions, threads)?;
        rows.push((
            format!(
                "sentence-transformers {} CrossEncoder (torch {} cpu)",
                st.version, st.torch
            ),
            st.tokens,
            st.seconds,
        ));
    }
    println!(
        "1 query, {n_docs} documents of 10-60 words, {tokens} pair tokens, {threads} threads, median of {repetitions}"
    );
    print_table("documents", n_docs, &rows);
    Ok(())
}
