//! The plan of a BERT-family encoder (an embedding model) on the ANE: the four kernels each
//! layer compiles (the engine's `arch/bert.rs`), and the modelled embeddings/s and tokens/s per
//! chip for texts of a given length.
//!
//! An encoder is the ANE's best case: every token of a batch is a W-lane, and the texts of a
//! call are packed (no padding), so every dispatch carries [`LANES`] tokens whatever the texts'
//! lengths. A step is one dispatch of every kernel for 32 tokens; embeddings/s is tokens/s
//! divided by the text length. A step costs its dispatches (fixed cost plus bytes at the chip's
//! streaming rate, as [`ChipProfile::weights_dispatch_seconds`]) plus the host's work between
//! them, counted as the decoder plan counts it ([`crate::plan_host`]): the per-dispatch call,
//! surface packing, and per token the embedding sum, LayerNorms, biases and GELU, and
//! bidirectional attention over the token's own text, which grows with the text's length.
//! Nothing overlaps (the evaluate call is synchronous).

use crate::chip::ChipProfile;
use crate::kernel::AneKernel;
use crate::plan::{KernelRole, PlanError, PlanOptions};
use crate::plan_host::{HostRuntime, StepCost, Work, dispatch};
use crate::plan_input::ModelKernel;
use crate::surface::LANES;

/// Shapes of a BERT-family encoder (from its `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderDims {
    /// Hidden width.
    pub hidden: usize,
    /// FFN width.
    pub intermediate: usize,
    /// Attention heads.
    pub heads: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Longest text in tokens (position table).
    pub max_positions: usize,
}

/// One encoder kernel and what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncoderKernel {
    /// `qkv`, `attn_out`, `ffn_up` or `ffn_down`.
    pub role: &'static str,
    /// The kernel.
    pub kernel: AneKernel,
}

/// The kernels of every layer of an encoder, in dispatch order.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderPlan {
    /// The shapes planned.
    pub dims: EncoderDims,
    /// Settings used.
    pub options: PlanOptions,
    /// One layer's kernels (every layer has the same).
    pub layer: Vec<EncoderKernel>,
}

impl EncoderDims {
    /// The kernels every layer of an encoder of these shapes compiles, derived from the shapes
    /// alone: the fused q ‖ k ‖ v projection, the output projection with its residual, the FFN
    /// up projection (GELU and biases stay on the host) and the down projection with its
    /// residual. (The engine's `BertConfig::kernel_specs` describes the same list; its tests
    /// keep the two equal.)
    pub fn kernels(&self) -> Vec<ModelKernel> {
        let (h, f) = (self.hidden, self.intermediate);
        vec![
            ModelKernel {
                role: KernelRole::InputProj,
                kernel: AneKernel::FusedLinear {
                    parts: vec![h, h, h],
                    cols: h,
                },
            },
            ModelKernel {
                role: KernelRole::OutputProjResidual,
                kernel: AneKernel::LinearResidual { rows: h, cols: h },
            },
            ModelKernel {
                role: KernelRole::FfnUp,
                kernel: AneKernel::Linear { rows: f, cols: h },
            },
            ModelKernel {
                role: KernelRole::FfnDownResidual,
                kernel: AneKernel::LinearResidual { rows: h, cols: f },
            },
        ]
    }
}

/// Plan `dims` with the kernels [`EncoderDims::kernels`] derives from the shapes.
pub fn plan_encoder(dims: &EncoderDims, opts: &PlanOptions) -> Result<EncoderPlan, PlanError> {
    plan_encoder_kernels(dims, &dims.kernels(), opts)
}

/// The name `anelm plan` prints for an encoder kernel of `role`.
fn encoder_role(role: KernelRole) -> Option<&'static str> {
    match role {
        KernelRole::InputProj => Some("qkv"),
        KernelRole::OutputProjResidual => Some("attn_out"),
        KernelRole::FfnUp => Some("ffn_up"),
        KernelRole::FfnDownResidual => Some("ffn_down"),
        _ => None,
    }
}

