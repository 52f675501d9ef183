//! `anelm generate`: one prompt, streamed output, speeds on stderr.

use std::io::{Read, Write};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{Map, Value};

use anelm_engine::GenerateOptions;
use anelm_model::chat_template::ChatMessage;

use crate::args::{ModelArgs, SamplingArgs, SpeculateArgs};
use crate::runtime::load_reporting;

/// Arguments of `anelm generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt (read from stdin when absent).
    pub prompt: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculate: SpeculateArgs,
    /// Feed the prompt as-is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Ask thinking models (Qwen3/3.5) to think first (passed to the template as enable_thinking).
    #[arg(long)]
    pub think: bool,
    /// Prompt tokens per prefill pass.
    #[arg(long, default_value_t = anelm_engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
}

/// Read the prompt from the argument or stdin.
pub fn prompt_text(arg: Option<String>) -> Result<String> {
    match arg {
        Some(p) => Ok(p),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("could not read the prompt from stdin")?;
            Ok(s)
        }
    }
}

/// Template kwargs for the thinking switch.
pub fn template_kwargs(think: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("enable_thinking".into(), Value::Bool(think));
    m
}

/// Run `anelm generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    let text = prompt_text(a.prompt)?;
    let params = a.sampling.params();
    params.validate()?;
    let (lm, device) = load_reporting(&a.model)?;
    device.reset();
    let prompt = if a.raw {
        text
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = a.system {
            msgs.push(ChatMessage::new("system", s));
        }
        msgs.push(ChatMessage::new("user", text));
        lm.render_chat(&msgs, &[], &template_kwargs(a.think))?
    };
    let ids = lm.tokenizer.encode(&prompt)?;
    let mut session = lm.model.new_session(a.model.ctx_size);
    let mut opts = GenerateOptions {
        stream: a.sampling.stream(),
        prefill_chunk: a.prefill_chunk,
        speculate: None,
    };
    let draft = crate::speculate::Draft::setup(&a.speculate, &a.model, &lm, &mut opts)?;
    let mut drafter = draft
        .as_ref()
        .map(|d| d.drafter(a.model.ctx_size, lm.model.info().vocab_size));
    if let Some(g) = a.sampling.output_grammar()? {
        opts.stream.constraint = Some(lm.constraint(&g)?);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_failed = None;
    let (_, stats) = crate::speculate::run(&lm, &mut session, &ids, &opts, drafter.as_mut(), &mut |piece| match out
        .write_all(piece.as_bytes())
        .and_then(|_| out.flush())
    {
        Ok(()) => true,
        Err(e) => {
            write_failed = Some(e);
            false
        }
    })?;
    if let Some(e) = write_failed {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e).context("could not write to stdout");
        }
        return Ok(());
    }
    let _ = writeln!(out);
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s ({:?})",
        stats.prompt_tokens,
        stats.prompt_tok_per_s(),
        stats.generated_tokens,
        stats.generation_tok_per_s(),
        stats.finish
    );
    if stats.generated_tokens > 1 {
        let (forward, outside) = stats.step_split();
        let step = (forward + outside).as_secs_f64().max(f64::MIN_POSITIVE);
        eprintln!(
            "per token: {:.0} µs in the forward, {:.0} µs outside it (sampling, detokenising, writing: {:.1} % of a step)",
            forward.as_secs_f64() * 1e6,
            outside.as_secs_f64() * 1e6,
            100.0 * outside.as_secs_f64() / step
        );
    }
    if opts.speculate.is_some() || drafter.is_some() {
        let s = stats.speculation;
        eprintln!(
            "speculation: {} passes, {:.2} tokens per pass, {} of {} drafted tokens accepted ({:.0} %)",
            s.passes,
            stats.generated_tokens as f64 / s.passes.max(1) as f64,
            s.accepted,
            s.drafted,
            100.0 * s.acceptance()
        );
    }
    device.print_line("prompt + generation", stats.prompt_tokens + stats.generated_tokens);
    Ok(())
}
