//! Command-line arguments shared by the model commands.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use anelm_engine::{Grammar, LoadQuantization, SamplerParams, StreamOptions};

/// Where kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The Neural Engine when it opens on this machine, else the CPU.
    Auto,
    /// The native CPU backend.
    Cpu,
    /// The emulated Neural Engine: the exact ANE programs, validated against the hardware rules,
    /// run in fp16 on the CPU, with modelled ANE time for `--chip`.
    AneEmu,
    /// This Mac's Neural Engine through AppleNeuralEngine.framework (Apple Silicon, macOS); where
    /// there is none it fails with "no Neural Engine on this machine: use --device cpu or ane-emu".
    Ane,
}

/// How ANE programs store their weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AneWeightsArg {
    /// fp16 constants.
    Fp16,
    /// int8 rows with one fp16 scale per row (half the bytes per dispatch).
    Int8,
}

impl AneWeightsArg {
    /// The lowering's weight mode.
    pub fn mode(self) -> anelm_ane::WeightMode {
        match self {
            AneWeightsArg::Fp16 => anelm_ane::WeightMode::Fp16,
            AneWeightsArg::Int8 => anelm_ane::WeightMode::INT8_PER_ROW,
        }
    }
}

/// Options of the ANE devices (ignored on the CPU).
#[derive(Args, Clone, Debug)]
pub struct AneArgs {
    /// Chip profile of the emulator's cost model (m1, m1-pro, …, m3-max, …, m5-max).
    #[arg(long, default_value = "m3-max")]
    pub chip: String,
    /// Weight storage of ANE programs.
    #[arg(long, value_enum, default_value_t = AneWeightsArg::Fp16)]
    pub ane_weights: AneWeightsArg,
    /// Do not use or write compile-cache markers (compile every kernel).
    #[arg(long)]
    pub no_ane_cache: bool,
}

impl AneArgs {
    /// The chip profile `--chip` names, or an error listing the valid names.
    pub fn chip_profile(&self) -> anyhow::Result<anelm_ane::ChipProfile> {
        anelm_ane::ChipProfile::by_name(&self.chip).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown --chip '{}': use one of {}",
                self.chip,
                anelm_ane::ChipProfile::names()
            )
        })
    }
}

/// Arguments every model command takes.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face safetensors directory (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short = 'm', env = "ANELM_MODEL")]
    pub model: Option<PathBuf>,
    /// Where kernels run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// CPU threads (default: the machine's cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context size of a session in tokens (capped at the model's training context).
    #[arg(long, default_value_t = 4096)]
    pub ctx_size: usize,
    /// Lay out chat prompts with the Jinja template in FILE instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Re-encode the model's float (f32/f16/bf16) matrices at load for the CPU backend: q8_0,
    /// q4_0 or q4_k (block formats of GGUF files are kept). Off by default.
    #[arg(long, value_name = "FORMAT", value_parser = parse_quantize)]
    pub quantize: Option<LoadQuantization>,
    #[command(flatten)]
    pub ane: AneArgs,
}

fn parse_quantize(name: &str) -> Result<LoadQuantization, String> {
    LoadQuantization::parse(name).ok_or_else(|| format!("choose one of: {}", LoadQuantization::choices()))
}

/// Sampling and length options of the generating commands.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// Temperature; 0 is greedy (deterministic).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus: keep the most likely tokens up to this probability mass (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p × the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every recently seen token (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this × its count from the logit of every recently seen token (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long, default_value_t = 64)]
    pub penalty_last_n: usize,
    /// Random seed (sampling is reproducible for a given seed).
    #[arg(long, default_value_t = 0x5EED)]
    pub seed: u64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// End generation where this text appears (not printed); repeatable.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// The output must be JSON valid under the JSON schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// The output must match the grammar in FILE (llguidance's Lark dialect).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

impl SamplingArgs {
    /// The output grammar `--json-schema` or `--grammar` names, read from its file.
    pub fn output_grammar(&self) -> anyhow::Result<Option<Grammar>> {
        use anyhow::Context;
        if let Some(path) = &self.json_schema {
            let text = std::fs::read_to_string(path).with_context(|| format!("could not read {}", path.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not valid JSON (--json-schema takes a JSON schema file)",
                    path.display()
                )
            })?;
            return Ok(Some(Grammar::JsonSchema(schema)));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path).with_context(|| format!("could not read {}", path.display()))?;
            return Ok(Some(Grammar::Lark(text)));
        }
        Ok(None)
    }

    /// The stream these flags describe (end-of-sequence tokens honoured unless `--ignore-eos`).
    pub fn stream(&self) -> StreamOptions {
        StreamOptions {
            max_tokens: self.max_tokens,
            sampler: self.params(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            logprobs: None,
            constraint: None,
        }
    }

    /// The sampler parameters these flags describe.
    pub fn params(&self) -> SamplerParams {
        SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.penalty_last_n,
            seed: self.seed,
            logit_bias: Vec::new(),
        }
    }
}

