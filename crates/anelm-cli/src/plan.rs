//! `anelm plan`: from a model's configuration alone (a `config.json`, its directory, or a GGUF
//! file's metadata; no weights), the ANE kernels of every layer with their shapes, bytes and the
//! reason for each choice, dispatches per token, bytes per dispatch, and the modelled decode
//! tok/s at 1, 2, 4 and 8 streams and prefill tok/s per chip profile, host work included
//! (`--explain` splits a token's time into its terms).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;

use anelm_ane::{CHIPS, ChipProfile, DEFAULT_CONTEXT, HostOptions, HostRuntime, Plan, PlanOptions, WeightMode};
use anelm_engine::plan_dims::model_kernels;

use crate::args::AneWeightsArg;
use crate::default_model::default_model_path;

/// The code around the dispatches the host model describes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeArg {
    /// anelm's own ANE backend.
    Anelm,
    /// The C++ system the measured figures come from (`ane-runtime.md`): for comparing with them.
    AneCpp,
}

impl RuntimeArg {
    fn runtime(self) -> HostRuntime {
        match self {
            RuntimeArg::Anelm => HostRuntime::Anelm,
            RuntimeArg::AneCpp => HostRuntime::AneCpp,
        }
    }
}

/// Arguments of `anelm plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A Hugging Face `config.json` (or its directory) or a GGUF file (default: the embedded model).
    #[arg(long, short = 'm', env = "ANELM_MODEL")]
    pub model: Option<PathBuf>,
    /// One chip profile (default: the kernel table for m3-max and the rates for every profile).
    #[arg(long)]
    pub chip: Option<String>,
    /// Weight storage of the ANE programs.
    #[arg(long, value_enum, default_value_t = AneWeightsArg::Fp16)]
    pub weights: AneWeightsArg,
    /// Whose host code to model between the dispatches.
    #[arg(long, value_enum, default_value_t = RuntimeArg::Anelm)]
    pub runtime: RuntimeArg,
    /// Tokens of context each stream's attention reads per decoded token.
    #[arg(long, default_value_t = DEFAULT_CONTEXT)]
    pub context: usize,
    /// Model the host work on one core with nothing overlapped (the anelm runtime without its
    /// parallel sections and LM-head pipelining; `--runtime ane-cpp` is always serial).
    #[arg(long)]
    pub serial_host: bool,
    /// Split a token's modelled time into its terms (ANE dispatches, host work by kind).
    #[arg(long)]
    pub explain: bool,
    /// One JSON object on stdout (for `--chip`, or m3-max).
    #[arg(long)]
    pub json: bool,
    /// Plan with the dispatch line fitted through an `anelm doctor --report` file's sweep (fixed
    /// cost and bandwidth) on the report's chip profile (or `--chip`'s), instead of the profile's.
    #[arg(long, value_name = "REPORT")]
    pub calibrate: Option<PathBuf>,
    /// Encoders (embedding models): the text length in tokens the embeddings/s are modelled for.
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Speculative decoding: the share of drafted tokens the model accepts (default: the median
    /// `scripts/bench-speculate.sh` measured over its prompts).
    #[arg(long, default_value_t = anelm_ane::DEFAULT_ACCEPTANCE)]
    pub acceptance: f64,
}

/// Streams the rate table shows.
const STREAMS: [usize; 4] = [1, 2, 4, 8];

/// What the C++ system measured on an M3 Max for one Qwen3.5 configuration (`ane-runtime.md`
/// §11, README `7c61e4e`). Printed beside the modelled figures; never used to set a constant.
struct Measured {
    name: &'static str,
    hidden: usize,
    intermediate: usize,
    weights: &'static str,
    /// Single-stream generation (`generate`, 500 tokens).
    decode: f64,
    /// `serve` aggregate generation at concurrency 1, 2, 4 (8 requests × 100 tokens).
    serve: [f64; 3],
    /// Prompt tok/s.
    prefill: f64,
}

