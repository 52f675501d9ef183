//! Property and fuzz-style tests.
//!
//! * Round trip: for random IR programs (both dialects), `parse(print(p)) == p` and
//!   `print(parse(print(p))) == print(p)`.
//! * Random well-typed kernels from the builder check, print and parse back.
//! * The parser and checker never panic on random, truncated or mutated text, and any
//!   text they accept prints to a fixed point.
//! * The blob reader never panics on random bytes, and writer → reader is the identity.
//!
//! `PROPTEST_CASES=20000 cargo test -p anelm-mil --release --test proptests` for a longer run.

use anelm_mil::{
    Argument, BlobData, DType, Function, FunctionBuilder, Literal, Operand, Opset, Program, ProgramVersion, Statement,
    TensorData, TensorType, Value, WeightFiles, f16, parse_program, read_blob, write_blob,
};
use proptest::prelude::*;

const KNOWN_OPS: &[&str] = &[
    "const",
    "conv",
    "matmul",
    "add",
    "sub",
    "mul",
    "real_div",
    "pow",
    "sqrt",
    "sigmoid",
    "silu",
    "softmax",
    "concat",
    "slice_by_index",
    "slice_by_size",
    "reshape",
    "transpose",
    "reduce_sum",
    "cast",
    "constexpr_blockwise_shift_scale",
    "constexpr_affine_dequantize",
    "quantize",
    "dequantize",
    "tile",
];

const PARAMS: &[&str] = &[
    "x",
    "y",
    "weight",
    "bias",
    "axis",
    "values",
    "interleave",
    "begin",
    "end",
    "size",
    "stride",
    "begin_mask",
    "end_mask",
    "squeeze_mask",
    "shape",
    "perm",
    "axes",
    "keep_dims",
    "dtype",
    "data",
    "scale",
    "offset",
    "groups",
    "strides",
    "pad",
    "pad_type",
    "dilations",
    "transpose_x",
    "transpose_y",
    "reps",
    "input",
    "output_dtype",
];

fn ident() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-e]".prop_map(String::from),
        2 => "[A-Za-z_][A-Za-z0-9_]{0,6}",
        1 => prop::sample::select(vec!["tensor", "fp16", "int32", "string", "BLOBFILE", "true", "inf", "func"])
            .prop_map(String::from),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn tensor_type() -> impl Strategy<Value = TensorType> {
    (dtype(), prop::collection::vec(1usize..4, 0..4)).prop_map(|(d, s)| TensorType::new(d, s))
}

fn fp16_value() -> impl Strategy<Value = f16> {
    any::<u16>()
        .prop_map(f16::from_bits)
        .prop_filter("not NaN", |v| !v.is_nan())
}

fn data(d: DType, n: usize) -> BoxedStrategy<TensorData> {
    use prop::collection::vec;
    use prop::num::f32 as pf;
    match d {
        DType::Fp16 => vec(fp16_value(), n).prop_map(TensorData::Fp16).boxed(),
        DType::Fp32 => vec(pf::NORMAL | pf::SUBNORMAL | pf::ZERO | pf::INFINITE, n)
            .prop_map(TensorData::Fp32)
            .boxed(),
        DType::Int8 => vec(any::<i8>(), n).prop_map(TensorData::Int8).boxed(),
        DType::Int32 => vec(any::<i32>(), n).prop_map(TensorData::Int32).boxed(),
        DType::Uint64 => vec(any::<u64>(), n).prop_map(TensorData::Uint64).boxed(),
        DType::Bool => vec(any::<bool>(), n).prop_map(TensorData::Bool).boxed(),
        DType::String => vec("[ -~\n\t]{0,6}", n).prop_map(TensorData::String).boxed(),
    }
}

fn literal() -> impl Strategy<Value = Literal> {
    prop_oneof![
        4 => tensor_type().prop_flat_map(|ty| {
            let n = ty.num_elements().unwrap_or(0);
            data(ty.dtype, n).prop_map(move |data| Literal::Tensor { ty: ty.clone(), data })
        }),
        1 => (tensor_type(), "[ -~]{0,12}", any::<u64>()).prop_map(|(ty, path, offset)| Literal::Blob { ty, path, offset }),
    ]
}

