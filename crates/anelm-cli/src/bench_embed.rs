//! `anelm bench --embeddings`: texts/s and tokens/s of an embedding model over a fixed set of
//! short texts (10–60 words, made from a seeded generator so every run and machine embeds the
//! same ones), median over repetitions after a warm-up. With `--vs-sentence-transformers PY`
//! the same texts go through sentence-transformers on torch CPU (same thread count) in the
//! same run, and the table shows both and their ratio.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use anelm_engine::default_model::{FETCH_EMBEDDING_COMMAND, default_embedding_model_location};

use crate::args::ModelArgs;
use crate::runtime::{load_embedder, model_path};

const ST_SCRIPT: &str = include_str!("bench_embed_st.py");

/// Words the bench texts are made of.
const WORDS: &[&str] = &[
    "the",
    "model",
    "reads",
    "a",
    "note",
    "about",
    "travel",
    "plans",
    "for",
    "spring",
    "and",
    "summer",
    "with",
    "friends",
    "from",
    "school",
    "who",
    "live",
    "near",
    "the",
    "river",
    "city",
    "library",
    "opens",
    "early",
    "on",
    "monday",
    "morning",
    "coffee",
    "tastes",
    "better",
    "when",
    "shared",
    "quiet",
    "garden",
    "behind",
    "old",
    "house",
    "grows",
    "tomatoes",
    "beans",
    "herbs",
    "every",
    "year",
    "browser",
    "history",
    "shows",
    "many",
    "articles",
    "on",
    "machine",
    "learning",
    "neural",
    "networks",
    "cooking",
    "recipes",
    "bread",
    "soup",
    "weather",
    "forecast",
    "rain",
    "tomorrow",
    "afternoon",
    "meeting",
    "moved",
    "to",
    "thursday",
    "because",
    "project",
    "deadline",
    "changed",
    "again",
    "invoice",
    "paid",
    "last",
    "week",
    "please",
    "remember",
    "buy",
    "milk",
    "eggs",
    "apples",
    "train",
    "leaves",
    "at",
    "seven",
    "station",
    "platform",
    "music",
    "concert",
    "tickets",
    "sold",
    "out",
    "quickly",
    "mountain",
    "hike",
    "trail",
    "steep",
    "view",
    "beautiful",
    "sunset",
    "ocean",
    "waves",
    "children",
    "played",
    "football",
    "park",
    "after",
    "lunch",
    "doctor",
    "appointment",
    "scheduled",
    "next",
    "tuesday",
    "engine",
    "indexes",
    "documents",
    "by",
    "topic",
    "clusters",
    "similar",
    "ideas",
    "together",
    "search",
    "finds",
    "answers",
    "fast",
    "small",
    "computer",
    "runs",
    "all",
    "night",
    "without",
    "noise",
    "letters",
    "arrived",
    "yesterday",
    "from",
    "abroad",
];

