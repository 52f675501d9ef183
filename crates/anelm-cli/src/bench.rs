//! `anelm bench`: llama-bench-style prompt-processing (`pp`) and text-generation (`tg`) figures,
//! measured in-process after the model is loaded (load time excluded), median and spread over
//! repetitions, after one warm-up run of each test.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;

use anelm_engine::{
    ForwardCost, GenerateOptions, LanguageModel, LoadedModel, LogitsMode, SamplerParams, StepItem, Stream,
    StreamOptions,
};

use crate::args::ModelArgs;
use crate::runtime::{load, load_reporting, model_path};

/// Arguments of `anelm bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to measure prefill on (comma-separated; 0 = skip).
    #[arg(short = 'p', long = "n-prompt", default_value = "128", value_delimiter = ',')]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to measure decode on (comma-separated; 0 = skip).
    #[arg(short = 'n', long = "n-gen", default_value = "128", value_delimiter = ',')]
    pub n_gen: Vec<usize>,
    /// Streams decoded together in each `tg` test (comma-separated, as llama-batched-bench's
    /// parallel sequences): one batched forward per step for all of them, in-process, so the
    /// figure is the engine's aggregate decode rate without a server or prefill. Levels
    /// alternate within each repetition, so drift on a shared host hits them alike.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    pub parallel: Vec<usize>,
    /// Prompt tokens per forward pass in the `pp` tests, as `anelm generate` and `anelm serve`
    /// prefill by default (0: the whole prompt in one pass).
    #[arg(long, default_value_t = anelm_engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Print one JSON object per test on stdout instead of the markdown table.
    #[arg(long)]
    pub json: bool,
    /// Concurrency levels for the serving benchmark (e.g. 1,2,4,8); replaces pp/tg when given.
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Serving benchmark: requests per concurrency level (default: 2 × the highest level).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Serving benchmark: tokens generated per request.
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// Serving benchmark: run the whole list of levels this many times, alternating, and report
    /// medians (and the ratio to the first level paired per round), so a noisy machine's drift
    /// does not decide a ratio.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Serving benchmark: an already running server (host:port) instead of an in-process one.
    #[arg(long)]
    pub url: Option<String>,
    /// Serving benchmark: write the results as JSON here.
    #[arg(long)]
    pub json_out: Option<std::path::PathBuf>,
    /// Serving benchmark: write an SVG chart here.
    #[arg(long)]
    pub chart_out: Option<std::path::PathBuf>,
    /// Serving benchmark: also run every level with its requests constrained by the JSON schema
    /// in FILE (paired with the unconstrained run in each round), to measure the constraint's
    /// cost. A schema that cannot complete within `--tokens` keeps the lengths equal.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Serving benchmark: time to first token of `--concurrency` requests whose prompts share a
    /// prefix of this many tokens, with prefix sharing on and off (two in-process servers,
    /// alternating per round, a fresh prefix each round).
    #[arg(long, value_name = "TOKENS")]
    pub shared_prefix: Option<usize>,
    /// Serving benchmark: speculative decoding per request (`lookup`, `draft` — the server's
    /// draft model — or `off`, the request field `"speculate"`); the table adds the drafts'
    /// acceptance and the tokens per decode pass the server's `/metrics` counted over each level.
    #[arg(long, value_name = "MODE", value_parser = ["lookup", "draft", "off"])]
    pub speculate: Option<String>,
    /// Serving benchmark: the draft model the in-process server loads beside the model (as
    /// `anelm serve --speculate PATH`), for `--speculate draft`.
    #[arg(long, value_name = "PATH")]
    pub draft_model: Option<std::path::PathBuf>,
    /// Serving benchmark: the `model` every request names (e.g. an upstream of the server
    /// given by --url); default: none, the server's own model.
    #[arg(long, value_name = "NAME")]
    pub request_model: Option<String>,
    /// Measure energy instead: average CPU/GPU/ANE watts and tokens per joule of one generation
    /// of the first -n length, idle baseline subtracted (macOS, root: powermetrics).
    #[arg(long)]
    pub energy: bool,
    /// Energy: seconds of idle baseline sampled before generating.
    #[arg(long, default_value_t = 5.0)]
    pub energy_idle: f64,
    /// Benchmark an embedding model instead (--model: a sentence-transformers directory or an
    /// embedding GGUF, default all-MiniLM-L6-v2): texts/s and tokens/s over --texts short texts.
    #[arg(long)]
    pub embeddings: bool,
    /// Benchmark a cross-encoder instead (--model: its directory): documents reranked per second
    /// for one query and --texts documents (10-60 words each).
    #[arg(long, conflicts_with = "embeddings")]
    pub rerank: bool,
    /// Embedding benchmark: number of texts (10-60 words each).
    #[arg(long, default_value_t = 1000)]
    pub texts: usize,
    /// Embedding and rerank benchmarks: also run sentence-transformers on torch CPU with this Python (e.g.
    /// the virtualenv of scripts/make-embedding-fixtures.sh), same texts and threads.
    #[arg(long, value_name = "PYTHON")]
    pub vs_sentence_transformers: Option<std::path::PathBuf>,
}

