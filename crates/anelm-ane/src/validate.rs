//! Validation of a parsed program against the hardware rules, and constant folding into an
//! [`Executable`]. Every refusal names its [`Rule`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anelm_mil::{
    Argument, BlobData, DType, Function, Literal, OpKind, Operand, Opset, Program, ProgramVersion, Statement,
    TensorData,
};

use crate::emu::EmuConfig;
use crate::error::AneError;
use crate::exec::{Executable, Tensor, literal_tensor, round_fp16};
use crate::rules::{MAX_PROGRAM_OUTPUTS, Rule, SURFACE_ALIGN_BYTES, unsorted_pair};

/// Ops the emulator accepts and executes (see [`Rule::OpWhitelist`] for the evidence).
pub const WHITELIST: [OpKind; 17] = [
    OpKind::Const,
    OpKind::Conv,
    OpKind::Matmul,
    OpKind::Add,
    OpKind::Sub,
    OpKind::Mul,
    OpKind::Pow,
    OpKind::Sigmoid,
    OpKind::Silu,
    OpKind::Softmax,
    OpKind::Concat,
    OpKind::SliceByIndex,
    OpKind::SliceBySize,
    OpKind::Reshape,
    OpKind::Transpose,
    OpKind::ReduceSum,
    OpKind::ConstexprBlockwiseShiftScale,
];

fn rule(r: Rule, detail: impl Into<String>) -> AneError {
    AneError::rule_err(r, detail)
}

fn operand_var<'a>(st: &'a Statement, param: &str) -> Option<&'a str> {
    st.input_var(param)
}

/// Validate `program` with `weights` under `cfg` and fold its constants.
pub(crate) fn validate(
    program: &Program,
    weights: &anelm_mil::WeightFiles,
    cfg: &EmuConfig,
) -> Result<Executable, AneError> {
    let f = dialect(program)?;
    // The signature rules come first: a wrongly typed surface is a hardware rule even when it
    // also makes the body ill-typed.
    io_rules(f)?;
    io_limits(f, cfg)?;
    program.check().map_err(AneError::Invalid)?;
    let weight_bytes = weights
        .iter()
        .map(|(_, b)| b.len() as u64)
        .fold(0u64, u64::saturating_add);
    if weight_bytes > cfg.limits.max_program_weight_bytes {
        return Err(rule(
            Rule::ProgramWeights,
            format!(
                "the program's weight files hold {weight_bytes} bytes, over the per-program limit of {} bytes",
                cfg.limits.max_program_weight_bytes
            ),
        ));
    }

    let stmts: HashMap<&str, &Statement> = f.body.iter().map(|s| (s.output.name.as_str(), s)).collect();
    let is_compile_time = |name: &str| {
        stmts
            .get(name)
            .is_some_and(|s| matches!(s.kind(), OpKind::Const | OpKind::ConstexprBlockwiseShiftScale))
    };

    for st in &f.body {
        let kind = st.kind();
        if kind == OpKind::Tile {
            return Err(rule(Rule::NoTile, format!("statement `{}` is a tile", st.output.name)));
        }
        if !WHITELIST.contains(&kind) {
            return Err(rule(
                Rule::OpWhitelist,
                format!(
                    "statement `{}` uses `{}`, which is not verified on hardware",
                    st.output.name, st.op
                ),
            ));
        }
    }
    for st in &f.body {
        op_rules(st, &is_compile_time, &stmts)?;
    }
    fp16_rules(f, &stmts)?;
    dim_rules(f, &stmts, cfg)?;
    let kernel_bytes = kernel_size(f);
    if kernel_bytes > cfg.limits.max_kernel_const_bytes {
        return Err(rule(
            Rule::KernelSize,
            format!(
                "the program's constants are {kernel_bytes} bytes as fp16, over the per-kernel limit of {} bytes",
                cfg.limits.max_kernel_const_bytes
            ),
        ));
    }
    fold(f, program, weights, cfg)
}

/// Build the executable of a program that passed [`validate`] before under the same settings
/// (a compile-cache hit): the dialect is checked and constants are folded, the other rules are
/// not re-run.
pub(crate) fn load_validated(
    program: &Program,
    weights: &anelm_mil::WeightFiles,
    cfg: &EmuConfig,
) -> Result<Executable, AneError> {
    let f = dialect(program)?;
    program.check().map_err(AneError::Invalid)?;
    fold(f, program, weights, cfg)
}

