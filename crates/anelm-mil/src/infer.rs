//! Result-type inference for the ops anelm emits (and a few it must recognise).
//!
//! Used by the builder (so emitters never hand-compute shapes) and by the checker (so a
//! parsed program whose declared types disagree with its operands is refused).

use std::collections::HashMap;

use crate::error::BuildError;
use crate::ir::{Argument, OpKind, Operand, Statement};
use crate::literal::Literal;
use crate::types::{DType, TensorType};

/// What inference needs to know about the values in scope.
#[derive(Debug, Default, Clone)]
pub(crate) struct Scope {
    pub types: HashMap<String, TensorType>,
    pub consts: HashMap<String, Literal>,
}

struct Ctx<'a> {
    st: &'a Statement,
    scope: &'a Scope,
}

impl<'a> Ctx<'a> {
    fn err(&self, message: impl Into<String>) -> BuildError {
        BuildError::Type {
            op: self.st.op.clone(),
            value: self.st.output.name.clone(),
            message: message.into(),
        }
    }

    fn operand_ty(&self, o: &'a Operand) -> Result<&'a TensorType, BuildError> {
        match o {
            Operand::Var(v) => self.scope.types.get(v).ok_or_else(|| BuildError::Undefined(v.clone())),
            Operand::Lit(l) => Ok(l.ty()),
        }
    }

    fn single(&self, param: &str) -> Result<Option<&'a Operand>, BuildError> {
        match self.st.input(param) {
            None => Ok(None),
            Some(Argument::Single(o)) => Ok(Some(o)),
            Some(Argument::Tuple(_)) => Err(self.err(format!("`{param}` must be a single value, not a tuple"))),
        }
    }

    fn ty(&self, param: &str) -> Result<&'a TensorType, BuildError> {
        let o = self
            .single(param)?
            .ok_or_else(|| self.err(format!("missing argument `{param}`")))?;
        self.operand_ty(o)
    }

    fn opt_ty(&self, param: &str) -> Result<Option<&'a TensorType>, BuildError> {
        match self.single(param)? {
            None => Ok(None),
            Some(o) => self.operand_ty(o).map(Some),
        }
    }

    /// The compile-time value of a parameter; `None` if absent. Errors if present but not constant.
    fn lit(&self, param: &str) -> Result<Option<&'a Literal>, BuildError> {
        match self.single(param)? {
            None => Ok(None),
            Some(Operand::Lit(l)) => Ok(Some(l)),
            Some(Operand::Var(v)) => match self.scope.consts.get(v) {
                Some(l) => Ok(Some(l)),
                None if self.scope.types.contains_key(v) => {
                    Err(self.err(format!("`{param}` must be a compile-time constant, `{v}` is not")))
                }
                None => Err(BuildError::Undefined(v.clone())),
            },
        }
    }

    fn int32s(&self, param: &str) -> Result<Option<&'a [i32]>, BuildError> {
        match self.lit(param)? {
            None => Ok(None),
            Some(l) => l
                .as_int32s()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{param}` must be an inline int32 constant"))),
        }
    }

    fn req_int32s(&self, param: &str) -> Result<&'a [i32], BuildError> {
        self.int32s(param)?
            .ok_or_else(|| self.err(format!("missing argument `{param}`")))
    }

    fn int32(&self, param: &str) -> Result<Option<i32>, BuildError> {
        match self.lit(param)? {
            None => Ok(None),
            Some(l) => l
                .as_int32()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{param}` must be a scalar int32 constant"))),
        }
    }

    fn bool(&self, param: &str) -> Result<Option<bool>, BuildError> {
        match self.lit(param)? {
            None => Ok(None),
            Some(l) => l
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{param}` must be a scalar bool constant"))),
        }
    }

    fn bools(&self, param: &str, rank: usize) -> Result<Vec<bool>, BuildError> {
        match self.lit(param)? {
            None => Ok(vec![false; rank]),
            Some(Literal::Tensor {
                data: crate::TensorData::Bool(v),
                ..
            }) if v.len() == rank => Ok(v.clone()),
            Some(_) => Err(self.err(format!("`{param}` must be a bool constant with {rank} elements"))),
        }
    }

    fn string(&self, param: &str) -> Result<Option<&'a str>, BuildError> {
        match self.lit(param)? {
            None => Ok(None),
            Some(l) => l
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{param}` must be a scalar string constant"))),
        }
    }

    /// Normalise a possibly negative axis against `rank`.
    fn axis(&self, axis: i32, rank: usize) -> Result<usize, BuildError> {
        let r = rank as i64;
        let a = i64::from(axis);
        let n = if a < 0 { a + r } else { a };
        if (0..r).contains(&n) {
            Ok(n as usize)
        } else {
            Err(self.err(format!("axis {axis} is out of range for rank {rank}")))
        }
    }
}

