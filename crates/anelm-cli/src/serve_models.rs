//! `anelm serve --models-dir DIR` (or `--model` given more than once): many models in one
//! server. Every GGUF file and model directory in DIR, and every `--model` (the first one is
//! the default), becomes a named model of an [`anelm_server::model_registry::ModelRegistry`]:
//! listed by `/v1/models`, loaded on its first request, unloaded after `--idle-unload` or to
//! make room under `--max-loaded-bytes`. Chat, embedding and rerank models are told apart as
//! for a single `--model`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use anelm_engine::{CrossEncoder, Embedder};
use anelm_server::embeddings::Embeddings;
use anelm_server::model_registry::{ModelKind, ModelLoader, ModelRegistry, ModelSpec, RegistryConfig};
use anelm_server::rerank::Rerank;
use anelm_server::{AppState, model_router, shutdown_signal};

use crate::args::ModelArgs;
use crate::runtime::{load, load_embedder, load_reranker};
use crate::serve::{
    PromptCacheSetup, ServeArgs, listen, name_of, open_data_dir, prompt_cache_setup, scheduler_config,
    with_prompt_cache,
};

/// A model to serve: its path, id, and its kind when a flag decided it.
struct Found {
    path: PathBuf,
    id: String,
    kind: Option<ModelKind>,
}

/// The id of a model at `path`: a file's stem (`SmolLM2-135M-Instruct.Q4_1` for its GGUF), a
/// directory's name (dots and all).
fn id_of(path: &Path) -> String {
    if path.is_dir() {
        path.file_name()
            .map_or_else(|| name_of(path), |n| n.to_string_lossy().into_owned())
    } else {
        name_of(path)
    }
}

/// The models in `dir`: each `.gguf` file and each directory with a `config.json` or
/// `modules.json`, in name order (hidden entries and other files are skipped). Symbolic links
/// are followed; one that leads nowhere is an error.
fn scan_models_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("could not read --models-dir {}", dir.display()))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("could not read --models-dir {}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let meta = std::fs::metadata(&path).with_context(|| format!("could not read {}", path.display()))?;
        if meta.is_dir() {
            if path.join("config.json").is_file() || path.join("modules.json").is_file() {
                found.push(path);
            } else {
                eprintln!(
                    "anelm serve: skipping {}: a model directory has a config.json",
                    path.display()
                );
            }
        } else if path
            .extension()
            .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case("gguf"))
        {
            found.push(path);
        }
    }
    if found.is_empty() {
        anyhow::bail!(
            "--models-dir {} has no models: put GGUF files or model directories (with a config.json) in it",
            dir.display()
        );
    }
    found.sort();
    Ok(found)
}

/// The bytes of the files at `path` (a directory's, to a depth of 4).
fn bytes_of(path: &Path, depth: usize) -> u64 {
    let Ok(meta) = std::fs::metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.len();
    }
    if depth == 0 {
        return 0;
    }
    std::fs::read_dir(path).map_or(0, |rd| {
        rd.flatten()
            .fold(0u64, |a, e| a.saturating_add(bytes_of(&e.path(), depth - 1)))
    })
}

/// What a model at `path` serves: a cross-encoder reranks, an embedding model embeds, the rest
/// chat.
fn kind_of(path: &Path) -> ModelKind {
    if CrossEncoder::is_cross_encoder_dir(path) {
        ModelKind::Rerank
    } else if Embedder::is_embedding_model(path) {
        ModelKind::Embedding
    } else {
        ModelKind::Chat
    }
}

/// Every model the flags name: each `--model`, the `--embedding-model` and `--rerank-model`,
/// then the `--models-dir` (the first is the default).
fn models_of(a: &ServeArgs) -> Result<Vec<Found>> {
    let mut all = Vec::new();
    let mut add = |path: &PathBuf, flag: &str, kind: Option<ModelKind>| -> Result<()> {
        std::fs::metadata(path).with_context(|| format!("{flag} {}: cannot read it", path.display()))?;
        all.push(Found {
            path: path.clone(),
            id: id_of(path),
            kind,
        });
        Ok(())
    };
    for p in &a.models.0 {
        add(p, "--model", None)?;
    }
    if let Some(p) = &a.embedding_model {
        add(p, "--embedding-model", Some(ModelKind::Embedding))?;
    }
    if let Some(p) = &a.rerank_model {
        add(p, "--rerank-model", Some(ModelKind::Rerank))?;
    }
    if let Some(dir) = &a.models_dir {
        for p in scan_models_dir(dir)? {
            add(&p, "--models-dir", None)?;
        }
    }
    Ok(all)
}

/// Refuse the flags that belong to a one-model server.
fn refuse_single_model_flags(a: &ServeArgs) -> Result<()> {
    let why = "with several models (--models-dir, or --model more than once)";
    if a.model_id.is_some() {
        anyhow::bail!("--model-id names the one model of a server; {why} each is named by its file or directory");
    }
    if !a.upstream.is_empty() || a.fallback.is_some() || !a.upstream_key.is_empty() {
        anyhow::bail!("--upstream and --fallback are not supported {why} yet");
    }
    if a.speculate.server_default()?.1.is_some() {
        anyhow::bail!("a draft model (--speculate PATH) is not supported {why}: it belongs to one chat model");
    }
    Ok(())
}

