//! `anelm plan`: from a model's configuration alone (a `config.json`, its directory, or a GGUF
//! file's metadata; no weights), the ANE kernels of every layer with their shapes, bytes and the
//! reason for each choice, dispatches per token, bytes per dispatch, and the modelled decode
//! tok/s at 1, 2, 4 and 8 streams per chip profile.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use anelm_ane::{CHIPS, ChipProfile, Plan, PlanOptions, WeightMode, plan};
use anelm_engine::plan_dims::model_dims;

use crate::args::AneWeightsArg;
use crate::default_model::default_model_path;

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
    /// One JSON object on stdout (for `--chip`, or m3-max).
    #[arg(long)]
    pub json: bool,
}

/// Streams the rate table shows.
const STREAMS: [usize; 4] = [1, 2, 4, 8];
/// Prompt tokens per W-lane prefill dispatch (the default `--prefill-batch`).
const PREFILL_BATCH: usize = 4;

/// A decode rate the C++ system measured (ane-runtime.md §11, README 7c61e4e, M3 Max, single
/// stream). Printed beside the modelled figure; never used to set a constant.
struct Measured {
    name: &'static str,
    hidden: usize,
    intermediate: usize,
    layers: usize,
    vocab: usize,
    weights: &'static str,
    tok_s: f64,
}

const CPP_MEASURED_M3_MAX: [Measured; 4] = [
    measured("Qwen3.5-4B", 2560, 9216, "fp16", 9.21),
    measured("Qwen3.5-4B", 2560, 9216, "int8", 11.66),
    measured("Qwen3.5-9B", 4096, 12288, "fp16", 4.27),
    measured("Qwen3.5-9B", 4096, 12288, "int8", 7.01),
];

const fn measured(
    name: &'static str,
    hidden: usize,
    intermediate: usize,
    weights: &'static str,
    tok_s: f64,
) -> Measured {
    Measured {
        name,
        hidden,
        intermediate,
        layers: 32,
        vocab: 248_320,
        weights,
        tok_s,
    }
}

/// The C++ system's measured single-stream decode for this plan on `chip`, if it has one.
fn measured_for(p: &Plan, chip: &ChipProfile) -> Option<&'static Measured> {
    let d = &p.dims;
    let mode = p.options.weights.label();
    (chip.name == "m3-max" && d.linear_attention.is_some())
        .then(|| {
            CPP_MEASURED_M3_MAX.iter().find(|m| {
                m.hidden == d.hidden
                    && m.intermediate == d.intermediate
                    && m.layers == d.layers
                    && m.vocab == d.vocab
                    && m.weights == mode
            })
        })
        .flatten()
}

/// The plan's figures as the JSON object outside checks read.
pub fn plan_json(model: &str, p: &Plan, chip: &ChipProfile) -> serde_json::Value {
    let decode: serde_json::Map<String, serde_json::Value> = STREAMS
        .iter()
        .map(|&n| (n.to_string(), json!(p.decode_tok_s(chip, n))))
        .collect();
    let mut v = json!({
        "model": model,
        "chip": chip.name,
        "weights": p.options.weights.label(),
        "kernels": p.kernel_count(),
        "dispatches_per_token": p.dispatches_per_token(),
        "weight_bytes_per_token": p.weight_bytes_per_token(),
        "bytes_per_dispatch": p.bytes_per_token() / p.dispatches_per_token().max(1) as u64,
        "step_ms": p.step_seconds(chip) * 1e3,
        "decode_tok_s": decode,
        "prefill_tok_s": p.prefill_tok_s(chip, PREFILL_BATCH),
    });
    if let Some(m) = measured_for(p, chip) {
        v["measured_cpp_tok_s"] = json!(m.tok_s);
    }
    v
}

/// Plan the model at `path` with `mode` weights.
pub fn plan_model(path: &std::path::Path, mode: WeightMode) -> Result<Plan> {
    let dims =
        model_dims(path).with_context(|| format!("could not read the model's shapes from {}", path.display()))?;
    Ok(plan(&dims, &PlanOptions::with_weights(mode))?)
}

/// Run `anelm plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    let path = match a.model {
        Some(p) => p,
        None => default_model_path()?,
    };
    let p = plan_model(&path, a.weights.mode())?;
    let chip = match &a.chip {
        Some(name) => Some(
            ChipProfile::by_name(name)
                .ok_or_else(|| anyhow::anyhow!("unknown --chip '{name}': use one of {}", ChipProfile::names()))?,
        ),
        None => None,
    };
    let model = path.display().to_string();
    if a.json {
        println!("{}", plan_json(&model, &p, &chip.unwrap_or_default()));
        return Ok(());
    }
    println!("{model}");
    match chip {
        Some(c) => {
            print!("{}", p.report(&c));
            if let Some(m) = measured_for(&p, &c) {
                let modelled = p.decode_tok_s(&c, 1);
                println!(
                    "single-stream decode: modelled {modelled:.2} tok/s vs {:.2} measured by the C++ system \
                     ({} {}, M3 Max): {:+.0} %",
                    m.tok_s,
                    m.name,
                    m.weights,
                    (modelled / m.tok_s - 1.0) * 100.0
                );
            }
        }
        None => {
            print!("{}", p.report(&ChipProfile::m3_max()));
            println!(
                "\nmodelled tok/s per chip (decode at 1/2/4/8 streams sharing each dispatch's lanes; prefill at a \
                 {PREFILL_BATCH}-token W-lane batch):"
            );
            println!(
                "| chip | fixed µs | GB/s | step ms | 1 | 2 | 4 | 8 | prefill |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            );
            for c in &CHIPS {
                print!(
                    "| {} | {:.0} | {:.1} | {:.1} |",
                    c.name,
                    c.fixed_us,
                    c.bandwidth_gb_s,
                    p.step_seconds(c) * 1e3
                );
                for n in STREAMS {
                    print!(" {:.2} |", p.decode_tok_s(c, n));
                }
                println!(" {:.2} |", p.prefill_tok_s(c, PREFILL_BATCH));
            }
        }
    }
    Ok(())
}
