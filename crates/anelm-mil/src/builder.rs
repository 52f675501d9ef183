//! A builder that emits well-typed, uniquely named statements for the ops anelm uses.
//!
//! Each op method infers the result type from its operands (so emitters never write shapes
//! by hand), names the op after its result, and writes arguments in the alphabetical order
//! the MIL printer of coremltools uses (`conv(dilations = …, groups = …, …, weight = W, x = x)`).

use std::collections::HashSet;

use crate::check::{check_statement, ident};
use crate::error::BuildError;
use crate::infer::{Scope, infer};
use crate::ir::{Argument, Function, Opset, Statement, Value};
use crate::literal::Literal;
use crate::types::{DType, TensorType};

/// The chunk-header offset every one-tensor weight file is referenced at.
pub const BLOB_OFFSET: u64 = 64;

/// The shared 1×1 conv parameter constants (`pt`, `st`, `pd`, `dl`, `gr` in the C++ system).
#[derive(Debug, Clone, PartialEq)]
pub struct ConvParams {
    /// `pad_type` = "valid".
    pub pad_type: Value,
    /// `strides` = [1, 1].
    pub strides: Value,
    /// `pad` = [0, 0, 0, 0].
    pub pad: Value,
    /// `dilations` = [1, 1].
    pub dilations: Value,
    /// `groups` = 1.
    pub groups: Value,
}

/// Builds one [`Function`], statement by statement, checking each as it goes.
#[derive(Debug, Clone)]
pub struct FunctionBuilder {
    name: String,
    opset: Opset,
    inputs: Vec<Value>,
    body: Vec<Statement>,
    outputs: Vec<String>,
    scope: Scope,
    op_names: HashSet<String>,
    conv_params: Option<ConvParams>,
}

impl FunctionBuilder {
    /// Start a function called `name` targeting `opset` (ios16 for fp16, ios18 for int8).
    pub fn new(name: impl Into<String>, opset: Opset) -> Self {
        FunctionBuilder {
            name: name.into(),
            opset,
            inputs: Vec::new(),
            body: Vec::new(),
            outputs: Vec::new(),
            scope: Scope::default(),
            op_names: HashSet::new(),
            conv_params: None,
        }
    }

    /// Declare the next runtime input (inputs are bound to surfaces in declaration order).
    pub fn input(&mut self, name: &str, ty: TensorType) -> Result<Value, BuildError> {
        ident(name)?;
        if self.scope.types.contains_key(name) {
            return Err(BuildError::Redefined(name.to_string()));
        }
        let v = Value::new(name, ty);
        self.scope.types.insert(v.name.clone(), v.ty.clone());
        self.inputs.push(v.clone());
        Ok(v)
    }

    /// Mark a value as the next function output.
    pub fn output(&mut self, v: &Value) -> Result<(), BuildError> {
        if !self.scope.types.contains_key(&v.name) {
            return Err(BuildError::UndefinedOutput(v.name.clone()));
        }
        self.outputs.push(v.name.clone());
        Ok(())
    }

    /// Finish: the function, checked as a whole.
    pub fn finish(self) -> Result<Function, BuildError> {
        let f = Function {
            name: self.name,
            opset: self.opset,
            inputs: self.inputs,
            body: self.body,
            outputs: self.outputs,
        };
        f.check()?;
        Ok(f)
    }

    /// The compile-time value of a const defined in this builder.
    pub fn const_value(&self, v: &Value) -> Option<&Literal> {
        self.scope.consts.get(&v.name)
    }

    /// Emit a statement of op `op`; its type is inferred, or `ty` is used for ops without a rule.
    /// This is the general entry point; the named methods below are preferred.
    pub fn op(
        &mut self,
        name: &str,
        op: &str,
        inputs: Vec<(String, Argument)>,
        extra_attributes: Vec<(String, Literal)>,
        ty: Option<TensorType>,
    ) -> Result<Value, BuildError> {
        let mut attributes = vec![("name".to_string(), Literal::string(name))];
        attributes.extend(extra_attributes);
        let placeholder = TensorType::scalar(DType::Fp16);
        let mut st = Statement {
            output: Value::new(name, placeholder),
            op: op.to_string(),
            inputs,
            attributes,
        };
        ident(name)?;
        let inferred = infer(&st, &self.scope)?;
        st.output.ty = match (inferred, ty) {
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => {
                return Err(BuildError::Type {
                    op: op.to_string(),
                    value: name.to_string(),
                    message: "no inference rule for this op; give its result type".into(),
                });
            }
        };
        let f = Function {
            name: self.name.clone(),
            opset: self.opset,
            inputs: vec![],
            body: vec![],
            outputs: vec![],
        };
        check_statement(&st, &f, &self.scope, &mut self.op_names)?;
        if let Some(v) = st.const_value() {
            self.scope.consts.insert(name.to_string(), v.clone());
        }
        self.scope.types.insert(name.to_string(), st.output.ty.clone());
        let v = st.output.clone();
        self.body.push(st);
        Ok(v)
    }

