//! Where the embedded default model lives (SmolLM2-135M-Instruct, GGUF Q4_1), so the CLI,
//! the server and the tests agree with `scripts/fetch-default-model.sh`.

use std::path::PathBuf;

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The command that installs the default model.
pub const FETCH_COMMAND: &str = "scripts/fetch-default-model.sh";

/// anelm's user cache directory: `$XDG_CACHE_HOME/anelm`, else `~/.cache/anelm`
/// (`~/Library/Caches/anelm` on macOS).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("anelm"));
    }
    let home = PathBuf::from(std::env::var_os("HOME")?);
    if cfg!(target_os = "macos") {
        Some(home.join("Library/Caches/anelm"))
    } else {
        Some(home.join(".cache/anelm"))
    }
}

/// Where the default model is (or would be) installed.
pub fn default_model_location() -> Option<PathBuf> {
    Some(cache_dir()?.join("models").join(DEFAULT_MODEL_FILE))
}

/// Directory name of the default embedding model (all-MiniLM-L6-v2, a sentence-transformers
/// directory) under the cache's `models/`.
pub const DEFAULT_EMBEDDING_MODEL_DIR: &str = "all-MiniLM-L6-v2";

/// The command that installs the default embedding model.
pub const FETCH_EMBEDDING_COMMAND: &str = "scripts/fetch-minilm.sh";

/// Where the default embedding model is (or would be) installed.
pub fn default_embedding_model_location() -> Option<PathBuf> {
    Some(cache_dir()?.join("models").join(DEFAULT_EMBEDDING_MODEL_DIR))
}
