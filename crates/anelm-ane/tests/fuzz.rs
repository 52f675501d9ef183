//! The emulator never panics: random text, and valid programs of every kernel kind mutated at
//! the character level (deletions, duplications, digit changes, token swaps) or with corrupted
//! blob bytes, either compile — and then evaluate or fail cleanly — or are refused with an error.

use anelm_ane::{AneDevice, AneKernel, EmuAne, EmuConfig, Limits, WeightMode, lower};
use anelm_mil::WeightFiles;
use proptest::prelude::*;

/// Small limits so that a mutated shape cannot ask for gigabytes.
fn emu() -> EmuAne {
    EmuAne::new(EmuConfig {
        limits: Limits {
            max_dim: 4096,
            max_tensor_elements: 1 << 18,
            max_kernel_const_bytes: 1 << 20,
            ..Limits::default()
        },
        ..EmuConfig::default()
    })
}

fn seeds() -> Vec<(String, WeightFiles)> {
    let kernels = [
        AneKernel::Linear { rows: 8, cols: 4 },
        AneKernel::FusedLinear {
            parts: vec![4, 2, 2],
            cols: 4,
        },
        AneKernel::LinearResidual { rows: 4, cols: 8 },
        AneKernel::SwiGluFfn { hidden: 4, inter: 8 },
        AneKernel::SwiGluFfnResidual { hidden: 4, inter: 8 },
        AneKernel::FfnChunk { hidden: 4, chunk: 4 },
        AneKernel::LmHeadChunk { rows: 16, cols: 4 },
    ];
    let mut out = Vec::new();
    for mode in [WeightMode::Fp16, WeightMode::Int8 { block: Some(2) }] {
        for k in &kernels {
            let ws: Vec<Vec<f32>> = k
                .weights()
                .iter()
                .map(|w| (0..w.rows * w.cols).map(|i| (i as f32 * 0.37).sin()).collect())
                .collect();
            let refs: Vec<&[f32]> = ws.iter().map(Vec::as_slice).collect();
            let low = lower(k, &refs, mode).unwrap();
            out.push((low.mil_text(), low.weights));
        }
    }
    out.push((extra_ops_program(), WeightFiles::new()));
    out
}

/// A program exercising the other whitelisted ops, so mutations reach their executors.
fn extra_ops_program() -> String {
    let n = |s: &str| format!("[name = tensor<string, []>(\"{s}\")]");
    let c = |ty: &str, name: &str, val: &str| {
        format!("        {ty} {name} = const()[name = tensor<string, []>(\"{name}\"), val = {ty}({val})];\n")
    };
    let body = [
        c("tensor<int32, [4]>", "sb", "[0, 0, 0, 0]"),
        c("tensor<int32, [4]>", "ss", "[1, 4, 1, -1]"),
        format!(
            "        tensor<fp16, [1, 4, 1, 32]> h = slice_by_size(begin = sb, size = ss, x = x){};\n",
            n("h")
        ),
        c("tensor<int32, [4]>", "rs", "[1, 1, 4, 32]"),
        format!(
            "        tensor<fp16, [1, 1, 4, 32]> r = reshape(shape = rs, x = h){};\n",
            n("r")
        ),
        c("tensor<int32, [4]>", "perm", "[0, 1, 3, 2]"),
        format!(
            "        tensor<fp16, [1, 1, 32, 4]> t = transpose(perm = perm, x = r){};\n",
            n("t")
        ),
        c("tensor<bool, []>", "fx", "false"),
        format!(
            "        tensor<fp16, [1, 1, 32, 32]> mm = matmul(transpose_x = fx, transpose_y = fx, x = t, y = r){};\n",
            n("mm")
        ),
        c("tensor<int32, []>", "sax", "-1"),
        format!(
            "        tensor<fp16, [1, 1, 32, 32]> sm = softmax(axis = sax, x = mm){};\n",
            n("sm")
        ),
        c("tensor<int32, [1]>", "axes", "[-2]"),
        c("tensor<bool, []>", "kd", "true"),
        format!(
            "        tensor<fp16, [1, 1, 1, 32]> rsum = reduce_sum(axes = axes, keep_dims = kd, x = sm){};\n",
            n("rsum")
        ),
        c("tensor<fp16, []>", "half", "0.5"),
        format!(
            "        tensor<fp16, [1, 1, 1, 32]> p = pow(x = rsum, y = half){};\n",
            n("p")
        ),
        format!("        tensor<fp16, [1, 8, 1, 32]> s = silu(x = x){};\n", n("s")),
        format!("        tensor<fp16, [1, 8, 1, 32]> d = sub(x = s, y = p){};\n", n("d")),
        c("tensor<int32, []>", "ax", "1"),
        c("tensor<bool, []>", "ci", "false"),
        format!(
            "        tensor<fp16, [1, 16, 1, 32]> y = concat(axis = ax, interleave = ci, values = (d, x)){};\n",
            n("y")
        ),
    ]
    .concat();
    format!(
        "program(1.0)\n[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{{{\"coremlc-version\", \"3505.4.1\"}}}})]\n{{\n    func main<ios16>(tensor<fp16, [1, 8, 1, 32]> x) {{\n{body}    }} -> (y);\n}}\n"
    )
}

