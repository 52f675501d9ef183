//! `anelm serve`: the OpenAI-compatible server. It listens at once (`/health` answers 503 while
//! the model loads), then serves every request through one continuous-batching scheduler.
//! `--embedding-model DIR` adds `/v1/embeddings` beside the chat model; a `--model` that is an
//! embedding model (a sentence-transformers directory) serves embeddings only.
//! `--rerank-model PATH` adds `/v1/rerank` and `/v1/classify` beside the chat model (a
//! cross-encoder directory, or a causal LM as a yes/no reranker); a `--model` that is a
//! cross-encoder (its config names a `…ForSequenceClassification`) serves only those.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use anelm_engine::{
    CrossEncoder, Embedder, LoadedModel, ModelIdentity, PromptCache, PromptCacheOptions, SchedulerConfig,
};
use anelm_server::batch_runner::Jobs;
use anelm_server::data_dir::{DataDir, DataDirError, default_data_dir};
use anelm_server::embeddings::Embeddings;
use anelm_server::job_store::JobStore;
use anelm_server::rerank::Rerank;
use anelm_server::upstream::{Upstream, Upstreams};
use anelm_server::{AppState, ServerConfig, router, shutdown_signal};

use crate::args::{EmbeddingPromptArgs, ModelArgs, RerankPromptArgs, SpeculateArgs};
use crate::runtime::{load, load_embedder, load_reranker, model_path};

