//! Parser tests: both dialects, the reference snippets, and error positions.

use anelm_mil::{
    Argument, BuildError, DType, Literal, OpKind, Operand, Opset, ProgramVersion, TensorData, TensorType, f16,
    parse_program,
};

/// A program in the MX dialect of ane-hardware.md §3.1 (`program(1.3)`, bare scalar types,
/// the four-entry buildInfo wrapped over two lines), using the literal forms that section
/// and §2.5 show: `fp16(0.00001)`, hex float `fp16(0x1p-3)`, `tensor<int32, [4]>([1,64,1,32])`
/// without spaces, an inline mask with −65504, and `constexpr_affine_dequantize` whose
/// parameters are attributes.
const MX: &str = r#"program(1.3)
[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, {"coremlc-version", "3505.4.1"},
                                   {"coremltools-component-milinternal", ""}, {"coremltools-version", "9.0"}})]
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x) {
        string pt = const()[name = string("pt"), val = string("valid")];
        tensor<int32, [2]> st = const()[name = string("st"), val = tensor<int32, [2]>([1,1])];
        tensor<int32, [4]> pd = const()[name = string("pd"), val = tensor<int32, [4]>([0,0,0,0])];
        tensor<int32, [2]> dl = const()[name = string("dl"), val = tensor<int32, [2]>([1,1])];
        int32 gr = const()[name = string("gr"), val = int32(1)];
        tensor<fp16, [64, 64, 1, 1]> W = constexpr_affine_dequantize()[axis = int32(0), name = string("W"), quantized_data = tensor<int8, [64, 64, 1, 1]>(BLOBFILE(path = string("@model_path/weights/weight.bin"), offset = uint64(64))), scale = fp16(0x1p-3), zero_point = int8(0)];
        tensor<fp16, [1, 64, 1, 32]> c = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = W, x = x)[name = string("c")];
        fp16 eps = const()[name = string("eps"), val = fp16(0.00001)];
        tensor<fp16, [1, 64, 1, 32]> e = add(x = c, y = eps)[name = string("e")];
        fp16 nh = const()[name = string("nh"), val = fp16(-0.5)];
        tensor<fp16, [1, 64, 1, 32]> r = pow(x = e, y = nh)[name = string("r")];
        tensor<int32, [4]> sh = const()[name = string("sh"), val = tensor<int32, [4]>([1,64,1,32])];
        tensor<fp16, [1, 64, 1, 32]> o = reshape(shape = sh, x = r)[name = string("o")];
        tensor<fp16, [1, 1, 2, 2]> mask = const()[name = string("mask"), val = tensor<fp16, [1,1,2,2]>([0, -65504, 0, 0])];
        bool ci = const()[name = string("ci"), val = bool(false)];
        int32 ax = const()[name = string("ax"), val = int32(1)];
        tensor<fp16, [1, 128, 1, 32]> out = concat(axis = ax, interleave = ci, values = (o, c))[name = string("out")];
    } -> (out);
}
"#;