/// `anelm bench --energy`: one warm-up, an idle baseline, then one measured generation.
fn run_energy(a: &BenchArgs) -> Result<()> {
    crate::energy::check_available()?;
    if !(a.energy_idle.is_finite() && a.energy_idle >= 0.5) {
        bail!("--energy-idle must be at least 0.5 seconds");
    }
    let n = a.n_gen.iter().copied().find(|&n| n > 0).unwrap_or(128);
    let (lm, _device) = load_reporting(&a.model)?;
    let model = lm.model.as_ref();
    if n + 1 > model.info().context_length {
        bail!(
            "-n {n} exceeds the model's context of {} tokens",
            model.info().context_length
        );
    }
    let first = bench_tokens(1, model.info().vocab_size)[0];
    decode_batch(&lm, &[first], n.min(16))?; // warm-up: weights paged in, kernels loaded
    let report = crate::energy::measure(std::time::Duration::from_secs_f64(a.energy_idle), || {
        decode_batch(&lm, &[first], n).map(|_| n)
    })?;
    print!("{report}");
    Ok(())
}

/// `--shared-prefix TOKENS`: TTFT of a burst sharing a prefix, prefix sharing on and off.
fn run_shared_prefix(a: &BenchArgs, tokens: usize) -> Result<()> {
    if a.url.is_some() || a.json_schema.is_some() {
        bail!("--shared-prefix runs its own two in-process servers: drop --url and --json-schema");
    }
    let [c] = a.concurrency[..] else {
        bail!("--shared-prefix needs exactly one --concurrency level (e.g. --concurrency 4)");
    };
    if c == 0 || tokens == 0 || a.rounds == 0 {
        bail!("--shared-prefix, --concurrency and --rounds must be at least 1");
    }
    let lm = std::sync::Arc::new(load(&a.model)?);
    let threads = rayon::current_num_threads();
    let rows = crate::bench_prefix::run(lm, tokens, c, a.rounds, threads)?;
    println!(
        "anelm: {c} concurrent requests sharing a {tokens}-token prefix, medians of {} rounds ({threads} threads)\n",
        a.rounds
    );
    print!("{}", crate::bench_prefix::markdown(&rows));
    Ok(())
}

