//! The op patterns of the C++ kernel catalogue (ane-runtime.md §3.3, §3.6) built with the
//! builder: each type-checks, prints, and parses back to the same text.

use anelm_mil::{BuildError, DType, FunctionBuilder, Opset, Program, TensorType, Value, parse_program};

const SP: usize = 32;

fn blob(f: &mut FunctionBuilder, name: &str, o: usize, i: usize) -> Value {
    f.blob(
        name,
        TensorType::fp16([o, i, 1, 1]),
        &format!("@model_path/weights/{name}.bin"),
    )
    .unwrap()
}

fn finish(f: FunctionBuilder) -> String {
    let p = Program::new(vec![f.finish().unwrap()]);
    p.check().unwrap();
    let text = p.to_string();
    let back = parse_program(&text).unwrap();
    back.check().unwrap();
    assert_eq!(back, p);
    assert_eq!(back.to_string(), text);
    text
}

#[test]
fn fused_3_concat() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = f.input("x", TensorType::surface(64, SP)).unwrap();
    let (wa, wb, wc) = (
        blob(&mut f, "wa", 64, 64),
        blob(&mut f, "wb", 16, 64),
        blob(&mut f, "wc", 16, 64),
    );
    let ya = f.linear("ya", &x, &wa).unwrap();
    let yb = f.linear("yb", &x, &wb).unwrap();
    let yc = f.linear("yc", &x, &wc).unwrap();
    let ax = f.const_int32("ax", 1).unwrap();
    let ci = f.const_bool("ci", false).unwrap();
    let y = f.concat("y", &[&ya, &yb, &yc], &ax, &ci).unwrap();
    assert_eq!(y.ty, TensorType::surface(96, SP));
    f.output(&y).unwrap();
    let text = finish(f);
    assert!(text.contains("concat(axis = ax, interleave = ci, values = (ya, yb, yc))"));
}

#[test]
fn ffn_resadd() {
    let (d, ff) = (64, 192);
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let xn = f.input("xnorm", TensorType::surface(d, SP)).unwrap();
    let xr = f.input("xres", TensorType::surface(d, SP)).unwrap();
    let (wg, wu, wd) = (
        blob(&mut f, "wg", ff, d),
        blob(&mut f, "wu", ff, d),
        blob(&mut f, "wd", d, ff),
    );
    let gate = f.linear("gate", &xn, &wg).unwrap();
    let up = f.linear("up", &xn, &wu).unwrap();
    let sig = f.sigmoid("sig", &gate).unwrap();
    let silu = f.mul("silu", &gate, &sig).unwrap();
    let fused = f.mul("fused", &silu, &up).unwrap();
    let ffn = f.linear("ffn", &fused, &wd).unwrap();
    let y = f.add("y", &xr, &ffn).unwrap();
    f.output(&y).unwrap();
    finish(f);
}

#[test]
fn ffn_chunk_accumulate_with_slices() {
    let (d, fc) = (64, 96);
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let packed = f.input("packed", TensorType::surface(2 * d, SP)).unwrap();
    let b0 = f.const_int32s("b0", &[0, 0, 0, 0]).unwrap();
    let e0 = f.const_int32s("e0", &[1, d as i32, 1, SP as i32]).unwrap();
    let b1 = f.const_int32s("b1", &[0, d as i32, 0, 0]).unwrap();
    let e1 = f.const_int32s("e1", &[1, 2 * d as i32, 1, SP as i32]).unwrap();
    let x = f.slice_by_index("x", &packed, &b0, &e0).unwrap();
    let acc = f.slice_by_index("acc", &packed, &b1, &e1).unwrap();
    assert_eq!(acc.ty, TensorType::surface(d, SP));
    let (wg, wu, wd) = (
        blob(&mut f, "wg", fc, d),
        blob(&mut f, "wu", fc, d),
        blob(&mut f, "wd", d, fc),
    );
    let gate = f.linear("gate", &x, &wg).unwrap();
    let up = f.linear("up", &x, &wu).unwrap();
    let silu = f.silu("silu", &gate).unwrap();
    let fused = f.mul("fused", &silu, &up).unwrap();
    let part = f.linear("partial", &fused, &wd).unwrap();
    let out = f.add("out", &acc, &part).unwrap();
    f.output(&out).unwrap();
    let text = finish(f);
    assert!(text.contains("slice_by_index(begin = b1, end = e1, x = packed)"));
}

