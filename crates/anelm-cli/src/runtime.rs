//! Turning the shared arguments into a loaded model: thread pool, device, default model, progress.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anelm_model::chat_template::ChatTemplate;
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use anelm_ane::{AppleAne, AppleConfig, ChipProfile, CompileCache, EmuAne, EmuConfig};
use anelm_engine::{
    AneBackend, AneMonitor, AneOptions, AneStats, Backend, CpuBackend, Embedder, KernelFallback, LanguageModel,
    LoadedModel, Reranker, load_model, load_model_weights,
};

use crate::args::{AneArgs, DeviceArg, EmbeddingPromptArgs, ModelArgs, RerankPromptArgs};
use crate::default_model::default_model_path;

/// Run `f` on a worker of a persistent pool of `threads` threads (default: the machine's cores),
/// which every parallel kernel inside `f` uses.
pub fn in_pool<T: Send>(threads: Option<usize>, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let n = match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let pool = anelm_engine::threads::start_pools(n, "anelm-worker").context("could not start the thread pools")?;
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
    Ok(load_reporting(args)?.0)
}

/// What the device a model was compiled on can report: on an ANE device, dispatch counts,
/// measured host time and modelled (emulator) ANE time.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    /// Backend name (`cpu`, `ane-emu`).
    pub name: String,
    /// The emulator's chip profile.
    pub chip: Option<ChipProfile>,
    monitor: Option<AneMonitor>,
}

impl DeviceReport {
    fn cpu() -> Self {
        DeviceReport {
            name: "cpu".into(),
            chip: None,
            monitor: None,
        }
    }

    /// ANE counters (`None` on the CPU).
    pub fn stats(&self) -> Option<AneStats> {
        self.monitor.as_ref().map(AneMonitor::stats)
    }

    /// The kernels that fell back to another form while the model was compiled (int8 → fp16,
    /// FFN resadd → plain → chunked, LM head → CPU); empty on the CPU.
    pub fn fallbacks(&self) -> Vec<KernelFallback> {
        self.monitor.as_ref().map(AneMonitor::fallbacks).unwrap_or_default()
    }

    /// The fallbacks as report lines: a count, then one `kernel: from → to (reason)` line each.
    /// Nothing when every kernel got its first form.
    pub fn fallback_lines(&self) -> Vec<String> {
        let list = self.fallbacks();
        if list.is_empty() {
            return Vec::new();
        }
        let mut lines = vec![format!(
            "{}: {} ANE fallback(s): the device refused these kernel forms and anelm built the next one",
            self.name,
            list.len()
        )];
        lines.extend(list.iter().map(|f| format!("  {f}")));
        lines
    }

    /// Zero the dispatch counters and clocks.
    pub fn reset(&self) {
        if let Some(m) = &self.monitor {
            m.reset_dispatch_stats();
        }
    }

    /// One line on stderr: dispatches, host time and modelled ANE time since the last reset, and
    /// the modelled rate for `tokens` tokens. Nothing on the CPU.
    pub fn print_line(&self, what: &str, tokens: usize) {
        let Some(s) = self.stats() else {
            return;
        };
        let Some(chip) = self.chip else {
            // The real Neural Engine: its time is measured (the evaluate calls), not modelled.
            eprintln!(
                "{}: {what}: {} dispatches, {:.1} MB moved; host {:.1} ms, ANE evaluate calls {:.1} ms (measured)",
                self.name,
                s.dispatches,
                s.bytes as f64 / 1e6,
                s.host_time.as_secs_f64() * 1e3,
                s.ane_time.as_secs_f64() * 1e3
            );
            return;
        };
        let ane = s.ane_time.as_secs_f64();
        let rate = if ane > 0.0 { tokens as f64 / ane } else { 0.0 };
        eprintln!(
            "{} ({}): {what}: {} dispatches, {:.1} MB moved; host {:.1} ms measured, ANE {:.1} ms modelled \
             → {rate:.1} tok/s modelled on {}",
            self.name,
            chip.name,
            s.dispatches,
            s.bytes as f64 / 1e6,
            s.host_time.as_secs_f64() * 1e3,
            ane * 1e3,
            chip.name
        );
    }
}

/// The ANE backend options the arguments describe (compile cache under the user cache dir
/// unless `--no-ane-cache`).
pub fn ane_options(a: &AneArgs) -> AneOptions {
    AneOptions {
        weights: a.ane_weights.mode(),
        cache: if a.no_ane_cache {
            None
        } else {
            CompileCache::user_default()
        },
    }
}

/// The real Neural Engine's settings (the environment's; a model directory is removed once its
/// program has loaded, with or without `--no-ane-cache`).
pub fn apple_config(_a: &AneArgs) -> AppleConfig {
    AppleConfig::from_env()
}

fn apple_backend(dev: AppleAne, args: &ModelArgs) -> (Box<dyn Backend>, DeviceReport) {
    let a = &args.ane;
    let b = AneBackend::new(Arc::new(dev), ane_options(a));
    // Count the programs before compiling (the plan knows), so a compile budget too small for
    // the model is announced up front rather than met at program 120.
    let programs = model_path(args)
        .ok()
        .and_then(|p| crate::plan::plan_model(&p, a.ane_weights.mode()).ok())
        .map(|p| p.kernel_count());
    if let Some(n) = programs {
        b.expect_programs(n);
    }
    let report = DeviceReport {
        name: "ane".into(),
        chip: None,
        monitor: Some(b.monitor()),
    };
    (Box::new(b), report)
}

