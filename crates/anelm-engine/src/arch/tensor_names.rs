//! Typed tensor names of the decoders (Llama family, Gemma 3, Qwen3.5): every tensor a decoder
//! reads is a [`Tensor`] role, and its name in a file comes from one table per architecture
//! family and file layout (GGUF, Hugging Face), as llama.cpp keeps one tensor list per
//! architecture. The tables are exhaustive `match`es: a misspelt role does not compile, and a
//! role a layout does not name is an error naming the role, the layer and the layout, never a
//! lookup of some other tensor. (BERT's roles live in [`crate::arch::bert_tensors`]: it has one
//! layout only.)

use std::fmt;

use crate::backend::WeightId;
use crate::error::{EngineError, Result};

/// A tensor of a decoder checkpoint, by what it is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tensor {
    /// Token embeddings [vocab, hidden].
    TokenEmbedding,
    /// The final norm before the LM head [hidden].
    OutputNorm,
    /// The untied LM head [vocab, hidden] (absent when tied to the embedding).
    Output,
    /// Tensor `.1` of decoder layer `.0`.
    Layer(usize, LayerTensor),
    /// Matrix `t` of expert `e` of layer `i`'s mixture-of-experts FFN (Qwen3-MoE).
    Expert(usize, usize, ExpertTensor),
}

/// A tensor of one decoder layer, by what it is for.
/// One matrix of an expert of a mixture-of-experts FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertTensor {
    /// Gate projection [expert ffn, hidden].
    Gate,
    /// Up projection [expert ffn, hidden].
    Up,
    /// Down projection [hidden, expert ffn].
    Down,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerTensor {
    /// The norm before the mixer (attention or DeltaNet) [hidden].
    AttnNorm,
    /// Query projection [heads·head_dim, hidden] (Qwen3.5: query and output gate per head).
    AttnQ,
    /// Key projection [kv_heads·head_dim, hidden].
    AttnK,
    /// Value projection [kv_heads·head_dim, hidden].
    AttnV,
    /// Attention output projection [hidden, heads·head_dim].
    AttnOutput,
    /// Per-head RMSNorm of the queries [head_dim] (Qwen3, Gemma 3, Qwen3.5).
    AttnQNorm,
    /// Per-head RMSNorm of the keys [head_dim].
    AttnKNorm,
    /// Qwen2: bias of the query projection [heads·head_dim].
    AttnQBias,
    /// Qwen2: bias of the key projection [kv_heads·head_dim].
    AttnKBias,
    /// Qwen2: bias of the value projection [kv_heads·head_dim].
    AttnVBias,
    /// Gemma 3: the norm of the attention output before the residual add [hidden].
    PostAttnNorm,
    /// The norm before the FFN [hidden].
    FfnNorm,
    /// Gemma 3: the norm of the FFN output before the residual add [hidden].
    PostFfnNorm,
    /// FFN gate projection [ffn, hidden].
    FfnGate,
    /// FFN up projection [ffn, hidden].
    FfnUp,
    /// FFN down projection [hidden, ffn].
    FfnDown,
    /// Qwen3.5 DeltaNet: fused q, k, v input projection [2K + V, hidden].
    SsmQkv,
    /// DeltaNet output-gate projection z [V, hidden].
    SsmZ,
    /// DeltaNet β projection [value heads, hidden].
    SsmBeta,
    /// DeltaNet decay-rate projection a [value heads, hidden].
    SsmAlpha,
    /// DeltaNet causal conv1d weights [2K + V, 1, kernel].
    SsmConv,
    /// DeltaNet decay base per value head: `A_log` (Hugging Face) or −exp(A_log) (GGUF).
    SsmA,
    /// DeltaNet dt bias per value head.
    SsmDtBias,
    /// DeltaNet gated RMSNorm weight [value head dim].
    SsmNorm,
    /// DeltaNet output projection [hidden, V].
    SsmOut,
    /// LFM2 short convolution: the input projection to the B and C gates and the conv input
    /// [3·hidden, hidden].
    ConvInProj,
    /// LFM2 short convolution: the depthwise causal conv weights [hidden, 1, taps].
    ConvWeight,
    /// LFM2 short convolution: the output projection [hidden, hidden].
    ConvOutProj,
    /// A mixture-of-experts FFN's router [experts, hidden] (Qwen3-MoE).
    FfnRouter,
    /// Phi-3: the fused q ‖ k ‖ v projection [(heads + 2·kv_heads)·head_dim, hidden].
    AttnQkv,
}