#[test]
fn int8_fused_2_blockwise() {
    let (d, a, b, block) = (64, 96, 32, 16);
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let x = f.input("x", TensorType::surface(d, SP)).unwrap();
    let mut outs = Vec::new();
    for (n, o) in [("wa", a), ("wb", b)] {
        let q = f.blob(
            &format!("{n}q"),
            TensorType::new(DType::Int8, [o, d, 1, 1]),
            &format!("@model_path/weights/{n}q.bin"),
        );
        let s = f.blob(
            &format!("{n}s"),
            TensorType::fp16([o, d / block, 1, 1]),
            &format!("@model_path/weights/{n}s.bin"),
        );
        let w = f.constexpr_blockwise_shift_scale(n, &q.unwrap(), &s.unwrap()).unwrap();
        outs.push(f.linear(&format!("y{n}"), &x, &w).unwrap());
    }
    let ax = f.const_int32("ax", 1).unwrap();
    let ci = f.const_bool("ci", false).unwrap();
    let y = f.concat("y", &[&outs[0], &outs[1]], &ax, &ci).unwrap();
    f.output(&y).unwrap();
    let text = finish(f);
    assert!(text.contains("func main<ios18>"));
}

#[test]
fn other_ops_infer_shapes() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = f.input("x", TensorType::surface(64, SP)).unwrap();
    let sb = f.const_int32s("sb", &[0, 0, 0, 0]).unwrap();
    let ss = f.const_int32s("ss", &[1, 16, 1, -1]).unwrap();
    let head = f.slice_by_size("head", &x, &sb, &ss).unwrap();
    assert_eq!(head.ty, TensorType::surface(16, SP));
    let rs = f.const_int32s("rs", &[1, 1, 16, 32]).unwrap();
    let r = f.reshape("r", &head, &rs).unwrap();
    let perm = f.const_int32s("perm", &[0, 1, 3, 2]).unwrap();
    let t = f.transpose("t", &r, &perm).unwrap();
    assert_eq!(t.ty, TensorType::fp16([1, 1, 32, 16]));
    let fx = f.const_bool("fx", false).unwrap();
    let mm = f.matmul("mm", &t, &r, &fx, &fx).unwrap();
    assert_eq!(mm.ty, TensorType::fp16([1, 1, 32, 32]));
    let ax = f.const_int32s("axes", &[-1]).unwrap();
    let kd = f.const_bool("kd", true).unwrap();
    let rsum = f.reduce_sum("rsum", &mm, &ax, &kd).unwrap();
    assert_eq!(rsum.ty, TensorType::fp16([1, 1, 32, 1]));
    let sax = f.const_int32("sax", -1).unwrap();
    let sm = f.softmax("sm", &mm, &sax).unwrap();
    let half = f.const_fp16("nh", -0.5).unwrap();
    let p = f.pow("p", &sm, &half).unwrap();
    let dt = f.const_string("dt", "fp32").unwrap();
    let c = f.cast("c", &p, &dt).unwrap();
    assert_eq!(c.ty.dtype, DType::Fp32);
    let dt16 = f.const_string("dt16", "fp16").unwrap();
    let c16 = f.cast("c16", &c, &dt16).unwrap();
    let s = f.sqrt("s", &c16).unwrap();
    let q = f.real_div("q", &s, &p).unwrap();
    let z = f.sub("z", &q, &rsum).unwrap();
    f.output(&z).unwrap();
    finish(f);
}

#[test]
fn builder_refuses_bad_programs() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = f.input("x", TensorType::surface(64, SP)).unwrap();
    let w = blob(&mut f, "w", 8, 32);
    assert!(matches!(f.linear("y", &x, &w), Err(BuildError::Type { .. })));
    assert!(matches!(
        f.input("x", TensorType::surface(1, SP)),
        Err(BuildError::Redefined(_))
    ));
    assert!(matches!(f.sigmoid("1bad", &x), Err(BuildError::BadIdentifier(_))));
    let y = f.sigmoid("y", &x).unwrap();
    assert!(matches!(f.sigmoid("y", &x), Err(BuildError::Redefined(_))));
    let big = f.const_int32s("big", &[1, 65, 1, 32]).unwrap();
    let zero = f.const_int32s("zero", &[0, 0, 0, 0]).unwrap();
    assert!(f.slice_by_index("s", &y, &zero, &big).is_err());
    assert!(f.slice_by_size("s", &y, &zero, &big).is_err());
    // A runtime value where a constant is required.
    assert!(f.reshape("r", &y, &x).is_err());
    // Unknown op without a result type.
    assert!(f.op("t", "mystery", vec![], vec![], None).is_err());
}
