//! `anelm compile`: build every ANE kernel of a model ahead of time (with a progress bar), so
//! later runs load them through the compile cache; reports counts and time.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;

use crate::args::{DeviceArg, ModelArgs};
use crate::runtime::{load_weights_reporting, model_path};

/// Arguments of `anelm compile`.
#[derive(Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Run `anelm compile`.
pub fn run(a: CompileArgs) -> Result<()> {
    let mut args = a.model;
    args.device = match args.device {
        // Only ANE devices compile kernels; without a Neural Engine that is the emulator.
        DeviceArg::Auto if anelm_ane::AppleAne::open_with(&crate::runtime::apple_config(&args.ane)).is_ok() => {
            DeviceArg::Ane
        }
        DeviceArg::Auto | DeviceArg::AneEmu => DeviceArg::AneEmu,
        DeviceArg::Ane => DeviceArg::Ane,
        DeviceArg::Cpu => bail!("`anelm compile` builds ANE kernels: use --device ane-emu (or leave --device out)"),
    };
    let path = model_path(&args)?;
    let start = Instant::now();
    let (_model, device) = load_weights_reporting(&args)?;
    let elapsed = start.elapsed();
    let Some(s) = device.stats() else {
        bail!("the {} backend compiles no ANE kernels", device.name);
    };
    let cache = if args.ane.no_ane_cache {
        "cache off (--no-ane-cache)".to_string()
    } else {
        match anelm_ane::CompileCache::user_default() {
            Some(c) => format!("{} markers in {}", c.marker_count(), c.dir().display()),
            None => "no user cache directory (set ANELM_CACHE_DIR)".to_string(),
        }
    };
    println!(
        "{}: {} ANE programs on {} ({} weights): {} compiled, {} loaded from the cache; {:.2} s in total \
         ({:.2} s lowering + compiling + loading); {} fallback(s); {cache}",
        path.display(),
        s.programs,
        device.name,
        args.ane.ane_weights.mode(),
        s.compiled,
        s.cache_loads,
        elapsed.as_secs_f64(),
        s.compile_time.as_secs_f64(),
        s.fallbacks
    );
    Ok(())
}
