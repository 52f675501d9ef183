//! Lowering: an [`AneKernel`] plus its f32 weights → a MIL [`Program`] and its [`WeightFiles`].
//!
//! Every projection is a 1×1 `conv` with its weight baked in as a BLOBFILE constant
//! (`ane-runtime.md` §3.2): fp16 `[O, I, 1, 1]` under `func main<ios16>`, or int8 `[O, I, 1, 1]`
//! plus fp16 scales `[O, I/B, 1, 1]` dequantised by `constexpr_blockwise_shift_scale` under
//! `func main<ios18>` (§3.6), always in `program(1.0)`, one tensor per weight file at offset 64.
//! Op sequences and blob names follow the catalogue (§3.3).

use anelm_mil::{DType, FunctionBuilder, Opset, Program, TensorType, Value, WeightFiles, f16};

use crate::error::LowerError;
use crate::kernel::{AneKernel, WeightMode, WeightShape};
use crate::quant::quantize_int8;
use crate::surface::LANES;

/// A lowered kernel: the program, its weight files, and its MIL text.
#[derive(Debug, Clone)]
pub struct Lowered {
    /// What was lowered.
    pub kernel: AneKernel,
    /// How its weights are stored.
    pub mode: WeightMode,
    /// The program IR.
    pub program: Program,
    /// The weight files the program's BLOBFILEs name (`@model_path/weights/<n>.bin`).
    pub weights: WeightFiles,
}

impl Lowered {
    /// The MIL text, exactly what the ANE compiler receives.
    pub fn mil_text(&self) -> String {
        self.program.to_string()
    }
}

/// The weights-dictionary path of blob `name`.
pub fn blob_path(name: &str) -> String {
    format!("@model_path/weights/{name}.bin")
}

/// Lower `kernel` with `weights` (row-major f32, one slice per [`AneKernel::weights`] entry,
/// in that order) to a MIL program and its weight files.
pub fn lower(kernel: &AneKernel, weights: &[&[f32]], mode: WeightMode) -> Result<Lowered, LowerError> {
    let shapes = kernel.weights();
    check_dims(kernel, &shapes)?;
    if shapes.len() != weights.len() {
        return Err(LowerError::WeightCount {
            kernel: kernel.to_string(),
            expected: shapes.len(),
            found: weights.len(),
        });
    }
    for (s, w) in shapes.iter().zip(weights) {
        if Some(w.len()) != s.rows.checked_mul(s.cols) {
            return Err(LowerError::WeightShape {
                name: s.name.clone(),
                expected: s.rows.saturating_mul(s.cols),
                found: w.len(),
            });
        }
    }
    let opset = match mode {
        WeightMode::Fp16 => Opset::Ios16,
        WeightMode::Int8 { .. } => Opset::Ios18,
    };
    let mut e = Emitter {
        f: FunctionBuilder::new("main", opset),
        files: WeightFiles::new(),
        mode,
    };
    let pairs: Vec<(&WeightShape, &[f32])> = shapes.iter().zip(weights.iter().copied()).collect();
    let w = |k: usize| {
        pairs
            .get(k)
            .copied()
            .ok_or(LowerError::Internal("weight index out of range"))
    };
    let out = match kernel {
        AneKernel::Linear { cols, .. } | AneKernel::LmHeadChunk { cols, .. } => {
            let x = e.f.input("x", TensorType::surface(*cols, LANES))?;
            let (s, data) = w(0)?;
            let wv = e.weight(s, data)?;
            e.f.linear("y", &x, &wv)?
        }
        AneKernel::FusedLinear { cols, parts } => {
            let x = e.f.input("x", TensorType::surface(*cols, LANES))?;
            let mut ys = Vec::with_capacity(parts.len());
            for k in 0..parts.len() {
                let (s, data) = w(k)?;
                let wv = e.weight(s, data)?;
                let yname = format!("y{}", s.name.trim_start_matches('w'));
                ys.push(e.f.linear(if parts.len() == 1 { "y" } else { &yname }, &x, &wv)?);
            }
            match ys.as_slice() {
                [only] => only.clone(),
                _ => {
                    let ax = e.f.const_int32("ax", 1)?;
                    let ci = e.f.const_bool("ci", false)?;
                    let refs = ys.iter().collect::<Vec<_>>();
                    e.f.concat("y", &refs, &ax, &ci)?
                }
            }
        }
        AneKernel::LinearResidual { rows, cols } => {
            let x = e.f.input("attn", TensorType::surface(*cols, LANES))?;
            let r = e.f.input("xres", TensorType::surface(*rows, LANES))?;
            let (s, data) = w(0)?;
            let wv = e.weight(s, data)?;
            let p = e.f.linear("po", &x, &wv)?;
            e.f.add("y", &r, &p)?
        }
        AneKernel::SwiGluFfn { hidden, .. } => {
            let x = e.f.input("x", TensorType::surface(*hidden, LANES))?;
            let ws = e.ffn_weights(&w)?;
            e.swiglu("out", &x, &ws)?
        }
        AneKernel::SwiGluFfnResidual { hidden, .. } => {
            let x = e.f.input("xnorm", TensorType::surface(*hidden, LANES))?;
            let r = e.f.input("xres", TensorType::surface(*hidden, LANES))?;
            let ws = e.ffn_weights(&w)?;
            let ffn = e.swiglu("ffn", &x, &ws)?;
            e.f.add("y", &r, &ffn)?
        }
        AneKernel::FfnChunk { hidden, .. } => {
            let d =
                i32::try_from(*hidden).map_err(|_| LowerError::BadDims(format!("hidden {hidden} exceeds int32")))?;
            let sp = LANES as i32;
            let packed = e.f.input("packed", TensorType::surface(2 * hidden, LANES))?;
            let b0 = e.f.const_int32s("b0", &[0, 0, 0, 0])?;
            let e0 = e.f.const_int32s("e0", &[1, d, 1, sp])?;
            let b1 = e.f.const_int32s("b1", &[0, d, 0, 0])?;
            let e1 = e.f.const_int32s("e1", &[1, 2 * d, 1, sp])?;
            let x = e.f.slice_by_index("x", &packed, &b0, &e0)?;
            let acc = e.f.slice_by_index("acc", &packed, &b1, &e1)?;
            let ws = e.ffn_weights(&w)?;
            let part = e.swiglu("partial", &x, &ws)?;
            e.f.add("out", &acc, &part)?
        }
    };
    e.f.output(&out)?;
    let program = Program::new(vec![e.f.finish()?]);
    Ok(Lowered {
        kernel: kernel.clone(),
        mode,
        program,
        weights: e.files,
    })
}

