//! The scheduler's use of the on-disk prompt cache ([`PromptCache`]).
//!
//! **Restore.** At admission, once the chosen session is rewound to the prefix it shares with
//! the prompt, a stored entry that gives more positions (at most the prompt less its last token,
//! whose logits start generation) is restored into the session, and only the rest is prefilled.
//!
//! **Store policy.** Only prefixes of at least [`PromptCacheOptions::min_tokens`] tokens, and
//! each prefix once (an entry already stored only has its last use renewed):
//! - *a prefix two requests were seen to share*: the point where an idle session's cached
//!   tokens and a new prompt part (saved at admission, after the rewind), and the length a
//!   request copies from a concurrent one (`share_prefixes`); a hybrid model's state there is
//!   the checkpoint the rewind or the copy used;
//! - *the submitter's hint* ([`Submission::cache_hint`](super::Submission::cache_hint)): where
//!   a long system prompt ends, so a later request with the same system prompt and another
//!   question restores it — after a restart too, and on a hybrid model, whose session cannot
//!   rewind to a shared prefix it never checkpointed;
//! - *every prompt less its last token* (unless [`PromptCacheOptions::save_prompts`] is off), saved when its prefill reaches that point, so the same
//!   prompt, or any continuation of it (the next turn of a chat), hits after a restart. A hybrid
//!   model's prefill ends a chunk there ([`checkpoint_cuts`]) so the exact state exists.
//!
//! Serialising happens on the step loop (a memory copy of the prefix's state); the file write
//! on the cache's own thread.
//!
//! [`PromptCacheOptions::min_tokens`]: crate::PromptCacheOptions::min_tokens
//! [`PromptCacheOptions::save_prompts`]: crate::PromptCacheOptions::save_prompts

use super::Slot;
use crate::prompt_cache::PromptCache;
use crate::session::Session;

/// At admission: `session` held `held` positions and was rewound to the `common` it shares with
/// `prompt`. Saves the shared prefix when the session held more (two requests share it), then
/// restores a longer stored prefix if there is one. Returns the positions the session holds.
pub(super) fn on_admit(disk: &PromptCache, session: &mut Session, held: usize, prompt: &[u32], common: usize) -> usize {
    let min = disk.options().min_tokens;
    if common < held && common >= min {
        disk.store(session, common);
    }
    let max_len = prompt.len() - 1;
    let mut now = common;
    if max_len > common && max_len >= min {
        now = disk.restore_into(session, prompt, max_len, common).unwrap_or(common);
    }
    now
}

/// After a prefill chunk of `prompt` ran in `session`: save the prompt less its last token once
/// the session holds that state (a hybrid model only at exactly that length, where
/// [`checkpoint_cuts`] ends a chunk; others also once the whole prompt is in).
pub(super) fn after_prefill_chunk(disk: &PromptCache, session: &Session, prompt: &[u32], hint: Option<usize>) {
    // The submitter's hint (the end of a system prompt): kept whenever the session holds it
    // (a hybrid model exactly there, where `checkpoint_cuts` ends a chunk).
    if let Some(h) = hint
        && h >= disk.options().min_tokens
        && (session.len() == h || (session.len() > h && !session.is_recurrent()))
        && !disk.contains(&prompt[..h])
    {
        disk.store(session, h);
    }
    let target = prompt.len() - 1;
    if !disk.options().save_prompts || target < disk.options().min_tokens {
        return;
    }
    let at_target = session.len() == target;
    let done = session.len() == prompt.len() && !session.is_recurrent();
    if at_target || done {
        disk.store(session, target);
    }
}

/// For each hybrid-model session still prefilling a prompt worth saving that is not stored yet:
/// end a chunk at the prompt less its last token, where its recurrent state can be saved.
pub(super) fn checkpoint_cuts(disk: &PromptCache, slots: &[Slot<'_>], cuts: &mut [Option<usize>]) {
    for (slot, cut) in slots.iter().zip(cuts.iter_mut()) {
        let Some(a) = &slot.active else { continue };
        if a.next.is_some() || a.pending.is_empty() || !slot.session.is_recurrent() {
            continue;
        }
        let prompt = &a.job.req.prompt;
        if let Some(h) = a.job.cache_hint
            && h >= disk.options().min_tokens
            && slot.session.len() < h
            && !disk.contains(&prompt[..h])
        {
            *cut = Some(cut.map_or(h, |c| c.min(h)));
        }
        let target = prompt.len() - 1;
        if !disk.options().save_prompts
            || target < disk.options().min_tokens
            || slot.session.len() >= target
            || disk.contains(&prompt[..target])
        {
            continue;
        }
        *cut = Some(cut.map_or(target, |c| c.min(target)));
    }
}
