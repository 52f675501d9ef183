//! Golden-text tests: the printer against the examples in `ane-runtime.md` §3 and
//! `ane-hardware.md` §3, character for character.

use anelm_mil::{
    Argument, DType, Function, FunctionBuilder, Literal, Opset, Program, ProgramVersion, Statement, TensorType, Value,
    print_literal, print_statement, print_type,
};

const V10: ProgramVersion = ProgramVersion::V1_0;
const V13: ProgramVersion = ProgramVersion::V1_3;

/// ane-runtime.md §3.1, the program skeleton: first lines and the closing lines.
#[test]
fn skeleton_header_and_footer() {
    let f = Function {
        name: "main".into(),
        opset: Opset::Ios16,
        inputs: vec![Value::new("x", TensorType::surface(2560, 32))],
        body: vec![],
        outputs: vec!["y".into()],
    };
    let text = Program::new(vec![f]).to_string();
    let expected = "program(1.0)\n\
[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{\"coremlc-version\", \"3505.4.1\"}})]\n\
{\n\
\x20   func main<ios16>(tensor<fp16, [1, 2560, 1, 32]> x) {\n\
\x20   } -> (y);\n\
}\n";
    assert_eq!(text, expected);
}

/// ane-runtime.md §3.1: `tensor<fp16, [1, 4096, 1, 32]> y = conv(...)[name = tensor<string, []>("cv")];`
#[test]
fn typed_named_statement() {
    let st = Statement {
        output: Value::new("y", TensorType::surface(4096, 32)),
        op: "conv".into(),
        inputs: vec![("x".into(), Argument::var("x"))],
        attributes: vec![("name".into(), Literal::string("cv"))],
    };
    let s = print_statement(&st, V10);
    assert!(s.starts_with("tensor<fp16, [1, 4096, 1, 32]> y = conv("), "{s}");
    assert!(s.ends_with(")[name = tensor<string, []>(\"cv\")];"), "{s}");
}

/// ane-runtime.md §3.1: every literal the C++ system uses.
#[test]
fn literals_dialect_a() {
    let cases = [
        (Literal::string("valid"), "tensor<string, []>(\"valid\")"),
        (Literal::int32s(&[1, 1]), "tensor<int32, [2]>([1, 1])"),
        (Literal::int32s(&[0, 0, 0, 0]), "tensor<int32, [4]>([0, 0, 0, 0])"),
        (Literal::int32(1), "tensor<int32, []>(1)"),
        (Literal::bool(false), "tensor<bool, []>(false)"),
        (Literal::int32s(&[1]), "tensor<int32, [1]>([1])"),
        (Literal::bool(true), "tensor<bool, []>(true)"),
        (
            Literal::blob(TensorType::fp16([4096, 2560, 1, 1]), "@model_path/weights/wq.bin", 64),
            "tensor<fp16, [4096, 2560, 1, 1]>(BLOBFILE(path = tensor<string, []>(\"@model_path/weights/wq.bin\"), offset = tensor<uint64, []>(64)))",
        ),
    ];
    for (lit, want) in cases {
        assert_eq!(print_literal(&lit, V10), want);
    }
}

/// ane-hardware.md §3.1 dialect B spellings.
#[test]
fn literals_dialect_b() {
    let cases = [
        (Literal::string("valid"), "string(\"valid\")"),
        (Literal::int32(1), "int32(1)"),
        (Literal::bool(true), "bool(true)"),
        (Literal::fp16(-0.5), "fp16(-0.5)"),
        (Literal::fp16(0.125), "fp16(0.125)"),
        (Literal::uint64(64), "uint64(64)"),
        (Literal::int32s(&[1, 64, 1, 32]), "tensor<int32, [4]>([1, 64, 1, 32])"),
        (
            Literal::blob(TensorType::fp16([64, 64, 1, 1]), "@model_path/weights/weight.bin", 64),
            "tensor<fp16, [64, 64, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/weight.bin\"), offset = uint64(64)))",
        ),
    ];
    for (lit, want) in cases {
        assert_eq!(print_literal(&lit, V13), want);
    }
    assert_eq!(print_type(&TensorType::scalar(DType::Fp16), V13), "fp16");
    assert_eq!(print_type(&TensorType::scalar(DType::Fp16), V10), "tensor<fp16, []>");
}

/// ane-runtime.md §3.1 const template:
/// `tensor<T, shape> v = const()[name = tensor<string, []>("v"), val = tensor<T, shape>(<literal>)];`
#[test]
fn const_template() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    f.const_int32s("st", &[1, 1]).unwrap();
    let fun = f.finish().unwrap();
    assert_eq!(
        print_statement(&fun.body[0], V10),
        "tensor<int32, [2]> st = const()[name = tensor<string, []>(\"st\"), val = tensor<int32, [2]>([1, 1])];"
    );
}

