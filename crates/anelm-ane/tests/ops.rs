//! The emulator's other whitelisted ops against hand-computed results, and its fp16 behaviour
//! (rounding after each op, subnormal flush).

use anelm_ane::{AneDevice, EmuAne, EmuConfig, Surface};
use anelm_mil::{FunctionBuilder, Opset, Program, TensorType, Value, WeightFiles};

fn run(f: FunctionBuilder, cfg: EmuConfig, inputs: &[Surface]) -> Vec<Surface> {
    let text = Program::new(vec![f.finish().unwrap()]).to_string();
    let ane = EmuAne::new(cfg);
    let h = ane.compile(&text, &WeightFiles::new()).unwrap();
    ane.load(h).unwrap();
    let mut out = ane.signature(h).unwrap().output_surfaces();
    let refs: Vec<&Surface> = inputs.iter().collect();
    ane.evaluate(h, &refs, &mut out).unwrap();
    out
}

fn ramp(channels: usize) -> Surface {
    let mut s = Surface::new(channels);
    for c in 0..channels {
        for l in 0..32 {
            s.set(c, l, (c * 32 + l) as f32 * 0.125 - 4.0).unwrap();
        }
    }
    s
}

fn input(f: &mut FunctionBuilder, c: usize) -> Value {
    f.input("x", TensorType::surface(c, 32)).unwrap()
}

#[test]
fn slices_concat_and_broadcast_sub() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = input(&mut f, 6);
    let b = f.const_int32s("b", &[0, 2, 0, 0]).unwrap();
    let e = f.const_int32s("e", &[1, 6, 1, 32]).unwrap();
    let tail = f.slice_by_index("tail", &x, &b, &e).unwrap(); // channels 2..6
    let sb = f.const_int32s("sb", &[0, 0, 0, 0]).unwrap();
    let ss = f.const_int32s("ss", &[1, 1, 1, 32]).unwrap();
    let first = f.slice_by_size("first", &x, &sb, &ss).unwrap(); // channel 0
    let d = f.sub("d", &tail, &first).unwrap(); // C-broadcast
    let ax = f.const_int32("ax", 1).unwrap();
    let ci = f.const_bool("ci", false).unwrap();
    let y = f.concat("y", &[&first, &d], &ax, &ci).unwrap();
    f.output(&y).unwrap();
    let x = ramp(6);
    let out = run(f, EmuConfig::default(), std::slice::from_ref(&x));
    let y = &out[0];
    assert_eq!(y.channels(), 5);
    for l in 0..32 {
        assert_eq!(y.get(0, l).unwrap(), x.get(0, l).unwrap());
        for c in 0..4 {
            assert_eq!(
                y.get(c + 1, l).unwrap(),
                x.get(c + 2, l).unwrap() - x.get(0, l).unwrap()
            );
        }
    }
}

#[test]
fn reshape_transpose_matmul_softmax_reduce() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = input(&mut f, 2);
    let rs = f.const_int32s("rs", &[1, 1, 2, 32]).unwrap();
    let r = f.reshape("r", &x, &rs).unwrap(); // [1,1,2,32]
    let perm = f.const_int32s("perm", &[0, 1, 3, 2]).unwrap();
    let t = f.transpose("t", &r, &perm).unwrap(); // [1,1,32,2]
    let no = f.const_bool("no", false).unwrap();
    let g = f.matmul("g", &r, &t, &no, &no).unwrap(); // [1,1,2,2] = r·rᵀ
    let sax = f.const_int32("sax", -1).unwrap();
    let sm = f.softmax("sm", &g, &sax).unwrap();
    let axes = f.const_int32s("axes", &[-1]).unwrap();
    let kd = f.const_bool("kd", true).unwrap();
    let sum = f.reduce_sum("sum", &sm, &axes, &kd).unwrap(); // [1,1,2,1], each 1
    let rs2 = f.const_int32s("rs2", &[1, 2, 1, 1]).unwrap();
    let s2 = f.reshape("s2", &sum, &rs2).unwrap();
    let y = f.mul("y", &x, &s2).unwrap(); // W-broadcast: x·1
    f.output(&y).unwrap();
    let mut x = Surface::new(2);
    for l in 0..32 {
        x.set(0, l, 0.01 * l as f32).unwrap();
        x.set(1, l, -0.02 * l as f32).unwrap();
    }
    let out = run(f, EmuConfig::default(), std::slice::from_ref(&x));
    for c in 0..2 {
        for l in 0..32 {
            let (got, want) = (out[0].get(c, l).unwrap(), x.get(c, l).unwrap());
            assert!((got - want).abs() <= want.abs() * 1e-3, "({c}, {l}): {got} vs {want}");
        }
    }
}

#[test]
fn every_op_rounds_to_fp16_and_flushes_subnormals() {
    // x · 2⁻¹⁰ for x = 2⁻⁶ gives 2⁻¹⁶, an fp16 subnormal: flushed to 0 by default, kept when
    // flushing is off. 1 + 2⁻¹² rounds back to 1 after the add.
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = input(&mut f, 1);
    let k = f.const_fp16("k", f32::powi(2.0, -10)).unwrap();
    let tiny = f.mul("tiny", &x, &k).unwrap();
    let one = f.const_fp16("one", 1.0).unwrap();
    let y = f.add("y", &tiny, &one).unwrap();
    f.output(&tiny).unwrap();
    f.output(&y).unwrap();
    let x = Surface::pack(1, &[&[f32::powi(2.0, -6)], &[f32::powi(2.0, -2)]]).unwrap();
    let flushed = run(f.clone(), EmuConfig::default(), std::slice::from_ref(&x));
    assert_eq!(flushed[0].get(0, 0).unwrap(), 0.0);
    assert_eq!(flushed[1].get(0, 0).unwrap(), 1.0);
    assert_eq!(flushed[0].get(0, 1).unwrap(), f32::powi(2.0, -12));
    assert_eq!(flushed[1].get(0, 1).unwrap(), 1.0, "1 + 2^-12 rounds to 1 in fp16");
    let kept = run(
        f,
        EmuConfig {
            flush_subnormals: false,
            ..EmuConfig::default()
        },
        &[x],
    );
    assert_eq!(kept[0].get(0, 0).unwrap(), f32::powi(2.0, -16));
}

#[test]
fn matmul_and_transpose_values() {
    // y = reshape(transpose(r)·r) with r = x viewed as [1, 1, 2, 32]: y[i, j] = Σ_k x[k, i]·x[k, j].
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let x = input(&mut f, 2);
    let rs = f.const_int32s("rs", &[1, 1, 2, 32]).unwrap();
    let r = f.reshape("r", &x, &rs).unwrap();
    let perm = f.const_int32s("perm", &[0, 1, 3, 2]).unwrap();
    let t = f.transpose("t", &r, &perm).unwrap();
    let no = f.const_bool("no", false).unwrap();
    let g = f.matmul("g", &t, &r, &no, &no).unwrap();
    let os = f.const_int32s("os", &[1, 32, 1, 32]).unwrap();
    let y = f.reshape("y", &g, &os).unwrap();
    f.output(&y).unwrap();
    let x = ramp(2);
    let out = run(f, EmuConfig::default(), std::slice::from_ref(&x));
    for i in 0..32 {
        for j in 0..32 {
            let want: f32 = (0..2).map(|k| x.get(k, i).unwrap() * x.get(k, j).unwrap()).sum();
            let got = out[0].get(i, j).unwrap();
            assert!(
                (got - want).abs() <= want.abs() / 1024.0 + 1e-6,
                "({i}, {j}): {got} vs {want}"
            );
        }
    }
}
