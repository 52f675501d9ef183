//! `anelm`: LLM inference on Apple's Neural Engine, with a native CPU backend everywhere else.

mod args;
mod batch;
mod bench;
mod bench_embed;
mod bench_prefix;
mod bench_rerank;
mod bench_serve;
mod cache_cmd;
mod chat;
mod compile;
mod default_model;
mod doctor;
mod doctor_report;
mod embed;
mod energy;
mod generate;
mod http_client;
mod inspect;
mod logits;
mod plan;
mod plan_encoder;
mod priority;
mod runtime;
mod serve;
mod serve_models;
mod service;
mod speculate;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// LLM inference on Apple's Neural Engine (and a fast CPU backend where there is none).
#[derive(Parser, Debug)]
#[command(name = "anelm", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate text from a prompt (streams to stdout; speeds to stderr).
    Generate(generate::GenerateArgs),
    /// Interactive chat that keeps the conversation (and its cache) between turns.
    Chat(chat::ChatArgs),
    /// Print a model file's architecture, metadata and tensors.
    Inspect(inspect::InspectArgs),
    /// Print the logits for given token ids as JSON (for checking numerics from outside).
    Logits(logits::LogitsArgs),
    /// Print the token ids a raw prompt becomes, as a JSON array.
    Tokenize(logits::TokenizeArgs),
    /// Embed texts (arguments, --file, or stdin lines) as JSON lines {"index", "embedding"}.
    Embed(embed::EmbedArgs),
    /// Measure prompt processing (pp) and generation (tg) speed, llama-bench style.
    Bench(bench::BenchArgs),
    /// Serve the OpenAI-compatible HTTP API (continuous batching over --sessions streams).
    Serve(serve::ServeArgs),
    /// Print a model's ANE kernels, dispatches and modelled tok/s from its config alone.
    Plan(plan::PlanArgs),
    /// Build every ANE kernel of a model ahead of time (fills the compile cache).
    Compile(compile::CompileArgs),
    /// Print this machine, the devices that open, and a Neural Engine self-test (for bug reports).
    Doctor(doctor::DoctorArgs),
    /// Run `anelm serve` as a per-user service (systemd on Linux, launchd on macOS).
    Service(service::ServiceArgs),
    /// Submit, follow, fetch and cancel batch jobs on a running `anelm serve`.
    Batch(batch::BatchArgs),
    /// Look at or empty the on-disk prompt cache of a data directory.
    Cache(cache_cmd::CacheArgs),
}

impl Command {
    fn threads(&self) -> Option<usize> {
        self.model_args().and_then(|m| m.threads)
    }

    fn model_args(&self) -> Option<&args::ModelArgs> {
        Some(match self {
            Command::Plan(_) | Command::Doctor(_) | Command::Service(_) | Command::Batch(_) | Command::Cache(_) => {
                return None;
            }
            Command::Compile(a) => &a.model,
            Command::Generate(a) => &a.model,
            Command::Chat(a) => &a.model,
            Command::Inspect(a) => &a.model,
            Command::Logits(a) => &a.model,
            Command::Tokenize(a) => &a.model,
            Command::Embed(a) => &a.model,
            Command::Bench(a) => &a.model,
            Command::Serve(a) => &a.model,
        })
    }
}

fn main() {
    let cli = Cli::parse();
    let threads = cli.command.threads();
    // `serve --background`: before any thread starts, so every one inherits it.
    if let Command::Serve(a) = &cli.command
        && a.background
    {
        match priority::enter_background() {
            Ok(what) => eprintln!("anelm serve: background priority ({what})"),
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::exit(1);
            }
        }
    }
    // The whole command runs on a pool worker, so each parallel kernel starts without waking a
    // thread to hand it over (and with --threads 1 nothing is handed over at all).
    let result: Result<()> = runtime::in_pool(threads, || match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Logits(a) => logits::run_logits(a),
        Command::Tokenize(a) => logits::run_tokenize(a),
        Command::Embed(a) => embed::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Compile(a) => compile::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Service(a) => service::run(a),
        Command::Batch(a) => batch::run(a),
        Command::Cache(a) => cache_cmd::run(a),
    });
    if let Err(e) = result {
        let msg = format!("{e:#}").replace('\n', " ");
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