/// Arguments of `anelm serve`.
#[derive(Args, Debug)]
// `--model` may be given more than once (several models in one server); `model` keeps the first.
#[command(mut_arg("model", |a| a.action(clap::ArgAction::Append)))]
pub struct ServeArgs {
    /// Every `--model` given (read before `model`, which takes the first).
    #[command(flatten)]
    pub models: ModelList,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Serve every model in DIR (each GGUF file and each model directory, named by its file
    /// stem or directory name), beside any --model: each is loaded on its first request.
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// With several models: most bytes of model files loaded at once; loading another first
    /// unloads the least recently used idle, unpinned ones (default: no limit).
    #[arg(long, value_name = "BYTES")]
    pub max_loaded_bytes: Option<u64>,
    /// Speculative decoding for requests that do not choose (their `speculate` field does).
    #[command(flatten)]
    pub speculate: SpeculateArgs,
    /// Address to bind (use 0.0.0.0 to accept other machines).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Concurrent sessions (streams generating at once, batched together).
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    /// Requests that may wait for a free session; more get 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Prompt tokens a session prefills per step (smaller: other streams stall less).
    #[arg(long, default_value_t = anelm_engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Require `Authorization: Bearer <key>` on /v1/*.
    #[arg(long, env = "ANELM_API_KEY")]
    pub api_key: Option<String>,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Name reported by /v1/models (default: the model file's name).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Do not share prompt prefixes between concurrent requests (each prefills its whole
    /// prompt; for comparisons).
    #[arg(long)]
    pub no_prefix_sharing: bool,
    /// Most MiB the sessions' caches may keep between requests (default: no limit); beyond it
    /// the least recently used idle sessions forget their cache.
    #[arg(long, value_name = "MIB")]
    pub cache_mem: Option<usize>,
    /// Forward requests whose `model` is NAME (or NAME/ID) to the OpenAI-compatible engine at
    /// URL (its `/v1` base, http://); repeatable.
    #[arg(long, value_name = "NAME=URL")]
    pub upstream: Vec<String>,
    /// Send upstream NAME the API key held in environment variable ENV_VAR (never the key
    /// itself on the command line); repeatable.
    #[arg(long, value_name = "NAME=ENV_VAR")]
    pub upstream_key: Vec<String>,
    /// Every request stays on this machine unless it says `X-Anelm-Privacy: allow-upstream`.
    #[arg(long)]
    pub private_by_default: bool,
    /// A request that may leave the machine and finds the local queue full goes to upstream
    /// NAME instead of getting 429.
    #[arg(long, value_name = "NAME")]
    pub fallback: Option<String>,
    /// Run at the operating system's background priority (Linux: nice 19 and SCHED_IDLE;
    /// macOS: the utility QoS class), yielding the CPU to the user's foreground work.
    #[arg(long)]
    pub background: bool,
    /// Release the model, its caches and (on a Mac) its Neural Engine programs after this many
    /// seconds without requests; the next request loads them again and waits (`/health` says
    /// "sleeping" meanwhile).
    #[arg(long, value_name = "SECS")]
    pub idle_unload: Option<u64>,
    /// Also serve /v1/embeddings with this embedding model (a sentence-transformers directory,
    /// e.g. the one scripts/fetch-minilm.sh installs, or an embedding model's GGUF).
    #[arg(long, value_name = "PATH")]
    pub embedding_model: Option<PathBuf>,
    #[command(flatten)]
    pub embedding_prompt: EmbeddingPromptArgs,
    /// Also serve /v1/rerank and /v1/classify with this reranker: a cross-encoder directory
    /// (BertForSequenceClassification, as sentence-transformers' CrossEncoder saves it), or a
    /// causal language model (directory or GGUF) scored by P(yes), as Qwen3-Reranker.
    #[arg(long, value_name = "PATH")]
    pub rerank_model: Option<PathBuf>,
    #[command(flatten)]
    pub rerank_prompt: RerankPromptArgs,
    /// Where work that outlives the process is kept: the Files and Batch APIs' job database
    /// (default: ~/Library/Application Support/anelm on macOS, $XDG_DATA_HOME/anelm or
    /// ~/.local/share/anelm elsewhere). One server per directory.
    #[arg(long, value_name = "DIR", env = "ANELM_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Run without a data directory (no /v1/files or /v1/batches).
    #[arg(long, conflicts_with = "data_dir")]
    pub no_data_dir: bool,
    /// Largest file POST /v1/files accepts, in bytes.
    #[arg(long, default_value_t = 200 << 20)]
    pub max_file_bytes: usize,
    /// Do not keep long prompt prefixes' caches on disk in the data directory (by default they
    /// are kept, and a request sharing a stored prefix prefills only the rest, also after a
    /// restart or an idle unload).
    #[arg(long)]
    pub no_prompt_cache: bool,
    /// Most bytes the prompt cache may take on disk (least recently used entries go first).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 30)]
    pub prompt_cache_bytes: u64,
    /// Shortest prompt prefix, in tokens, worth keeping on disk.
    #[arg(long, value_name = "TOKENS", default_value_t = 256)]
    pub prompt_cache_min_tokens: usize,
    /// Seconds a shutdown waits for the batch lines in flight before leaving them for the next
    /// start (they run again then; none is lost or done twice).
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub shutdown_grace: u64,
}

/// Every `--model` of `anelm serve`, in order (clap's derive keeps only the first in
/// [`ModelArgs`]; this reads them all from the same argument).
#[derive(Clone, Debug, Default)]
pub struct ModelList(pub Vec<PathBuf>);

impl clap::FromArgMatches for ModelList {
    fn from_arg_matches(m: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        let all = m
            .try_get_many::<PathBuf>("model")
            .ok()
            .flatten()
            .map(|v| v.cloned().collect())
            .unwrap_or_default();
        Ok(Self(all))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> std::result::Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for ModelList {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd
    }
}

pub(crate) fn name_of(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "anelm".into())
}

/// The `--upstream`, `--upstream-key`, `--private-by-default` and `--fallback` settings.
pub(crate) fn upstreams(a: &ServeArgs) -> Result<Upstreams> {
    let mut keys = std::collections::HashMap::new();
    for k in &a.upstream_key {
        let (name, var) = k
            .split_once('=')
            .with_context(|| format!("--upstream-key {k}: expected NAME=ENV_VAR"))?;
        let key =
            std::env::var(var).with_context(|| format!("--upstream-key {k}: environment variable {var} is not set"))?;
        keys.insert(name.to_string(), key);
    }
    let mut list: Vec<Arc<Upstream>> = Vec::new();
    for u in &a.upstream {
        let (name, url) = u
            .split_once('=')
            .with_context(|| format!("--upstream {u}: expected NAME=URL"))?;
        if list.iter().any(|x| x.name == name) {
            anyhow::bail!("--upstream {name} is given twice");
        }
        list.push(Arc::new(Upstream::new(name, url, keys.remove(name))?));
    }
    if let Some(name) = keys.keys().next() {
        anyhow::bail!("--upstream-key names '{name}', which is not an --upstream");
    }
    if let Some(f) = &a.fallback
        && !list.iter().any(|u| &u.name == f)
    {
        anyhow::bail!("--fallback names '{f}', which is not an --upstream");
    }
    Ok(Upstreams {
        list,
        private_by_default: a.private_by_default,
        fallback: a.fallback.clone(),
        ..Upstreams::default()
    })
}

/// Open the data directory and its job database: the one given (its failure ends the
/// command), else the default (where a failure — another server holds it, no home — only
/// turns the Files and Batch APIs off, with a warning).
fn open_jobs(a: &ServeArgs, concurrency: usize) -> Result<Option<(DataDir, Arc<Jobs>)>> {
    let Some(dir) = open_data_dir(a, "files and batches are off")? else {
        return Ok(None);
    };
    let store = JobStore::open(&dir.jobs_db())
        .with_context(|| format!("could not open the job database in {}", dir.path().display()))?;
    // Readable by the user alone (the directory is 0700 too).
    anelm_server::data_dir::restrict(&dir.jobs_db(), 0o600)
        .with_context(|| format!("could not restrict {}", dir.jobs_db().display()))?;
    Ok(Some((dir, Jobs::new(store, a.max_file_bytes, concurrency))))
}

/// Open the data directory: the one given (its failure ends the command), else the default
/// (where a failure only turns off what `off` says, with a warning); `None` with
/// `--no-data-dir`.
pub(crate) fn open_data_dir(a: &ServeArgs, off: &str) -> Result<Option<DataDir>> {
    if a.no_data_dir {
        return Ok(None);
    }
    let (path, explicit) = match &a.data_dir {
        Some(p) => (p.clone(), true),
        None => match default_data_dir() {
            Some(p) => (p, false),
            None => {
                eprintln!("anelm serve: warning: {} ({off})", DataDirError::NoDefault);
                return Ok(None);
            }
        },
    };
    let dir = match DataDir::open(&path) {
        Ok(d) => d,
        Err(e) if !explicit => {
            eprintln!("anelm serve: warning: {e} ({off})");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Some(dir))
}

/// Run `anelm serve` until SIGINT/SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    if a.sessions == 0 {
        anyhow::bail!("--sessions must be at least 1");
    }
    if a.models_dir.is_some() || a.models.0.len() > 1 {
        return crate::serve_models::run(a);
    }
    if a.max_loaded_bytes.is_some() {
        anyhow::bail!("--max-loaded-bytes needs several models: give --models-dir DIR or --model more than once");
    }

    let path = model_path(&a.model)?;
    let model_id = a.model_id.clone().unwrap_or_else(|| name_of(&path));
    // What /v1/rerank serves: the --rerank-model, or --model itself when it is a cross-encoder.
    let rerank_only = CrossEncoder::is_cross_encoder_dir(&path);
    if rerank_only && a.rerank_model.is_some() {
        anyhow::bail!("--model is already a cross-encoder; give --rerank-model only beside a chat model");
    }
    let rerank = match (&a.rerank_model, rerank_only) {
        (Some(dir), _) => Some((dir.clone(), name_of(dir))),
        (None, true) => Some((path.clone(), model_id.clone())),
        (None, false) => None,
    };
    // What /v1/embeddings serves: the --embedding-model, or --model itself when it is one.
    let embedding_only = !rerank_only && Embedder::is_embedding_model(&path);
    if embedding_only && a.embedding_model.is_some() {
        anyhow::bail!("--model is already an embedding model; give --embedding-model only beside a chat model");
    }
    let embedding = match (&a.embedding_model, embedding_only) {
        (Some(dir), _) => Some((dir.clone(), name_of(dir))),
        (None, true) => Some((path.clone(), model_id.clone())),
        (None, false) => None,
    };
    let state = AppState::with_upstreams(
        ServerConfig {
            model_id,
            api_key: a.api_key.clone(),
            max_body_bytes: a.max_body_bytes,
        },
        upstreams(&a)?,
    );
    let sched_cfg = scheduler_config(&a);
    let (speculate, draft_path) = a.speculate.server_default()?;
    let sched_cfg = SchedulerConfig { speculate, ..sched_cfg };
    let draft = draft_path.map(|p| (p, a.speculate.draft_tokens));
    // Batch lines in flight: enough to keep every session busy while finished lines are
    // recorded (the extra ones wait in the scheduler's queue at background priority).
    let data = open_jobs(&a, a.sessions * 2)?;
    if let Some((dir, _)) = &data {
        eprintln!("anelm serve: data directory {}", dir.path().display());
    }
    let prompt_cache = prompt_cache_setup(&a, data.as_ref().map(|(d, _)| d));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    rt.block_on(async move {
        let listener = listen(&a).await?;
        eprintln!(
            "anelm serve: listening on http://{} (loading the model; /health is 503 until ready)",
            listener.local_addr()?
        );
        if let Some(secs) = a.idle_unload {
            let (args, cfg, cache, draft) = (a.model.clone(), sched_cfg.clone(), prompt_cache.clone(), draft.clone());
            let loader: anelm_server::idle::Loader = Arc::new(move || {
                load(&args)
                    .and_then(|lm| {
                        let cfg = with_draft(&lm, &args, cfg.clone(), draft.as_ref())?;
                        let cfg = with_prompt_cache(&lm, &args, cfg, &cache);
                        Ok((Arc::new(lm), cfg))
                    })
                    .map_err(|e| format!("{e:#}"))
            });
            state.enable_idle_unload(std::time::Duration::from_secs(secs.max(1)), loader);
        }
        if let Some((_, jobs)) = &data {
            let _ = state.jobs.set(jobs.clone());
            state.responses.use_db(jobs.store.clone());
            jobs.start(state.clone(), std::time::Duration::from_secs(a.shutdown_grace));
        }
        let loader_state = state.clone();
        let model_args = a.model.clone();
        let prompt_args = a.embedding_prompt.clone();
        let rerank_args = a.rerank_prompt.clone();
        std::thread::spawn(move || {
            if let Some((dir, id)) = rerank {
                let mut args = model_args.clone();
                args.model = Some(dir);
                match load_reranker(&args, &rerank_args) {
                    Ok(model) => {
                        eprintln!("anelm serve: reranker ready ({})", model.kind());
                        let _ = loader_state.rerank.set(Rerank {
                            model: Arc::new(model),
                            id,
                            only: rerank_only,
                        });
                    }
                    Err(e) => {
                        let msg = format!("{e:#}").replace('\n', " ");
                        eprintln!("error: {msg}");
                        let _ = loader_state.load_error.set(msg);
                        return;
                    }
                }
                if rerank_only {
                    return;
                }
            }
            if let Some((dir, id)) = embedding {
                let mut emb_args = model_args.clone();
                emb_args.model = Some(dir);
                match load_embedder(&emb_args, &prompt_args) {
                    Ok(model) => {
                        let _ = loader_state.embeddings.set(Embeddings {
                            model: Arc::new(model),
                            id,
                            only: embedding_only,
                        });
                        eprintln!("anelm serve: embeddings ready");
                    }
                    Err(e) => {
                        let msg = format!("{e:#}").replace('\n', " ");
                        eprintln!("error: {msg}");
                        let _ = loader_state.load_error.set(msg);
                        return;
                    }
                }
                if embedding_only {
                    return;
                }
            }
            load_chat(&model_args, &loader_state, sched_cfg, &prompt_cache, draft.as_ref())
        });
        // On SIGINT/SIGTERM: first the batch runner (its lines in flight finish or stay
        // pending for the next start), then the HTTP server.
        let stopping = state.clone();
        let shutdown = async move {
            shutdown_signal().await;
            eprintln!("anelm serve: shutting down");
            if let Some(jobs) = stopping.jobs.get() {
                jobs.stop().await;
            }
        };
        axum::serve(listener, router(state.clone()))
            .with_graceful_shutdown(shutdown)
            .await
            .context("the server failed")?;
        drop(data);
        if let Some(r) = state.ready.get() {
            r.scheduler.shutdown(true);
        }
        Ok(())
    })
}

/// The scheduler settings of every chat model of `anelm serve` (no prompt cache, speculation
/// or draft model yet).
pub(crate) fn scheduler_config(a: &ServeArgs) -> SchedulerConfig {
    let threads = a
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    SchedulerConfig {
        sessions: a.sessions,
        queue: a.queue,
        ctx_size: a.model.ctx_size,
        prefill_chunk: a.prefill_chunk.max(1),
        max_step_tokens: (a.prefill_chunk.max(1) + a.sessions).max(64),
        threads,
        share_prefixes: !a.no_prefix_sharing,
        cache_mem: a.cache_mem.map(|mib| mib.saturating_mul(1 << 20)),
        prompt_cache: None,
        speculate: None,
        draft_model: None,
    }
}

/// The on-disk prompt cache in the data directory `dir`, unless `--no-prompt-cache`.
pub(crate) fn prompt_cache_setup(a: &ServeArgs, dir: Option<&DataDir>) -> PromptCacheSetup {
    match dir {
        Some(dir) if !a.no_prompt_cache => Some(Arc::new((
            dir.prompt_cache(),
            PromptCacheOptions {
                max_bytes: a.prompt_cache_bytes,
                min_tokens: a.prompt_cache_min_tokens.max(1),
                ..PromptCacheOptions::default()
            },
        ))),
        _ => None,
    }
}

/// Bind `--host`:`--port`.
pub(crate) async fn listen(a: &ServeArgs) -> Result<tokio::net::TcpListener> {
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("'{}:{}' is not a valid address", a.host, a.port))?;
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("could not listen on {addr} (is another server using the port?)"))
}

