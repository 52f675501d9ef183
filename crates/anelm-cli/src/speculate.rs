//! What `--speculate` sets up for `anelm generate` and `anelm chat`: lookup options in the
//! generation options, or a draft model loaded beside the target (same device and threads),
//! checked to share its tokenizer, and one generation call for both; `anelm serve` loads its
//! draft model here too.

use std::path::Path;

use anyhow::{Context, Result};

use anelm_engine::{
    DraftModel, GenerateOptions, GenerationStats, LoadedModel, Session, check_same_vocabulary, generate,
    generate_with_drafter,
};

use crate::args::{ModelArgs, SpeculateArgs, SpeculateChoice};

/// The draft model, when `--speculate` names one.
pub struct Draft {
    model: LoadedModel,
    draft_tokens: usize,
}

impl Draft {
    /// Apply `args` to `opts` (lookup) or load the draft model it names beside `target`.
    pub fn setup(
        args: &SpeculateArgs,
        model: &ModelArgs,
        target: &LoadedModel,
        opts: &mut GenerateOptions,
    ) -> Result<Option<Self>> {
        match args.choice()? {
            SpeculateChoice::Off => Ok(None),
            SpeculateChoice::Lookup(o) => {
                opts.speculate = Some(o);
                Ok(None)
            }
            SpeculateChoice::Model(path) => Ok(Some(Self {
                model: load_draft(&path, model, target)?,
                draft_tokens: args.draft_tokens,
            })),
        }
    }

    /// A drafter over this model for a target of `target_vocab` ids and `ctx_size` positions.
    pub fn drafter(&self, ctx_size: usize, target_vocab: usize) -> DraftModel<'_> {
        DraftModel::new(self.model.model.as_ref(), ctx_size, target_vocab, self.draft_tokens)
    }
}

/// Load the draft model at `path` with the target's device and threads (`model`), and check
/// that it shares `target`'s tokenizer.
pub fn load_draft(path: &Path, model: &ModelArgs, target: &LoadedModel) -> Result<LoadedModel> {
    let draft_args = ModelArgs {
        model: Some(path.to_path_buf()),
        chat_template: None,
        ..model.clone()
    };
    let lm = crate::runtime::load(&draft_args)
        .with_context(|| format!("could not load the draft model {}", path.display()))?;
    check_same_vocabulary(&target.tokenizer, &lm.tokenizer)?;
    Ok(lm)
}

/// [`generate`], drafting with `drafter` when there is one.
pub fn run(
    lm: &LoadedModel,
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    drafter: Option<&mut DraftModel<'_>>,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> anelm_engine::Result<(Vec<u32>, GenerationStats)> {
    match drafter {
        Some(d) => generate_with_drafter(lm.model.as_ref(), &lm.tokenizer, session, prompt, opts, d, on_text),
        None => generate(lm.model.as_ref(), &lm.tokenizer, session, prompt, opts, on_text),
    }
}
