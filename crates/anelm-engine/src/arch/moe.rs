//! A mixture-of-experts FFN (Qwen3-MoE): a router scores every expert for each token, the
//! `top_k` best are kept (their softmax probabilities, renormalised to sum to 1 when the model
//! says so), and the token's FFN output is the weighted sum of those experts' SwiGLU outputs.
//!
//! Only the chosen experts run, and each over exactly the lanes routed to it: in a prefill an
//! expert's matrices are read once for all of its tokens (its lanes gathered into one batch), in
//! decode only `top_k` experts' rows are read per token. The router runs on the host in f32 (its
//! choice is discrete: fp16 rounding there could swap experts); the experts are backend kernels —
//! gate ‖ up, then down — with the SwiGLU, the weighting and the residual on the host.

use std::sync::Arc;

use anelm_ane::KernelRole;
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;
use serde_json::Value;

use crate::arch::config_read::GgufMeta;
use crate::arch::kernel_compile::CompiledLayer;
use crate::arch::trunk::f32_matrix;
use crate::backend::{ForwardCost, Kernel};
use crate::batch::Batch;
use crate::error::{EngineError, Result};

/// The mixture-of-experts part of a configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per MoE layer.
    pub experts: usize,
    /// Experts each token uses.
    pub top_k: usize,
    /// Each expert's FFN width.
    pub expert_ffn: usize,
    /// Whether the kept experts' probabilities are renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// Per layer: true where the FFN is the mixture, false for a dense FFN.
    pub sparse: Vec<bool>,
}

impl MoeConfig {
    /// From a Hugging Face `config.json` with `num_experts` or `num_local_experts` (Qwen3-MoE's keys:
    /// `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`, `decoder_sparse_step`,
    /// `mlp_only_layers`); `None` without experts.
    pub fn from_hf(c: &HfConfig, n_layers: usize) -> Result<Option<Self>> {
        let raw = c.raw();
        let uint = |k: &str| raw.get(k).and_then(Value::as_u64).map(|v| v as usize);
        // Hub configs say `num_experts`; transformers 5 saves it as `num_local_experts`.
        let experts = uint("num_experts").or_else(|| uint("num_local_experts")).unwrap_or(0);
        if experts == 0 {
            return Ok(None);
        }
        let top_k = uint("num_experts_per_tok").unwrap_or(1);
        let expert_ffn = uint("moe_intermediate_size")
            .ok_or_else(|| EngineError::Config("num_experts is set but moe_intermediate_size is missing".into()))?;
        check_plausible(experts, top_k, expert_ffn)?;
        let step = uint("decoder_sparse_step").unwrap_or(1).max(1);
        let dense_only: Vec<u64> = raw
            .get("mlp_only_layers")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        Ok(Some(Self {
            experts,
            top_k,
            expert_ffn,
            // transformers' Qwen3MoeConfig defaults it to false.
            norm_topk_prob: raw.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(false),
            sparse: (0..n_layers)
                .map(|i| !dense_only.contains(&(i as u64)) && (i + 1) % step == 0)
                .collect(),
        }))
    }
}

impl MoeConfig {
    /// From a GGUF file's `<arch>.expert_*` metadata (llama.cpp's `qwen3moe`: probabilities
    /// always renormalised); a layer is a mixture where the file has its router
    /// (`blk.N.ffn_gate_inp.weight`). `None` without `expert_count`.
    pub(crate) fn from_gguf(m: &GgufMeta<'_>, g: &GgufFile, n_layers: usize) -> Result<Option<Self>> {
        let Some(experts) = m.opt_usize("expert_count").filter(|&e| e > 0) else {
            return Ok(None);
        };
        let top_k = m.usize("expert_used_count")?;
        let expert_ffn = m.usize("expert_feed_forward_length")?;
        check_plausible(experts, top_k, expert_ffn)?;
        Ok(Some(Self {
            experts,
            top_k,
            expert_ffn,
            norm_topk_prob: true,
            sparse: (0..n_layers)
                .map(|i| g.tensor_info(&format!("blk.{i}.ffn_gate_inp.weight")).is_some())
                .collect(),
        }))
    }
}

/// An error unless `top_k` of `experts` experts of width `expert_ffn` is a mixture a real file
/// could hold.
fn check_plausible(experts: usize, top_k: usize, expert_ffn: usize) -> Result<()> {
    if top_k == 0 || top_k > experts || experts > 4096 || expert_ffn == 0 || expert_ffn > 1 << 20 {
        return Err(EngineError::Config(format!(
            "implausible mixture of experts: {top_k} of {experts} experts of width {expert_ffn}"
        )));
    }
    Ok(())
}

/// One loaded MoE FFN.
pub(crate) struct MoeFfn {
    /// Router weights, `experts × hidden`, in f32.
    router: Vec<f32>,
    /// Per expert: gate ‖ up, then down.
    experts: Vec<(Box<dyn Kernel>, Box<dyn Kernel>)>,
    top_k: usize,
    norm_topk_prob: bool,
    expert_ffn: usize,
    hidden: usize,
}