/// Where the prompt cache lives and how it is sized (`None`: no prompt cache).
pub(crate) type PromptCacheSetup = Option<Arc<(PathBuf, PromptCacheOptions)>>;

/// `cfg` with the on-disk prompt cache for `lm` opened in it. Its entries are keyed by the
/// model files and everything that changes the numbers (device, quantisation, context, chip);
/// a cache that cannot be opened is a warning, not a failure.
pub(crate) fn with_prompt_cache(
    lm: &LoadedModel,
    args: &ModelArgs,
    mut cfg: SchedulerConfig,
    setup: &PromptCacheSetup,
) -> SchedulerConfig {
    let Some(setup) = setup else {
        return cfg;
    };
    let (dir, opts) = setup.as_ref();
    let opened = ModelIdentity::of(lm).map_err(|e| e.to_string()).and_then(|id| {
        let id = id
            .with("device", format!("{:?}", args.device))
            .with("quantize", format!("{:?}", args.quantize))
            .with("ctx", args.ctx_size)
            .with("chip", &args.ane.chip)
            .with("ane_weights", format!("{:?}", args.ane.ane_weights))
            .with("chat_template", format!("{:?}", args.chat_template));
        PromptCache::open(dir.clone(), id.as_str(), opts.clone()).map_err(|e| e.to_string())
    });
    match opened {
        Ok(cache) => cfg.prompt_cache = Some(Arc::new(cache)),
        Err(e) => eprintln!("anelm serve: warning: the prompt cache is off: {e}"),
    }
    cfg
}

