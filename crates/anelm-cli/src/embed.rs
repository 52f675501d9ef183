//! `anelm embed`: texts (arguments, `--file`, or stdin lines) to JSON lines
//! `{"index": i, "embedding": [...]}` on stdout, with a progress bar on stderr for long inputs.
//! Texts go through the model `--batch` at a time (each batch packed into shared forwards).

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use anelm_engine::default_model::{FETCH_EMBEDDING_COMMAND, default_embedding_model_location};
use anelm_engine::pooling::l2_normalize;

use crate::args::{EmbeddingPromptArgs, ModelArgs};
use crate::runtime::load_embedder;

/// Arguments of `anelm embed`.
#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// Texts to embed (none: read `--file`, or stdin, one text per line).
    pub texts: Vec<String>,
    /// Read texts from this file, one per line.
    #[arg(long, value_name = "PATH", conflicts_with = "texts")]
    pub file: Option<PathBuf>,
    /// Keep the first N values of each embedding and renormalise (as the API's `dimensions`).
    #[arg(long, value_name = "N")]
    pub dimensions: Option<usize>,
    /// Texts per model call.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// The embedding model: a sentence-transformers directory, or an embedding model's GGUF
    /// (one with `<arch>.pooling_type`; default: all-MiniLM-L6-v2 in the model cache).
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: EmbeddingPromptArgs,
}

fn read_lines(r: impl BufRead, what: &str) -> Result<Vec<String>> {
    r.lines()
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("could not read {what}"))
}

/// Run `anelm embed`.
pub fn run(mut a: EmbedArgs) -> Result<()> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if a.model.model.is_none() {
        let Some(dir) = default_embedding_model_location().filter(|d| d.join("modules.json").is_file()) else {
            bail!(
                "no --model given and the default embedding model is not installed: run {FETCH_EMBEDDING_COMMAND} (or pass --model DIR, a sentence-transformers directory)"
            );
        };
        a.model.model = Some(dir);
    }
    let texts = if !a.texts.is_empty() {
        std::mem::take(&mut a.texts)
    } else if let Some(path) = &a.file {
        let f = std::fs::File::open(path).with_context(|| format!("could not open {}", path.display()))?;
        read_lines(std::io::BufReader::new(f), &path.display().to_string())?
    } else {
        read_lines(std::io::stdin().lock(), "stdin")?
    };
    let model = load_embedder(&a.model, &a.prompt)?;
    let dims = model.info().dimensions;
    if let Some(d) = a.dimensions
        && !(1..=dims).contains(&d)
    {
        bail!("--dimensions must be from 1 to {dims} for this model");
    }
    let bar = if texts.len() > a.batch {
        let bar = ProgressBar::with_draw_target(Some(texts.len() as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("embedding [{bar:30}] {pos}/{len} texts, {per_sec}, eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut index = 0usize;
    for chunk in texts.chunks(a.batch) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let vectors = model.embed(&refs)?;
        for mut v in vectors {
            if let Some(d) = a.dimensions.filter(|&d| d < dims) {
                v.truncate(d);
                l2_normalize(&mut v);
            }
            serde_json::to_writer(&mut out, &json!({"index": index, "embedding": v}))?;
            out.write_all(b"\n")?;
            index += 1;
        }
        bar.inc(chunk.len() as u64);
    }
    out.flush().context("could not write to stdout")?;
    bar.finish_and_clear();
    Ok(())
}