/// Numpy-style broadcast of two shapes (right-aligned, size-1 dims stretch).
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

fn fmt_shape(s: &[usize]) -> String {
    format!("{s:?}")
}

/// Infer the result type of `st`. `Ok(None)` means the op has no inference rule here
/// (unknown ops); errors mean the operands are inconsistent.
pub(crate) fn infer(st: &Statement, scope: &Scope) -> Result<Option<TensorType>, BuildError> {
    let c = Ctx { st, scope };
    let ty = match st.kind() {
        OpKind::Const => {
            let v = st
                .attribute("val")
                .ok_or_else(|| c.err("const has no `val` attribute"))?;
            v.ty().clone()
        }
        OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::RealDiv | OpKind::Pow => {
            let (x, y) = (c.ty("x")?, c.ty("y")?);
            if x.dtype != y.dtype {
                return Err(c.err(format!("operand dtypes differ: {} and {}", x.dtype, y.dtype)));
            }
            let shape = broadcast(&x.shape, &y.shape).ok_or_else(|| {
                c.err(format!(
                    "shapes {} and {} do not broadcast",
                    fmt_shape(&x.shape),
                    fmt_shape(&y.shape)
                ))
            })?;
            TensorType::new(x.dtype, shape)
        }
        OpKind::Sigmoid | OpKind::Silu | OpKind::Sqrt => {
            let x = c.ty("x")?;
            float(&c, x)?;
            x.clone()
        }
        OpKind::Softmax => {
            let x = c.ty("x")?;
            float(&c, x)?;
            c.axis(c.int32("axis")?.unwrap_or(-1), x.rank())?;
            x.clone()
        }
        OpKind::Conv => conv(&c)?,
        OpKind::Matmul => matmul(&c)?,
        OpKind::Concat => concat(&c)?,
        OpKind::SliceByIndex => slice_by_index(&c)?,
        OpKind::SliceBySize => slice_by_size(&c)?,
        OpKind::Reshape => reshape(&c)?,
        OpKind::Transpose => {
            let x = c.ty("x")?;
            let perm = c.req_int32s("perm")?;
            let mut seen = vec![false; x.rank()];
            let mut shape = Vec::with_capacity(x.rank());
            if perm.len() != x.rank() {
                return Err(c.err(format!("perm has {} entries for rank {}", perm.len(), x.rank())));
            }
            for &p in perm {
                let a = c.axis(p, x.rank())?;
                if std::mem::replace(&mut seen[a], true) {
                    return Err(c.err(format!("perm {perm:?} is not a permutation")));
                }
                shape.push(x.shape[a]);
            }
            TensorType::new(x.dtype, shape)
        }
        OpKind::ReduceSum => {
            let x = c.ty("x")?;
            let keep = c.bool("keep_dims")?.unwrap_or(false);
            let mut reduce = vec![false; x.rank()];
            match c.int32s("axes")? {
                None => reduce.iter_mut().for_each(|r| *r = true),
                Some(axes) => {
                    for &a in axes {
                        let a = c.axis(a, x.rank())?;
                        if std::mem::replace(&mut reduce[a], true) {
                            return Err(c.err(format!("axes {axes:?} repeat an axis")));
                        }
                    }
                }
            }
            let shape = x
                .shape
                .iter()
                .zip(&reduce)
                .filter_map(|(&d, &r)| match (r, keep) {
                    (false, _) => Some(d),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect::<Vec<_>>();
            TensorType::new(x.dtype, shape)
        }
        OpKind::Cast => {
            let x = c.ty("x")?;
            let name = c.string("dtype")?.ok_or_else(|| c.err("missing argument `dtype`"))?;
            let d = DType::from_name(name)
                .filter(|d| *d != DType::String && *d != DType::Uint64)
                .ok_or_else(|| c.err(format!("cannot cast to {name:?}")))?;
            x.with_dtype(d)
        }
        OpKind::ConstexprBlockwiseShiftScale => {
            let data = c.ty("data")?;
            let scale = c.ty("scale")?;
            if !scale.dtype.is_float() {
                return Err(c.err(format!("scale must be fp16 or fp32, not {}", scale.dtype)));
            }
            if data.rank() != scale.rank() {
                return Err(c.err(format!(
                    "data rank {} differs from scale rank {}",
                    data.rank(),
                    scale.rank()
                )));
            }
            for (&d, &s) in data.shape.iter().zip(&scale.shape) {
                if s == 0 || d % s != 0 {
                    return Err(c.err(format!(
                        "scale shape {} does not divide data shape {} into whole blocks",
                        fmt_shape(&scale.shape),
                        fmt_shape(&data.shape)
                    )));
                }
            }
            if let Some(off) = c.opt_ty("offset")? {
                if off.shape != scale.shape || off.dtype != data.dtype {
                    return Err(c.err("offset must have the scale's shape and the data's dtype"));
                }
            }
            data.with_dtype(scale.dtype)
        }
        OpKind::ConstexprAffineDequantize => {
            let q = st
                .attribute("quantized_data")
                .ok_or_else(|| c.err("missing attribute `quantized_data`"))?;
            let s = st
                .attribute("scale")
                .ok_or_else(|| c.err("missing attribute `scale`"))?;
            if !s.ty().dtype.is_float() {
                return Err(c.err("scale must be fp16 or fp32"));
            }
            q.ty().with_dtype(s.ty().dtype)
        }
        OpKind::Quantize => {
            let x = c.ty("input")?;
            let name = c
                .string("output_dtype")?
                .ok_or_else(|| c.err("missing argument `output_dtype`"))?;
            let d = DType::from_name(name).ok_or_else(|| c.err(format!("unknown output_dtype {name:?}")))?;
            x.with_dtype(d)
        }
        OpKind::Dequantize => {
            let x = c.ty("input")?;
            let s = c.ty("scale")?;
            x.with_dtype(s.dtype)
        }
        OpKind::Tile => {
            let x = c.ty("x")?;
            let reps = c.req_int32s("reps")?;
            if reps.len() != x.rank() {
                return Err(c.err("reps must have one entry per dimension"));
            }
            let shape = x
                .shape
                .iter()
                .zip(reps)
                .map(|(&d, &r)| usize::try_from(r).ok().and_then(|r| d.checked_mul(r)))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| c.err("reps must be non-negative"))?;
            TensorType::new(x.dtype, shape)
        }
        OpKind::Other => return Ok(None),
    };
    Ok(Some(ty))
}

fn float(c: &Ctx<'_>, x: &TensorType) -> Result<(), BuildError> {
    if x.dtype.is_float() {
        Ok(())
    } else {
        Err(c.err(format!("needs a floating-point input, not {}", x.dtype)))
    }
}

fn pair(c: &Ctx<'_>, param: &str, default: [i32; 2]) -> Result<[usize; 2], BuildError> {
    let v = match c.int32s(param)? {
        None => default.to_vec(),
        Some(v) => v.to_vec(),
    };
    match v.as_slice() {
        [a, b] if *a >= 1 && *b >= 1 => Ok([*a as usize, *b as usize]),
        _ => Err(c.err(format!("`{param}` must be two positive int32s"))),
    }
}

fn conv(c: &Ctx<'_>) -> Result<TensorType, BuildError> {
    let x = c.ty("x")?;
    let w = c.ty("weight")?;
    let [n, ci, h, wd] = x.shape[..] else {
        return Err(c.err(format!("x must be rank 4 [N, C, H, W], got {}", fmt_shape(&x.shape))));
    };
    let [o, cg, kh, kw] = w.shape[..] else {
        return Err(c.err(format!(
            "weight must be rank 4 [O, C/groups, kH, kW], got {}",
            fmt_shape(&w.shape)
        )));
    };
    if w.dtype != x.dtype {
        return Err(c.err(format!("weight dtype {} differs from x dtype {}", w.dtype, x.dtype)));
    }
    let groups = c.int32("groups")?.unwrap_or(1);
    let groups = usize::try_from(groups)
        .ok()
        .filter(|g| *g >= 1)
        .ok_or_else(|| c.err("groups must be ≥ 1"))?;
    if cg.checked_mul(groups) != Some(ci) || o % groups != 0 {
        return Err(c.err(format!(
            "weight {} with groups = {groups} does not fit x with {ci} channels",
            fmt_shape(&w.shape)
        )));
    }
    let strides = pair(c, "strides", [1, 1])?;
    let dil = pair(c, "dilations", [1, 1])?;
    let pad_type = c.string("pad_type")?.unwrap_or("valid");
    let ext = |k: usize, d: usize| k.saturating_sub(1).saturating_mul(d).saturating_add(1);
    let (eh, ew) = (ext(kh, dil[0]), ext(kw, dil[1]));
    let out = |len: usize, e: usize, s: usize| -> Option<usize> { len.checked_sub(e).map(|r| r / s + 1) };
    let (ho, wo) = match pad_type {
        "valid" => (out(h, eh, strides[0]), out(wd, ew, strides[1])),
        "same" => (Some(h.div_ceil(strides[0])), Some(wd.div_ceil(strides[1]))),
        "custom" => {
            let p = c.req_int32s("pad")?;
            let p: Vec<usize> = p
                .iter()
                .map(|&v| usize::try_from(v).ok())
                .collect::<Option<_>>()
                .unwrap_or_default();
            let [t, b, l, r] = p[..] else {
                return Err(c.err("custom pad must be four non-negative int32s"));
            };
            (
                out(h.saturating_add(t).saturating_add(b), eh, strides[0]),
                out(wd.saturating_add(l).saturating_add(r), ew, strides[1]),
            )
        }
        other => return Err(c.err(format!("unknown pad_type {other:?}"))),
    };
    let (Some(ho), Some(wo)) = (ho, wo) else {
        return Err(c.err("kernel is larger than the padded input"));
    };
    if let Some(b) = c.opt_ty("bias")? {
        if b.shape != [o] {
            return Err(c.err(format!("bias must be [{o}]")));
        }
    }
    Ok(TensorType::new(x.dtype, [n, o, ho, wo]))
}

fn matmul(c: &Ctx<'_>) -> Result<TensorType, BuildError> {
    let x = c.ty("x")?;
    let y = c.ty("y")?;
    if x.dtype != y.dtype {
        return Err(c.err(format!("operand dtypes differ: {} and {}", x.dtype, y.dtype)));
    }
    if x.rank() < 2 || y.rank() < 2 {
        return Err(c.err("operands must have rank ≥ 2"));
    }
    let tx = c.bool("transpose_x")?.unwrap_or(false);
    let ty = c.bool("transpose_y")?.unwrap_or(false);
    let (xr, yr) = (x.rank(), y.rank());
    let (m, kx) = if tx {
        (x.shape[xr - 1], x.shape[xr - 2])
    } else {
        (x.shape[xr - 2], x.shape[xr - 1])
    };
    let (ky, n) = if ty {
        (y.shape[yr - 1], y.shape[yr - 2])
    } else {
        (y.shape[yr - 2], y.shape[yr - 1])
    };
    if kx != ky {
        return Err(c.err(format!(
            "inner dimensions differ: x {} and y {} (transpose_x = {tx}, transpose_y = {ty})",
            fmt_shape(&x.shape),
            fmt_shape(&y.shape)
        )));
    }
    let mut shape =
        broadcast(&x.shape[..xr - 2], &y.shape[..yr - 2]).ok_or_else(|| c.err("batch dimensions do not broadcast"))?;
    shape.extend([m, n]);
    Ok(TensorType::new(x.dtype, shape))
}

fn concat(c: &Ctx<'_>) -> Result<TensorType, BuildError> {
    let values = match c.st.input("values") {
        Some(Argument::Tuple(v)) => v,
        Some(Argument::Single(_)) => return Err(c.err("`values` must be a tuple")),
        None => return Err(c.err("missing argument `values`")),
    };
    let tys = values.iter().map(|o| c.operand_ty(o)).collect::<Result<Vec<_>, _>>()?;
    let first = tys.first().ok_or_else(|| c.err("`values` is empty"))?;
    let axis_raw = c.int32("axis")?.ok_or_else(|| c.err("missing argument `axis`"))?;
    let axis = c.axis(axis_raw, first.rank())?;
    c.bool("interleave")?;
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    for t in &tys {
        if t.dtype != first.dtype || t.rank() != first.rank() {
            return Err(c.err(format!("cannot concatenate {t} with {first}")));
        }
        for (i, (&a, &b)) in t.shape.iter().zip(&first.shape).enumerate() {
            if i != axis && a != b {
                return Err(c.err(format!("cannot concatenate {t} with {first} along axis {axis_raw}")));
            }
        }
        shape[axis] = shape[axis]
            .checked_add(t.shape[axis])
            .ok_or_else(|| c.err("size overflow"))?;
    }
    Ok(TensorType::new(first.dtype, shape))
}

fn norm_index(v: i32, d: usize) -> Option<usize> {
    let n = if v < 0 { (d as i64) + i64::from(v) } else { i64::from(v) };
    usize::try_from(n).ok().filter(|&n| n <= d)
}

fn slice_by_index(c: &Ctx<'_>) -> Result<TensorType, BuildError> {
    let x = c.ty("x")?;
    let r = x.rank();
    let begin = c.req_int32s("begin")?;
    let end = c.req_int32s("end")?;
    let stride = c.int32s("stride")?.map(<[i32]>::to_vec).unwrap_or_else(|| vec![1; r]);
    if begin.len() != r || end.len() != r || stride.len() != r {
        return Err(c.err(format!("begin, end and stride need {r} entries each")));
    }
    let bm = c.bools("begin_mask", r)?;
    let em = c.bools("end_mask", r)?;
    let sq = c.bools("squeeze_mask", r)?;
    let mut shape = Vec::with_capacity(r);
    for i in 0..r {
        let d = x.shape[i];
        let s = usize::try_from(stride[i])
            .ok()
            .filter(|s| *s >= 1)
            .ok_or_else(|| c.err("stride must be ≥ 1"))?;
        let b = if bm[i] { Some(0) } else { norm_index(begin[i], d) };
        let e = if em[i] { Some(d) } else { norm_index(end[i], d) };
        let (Some(b), Some(e)) = (b, e) else {
            return Err(c.err(format!(
                "slice [{}, {}) is out of bounds for dimension {i} of size {d}",
                begin[i], end[i]
            )));
        };
        if e <= b {
            return Err(c.err(format!("slice [{b}, {e}) on dimension {i} is empty")));
        }
        let len = (e - b).div_ceil(s);
        if sq[i] {
            if len != 1 {
                return Err(c.err(format!("squeeze_mask on dimension {i} whose slice has {len} elements")));
            }
        } else {
            shape.push(len);
        }
    }
    Ok(TensorType::new(x.dtype, shape))
}

fn slice_by_size(c: &Ctx<'_>) -> Result<TensorType, BuildError> {
    let x = c.ty("x")?;
    let r = x.rank();
    let begin = c.req_int32s("begin")?;
    let size = c.req_int32s("size")?;
    if begin.len() != r || size.len() != r {
        return Err(c.err(format!("begin and size need {r} entries each")));
    }
    let mut shape = Vec::with_capacity(r);
    for i in 0..r {
        let d = x.shape[i];
        let b = norm_index(begin[i], d).filter(|&b| b < d);
        let Some(b) = b else {
            return Err(c.err(format!(
                "begin {} is out of bounds for dimension {i} of size {d}",
                begin[i]
            )));
        };
        let len = if size[i] == -1 {
            d - b
        } else {
            match usize::try_from(size[i]) {
                Ok(n) if n >= 1 && n <= d - b => n,
                _ => {
                    return Err(c.err(format!(
                        "size {} from {b} does not fit dimension {i} of size {d}",
                        size[i]
                    )));
                }
            }
        };
        shape.push(len);
    }
    Ok(TensorType::new(x.dtype, shape))
}

fn reshape(c: &Ctx<'_>) -> Result<TensorType, BuildError> {
    let x = c.ty("x")?;
    let target = c.req_int32s("shape")?;
    let total = x.num_elements().ok_or_else(|| c.err("size overflow"))?;
    let mut infer_at = None;
    let mut known = 1usize;
    let mut shape = Vec::with_capacity(target.len());
    for (i, &d) in target.iter().enumerate() {
        if d == -1 {
            if infer_at.replace(i).is_some() {
                return Err(c.err("shape has more than one -1"));
            }
            shape.push(0);
        } else {
            let d = usize::try_from(d)
                .ok()
                .filter(|d| *d >= 1)
                .ok_or_else(|| c.err(format!("bad shape entry {d}")))?;
            known = known.checked_mul(d).ok_or_else(|| c.err("size overflow"))?;
            shape.push(d);
        }
    }
    if let Some(i) = infer_at {
        if known == 0 || total % known != 0 {
            return Err(c.err(format!("cannot reshape {} into {target:?}", fmt_shape(&x.shape))));
        }
        shape[i] = total / known;
    } else if known != total {
        return Err(c.err(format!(
            "cannot reshape {} ({total} elements) into {target:?}",
            fmt_shape(&x.shape)
        )));
    }
    Ok(TensorType::new(x.dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::broadcast;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast(&[1, 4, 1, 32], &[1, 1, 1, 32]), Some(vec![1, 4, 1, 32]));
        assert_eq!(broadcast(&[1, 4, 1, 32], &[]), Some(vec![1, 4, 1, 32]));
        assert_eq!(broadcast(&[2, 4], &[3, 4]), None);
        assert_eq!(broadcast(&[4, 1], &[1, 1, 5]), Some(vec![1, 4, 5]));
    }
}
