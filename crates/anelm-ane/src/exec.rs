//! The emulator's fp16 interpreter for validated programs.
//!
//! Values are dense row-major tensors whose elements are always exactly representable fp16
//! numbers (held as f32 for speed). Each op computes in f32 (dot products and sums accumulate
//! in f32, as the ANE accumulates wider than fp16) and rounds its result to fp16 once, to
//! nearest even, flushing subnormals to zero (`ane-hardware.md` §3.7, §8.4) — "round after each
//! op as the hardware would".

use std::collections::HashMap;
use std::sync::Arc;

use anelm_mil::{Argument, Literal, OpKind, Operand, Statement, TensorData, f16};

use crate::error::AneError;

/// A dense tensor of fp16-exact values.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Round to fp16 (nearest even); flush subnormal results to ±0 when `flush` is set.
///
/// Values in fp16's normal range `[2^-14, 65504)` (almost all of them) are rounded in the f32
/// bit pattern: drop the 13 low mantissa bits, to nearest, ties to even — the same result as
/// converting to fp16 and back (checked against that in the tests), without the conversions.
#[inline]
pub(crate) fn round_fp16(x: f32, flush: bool) -> f32 {
    let bits = x.to_bits();
    let mag = bits & 0x7FFF_FFFF;
    if (0x3880_0000..0x477F_E000).contains(&mag) {
        let lsb = (bits >> 13) & 1;
        return f32::from_bits((bits + 0x0FFF + lsb) & !0x1FFF);
    }
    if mag == 0 {
        // ±0 (the idle lanes of a surface) stay as they are.
        return x;
    }
    round_fp16_via_f16(x, flush)
}

/// [`round_fp16`] by conversion (subnormals, overflow, NaN).
#[inline(never)]
fn round_fp16_via_f16(x: f32, flush: bool) -> f32 {
    let h = f16::from_f32(x);
    if flush && h.is_finite() && !h.is_normal() && h != f16::ZERO && h != f16::NEG_ZERO {
        if h.is_sign_negative() { -0.0 } else { 0.0 }
    } else {
        h.to_f32()
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Strides of `shape` viewed as `out` (right-aligned; broadcast dims get stride 0).
fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let own = strides(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                own[i - off]
            }
        })
        .collect()
}

/// Iterate every multi-index of `shape`, calling `f` with the linear offsets into each of
/// the given stride sets.
fn for_each_index<const K: usize>(shape: &[usize], strides: [&[usize]; K], mut f: impl FnMut([usize; K])) {
    let n: usize = shape.iter().product();
    if n == 0 {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    let mut off = [0usize; K];
    for _ in 0..n {
        f(off);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            for k in 0..K {
                off[k] += strides[k][d];
            }
            if idx[d] < shape[d] {
                break;
            }
            for k in 0..K {
                off[k] -= strides[k][d] * shape[d];
            }
            idx[d] = 0;
        }
    }
}

/// Compile-time data of a validated program plus the statements to run.
#[derive(Debug)]
pub(crate) struct Executable {
    /// Input names and shapes, in sorted order of the names (how surfaces bind).
    pub inputs: Vec<(String, Vec<usize>)>,
    /// Output names and shapes, in sorted order of the names.
    pub outputs: Vec<(String, Vec<usize>)>,
    /// Runtime statements in order (consts and constexprs already folded).
    pub steps: Vec<Statement>,
    /// fp16 constants (blob weights, dequantised constexpr results, inline fp16 tensors).
    pub tensors: HashMap<String, Arc<Tensor>>,
    /// Parameter constants (int32 / bool / string literals), by value name.
    pub params: HashMap<String, Literal>,
    /// Bytes of stored constants (what a dispatch streams besides its surfaces).
    pub const_bytes: u64,
    /// Flush fp16 subnormals.
    pub flush: bool,
}

struct Run<'a> {
    exe: &'a Executable,
    env: HashMap<&'a str, Arc<Tensor>>,
}

impl Executable {
    /// Run on input tensors (already fp16-exact), returning the outputs in order.
    pub fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Arc<Tensor>>, AneError> {
        let mut r = Run {
            exe: self,
            env: HashMap::new(),
        };
        for ((name, _), t) in self.inputs.iter().zip(inputs) {
            r.env.insert(name.as_str(), Arc::new(t));
        }
        for st in &self.steps {
            let t = r.step(st)?;
            r.env.insert(st.output.name.as_str(), Arc::new(t));
        }
        self.outputs.iter().map(|(name, _)| r.value(name, "output")).collect()
    }
}