fn operand() -> impl Strategy<Value = Operand> {
    prop_oneof![3 => ident().prop_map(Operand::Var), 1 => literal().prop_map(Operand::Lit)]
}

fn argument() -> impl Strategy<Value = Argument> {
    prop_oneof![
        3 => operand().prop_map(Argument::Single),
        1 => prop::collection::vec(operand(), 0..3).prop_map(Argument::Tuple),
    ]
}

fn param() -> impl Strategy<Value = String> {
    prop_oneof![3 => prop::sample::select(PARAMS.to_vec()).prop_map(String::from), 1 => ident()]
}

fn statement() -> impl Strategy<Value = Statement> {
    let op = prop_oneof![3 => prop::sample::select(KNOWN_OPS.to_vec()).prop_map(String::from), 1 => ident()];
    let attr_key = prop_oneof![
        prop::sample::select(vec!["name", "val", "scale", "quantized_data"]).prop_map(String::from),
        ident()
    ];
    (
        ident(),
        tensor_type(),
        op,
        prop::collection::vec((param(), argument()), 0..4),
        prop::collection::vec((attr_key, literal()), 0..3),
    )
        .prop_map(|(name, ty, op, inputs, attributes)| Statement {
            output: Value::new(name, ty),
            op,
            inputs,
            attributes,
        })
}

fn opset() -> impl Strategy<Value = Opset> {
    prop::sample::select(vec![Opset::Ios15, Opset::Ios16, Opset::Ios17, Opset::Ios18])
}

fn function() -> impl Strategy<Value = Function> {
    (
        ident(),
        opset(),
        prop::collection::vec((ident(), tensor_type()).prop_map(|(n, t)| Value::new(n, t)), 0..3),
        prop::collection::vec(statement(), 0..5),
        prop::collection::vec(ident(), 0..3),
    )
        .prop_map(|(name, opset, inputs, body, outputs)| Function {
            name,
            opset,
            inputs,
            body,
            outputs,
        })
}

fn program() -> impl Strategy<Value = Program> {
    (
        prop::sample::select(vec![ProgramVersion::V1_0, ProgramVersion::V1_3]),
        prop::collection::vec(("[ -~]{0,8}", "[ -~]{0,8}"), 0..3),
        prop::collection::vec(function(), 0..3),
    )
        .prop_map(|(version, build_info, functions)| Program {
            version,
            build_info,
            functions,
        })
}

/// Any text the parser accepts must check without panicking and print to a fixed point.
fn accepted_text_is_stable(src: &str) {
    if let Ok(p) = parse_program(src) {
        let _ = p.check();
        let _ = WeightFiles::new().resolve_program(&p);
        let t = p.to_string();
        let q = parse_program(&t).unwrap_or_else(|e| panic!("printed text does not parse: {e}\n{t}"));
        assert_eq!(q.to_string(), t);
    }
}

/// A random well-typed kernel: a chain of ops over `[1, C, 1, 32]` surfaces.
fn kernel() -> impl Strategy<Value = (Opset, Vec<(u8, usize)>)> {
    (opset(), prop::collection::vec((0u8..8, 1usize..5), 1..12))
}

