//! The one decoder trunk every causal architecture runs: lay a step's tokens out as lanes,
//! look up (and scale) their embeddings, run the architecture's layers over the residual
//! stream, record the tokens in their sessions, apply the final norm to the rows asked for, and
//! run the LM head (with the optional logit soft-cap) — or stop before the head and hand the
//! normed hidden states to an embedder. An architecture supplies only its layers
//! ([`DecoderLayers`]: mixers, FFNs, the per-step values they share, its session layout);
//! loading the embedding, the final norm and the head is shared too ([`DecoderEnds::load`]).

use std::sync::Arc;

use anelm_model::tensor_store::TensorStore;

use crate::arch::kernel_list::KernelDesc;
use crate::arch::step::{LaneRef, commit_tokens, embed_lanes, plan_lanes, wanted_lanes};
use crate::arch::tensor_names::{Tensor, TensorNames};
use crate::arch::trunk::{load_embedding, norm_vector};
use crate::backend::{Backend, ForwardCost, Kernel};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::model::{LanguageModel, ModelInfo, StepItem};
use crate::ops::{layer_norm, rms_norm};
use crate::session::Session;
use crate::stored_matrix::StoredMatrix;

/// What an architecture adds to the shared trunk: its layers.
pub trait DecoderLayers: Send + Sync {
    /// Values the layers of one step share (RoPE angles per lane, scratch batches), made once
    /// per step by [`DecoderLayers::begin`].
    type Step;

    /// Prepare a step over `lanes` (one per token of the step, in order).
    fn begin(&self, lanes: &[LaneRef]) -> Self::Step;

    /// Run layer `li` over the residual stream `x` (one row per lane), in place.
    fn layer(
        &self,
        li: usize,
        step: &mut Self::Step,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        x: &mut Batch,
        cost: &mut ForwardCost,
    ) -> Result<()>;

    /// A fresh session of `ctx` positions (already clamped to the training context).
    fn new_session(&self, ctx: usize) -> Session;

    /// Whether attention sees later positions too (an encoder: each input in one step).
    fn bidirectional(&self) -> bool {
        false
    }
}

/// The parts around the layers: embedding, final norm and LM head.
pub struct DecoderEnds {
    /// The token embedding, rows decoded per token.
    pub embed: StoredMatrix,
    /// Factor on every embedding row (Gemma: √hidden).
    pub embed_scale: f32,
    /// The final RMSNorm's weights (any `1 + w` offset already added).
    pub output_norm: Vec<f32>,
    /// Its epsilon.
    pub norm_eps: f32,
    /// LayerNorm without a bias (ModernBERT) instead of RMSNorm: its (zero) bias, one per hidden
    /// value; `None` for RMSNorm.
    pub layer_norm_bias: Option<Vec<f32>>,
    /// The LM head; `None` for a trunk loaded for embeddings.
    pub lm_head: Option<Box<dyn Kernel>>,
    /// `cap · tanh(logit / cap)` on the logits (Gemma 3).
    pub final_softcap: Option<f32>,
}

/// How [`DecoderEnds::load`] reads the tensors around the layers.
pub struct EndsSpec<'a> {
    /// Vocabulary rows.
    pub vocab: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Added to the stored final-norm weights (1 for `(1 + w)` norms stored as `w`).
    pub norm_offset: f32,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// LayerNorm without a bias (ModernBERT) instead of RMSNorm.
    pub layer_norm: bool,
    /// Factor on the embedding rows.
    pub embed_scale: f32,
    /// Logit soft-cap.
    pub final_softcap: Option<f32>,
    /// The LM head's description (the last kernel of the architecture's list), or `None` to
    /// load the trunk without it.
    pub lm_head: Option<&'a KernelDesc>,
}

