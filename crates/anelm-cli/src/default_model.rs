//! Resolving the default model, with the error that says how to get it.

use std::path::PathBuf;

use anyhow::{Result, bail};

use anelm_engine::default_model::{FETCH_COMMAND, default_model_location};

/// Path of the default model, if it is installed.
pub fn default_model_path() -> Result<PathBuf> {
    let Some(path) = default_model_location() else {
        bail!("no --model given and no home directory to find the default model in; pass --model PATH");
    };
    if !path.is_file() {
        bail!(
            "no --model given and the default model is not installed at {}: run {FETCH_COMMAND} (or pass --model PATH)",
            path.display()
        );
    }
    Ok(path)
}
