//! `anelm cache`: look at or empty the prompt cache a server keeps in its data directory.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use anelm_engine::PromptCache;
use anelm_server::data_dir::{default_data_dir, prompt_cache_dir};

/// Arguments of `anelm cache`.
#[derive(Args, Debug)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
    /// The data directory (default: the one `anelm serve` uses by default).
    #[arg(long, global = true, value_name = "DIR", env = "ANELM_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Delete every prompt-cache entry (a running server notices at its next lookup).
    Clear,
    /// Print the prompt cache's size on disk.
    Size,
}

/// Run `anelm cache`.
pub fn run(a: CacheArgs) -> Result<()> {
    let dir = prompt_cache_dir(&match a.data_dir {
        Some(d) => d,
        None => default_data_dir().context("no default data directory: pass --data-dir DIR")?,
    });
    match a.command {
        CacheCommand::Clear => {
            if !dir.exists() {
                eprintln!("no prompt cache at {}", dir.display());
                return Ok(());
            }
            let n = PromptCache::clear_dir(&dir).with_context(|| format!("could not clear {}", dir.display()))?;
            eprintln!("removed {n} prompt-cache entries from {}", dir.display());
        }
        CacheCommand::Size => {
            let (mut files, mut bytes) = (0u64, 0u64);
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    if let Ok(m) = e.metadata()
                        && m.is_file()
                    {
                        files += 1;
                        bytes += m.len();
                    }
                }
            }
            println!("{bytes} bytes in {files} files at {}", dir.display());
        }
    }
    Ok(())
}