const CPP_MEASURED_M3_MAX: [Measured; 4] = [
    Measured {
        name: "Qwen3.5-4B",
        hidden: 2560,
        intermediate: 9216,
        weights: "fp16",
        decode: 9.21,
        serve: [8.62, 12.59, 20.75],
        prefill: 18.93,
    },
    Measured {
        name: "Qwen3.5-4B",
        hidden: 2560,
        intermediate: 9216,
        weights: "int8",
        decode: 11.66,
        serve: [10.53, 15.95, 28.62],
        prefill: 30.08,
    },
    Measured {
        name: "Qwen3.5-9B",
        hidden: 4096,
        intermediate: 12288,
        weights: "fp16",
        decode: 4.27,
        serve: [3.62, 4.44, 4.89],
        prefill: 6.49,
    },
    Measured {
        name: "Qwen3.5-9B",
        hidden: 4096,
        intermediate: 12288,
        weights: "int8",
        decode: 7.01,
        serve: [5.76, 5.81, 6.57],
        prefill: 7.39,
    },
];

/// The C++ system's measurements for this plan on `chip`, if it has them.
fn measured_for(p: &Plan, chip: &ChipProfile) -> Option<&'static Measured> {
    let d = &p.dims;
    let mode = p.options.weights.label();
    (chip.name == "m3-max" && d.linear_attention.is_some() && d.layers == 32 && d.vocab == 248_320)
        .then(|| {
            CPP_MEASURED_M3_MAX
                .iter()
                .find(|m| m.hidden == d.hidden && m.intermediate == d.intermediate && m.weights == mode)
        })
        .flatten()
}

fn terms_json(p: &Plan, chip: &ChipProfile, host: &HostOptions, streams: Option<usize>) -> serde_json::Value {
    let cost = match streams {
        Some(n) => p.decode_cost(chip, host, n),
        None => p.prefill_cost(chip, host),
    };
    let per = 1e3 / cost.tokens.max(1) as f64;
    let terms: serde_json::Map<String, serde_json::Value> = cost
        .terms()
        .iter()
        .map(|(name, t)| (name.replace([' ', '/'], "_"), json!(t * per)))
        .collect();
    json!({
        "tokens_per_step": cost.tokens,
        "dispatches_per_step": cost.dispatches,
        "ms_per_token": terms,
        "ane_utilisation": cost.ane_utilisation(),
        "host_critical_share": cost.host_share(),
        "cpu_utilisation": cost.cpu_utilisation(),
        "cores": cost.cores,
        "overlapped_ms_per_token": cost.hidden * per,
    })
}

/// The plan's figures as the JSON object outside checks read.
pub fn plan_json(
    model: &str,
    p: &Plan,
    chip: &ChipProfile,
    host: &HostOptions,
    explain: bool,
    acceptance: f64,
) -> serde_json::Value {
    let rates = |f: &dyn Fn(usize) -> f64| -> serde_json::Map<String, serde_json::Value> {
        STREAMS.iter().map(|&n| (n.to_string(), json!(f(n)))).collect()
    };
    let speculative: Vec<(usize, anelm_ane::SpeculativeDecode)> = STREAMS
        .iter()
        .map(|&n| (n, p.speculative_decode(chip, host, n, acceptance)))
        .collect();
    let mut v = json!({
        "model": model,
        "chip": chip.name,
        "weights": p.options.weights.label(),
        "runtime": host.runtime.name(),
        "context": host.context,
        "serial_host": !host.overlapped(),
        "kernels": p.kernel_count(),
        "dispatches_per_token": p.dispatches_per_token(),
        "weight_bytes_per_token": p.weight_bytes_per_token(),
        "bytes_per_dispatch": p.bytes_per_token() / p.dispatches_per_token().max(1) as u64,
        "step_ms": p.decode_cost(chip, host, 1).seconds() * 1e3,
        "decode_tok_s": rates(&|n| p.decode_tok_s(chip, host, n)),
        "prefill_tok_s": p.prefill_tok_s(chip, host),
        "prefill_lanes": host.runtime.prefill_lanes(),
        "ane_step_ms": p.step_seconds(chip) * 1e3,
        "ane_decode_tok_s": rates(&|n| p.ane_decode_tok_s(chip, n)),
        "acceptance": acceptance,
        "speculative_decode_tok_s": speculative.iter().map(|(n, s)| (n.to_string(), json!(s.tok_s))).collect::<serde_json::Map<_, _>>(),
        "speculative_drafts": speculative.iter().map(|(n, s)| (n.to_string(), json!(s.drafts))).collect::<serde_json::Map<_, _>>(),
    });
    if explain {
        v["explain"] = json!({
            "decode_1": terms_json(p, chip, host, Some(1)),
            "decode_2": terms_json(p, chip, host, Some(2)),
            "decode_4": terms_json(p, chip, host, Some(4)),
            "decode_8": terms_json(p, chip, host, Some(8)),
            "prefill": terms_json(p, chip, host, None),
        });
    }
    if let Some(m) = measured_for(p, chip) {
        v["measured_cpp"] = json!({
            "decode_tok_s": m.decode,
            "serve_tok_s": {"1": m.serve[0], "2": m.serve[1], "4": m.serve[2]},
            "prefill_tok_s": m.prefill,
        });
    }
    v
}

