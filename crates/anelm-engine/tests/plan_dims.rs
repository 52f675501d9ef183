//! `anelm plan` for every architecture the loader runs, from a `config.json` and from a GGUF
//! file's metadata: the planner's dimensions and kernels match what the architecture compiles.

use std::path::{Path, PathBuf};

use anelm_ane::{AneKernel, BlockLayout, KernelRole, LayerKind, PlanOptions, SlidingWindow, plan_model};
use anelm_engine::plan_dims::{model_dims, model_kernels};

fn hf(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

/// A fresh file under the system temp dir, removed on drop.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

enum Val {
    U32(u32),
    F32(f32),
    Bools(Vec<bool>),
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// A GGUF v3 file with `kv` metadata and one F32 `token_embd.weight` of `[hidden, vocab]`.
fn gguf(tag: &str, arch: &str, kv: &[(&str, Val)], hidden: usize, vocab: usize) -> TempFile {
    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(((kv.len() + 1) as u64).to_le_bytes());
    put_str(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    put_str(&mut b, arch);
    for (k, v) in kv {
        put_str(&mut b, &format!("{arch}.{k}"));
        match v {
            Val::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Val::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Val::Bools(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(7u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                b.extend(v.iter().map(|&x| u8::from(x)));
            }
        }
    }
    put_str(&mut b, "token_embd.weight");
    b.extend(2u32.to_le_bytes());
    b.extend((hidden as u64).to_le_bytes());
    b.extend((vocab as u64).to_le_bytes());
    b.extend(0u32.to_le_bytes()); // F32
    b.extend(0u64.to_le_bytes());
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend(vec![0u8; hidden * vocab * 4]);
    let path = std::env::temp_dir().join(format!("anelm-plan-dims-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&path, b).expect("write gguf");
    TempFile(path)
}

fn common(hidden: u32, ffn: u32, layers: u32, heads: u32, kv: u32, head_dim: u32) -> Vec<(&'static str, Val)> {
    vec![
        ("embedding_length", Val::U32(hidden)),
        ("feed_forward_length", Val::U32(ffn)),
        ("block_count", Val::U32(layers)),
        ("attention.head_count", Val::U32(heads)),
        ("attention.head_count_kv", Val::U32(kv)),
        ("attention.key_length", Val::U32(head_dim)),
        ("attention.layer_norm_rms_epsilon", Val::F32(1e-6)),
    ]
}

/// Each layer's mixer as the architecture's kernel list has it.
fn layer_kinds(path: &Path) -> Vec<LayerKind> {
    model_kernels(path)
        .expect("kernels")
        .layers
        .iter()
        .map(|l| l.kind)
        .collect()
}

fn kernels_of_layer(path: &Path, layer: usize) -> Vec<(KernelRole, AneKernel)> {
    let p = plan_model(&model_kernels(path).expect("kernels"), &PlanOptions::default()).expect("plan");
    p.layers[layer]
        .kernels
        .iter()
        .map(|k| (k.role, k.kernel.clone()))
        .collect()
}

#[test]
fn every_hf_fixture_plans_with_its_loader_kernels() {
    // Llama, Qwen2 and Qwen3: fused QKV, output + residual, SwiGLU + residual (Qwen2's biases
    // are added on the host).
    for (name, q, kv) in [("llama", 64, 32), ("qwen2", 64, 32), ("qwen3", 128, 64)] {
        let d = model_dims(&hf(name)).expect(name);
        assert_eq!(d.block, BlockLayout::PreNorm, "{name}");
        let ks = kernels_of_layer(&hf(name), 0);
        assert_eq!(ks.len(), 3, "{name}: {ks:?}");
        assert_eq!(
            ks[0].1,
            AneKernel::FusedLinear {
                parts: vec![q, kv, kv],
                cols: d.hidden
            },
            "{name}"
        );
        assert_eq!(ks[1].0, KernelRole::OutputProjResidual);
        assert_eq!(ks[2].0, KernelRole::FfnResidual);
    }
    // Qwen3.5 (multimodal and text-only configs): DeltaNet layers fuse qkv, z, b and a.
    for name in ["qwen3_5", "qwen3_5_text"] {
        let d = model_dims(&hf(name)).expect(name);
        let la = d.linear_attention.expect("linear attention");
        let ks = kernels_of_layer(&hf(name), 0);
        let (k, v) = (la.key_heads * la.key_head_dim, la.value_heads * la.value_head_dim);
        assert_eq!(
            ks[0].1,
            AneKernel::FusedLinear {
                parts: vec![2 * k + v, v, la.value_heads, la.value_heads],
                cols: d.hidden
            },
            "{name}"
        );
    }
    // Gemma 3: 4 kernels per layer, local layers from layer_types (global every 3rd here).
    let d = model_dims(&hf("gemma3")).expect("gemma3");
    assert_eq!(d.block, BlockLayout::Sandwich);
    assert_eq!(d.sliding_window, Some(SlidingWindow { window: 6 }));
    let kinds = layer_kinds(&hf("gemma3"));
    assert_eq!(
        kinds,
        [
            LayerKind::SlidingAttention,
            LayerKind::SlidingAttention,
            LayerKind::Attention,
            LayerKind::SlidingAttention
        ]
    );
    let ks = kernels_of_layer(&hf("gemma3"), 0);
    let roles: Vec<_> = ks.iter().map(|(r, _)| *r).collect();
    assert_eq!(
        roles,
        [
            KernelRole::InputProj,
            KernelRole::OutputProj,
            KernelRole::FfnGateUp,
            KernelRole::FfnDown
        ]
    );
    assert_eq!(ks[1].1, AneKernel::Linear { rows: 64, cols: 64 });
    assert_eq!(
        ks[2].1,
        AneKernel::FusedLinear {
            parts: vec![96, 96],
            cols: 64
        }
    );
    assert_eq!(ks[3].1, AneKernel::Linear { rows: 64, cols: 96 });
    let p = plan_model(&model_kernels(&hf("gemma3")).expect("kernels"), &PlanOptions::default()).expect("plan");
    assert_eq!(p.dispatches_per_token(), 4 * 4 + 1);
}

#[test]
fn every_gguf_architecture_plans_from_its_metadata() {
    let mut llama = common(64, 128, 2, 4, 2, 16);
    llama.push(("vocab_size", Val::U32(300)));
    let f = gguf("llama", "llama", &llama, 64, 300);
    let d = model_dims(&f.0).expect("llama");
    assert_eq!((d.hidden, d.intermediate, d.layers, d.vocab), (64, 128, 2, 300));
    assert_eq!(kernels_of_layer(&f.0, 1).len(), 3);

    let mut qwen3 = common(64, 128, 3, 4, 2, 32);
    qwen3.push(("vocab_size", Val::U32(300)));
    let f = gguf("qwen3", "qwen3", &qwen3, 64, 300);
    let d = model_dims(&f.0).expect("qwen3");
    assert_eq!((d.heads, d.kv_heads, d.head_dim, d.layers), (4, 2, 32, 3));

    let mut qwen35 = common(64, 128, 4, 4, 2, 32);
    qwen35.extend([
        ("ssm.time_step_rank", Val::U32(4)),
        ("ssm.inner_size", Val::U32(64)),
        ("ssm.group_count", Val::U32(2)),
        ("ssm.state_size", Val::U32(16)),
        ("ssm.conv_kernel", Val::U32(4)),
        ("rope.dimension_count", Val::U32(8)),
        ("attention.recurrent_layers", Val::Bools(vec![true, true, true, false])),
    ]);
    let f = gguf("qwen35", "qwen35", &qwen35, 64, 300);
    let d = model_dims(&f.0).expect("qwen35");
    let la = d.linear_attention.expect("hybrid");
    assert_eq!(
        (la.value_heads, la.key_heads, la.key_head_dim, la.value_head_dim),
        (4, 2, 16, 16)
    );
    assert_eq!(
        layer_kinds(&f.0),
        [
            LayerKind::LinearAttention,
            LayerKind::LinearAttention,
            LayerKind::LinearAttention,
            LayerKind::Attention
        ]
    );
    assert_eq!(d.vocab, 300);
    assert!(d.attn_output_gate);
    assert_eq!(
        kernels_of_layer(&f.0, 3)[0].1.output_channels(),
        2 * 4 * 32 + 2 * 2 * 32
    );

    let mut gemma = common(64, 96, 6, 4, 1, 16);
    gemma.extend([
        ("vocab_size", Val::U32(300)),
        ("attention.sliding_window", Val::U32(512)),
        ("attention.sliding_window_pattern", Val::U32(3)),
    ]);
    let f = gguf("gemma3", "gemma3", &gemma, 64, 300);
    let d = model_dims(&f.0).expect("gemma3");
    assert_eq!(d.sliding_window, Some(SlidingWindow { window: 512 }));
    let global = |i: usize| (i + 1) % 3 == 0;
    let want: Vec<_> = (0..6)
        .map(|i| {
            if global(i) {
                LayerKind::Attention
            } else {
                LayerKind::SlidingAttention
            }
        })
        .collect();
    assert_eq!(layer_kinds(&f.0), want);
    assert_eq!(d.block, BlockLayout::Sandwich);
    assert_eq!(kernels_of_layer(&f.0, 2).len(), 4);

    // An architecture the loader does not run is named in the error, with the ones it does.
    let f = gguf("falcon", "falcon", &common(64, 96, 2, 4, 4, 16), 64, 300);
    let err = format!("{:#}", model_dims(&f.0).expect_err("falcon"));
    assert!(err.contains("'falcon'") && err.contains("gemma3"), "{err}");
}

/// LFM2: short-convolution layers (in projection B ‖ C ‖ x, out projection plus residual) beside
/// attention layers, each with the SwiGLU FFN; planned layer by layer in the fixture's order.
#[test]
fn lfm2_plans_its_short_convolutions_and_attention() {
    let path = hf("lfm2");
    assert_eq!(
        layer_kinds(&path),
        [
            LayerKind::ShortConv,
            LayerKind::Attention,
            LayerKind::ShortConv,
            LayerKind::ShortConv
        ]
    );
    let d = model_dims(&path).expect("dims");
    assert_eq!(
        (d.hidden, d.intermediate),
        (64, 128),
        "the FFN width transformers derives"
    );
    let conv = kernels_of_layer(&path, 0);
    assert_eq!(
        conv[0],
        (
            KernelRole::InputProj,
            AneKernel::FusedLinear {
                parts: vec![3 * 64],
                cols: 64
            }
        )
    );
    assert_eq!(
        conv[1],
        (
            KernelRole::OutputProjResidual,
            AneKernel::LinearResidual { rows: 64, cols: 64 }
        )
    );
    let p = plan_model(&model_kernels(&path).expect("kernels"), &PlanOptions::default()).expect("plan");
    assert_eq!(p.layers[0].kind, LayerKind::ShortConv);
    assert_eq!(p.dispatches_per_token(), 4 * 3 + 1);
}

/// A mixture-of-experts model says why the ANE planner does not take it (experts chosen per
/// token at run time) instead of planning every expert as if all ran.
#[test]
fn a_mixture_of_experts_is_refused_by_the_planner_with_the_reason() {
    let err = format!("{:#}", model_kernels(&hf("qwen3_moe")).expect_err("MoE"));
    assert!(
        err.contains("mixture-of-experts") && err.contains("2 of 8") && err.contains("--device cpu"),
        "{err}"
    );
}

/// Layer kinds in any order plan: each layer's kind comes from the architecture's own kernel
/// list, not from a periodic pattern (a Qwen3.5 whose attention layer is second, not fourth).
#[test]
fn an_irregular_layer_order_plans_layer_by_layer() {
    let mut qwen35 = common(64, 128, 4, 4, 2, 32);
    qwen35.extend([
        ("ssm.time_step_rank", Val::U32(4)),
        ("ssm.inner_size", Val::U32(64)),
        ("ssm.group_count", Val::U32(2)),
        ("ssm.state_size", Val::U32(16)),
        ("ssm.conv_kernel", Val::U32(4)),
        ("attention.recurrent_layers", Val::Bools(vec![true, false, true, true])),
    ]);
    let f = gguf("qwen35-odd", "qwen35", &qwen35, 64, 300);
    let want = [
        LayerKind::LinearAttention,
        LayerKind::Attention,
        LayerKind::LinearAttention,
        LayerKind::LinearAttention,
    ];
    assert_eq!(layer_kinds(&f.0), want);
    let p = plan_model(&model_kernels(&f.0).expect("kernels"), &PlanOptions::default()).expect("plan");
    let planned: Vec<_> = p.layers.iter().map(|l| l.kind).collect();
    assert_eq!(planned, want);
    // The attention layer's input projection carries the output gate; the DeltaNet ones do not.
    assert_eq!(
        kernels_of_layer(&f.0, 1)[0].1.output_channels(),
        2 * 4 * 32 + 2 * 2 * 32
    );
    assert_ne!(kernels_of_layer(&f.0, 0)[0].1, kernels_of_layer(&f.0, 1)[0].1);
}

/// The Gemma 3 270M GGUF (`scripts/fetch-gemma3.sh`; `scripts/test.sh` fetches it).
#[test]
fn gemma3_270m_gguf_plans() {
    let home = std::env::var_os("HOME").expect("HOME");
    let path = Path::new(&home).join(".cache/anelm/models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-gemma3.sh (scripts/test.sh does)",
        path.display()
    );
    let d = model_dims(&path).expect("dims");
    assert_eq!((d.hidden, d.layers, d.vocab), (640, 18, 262_144));
    let p = plan_model(&model_kernels(&path).expect("kernels"), &PlanOptions::default()).expect("plan");
    assert_eq!(p.dispatches_per_token(), 18 * 4 + 4);
}
