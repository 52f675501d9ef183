//! A bf16 checkpoint on the default CPU backend. Where the CPU has AVX512_BF16 its bf16-stored
//! matrices run as bf16 × bf16 with f32 sums (activations rounded to bf16, as llama.cpp's BF16
//! dot rounds them); elsewhere with f32 activations. Either way the logits must stay within bf16
//! rounding of the f32 original (the tiny Llama fixture, whose f32 logits equal transformers'),
//! and a stream's logits must not depend on the streams batched beside it.

use std::path::{Path, PathBuf};

use anelm_engine::{CpuBackend, LogitsMode, StepItem, load_model_weights};
use serde_json::Value;

mod common;
use common::{all_logits, cosine};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama")
}

/// The fixture directory with its F32 safetensors rewritten as BF16 (round to nearest even).
fn bf16_copy(dst: &Path) {
    let src = fixture_dir();
    std::fs::create_dir_all(dst).expect("mkdir");
    std::fs::copy(src.join("config.json"), dst.join("config.json")).expect("copy config");
    let bytes = std::fs::read(src.join("model.safetensors")).expect("read safetensors");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let data = &bytes[8 + n..];
    let mut names: Vec<&String> = header.keys().filter(|k| *k != "__metadata__").collect();
    names.sort();
    let (mut out_header, mut out_data) = (serde_json::Map::new(), Vec::new());
    for name in names {
        let meta = &header[name];
        assert_eq!(meta["dtype"], "F32", "{name}");
        let offs: Vec<usize> = meta["data_offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .map(|v| v.as_u64().expect("offset") as usize)
            .collect();
        let start = out_data.len();
        for c in data[offs[0]..offs[1]].chunks_exact(4) {
            let v = f32::from_le_bytes(c.try_into().expect("4 bytes"));
            out_data.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes());
        }
        out_header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": meta["shape"], "data_offsets": [start, out_data.len()]}),
        );
    }
    let mut head = serde_json::to_vec(&Value::Object(out_header)).expect("json");
    while head.len() % 8 != 0 {
        head.push(b' ');
    }
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend(head);
    file.extend(out_data);
    std::fs::write(dst.join("model.safetensors"), file).expect("write bf16 safetensors");
}

#[test]
fn a_bf16_checkpoint_stays_within_bf16_rounding_and_batches_without_mixing() {
    let dir = std::env::temp_dir().join(format!("anelm-bf16-checkpoint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    bf16_copy(&dir);
    let backend = CpuBackend::new();
    let f32_model = load_model_weights(&fixture_dir(), &backend, &mut |_, _| {}).expect("f32 model");
    let bf16_model = load_model_weights(&dir, &backend, &mut |_, _| {}).expect("bf16 model");
    let vocab = bf16_model.info().vocab_size as u32;
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % vocab).collect();
    let want = all_logits(f32_model.as_ref(), &tokens);
    let got = all_logits(bf16_model.as_ref(), &tokens);
    let mut worst = 1f64;
    for (pos, (g, w)) in got.iter().zip(&want).enumerate() {
        let cos = cosine(g, w);
        worst = worst.min(cos);
        assert!(cos >= 0.999, "position {pos}: cosine {cos} to the f32 model");
    }
    eprintln!("bf16 checkpoint: lowest cosine to f32 1 - {:.2e}", 1.0 - worst);

    // Two streams in one forward give each the bits it gets alone.
    let other: Vec<u32> = (0..13u32).map(|i| (i * 11 + 3) % vocab).collect();
    let alone = [
        all_logits(bf16_model.as_ref(), &tokens),
        all_logits(bf16_model.as_ref(), &other),
    ];
    let mut sessions = [bf16_model.new_session(64), bf16_model.new_session(64)];
    let [s0, s1] = &mut sessions;
    let batched = bf16_model
        .forward(&mut [
            StepItem {
                session: s0,
                tokens: &tokens,
                logits: LogitsMode::All,
            },
            StepItem {
                session: s1,
                tokens: &other,
                logits: LogitsMode::All,
            },
        ])
        .expect("batched forward");
    let rows: Vec<&[f32]> = (0..batched.lanes()).map(|l| batched.lane(l)).collect();
    let expected: Vec<&[f32]> = alone.iter().flatten().map(Vec::as_slice).collect();
    assert_eq!(rows.len(), expected.len());
    for (i, (r, e)) in rows.iter().zip(&expected).enumerate() {
        assert!(
            r.iter().zip(e.iter()).all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {i}: batched logits differ from the stream alone"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