fn exec_err(st: &Statement, message: impl Into<String>) -> AneError {
    AneError::Exec {
        op: st.op.clone(),
        value: st.output.name.clone(),
        message: message.into(),
    }
}

impl<'a> Run<'a> {
    fn value(&self, name: &str, what: &str) -> Result<Arc<Tensor>, AneError> {
        if let Some(t) = self.env.get(name) {
            return Ok(t.clone());
        }
        self.exe.tensors.get(name).cloned().ok_or_else(|| AneError::Exec {
            op: what.into(),
            value: name.into(),
            message: "value is not an fp16 tensor".into(),
        })
    }

    fn tensor(&self, st: &Statement, param: &str) -> Result<Arc<Tensor>, AneError> {
        match st.input(param) {
            Some(Argument::Single(Operand::Var(v))) => self.value(v, &st.op),
            Some(Argument::Single(Operand::Lit(l))) => literal_tensor(l, self.exe.flush)
                .map(Arc::new)
                .ok_or_else(|| exec_err(st, format!("`{param}` literal is not fp16"))),
            _ => Err(exec_err(st, format!("missing tensor argument `{param}`"))),
        }
    }

    fn param(&self, st: &'a Statement, param: &str) -> Option<&'a Literal> {
        match st.input(param)? {
            Argument::Single(Operand::Var(v)) => self.exe.params.get(v),
            Argument::Single(Operand::Lit(l)) => Some(l),
            Argument::Tuple(_) => None,
        }
    }

    fn ints(&self, st: &'a Statement, param: &str) -> Result<Option<&'a [i32]>, AneError> {
        match self.param(st, param) {
            None => Ok(None),
            Some(l) => l
                .as_int32s()
                .map(Some)
                .ok_or_else(|| exec_err(st, format!("`{param}` is not an int32 constant"))),
        }
    }

    fn flag(&self, st: &'a Statement, param: &str) -> bool {
        self.param(st, param).and_then(Literal::as_bool).unwrap_or(false)
    }

    fn flags(&self, st: &'a Statement, param: &str, rank: usize) -> Vec<bool> {
        match self.param(st, param).and_then(Literal::data) {
            Some(TensorData::Bool(v)) if v.len() == rank => v.clone(),
            _ => vec![false; rank],
        }
    }

    fn out(&self, st: &Statement, data: Vec<f32>) -> Tensor {
        let flush = self.exe.flush;
        Tensor {
            shape: st.output.ty.shape.clone(),
            data: data.into_iter().map(|x| round_fp16(x, flush)).collect(),
        }
    }

    fn step(&self, st: &'a Statement) -> Result<Tensor, AneError> {
        let rank = st.output.ty.rank();
        let out_shape = st.output.ty.shape.as_slice();
        match st.kind() {
            OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::Pow => {
                let (x, y) = (self.tensor(st, "x")?, self.tensor(st, "y")?);
                let f: fn(f32, f32) -> f32 = match st.kind() {
                    OpKind::Add => |a, b| a + b,
                    OpKind::Sub => |a, b| a - b,
                    OpKind::Mul => |a, b| a * b,
                    _ => f32::powf,
                };
                let mut data = Vec::with_capacity(out_shape.iter().product());
                if x.shape == y.shape {
                    data.extend(x.data.iter().zip(&y.data).map(|(&a, &b)| f(a, b)));
                } else {
                    let (sx, sy) = (
                        broadcast_strides(&x.shape, out_shape),
                        broadcast_strides(&y.shape, out_shape),
                    );
                    for_each_index(out_shape, [&sx, &sy], |[i, j]| data.push(f(x.data[i], y.data[j])));
                }
                Ok(self.out(st, data))
            }
            OpKind::Sigmoid => {
                let x = self.tensor(st, "x")?;
                Ok(self.out(st, x.data.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect()))
            }
            OpKind::Silu => {
                let x = self.tensor(st, "x")?;
                Ok(self.out(st, x.data.iter().map(|&v| v / (1.0 + (-v).exp())).collect()))
            }
            OpKind::Softmax => {
                let x = self.tensor(st, "x")?;
                let axis = norm_axis(self.param(st, "axis").and_then(Literal::as_int32).unwrap_or(-1), rank)
                    .ok_or_else(|| exec_err(st, "axis out of range"))?;
                Ok(self.out(st, softmax(&x, axis)))
            }
            OpKind::Conv => {
                let x = self.tensor(st, "x")?;
                let w = self.tensor(st, "weight")?;
                Ok(self.out(st, conv1x1(&x, &w)))
            }
            OpKind::Matmul => {
                let x = self.tensor(st, "x")?;
                let y = self.tensor(st, "y")?;
                let (tx, ty) = (self.flag(st, "transpose_x"), self.flag(st, "transpose_y"));
                Ok(self.out(st, matmul(&x, &y, tx, ty, out_shape)))
            }
            OpKind::Concat => {
                let axis = norm_axis(self.param(st, "axis").and_then(Literal::as_int32).unwrap_or(0), rank)
                    .ok_or_else(|| exec_err(st, "axis out of range"))?;
                let parts = match st.input("values") {
                    Some(Argument::Tuple(ops)) => ops
                        .iter()
                        .map(|o| match o {
                            Operand::Var(v) => self.value(v, &st.op),
                            Operand::Lit(l) => literal_tensor(l, self.exe.flush)
                                .map(Arc::new)
                                .ok_or_else(|| exec_err(st, "concat literal is not fp16")),
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    _ => return Err(exec_err(st, "`values` must be a tuple")),
                };
                Ok(Tensor {
                    shape: out_shape.to_vec(),
                    data: concat(&parts, axis, out_shape),
                })
            }
            OpKind::SliceByIndex => {
                let x = self.tensor(st, "x")?;
                let r = x.shape.len();
                let begin = self.ints(st, "begin")?.unwrap_or(&[]);
                let stride = self
                    .ints(st, "stride")?
                    .map(<[i32]>::to_vec)
                    .unwrap_or_else(|| vec![1; r]);
                let bm = self.flags(st, "begin_mask", r);
                let starts: Vec<usize> = (0..r)
                    .map(|d| {
                        if bm[d] {
                            0
                        } else {
                            begin
                                .get(d)
                                .copied()
                                .and_then(|v| norm_index(v, x.shape[d]))
                                .unwrap_or(0)
                        }
                    })
                    .collect();
                let steps: Vec<usize> = (0..r)
                    .map(|d| {
                        stride
                            .get(d)
                            .copied()
                            .and_then(|s| usize::try_from(s).ok())
                            .unwrap_or(1)
                    })
                    .collect();
                let lens = self.slice_lens(st, &x, "end")?;
                Ok(Tensor {
                    shape: out_shape.to_vec(),
                    data: gather(&x, &starts, &steps, &lens),
                })
            }
            OpKind::SliceBySize => {
                let x = self.tensor(st, "x")?;
                let begin = self.ints(st, "begin")?.unwrap_or(&[]);
                let starts = (0..x.shape.len())
                    .map(|d| {
                        begin
                            .get(d)
                            .copied()
                            .and_then(|v| norm_index(v, x.shape[d]))
                            .unwrap_or(0)
                    })
                    .collect::<Vec<_>>();
                let steps = vec![1; x.shape.len()];
                if out_shape.len() != x.shape.len() {
                    return Err(exec_err(st, "slice_by_size must keep the rank"));
                }
                Ok(Tensor {
                    shape: out_shape.to_vec(),
                    data: gather(&x, &starts, &steps, out_shape),
                })
            }
            OpKind::Reshape => {
                let x = self.tensor(st, "x")?;
                Ok(Tensor {
                    shape: out_shape.to_vec(),
                    data: x.data.clone(),
                })
            }
            OpKind::Transpose => {
                let x = self.tensor(st, "x")?;
                let perm = self.ints(st, "perm")?.unwrap_or(&[]);
                let own = strides(&x.shape);
                let ps = perm
                    .iter()
                    .map(|&p| norm_axis(p, x.shape.len()).map(|a| own[a]))
                    .collect::<Option<Vec<_>>>()
                    .filter(|p| p.len() == x.shape.len())
                    .ok_or_else(|| exec_err(st, "perm is not a permutation"))?;
                let mut data = Vec::with_capacity(x.data.len());
                for_each_index(out_shape, [&ps], |[i]| data.push(x.data[i]));
                Ok(Tensor {
                    shape: out_shape.to_vec(),
                    data,
                })
            }
            OpKind::ReduceSum => {
                let x = self.tensor(st, "x")?;
                let r = x.shape.len();
                let mut reduce = vec![false; r];
                match self.ints(st, "axes")? {
                    None => reduce.iter_mut().for_each(|v| *v = true),
                    Some(axes) => {
                        for &a in axes {
                            let a = norm_axis(a, r).ok_or_else(|| exec_err(st, "axis out of range"))?;
                            reduce[a] = true;
                        }
                    }
                }
                let kept: Vec<usize> = x
                    .shape
                    .iter()
                    .zip(&reduce)
                    .map(|(&d, &rd)| if rd { 1 } else { d })
                    .collect();
                let n: usize = kept.iter().product();
                let mut acc = vec![0.0f32; n];
                let ks = strides(&kept);
                let to_kept: Vec<usize> = (0..r).map(|d| if reduce[d] { 0 } else { ks[d] }).collect();
                let own = strides(&x.shape);
                for_each_index(&x.shape, [&own, &to_kept], |[i, j]| acc[j] += x.data[i]);
                Ok(self.out(st, acc))
            }
            _ => Err(exec_err(st, "op is not executable at run time")),
        }
    }

    /// Output lengths of a slice_by_index per axis, recomputed from begin/end/stride.
    fn slice_lens(&self, st: &'a Statement, x: &Tensor, end_param: &str) -> Result<Vec<usize>, AneError> {
        let r = x.shape.len();
        let begin = self.ints(st, "begin")?.unwrap_or(&[]);
        let end = self.ints(st, end_param)?.unwrap_or(&[]);
        let stride = self
            .ints(st, "stride")?
            .map(<[i32]>::to_vec)
            .unwrap_or_else(|| vec![1; r]);
        let (bm, em) = (self.flags(st, "begin_mask", r), self.flags(st, "end_mask", r));
        (0..r)
            .map(|d| {
                let dim = x.shape[d];
                let b = if bm[d] {
                    Some(0)
                } else {
                    begin.get(d).and_then(|&v| norm_index(v, dim))
                };
                let e = if em[d] {
                    Some(dim)
                } else {
                    end.get(d).and_then(|&v| norm_index(v, dim))
                };
                let s = stride.get(d).and_then(|&s| usize::try_from(s).ok()).filter(|&s| s >= 1);
                match (b, e, s) {
                    (Some(b), Some(e), Some(s)) if e > b => Ok((e - b).div_ceil(s)),
                    _ => Err(exec_err(st, format!("slice on axis {d} is empty or out of bounds"))),
                }
            })
            .collect()
    }
}

/// An inline fp16 literal as a tensor.
pub(crate) fn literal_tensor(l: &Literal, flush: bool) -> Option<Tensor> {
    match l {
        Literal::Tensor {
            ty,
            data: TensorData::Fp16(v),
        } => Some(Tensor {
            shape: ty.shape.clone(),
            data: v.iter().map(|h| round_fp16(h.to_f32(), flush)).collect(),
        }),
        _ => None,
    }
}

fn norm_axis(a: i32, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let n = if a < 0 { i64::from(a) + r } else { i64::from(a) };
    usize::try_from(n).ok().filter(|&n| n < rank)
}

fn norm_index(v: i32, d: usize) -> Option<usize> {
    let n = if v < 0 { d as i64 + i64::from(v) } else { i64::from(v) };
    usize::try_from(n).ok().filter(|&n| n <= d)
}

fn gather(x: &Tensor, starts: &[usize], steps: &[usize], lens: &[usize]) -> Vec<f32> {
    let own = strides(&x.shape);
    let base: usize = starts.iter().zip(&own).map(|(s, o)| s * o).sum();
    let st: Vec<usize> = steps.iter().zip(&own).map(|(s, o)| s * o).collect();
    let mut data = Vec::with_capacity(lens.iter().product());
    for_each_index(lens, [&st], |[i]| data.push(x.data[base + i]));
    data
}

fn concat(parts: &[Arc<Tensor>], axis: usize, out_shape: &[usize]) -> Vec<f32> {
    let outer: usize = out_shape[..axis].iter().product();
    let mut data = Vec::with_capacity(out_shape.iter().product());
    for o in 0..outer {
        for p in parts {
            let inner: usize = p.shape[axis..].iter().product();
            data.extend_from_slice(&p.data[o * inner..(o + 1) * inner]);
        }
    }
    data
}

fn softmax(x: &Tensor, axis: usize) -> Vec<f32> {
    let n = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let outer: usize = x.shape[..axis].iter().product();
    let mut out = vec![0.0f32; x.data.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * n * inner + k * inner + i;
            let m = (0..n).map(|k| x.data[at(k)]).fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = (0..n).map(|k| (x.data[at(k)] - m).exp()).sum();
            for k in 0..n {
                out[at(k)] = (x.data[at(k)] - m).exp() / sum;
            }
        }
    }
    out
}

/// Dot product with 8 independent f32 accumulators (vectorises; same arithmetic class as a
/// wide-accumulator hardware MAC).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// 1×1 conv, groups 1: x `[N, I, H, W]`, w `[O, I, 1, 1]` → `[N, O, H, W]`, f32 accumulation.
/// Spatial positions whose input column is entirely zero produce exactly zero (no bias), so
/// they are skipped: a single-token decode costs one column, not 32.
fn conv1x1(x: &Tensor, w: &Tensor) -> Vec<f32> {
    let (n, ci) = (x.shape[0], x.shape[1]);
    let sp = x.shape[2] * x.shape[3];
    let co = w.shape[0];
    let mut out = vec![0.0f32; n * co * sp];
    let mut col = vec![0.0f32; ci];
    for b in 0..n {
        let xb = &x.data[b * ci * sp..(b + 1) * ci * sp];
        for p in 0..sp {
            let mut any = false;
            for (i, c) in col.iter_mut().enumerate() {
                *c = xb[i * sp + p];
                any |= *c != 0.0;
            }
            if !any {
                continue;
            }
            for (o, row) in w.data.chunks_exact(ci).enumerate() {
                out[b * co * sp + o * sp + p] = dot(row, &col);
            }
        }
    }
    out
}

fn matmul(x: &Tensor, y: &Tensor, tx: bool, ty: bool, out_shape: &[usize]) -> Vec<f32> {
    let (xr, yr, or) = (x.shape.len(), y.shape.len(), out_shape.len());
    let (m, n) = (out_shape[or - 2], out_shape[or - 1]);
    let k = if tx { x.shape[xr - 2] } else { x.shape[xr - 1] };
    let batch = &out_shape[..or - 2];
    let xs = broadcast_strides(&x.shape[..xr - 2], batch);
    let ys = broadcast_strides(&y.shape[..yr - 2], batch);
    let (xmat, ymat) = (x.shape[xr - 2] * x.shape[xr - 1], y.shape[yr - 2] * y.shape[yr - 1]);
    let mut out = Vec::with_capacity(out_shape.iter().product());
    let mut body = |xo: usize, yo: usize| {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f32;
                for q in 0..k {
                    let a = if tx {
                        x.data[xo + q * m + i]
                    } else {
                        x.data[xo + i * k + q]
                    };
                    let b = if ty {
                        y.data[yo + j * k + q]
                    } else {
                        y.data[yo + q * n + j]
                    };
                    s += a * b;
                }
                out.push(s);
            }
        }
    };
    if batch.is_empty() {
        body(0, 0);
    } else {
        for_each_index(batch, [&xs, &ys], |[i, j]| body(i * xmat, j * ymat));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_rounding_equals_conversion_through_f16() {
        let check = |bits: u32| {
            let x = f32::from_bits(bits);
            for flush in [false, true] {
                let (a, b) = (round_fp16(x, flush), round_fp16_via_f16(x, flush));
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{x:e} ({bits:#x}): {a:e} vs {b:e}"
                );
            }
        };
        // Every f32 around the fast path's edges and fp16's rounding boundaries, then a sweep.
        for edge in [0x3880_0000u32, 0x477F_E000, 0x477F_F000, 0x3800_0000, 0x3F80_0000, 0] {
            for d in 0..0x4000u32 {
                for b in [edge.wrapping_add(d), edge.wrapping_sub(d)] {
                    check(b);
                    check(b | 0x8000_0000);
                }
            }
        }
        let mut s = 0x1234_5678_9ABC_DEF0u64;
        for _ in 0..2_000_000 {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            check((s >> 32) as u32);
        }
    }

    #[test]
    fn rounding_flushes_subnormals() {
        assert_eq!(round_fp16(3e-6, true), 0.0);
        assert!(round_fp16(3e-6, false) > 0.0);
        assert_eq!(round_fp16(1.0, true), 1.0);
        assert!(round_fp16(-3e-6, true).is_sign_negative());
    }

    #[test]
    fn iteration_and_broadcast() {
        let s = broadcast_strides(&[1, 3], &[2, 3]);
        assert_eq!(s, vec![0, 1]);
        let mut seen = Vec::new();
        for_each_index(&[2, 3], [&s], |[i]| seen.push(i));
        assert_eq!(seen, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn conv_matches_naive() {
        let x = Tensor {
            shape: vec![1, 3, 1, 2],
            data: vec![1.0, 0.0, 2.0, 0.0, 3.0, 0.0],
        };
        let w = Tensor {
            shape: vec![2, 3, 1, 1],
            data: vec![1.0, 1.0, 1.0, 1.0, -1.0, 0.5],
        };
        assert_eq!(conv1x1(&x, &w), vec![6.0, 0.0, 0.5, 0.0]);
    }
}