#[test]
fn parses_mx_dialect() {
    let p = parse_program(MX).unwrap();
    assert_eq!(p.version, ProgramVersion::V1_3);
    assert_eq!(p.build_info.len(), 4);
    assert_eq!(p.build_info_value("coremlc-version"), Some("3505.4.1"));
    assert_eq!(p.build_info_value("coremltools-component-milinternal"), Some(""));
    let f = p.main().unwrap();
    assert_eq!(f.opset, Opset::Ios18);
    assert_eq!(f.inputs[0].ty, TensorType::surface(64, 32));
    assert_eq!(f.outputs, ["out"]);
    let w = f.statement("W").unwrap();
    assert_eq!(w.kind(), OpKind::ConstexprAffineDequantize);
    assert_eq!(w.attribute("scale"), Some(&Literal::fp16(0.125)));
    assert_eq!(
        w.attribute("zero_point").and_then(Literal::data),
        Some(&TensorData::Int8(vec![0]))
    );
    let eps = f.statement("eps").unwrap().const_value().unwrap();
    assert_eq!(eps, &Literal::fp16(0.00001));
    let mask = f.statement("mask").unwrap().const_value().unwrap();
    assert_eq!(
        mask.data(),
        Some(&TensorData::Fp16([0.0, -65504.0, 0.0, 0.0].map(f16::from_f32).to_vec()))
    );
    let refs = p.blob_refs();
    assert_eq!(refs.len(), 1);
    assert_eq!(
        (refs[0].value, refs[0].path, refs[0].offset),
        ("W", "@model_path/weights/weight.bin", 64)
    );
    assert_eq!(refs[0].ty, &TensorType::new(DType::Int8, [64, 64, 1, 1]));
    assert_eq!(
        f.statement("out").unwrap().input("values"),
        Some(&Argument::vars(["o", "c"]))
    );
    p.check().unwrap();
    // Printing keeps the 1.3 spelling, and the printed text is a fixed point.
    let printed = p.to_string();
    assert!(printed.contains("        int32 gr = const()[name = string(\"gr\"), val = int32(1)];\n"));
    assert!(printed.contains("scale = fp16(0.125)"));
    assert_eq!(parse_program(&printed).unwrap(), p);
    assert_eq!(parse_program(&printed).unwrap().to_string(), printed);
}

/// The 1.0 spelling is accepted for scalars in any program and vice versa (lenient reading),
/// and inline typed literals are accepted as operands.
#[test]
fn lenient_spellings_and_inline_operands() {
    let src = r#"program(1.0)
[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{"coremlc-version", "3505.4.1"}})]
{
    func main<ios16>(tensor<fp16, [1, 2, 1, 32]> a, tensor<fp16, [1, 2, 1, 32]> b) {
        tensor<fp16, [1, 2, 1, 32]> s = sub(x = a, y = fp16(1))[name = string("s")];
        tensor<fp16, [1, 2, 1, 32]> m = mul(x = s, y = b)[name = tensor<string, []>("m")];
        tensor<fp16, [1, 2, 1, 32]> g = sigmoid(x = m)[name = tensor<string, []>("g")];
    } -> (g, m);
}
"#;
    let p = parse_program(src).unwrap();
    p.check().unwrap();
    let f = p.main().unwrap();
    assert_eq!(f.outputs, ["g", "m"]);
    assert_eq!(
        f.statement("s").unwrap().input("y"),
        Some(&Argument::Single(Operand::Lit(Literal::fp16(1.0))))
    );
    let printed = p.to_string();
    assert!(printed.contains("sub(x = a, y = tensor<fp16, []>(1))[name = tensor<string, []>(\"s\")]"));
}

fn err(src: &str) -> (usize, usize, String) {
    let e = parse_program(src).unwrap_err();
    (e.line, e.column, e.message)
}

#[test]
fn errors_carry_line_and_column() {
    let (l, c, m) = err("program(2.0) {}");
    assert_eq!((l, c), (1, 9));
    assert!(m.contains("unsupported program version 2.0"), "{m}");

    let (l, c, m) = err("program(1.0)\n{\n    func main<ios99>() {\n    } -> ();\n}\n");
    assert_eq!((l, c), (3, 15));
    assert!(m.contains("unknown opset `ios99`"), "{m}");

    let src = "program(1.0)\n{\n    func main<ios16>() {\n        tensor<fp99, [1]> x = const()[];\n    } -> ();\n}\n";
    let (l, c, m) = err(src);
    assert_eq!((l, c), (4, 16));
    assert!(m.contains("unknown element type `fp99`"), "{m}");

    let src = "program(1.0)\n{\n    func main<ios16>() {\n        tensor<int32, [2]> x = const()[val = tensor<int32, [2]>([1])];\n";
    let (l, c, m) = err(src);
    assert_eq!((l, c), (4, 46));
    assert!(m.contains("has 1 elements, expected 2"), "{m}");

    let (l, c, m) = err("program(1.0)\n{\n    func main<ios16>() {\n");
    assert_eq!((l, c), (4, 1));
    assert!(m.contains("end of input"), "{m}");

    let (_, _, m) = err("program(1.0) {} trailing");
    assert!(m.contains("end of input after"), "{m}");

    let (l, c, m) =
        err("program(1.0) {\n func main<ios16>() { tensor<int8, []> x = const()[val = int8(300)]; } -> (); }");
    assert_eq!((l, c), (2, 63));
    assert!(m.contains("not a valid int8"), "{m}");

    let (_, _, m) = err(
        "program(1.0) {\n func main<ios16>(tensor<fp16, [1]> x) { tensor<fp16, [1]> y = add(x = x, y = 1); } -> (y); }",
    );
    assert!(m.contains("inline literals must be typed"), "{m}");
}