/// Plan the model at `path` with `mode` weights.
pub fn plan_model(path: &std::path::Path, mode: WeightMode) -> Result<Plan> {
    let kernels =
        model_kernels(path).with_context(|| format!("could not read the model's shapes from {}", path.display()))?;
    Ok(anelm_ane::plan_model(&kernels, &PlanOptions::with_weights(mode))?)
}

fn explain(p: &Plan, chip: &ChipProfile, host: &HostOptions) {
    println!(
        "\nwhere a token's time goes ({} runtime on {}, context {}):",
        host.runtime, chip.name, host.context
    );
    for n in STREAMS {
        println!("  decode, {n} stream{}:", if n == 1 { "" } else { "s" });
        print!("{}", p.decode_cost(chip, host, n).explain());
    }
    println!(
        "  prefill, {} prompt tokens per step (LM head excluded):",
        host.runtime.prefill_lanes()
    );
    print!("{}", p.prefill_cost(chip, host).explain());
}

fn compare(p: &Plan, chip: &ChipProfile, host: &HostOptions, m: &Measured) {
    let row = |what: &str, modelled: f64, measured: f64| {
        println!(
            "| {what} | {modelled:.2} | {measured:.2} | {:+.1} % |",
            (modelled / measured - 1.0) * 100.0
        );
    };
    println!(
        "\nmodelled ({} runtime) vs measured by the C++ system ({} {}, M3 Max, ane-runtime.md §11):",
        host.runtime, m.name, m.weights
    );
    println!("| figure | modelled tok/s | measured tok/s | error |\n| --- | ---: | ---: | ---: |");
    row("single-stream decode", p.decode_tok_s(chip, host, 1), m.decode);
    for (i, n) in [1, 2, 4].into_iter().enumerate() {
        row(&format!("serve c{n}"), p.decode_tok_s(chip, host, n), m.serve[i]);
    }
    row("prefill", p.prefill_tok_s(chip, host), m.prefill);
    if host.runtime != HostRuntime::AneCpp {
        println!("(--runtime ane-cpp models the code that was measured)");
    }
}

/// The chip profile fitted from the report at `path`: `chip` (or the profile of the chip the
/// report names, else m3-max) with the report's dispatch line, and a line saying so.
fn calibrate(path: &std::path::Path, chip: Option<ChipProfile>) -> Result<(ChipProfile, String)> {
    let cal = crate::doctor_report::read_calibration(path)?;
    let from_report = cal
        .chip
        .as_deref()
        .and_then(crate::doctor_report::profile_name)
        .and_then(|n| ChipProfile::by_name(&n));
    let base = chip.or(from_report).unwrap_or_default();
    let mut note = format!(
        "calibrated from {}: {:.1} µs + bytes / {:.1} GB/s per dispatch (sweep on {}, largest residual {:.1} %), host constants of the {} profile",
        path.display(),
        cal.fit.fixed_us,
        cal.fit.gb_s,
        cal.device,
        cal.fit.max_residual * 100.0,
        base.name
    );
    if cal.device != "ane" {
        note.push_str("; the sweep did not run on a Neural Engine, so this is that device's clock, not a chip's");
    }
    Ok((base.calibrated(&cal.fit), note))
}