impl LayerTensor {
    /// Every role, for walking the tables (add a new role here too).
    pub const ALL: [LayerTensor; 30] = {
        use LayerTensor::*;
        [
            AttnNorm,
            AttnQ,
            AttnK,
            AttnV,
            AttnOutput,
            AttnQNorm,
            AttnKNorm,
            AttnQBias,
            AttnKBias,
            AttnVBias,
            PostAttnNorm,
            FfnNorm,
            PostFfnNorm,
            FfnGate,
            FfnUp,
            FfnDown,
            SsmQkv,
            SsmZ,
            SsmBeta,
            SsmAlpha,
            SsmConv,
            SsmA,
            SsmDtBias,
            SsmNorm,
            SsmOut,
            ConvInProj,
            ConvWeight,
            ConvOutProj,
            FfnRouter,
            AttnQkv,
        ]
    };
}

/// An architecture family whose files share one tensor list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama 2/3, SmolLM2, Mistral, Qwen3.
    Llama,
    /// Gemma 3 text.
    Gemma3,
    /// Qwen3.5 text (Gated DeltaNet hybrid).
    Qwen35,
    /// LFM2 (gated short-convolution hybrid).
    Lfm2,
    /// Phi-3 / Phi-4-mini (fused q ‖ k ‖ v and gate ‖ up projections).
    Phi3,
    /// ModernBERT (an encoder: fused Wqkv, GeGLU's input ‖ gate as one matrix).
    ModernBert,
}

/// How a file names its tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// llama.cpp's names (`blk.N.attn_q.weight`).
    Gguf,
    /// Hugging Face names with the model's tensors under `prefix` (`model.`, or
    /// `model.language_model.` for a multimodal checkpoint); the LM head is `lm_head.weight`.
    HuggingFace(String),
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gguf => f.write_str("GGUF"),
            Self::HuggingFace(p) => write!(f, "Hugging Face (under '{p}')"),
        }
    }
}

/// The tensor names of one family in one layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorNames {
    family: Family,
    layout: Layout,
}

impl TensorNames {
    /// The names `family` files in `layout` use.
    pub fn new(family: Family, layout: Layout) -> Self {
        Self { family, layout }
    }

    /// llama.cpp's names for `family`.
    pub fn gguf(family: Family) -> Self {
        Self::new(family, Layout::Gguf)
    }

    /// Hugging Face names for `family` under `model.`.
    pub fn hugging_face(family: Family) -> Self {
        Self::new(family, Layout::HuggingFace("model.".into()))
    }