fn dialect(program: &Program) -> Result<&Function, AneError> {
    if program.build_info_value("coremlc-version").is_none() {
        return Err(rule(
            Rule::Dialect,
            "buildInfo has no \"coremlc-version\" entry (without it the MIL parser fails)",
        ));
    }
    let f = match program.functions.as_slice() {
        [f] if f.name == "main" => f,
        fs => {
            let names = fs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ");
            return Err(rule(
                Rule::Dialect,
                format!("expected exactly one function `main`, found [{names}]"),
            ));
        }
    };
    let ok = matches!(
        (program.version, f.opset),
        (ProgramVersion::V1_0, Opset::Ios16)
            | (ProgramVersion::V1_0, Opset::Ios18)
            | (ProgramVersion::V1_3, Opset::Ios18)
    );
    if !ok {
        return Err(rule(
            Rule::Dialect,
            format!(
                "program({}) with func main<{}> is not a verified combination (1.0 + ios16/ios18, 1.3 + ios18)",
                program.version.as_str(),
                f.opset
            ),
        ));
    }
    Ok(f)
}

fn io_rules(f: &Function) -> Result<(), AneError> {
    let outs = f.output_values();
    let all = f
        .inputs
        .iter()
        .map(|v| ("input", v))
        .chain(outs.iter().map(|v| ("output", v)));
    for (what, v) in all {
        if v.ty.dtype != DType::Fp16 {
            return Err(rule(Rule::IoFp16, format!("{what} `{}` is {}", v.name, v.ty)));
        }
        match v.ty.shape.as_slice() {
            [1, _, 1, w] if *w >= 32 => {}
            [1, _, 1, w] => {
                return Err(rule(
                    Rule::IoLanes,
                    format!("{what} `{}` is {} with W = {w} < 32", v.name, v.ty),
                ));
            }
            _ => {
                return Err(rule(
                    Rule::IoShape,
                    format!("{what} `{}` is {}, not [1, C, 1, W]", v.name, v.ty),
                ));
            }
        }
    }
    if f.inputs.is_empty() || f.outputs.is_empty() {
        return Err(rule(
            Rule::IoShape,
            "a program needs at least one input and one output surface",
        ));
    }
    Ok(())
}