/// Plan an encoder whose every layer compiles `layer` (the engine's description of the model):
/// each kernel whole, within the device limits.
pub fn plan_encoder_kernels(
    dims: &EncoderDims,
    layer: &[ModelKernel],
    opts: &PlanOptions,
) -> Result<EncoderPlan, PlanError> {
    let (h, f) = (dims.hidden, dims.intermediate);
    if h == 0 || f == 0 || dims.layers == 0 || dims.max_positions == 0 || dims.heads == 0 {
        return Err(PlanError::BadDims(format!(
            "hidden {h}, intermediate {f}, heads {}, layers {} and max positions {} must be positive",
            dims.heads, dims.layers, dims.max_positions
        )));
    }
    if h % dims.heads != 0 {
        return Err(PlanError::BadDims(format!(
            "hidden {h} does not divide into {} heads",
            dims.heads
        )));
    }
    let layer = layer
        .iter()
        .map(|k| {
            let role = encoder_role(k.role).ok_or_else(|| {
                PlanError::BadDims(format!("a {} kernel: an encoder layer has no such kernel", k.role))
            })?;
            Ok(EncoderKernel {
                role,
                kernel: k.kernel.clone(),
            })
        })
        .collect::<Result<Vec<_>, PlanError>>()?;
    // The widest channel count and the widest conv input of any kernel of the layer.
    let widest = (layer.iter())
        .flat_map(|k| {
            k.kernel
                .input_channels()
                .into_iter()
                .chain([k.kernel.output_channels()])
        })
        .max()
        .unwrap_or(0);
    let widest_input = (layer.iter())
        .flat_map(|k| k.kernel.weights().into_iter().map(|w| w.cols))
        .max()
        .unwrap_or(0);
    for k in &layer {
        let fp16 = k.kernel.weight_bytes(crate::WeightMode::Fp16) as u64;
        let l = &opts.limits;
        if fp16 > l.max_kernel_const_bytes || widest > l.max_dim || widest_input > l.max_conv_input_channels {
            return Err(PlanError::DoesNotFit(format!(
                "the encoder's {} kernel ({} MB of fp16 weights)",
                k.role,
                fp16 / 1_000_000
            )));
        }
    }
    Ok(EncoderPlan {
        dims: *dims,
        options: *opts,
        layer,
    })
}

impl EncoderPlan {
    /// Kernels to compile and load.
    pub fn kernel_count(&self) -> usize {
        self.layer.len() * self.dims.layers
    }

    /// Dispatches per step of [`LANES`] tokens.
    pub fn dispatches_per_step(&self) -> usize {
        self.kernel_count()
    }

    /// Weight bytes streamed per step, in the plan's weight mode.
    pub fn weight_bytes_per_step(&self) -> u64 {
        self.layer
            .iter()
            .map(|k| k.kernel.weight_bytes(self.options.weights) as u64)
            .sum::<u64>()
            * self.dims.layers as u64
    }

    /// Modelled ANE time of one step (every kernel once, 32 tokens), seconds: the dispatches
    /// alone, without the host's work.
    pub fn ane_step_seconds(&self, chip: &ChipProfile) -> f64 {
        let layer: f64 = self
            .layer
            .iter()
            .map(|k| {
                let w = k.kernel.weight_bytes(self.options.weights) as u64;
                chip.weights_dispatch_seconds(w, k.kernel.io_bytes() as u64, self.options.weights)
            })
            .sum();
        layer * self.dims.layers as f64
    }

    /// One step of 32 tokens from texts of `seq_len` tokens, by term: every kernel dispatched
    /// once for the 32 lanes, and each token's host work.
    pub fn step_cost(&self, chip: &ChipProfile, seq_len: usize) -> StepCost {
        let mut cost = StepCost {
            tokens: LANES,
            ..StepCost::default()
        };
        for _ in 0..self.dims.layers {
            for k in &self.layer {
                dispatch(
                    &mut cost,
                    &k.kernel,
                    self.options.weights,
                    LANES,
                    chip,
                    HostRuntime::Anelm,
                );
            }
        }
        let (elementwise, attention) = self.token_work(seq_len);
        cost.elementwise = elementwise.seconds(chip) * LANES as f64;
        cost.attention = attention.seconds(chip) * LANES as f64;
        cost.core_seconds += cost.elementwise + cost.attention;
        cost.cores = 1;
        cost
    }

    /// One token's host work for texts of `seq_len` tokens: (elementwise, attention).
    fn token_work(&self, seq_len: usize) -> (Work, Work) {
        let d = &self.dims;
        let (h, f, nh, l) = (
            d.hidden as f64,
            d.intermediate as f64,
            d.heads as f64,
            seq_len.clamp(1, d.max_positions) as f64,
        );
        let hd = h / nh;
        // A LayerNorm of n: mean, variance, scale and shift (~8 flops); read x, γ, β, write y.
        let layer_norm = |n: f64| Work {
            flops: 8.0 * n,
            bytes: 16.0 * n,
            ..Work::default()
        };
        let mut e = Work::default();
        // Word + position + type rows summed, then the embedding LayerNorm; pooling and the
        // final normalisation add one pass over the hidden state per token.
        e.add(Work {
            flops: 3.0 * h,
            bytes: 16.0 * h,
            ..Work::default()
        });
        e.add(layer_norm(h));
        for _ in 0..d.layers {
            e.add(layer_norm(h).scaled(2.0));
            // Biases of q‖k‖v, the output and the down projection; the up projection's bias
            // and erf GELU (~20 flops) over the FFN width.
            e.add(Work {
                flops: 5.0 * h + 21.0 * f,
                bytes: 8.0 * 5.0 * h + 8.0 * f,
                ..Work::default()
            });
        }
        // Bidirectional attention over the token's own text: q·k and p·v per head over every
        // position, softmax; K and V of the text read once per token.
        let per_layer = Work {
            flops: nh * l * (4.0 * hd + 5.0),
            bytes: 2.0 * l * h * 4.0 + nh * l * 8.0,
            ..Work::default()
        };
        let a = per_layer.scaled(d.layers as f64);
        (e, a)
    }