    /// The family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// These names, when they are `family`'s (an architecture's loader was handed them), else an
    /// error naming both: `model` is the architecture as a user knows it ("a Gemma 3 model").
    pub fn require(&self, family: Family, model: &str) -> Result<&Self> {
        if self.family == family {
            Ok(self)
        } else {
            Err(EngineError::Config(format!(
                "{model} was given the {:?} tensor names",
                self.family
            )))
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether the file is a GGUF (its own conventions for norms and value-head order).
    pub fn is_gguf(&self) -> bool {
        self.layout == Layout::Gguf
    }

    /// The stored name of `t`; an error when this family's layout has no such tensor.
    pub fn name(&self, t: Tensor) -> Result<String> {
        let missing = || {
            EngineError::Config(format!(
                "the {:?} {} tensor list has no {t:?} tensor: this architecture does not use it",
                self.family, self.layout
            ))
        };
        Ok(match (&self.layout, t) {
            (Layout::Gguf, Tensor::TokenEmbedding) => "token_embd.weight".into(),
            // llama.cpp keeps LFM2's final norm (`embedding_norm`) as `token_embd_norm`.
            (Layout::Gguf, Tensor::OutputNorm) if self.family == Family::Lfm2 => "token_embd_norm.weight".into(),
            (Layout::Gguf, Tensor::OutputNorm) => "output_norm.weight".into(),
            (Layout::Gguf, Tensor::Output) => "output.weight".into(),
            (Layout::Gguf, Tensor::Layer(i, l)) => {
                let s = match self.family {
                    Family::Llama => gguf_llama(l),
                    Family::Gemma3 => gguf_gemma3(l),
                    Family::Qwen35 => gguf_qwen35(l),
                    Family::Lfm2 => gguf_lfm2(l),
                    Family::Phi3 => gguf_phi3(l),
                    Family::ModernBert => gguf_modernbert(l),
                };
                format!("blk.{i}.{}", s.ok_or_else(missing)?)
            }
            // llama.cpp stacks each layer's experts into one 3-D tensor per projection; an
            // `ExpertSlices` store shows expert `e` of it as `<tensor>#<e>`.
            (Layout::Gguf, Tensor::Expert(i, e, t)) => {
                let m = match t {
                    ExpertTensor::Gate => "ffn_gate_exps",
                    ExpertTensor::Up => "ffn_up_exps",
                    ExpertTensor::Down => "ffn_down_exps",
                };
                crate::expert_slices::expert_slice_name(&format!("blk.{i}.{m}.weight"), e)
            }
            (Layout::HuggingFace(p), Tensor::Expert(i, e, t)) => {
                let m = match t {
                    ExpertTensor::Gate => "gate_proj",
                    ExpertTensor::Up => "up_proj",
                    ExpertTensor::Down => "down_proj",
                };
                format!("{p}layers.{i}.mlp.experts.{e}.{m}.weight")
            }
            (Layout::HuggingFace(p), Tensor::TokenEmbedding) if self.family == Family::ModernBert => {
                format!("{p}embeddings.tok_embeddings.weight")
            }
            (Layout::HuggingFace(p), Tensor::OutputNorm) if self.family == Family::ModernBert => {
                format!("{p}final_norm.weight")
            }
            (Layout::HuggingFace(p), Tensor::TokenEmbedding) => format!("{p}embed_tokens.weight"),
            (Layout::HuggingFace(p), Tensor::OutputNorm) if self.family == Family::Lfm2 => {
                format!("{p}embedding_norm.weight")
            }
            (Layout::HuggingFace(p), Tensor::OutputNorm) => format!("{p}norm.weight"),
            (Layout::HuggingFace(_), Tensor::Output) => "lm_head.weight".into(),
            (Layout::HuggingFace(p), Tensor::Layer(i, l)) => {
                let s = match self.family {
                    Family::Llama => hf_llama(l),
                    Family::Gemma3 => hf_gemma3(l),
                    Family::Qwen35 => hf_qwen35(l),
                    Family::Lfm2 => hf_lfm2(l),
                    Family::Phi3 => hf_phi3(l),
                    Family::ModernBert => hf_modernbert(l),
                };
                format!("{p}layers.{i}.{}", s.ok_or_else(missing)?)
            }
        })
    }

    /// The name of layer `i`'s tensor `l`.
    pub fn layer(&self, i: usize, l: LayerTensor) -> Result<String> {
        self.name(Tensor::Layer(i, l))
    }

    /// [`TensorNames::layer`] as a kernel's weight id.
    pub fn weight(&self, i: usize, l: LayerTensor) -> Result<WeightId> {
        self.layer(i, l).map(WeightId::new)
    }
}

fn gguf_llama(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "attn_norm.weight",
        AttnQ => "attn_q.weight",
        AttnK => "attn_k.weight",
        AttnV => "attn_v.weight",
        AttnOutput => "attn_output.weight",
        AttnQNorm => "attn_q_norm.weight",
        AttnKNorm => "attn_k_norm.weight",
        AttnQBias => "attn_q.bias",
        AttnKBias => "attn_k.bias",
        AttnVBias => "attn_v.bias",
        FfnRouter => "ffn_gate_inp.weight",
        FfnNorm => "ffn_norm.weight",
        FfnGate => "ffn_gate.weight",
        FfnUp => "ffn_up.weight",
        FfnDown => "ffn_down.weight",
        PostAttnNorm | PostFfnNorm | SsmQkv | SsmZ | SsmBeta | SsmAlpha | SsmConv | SsmA | SsmDtBias | SsmNorm
        | SsmOut | ConvInProj | ConvWeight | ConvOutProj | AttnQkv => return None,
    })
}

