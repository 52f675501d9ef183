//! Constrained decoding: a grammar (a JSON schema, any JSON object, a Lark grammar or a regular
//! expression) that a stream's output must match, enforced token by token with `llguidance`.
//! Each step the constraint masks every token that cannot continue a valid output, so the answer
//! parses whatever the model's size; end-of-generation tokens are allowed only where the grammar
//! is complete.

use std::fmt;
use std::sync::Arc;

use anelm_model::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::json_schema::rewrite;
use crate::unique_items::UniqueItems;

/// What a stream's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid under this JSON schema.
    JsonSchema(Value),
    /// A value valid under this JSON schema between two fixed texts (a tool call's tags).
    TaggedJson {
        /// The text before the JSON.
        open: String,
        /// The JSON's schema.
        schema: Value,
        /// The text after it.
        close: String,
    },
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

/// A grammar that could not be compiled, or a constraint that failed mid-stream.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar or schema is invalid or unsupported; the message is llguidance's reason.
    #[error("invalid grammar: {0}")]
    Invalid(String),
    /// The tokenizer could not be prepared for constrained decoding.
    #[error("constrained decoding is unavailable for this tokenizer: {0}")]
    Tokenizer(String),
    /// The constraint failed while generating (a bug or an internal limit).
    #[error("the output constraint failed: {0}")]
    Failed(String),
}

/// JSON is generated compactly readable (`", "` and `": "`, no free whitespace): a small model
/// given free whitespace can spend its whole budget on newlines.
fn json_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// A JSON schema rewritten for llguidance ([`crate::json_schema`]), with anelm's JSON options.
fn prepared_schema(schema: &Value) -> Result<Value, ConstraintError> {
    let mut schema = rewrite(schema).map_err(|e| ConstraintError::Invalid(e.0))?;
    if let Value::Object(o) = &mut schema
        && !o.contains_key("x-guidance")
    {
        o.insert("x-guidance".into(), json_options());
    }
    Ok(schema)
}

impl Grammar {
    /// llguidance's grammar, and the run-time `uniqueItems` rule when the schema needs one.
    fn to_llguidance(&self) -> Result<(TopLevelGrammar, Option<UniqueItems>), ConstraintError> {
        Ok(match self {
            Grammar::JsonObject => (
                TopLevelGrammar::from_json_schema(json!({"type": "object", "x-guidance": json_options()})),
                None,
            ),
            Grammar::JsonSchema(schema) => {
                let schema = prepared_schema(schema)?;
                let unique = UniqueItems::new(&schema, 0);
                (TopLevelGrammar::from_json_schema(schema), unique)
            }
            Grammar::TaggedJson { open, schema, close } => {
                let schema = prepared_schema(schema)?;
                let unique = UniqueItems::new(&schema, open.len());
                let lark = format!(
                    "start: {} %json {schema} {}",
                    Value::from(open.as_str()),
                    Value::from(close.as_str())
                );
                (TopLevelGrammar::from_lark(lark), unique)
            }
            Grammar::Lark(g) => (TopLevelGrammar::from_lark(g.clone()), None),
            Grammar::Regex(r) => (TopLevelGrammar::from_regex(r), None),
        })
    }
}

/// anelm's vocabulary seen by llguidance: each token's bytes, special tokens behind llguidance's
/// marker byte so text can never produce them. Text is tokenized greedily over the trie and
/// declared non-canonical, so llguidance never forces tokens from it (it only masks).
struct VocabularyTrie {
    trie: TokTrie,
}