fn build_kernel(opset: Opset, steps: &[(u8, usize)]) -> Program {
    let mut f = FunctionBuilder::new("main", opset);
    let x = f.input("x", TensorType::surface(32, 32)).unwrap();
    let r = f.input("r", TensorType::surface(32, 32)).unwrap();
    let ax = f.const_int32("ax", 1).unwrap();
    let ci = f.const_bool("ci", false).unwrap();
    let mut cur = x.clone();
    for (i, &(kind, k)) in steps.iter().enumerate() {
        let name = format!("v{i}");
        let c = cur.ty.shape[1];
        cur = match kind {
            0 => f.sigmoid(&name, &cur).unwrap(),
            1 => f.silu(&name, &cur).unwrap(),
            2 => f.mul(&name, &cur, &cur).unwrap(),
            3 => {
                let w = f.blob(
                    &format!("w{i}"),
                    TensorType::fp16([32, c, 1, 1]),
                    &format!("@model_path/weights/w{i}.bin"),
                );
                f.linear(&name, &cur, &w.unwrap()).unwrap()
            }
            4 => f.concat(&name, &[&cur, &x], &ax, &ci).unwrap(),
            5 => {
                let b = f.const_int32s(&format!("b{i}"), &[0, 0, 0, 0]).unwrap();
                let s = f.const_int32s(&format!("s{i}"), &[1, k.min(c) as i32, 1, -1]).unwrap();
                f.slice_by_size(&name, &cur, &b, &s).unwrap()
            }
            6 => {
                let o = 32 * k;
                let q = f.blob(
                    &format!("q{i}"),
                    TensorType::new(DType::Int8, [o, c, 1, 1]),
                    &format!("@model_path/weights/q{i}.bin"),
                );
                let s = f.blob(
                    &format!("s{i}"),
                    TensorType::fp16([o, 1, 1, 1]),
                    &format!("@model_path/weights/s{i}.bin"),
                );
                match f.constexpr_blockwise_shift_scale(&format!("w{i}"), &q.unwrap(), &s.unwrap()) {
                    Ok(w) => f.linear(&name, &cur, &w).unwrap(),
                    Err(_) => {
                        assert!(opset < Opset::Ios18);
                        f.sigmoid(&name, &cur).unwrap()
                    }
                }
            }
            _ => {
                if c == 32 {
                    f.add(&name, &r, &cur).unwrap()
                } else {
                    f.sub(&name, &cur, &cur).unwrap()
                }
            }
        };
    }
    f.output(&cur).unwrap();
    Program::new(vec![f.finish().unwrap()])
}

const SAMPLE: &str = r#"program(1.3)
[buildInfo = dict<string, string>({{"coremlc-version", "3505.4.1"}})]
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x) {
        string pt = const()[name = string("pt"), val = string("valid")];
        tensor<int32, [2]> st = const()[name = string("st"), val = tensor<int32, [2]>([1,1])];
        tensor<int32, [4]> pd = const()[name = string("pd"), val = tensor<int32, [4]>([0,0,0,0])];
        tensor<int32, [2]> dl = const()[name = string("dl"), val = tensor<int32, [2]>([1,1])];
        int32 gr = const()[name = string("gr"), val = int32(1)];
        tensor<int8, [64, 64, 1, 1]> q = const()[name = string("q"), val = tensor<int8, [64, 64, 1, 1]>(BLOBFILE(path = string("@model_path/weights/q.bin"), offset = uint64(64)))];
        tensor<fp16, [64, 4, 1, 1]> s = const()[name = string("s"), val = tensor<fp16, [64, 4, 1, 1]>(BLOBFILE(path = string("@model_path/weights/s.bin"), offset = uint64(64)))];
        tensor<fp16, [64, 64, 1, 1]> W = constexpr_blockwise_shift_scale(data = q, scale = s)[name = string("W")];
        tensor<fp16, [1, 64, 1, 32]> c = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = W, x = x)[name = string("c")];
        fp16 eps = const()[name = string("eps"), val = fp16(0x1p-3)];
        tensor<int32, [1]> axes = const()[name = string("axes"), val = tensor<int32, [1]>([1])];
        bool kd = const()[name = string("kd"), val = bool(true)];
        tensor<fp16, [1, 1, 1, 32]> r = reduce_sum(axes = axes, keep_dims = kd, x = c)[name = string("r")];
        tensor<fp16, [1, 64, 1, 32]> o = mul(x = c, y = r)[name = string("o")];
        tensor<int32, [4]> b = const()[name = string("b"), val = tensor<int32, [4]>([0, 0, 0, 0])];
        tensor<int32, [4]> e = const()[name = string("e"), val = tensor<int32, [4]>([1, 32, 1, 32])];
        tensor<fp16, [1, 32, 1, 32]> h = slice_by_index(begin = b, end = e, x = o)[name = string("h")];
        tensor<fp16, [1, 1, 2, 2]> m = const()[name = string("m"), val = tensor<fp16, [1, 1, 2, 2]>([0, -65504, -inf, 1e-3])];
    } -> (h, o);
}
"#;