#[test]
fn check_rejects_structural_errors() {
    let head = "program(1.0)\n[buildInfo = dict<string, string>({{\"coremlc-version\", \"1\"}})]\n{\n    func main<ios16>(tensor<fp16, [1, 4, 1, 32]> x) {\n";
    let prog = |body: &str, out: &str| format!("{head}{body}    }} -> ({out});\n}}\n");
    let check = |src: String| parse_program(&src).unwrap().check();

    // Missing buildInfo: the ANE MIL parser requires coremlc-version.
    let no_info = "program(1.0)\n{\n    func main<ios16>() {\n    } -> ();\n}\n";
    assert_eq!(
        parse_program(no_info).unwrap().check(),
        Err(BuildError::MissingBuildInfo)
    );

    let e = check(prog(
        "        tensor<fp16, [1, 4, 1, 32]> y = sigmoid(x = z)[name = string(\"y\")];\n",
        "y",
    ));
    assert_eq!(e, Err(BuildError::Undefined("z".into())));

    let e = check(prog(
        "        tensor<fp16, [1, 4, 1, 32]> x = sigmoid(x = x)[name = string(\"y\")];\n",
        "x",
    ));
    assert_eq!(e, Err(BuildError::Redefined("x".into())));

    let e = check(prog("        tensor<fp16, [1, 4, 1, 32]> y = sigmoid(x = x);\n", "y"));
    assert_eq!(e, Err(BuildError::MissingName("y".into())));

    let e = check(prog("", "nope"));
    assert_eq!(e, Err(BuildError::UndefinedOutput("nope".into())));

    let e = check(prog(
        "        tensor<fp16, [1, 8, 1, 32]> y = sigmoid(x = x)[name = string(\"y\")];\n",
        "y",
    ));
    assert!(matches!(e, Err(BuildError::DeclaredTypeMismatch { .. })), "{e:?}");

    let dup = "        tensor<fp16, [1, 4, 1, 32]> y = sigmoid(x = x)[name = string(\"s\")];\n        tensor<fp16, [1, 4, 1, 32]> z = sigmoid(x = y)[name = string(\"s\")];\n";
    assert_eq!(check(prog(dup, "z")), Err(BuildError::DuplicateOpName("s".into())));

    // A reshape to a different element count is a type error.
    let w = "        tensor<fp16, [1, 4, 1, 32]> y = mul(x = x, y = x)[name = string(\"y\")];\n        tensor<int32, [4]> s = const()[name = string(\"s\"), val = tensor<int32, [4]>([1, 2, 1, 32])];\n        tensor<fp16, [1, 2, 1, 32]> r = reshape(shape = s, x = y)[name = string(\"r\")];\n";
    let e = check(prog(w, "r"));
    assert!(matches!(e, Err(BuildError::Type { .. })), "{e:?}");
    // An op without a type rule is parsed and checked structurally only.
    let other = "        tensor<fp16, [1, 4, 1, 32]> y = fancy_op(x = x)[name = string(\"y\")];\n";
    assert_eq!(check(prog(other, "y")), Ok(()));
}