impl MoeFfn {
    /// The router `router_name` and every expert's kernels from `compiled` (its
    /// `FfnGateUp`/`FfnDown` kernels in expert order, as `KernelDesc::expert` lists them).
    pub(crate) fn load(
        cfg: &MoeConfig,
        hidden: usize,
        store: &Arc<dyn TensorStore>,
        router_name: &str,
        compiled: &mut CompiledLayer,
    ) -> Result<Self> {
        let router = f32_matrix(store, router_name, cfg.experts, hidden)?;
        let experts = (0..cfg.experts)
            .map(|_| {
                Ok((
                    compiled.take(KernelRole::FfnGateUp)?,
                    compiled.take(KernelRole::FfnDown)?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            router,
            experts,
            top_k: cfg.top_k,
            norm_topk_prob: cfg.norm_topk_prob,
            expert_ffn: cfg.expert_ffn,
            hidden,
        })
    }

    /// `x += MoE(xn)` for every lane.
    pub(crate) fn forward(&self, xn: &Batch, x: &mut Batch, cost: &mut ForwardCost) -> Result<()> {
        let (n, h, f) = (xn.lanes(), self.hidden, self.expert_ffn);
        let mut routes: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.experts.len()];
        let mut probs = vec![0f32; self.experts.len()];
        let mut order: Vec<usize> = Vec::with_capacity(self.experts.len());
        for lane in 0..n {
            let xl = xn.lane(lane);
            for (p, w) in probs.iter_mut().zip(self.router.chunks_exact(h)) {
                *p = anelm_kernels::dot_f32(w, xl);
            }
            softmax(&mut probs);
            order.clear();
            order.extend(0..probs.len());
            // The top_k by probability, ties to the lower expert index (a total order, so the set
            // is the one a full sort would keep; their order does not matter: each expert adds
            // its share in expert order below).
            order.select_nth_unstable_by(self.top_k - 1, |&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let kept = &order[..self.top_k];
            let total: f32 = kept.iter().map(|&e| probs[e]).sum();
            for &e in kept {
                let w = if self.norm_topk_prob {
                    probs[e] / total
                } else {
                    probs[e]
                };
                routes[e].push((lane, w));
            }
        }
        let mut out = Batch::zeros(n, h);
        let (mut xs, mut gu, mut act, mut y) = (Batch::default(), Batch::default(), Batch::default(), Batch::default());
        for ((gate_up, down), lanes) in self.experts.iter().zip(&routes) {
            if lanes.is_empty() {
                continue;
            }
            let m = lanes.len();
            xs.resize(m, h);
            for (row, &(lane, _)) in lanes.iter().enumerate() {
                xs.lane_mut(row).copy_from_slice(xn.lane(lane));
            }
            cost.add(gate_up.run(&[&xs], &mut gu)?);
            act.resize(m, f);
            for row in 0..m {
                let (g, u) = gu.lane(row).split_at(f);
                let a = act.lane_mut(row);
                a.copy_from_slice(g);
                anelm_kernels::silu_mul(a, u);
            }
            cost.add(down.run(&[&act], &mut y)?);
            for (row, &(lane, w)) in lanes.iter().enumerate() {
                for (o, &v) in out.lane_mut(lane).iter_mut().zip(y.lane(row)) {
                    *o += v * w;
                }
            }
        }
        for lane in 0..n {
            for (a, &b) in x.lane_mut(lane).iter_mut().zip(out.lane(lane)) {
                *a += b;
            }
        }
        Ok(())
    }
}

/// In-place softmax (max-subtracted, f32).
fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    v.iter_mut().for_each(|x| *x /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Option<MoeConfig> {
        let c = HfConfig::from_json_str(json).expect("config");
        MoeConfig::from_hf(&c, 4).expect("moe")
    }

    #[test]
    fn sparse_layers_follow_the_step_and_the_dense_list() {
        let m = config(
            r#"{"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 16, "decoder_sparse_step": 2, "mlp_only_layers": [3]}"#,
        )
        .expect("a mixture");
        assert_eq!(m.sparse, [false, true, false, false]);
        assert!(!m.norm_topk_prob, "transformers' default");
        let m = config(r#"{"model_type": "qwen3_moe", "num_local_experts": 4, "moe_intermediate_size": 8, "norm_topk_prob": true}"#)
            .expect("transformers 5's key");
        assert_eq!((m.experts, m.top_k, m.sparse.len()), (4, 1, 4));
        assert!(m.norm_topk_prob && m.sparse.iter().all(|&s| s));
        assert!(config(r#"{"model_type": "qwen3"}"#).is_none());
    }

    #[test]
    fn implausible_mixtures_are_errors() {
        for json in [
            r#"{"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 5, "moe_intermediate_size": 8}"#,
            r#"{"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 0, "moe_intermediate_size": 8}"#,
            r#"{"model_type": "qwen3_moe", "num_experts": 4}"#,
        ] {
            let c = HfConfig::from_json_str(json).expect("config");
            assert!(MoeConfig::from_hf(&c, 2).is_err(), "{json}");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut v = [1.0f32, 3.0, 2.0, -50.0];
        softmax(&mut v);
        assert!((v.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(v[1] > v[2] && v[2] > v[0] && v[0] > v[3]);
    }
}