fn check_dims(kernel: &AneKernel, shapes: &[WeightShape]) -> Result<(), LowerError> {
    if shapes.is_empty() {
        return Err(LowerError::BadDims(format!(
            "{kernel}: a kernel needs at least one weight"
        )));
    }
    if let Some(s) = shapes.iter().find(|s| s.rows == 0 || s.cols == 0) {
        return Err(LowerError::BadDims(format!(
            "{kernel}: weight {} is {}×{}; every dimension must be at least 1",
            s.name, s.rows, s.cols
        )));
    }
    let limit = i32::MAX as usize / 2;
    if let Some(s) = shapes.iter().find(|s| s.rows > limit || s.cols > limit) {
        return Err(LowerError::BadDims(format!("{kernel}: weight {} is too large", s.name)));
    }
    Ok(())
}

struct Emitter {
    f: FunctionBuilder,
    files: WeightFiles,
    mode: WeightMode,
}

impl Emitter {
    /// Declare weight `s` (fp16 blob, or int8 blob + fp16 scale blob + dequantisation) and
    /// return the fp16 `[O, I, 1, 1]` value the conv uses.
    fn weight(&mut self, s: &WeightShape, data: &[f32]) -> Result<Value, LowerError> {
        let (o, i) = (s.rows, s.cols);
        match self.mode {
            WeightMode::Fp16 => {
                let path = blob_path(&s.name);
                let values = data.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
                self.files.insert_fp16(path.clone(), &values)?;
                Ok(self.f.blob(&s.name, TensorType::fp16([o, i, 1, 1]), &path)?)
            }
            WeightMode::Int8 { block } => {
                let q = quantize_int8(data, o, i, block)?;
                let base = int8_base(&s.name);
                let (qn, sn) = (format!("{base}q"), format!("{base}s"));
                let (qp, sp) = (blob_path(&qn), blob_path(&sn));
                self.files.insert_int8(qp.clone(), &q.data)?;
                self.files.insert_fp16(sp.clone(), &q.scales)?;
                let qv = self.f.blob(&qn, TensorType::new(DType::Int8, [o, i, 1, 1]), &qp)?;
                let sv = self
                    .f
                    .blob(&sn, TensorType::fp16([o, q.blocks_per_row(i), 1, 1]), &sp)?;
                Ok(self.f.constexpr_blockwise_shift_scale(&s.name, &qv, &sv)?)
            }
        }
    }

