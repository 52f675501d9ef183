//! `anelm chat`: a REPL that keeps the conversation and the session, so each turn prefills only
//! what is new.

use std::io::{BufRead, Write};

use anyhow::Result;
use clap::Args;

use anelm_engine::{GenerateOptions, StreamOptions};
use anelm_model::chat_template::ChatMessage;

use crate::args::{ModelArgs, SamplingArgs, SpeculateArgs};
use crate::generate::template_kwargs;
use crate::runtime::load;

/// Arguments of `anelm chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculate: SpeculateArgs,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Let thinking models think (enable_thinking).
    #[arg(long)]
    pub think: bool,
}

/// Run `anelm chat`.
pub fn run(a: ChatArgs) -> Result<()> {
    let params = a.sampling.params();
    params.validate()?;
    let lm = load(&a.model)?;
    let mut session = lm.model.new_session(a.model.ctx_size);
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(ChatMessage::new("system", s.clone()));
    }
    let mut opts = GenerateOptions {
        stream: StreamOptions {
            sampler: params,
            ignore_eos: false,
            ..a.sampling.stream()
        },
        prefill_chunk: anelm_engine::DEFAULT_PREFILL_CHUNK,
        speculate: None,
    };
    let draft = crate::speculate::Draft::setup(&a.speculate, &a.model, &lm, &mut opts)?;
    let mut drafter = draft
        .as_ref()
        .map(|d| d.drafter(a.model.ctx_size, lm.model.info().vocab_size));
    // Every turn starts from the grammar's beginning (each stream clones the fresh constraint).
    if let Some(g) = a.sampling.output_grammar()? {
        opts.stream.constraint = Some(lm.constraint(&g)?);
    }
    eprintln!("anelm chat — type a message; /reset clears the conversation, /exit or Ctrl-D quits.");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let Some(line) = lines.next() else { break };
        let line = line?;
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m.role == "system");
                session.clear();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", input.to_string()));
        let prompt = lm.render_chat(&messages, &[], &template_kwargs(a.think))?;
        let ids = lm.tokenizer.encode(&prompt)?;
        let mut reply = String::new();
        let stdout = std::io::stdout();
        let result = crate::speculate::run(&lm, &mut session, &ids, &opts, drafter.as_mut(), &mut |piece| {
            reply.push_str(piece);
            let mut out = stdout.lock();
            out.write_all(piece.as_bytes()).and_then(|_| out.flush()).is_ok()
        });
        println!();
        match result {
            Ok((_, stats)) => {
                eprintln!(
                    "[{} prompt tokens ({} reused), {:.1} tok/s | {} tokens, {:.1} tok/s]",
                    stats.prompt_tokens,
                    stats.reused_tokens,
                    stats.prompt_tok_per_s(),
                    stats.generated_tokens,
                    stats.generation_tok_per_s()
                );
                messages.push(ChatMessage::new("assistant", reply.trim().to_string()));
            }
            Err(e) => {
                // Keep the REPL alive: drop the failed turn and say why.
                messages.pop();
                eprintln!("error: {e}");
            }
        }
    }
    Ok(())
}