/// The C++ `matmul` kernel (ane-runtime.md §3.2–3.3): shared conv constants, BLOBFILE
/// weight at offset 64, one 1×1 conv, output `-> (y)`.
#[test]
fn matmul_kernel_fp16() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = f.input("x", TensorType::surface(2560, 32)).unwrap();
    let w = f
        .blob(
            "W",
            TensorType::fp16([4096, 2560, 1, 1]),
            "@model_path/weights/weight.bin",
        )
        .unwrap();
    let y = f.linear("y", &x, &w).unwrap();
    f.output(&y).unwrap();
    let text = Program::new(vec![f.finish().unwrap()]).to_string();
    let expected = r#"program(1.0)
[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{"coremlc-version", "3505.4.1"}})]
{
    func main<ios16>(tensor<fp16, [1, 2560, 1, 32]> x) {
        tensor<fp16, [4096, 2560, 1, 1]> W = const()[name = tensor<string, []>("W"), val = tensor<fp16, [4096, 2560, 1, 1]>(BLOBFILE(path = tensor<string, []>("@model_path/weights/weight.bin"), offset = tensor<uint64, []>(64)))];
        tensor<string, []> pt = const()[name = tensor<string, []>("pt"), val = tensor<string, []>("valid")];
        tensor<int32, [2]> st = const()[name = tensor<string, []>("st"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, [4]> pd = const()[name = tensor<string, []>("pd"), val = tensor<int32, [4]>([0, 0, 0, 0])];
        tensor<int32, [2]> dl = const()[name = tensor<string, []>("dl"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, []> gr = const()[name = tensor<string, []>("gr"), val = tensor<int32, []>(1)];
        tensor<fp16, [1, 4096, 1, 32]> y = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = W, x = x)[name = tensor<string, []>("y")];
    } -> (y);
}
"#;
    assert_eq!(text, expected);
    assert_eq!(anelm_mil::parse_program(&text).unwrap().to_string(), text);
}

/// The int8 form of the matmul kernel (ane-runtime.md §3.6): `program(1.0)` with
/// `main<ios18>`, int8 data and fp16 `[O, 1, 1, 1]` scales dequantised by
/// `constexpr_blockwise_shift_scale(data, scale)`.
#[test]
fn matmul_kernel_int8() {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let x = f.input("x", TensorType::surface(64, 32)).unwrap();
    let q = f
        .blob(
            "Wq",
            TensorType::new(DType::Int8, [128, 64, 1, 1]),
            "@model_path/weights/wq.bin",
        )
        .unwrap();
    let s = f
        .blob("Ws", TensorType::fp16([128, 1, 1, 1]), "@model_path/weights/ws.bin")
        .unwrap();
    let w = f.constexpr_blockwise_shift_scale("W", &q, &s).unwrap();
    assert_eq!(w.ty, TensorType::fp16([128, 64, 1, 1]));
    let y = f.linear("y", &x, &w).unwrap();
    f.output(&y).unwrap();
    let text = Program::new(vec![f.finish().unwrap()]).to_string();
    assert!(text.starts_with("program(1.0)\n"));
    assert!(text.contains("    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x) {\n"));
    assert!(text.contains(
        "        tensor<fp16, [128, 64, 1, 1]> W = constexpr_blockwise_shift_scale(data = Wq, scale = Ws)[name = tensor<string, []>(\"W\")];\n"
    ));
    assert!(text.contains("tensor<int8, [128, 64, 1, 1]> Wq = const()[name = tensor<string, []>(\"Wq\"), val = tensor<int8, [128, 64, 1, 1]>(BLOBFILE(path = tensor<string, []>(\"@model_path/weights/wq.bin\"), offset = tensor<uint64, []>(64)))];"));
    assert_eq!(anelm_mil::parse_program(&text).unwrap().to_string(), text);
}

/// `constexpr_blockwise_shift_scale` is an iOS 18 op: refused under ios16.
#[test]
fn blockwise_needs_ios18() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let q = f
        .blob(
            "Wq",
            TensorType::new(DType::Int8, [8, 64, 1, 1]),
            "@model_path/weights/wq.bin",
        )
        .unwrap();
    let s = f
        .blob("Ws", TensorType::fp16([8, 2, 1, 1]), "@model_path/weights/ws.bin")
        .unwrap();
    let e = f.constexpr_blockwise_shift_scale("W", &q, &s).unwrap_err();
    assert!(e.to_string().contains("ios18"), "{e}");
}