    fn ffn_weights<'a>(
        &mut self,
        w: &impl Fn(usize) -> Result<(&'a WeightShape, &'a [f32]), LowerError>,
    ) -> Result<[Value; 3], LowerError> {
        let (g, gd) = w(0)?;
        let (u, ud) = w(1)?;
        let (d, dd) = w(2)?;
        Ok([self.weight(g, gd)?, self.weight(u, ud)?, self.weight(d, dd)?])
    }

    /// gate = conv(wg), up = conv(wu), sig = sigmoid(gate), silu = gate·sig, fused = silu·up,
    /// out = conv(wd, fused) — the reference `fused_ffn` sequence.
    fn swiglu(&mut self, out: &str, x: &Value, [wg, wu, wd]: &[Value; 3]) -> Result<Value, LowerError> {
        let gate = self.f.linear("gate", x, wg)?;
        let up = self.f.linear("up", x, wu)?;
        let sig = self.f.sigmoid("sig", &gate)?;
        let silu = self.f.mul("silu", &gate, &sig)?;
        let fused = self.f.mul("fused", &silu, &up)?;
        Ok(self.f.linear(out, &fused, wd)?)
    }
}

/// int8 blob base names follow the C++ system: `weight` → `w` (`wq`/`ws`), `oproj` → `o`
/// (`oq`/`os`), others unchanged (`waq`/`was`, `wgq`/`wgs`, …).
fn int8_base(name: &str) -> &str {
    match name {
        "weight" => "w",
        "oproj" => "o",
        other => other,
    }
}

/// The weights of one chunk of a split FFN, row-major: gate and up `[chunk, hidden]`, down
/// `[hidden, chunk]` — in [`AneKernel::FfnChunk`] weight order.
#[derive(Debug, Clone, PartialEq)]
pub struct FfnChunkWeights {
    /// Gate rows of the chunk.
    pub gate: Vec<f32>,
    /// Up rows of the chunk.
    pub up: Vec<f32>,
    /// Down columns of the chunk, re-packed dense.
    pub down: Vec<f32>,
}

/// The chunk-`index` weights of a split FFN with `chunk` intermediate rows per chunk: rows
/// `[index·chunk, (index+1)·chunk)` of gate and up, and the same **columns** of down, re-packed
/// into a dense `[hidden, chunk]` (`ane-runtime.md` §3.5).
pub fn ffn_chunk_weights(
    gate: &[f32],
    up: &[f32],
    down: &[f32],
    hidden: usize,
    inter: usize,
    index: usize,
    chunk: usize,
) -> Result<FfnChunkWeights, LowerError> {
    let n = hidden.checked_mul(inter);
    for (name, w) in [("gate", gate), ("up", up), ("down", down)] {
        if Some(w.len()) != n {
            return Err(LowerError::WeightShape {
                name: name.into(),
                expected: n.unwrap_or(usize::MAX),
                found: w.len(),
            });
        }
    }
    let start = index
        .checked_mul(chunk)
        .filter(|s| chunk > 0 && s + chunk <= inter)
        .ok_or_else(|| {
            LowerError::BadDims(format!(
                "FFN chunk {index} of {chunk} rows does not fit an intermediate width of {inter}"
            ))
        })?;
    let rows = start * hidden..(start + chunk) * hidden;
    let g = gate[rows.clone()].to_vec();
    let u = up[rows].to_vec();
    let mut d = Vec::with_capacity(hidden * chunk);
    for r in 0..hidden {
        d.extend_from_slice(&down[r * inter + start..r * inter + start + chunk]);
    }
    Ok(FfnChunkWeights {
        gate: g,
        up: u,
        down: d,
    })
}
