//! The anelm engine: the Backend/Kernel seam, model forwards per architecture, sessions,
//! sampling and generation.

pub mod ane_backend;
pub mod arch;
pub mod backend;
pub mod batch;
mod byte_codec;
pub mod constraint;
pub mod cpu_backend;
pub mod cross_encoder;
pub mod decoder_embedder;
pub mod decoder_reranker;
pub mod default_model;
pub mod draft_model;
pub mod embedder;
pub mod error;
pub mod expert_slices;
pub mod generate;
pub mod json_schema;
pub mod kv_cache;
pub mod label_scores;
pub mod last_logits;
pub mod load_quantize;
pub mod loader;
pub mod model;
pub mod model_identity;
pub mod ops;
pub mod plan_dims;
pub mod pooling;
pub mod prefixed_store;
pub mod prompt_cache;
pub mod prompt_cache_file;
pub mod reasoning;
pub mod reranker;
pub mod sampler;
pub mod scheduler;
pub mod session;
pub mod session_snapshot;
pub mod speculate;
pub mod stop;
pub mod stored_matrix;
pub mod stream;
pub mod threads;
pub mod tools;
mod unique_items;
mod wide;

pub use ane_backend::{AneBackend, AneMonitor, AneOptions, AneStats, KernelFallback};
pub use backend::{Backend, Dispatch, ForwardCost, Kernel, KernelSpec, WeightId};
pub use batch::Batch;
pub use constraint::{Constraint, ConstraintError, ConstraintFactory, Grammar};
pub use cpu_backend::CpuBackend;
pub use cross_encoder::{CrossEncoder, CrossEncoderInfo, Logits};
pub use decoder_reranker::{DecoderReranker, RerankPrompt};
pub use draft_model::{DraftLane, DraftModel, check_same_vocabulary, draft_lanes};
pub use embedder::{Embedder, EmbedderInfo};
pub use error::{EngineError, Result};
pub use generate::{DEFAULT_PREFILL_CHUNK, GenerateOptions, GenerationStats, generate, generate_with_drafter, prefill};
pub use load_quantize::LoadQuantization;
pub use loader::{LoadedModel, ModelSource, load_model, load_model_weights};
pub use model::{LanguageModel, LogitsMode, ModelInfo, StepItem};
pub use model_identity::ModelIdentity;
pub use prompt_cache::{PromptCache, PromptCacheError, PromptCacheOptions, PromptCacheStats};
pub use reasoning::{Part, ReasoningSplitter};
pub use reranker::Reranker;
pub use sampler::{Sampler, SamplerParams};
pub use scheduler::{
    CancelToken, Completion, DraftConfig, Event, Metrics, Priority, Request, Scheduler, SchedulerConfig, Sink,
    Submission, SubmitError,
};
pub use session::{RecurrentLayer, Session};
pub use session_snapshot::SnapshotError;
pub use speculate::{Drafter, Drafting, LookupOptions, Speculation, SpeculationStats};
pub use stream::{FinishReason, Stream, StreamError, StreamOptions, StreamStep, TokenLogprob};
pub use tools::{ForcedCall, ToolCall, ToolFormat, ToolSpec};
