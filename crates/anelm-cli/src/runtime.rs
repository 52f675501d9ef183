//! Turning the shared arguments into a loaded model: thread pool, device, default model, progress.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use anelm_engine::{Backend, CpuBackend, LanguageModel, LoadedModel, load_model, load_model_weights};

use crate::args::{DeviceArg, ModelArgs};
use crate::default_model::default_model_path;

/// Run `f` on a worker of a persistent pool of `threads` threads (default: the machine's cores),
/// which every parallel kernel inside `f` uses.
pub fn in_pool<T: Send>(threads: Option<usize>, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let n = match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // Matmuls run on the kernel pool (spinning workers); the rayon pool runs the remaining
    // parallel loops (attention).
    anelm_kernels::pool::init_global(n);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("anelm-worker-{i}"))
        .stack_size(8 << 20)
        .build()
        .context("could not start the thread pool")?;
    pool.install(f)
}

/// The model path the arguments name (or the default model).
pub fn model_path(args: &ModelArgs) -> Result<PathBuf> {
    match &args.model {
        Some(p) => Ok(p.clone()),
        None => default_model_path(),
    }
}

/// Load the model the arguments name, with a progress bar when it takes more than a moment.
pub fn load(args: &ModelArgs) -> Result<LoadedModel> {
    load_with(args, |path, backend, progress| Ok(load_model(path, backend, progress)?))
}

/// Load only the forward pass of the model the arguments name (no tokenizer or chat template):
/// for token-id-level commands, and for safetensors directories without `tokenizer.json`.
pub fn load_weights(args: &ModelArgs) -> Result<Box<dyn LanguageModel>> {
    load_with(args, |path, backend, progress| {
        Ok(load_model_weights(path, backend, progress)?)
    })
}

fn load_with<T>(
    args: &ModelArgs,
    loader: impl FnOnce(&std::path::Path, &dyn Backend, &mut dyn FnMut(usize, usize)) -> Result<T>,
) -> Result<T> {
    let path = model_path(args)?;
    let backend = match args.device {
        DeviceArg::Auto | DeviceArg::Cpu => CpuBackend::new(),
    };
    let start = Instant::now();
    let bar = ProgressBar::hidden();
    let mut shown = false;
    let mut progress = |done: usize, total: usize| {
        if !shown && start.elapsed() > Duration::from_millis(300) {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_message(
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
            shown = true;
        }
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let model = loader(&path, &backend, &mut progress)
        .with_context(|| format!("could not load the model at {}", path.display()))?;
    bar.finish_and_clear();
    Ok(model)
}