/// Compile; if accepted, load and evaluate on zero and on patterned inputs. Must not panic.
fn exercise(text: &str, weights: &WeightFiles) -> bool {
    let ane = emu();
    let Ok(h) = ane.compile(text, weights) else {
        return false;
    };
    ane.load(h).unwrap();
    let sig = ane.signature(h).unwrap();
    let mut inputs: Vec<anelm_ane::Surface> = sig
        .inputs
        .iter()
        .map(|&(c, w)| anelm_ane::Surface::with_lanes(c, w))
        .collect();
    let mut outputs = sig.output_surfaces();
    let refs: Vec<&anelm_ane::Surface> = inputs.iter().collect();
    let _ = ane.evaluate(h, &refs, &mut outputs);
    for s in &mut inputs {
        for (i, v) in s.halves_mut().iter_mut().enumerate() {
            *v = anelm_mil::f16::from_f32(((i % 17) as f32 - 8.0) * 0.25);
        }
    }
    let refs: Vec<&anelm_ane::Surface> = inputs.iter().collect();
    let _ = ane.evaluate(h, &refs, &mut outputs);
    true
}

#[test]
fn every_seed_is_accepted_and_runs() {
    for (text, w) in seeds() {
        assert!(
            exercise(&text, &w),
            "seed refused:\n{text}\n{:?}",
            emu().compile(&text, &w).err()
        );
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Duplicate(usize, usize),
    Digit(usize, u8),
    Replace(usize, String),
    SwapLines(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let tokens = prop::sample::select(vec![
        "tile",
        "conv",
        "fp32",
        "int8",
        "1",
        "0",
        "-1",
        "65537",
        "(",
        ")",
        "[",
        "]",
        ",",
        "x",
        "y",
        "ios18",
        "1.3",
        "true",
        "BLOBFILE",
        "uint64",
        "\"",
        "=",
        ";",
        "slice_by_index",
        "reshape",
        "add",
        "concat",
        "matmul",
    ]);
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(a, n)| Edit::Delete(a, n)),
        (any::<usize>(), 1usize..80).prop_map(|(a, n)| Edit::Duplicate(a, n)),
        (any::<usize>(), 0u8..10).prop_map(|(a, d)| Edit::Digit(a, d)),
        (any::<usize>(), tokens).prop_map(|(a, t)| Edit::Replace(a, t.to_string())),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
    ]
}

fn apply(text: &str, e: &Edit) -> String {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len().max(1);
    let s = |v: &[char]| v.iter().collect::<String>();
    match e {
        Edit::Delete(a, len) => {
            let a = a % n;
            let b = (a + len).min(chars.len());
            s(&chars[..a]) + &s(&chars[b..])
        }
        Edit::Duplicate(a, len) => {
            let a = a % n;
            let b = (a + len).min(chars.len());
            s(&chars[..b]) + &s(&chars[a..])
        }
        Edit::Digit(a, d) => {
            let digits: Vec<usize> = chars
                .iter()
                .enumerate()
                .filter(|(_, c)| c.is_ascii_digit())
                .map(|(i, _)| i)
                .collect();
            if digits.is_empty() {
                return text.to_string();
            }
            let mut c = chars.clone();
            c[digits[a % digits.len()]] = char::from(b'0' + d);
            s(&c)
        }
        Edit::Replace(a, tok) => {
            // Replace the identifier/number/punctuation run at a.
            let a = a % n;
            let mut b = a;
            while b < chars.len() && chars[b].is_ascii_alphanumeric() {
                b += 1;
            }
            let b = b.max((a + 1).min(chars.len()));
            s(&chars[..a]) + tok + &s(&chars[b..])
        }
        Edit::SwapLines(a, b) => {
            let mut lines: Vec<&str> = text.lines().collect();
            let m = lines.len().max(1);
            if !lines.is_empty() {
                lines.swap(a % m, b % m);
            }
            lines.join("\n") + "\n"
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_text_never_panics(text in "\\PC{0,300}") {
        exercise(&text, &WeightFiles::new());
    }

    #[test]
    fn mutated_programs_never_panic(seed in 0usize..15, edits in prop::collection::vec(edit(), 1..4)) {
        let seeds = seeds();
        let (text, weights) = &seeds[seed % seeds.len()];
        let mut t = text.clone();
        for e in &edits {
            t = apply(&t, e);
        }
        exercise(&t, weights);
    }

    #[test]
    fn corrupted_blobs_never_panic(seed in 0usize..14, at in any::<usize>(), byte in any::<u8>(), cut in any::<bool>()) {
        let seeds = seeds();
        let (text, weights) = &seeds[seed % seeds.len()];
        let mut bad = WeightFiles::new();
        for (i, (p, b)) in weights.iter().enumerate() {
            let mut b = b.to_vec();
            if i == at % weights.len().max(1) {
                let k = (at / 7) % b.len().max(1);
                if cut { b.truncate(k) } else if let Some(x) = b.get_mut(k) { *x = byte }
            }
            bad.insert(p, b);
        }
        exercise(text, &bad);
    }
}