/// How to load `found` into a model's state.
fn loader_for(a: &ServeArgs, found: &Found, kind: ModelKind, cache: &PromptCacheSetup) -> Result<ModelLoader> {
    let mut args: ModelArgs = a.model.clone();
    args.model = Some(found.path.clone());
    let id = found.id.clone();
    Ok(match kind {
        ModelKind::Chat => {
            let (speculate, _) = a.speculate.server_default()?;
            let cfg = anelm_engine::SchedulerConfig {
                speculate,
                ..scheduler_config(a)
            };
            let cache = cache.clone();
            Arc::new(move |st: &Arc<AppState>| {
                let lm = load(&args).map_err(|e| format!("{e:#}"))?;
                let cfg = with_prompt_cache(&lm, &args, cfg.clone(), &cache);
                st.set_ready(Arc::new(lm), cfg)
                    .map(|_| ())
                    .map_err(|e| format!("could not start the scheduler: {e}"))
            })
        }
        ModelKind::Embedding => {
            let prompt = a.embedding_prompt.clone();
            Arc::new(move |st: &Arc<AppState>| {
                let model = load_embedder(&args, &prompt).map_err(|e| format!("{e:#}"))?;
                let _ = st.embeddings.set(Embeddings {
                    model: Arc::new(model),
                    id: id.clone(),
                    only: true,
                });
                Ok(())
            })
        }
        ModelKind::Rerank => {
            let prompt = a.rerank_prompt.clone();
            Arc::new(move |st: &Arc<AppState>| {
                let model = load_reranker(&args, &prompt).map_err(|e| format!("{e:#}"))?;
                let _ = st.rerank.set(Rerank {
                    model: Arc::new(model),
                    id: id.clone(),
                    only: true,
                });
                Ok(())
            })
        }
    })
}

/// Run the multi-model server until SIGINT/SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    refuse_single_model_flags(&a)?;
    let found = models_of(&a)?;
    // The data directory keeps the chat models' prompt caches (the Files and Batch APIs belong
    // to a one-model server).
    let data = open_data_dir(&a, "the prompt cache is off")?;
    if let Some(dir) = &data {
        eprintln!(
            "anelm serve: data directory {} (prompt cache only: /v1/files and /v1/batches need a one-model server)",
            dir.path().display()
        );
    }
    let cache = prompt_cache_setup(&a, data.as_ref());
    let mut specs = Vec::with_capacity(found.len());
    for f in &found {
        let kind = f.kind.unwrap_or_else(|| kind_of(&f.path));
        specs.push(ModelSpec {
            id: f.id.clone(),
            path: f.path.clone(),
            kind,
            bytes: bytes_of(&f.path, 4),
            load: loader_for(&a, f, kind, &cache)?,
        });
    }
    let config = RegistryConfig {
        api_key: a.api_key.clone(),
        max_body_bytes: a.max_body_bytes,
        max_loaded_bytes: a.max_loaded_bytes,
        idle_unload: a.idle_unload.map(|s| Duration::from_secs(s.max(1))),
    };
    let registry = ModelRegistry::new(config, specs)?;
    if let Some(budget) = a.max_loaded_bytes
        && let Some(big) = (0..registry.len()).find(|&i| registry.spec(i).is_some_and(|s| s.bytes > budget))
    {
        eprintln!(
            "anelm serve: warning: '{}' is larger than --max-loaded-bytes {budget}: it cannot be loaded",
            registry.id(big)
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    rt.block_on(async move {
        let listener = listen(&a).await?;
        eprintln!(
            "anelm serve: listening on http://{} with {} models, each loaded on its first request: {}",
            listener.local_addr()?,
            registry.len(),
            registry.ids().join(", ")
        );
        let app = model_router::router(registry.clone());
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                shutdown_signal().await;
                eprintln!("anelm serve: shutting down");
            })
            .await
            .context("the server failed")?;
        for i in 0..registry.len() {
            let _ = registry.unload(i).await;
        }
        drop(data);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("anelm-serve-models-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("temp dir");
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_models_dir_lists_gguf_files_and_model_directories() {
        let dir = TempDir::new("scan");
        std::fs::write(dir.0.join("b.Q4_0.gguf"), b"x").expect("write");
        std::fs::write(dir.0.join("README.md"), b"x").expect("write");
        std::fs::write(dir.0.join(".hidden.gguf"), b"x").expect("write");
        std::fs::create_dir_all(dir.0.join("Qwen2.5-0.5B")).expect("mkdir");
        std::fs::write(dir.0.join("Qwen2.5-0.5B/config.json"), b"{}").expect("write");
        std::fs::write(dir.0.join("Qwen2.5-0.5B/model.safetensors"), b"0123456789").expect("write");
        std::fs::create_dir_all(dir.0.join("notes")).expect("mkdir");
        let found = scan_models_dir(&dir.0).expect("scan");
        let ids: Vec<String> = found.iter().map(|p| id_of(p)).collect();
        assert_eq!(ids, ["Qwen2.5-0.5B", "b.Q4_0"]);
        assert_eq!(bytes_of(&found[0], 4), 12);
    }

    #[test]
    fn an_empty_or_missing_models_dir_is_an_error() {
        let dir = TempDir::new("empty");
        let msg = format!("{:#}", scan_models_dir(&dir.0).expect_err("empty"));
        assert!(msg.contains("has no models"), "{msg}");
        let msg = format!("{:#}", scan_models_dir(&dir.0.join("nope")).expect_err("missing"));
        assert!(msg.contains("could not read --models-dir"), "{msg}");
    }
}