    /// Modelled tokens/s with many texts of `seq_len` tokens packed into full 32-token steps,
    /// host work included.
    pub fn tokens_per_s(&self, chip: &ChipProfile, seq_len: usize) -> f64 {
        self.step_cost(chip, seq_len).tok_s()
    }

    /// Modelled embeddings/s for texts of `seq_len` tokens, packed (tokens/s ÷ length).
    pub fn embeddings_per_s(&self, chip: &ChipProfile, seq_len: usize) -> f64 {
        self.tokens_per_s(chip, seq_len) / seq_len.max(1) as f64
    }

    /// Modelled time of one text of `seq_len` tokens alone (its steps, the last one partly
    /// empty: the dispatches cost a full step, the host's token work only the text's tokens),
    /// seconds.
    pub fn single_text_seconds(&self, chip: &ChipProfile, seq_len: usize) -> f64 {
        let seq_len = seq_len.max(1);
        let c = self.step_cost(chip, seq_len);
        let per_step = c.ane() + c.host_dispatch + c.surfaces;
        let per_token = (c.elementwise + c.attention) / LANES as f64;
        seq_len.div_ceil(LANES) as f64 * per_step + seq_len as f64 * per_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WeightMode;

    fn minilm() -> EncoderDims {
        EncoderDims {
            hidden: 384,
            intermediate: 1536,
            heads: 12,
            layers: 6,
            max_positions: 512,
        }
    }

    #[test]
    fn minilm_plans_four_kernels_per_layer_and_rates_follow_the_length() {
        let p = plan_encoder(&minilm(), &PlanOptions::default()).expect("plan");
        assert_eq!(p.dispatches_per_step(), 24);
        // q, k, v, o (384²) and up, down (384·1536), fp16.
        assert_eq!(p.weight_bytes_per_step(), 6 * (4 * 384 * 384 + 2 * 384 * 1536) * 2);
        let chip = ChipProfile::m3_max();
        let ane = p.ane_step_seconds(&chip);
        // 24 fixed costs at least, plus the bytes.
        assert!(ane > 24.0 * chip.fixed_us * 1e-6);
        let c = p.step_cost(&chip, 64);
        assert_eq!(c.dispatches, 24);
        assert!(
            (c.ane() - ane).abs() < 1e-12 * ane,
            "the step's ANE part is the dispatches"
        );
        assert!(c.host() > 0.0 && c.attention > 0.0 && c.elementwise > 0.0 && c.surfaces > 0.0);
        let tok = p.tokens_per_s(&chip, 64);
        assert!((tok - 32.0 / (ane + c.host())).abs() < 1e-6 * tok);
        assert!((p.embeddings_per_s(&chip, 64) * 64.0 - tok).abs() < 1e-6 * tok);
        // Attention grows with the text; the dispatches do not.
        let long = p.step_cost(&chip, 256);
        assert!(long.attention > 3.0 * c.attention && (long.ane() - c.ane()).abs() < 1e-15);
        assert!(p.tokens_per_s(&chip, 256) < tok);
        // One text of 33 tokens pays two steps of dispatches, but the host work of 33 tokens.
        let one = p.single_text_seconds(&chip, 33);
        let c33 = p.step_cost(&chip, 33);
        let fixed = c33.ane() + c33.host_dispatch + c33.surfaces;
        let per_token = (c33.elementwise + c33.attention) / 32.0;
        assert!((one - (2.0 * fixed + 33.0 * per_token)).abs() < 1e-12);
        // int8 weights stream fewer bytes.
        let int8 = plan_encoder(&minilm(), &PlanOptions::with_weights(WeightMode::Int8 { block: None })).expect("int8");
        assert!(int8.weight_bytes_per_step() < p.weight_bytes_per_step());
    }

    #[test]
    fn bad_or_oversized_encoders_are_errors() {
        let mut d = minilm();
        d.layers = 0;
        assert!(matches!(
            plan_encoder(&d, &PlanOptions::default()),
            Err(PlanError::BadDims(_))
        ));
        d = minilm();
        d.heads = 5;
        assert!(matches!(
            plan_encoder(&d, &PlanOptions::default()),
            Err(PlanError::BadDims(_))
        ));
        let huge = EncoderDims {
            hidden: 20_000,
            intermediate: 80_000,
            heads: 16,
            layers: 2,
            max_positions: 512,
        };
        assert!(matches!(
            plan_encoder(&huge, &PlanOptions::default()),
            Err(PlanError::DoesNotFit(_))
        ));
    }
}