/// The output count and, on M5, the 128-byte size of every runtime input and output.
fn io_limits(f: &Function, cfg: &EmuConfig) -> Result<(), AneError> {
    if f.outputs.len() > MAX_PROGRAM_OUTPUTS {
        return Err(rule(
            Rule::OutputCount,
            format!(
                "the program returns {} outputs ({}); at most {MAX_PROGRAM_OUTPUTS} come back intact",
                f.outputs.len(),
                f.outputs.join(", ")
            ),
        ));
    }
    let inputs: Vec<&str> = f.inputs.iter().map(|v| v.name.as_str()).collect();
    let outputs: Vec<&str> = f.outputs.iter().map(String::as_str).collect();
    for (what, names) in [("inputs", &inputs), ("outputs", &outputs)] {
        if let Some((a, b)) = unsorted_pair(names) {
            return Err(rule(
                Rule::IoSortedNames,
                format!(
                    "the {what} are declared ({}) with `{a}` before `{b}`, not in sorted order of their names",
                    names.join(", ")
                ),
            ));
        }
    }
    if cfg.chip.aligns_io_to_128() {
        let outs = f.output_values();
        let all = f
            .inputs
            .iter()
            .map(|v| ("input", v))
            .chain(outs.iter().map(|v| ("output", v)));
        for (what, v) in all {
            let bytes = v.ty.num_elements().and_then(|n| n.checked_mul(2));
            if bytes.is_none_or(|b| b % SURFACE_ALIGN_BYTES != 0) {
                return Err(rule(
                    Rule::M5Alignment,
                    format!(
                        "{what} `{}` is {} ({} bytes), not a multiple of {SURFACE_ALIGN_BYTES} bytes, on {}",
                        v.name,
                        v.ty,
                        bytes.map_or_else(|| "too many".to_string(), |b| b.to_string()),
                        cfg.chip.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn op_rules(
    st: &Statement,
    is_compile_time: &dyn Fn(&str) -> bool,
    stmts: &HashMap<&str, &Statement>,
) -> Result<(), AneError> {
    let name = &st.output.name;
    match st.kind() {
        OpKind::Conv => {
            let weight_const = match st.input("weight") {
                Some(Argument::Single(Operand::Var(v))) => is_compile_time(v),
                Some(Argument::Single(Operand::Lit(_))) => true,
                _ => false,
            };
            if !weight_const {
                return Err(rule(
                    Rule::ConvConstWeight,
                    format!("conv `{name}` takes its weight from a runtime value"),
                ));
            }
            let lit = |p: &str| -> Option<&Literal> {
                match st.input(p)? {
                    Argument::Single(Operand::Var(v)) => stmts.get(v.as_str()).and_then(|s| s.const_value()),
                    Argument::Single(Operand::Lit(l)) => Some(l),
                    Argument::Tuple(_) => None,
                }
            };
            let pair_ok = |p: &str| lit(p).is_none_or(|l| l.as_int32s() == Some(&[1, 1]));
            let pad_ok = lit("pad_type").is_none_or(|l| l.as_str() == Some("valid"));
            let groups_ok = lit("groups").is_none_or(|l| l.as_int32() == Some(1));
            let kernel_1x1 = weight_shape(st, stmts).is_some_and(|s| s.len() == 4 && s[2] == 1 && s[3] == 1);
            let problems = [
                (!kernel_1x1, "the kernel is not 1×1"),
                (!pair_ok("strides"), "strides are not [1, 1]"),
                (!pair_ok("dilations"), "dilations are not [1, 1]"),
                (!pad_ok, "pad_type is not \"valid\""),
                (!groups_ok, "groups is not 1"),
                (st.input("bias").is_some(), "a bias is given"),
            ];
            if let Some((_, why)) = problems.iter().find(|(bad, _)| *bad) {
                return Err(rule(Rule::ConvForm, format!("conv `{name}`: {why}")));
            }
        }
        OpKind::ConstexprBlockwiseShiftScale => {
            for p in ["data", "scale", "offset"] {
                if let Some(v) = operand_var(st, p) {
                    if !stmts.get(v).is_some_and(|s| s.kind() == OpKind::Const) {
                        return Err(rule(
                            Rule::ConvConstWeight,
                            format!("constexpr_blockwise_shift_scale `{name}` reads `{p}` from non-constant `{v}`"),
                        ));
                    }
                }
            }
        }
        OpKind::Concat => {
            let interleave = match st.input("interleave") {
                Some(Argument::Single(Operand::Var(v))) => stmts
                    .get(v.as_str())
                    .and_then(|s| s.const_value())
                    .and_then(Literal::as_bool),
                Some(Argument::Single(Operand::Lit(l))) => l.as_bool(),
                _ => Some(false),
            };
            if interleave != Some(false) {
                return Err(rule(
                    Rule::OpWhitelist,
                    format!("concat `{name}` with interleave = true is not verified on hardware"),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

fn weight_shape<'a>(st: &'a Statement, stmts: &HashMap<&str, &'a Statement>) -> Option<&'a [usize]> {
    match st.input("weight")? {
        Argument::Single(Operand::Var(v)) => stmts.get(v.as_str()).map(|s| s.output.ty.shape.as_slice()),
        Argument::Single(Operand::Lit(l)) => Some(l.ty().shape.as_slice()),
        Argument::Tuple(_) => None,
    }
}

fn fp16_rules(f: &Function, stmts: &HashMap<&str, &Statement>) -> Result<(), AneError> {
    for st in &f.body {
        let name = &st.output.name;
        let dt = st.output.ty.dtype;
        match st.kind() {
            OpKind::Const => {
                if matches!(dt, DType::Fp32 | DType::Uint64) {
                    return Err(rule(Rule::Fp16Compute, format!("const `{name}` is {dt}")));
                }
            }
            _ if dt != DType::Fp16 => {
                return Err(rule(Rule::Fp16Compute, format!("`{name}` ({}) computes {dt}", st.op)));
            }
            _ => {}
        }
        for (param, arg) in &st.inputs {
            for o in arg.operands() {
                let ty = match o {
                    Operand::Var(v) => stmts.get(v.as_str()).map(|s| &s.output.ty),
                    Operand::Lit(l) => Some(l.ty()),
                };
                let Some(ty) = ty else { continue };
                let data_of_constexpr = st.kind() == OpKind::ConstexprBlockwiseShiftScale && param == "data";
                let offset_of_constexpr = st.kind() == OpKind::ConstexprBlockwiseShiftScale && param == "offset";
                if ty.dtype == DType::Int8 && !(data_of_constexpr || offset_of_constexpr) {
                    return Err(rule(
                        Rule::Fp16Compute,
                        format!("`{name}` ({}) reads int8 `{param}`; int8 is only constexpr data", st.op),
                    ));
                }
                if data_of_constexpr && ty.dtype != DType::Int8 {
                    return Err(rule(
                        Rule::Fp16Compute,
                        format!(
                            "constexpr_blockwise_shift_scale `{name}` data is {}, not int8",
                            ty.dtype
                        ),
                    ));
                }
                if st.kind() == OpKind::ConstexprBlockwiseShiftScale && param == "scale" && ty.dtype != DType::Fp16 {
                    return Err(rule(
                        Rule::Fp16Compute,
                        format!(
                            "constexpr_blockwise_shift_scale `{name}` scale is {}, not fp16",
                            ty.dtype
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn dim_rules(f: &Function, stmts: &HashMap<&str, &Statement>, cfg: &EmuConfig) -> Result<(), AneError> {
    let values = f
        .inputs
        .iter()
        .map(|v| (&v.name, &v.ty))
        .chain(f.body.iter().map(|s| (&s.output.name, &s.output.ty)));
    for (name, ty) in values {
        if ty.dtype == DType::String {
            continue;
        }
        if let Some(d) = ty.shape.iter().find(|&&d| d > cfg.limits.max_dim) {
            return Err(rule(
                Rule::DimCap,
                format!(
                    "`{name}` is {ty}: dimension {d} exceeds the per-op cap of {}",
                    cfg.limits.max_dim
                ),
            ));
        }
        if ty.shape.contains(&0) {
            return Err(rule(Rule::DimCap, format!("`{name}` is {ty}: a dimension is 0")));
        }
        if ty.num_elements().is_none_or(|n| n > cfg.limits.max_tensor_elements) {
            return Err(rule(
                Rule::DimCap,
                format!(
                    "`{name}` is {ty}: more than the {} elements one tensor may hold",
                    cfg.limits.max_tensor_elements
                ),
            ));
        }
    }
    for st in f.body.iter().filter(|s| s.kind() == OpKind::Conv) {
        if let Some(&[_, ic, ..]) = weight_shape(st, stmts) {
            if ic > cfg.limits.max_conv_input_channels {
                return Err(rule(
                    Rule::DimCap,
                    format!(
                        "conv `{}` reads {ic} input channels, over the conv input cap of {}",
                        st.output.name, cfg.limits.max_conv_input_channels
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Constant bytes counted against the per-kernel limit: every compile-time tensor the compute
/// ops see, at fp16 size (int8 weights count as the fp16 tensor they dequantise to, since the
/// compiler may expand them; the data and scales feeding a constexpr are not counted twice).
fn kernel_size(f: &Function) -> u64 {
    let feeds_constexpr: HashSet<&str> = f
        .body
        .iter()
        .filter(|s| s.kind() == OpKind::ConstexprBlockwiseShiftScale)
        .flat_map(|s| s.uses())
        .collect();
    f.body
        .iter()
        .filter(|s| matches!(s.kind(), OpKind::Const | OpKind::ConstexprBlockwiseShiftScale))
        .filter(|s| matches!(s.output.ty.dtype, DType::Fp16 | DType::Int8))
        .filter(|s| !feeds_constexpr.contains(s.output.name.as_str()))
        .map(|s| s.output.ty.num_elements().map_or(u64::MAX, |n| n as u64 * 2))
        .fold(0u64, u64::saturating_add)
}

/// Resolve blobs, fold constexprs, and collect the runtime steps.
fn fold(
    f: &Function,
    program: &Program,
    weights: &anelm_mil::WeightFiles,
    cfg: &EmuConfig,
) -> Result<Executable, AneError> {
    let flush = cfg.flush_subnormals;
    let mut blobs: HashMap<String, BlobData> = HashMap::new();
    let mut const_bytes = 0u64;
    for r in program.blob_refs() {
        let data = weights.resolve(&r).map_err(|e| {
            rule(
                Rule::BlobHeader,
                format!("BLOBFILE {:?} for `{}`: {e}", r.path, r.value),
            )
        })?;
        const_bytes += match &data {
            BlobData::Fp16(v) => v.len() as u64 * 2,
            BlobData::Int8(v) => v.len() as u64,
        };
        blobs.insert(r.value.to_string(), data);
    }
    let mut tensors: HashMap<String, Arc<Tensor>> = HashMap::new();
    let mut int8: HashMap<String, (Vec<usize>, Vec<i8>)> = HashMap::new();
    let mut params: HashMap<String, Literal> = HashMap::new();
    let mut steps = Vec::new();
    for st in &f.body {
        let name = st.output.name.clone();
        match st.kind() {
            OpKind::Const => {
                let shape = st.output.ty.shape.clone();
                if let Some(b) = blobs.remove(&name) {
                    match b {
                        BlobData::Fp16(v) => {
                            let data = v.iter().map(|h| round_fp16(h.to_f32(), flush)).collect();
                            tensors.insert(name, Arc::new(Tensor { shape, data }));
                        }
                        BlobData::Int8(v) => {
                            int8.insert(name, (shape, v));
                        }
                    }
                    continue;
                }
                let Some(val) = st.const_value() else { continue };
                if let Some(t) = literal_tensor(val, flush) {
                    const_bytes += t.data.len() as u64 * 2;
                    tensors.insert(name.clone(), Arc::new(t));
                } else if let Some(TensorData::Int8(v)) = val.data() {
                    const_bytes += v.len() as u64;
                    int8.insert(name.clone(), (shape, v.clone()));
                }
                params.insert(name, val.clone());
            }
            OpKind::ConstexprBlockwiseShiftScale => {
                let t = dequantize(st, &int8, &tensors, flush)?;
                tensors.insert(name, Arc::new(t));
            }
            _ => steps.push(st.clone()),
        }
    }
    // Surfaces bind by sorted name, as on the hardware (Rule::IoSortedNames): the validator
    // refuses other declaration orders, and a cache load (which skips the rules) binds the same way.
    let shapes = |vals: Vec<anelm_mil::Value>| {
        let mut v: Vec<(String, Vec<usize>)> = vals.into_iter().map(|v| (v.name, v.ty.shape)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    Ok(Executable {
        inputs: shapes(f.inputs.clone()),
        outputs: shapes(f.output_values()),
        steps,
        tensors,
        params,
        const_bytes,
        flush,
    })
}

/// `constexpr_blockwise_shift_scale`: w = (q − offset) · scale, scale broadcast over blocks.
fn dequantize(
    st: &Statement,
    int8: &HashMap<String, (Vec<usize>, Vec<i8>)>,
    tensors: &HashMap<String, Arc<Tensor>>,
    flush: bool,
) -> Result<Tensor, AneError> {
    let err = |m: &str| AneError::Exec {
        op: st.op.clone(),
        value: st.output.name.clone(),
        message: m.to_string(),
    };
    let (shape, q) = operand_var(st, "data")
        .and_then(|v| int8.get(v))
        .ok_or_else(|| err("data is not an int8 constant"))?;
    let scale = operand_var(st, "scale")
        .and_then(|v| tensors.get(v))
        .ok_or_else(|| err("scale is not an fp16 constant"))?;
    let offset = match operand_var(st, "offset") {
        None => None,
        Some(v) => Some(int8.get(v).ok_or_else(|| err("offset is not an int8 constant"))?),
    };
    if scale.shape.len() != shape.len() || q.len() != shape.iter().product::<usize>() {
        return Err(err("data and scale ranks differ"));
    }
    let block: Vec<usize> = shape
        .iter()
        .zip(&scale.shape)
        .map(|(&d, &s)| d.checked_div(s).unwrap_or(1))
        .collect();
    let mut sstr = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        sstr[i] = sstr[i + 1] * scale.shape[i + 1];
    }
    let mut data = Vec::with_capacity(q.len());
    let mut idx = vec![0usize; shape.len()];
    for &qv in q {
        let si: usize = idx
            .iter()
            .zip(&block)
            .zip(&sstr)
            .map(|((i, b), s)| (i / b.max(&1)) * s)
            .sum();
        let off = offset.map_or(0.0, |(_, o)| f32::from(o.get(si).copied().unwrap_or(0)));
        let s = scale.data.get(si).copied().unwrap_or(0.0);
        data.push(round_fp16((f32::from(qv) - off) * s, flush));
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(Tensor {
        shape: shape.clone(),
        data,
    })
}