/// [`load`], also returning what the device can report.
pub fn load_reporting(args: &ModelArgs) -> Result<(LoadedModel, DeviceReport)> {
    // Read the template first: a bad file fails before the model loads.
    let template = match &args.chat_template {
        Some(p) => Some(
            std::fs::read_to_string(p).with_context(|| format!("could not read the chat template {}", p.display()))?,
        ),
        None => None,
    };
    let (mut lm, report) = load_with(args, CpuBackend::new, |path, backend, progress| {
        Ok(load_model(path, backend, progress)?)
    })?;
    if let Some(source) = template {
        lm.template = ChatTemplate::new(&source, lm.tokenizer.bos_token(), lm.tokenizer.eos_token()).with_context(
            || match &args.chat_template {
                Some(p) => format!("the chat template in {}", p.display()),
                None => "the chat template".into(),
            },
        )?;
        lm.has_own_template = true;
    }
    Ok((lm, report))
}

/// Load only the forward pass of the model the arguments name (no tokenizer or chat template):
/// for token-id-level commands, and for safetensors directories without `tokenizer.json`. Also
/// returns what the device can report.
pub fn load_weights_reporting(args: &ModelArgs) -> Result<(Box<dyn LanguageModel>, DeviceReport)> {
    if args.chat_template.is_some() {
        anyhow::bail!("--chat-template has no effect here: this command works on token ids, without chat prompts");
    }
    load_with(args, CpuBackend::new, |path, backend, progress| {
        Ok(load_model_weights(path, backend, progress)?)
    })
}

/// Load the embedding model (a sentence-transformers directory) the arguments name, on their
/// device, with the instruction `prompt` asks for.
pub fn load_embedder(args: &ModelArgs, prompt: &EmbeddingPromptArgs) -> Result<Embedder> {
    // On the CPU, embedding models run their float matrices as bf16 where the CPU can.
    let mut model = load_with(args, CpuBackend::for_embeddings, |path, backend, progress| {
        Ok(Embedder::load_with_progress(path, backend, progress)?)
    })?
    .0;
    if let Some(text) = &prompt.embedding_instruction {
        model.set_instruction(Some(text.clone()))?;
    } else if let Some(name) = &prompt.embedding_prompt {
        let text = model.prompt(name).map(str::to_string).ok_or_else(|| {
            let names = model.prompt_names();
            anyhow::anyhow!(
                "the embedding model has no prompt '{name}' (its prompts: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )
        })?;
        model.set_instruction(Some(text))?;
    }
    Ok(model)
}

/// Load a reranker: a cross-encoder directory (on the CPU in f32, so scores match
/// sentence-transformers to 1e-4), or a causal language model as a yes/no reranker with `prompt`.
pub fn load_reranker(args: &ModelArgs, prompt: &RerankPromptArgs) -> Result<Reranker> {
    let prompt = prompt.prompt();
    Ok(load_with(args, CpuBackend::new, |path, backend, progress| {
        Ok(Reranker::load(path, backend, prompt, progress)?)
    })?
    .0)
}

fn load_with<T>(
    args: &ModelArgs,
    cpu_backend: fn() -> CpuBackend,
    loader: impl FnOnce(&std::path::Path, &dyn Backend, &mut dyn FnMut(usize, usize)) -> Result<T>,
) -> Result<(T, DeviceReport)> {
    // The device first: `--device ane` on a machine without one fails before anything else.
    let cpu = || match args.quantize {
        Some(q) => CpuBackend::quantizing(q),
        None => cpu_backend(),
    };
    let (backend, report): (Box<dyn Backend>, DeviceReport) = match args.device {
        DeviceArg::Cpu => (Box::new(cpu()), DeviceReport::cpu()),
        DeviceArg::Ane => apple_backend(AppleAne::open_with(&apple_config(&args.ane))?, args),
        DeviceArg::Auto => match AppleAne::open_with(&apple_config(&args.ane)) {
            Ok(dev) => apple_backend(dev, args),
            Err(_) => (Box::new(cpu()), DeviceReport::cpu()),
        },
        DeviceArg::AneEmu => {
            let chip = args.ane.chip_profile()?;
            // ANELM_EMU_REFUSE (a test knob) makes the emulator refuse kernel forms, to show the
            // fallback chain off a Mac.
            let emu = EmuAne::new(EmuConfig {
                chip,
                refuse: EmuConfig::refuse_from_env(),
                ..EmuConfig::default()
            });
            let b = AneBackend::new(Arc::new(emu), ane_options(&args.ane));
            let report = DeviceReport {
                name: "ane-emu".into(),
                chip: Some(chip),
                monitor: Some(b.monitor()),
            };
            (Box::new(b), report)
        }
    };
    if let (Some(q), Some(_)) = (args.quantize, &report.monitor) {
        anyhow::bail!(
            "--quantize {} re-encodes weights for the CPU backend; the Neural Engine ({}) stores its own \
             (fp16, or int8 with --ane-weights int8)",
            q.name(),
            report.name
        );
    }
    let path = model_path(args)?;
    let verb = if report.monitor.is_some() {
        "compiling"
    } else {
        "loading"
    };
    let start = Instant::now();
    let bar = ProgressBar::hidden();
    let mut shown = false;
    let mut progress = |done: usize, total: usize| {
        if !shown && start.elapsed() > Duration::from_millis(300) {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(&format!("{verb} {{msg}} [{{bar:30}}] {{pos}}/{{len}} layers"))
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
    let model = loader(&path, backend.as_ref(), &mut progress)
        .with_context(|| format!("could not load the model at {}", path.display()))?;
    bar.finish_and_clear();
    for line in report.fallback_lines() {
        eprintln!("{line}");
    }
    Ok((model, report))
}
