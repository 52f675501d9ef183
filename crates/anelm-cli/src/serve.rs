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
use anelm_server::{AppState, ServerConfig, router, shutdown_signal};

use crate::args::ModelArgs;
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
    /// Also serve /v1/embeddings with this embedding model (a sentence-transformers directory,
    /// e.g. the one scripts/fetch-minilm.sh installs).
    #[arg(long, value_name = "DIR")]
    pub embedding_model: Option<PathBuf>,
}

fn name_of(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "anelm".into())
}

/// Run `anelm serve` until SIGINT/SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    if a.sessions == 0 {
        anyhow::bail!("--sessions must be at least 1");
    }
    let path = model_path(&a.model)?;
    let model_id = a.model_id.clone().unwrap_or_else(|| name_of(&path));
    // What /v1/embeddings serves: the --embedding-model, or --model itself when it is one.
    let embedding_only = Embedder::is_embedding_dir(&path);
    if embedding_only && a.embedding_model.is_some() {
        anyhow::bail!("--model is already an embedding model; give --embedding-model only beside a chat model");
    }
    let embedding = match (&a.embedding_model, embedding_only) {
        (Some(dir), _) => Some((dir.clone(), name_of(dir))),
        (None, true) => Some((path.clone(), model_id.clone())),
        (None, false) => None,
    };
    let state = AppState::new(ServerConfig {
        model_id,
        api_key: a.api_key.clone(),
        max_body_bytes: a.max_body_bytes,
    });
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
        let loader_state = state.clone();
        let model_args = a.model.clone();
        std::thread::spawn(move || {
            if let Some((dir, id)) = embedding {
                let mut emb_args = model_args.clone();
                emb_args.model = Some(dir);
                match load_embedder(&emb_args) {
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