#[test]
fn sample_is_valid() {
    let p = parse_program(SAMPLE).unwrap();
    p.check().unwrap();
    accepted_text_is_stable(SAMPLE);
}

/// Every proper prefix of a valid program is an error with a position (and no panic).
#[test]
fn every_truncation_is_handled() {
    let full = SAMPLE.trim_end().len();
    for i in SAMPLE.char_indices().map(|(i, _)| i).filter(|&i| i < full) {
        let r = parse_program(&SAMPLE[..i]);
        assert!(r.is_err(), "prefix of {i} bytes parsed");
        let e = r.unwrap_err();
        assert!(e.line >= 1 && e.column >= 1);
    }
}

fn param_literal() -> impl Strategy<Value = Literal> {
    let ints = prop::collection::vec(
        prop_oneof![4 => -3i32..70, 1 => Just(i32::MIN), 1 => Just(i32::MAX), 1 => Just(-1)],
        0..6,
    );
    prop_oneof![
        3 => ints.prop_map(|v| Literal::int32s(&v)),
        1 => (-3i32..5).prop_map(Literal::int32),
        1 => any::<bool>().prop_map(Literal::bool),
        1 => prop::collection::vec(any::<bool>(), 0..5).prop_map(|v| {
            Literal::Tensor { ty: TensorType::new(DType::Bool, [v.len()]), data: TensorData::Bool(v) }
        }),
        1 => prop::sample::select(vec!["valid", "same", "custom", "fp16", "fp32", "int8", "string"]).prop_map(Literal::string),
        1 => (tensor_type(), any::<u64>()).prop_map(|(t, o)| Literal::blob(t, "@model_path/weights/w.bin", o)),
    ]
}