/// Run `anelm plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    let path = match a.model {
        Some(p) => p,
        None => default_model_path()?,
    };
    let chip = match &a.chip {
        Some(name) => Some(
            ChipProfile::by_name(name)
                .ok_or_else(|| anyhow::anyhow!("unknown --chip '{name}': use one of {}", ChipProfile::names()))?,
        ),
        None => None,
    };
    let calibrated = match &a.calibrate {
        Some(report) => Some(calibrate(report, chip)?),
        None => None,
    };
    let chip = calibrated.as_ref().map(|(c, _)| *c).or(chip);
    // Encoders (embedding models) have their own plan: 32 tokens per dispatch, no decode.
    if let Some((dims, layer)) = crate::plan_encoder::encoder_dims(&path)? {
        let model = path.display().to_string();
        if let Some((_, note)) = calibrated.as_ref().filter(|_| !a.json) {
            println!("{note}");
        }
        let output = match (a.json, a.explain) {
            (true, _) => crate::plan_encoder::EncoderOutput::Json,
            (false, true) => crate::plan_encoder::EncoderOutput::Explain,
            (false, false) => crate::plan_encoder::EncoderOutput::Table,
        };
        return crate::plan_encoder::run(&model, &dims, &layer, a.weights.mode(), a.seq_len, chip, output);
    }
    if !(0.0..=1.0).contains(&a.acceptance) {
        anyhow::bail!(
            "--acceptance is a share of drafted tokens, from 0 to 1 (got {})",
            a.acceptance
        );
    }
    let p = plan_model(&path, a.weights.mode())?;
    let host = HostOptions {
        runtime: a.runtime.runtime(),
        context: a.context,
        serial: a.serial_host,
    };
    let model = path.display().to_string();
    if a.json {
        let mut v = plan_json(&model, &p, &chip.unwrap_or_default(), &host, a.explain, a.acceptance);
        if let Some((c, note)) = &calibrated {
            v["calibrated"] = json!({"fixed_us": c.fixed_us, "gb_s": c.stream_gb_s, "from": note});
        }
        println!("{v}");
        return Ok(());
    }
    println!("{model}");
    if let Some((_, note)) = &calibrated {
        println!("{note}");
    }
    let shown = chip.unwrap_or_default();
    print!("{}", p.report_host(&shown, &host));
    print!(
        "speculative decode tok/s (prompt lookup, acceptance {:.2}):",
        a.acceptance
    );
    for n in STREAMS {
        let s = p.speculative_decode(&shown, &host, n, a.acceptance);
        print!(
            "  {n} stream{}: {:.2} ({} drafts, {:.2} tokens/pass)",
            if n == 1 { "" } else { "s" },
            s.tok_s,
            s.drafts,
            s.tokens_per_pass
        );
    }
    println!();
    if a.explain {
        explain(&p, &shown, &host);
    }
    if let Some(m) = measured_for(&p, &shown) {
        compare(&p, &shown, &host, m);
    }
    if chip.is_none() {
        println!(
            "\nmodelled tok/s per chip ({} runtime, host work included; decode at 1/2/4/8 streams sharing each \
             dispatch's lanes; prefill at a {}-token W-lane batch):",
            host.runtime,
            host.runtime.prefill_lanes()
        );
        println!(
            "| chip | fixed µs | stream GB/s | step ms | 1 | 2 | 4 | 8 | prefill |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for c in &CHIPS {
            print!(
                "| {} | {:.0} | {:.1} | {:.1} |",
                c.name,
                c.fixed_us,
                c.stream_gb_s,
                p.decode_cost(c, &host, 1).seconds() * 1e3
            );
            for n in STREAMS {
                print!(" {:.2} |", p.decode_tok_s(c, &host, n));
            }
            println!(" {:.2} |", p.prefill_tok_s(c, &host));
        }
    }
    Ok(())
}
