//! `anelm inspect`: what is inside a model file, without running it.

use anyhow::{Context, Result};
use clap::Args;

use anelm_model::gguf::{GgufFile, GgufValue};
use anelm_model::hf_config::HfConfig;
use anelm_model::safetensors_dir::SafetensorsDir;
use anelm_model::tensor_store::TensorStore;

use crate::args::ModelArgs;
use crate::runtime::model_path;

/// Arguments of `anelm inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print every tensor (default: the first 40).
    #[arg(long)]
    pub all_tensors: bool,
}

fn show_value(v: &GgufValue) -> String {
    let s = format!("{v:?}");
    if s.chars().count() > 160 {
        let head: String = s.chars().take(150).collect();
        format!("{head}… ({} chars)", s.len())
    } else {
        s
    }
}

/// Run `anelm inspect`.
pub fn run(a: InspectArgs) -> Result<()> {
    let path = model_path(&a.model)?;
    let limit = if a.all_tensors { usize::MAX } else { 40 };
    if path.is_dir() {
        let cfg = HfConfig::from_file(&path.join("config.json"))?;
        let st = SafetensorsDir::open(&path)?;
        println!("format: safetensors directory {}", path.display());
        println!("architecture: {} {:?}", cfg.model_type, cfg.architectures);
        println!("config: {}", serde_json::to_string_pretty(cfg.raw())?);
        let mut names = st.tensor_names();
        names.sort_unstable();
        println!("tensors: {}", names.len());
        for name in names.iter().take(limit) {
            match st.tensor(name) {
                Ok(t) => println!("  {name:<60} {:<5} {:?}", t.format.name(), t.shape),
                Err(e) => println!("  {name:<60} ({e})"),
            }
        }
        return Ok(());
    }
    let g = GgufFile::open(&path).with_context(|| format!("could not read {}", path.display()))?;
    println!("format: GGUF v{} {}", g.version(), path.display());
    println!("architecture: {}", g.architecture().unwrap_or("(none)"));
    println!("metadata: {} keys", g.metadata().len());
    for (k, v) in g.metadata() {
        println!("  {k} = {}", show_value(v));
    }
    let tensors = g.tensors();
    let total: u64 = tensors.iter().map(|t| t.size).sum();
    println!(
        "tensors: {} ({:.1} MiB)",
        tensors.len(),
        total as f64 / (1024.0 * 1024.0)
    );
    for t in tensors.iter().take(limit) {
        let ty = t
            .format
            .map_or_else(|| format!("type{}", t.ggml_type), |f| f.name().to_string());
        println!("  {:<40} {:<5} {:?}", t.name, ty, t.dims);
    }
    if tensors.len() > limit {
        println!("  … {} more (--all-tensors)", tensors.len() - limit);
    }
    Ok(())
}