impl TokenizerEnv for VocabularyTrie {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Compiles grammars for one model's tokenizer (built once per model: it indexes the whole
/// vocabulary).
pub struct ConstraintFactory {
    factory: ParserFactory,
    env: TokEnv,
    stop_ids: Vec<u32>,
    vocab: usize,
}

impl ConstraintFactory {
    /// Index `tokenizer`'s vocabulary for constrained decoding.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, ConstraintError> {
        let vocab = tokenizer.vocab_size();
        let stop_ids = tokenizer.stop_ids().to_vec();
        let eos = tokenizer
            .eos_id()
            .or_else(|| stop_ids.first().copied())
            .ok_or_else(|| ConstraintError::Tokenizer("the model has no end-of-sequence token".into()))?;
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id);
                if tokenizer.is_special(id) {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend_from_slice(tokenizer.token_str(id).map_or(&bytes[..], str::as_bytes));
                    marked
                } else {
                    bytes
                }
            })
            .collect();
        let vocab_u32 = u32::try_from(vocab).map_err(|_| ConstraintError::Tokenizer("vocabulary too large".into()))?;
        let mut info = TokRxInfo::new(vocab_u32, eos);
        info.tok_bos = tokenizer.bos_id();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(VocabularyTrie { trie });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            env,
            stop_ids,
            vocab,
        })
    }

    /// A fresh constraint for one stream; an invalid grammar is an error quoting llguidance.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let (grammar, unique) = grammar.to_llguidance()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher_error(&matcher) {
            return Err(ConstraintError::Invalid(e));
        }
        Ok(Constraint {
            matcher,
            unique,
            env: self.env.clone(),
            stop_ids: self.stop_ids.clone(),
            vocab: self.vocab,
            ready: None,
            mask_every_step: false,
        })
    }
}

/// A matcher error as a failed constraint.
fn failed(e: impl fmt::Display) -> ConstraintError {
    ConstraintError::Failed(e.to_string())
}

fn matcher_error(m: &Matcher) -> Option<String> {
    m.is_error()
        .then(|| m.get_error().unwrap_or_else(|| "unknown error".into()))
}