fn hf_llama(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "input_layernorm.weight",
        AttnQ => "self_attn.q_proj.weight",
        AttnK => "self_attn.k_proj.weight",
        AttnV => "self_attn.v_proj.weight",
        AttnOutput => "self_attn.o_proj.weight",
        AttnQNorm => "self_attn.q_norm.weight",
        AttnKNorm => "self_attn.k_norm.weight",
        AttnQBias => "self_attn.q_proj.bias",
        AttnKBias => "self_attn.k_proj.bias",
        AttnVBias => "self_attn.v_proj.bias",
        FfnRouter => "mlp.gate.weight",
        FfnNorm => "post_attention_layernorm.weight",
        FfnGate => "mlp.gate_proj.weight",
        FfnUp => "mlp.up_proj.weight",
        FfnDown => "mlp.down_proj.weight",
        PostAttnNorm | PostFfnNorm | SsmQkv | SsmZ | SsmBeta | SsmAlpha | SsmConv | SsmA | SsmDtBias | SsmNorm
        | SsmOut | ConvInProj | ConvWeight | ConvOutProj | AttnQkv => return None,
    })
}

fn gguf_gemma3(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "attn_norm.weight",
        AttnQ => "attn_q.weight",
        AttnK => "attn_k.weight",
        AttnV => "attn_v.weight",
        AttnOutput => "attn_output.weight",
        AttnQNorm => "attn_q_norm.weight",
        AttnKNorm => "attn_k_norm.weight",
        PostAttnNorm => "post_attention_norm.weight",
        FfnNorm => "ffn_norm.weight",
        PostFfnNorm => "post_ffw_norm.weight",
        FfnGate => "ffn_gate.weight",
        FfnUp => "ffn_up.weight",
        FfnDown => "ffn_down.weight",
        AttnQBias | AttnKBias | AttnVBias | SsmQkv | SsmZ | SsmBeta | SsmAlpha | SsmConv | SsmA | SsmDtBias
        | SsmNorm | SsmOut | ConvInProj | ConvWeight | ConvOutProj | FfnRouter | AttnQkv => return None,
    })
}

fn hf_gemma3(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "input_layernorm.weight",
        AttnQ => "self_attn.q_proj.weight",
        AttnK => "self_attn.k_proj.weight",
        AttnV => "self_attn.v_proj.weight",
        AttnOutput => "self_attn.o_proj.weight",
        AttnQNorm => "self_attn.q_norm.weight",
        AttnKNorm => "self_attn.k_norm.weight",
        PostAttnNorm => "post_attention_layernorm.weight",
        FfnNorm => "pre_feedforward_layernorm.weight",
        PostFfnNorm => "post_feedforward_layernorm.weight",
        FfnGate => "mlp.gate_proj.weight",
        FfnUp => "mlp.up_proj.weight",
        FfnDown => "mlp.down_proj.weight",
        AttnQBias | AttnKBias | AttnVBias | SsmQkv | SsmZ | SsmBeta | SsmAlpha | SsmConv | SsmA | SsmDtBias
        | SsmNorm | SsmOut | ConvInProj | ConvWeight | ConvOutProj | FfnRouter | AttnQkv => return None,
    })
}

fn gguf_qwen35(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "attn_norm.weight",
        AttnQ => "attn_q.weight",
        AttnK => "attn_k.weight",
        AttnV => "attn_v.weight",
        AttnOutput => "attn_output.weight",
        AttnQNorm => "attn_q_norm.weight",
        AttnKNorm => "attn_k_norm.weight",
        // llama.cpp calls Qwen3.5's pre-FFN norm the post-attention norm.
        FfnNorm => "post_attention_norm.weight",
        FfnGate => "ffn_gate.weight",
        FfnUp => "ffn_up.weight",
        FfnDown => "ffn_down.weight",
        SsmQkv => "attn_qkv.weight",
        SsmZ => "attn_gate.weight",
        SsmBeta => "ssm_beta.weight",
        SsmAlpha => "ssm_alpha.weight",
        SsmConv => "ssm_conv1d.weight",
        SsmA => "ssm_a",
        SsmDtBias => "ssm_dt.bias",
        SsmNorm => "ssm_norm.weight",
        SsmOut => "ssm_out.weight",
        PostAttnNorm | PostFfnNorm | AttnQBias | AttnKBias | AttnVBias | ConvInProj | ConvWeight | ConvOutProj
        | FfnRouter | AttnQkv => {
            return None;
        }
    })
}