/// Programs whose statements use earlier values (v0, v1, …) under real op and parameter
/// names, with hostile constant values: the checker must answer, never panic.
fn semantic_program() -> impl Strategy<Value = Program> {
    let input_ty = (
        prop::sample::select(vec![DType::Fp16, DType::Fp32, DType::Int8]),
        prop::collection::vec(0usize..70, 0..5),
    )
        .prop_map(|(d, s)| TensorType::new(d, s));
    let arg = (0usize..12, any::<bool>(), prop::collection::vec(0usize..12, 0..4));
    let stmt = (
        prop::sample::select(KNOWN_OPS.to_vec()),
        prop::collection::vec((prop::sample::select(PARAMS.to_vec()), arg), 0..6),
        param_literal(),
        tensor_type(),
    );
    (
        prop::collection::vec(input_ty, 1..3),
        prop::collection::vec(stmt, 1..10),
    )
        .prop_map(|(inputs, stmts)| {
            let inputs: Vec<Value> = inputs
                .into_iter()
                .enumerate()
                .map(|(i, t)| Value::new(format!("v{i}"), t))
                .collect();
            let n_in = inputs.len();
            let body = stmts
                .into_iter()
                .enumerate()
                .map(|(i, (op, args, lit, ty))| {
                    let name = format!("v{}", i + n_in);
                    let var = |k: usize| Operand::Var(format!("v{}", k % (i + n_in)));
                    let inputs = args
                        .into_iter()
                        .map(|(k, (a, tuple, many))| {
                            let arg = if tuple {
                                Argument::Tuple(many.into_iter().map(var).collect())
                            } else {
                                Argument::Single(var(a))
                            };
                            (k.to_string(), arg)
                        })
                        .collect();
                    let mut attributes = vec![("name".to_string(), Literal::string(name.clone()))];
                    if op == "const" {
                        attributes.push(("val".to_string(), lit));
                    } else {
                        attributes.push(("quantized_data".to_string(), lit.clone()));
                        attributes.push(("scale".to_string(), Literal::fp16(0.5)));
                    }
                    Statement {
                        output: Value::new(name, ty),
                        op: op.to_string(),
                        inputs,
                        attributes,
                    }
                })
                .collect();
            let f = Function {
                name: "main".into(),
                opset: Opset::Ios18,
                inputs,
                body,
                outputs: vec!["v0".into()],
            };
            Program::new(vec![f])
        })
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_ir_round_trips(p in program()) {
        let text = p.to_string();
        let q = parse_program(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&q, &p);
        prop_assert_eq!(q.to_string(), text);
        let _ = q.check();
    }

    #[test]
    fn random_kernels_check_and_round_trip((opset, steps) in kernel()) {
        let p = build_kernel(opset, &steps);
        p.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let text = p.to_string();
        let q = parse_program(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        q.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(q.to_string(), text);
    }

    #[test]
    fn hostile_programs_check_without_panicking(p in semantic_program()) {
        let _ = p.check();
        let text = p.to_string();
        let q = parse_program(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(q.to_string(), text);
        let _ = q.check();
    }

    #[test]
    fn random_text_never_panics(s in "\\PC{0,300}") {
        accepted_text_is_stable(&s);
    }

    #[test]
    fn token_soup_never_panics(toks in prop::collection::vec(prop::sample::select(vec![
        "program", "(", ")", "1.0", "1.3", "[", "]", "{", "}", "<", ">", ",", "=", ";", "->", "func", "main",
        "ios16", "ios18", "tensor", "fp16", "int32", "bool", "string", "uint64", "int8", "const", "conv", "concat",
        "x", "y", "values", "name", "val", "BLOBFILE", "path", "offset", "64", "-1", "0x1p-3", "\"s\"", "true",
        "dict", "buildInfo", "reshape", "shape", "slice_by_index", "begin", "end", "99999999999999999999",
    ]), 0..80)) {
        accepted_text_is_stable(&toks.join(" "));
    }

    #[test]
    fn mutated_text_never_panics(
        pos in 0usize..SAMPLE.len(),
        len in 0usize..40,
        insert in "\\PC{0,6}",
        mode in 0u8..3,
    ) {
        let bytes = SAMPLE.as_bytes();
        let pos = (0..=pos).rev().find(|&i| SAMPLE.is_char_boundary(i)).unwrap_or(0);
        let end = (pos + len).min(bytes.len());
        let end = (end..=bytes.len()).find(|&i| SAMPLE.is_char_boundary(i)).unwrap_or(bytes.len());
        let mutated = match mode {
            0 => format!("{}{}", &SAMPLE[..pos], &SAMPLE[end..]),
            1 => format!("{}{}{}", &SAMPLE[..pos], insert, &SAMPLE[pos..]),
            _ => format!("{}{}{}", &SAMPLE[..pos], insert, &SAMPLE[end..]),
        };
        accepted_text_is_stable(&mutated);
    }

    #[test]
    fn blob_round_trip(bits in prop::collection::vec(any::<u16>(), 0..300), bytes in prop::collection::vec(any::<i8>(), 0..301)) {
        let fp = write_blob(&BlobData::Fp16(bits.iter().map(|&b| f16::from_bits(b)).collect())).unwrap();
        let r = read_blob(&fp).unwrap();
        match r.decode(&TensorType::fp16([bits.len()])).unwrap() {
            BlobData::Fp16(v) => prop_assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), bits),
            other => prop_assert!(false, "decoded {other:?}"),
        }
        let q = write_blob(&BlobData::Int8(bytes.clone())).unwrap();
        prop_assert_eq!(q.len() % 2, 0);
        prop_assert_eq!(read_blob(&q).unwrap().decode(&TensorType::new(DType::Int8, [bytes.len()])).unwrap(), BlobData::Int8(bytes));
    }

    #[test]
    fn random_blobs_never_panic(mut b in prop::collection::vec(any::<u8>(), 0..300), header in any::<bool>(), size in any::<u32>()) {
        if header && b.len() >= 128 {
            let good = write_blob(&BlobData::Int8(vec![0; 4])).unwrap();
            b[..128].copy_from_slice(&good[..128]);
            b[72..76].copy_from_slice(&size.to_le_bytes());
        }
        if let Ok(r) = read_blob(&b) {
            prop_assert_eq!(r.payload.len() as u64, u64::from(u32::from_le_bytes([b[72], b[73], b[74], b[75]])));
            let _ = r.decode(&TensorType::fp16([r.payload.len() / 2]));
        }
    }
}
