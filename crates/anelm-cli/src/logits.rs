//! `anelm logits` and `anelm tokenize`: machine-readable outputs for checking numerics.

use std::io::Write;

use anyhow::{Context, Result, bail};
use clap::Args;

use anelm_engine::{LogitsMode, StepItem};

use crate::args::ModelArgs;
use crate::runtime::{load, load_weights_reporting};

/// Arguments of `anelm logits`.
#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids, e.g. 1,2,3.
    #[arg(long, required = true)]
    pub token_ids: String,
    /// Print every position's logits, not only the last.
    #[arg(long)]
    pub all_positions: bool,
}

/// Arguments of `anelm tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Text to tokenize, as `generate --raw` would feed it.
    pub text: String,
    #[command(flatten)]
    pub model: ModelArgs,
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("'{t}' is not a token id (expected e.g. --token-ids 1,2,3)"))
        })
        .collect::<Result<Vec<_>>>()?;
    if ids.is_empty() {
        bail!("--token-ids is empty: give at least one id, e.g. --token-ids 1,2,3");
    }
    Ok(ids)
}

/// Run `anelm logits`.
pub fn run_logits(a: LogitsArgs) -> Result<()> {
    let ids = parse_ids(&a.token_ids)?;
    // Token ids in, logits out: no tokenizer needed (test fixtures ship without one).
    let (model, device) = load_weights_reporting(&a.model)?;
    device.reset();
    let mut session = model.new_session(a.model.ctx_size.max(ids.len()));
    let mut items = [StepItem {
        session: &mut session,
        tokens: &ids,
        logits: if a.all_positions {
            LogitsMode::All
        } else {
            LogitsMode::Last
        },
    }];
    let logits = model.forward(&mut items)?;
    let rows: Vec<&[f32]> = (0..logits.lanes()).map(|i| logits.lane(i)).collect();
    let out = serde_json::json!({ "logits": rows });
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    serde_json::to_writer(&mut lock, &out)?;
    writeln!(lock)?;
    device.print_line("prefill", ids.len());
    Ok(())
}

/// Run `anelm tokenize`.
pub fn run_tokenize(a: TokenizeArgs) -> Result<()> {
    let lm = load(&a.model)?;
    let ids = lm.tokenizer.encode(&a.text)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