    fn emit(&mut self, name: &str, op: &str, inputs: &[(&str, &Value)]) -> Result<Value, BuildError> {
        let inputs = inputs
            .iter()
            .map(|(k, v)| (k.to_string(), Argument::var(v.name.clone())))
            .collect();
        self.op(name, op, inputs, Vec::new(), None)
    }

    /// `const` with an arbitrary literal value.
    pub fn constant(&mut self, name: &str, val: Literal) -> Result<Value, BuildError> {
        self.op(name, "const", Vec::new(), vec![("val".to_string(), val)], None)
    }

    /// Scalar int32 const.
    pub fn const_int32(&mut self, name: &str, v: i32) -> Result<Value, BuildError> {
        self.constant(name, Literal::int32(v))
    }

    /// Rank-1 int32 const (shapes, axes, begin/end, strides).
    pub fn const_int32s(&mut self, name: &str, v: &[i32]) -> Result<Value, BuildError> {
        self.constant(name, Literal::int32s(v))
    }

    /// Scalar bool const.
    pub fn const_bool(&mut self, name: &str, v: bool) -> Result<Value, BuildError> {
        self.constant(name, Literal::bool(v))
    }

    /// Scalar string const.
    pub fn const_string(&mut self, name: &str, v: &str) -> Result<Value, BuildError> {
        self.constant(name, Literal::string(v))
    }

    /// Scalar fp16 const (rounded to nearest even).
    pub fn const_fp16(&mut self, name: &str, v: f32) -> Result<Value, BuildError> {
        self.constant(name, Literal::fp16(v))
    }

    /// A BLOBFILE-backed const: one tensor per file, referenced at offset 64.
    pub fn blob(&mut self, name: &str, ty: TensorType, path: &str) -> Result<Value, BuildError> {
        self.constant(name, Literal::blob(ty, path, BLOB_OFFSET))
    }

    /// Declare the shared 1×1 conv constants `pt`, `st`, `pd`, `dl`, `gr` (once per program).
    pub fn conv_params(&mut self) -> Result<ConvParams, BuildError> {
        if let Some(p) = &self.conv_params {
            return Ok(p.clone());
        }
        let p = ConvParams {
            pad_type: self.const_string("pt", "valid")?,
            strides: self.const_int32s("st", &[1, 1])?,
            pad: self.const_int32s("pd", &[0, 0, 0, 0])?,
            dilations: self.const_int32s("dl", &[1, 1])?,
            groups: self.const_int32("gr", 1)?,
        };
        self.conv_params = Some(p.clone());
        Ok(p)
    }

    /// `conv` with explicit parameter constants.
    pub fn conv(&mut self, name: &str, x: &Value, weight: &Value, p: &ConvParams) -> Result<Value, BuildError> {
        self.emit(
            name,
            "conv",
            &[
                ("dilations", &p.dilations),
                ("groups", &p.groups),
                ("pad", &p.pad),
                ("pad_type", &p.pad_type),
                ("strides", &p.strides),
                ("weight", weight),
                ("x", x),
            ],
        )
    }

    /// A linear layer as a 1×1 `conv`: `weight` is `[O, I, 1, 1]`, `x` is `[1, I, 1, W]`.
    /// Declares the shared conv constants on first use.
    pub fn linear(&mut self, name: &str, x: &Value, weight: &Value) -> Result<Value, BuildError> {
        let p = self.conv_params()?;
        self.conv(name, x, weight, &p)
    }

    /// Elementwise `add(x, y)` with broadcasting.
    pub fn add(&mut self, name: &str, x: &Value, y: &Value) -> Result<Value, BuildError> {
        self.emit(name, "add", &[("x", x), ("y", y)])
    }

    /// Elementwise `sub(x, y)` with broadcasting.
    pub fn sub(&mut self, name: &str, x: &Value, y: &Value) -> Result<Value, BuildError> {
        self.emit(name, "sub", &[("x", x), ("y", y)])
    }

    /// Elementwise `mul(x, y)` with broadcasting.
    pub fn mul(&mut self, name: &str, x: &Value, y: &Value) -> Result<Value, BuildError> {
        self.emit(name, "mul", &[("x", x), ("y", y)])
    }

    /// Elementwise `real_div(x, y)` with broadcasting.
    pub fn real_div(&mut self, name: &str, x: &Value, y: &Value) -> Result<Value, BuildError> {
        self.emit(name, "real_div", &[("x", x), ("y", y)])
    }