impl DecoderEnds {
    /// Load the embedding, the final norm and (when asked) compile the LM head.
    pub fn load(
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        spec: EndsSpec<'_>,
    ) -> Result<Self> {
        let embed = load_embedding(store, names, spec.vocab, spec.hidden)?;
        let lm_head = match spec.lm_head {
            Some(desc) => Some(desc.compile(backend, store, names)?),
            None => None,
        };
        Ok(Self {
            embed,
            embed_scale: spec.embed_scale,
            output_norm: norm_vector(store, &names.name(Tensor::OutputNorm)?, spec.hidden, spec.norm_offset)?,
            norm_eps: spec.norm_eps,
            layer_norm_bias: spec.layer_norm.then(|| vec![0.0; spec.hidden]),
            lm_head,
            final_softcap: spec.final_softcap,
        })
    }
}

/// A decoder model: an architecture's layers inside the shared trunk.
pub struct Decoder<L> {
    pub(crate) layers: L,
    pub(crate) ends: DecoderEnds,
    pub(crate) info: ModelInfo,
}

impl<L: DecoderLayers> Decoder<L> {
    /// Assemble a model from its layers, ends and description.
    pub fn new(layers: L, ends: DecoderEnds, info: ModelInfo) -> Self {
        Self { layers, ends, info }
    }

    /// Run one step as [`LanguageModel::forward`] does, but return the final-normed hidden
    /// states (hidden-size rows) of the rows the items ask for instead of their logits: what a
    /// decoder embedder pools.
    pub fn hidden_states(&self, items: &mut [StepItem<'_>]) -> Result<Batch> {
        self.trunk(items, &mut ForwardCost::default())
    }

    /// Whether attention sees later positions too ([`DecoderLayers::bidirectional`]).
    pub fn bidirectional(&self) -> bool {
        self.layers.bidirectional()
    }

    /// Whether the model has its LM head (false for a trunk loaded for embeddings).
    pub fn has_lm_head(&self) -> bool {
        self.ends.lm_head.is_some()
    }

    /// Every layer over the items' tokens, then the final norm of the wanted rows.
    fn trunk(&self, items: &mut [StepItem<'_>], cost: &mut ForwardCost) -> Result<Batch> {
        let h = self.info.hidden_size;
        let lanes = plan_lanes(items, self.info.vocab_size)?;
        let n = lanes.len();
        if n == 0 {
            return Ok(Batch::zeros(0, h));
        }
        let mut x = embed_lanes(&self.ends.embed, items, n, self.ends.embed_scale)?;
        let mut step = self.layers.begin(&lanes);
        for li in 0..self.info.n_layers {
            self.layers.layer(li, &mut step, items, &lanes, &mut x, cost)?;
        }
        commit_tokens(items);
        let wanted = wanted_lanes(items);
        let mut normed = Batch::zeros(wanted.len(), h);
        for (row, &lane) in wanted.iter().enumerate() {
            let (w, eps) = (&self.ends.output_norm, self.ends.norm_eps);
            match &self.ends.layer_norm_bias {
                Some(b) => layer_norm(x.lane(lane), w, b, eps, normed.lane_mut(row)),
                None => rms_norm(x.lane(lane), w, eps, 0.0, normed.lane_mut(row)),
            }
        }
        Ok(normed)
    }
}

impl<L: DecoderLayers> LanguageModel for Decoder<L> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_session(&self, ctx_size: usize) -> Session {
        self.layers
            .new_session(ctx_size.clamp(1, self.info.context_length.max(1)))
    }

    fn forward_with_cost(&self, items: &mut [StepItem<'_>]) -> Result<(Batch, ForwardCost)> {
        let lm_head = self.ends.lm_head.as_ref().ok_or_else(|| {
            EngineError::InvalidRequest("this model was loaded as an embedding trunk: it has no LM head".into())
        })?;
        let mut cost = ForwardCost::default();
        let normed = self.trunk(items, &mut cost)?;
        let mut logits = Batch::default();
        if normed.lanes() == 0 {
            logits.resize(0, self.info.vocab_size);
        } else {
            cost.add(lm_head.run(&[&normed], &mut logits)?);
        }
        if let Some(cap) = self.ends.final_softcap {
            logits
                .as_mut_slice()
                .iter_mut()
                .for_each(|v| *v = cap * (*v / cap).tanh());
        }
        Ok((logits, cost))
    }
}