fn run_serving(a: &BenchArgs) -> Result<()> {
    use crate::bench_serve::*;
    if a.concurrency.contains(&0) {
        bail!("--concurrency levels must be at least 1");
    }
    if a.tokens == 0 {
        bail!("--tokens must be at least 1");
    }
    let top = a.concurrency.iter().copied().max().unwrap_or(1);
    let requests = a.requests.unwrap_or(2 * top).max(1);
    let (addr, what) = match &a.url {
        Some(u) => {
            let hp = u
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .trim_end_matches("/v1")
                .to_string();
            (hp, format!("server at {u}"))
        }
        None => {
            let lm = load(&a.model)?;
            let threads = rayon::current_num_threads();
            let name = model_path(&a.model)?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut cfg = bench_scheduler(top, threads, 2048);
            let mut what = format!("{name}, in-process server, {top} sessions, {threads} threads");
            if let Some(path) = &a.draft_model {
                let draft = crate::speculate::load_draft(path, &a.model, &lm)?;
                cfg.draft_model = Some(anelm_engine::DraftConfig {
                    model: std::sync::Arc::from(draft.model),
                    draft_tokens: anelm_engine::LookupOptions::default().draft_tokens,
                });
                what.push_str(&format!(", draft model {}", path.display()));
            }
            (start_server_with(std::sync::Arc::new(lm), cfg)?, what)
        }
    };
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let schema = match &a.json_schema {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("could not read {}", p.display()))?;
            Some(
                serde_json::from_str::<serde_json::Value>(&text)
                    .with_context(|| format!("{} is not JSON", p.display()))?,
            )
        }
        None => None,
    };
    let workload = Workload {
        tokens: a.tokens,
        model: a.request_model.clone(),
        speculate: a.speculate.clone(),
    };
    let levels = run_levels(&addr, &a.concurrency, requests, &workload, a.rounds, schema.as_ref())?;
    let title = format!("anelm: {requests} requests × {} tokens per level ({what})", a.tokens);
    println!("{title}\n");
    print!("{}", markdown(&levels));
    if let Some(p) = &a.json_out {
        let meta = serde_json::json!({"what": what, "requests": requests, "tokens": a.tokens, "rounds": a.rounds,
                                      "json_schema": schema, "speculate": a.speculate,
                                      "isa": anelm_kernels::Isa::best().name()});
        std::fs::write(p, serde_json::to_string_pretty(&to_json(&levels, meta))?)
            .with_context(|| format!("write {}", p.display()))?;
    }
    if let Some(p) = &a.chart_out {
        std::fs::write(p, svg(&levels, &title)).with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

/// One measured test.
struct Figure {
    test: String,
    tokens: usize,
    /// Tokens per second of each repetition (measured on this host).
    rates: Vec<f64>,
    /// Tokens per second of modelled ANE time over all repetitions (ANE devices only).
    modelled: Option<f64>,
    /// Prefill on the CPU: the matmuls' achieved rate on their main unit beside its peak.
    compute: Option<Compute>,
    /// `generate` rows: per token, the median time inside the decode forward and outside it.
    split: Option<StepSplit>,
}

/// Where a generated token's time goes (`anelm generate`'s loop, measured by the engine).
#[derive(Clone, Copy)]
struct StepSplit {
    forward_us: f64,
    outside_us: f64,
}

impl StepSplit {
    fn describe(&self) -> String {
        let step = (self.forward_us + self.outside_us).max(f64::MIN_POSITIVE);
        format!(
            "per token {:.0} µs in the forward + {:.0} µs outside it ({:.1} %: sampling, detokenising)",
            self.forward_us,
            self.outside_us,
            100.0 * self.outside_us / step
        )
    }
}

/// A prefill's matmuls against the physical limit of the unit they ran on.
struct Compute {
    unit: anelm_kernels::ComputeUnit,
    /// Achieved giga-operations per second inside those matmuls (a multiply-add is two).
    gops: f64,
    /// The unit's measured peak on this machine's kernel threads.
    peak: Option<f64>,
}

impl Compute {
    /// The main unit of the forwards that cost `cost`, with its achieved rate and peak.
    fn of(cost: &ForwardCost) -> Option<Compute> {
        let (unit, c) = cost.main_unit()?;
        Some(Compute {
            unit,
            gops: c.gops()?,
            peak: unit.peak_gops(),
        })
    }

    /// `412 of 905 GOPS int8 dot (AVX-512 VNNI), 45.5 %`.
    fn describe(&self) -> String {
        match self.peak {
            Some(p) => format!(
                "{:.0} of {p:.0} GOPS {}, {:.1} %",
                self.gops,
                self.unit.describe(),
                100.0 * self.gops / p
            ),
            None => format!("{:.0} GOPS {}", self.gops, self.unit.describe()),
        }
    }
}

/// Tokens per modelled ANE second of the forwards that cost `cost` (emulated devices only).
fn modelled_rate(cost: &ForwardCost, tokens: usize) -> Option<f64> {
    let t = cost.modelled?.as_secs_f64();
    (t > 0.0).then(|| tokens as f64 / t)
}

impl Figure {
    fn median(&self) -> f64 {
        let mut v = self.rates.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }
    fn stdev(&self) -> f64 {
        let n = self.rates.len() as f64;
        let mean = self.rates.iter().sum::<f64>() / n;
        (self.rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt()
    }
}

/// Deterministic token ids spread over the vocabulary (as llama-bench, content does not matter
/// for speed; a fixed sequence keeps runs comparable).
fn bench_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// Prefill `tokens` into a new session, `chunk` tokens per forward (0: all in one); tokens per
/// second and what the forwards cost.
fn prefill_once(model: &dyn LanguageModel, tokens: &[u32], chunk: usize) -> Result<(f64, ForwardCost)> {
    let mut session = model.new_session(tokens.len() + 1);
    let chunk = if chunk == 0 { tokens.len().max(1) } else { chunk };
    let t = Instant::now();
    let mut cost = ForwardCost::default();
    let pieces = tokens.len().div_ceil(chunk);
    for (i, piece) in tokens.chunks(chunk).enumerate() {
        let (_, c) = model.forward_with_cost(&mut [StepItem {
            session: &mut session,
            tokens: piece,
            logits: if i + 1 == pieces {
                LogitsMode::Last
            } else {
                LogitsMode::None
            },
        }])?;
        cost.merge(&c);
    }
    Ok((tokens.len() as f64 / t.elapsed().as_secs_f64(), cost))
}

/// Bytes of weights one decode step streams, for a GGUF file (else `None`): every tensor of two
/// or more dimensions, except the token table when a separate output matrix exists (then only
/// one row of it is read), and of a mixture of experts' stacked 3-D tensors only the experts a
/// token uses (`expert_used_count` of `expert_count`). The bandwidth bound of
/// `scripts/bench-vs-llamacpp.sh` divides by it.
fn streamed_weight_bytes(path: &std::path::Path) -> Option<u64> {
    if path.extension().is_none_or(|e| e != "gguf") {
        return None;
    }
    let file = anelm_model::gguf::GgufFile::open(path).ok()?;
    let untied = file.tensor_info("output.weight").is_some();
    let arch = file.architecture().unwrap_or("").to_string();
    let experts = file.get_u64(&format!("{arch}.expert_count")).filter(|&e| e > 0);
    let used = file.get_u64(&format!("{arch}.expert_used_count"));
    Some(
        file.tensors()
            .iter()
            .filter(|t| t.dims.iter().filter(|&&d| d > 1).count() >= 2)
            .filter(|t| !(untied && t.name == "token_embd.weight"))
            .map(|t| match (experts, used) {
                (Some(e), Some(u)) if t.dims.len() == 3 && t.dims[2] == e => t.size / e * u.min(e),
                _ => t.size,
            })
            .sum(),
    )
}

/// `n` greedy decode steps of `firsts.len()` streams at once (stream `i` starting from
/// `firsts[i]`, at position 0), one batched forward per step; aggregate tokens per second and
/// what the forwards cost.
fn decode_batch(lm: &LoadedModel, firsts: &[u32], n: usize) -> Result<(f64, ForwardCost)> {
    let model = lm.model.as_ref();
    let mut sessions: Vec<_> = firsts.iter().map(|_| model.new_session(n + 1)).collect();
    // Each stream picks its tokens through the engine's `Stream`, as a temperature-0 request in
    // the server does (greedy, end-of-generation masked so every stream runs n tokens).
    let opts = StreamOptions {
        ignore_eos: true,
        ..StreamOptions::greedy(n + 1)
    };
    let mut streams = firsts
        .iter()
        .map(|_| Stream::new(&lm.tokenizer, &opts))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut toks = firsts.to_vec();
    let mut cost = ForwardCost::default();
    let t = Instant::now();
    for _ in 0..n {
        let mut items: Vec<StepItem<'_>> = sessions
            .iter_mut()
            .zip(&toks)
            .map(|(session, tok)| StepItem {
                session,
                tokens: std::slice::from_ref(tok),
                logits: LogitsMode::Last,
            })
            .collect();
        let (mut out, step) = model.forward_with_cost(&mut items)?;
        cost.merge(&step);
        drop(items);
        for (lane, (tok, stream)) in toks.iter_mut().zip(&mut streams).enumerate() {
            let history = sessions[lane].tokens();
            let step = stream.advance(out.lane_mut(lane), history, true)?;
            *tok = step.token.unwrap_or(0);
        }
    }
    Ok(((n * firsts.len()) as f64 / t.elapsed().as_secs_f64(), cost))
}

/// `n` tokens as `anelm generate` makes them after an 8-token prompt: the engine's generation
/// loop with its default sampling (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), the
/// text detokenised piece by piece and stop strings checked, end-of-generation masked so every
/// run makes `n` tokens. Tokens per second by wall clock after the first token, and the split
/// of each token's time between the decode forward and the rest (the pieces go to memory, not
/// to a terminal).
fn generate_once(lm: &LoadedModel, prompt: &[u32], n: usize) -> Result<(f64, StepSplit)> {
    let mut session = lm.model.new_session(prompt.len() + n + 1);
    let opts = GenerateOptions {
        stream: StreamOptions {
            ignore_eos: true,
            sampler: SamplerParams::default(),
            ..StreamOptions::greedy(n)
        },
        ..GenerateOptions::default()
    };
    let (_, stats) = anelm_engine::generate(
        lm.model.as_ref(),
        &lm.tokenizer,
        &mut session,
        prompt,
        &opts,
        &mut |_| true,
    )?;
    let (forward, outside) = stats.step_split();
    Ok((
        stats.generation_tok_per_s(),
        StepSplit {
            forward_us: forward.as_secs_f64() * 1e6,
            outside_us: outside.as_secs_f64() * 1e6,
        },
    ))
}

/// Most streams one `--parallel` level decodes (each holds a session with its own cache).
const MAX_PARALLEL: usize = 256;

/// Run `anelm bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    if a.energy {
        return run_energy(&a);
    }
    if a.rerank {
        return crate::bench_rerank::run(&a.model, a.texts, a.repetitions, a.vs_sentence_transformers.as_deref());
    }
    if a.embeddings {
        return crate::bench_embed::run(&a.model, a.texts, a.repetitions, a.vs_sentence_transformers.as_deref());
    }
    if a.request_model.is_some() && (a.concurrency.is_empty() || a.shared_prefix.is_some()) {
        bail!("--request-model applies to the serving benchmark: give --concurrency (without --shared-prefix)");
    }
    if (a.speculate.is_some() || a.draft_model.is_some()) && (a.concurrency.is_empty() || a.shared_prefix.is_some()) {
        bail!(
            "--speculate and --draft-model apply to the serving benchmark: give --concurrency (without --shared-prefix)"
        );
    }
    if a.draft_model.is_some() && a.url.is_some() {
        bail!(
            "--draft-model loads a draft model into the in-process server; a server given by --url has its own (anelm serve --speculate PATH)"
        );
    }
    if a.speculate.as_deref() == Some("draft") && a.draft_model.is_none() && a.url.is_none() {
        bail!("--speculate draft needs the draft model: give --draft-model PATH");
    }
    if let Some(tokens) = a.shared_prefix {
        return run_shared_prefix(&a, tokens);
    }
    if a.json_schema.is_some() && a.concurrency.is_empty() {
        bail!("--json-schema applies to the serving benchmark: give --concurrency too");
    }
    if !a.concurrency.is_empty() {
        return run_serving(&a);
    }
    if a.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if a.parallel.is_empty() || a.parallel.iter().any(|&b| b == 0 || b > MAX_PARALLEL) {
        bail!("--parallel levels must be between 1 and {MAX_PARALLEL} (e.g. --parallel 1,4)");
    }
    let path = model_path(&a.model)?;
    let (lm, device) = load_reporting(&a.model)?;
    let model = lm.model.as_ref();
    let vocab = model.info().vocab_size;
    let max_ctx = model.info().context_length;
    let mut figures = Vec::new();
    for &p in a.n_prompt.iter().filter(|&&p| p > 0) {
        if p > max_ctx {
            bail!("-p {p} exceeds the model's context of {max_ctx} tokens");
        }
        let tokens = bench_tokens(p, vocab);
        prefill_once(model, &tokens, a.prefill_chunk)?; // warm-up
        device.reset();
        let mut cost = ForwardCost::default();
        let mut rates = Vec::with_capacity(a.repetitions);
        for _ in 0..a.repetitions {
            let (rate, c) = prefill_once(model, &tokens, a.prefill_chunk)?;
            rates.push(rate);
            cost.merge(&c);
        }
        figures.push(Figure {
            test: format!("pp{p}"),
            tokens: p,
            rates,
            modelled: modelled_rate(&cost, p * a.repetitions),
            compute: Compute::of(&cost),
            split: None,
        });
    }
    for &n in a.n_gen.iter().filter(|&&n| n > 0) {
        if n + 1 > max_ctx {
            bail!("-n {n} exceeds the model's context of {max_ctx} tokens");
        }
        // Distinct first tokens, so the streams do not decode the same text.
        let firsts = bench_tokens(a.parallel.iter().copied().max().unwrap_or(1), vocab);
        for &b in &a.parallel {
            decode_batch(&lm, &firsts[..b], n.min(16))?; // warm-up
        }
        device.reset();
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); a.parallel.len()];
        let mut costs = vec![ForwardCost::default(); a.parallel.len()];
        for _ in 0..a.repetitions {
            for ((r, cost), &b) in rates.iter_mut().zip(&mut costs).zip(&a.parallel) {
                let (rate, c) = decode_batch(&lm, &firsts[..b], n)?;
                r.push(rate);
                cost.merge(&c);
            }
        }
        for ((rates, cost), &b) in rates.into_iter().zip(&costs).zip(&a.parallel) {
            figures.push(Figure {
                test: if b == 1 {
                    format!("tg{n}")
                } else {
                    format!("tg{n} x{b}")
                },
                tokens: n * b,
                rates,
                // Each level's own forwards: their costs say its modelled time.
                modelled: modelled_rate(cost, n * b * a.repetitions),
                compute: None,
                split: None,
            });
        }
        // The same decode through `anelm generate`'s loop: what sampling and detokenising add.
        let prompt = bench_tokens(8, vocab);
        if n + prompt.len() < max_ctx && device.chip.is_none() {
            generate_once(&lm, &prompt, n.min(16))?; // warm-up
            let runs = (0..a.repetitions)
                .map(|_| generate_once(&lm, &prompt, n))
                .collect::<Result<Vec<_>>>()?;
            let median = |f: &dyn Fn(&StepSplit) -> f64| {
                let mut v: Vec<f64> = runs.iter().map(|(_, s)| f(s)).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            figures.push(Figure {
                test: format!("tg{n} generate"),
                tokens: n,
                rates: runs.iter().map(|(r, _)| *r).collect(),
                modelled: None,
                compute: None,
                split: Some(StepSplit {
                    forward_us: median(&|s| s.forward_us),
                    outside_us: median(&|s| s.outside_us),
                }),
            });
        }
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let size_mib = model_bytes(&path) as f64 / (1 << 20) as f64;
    let threads = rayon::current_num_threads();
    let isa = anelm_kernels::Isa::best().name();
    let weight_bytes = streamed_weight_bytes(&path);
    let fallbacks: Vec<serde_json::Value> = device
        .fallbacks()
        .iter()
        .map(|f| serde_json::json!({"kernel": f.kernel, "from": f.from, "to": f.to, "reason": f.reason}))
        .collect();
    let mut out = std::io::stdout().lock();
    if a.json {
        for f in &figures {
            let v = serde_json::json!({
                "model": name, "size_mib": size_mib, "backend": device.name, "isa": isa, "threads": threads,
                "test": f.test, "tokens": f.tokens, "repetitions": f.rates.len(),
                "prefill_chunk": f.test.starts_with("pp").then_some(a.prefill_chunk),
                "tok_s_median": f.median(), "tok_s_stdev": f.stdev(), "tok_s": f.rates,
                "chip": device.chip.map(|c| c.name), "modelled_ane_tok_s": f.modelled,
                "weight_bytes_per_token": weight_bytes,
                "ane_fallbacks": fallbacks,
                "matmul_gops": f.compute.as_ref().map(|c| c.gops),
                "compute_unit": f.compute.as_ref().map(|c| c.unit.describe()),
                "unit_peak_gops": f.compute.as_ref().and_then(|c| c.peak),
                "forward_us_per_token": f.split.map(|s| s.forward_us),
                "outside_forward_us_per_token": f.split.map(|s| s.outside_us),
            });
            writeln!(out, "{v}").context("write to stdout")?;
        }
    } else if let Some(chip) = device.chip {
        // Host time is the emulator running fp16 in software; the modelled column is the chip's.
        writeln!(
            out,
            "| model | size | backend | threads | test | host t/s (measured) | ANE t/s (modelled, {}) |",
            chip.name
        )?;
        writeln!(out, "| --- | ---: | --- | ---: | ---: | ---: | ---: |")?;
        for f in &figures {
            writeln!(
                out,
                "| {name} | {size_mib:.2} MiB | {} | {threads} | {} | {:.2} ± {:.2} | {:.2} |",
                device.name,
                f.test,
                f.median(),
                f.stdev(),
                f.modelled.unwrap_or(0.0)
            )?;
        }
    } else {
        writeln!(
            out,
            "| model | size | backend | threads | test | t/s | matmuls vs the unit's peak / where a token's time goes |"
        )?;
        writeln!(out, "| --- | ---: | --- | ---: | ---: | ---: | --- |")?;
        for f in &figures {
            writeln!(
                out,
                "| {name} | {size_mib:.2} MiB | cpu ({isa}) | {threads} | {} | {:.2} ± {:.2} | {} |",
                f.test,
                f.median(),
                f.stdev(),
                match (&f.compute, &f.split) {
                    (Some(c), _) => c.describe(),
                    (None, Some(s)) => s.describe(),
                    (None, None) => "—".to_string(),
                }
            )?;
        }
    }
    if !a.json {
        let lines = device.fallback_lines();
        if !lines.is_empty() {
            writeln!(out)?;
        }
        for line in lines {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// Bytes of a model on disk: the file, or for a Hugging Face directory its `.safetensors` files.
fn model_bytes(path: &std::path::Path) -> u64 {
    if !path.is_dir() {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    }
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