/// One stream's grammar state.
pub struct Constraint {
    matcher: Matcher,
    /// The run-time `uniqueItems` rule, when the schema has a unique array.
    unique: Option<UniqueItems>,
    /// The vocabulary, for the bytes of a token.
    env: TokEnv,
    stop_ids: Vec<u32>,
    vocab: usize,
    /// The next step's mask, when computed ahead ([`Constraint::prepare`]).
    ready: Option<llguidance::toktrie::SimpleVob>,
    /// Never let a stream take the sampler's unmasked choice without a full mask (see
    /// [`Constraint::mask_every_step`]).
    mask_every_step: bool,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            unique: self.unique.clone(),
            env: self.env.clone(),
            stop_ids: self.stop_ids.clone(),
            vocab: self.vocab,
            ready: self.ready.clone(),
            mask_every_step: self.mask_every_step,
        }
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Set every logit the grammar does not allow next to −∞. End-of-generation tokens are
    /// allowed exactly where the grammar is complete.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        self.prepare()?;
        let Some(mask) = self.ready.take() else {
            return Err(ConstraintError::Failed("no mask was computed".into()));
        };
        let eos_ok = self.stop_ids.iter().any(|&s| mask.is_allowed(s));
        // Every end-of-generation token follows the grammar's end-of-sequence bit.
        let stops: Vec<(usize, f32)> = self
            .stop_ids
            .iter()
            .filter_map(|&s| logits.get(s as usize).map(|&l| (s as usize, l)))
            .collect();
        // Word by word over the bitset: whole words of 32 allowed or refused tokens at once.
        let words = mask.as_slice();
        for (chunk, &word) in logits.chunks_mut(32).zip(words.iter().chain(std::iter::repeat(&0))) {
            match word {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                w => {
                    for (bit, l) in chunk.iter_mut().enumerate() {
                        if w & (1 << bit) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        for (s, l) in stops {
            logits[s] = if eos_ok { l } else { f32::NEG_INFINITY };
        }
        // Entries past the vocabulary (padded logit rows) are never allowed.
        if let Some(tail) = logits.get_mut(self.vocab..) {
            tail.fill(f32::NEG_INFINITY);
        }
        Ok(())
    }

    /// Compute the next step's mask now (the costly part of [`Constraint::mask`]), so a
    /// scheduler can compute several streams' masks in parallel; a no-op when it is ready.
    pub fn prepare(&mut self) -> Result<(), ConstraintError> {
        if self.ready.is_none() {
            let mut mask = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| ConstraintError::Failed(e.to_string()))?;
            if self.unique.as_ref().is_some_and(UniqueItems::is_active)
                && let Some(mut u) = self.unique.take()
            {
                let trie = self.env.tok_trie();
                let (mut refused, mut risky) = (Vec::new(), Vec::new());
                mask.iter_set_entries(|t| {
                    let (t, bytes) = (t as u32, trie.token(t as u32));
                    if self.stop_ids.contains(&t) {
                    } else if !u.allows(bytes) {
                        refused.push(t);
                    } else if u.is_risky(bytes) {
                        risky.push(t);
                    }
                });
                let mut looked = Ok(());
                for t in risky {
                    match self.unique_way_out(&u, t) {
                        Ok(true) => {}
                        Ok(false) => refused.push(t),
                        Err(e) => {
                            looked = Err(e);
                            break;
                        }
                    }
                }
                // The rule goes back before any error is passed on: a later step still needs it.
                self.unique = Some(u);
                looked?;
                for t in refused {
                    mask.disallow_token(t);
                }
                if mask.is_zero() {
                    return Err(ConstraintError::Failed(
                        "every continuation repeats an item of a uniqueItems array (the schema's \
                         unique array cannot be completed: give it more possible values or a lower minItems)"
                            .into(),
                    ));
                }
            }
            self.ready = Some(mask);
        }
        Ok(())
    }

    /// Whether the grammar allows `token` next, without computing the whole mask: a parse of
    /// the token's bytes (microseconds) rather than a walk of the vocabulary. Exactly the
    /// mask's answer: end-of-generation tokens where the grammar is complete, no id past the
    /// vocabulary.
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        if self.stop_ids.contains(&token) {
            return match self.matcher.is_stopped() {
                true => Ok(!self.matcher.is_error()),
                false => self
                    .matcher
                    .is_accepting()
                    .map_err(|e| ConstraintError::Failed(e.to_string())),
            };
        }
        if token as usize >= self.vocab || self.matcher.is_stopped() {
            return Ok(false);
        }
        let grammar_ok = self
            .matcher
            .validate_tokens(&[token])
            .map(|n| n == 1)
            .map_err(|e| ConstraintError::Failed(e.to_string()))?;
        if !grammar_ok {
            return Ok(false);
        }
        let Some(mut u) = self.unique.take() else {
            return Ok(true);
        };
        let bytes = self.env.tok_trie().token(token);
        let ok = match u.allows(bytes) {
            true if u.is_risky(bytes) => self.unique_way_out(&u, token),
            allowed => Ok(allowed),
        };
        self.unique = Some(u);
        ok
    }

    /// After a risky token ([`UniqueItems::is_risky`]): whether some next token would still be
    /// allowed by both the grammar and the unique rule (one step of look-ahead, on copies).
    fn unique_way_out(&self, u: &UniqueItems, token: u32) -> Result<bool, ConstraintError> {
        let mut m = self.matcher.deep_clone();
        m.consume_token(token).map_err(failed)?;
        let mask = m.compute_mask_or_eos().map_err(failed)?;
        let mut after = u.clone();
        let trie = self.env.tok_trie();
        after.accept(trie.token(token));
        let mut found = false;
        mask.iter_set_entries(|t| {
            if !found && !self.stop_ids.contains(&(t as u32)) && after.allows(trie.token(t as u32)) {
                found = true;
            }
        });
        Ok(found)
    }

    /// Compute the full mask at every step, never taking the sampler's unmasked choice after
    /// a check with [`Constraint::allows`] (for tests and A/B measurements: the output is the
    /// same, only slower).
    pub fn mask_every_step(&mut self) {
        self.mask_every_step = true;
    }

    /// Whether [`Constraint::mask_every_step`] was asked for.
    pub fn masks_every_step(&self) -> bool {
        self.mask_every_step
    }

    /// Advance past the token taken (end-of-generation tokens end the constraint).
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        // A mask computed ahead belongs to the state before this token.
        self.ready = None;
        if self.stop_ids.contains(&token) {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Failed(e.to_string()))?;
        if let Some(u) = &mut self.unique {
            u.accept(self.env.tok_trie().token(token));
        }
        Ok(())
    }

    /// The grammar is complete and admits nothing more: the stream should end.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