/// How a decoder reranker's prompt is written.
#[derive(Args, Clone, Debug, Default)]
pub struct RerankPromptArgs {
    /// Decoder rerankers: what `{instruction}` becomes in the prompt (default: Qwen3-Reranker's
    /// "Given a web search query, retrieve relevant passages that answer the query").
    #[arg(long, value_name = "TEXT")]
    pub rerank_instruction: Option<String>,
    /// Decoder rerankers: the prompt, with `{instruction}`, `{query}` and `{document}` (default:
    /// Qwen3-Reranker's system/user/assistant prompt); the score is P(yes) against P(no) for the
    /// next token.
    #[arg(long, value_name = "TEMPLATE")]
    pub rerank_template: Option<String>,
}

impl RerankPromptArgs {
    /// The prompt these options give.
    pub fn prompt(&self) -> anelm_engine::RerankPrompt {
        let mut p = anelm_engine::RerankPrompt::default();
        if let Some(i) = &self.rerank_instruction {
            p.instruction = i.clone();
        }
        if let Some(t) = &self.rerank_template {
            p.template = t.clone();
        }
        p
    }
}

/// The instruction put before every input of a decoder embedder (Qwen3-Embedding's queries
/// start "Instruct: …\nQuery: "). Default: the model's `default_prompt_name`, if its
/// `config_sentence_transformers.json` names one.
#[derive(Args, Clone, Debug, Default)]
pub struct EmbeddingPromptArgs {
    /// Put TEXT before every input to the embedding model.
    #[arg(long, value_name = "TEXT", conflicts_with = "embedding_prompt")]
    pub embedding_instruction: Option<String>,
    /// Put the model's prompt NAME (from its config_sentence_transformers.json, e.g. `query`)
    /// before every input.
    #[arg(long, value_name = "NAME")]
    pub embedding_prompt: Option<String>,
}

/// Speculative decoding options (`anelm generate`, `anelm chat`, `anelm serve`).
#[derive(Args, Clone, Debug)]
pub struct SpeculateArgs {
    /// Draft tokens and let the model check them in one pass (same output, fewer passes when
    /// the drafts are right): `off`; `lookup` copies what followed the last few tokens earlier
    /// in the prompt or output (strong on extraction, summarising and rewriting of given text);
    /// or the path of a smaller model sharing the tokenizer, whose greedy continuation is the
    /// draft (in `anelm serve`, requests may still choose `"off"` or `"lookup"` per request).
    #[arg(long, value_name = "off|lookup|MODEL", default_value = "off")]
    pub speculate: String,
    /// Most tokens drafted per pass.
    #[arg(long, default_value_t = anelm_engine::LookupOptions::default().draft_tokens)]
    pub draft_tokens: usize,
    /// Longest run of tokens prompt lookup matches (tried first, down to --draft-min-ngram).
    #[arg(long, default_value_t = anelm_engine::LookupOptions::default().max_ngram)]
    pub draft_max_ngram: usize,
    /// Shortest run of tokens prompt lookup matches.
    #[arg(long, default_value_t = anelm_engine::LookupOptions::default().min_ngram)]
    pub draft_min_ngram: usize,
}

/// What `--speculate` chose.
#[derive(Clone, Debug, PartialEq)]
pub enum SpeculateChoice {
    /// One token per pass.
    Off,
    /// Prompt lookup.
    Lookup(anelm_engine::LookupOptions),
    /// A draft model at this path, drafting up to `--draft-tokens` per pass.
    Model(PathBuf),
}

impl SpeculateArgs {
    /// The choice, checked.
    pub fn choice(&self) -> anyhow::Result<SpeculateChoice> {
        let lookup = anelm_engine::LookupOptions {
            draft_tokens: self.draft_tokens,
            max_ngram: self.draft_max_ngram,
            min_ngram: self.draft_min_ngram,
        };
        lookup.validate().map_err(|e| anyhow::anyhow!("--speculate: {e}"))?;
        Ok(match self.speculate.as_str() {
            "off" => SpeculateChoice::Off,
            "lookup" => SpeculateChoice::Lookup(lookup),
            path => {
                let p = PathBuf::from(path);
                if !p.exists() {
                    anyhow::bail!(
                        "--speculate takes off, lookup or the path of a draft model; {} does not exist",
                        p.display()
                    );
                }
                SpeculateChoice::Model(p)
            }
        })
    }

    /// The server's default drafting, and the draft model to load when it is one.
    pub fn server_default(&self) -> anyhow::Result<(Option<anelm_engine::Drafting>, Option<PathBuf>)> {
        Ok(match self.choice()? {
            SpeculateChoice::Off => (None, None),
            SpeculateChoice::Lookup(o) => (Some(anelm_engine::Drafting::Lookup(o)), None),
            SpeculateChoice::Model(p) => (Some(anelm_engine::Drafting::Model), Some(p)),
        })
    }
}