    /// Elementwise `pow(x, y)` (e.g. `y` = fp16 −0.5 for 1/√x).
    pub fn pow(&mut self, name: &str, x: &Value, y: &Value) -> Result<Value, BuildError> {
        self.emit(name, "pow", &[("x", x), ("y", y)])
    }

    /// `sigmoid(x)`.
    pub fn sigmoid(&mut self, name: &str, x: &Value) -> Result<Value, BuildError> {
        self.emit(name, "sigmoid", &[("x", x)])
    }

    /// `silu(x)` = x·σ(x).
    pub fn silu(&mut self, name: &str, x: &Value) -> Result<Value, BuildError> {
        self.emit(name, "silu", &[("x", x)])
    }

    /// `sqrt(x)`.
    pub fn sqrt(&mut self, name: &str, x: &Value) -> Result<Value, BuildError> {
        self.emit(name, "sqrt", &[("x", x)])
    }

    /// `softmax(axis, x)`; `axis` is a scalar int32 const.
    pub fn softmax(&mut self, name: &str, x: &Value, axis: &Value) -> Result<Value, BuildError> {
        self.emit(name, "softmax", &[("axis", axis), ("x", x)])
    }

    /// `concat(axis, interleave, values = (…))`; `axis` int32 and `interleave` bool consts.
    pub fn concat(
        &mut self,
        name: &str,
        values: &[&Value],
        axis: &Value,
        interleave: &Value,
    ) -> Result<Value, BuildError> {
        let inputs = vec![
            ("axis".to_string(), Argument::var(axis.name.clone())),
            ("interleave".to_string(), Argument::var(interleave.name.clone())),
            (
                "values".to_string(),
                Argument::vars(values.iter().map(|v| v.name.clone())),
            ),
        ];
        self.op(name, "concat", inputs, Vec::new(), None)
    }

    /// `slice_by_index(begin, end, x)`: elements `[begin, end)` on every axis.
    pub fn slice_by_index(&mut self, name: &str, x: &Value, begin: &Value, end: &Value) -> Result<Value, BuildError> {
        self.emit(name, "slice_by_index", &[("begin", begin), ("end", end), ("x", x)])
    }

    /// `slice_by_size(begin, size, x)`: `size` elements from `begin` on every axis (−1 = to the end).
    pub fn slice_by_size(&mut self, name: &str, x: &Value, begin: &Value, size: &Value) -> Result<Value, BuildError> {
        self.emit(name, "slice_by_size", &[("begin", begin), ("size", size), ("x", x)])
    }

    /// `reshape(shape, x)`; `shape` is an int32 const (one −1 allowed).
    pub fn reshape(&mut self, name: &str, x: &Value, shape: &Value) -> Result<Value, BuildError> {
        self.emit(name, "reshape", &[("shape", shape), ("x", x)])
    }

    /// `transpose(perm, x)`.
    pub fn transpose(&mut self, name: &str, x: &Value, perm: &Value) -> Result<Value, BuildError> {
        self.emit(name, "transpose", &[("perm", perm), ("x", x)])
    }

    /// `reduce_sum(axes, keep_dims, x)`.
    pub fn reduce_sum(&mut self, name: &str, x: &Value, axes: &Value, keep_dims: &Value) -> Result<Value, BuildError> {
        self.emit(
            name,
            "reduce_sum",
            &[("axes", axes), ("keep_dims", keep_dims), ("x", x)],
        )
    }

    /// `matmul(transpose_x, transpose_y, x, y)`, batched over leading dimensions.
    pub fn matmul(
        &mut self,
        name: &str,
        x: &Value,
        y: &Value,
        transpose_x: &Value,
        transpose_y: &Value,
    ) -> Result<Value, BuildError> {
        self.emit(
            name,
            "matmul",
            &[
                ("transpose_x", transpose_x),
                ("transpose_y", transpose_y),
                ("x", x),
                ("y", y),
            ],
        )
    }

    /// `cast(dtype, x)`; `dtype` is a string const ("fp16", "fp32", ...).
    pub fn cast(&mut self, name: &str, x: &Value, dtype: &Value) -> Result<Value, BuildError> {
        self.emit(name, "cast", &[("dtype", dtype), ("x", x)])
    }

    /// `constexpr_blockwise_shift_scale(data, scale)`: dequantise int8 `data` by fp16 `scale`
    /// at compile time. Scale `[O, I/B, 1, 1]` means blocks of B along axis 1; `[O, 1, 1, 1]`
    /// is one scale per row. Needs opset ios18.
    pub fn constexpr_blockwise_shift_scale(
        &mut self,
        name: &str,
        data: &Value,
        scale: &Value,
    ) -> Result<Value, BuildError> {
        self.emit(
            name,
            "constexpr_blockwise_shift_scale",
            &[("data", data), ("scale", scale)],
        )
    }
}
