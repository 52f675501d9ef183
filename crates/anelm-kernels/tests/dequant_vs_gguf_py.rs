//! K-quant, IQ4, Q5_1 and MXFP4 dequantisation against an independent implementation: random Q4_K,
//! Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, Q5_1 and MXFP4 blocks (MXFP4's exponents including both
//! subnormal ones) and the values the PyPI `gguf` package's numpy dequantizers give for them
//! (`tests/fixtures/dequant-gguf-py.json`, made by `scripts/make-dequant-fixtures.sh`). This is
//! where each layout is checked against someone else's reading of it;
//! the row-major and packed kernels are then checked against the dequantised rows
//! (`matmul_vs_reference.rs`, `simd_vs_scalar.rs`, `packed.rs`).

use anelm_kernels::{WeightFormat, dequantize_row};

fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dequant-gguf-py.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read the fixture")).expect("parse the fixture")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn quantised_blocks_dequantise_as_the_gguf_package_does() {
    let fx = fixture();
    for fmt in [
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::IQ4_NL,
        WeightFormat::Q5_1,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::IQ4_XS,
        WeightFormat::MXFP4,
    ] {
        let case = &fx[fmt.name()];
        let bytes = hex(case["bytes"].as_str().expect("bytes"));
        let want: Vec<f32> = case["f32_bits"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| f32::from_bits(v.as_u64().expect("bits") as u32))
            .collect();
        assert_eq!(
            bytes.len() / fmt.block_bytes() * fmt.block_elems(),
            want.len(),
            "{fmt:?}"
        );
        let mut got = vec![f32::NAN; want.len()];
        dequantize_row(fmt, &bytes, &mut got).expect("dequantize");
        let mut nonzero = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // numpy may order the scale products differently: a few ulps.
            let tol = 4.0 * f32::EPSILON * w.abs().max(1e-6);
            assert!((g - w).abs() <= tol, "{fmt:?} value {i}: {g} vs gguf {w}");
            nonzero += usize::from(*w != 0.0);
        }
        assert!(nonzero > want.len() / 2, "{fmt:?}: a fixture of zeros proves nothing");
    }
}