fn hf_qwen35(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "input_layernorm.weight",
        AttnQ => "self_attn.q_proj.weight",
        AttnK => "self_attn.k_proj.weight",
        AttnV => "self_attn.v_proj.weight",
        AttnOutput => "self_attn.o_proj.weight",
        AttnQNorm => "self_attn.q_norm.weight",
        AttnKNorm => "self_attn.k_norm.weight",
        FfnNorm => "post_attention_layernorm.weight",
        FfnGate => "mlp.gate_proj.weight",
        FfnUp => "mlp.up_proj.weight",
        FfnDown => "mlp.down_proj.weight",
        SsmQkv => "linear_attn.in_proj_qkv.weight",
        SsmZ => "linear_attn.in_proj_z.weight",
        SsmBeta => "linear_attn.in_proj_b.weight",
        SsmAlpha => "linear_attn.in_proj_a.weight",
        SsmConv => "linear_attn.conv1d.weight",
        SsmA => "linear_attn.A_log",
        SsmDtBias => "linear_attn.dt_bias",
        SsmNorm => "linear_attn.norm.weight",
        SsmOut => "linear_attn.out_proj.weight",
        PostAttnNorm | PostFfnNorm | AttnQBias | AttnKBias | AttnVBias | ConvInProj | ConvWeight | ConvOutProj
        | FfnRouter | AttnQkv => {
            return None;
        }
    })
}

fn gguf_lfm2(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "attn_norm.weight",
        AttnQ => "attn_q.weight",
        AttnK => "attn_k.weight",
        AttnV => "attn_v.weight",
        AttnOutput => "attn_output.weight",
        AttnQNorm => "attn_q_norm.weight",
        AttnKNorm => "attn_k_norm.weight",
        FfnNorm => "ffn_norm.weight",
        FfnGate => "ffn_gate.weight",
        FfnUp => "ffn_up.weight",
        FfnDown => "ffn_down.weight",
        ConvInProj => "shortconv.in_proj.weight",
        ConvWeight => "shortconv.conv.weight",
        ConvOutProj => "shortconv.out_proj.weight",
        AttnQBias | AttnKBias | AttnVBias | PostAttnNorm | PostFfnNorm | SsmQkv | SsmZ | SsmBeta | SsmAlpha
        | SsmConv | SsmA | SsmDtBias | SsmNorm | SsmOut | FfnRouter | AttnQkv => return None,
    })
}

fn hf_lfm2(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "operator_norm.weight",
        AttnQ => "self_attn.q_proj.weight",
        AttnK => "self_attn.k_proj.weight",
        AttnV => "self_attn.v_proj.weight",
        AttnOutput => "self_attn.out_proj.weight",
        AttnQNorm => "self_attn.q_layernorm.weight",
        AttnKNorm => "self_attn.k_layernorm.weight",
        FfnNorm => "ffn_norm.weight",
        FfnGate => "feed_forward.w1.weight",
        FfnUp => "feed_forward.w3.weight",
        FfnDown => "feed_forward.w2.weight",
        ConvInProj => "conv.in_proj.weight",
        ConvWeight => "conv.conv.weight",
        ConvOutProj => "conv.out_proj.weight",
        AttnQBias | AttnKBias | AttnVBias | PostAttnNorm | PostFfnNorm | SsmQkv | SsmZ | SsmBeta | SsmAlpha
        | SsmConv | SsmA | SsmDtBias | SsmNorm | SsmOut | FfnRouter | AttnQkv => return None,
    })
}

/// llama.cpp's `phi3`: the fused gate ‖ up matrix is `ffn_up`, its halves read through
/// [`crate::expert_slices::ExpertSlices`] as `#0` (gate) and `#1` (up).
fn gguf_phi3(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "attn_norm.weight",
        AttnQkv => "attn_qkv.weight",
        AttnOutput => "attn_output.weight",
        FfnNorm => "ffn_norm.weight",
        FfnGate => "ffn_up.weight#0",
        FfnUp => "ffn_up.weight#1",
        FfnDown => "ffn_down.weight",
        _ => return None,
    })
}

/// ModernBERT in llama.cpp's `modern-bert` GGUF layout (`ffn_up` holds GeGLU's input and gate
/// halves; layer 0 has no `attn_norm`).
fn gguf_modernbert(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "attn_norm.weight",
        AttnQkv => "attn_qkv.weight",
        AttnOutput => "attn_output.weight",
        FfnNorm => "ffn_norm.weight",
        FfnUp => "ffn_up.weight",
        FfnDown => "ffn_down.weight",
        _ => return None,
    })
}

