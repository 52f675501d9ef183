//! What Qwen3.5's Gated DeltaNet costs per token and value head in a prefill chunk: one layer's
//! `GatedDeltaNet::forward` over a chunk of lanes of one session (the conv, the recurrence and the
//! gated norm; no projections), at Qwen3.5-0.8B's shapes (16 key and 16 value heads of 128,
//! conv kernel 4) unless told otherwise, random inputs, on the kernel pool.
//!
//!   cargo bench -p anelm-engine --bench deltanet [-- LANES [V_HEADS]]
//!
//! Prints the median and range of 9 runs (wall clock) per chunk and per token·head; multiply by
//! the model's DeltaNet layers and value heads to get its share of a prefill.

use std::time::Instant;

use anelm_engine::Batch;
use anelm_engine::arch::deltanet::{DeltaNetShape, GatedDeltaNet, VHeadOrder};

/// A small deterministic generator (xorshift), values in [-1, 1).
fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let lanes = args.first().copied().unwrap_or(512);
    let hv = args.get(1).copied().unwrap_or(16);
    let shape = DeltaNetShape {
        n_k_heads: 16.min(hv),
        n_v_heads: hv,
        k_dim: 128,
        v_dim: 128,
        conv_kernel: 4,
    };
    let (cd, kk) = (shape.conv_dim(), shape.conv_kernel);
    let layer = GatedDeltaNet::new(
        shape,
        noise(1, cd * kk).iter().map(|w| 0.5 * w).collect(),
        noise(2, hv).iter().map(|a| -(0.5 + 0.4 * a).exp()).collect(),
        noise(3, hv),
        noise(4, shape.v_dim).iter().map(|w| 1.0 + 0.1 * w).collect(),
        1e-6,
        VHeadOrder::Grouped,
    )
    .expect("a valid layer");
    let proj = Batch::from_vec(lanes, shape.proj_width(), noise(5, lanes * shape.proj_width())).expect("sizes");
    let lane_state = vec![0usize; lanes];
    let (mut act, mut out) = (Batch::zeros(0, 0), Batch::zeros(0, 0));
    let mut times = Vec::new();
    for run in 0..10 {
        let mut st = shape.new_state();
        let t = Instant::now();
        layer
            .forward(&mut [&mut st], &lane_state, &proj, &mut act, &mut out)
            .expect("forward");
        if run > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
        assert!(out.as_slice().iter().all(|x| x.is_finite()), "finite outputs");
    }
    times.sort_by(f64::total_cmp);
    let per = |t: f64| t * 1e9 / (lanes * hv) as f64;
    println!(
        "deltanet forward, {lanes} lanes x {hv} value heads (dk = dv = 128), {} threads: median {:.3} ms ({:.3}-{:.3}), {:.0} ns per token-head ({:.0}-{:.0})",
        anelm_kernels::pool::global().threads(),
        times[4] * 1e3,
        times[0] * 1e3,
        times[8] * 1e3,
        per(times[4]),
        per(times[0]),
        per(times[8]),
    );
}