/// A draft model to load beside the chat model: its path and the most tokens it drafts per pass.
type DraftSetup = (PathBuf, usize);

/// `cfg` with the draft model (`--speculate PATH`) loaded beside `lm` on the same device.
fn with_draft(
    lm: &LoadedModel,
    args: &ModelArgs,
    mut cfg: SchedulerConfig,
    draft: Option<&DraftSetup>,
) -> Result<SchedulerConfig> {
    if let Some((path, draft_tokens)) = draft {
        let model = crate::speculate::load_draft(path, args, lm)?;
        eprintln!("anelm serve: draft model {} ready", path.display());
        cfg.draft_model = Some(anelm_engine::DraftConfig {
            model: Arc::from(model.model),
            draft_tokens: *draft_tokens,
        });
    }
    Ok(cfg)
}

/// Load the chat model (and its draft model) and start its scheduler; a failure is reported by
/// /health.
fn load_chat(
    model_args: &ModelArgs,
    state: &AppState,
    sched_cfg: SchedulerConfig,
    cache: &PromptCacheSetup,
    draft: Option<&DraftSetup>,
) {
    match load(model_args).and_then(|lm| with_draft(&lm, model_args, sched_cfg, draft).map(|cfg| (lm, cfg))) {
        Ok((lm, sched_cfg)) => {
            let cfg = with_prompt_cache(&lm, model_args, sched_cfg, cache);
            match state.set_ready(Arc::new(lm), cfg) {
                Ok(_) => eprintln!("anelm serve: ready"),
                Err(e) => {
                    eprintln!("error: could not start the scheduler: {e}");
                    let _ = state.load_error.set(e.to_string());
                }
            }
        }
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            let _ = state.load_error.set(msg);
        }
    }
}