/// ModernBERT's Hugging Face names (`mlp.Wi` holds GeGLU's input and gate halves).
fn hf_modernbert(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "attn_norm.weight",
        AttnQkv => "attn.Wqkv.weight",
        AttnOutput => "attn.Wo.weight",
        FfnNorm => "mlp_norm.weight",
        FfnUp => "mlp.Wi.weight",
        FfnDown => "mlp.Wo.weight",
        _ => return None,
    })
}

/// Phi-3's Hugging Face names: the fused gate ‖ up matrix's halves as `#0` (gate) and `#1` (up).
fn hf_phi3(l: LayerTensor) -> Option<&'static str> {
    use LayerTensor::*;
    Some(match l {
        AttnNorm => "input_layernorm.weight",
        AttnQkv => "self_attn.qkv_proj.weight",
        AttnOutput => "self_attn.o_proj.weight",
        FfnNorm => "post_attention_layernorm.weight",
        FfnGate => "mlp.gate_up_proj.weight#0",
        FfnUp => "mlp.gate_up_proj.weight#1",
        FfnDown => "mlp.down_proj.weight",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_familys_names_are_refused_naming_both() {
        let llama = TensorNames::gguf(Family::Llama);
        assert!(llama.require(Family::Llama, "a Llama-family model").is_ok());
        let err = llama
            .require(Family::Gemma3, "a Gemma 3 model")
            .expect_err("a Gemma 3 loader must refuse Llama names")
            .to_string();
        assert!(err.contains("a Gemma 3 model") && err.contains("Llama"), "{err}");
    }

    #[test]
    fn families_name_the_same_role_differently() {
        let n = |f, l| TensorNames::hugging_face(f).layer(3, l).unwrap();
        assert_eq!(
            n(Family::Llama, LayerTensor::FfnNorm),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(
            n(Family::Gemma3, LayerTensor::FfnNorm),
            "model.layers.3.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            TensorNames::gguf(Family::Qwen35)
                .layer(0, LayerTensor::FfnNorm)
                .unwrap(),
            "blk.0.post_attention_norm.weight"
        );
        assert_eq!(
            TensorNames::gguf(Family::Qwen35).layer(2, LayerTensor::SsmA).unwrap(),
            "blk.2.ssm_a"
        );
        let mm = TensorNames::new(Family::Gemma3, Layout::HuggingFace("model.language_model.".into()));
        assert_eq!(mm.name(Tensor::Output).unwrap(), "lm_head.weight");
        assert_eq!(
            mm.name(Tensor::TokenEmbedding).unwrap(),
            "model.language_model.embed_tokens.weight"
        );
    }

    #[test]
    fn every_table_names_each_role_once() {
        for family in [Family::Llama, Family::Gemma3, Family::Qwen35] {
            for names in [TensorNames::gguf(family), TensorNames::hugging_face(family)] {
                let named: Vec<String> = LayerTensor::ALL
                    .iter()
                    .filter_map(|&t| names.layer(7, t).ok())
                    .collect();
                let mut unique = named.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), named.len(), "{names:?}: two roles share a name");
                // Every family has the attention and FFN roles the loaders read.
                assert!(named.len() >= 11, "{names:?}: {named:?}");
                assert!(named.iter().all(|n| n.contains(".7.")), "{named:?}");
            }
        }
        // No role is listed twice (a new role must be added to `ALL` by hand).
        let distinct: std::collections::HashSet<_> = LayerTensor::ALL.iter().collect();
        assert_eq!(distinct.len(), LayerTensor::ALL.len());
    }

    #[test]
    fn a_role_the_family_lacks_is_an_error_naming_it() {
        let err = TensorNames::gguf(Family::Llama)
            .layer(1, LayerTensor::PostFfnNorm)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("PostFfnNorm") && err.contains("Llama") && err.contains("GGUF"),
            "{err}"
        );
        assert!(
            TensorNames::hugging_face(Family::Gemma3)
                .layer(0, LayerTensor::SsmQkv)
                .is_err()
        );
        assert!(
            TensorNames::hugging_face(Family::Qwen35)
                .layer(0, LayerTensor::PostAttnNorm)
                .is_err()
        );
    }
}
