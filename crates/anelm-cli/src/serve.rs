//! `anelm serve`: the OpenAI-compatible server. It listens at once (`/health` answers 503 while
//! the model loads), then serves every request through one continuous-batching scheduler.
//! `--embedding-model DIR` adds `/v1/embeddings` beside the chat model; a `--model` that is an
//! embedding model (a sentence-transformers directory) serves embeddings only.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use anelm_engine::{Embedder, SchedulerConfig};
use anelm_server::embeddings::Embeddings;
use anelm_server::upstream::{Upstream, Upstreams};
use anelm_server::{AppState, ServerConfig, router, shutdown_signal};

use crate::args::{EmbeddingPromptArgs, ModelArgs};
use crate::runtime::{load, load_embedder, model_path};

/// Arguments of `anelm serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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
    #[arg(long, default_value_t = 128)]
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
}

fn name_of(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "anelm".into())
}

/// The `--upstream`, `--upstream-key`, `--private-by-default` and `--fallback` settings.
fn upstreams(a: &ServeArgs) -> Result<Upstreams> {
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

/// Run `anelm serve` until SIGINT/SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    if a.sessions == 0 {
        anyhow::bail!("--sessions must be at least 1");
    }

    let path = model_path(&a.model)?;
    let model_id = a.model_id.clone().unwrap_or_else(|| name_of(&path));
    // What /v1/embeddings serves: the --embedding-model, or --model itself when it is one.
    let embedding_only = Embedder::is_embedding_model(&path);
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
    let threads = a
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let sched_cfg = SchedulerConfig {
        sessions: a.sessions,
        queue: a.queue,
        ctx_size: a.model.ctx_size,
        prefill_chunk: a.prefill_chunk.max(1),
        max_step_tokens: (a.prefill_chunk.max(1) + a.sessions).max(64),
        threads,
        share_prefixes: !a.no_prefix_sharing,
        cache_mem: a.cache_mem.map(|mib| mib.saturating_mul(1 << 20)),
        prompt_cache: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    rt.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", a.host, a.port)
            .parse()
            .with_context(|| format!("'{}:{}' is not a valid address", a.host, a.port))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("could not listen on {addr} (is another server using the port?)"))?;
        eprintln!("anelm serve: listening on http://{addr} (loading the model; /health is 503 until ready)");
        if let Some(secs) = a.idle_unload {
            let (args, cfg) = (a.model.clone(), sched_cfg.clone());
            let loader: anelm_server::idle::Loader = Arc::new(move || {
                load(&args)
                    .map(|lm| (Arc::new(lm), cfg.clone()))
                    .map_err(|e| format!("{e:#}"))
            });
            state.enable_idle_unload(std::time::Duration::from_secs(secs.max(1)), loader);
        }
        let loader_state = state.clone();
        let model_args = a.model.clone();
        let prompt_args = a.embedding_prompt.clone();
        std::thread::spawn(move || {
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
            load_chat(&model_args, &loader_state, sched_cfg)
        });
        axum::serve(listener, router(state.clone()))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("the server failed")?;
        eprintln!("anelm serve: shutting down");
        if let Some(r) = state.ready.get() {
            r.scheduler.shutdown(true);
        }
        Ok(())
    })
}

/// Load the chat model and start its scheduler; a failure is reported by /health.
fn load_chat(model_args: &ModelArgs, state: &AppState, sched_cfg: SchedulerConfig) {
    match load(model_args) {
        Ok(lm) => match state.set_ready(Arc::new(lm), sched_cfg) {
            Ok(_) => eprintln!("anelm serve: ready"),
            Err(e) => {
                eprintln!("error: could not start the scheduler: {e}");
                let _ = state.load_error.set(e.to_string());
            }
        },
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            let _ = state.load_error.set(msg);
        }
    }
}
