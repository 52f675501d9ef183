//! `anelm plan` on an encoder (a BERT-family embedding model's directory or `config.json`): its
//! ANE kernels, dispatches and bytes per 32-token step, and the modelled tokens/s and
//! embeddings/s per chip for texts of `--seq-len` tokens (`anelm_ane::plan_encoder_kernels` over the
//! kernels `BertConfig::kernel_specs` describes, which loading compiles).

use std::path::Path;

use anyhow::Result;
use serde_json::json;

use anelm_ane::{
    CHIPS, ChipProfile, EncoderDims, EncoderPlan, LANES, ModelKernel, PlanOptions, WeightMode, plan_encoder_kernels,
};
use anelm_engine::arch::bert::BertConfig;
use anelm_engine::plan_dims::encoder_kernels;
use anelm_model::hf_config::HfConfig;

/// The encoder shapes of the model at `path` and the kernels each of its layers compiles, when
/// it is a BERT `config.json` (or a directory holding one); `None` for any other model.
pub fn encoder_dims(path: &Path) -> Result<Option<(EncoderDims, Vec<ModelKernel>)>> {
    let config = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if !config.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) || !config.is_file() {
        return Ok(None);
    }
    let hf = HfConfig::from_file(&config)?;
    if hf.model_type != "bert" {
        return Ok(None);
    }
    Ok(Some(encoder_kernels(&BertConfig::from_hf(&hf)?)?))
}

/// What `anelm plan` prints for an encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderOutput {
    /// The kernel table and the per-chip rates.
    Table,
    /// The table, then where a step's time goes on the chosen chip (`--explain`).
    Explain,
    /// One JSON object (`--json`).
    Json,
}

/// Print the encoder plan (or its JSON) for one chip or every chip.
pub fn run(
    model: &str,
    dims: &EncoderDims,
    layer: &[ModelKernel],
    mode: WeightMode,
    seq_len: usize,
    chip: Option<ChipProfile>,
    output: EncoderOutput,
) -> Result<()> {
    if seq_len == 0 || seq_len > dims.max_positions {
        anyhow::bail!("--seq-len must be from 1 to {} for this model", dims.max_positions);
    }
    let p = plan_encoder_kernels(dims, layer, &PlanOptions::with_weights(mode))?;
    let shown = chip.unwrap_or_default();
    if output == EncoderOutput::Json {
        println!("{}", plan_json(model, &p, &shown, seq_len));
        return Ok(());
    }
    println!("{model}");
    println!(
        "encoder: {} layers, hidden {}, FFN {}; {} weights; {} kernels, {} dispatches per step of {LANES} tokens \
         (texts packed into the W-lanes, no padding), {:.1} MB of weights per step",
        dims.layers,
        dims.hidden,
        dims.intermediate,
        mode.label(),
        p.kernel_count(),
        p.dispatches_per_step(),
        p.weight_bytes_per_step() as f64 / 1e6
    );
    println!("| kernel (every layer) | shape | weight MB |\n| --- | --- | ---: |");
    for k in &p.layer {
        println!(
            "| {} | {} | {:.2} |",
            k.role,
            k.kernel,
            k.kernel.weight_bytes(mode) as f64 / 1e6
        );
    }
    let chips: Vec<ChipProfile> = match chip {
        Some(c) => vec![c],
        None => CHIPS.to_vec(),
    };
    println!(
        "\nmodelled per chip, texts of {seq_len} tokens (a step: the dispatches, then the host's surfaces, \
         LayerNorms, biases, GELU and attention over each text; nothing overlaps):"
    );
    println!(
        "| chip | step ms | ANE ms | host ms | tokens/s | embeddings/s | one text ms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for c in &chips {
        let cost = p.step_cost(c, seq_len);
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} | {:.2} |",
            c.name,
            cost.seconds() * 1e3,
            cost.ane() * 1e3,
            cost.host() * 1e3,
            cost.tok_s(),
            p.embeddings_per_s(c, seq_len),
            p.single_text_seconds(c, seq_len) * 1e3
        );
    }
    if output == EncoderOutput::Explain {
        println!("\nwhere a step's time goes on {} (per token):", shown.name);
        print!("{}", p.step_cost(&shown, seq_len).explain());
    }
    Ok(())
}

fn plan_json(model: &str, p: &EncoderPlan, chip: &ChipProfile, seq_len: usize) -> serde_json::Value {
    let cost = p.step_cost(chip, seq_len);
    json!({
        "model": model,
        "kind": "encoder",
        "chip": chip.name,
        "weights": p.options.weights.label(),
        "seq_len": seq_len,
        "kernels": p.kernel_count(),
        "dispatches_per_step": p.dispatches_per_step(),
        "tokens_per_step": LANES,
        "weight_bytes_per_step": p.weight_bytes_per_step(),
        "step_ms": cost.seconds() * 1e3,
        "ane_step_ms": cost.ane() * 1e3,
        "host_step_ms": cost.host() * 1e3,
        "ms_per_token": cost
            .terms()
            .iter()
            .filter(|(_, t)| *t > 0.0)
            .map(|(name, t)| (name.to_string(), json!(t * 1e3 / LANES as f64)))
            .collect::<serde_json::Map<_, _>>(),
        "tokens_per_s": cost.tok_s(),
        "embeddings_per_s": p.embeddings_per_s(chip, seq_len),
        "single_text_ms": p.single_text_seconds(chip, seq_len) * 1e3,
    })
}