/// `n` texts of 10–60 words from a fixed-seed generator.
pub fn bench_texts(n: usize) -> Vec<String> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    (0..n)
        .map(|_| {
            let len = 10 + (next() % 51) as usize;
            let mut words: Vec<String> = (0..len)
                .map(|_| WORDS[(next() % WORDS.len() as u64) as usize].to_string())
                .collect();
            if let Some(first) = words.first_mut() {
                let mut c = first.chars();
                if let Some(h) = c.next() {
                    *first = h.to_uppercase().chain(c).collect();
                }
            }
            words.join(" ") + "."
        })
        .collect()
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Run the embedding benchmark.
pub fn run(model: &ModelArgs, n_texts: usize, repetitions: usize, st_python: Option<&std::path::Path>) -> Result<()> {
    if n_texts == 0 || repetitions == 0 {
        bail!("--texts and --repetitions must be at least 1");
    }
    let mut args = model.clone();
    if args.model.is_none() {
        let Some(dir) = default_embedding_model_location().filter(|d| d.join("modules.json").is_file()) else {
            bail!("no --model given and the default embedding model is not installed: run {FETCH_EMBEDDING_COMMAND}");
        };
        args.model = Some(dir);
    }
    let dir = model_path(&args)?;
    let texts = bench_texts(n_texts);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

    let emb = load_embedder(&args, &Default::default())?;
    let tokens: usize = emb.tokenize(&refs)?.iter().map(Vec::len).sum();
    emb.embed(&refs[..refs.len().min(64)])?; // warm-up
    let mut seconds = Vec::with_capacity(repetitions);
    for _ in 0..repetitions {
        let t = Instant::now();
        let v = emb.embed(&refs)?;
        seconds.push(t.elapsed().as_secs_f64());
        if v.len() != refs.len() {
            bail!("the model returned {} embeddings for {} texts", v.len(), refs.len());
        }
    }
    let mut rows = vec![("anelm (cpu)".to_string(), tokens, median(&seconds))];
    // The physical reference: the encoder's matmul operations over the whole encode (wall time,
    // so tokenising, attention and pooling count against it) beside the unit's measured peak.
    use crate::args::DeviceArg;
    let on_cpu =
        matches!(args.device, DeviceArg::Cpu) || (matches!(args.device, DeviceArg::Auto) && !cfg!(target_os = "macos"));
    let compute = emb.matmul_macs_per_token().filter(|_| on_cpu).map(|macs| {
        let unit = if anelm_engine::CpuBackend::for_embeddings().bf16() {
            anelm_kernels::ComputeUnit::Bf16Dot
        } else {
            anelm_kernels::ComputeUnit::F32Fma
        };
        let gops = 2.0 * macs as f64 * tokens as f64 / median(&seconds) / 1e9;
        (unit, gops, unit.peak_gops())
    });

    if let Some(py) = st_python {
        let st = run_sentence_transformers(
            py,
            "embed",
            ST_SCRIPT,
            &dir,
            &serde_json::to_value(&texts)?,
            repetitions,
            threads,
        )?;
        rows.push((
            format!("sentence-transformers {} (torch {} cpu)", st.version, st.torch),
            st.tokens,
            st.seconds,
        ));
    }
    println!(
        "{} texts of 10-60 words, {} tokens, {threads} threads, median of {repetitions}",
        n_texts, tokens
    );
    print_table("texts", n_texts, &rows);
    if let Some((unit, gops, peak)) = compute {
        let of_peak = peak.map_or(String::new(), |p| {
            format!(" of {p:.0} measured peak ({:.1} %)", 100.0 * gops / p)
        });
        println!(
            "\nanelm's encoder matmuls: {gops:.0} GOPS over the whole encode on {}{of_peak}",
            unit.describe()
        );
    }
    Ok(())
}

/// A sentence-transformers run's result: its versions, the tokens it saw, its median seconds.
pub struct StRun {
    /// sentence-transformers' version.
    pub version: String,
    /// torch's version.
    pub torch: String,
    /// Tokens the run processed.
    pub tokens: usize,
    /// Median seconds of the timed repetitions.
    pub seconds: f64,
}

/// Run a sentence-transformers bench script (`script`, written to a temporary file) with the
/// Python `py` on the model `dir` and the `job` (JSON), `repetitions` times on `threads`
/// threads; it prints one JSON line `{"version", "torch", "tokens", "seconds": [...]}`.
pub fn run_sentence_transformers(
    py: &Path,
    what: &str,
    script: &str,
    dir: &Path,
    job: &Value,
    repetitions: usize,
    threads: usize,
) -> Result<StRun> {
    let tmp = std::env::temp_dir().join(format!("anelm-bench-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("could not create {}", tmp.display()))?;
    let script_path = tmp.join(format!("bench_{what}_st.py"));
    let job_path = tmp.join("job.json");
    std::fs::write(&script_path, script)?;
    std::fs::write(&job_path, serde_json::to_string(job)?)?;
    let out = Command::new(py)
        .arg(&script_path)
        .arg(dir)
        .arg(&job_path)
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
    Ok(StRun {
        version: v["version"].as_str().unwrap_or("?").to_string(),
        torch: v["torch"].as_str().unwrap_or("?").to_string(),
        tokens: v["tokens"].as_u64().unwrap_or(0) as usize,
        seconds: median(&secs),
    })
}

/// The results table: `(engine, tokens, seconds)` rows for `n` `unit`s (texts, documents), the
/// second row (sentence-transformers) the reference of the ratio.
pub fn print_table(unit: &str, n: usize, rows: &[(String, usize, f64)]) {
    println!();
    println!("| engine | {unit}/s | tokens/s | x sentence-transformers |");
    println!("| --- | ---: | ---: | ---: |");
    let st_rate = rows.get(1).map(|r| n as f64 / r.2);
    for (name, toks, secs) in rows {
        let rate = n as f64 / secs;
        let ratio = st_rate.map_or("-".to_string(), |s| format!("{:.2}", rate / s));
        println!("| {name} | {rate:.1} | {:.0} | {ratio} |", *toks as f64 / secs);
    }
}
