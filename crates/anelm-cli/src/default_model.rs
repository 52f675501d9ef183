//! Where the embedded default model lives, and the error that says how to get it.

use std::path::PathBuf;

use anyhow::{Result, bail};

/// File name of the default model (SmolLM2-135M-Instruct, GGUF Q4_1).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The user cache directory for anelm: `$XDG_CACHE_HOME/anelm`, else `~/.cache/anelm`
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

/// Path of the default model, if it is installed.
pub fn default_model_path() -> Result<PathBuf> {
    let Some(dir) = cache_dir() else {
        bail!("no --model given and no home directory to find the default model in; pass --model PATH");
    };
    let path = dir.join("models").join(DEFAULT_MODEL_FILE);
    if !path.is_file() {
        bail!(
            "no --model given and the default model is not installed at {}: run scripts/fetch-default-model.sh (or pass --model PATH)",
            path.display()
        );
    }
    Ok(path)
}
