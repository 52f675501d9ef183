//! The program IR: a program holds functions, a function holds typed named statements.
//!
//! Statements are kept generic (op name, named arguments, attribute list) so that every
//! program the parser accepts — including ops anelm never emits, such as `tile`, which the
//! emulator must recognise in order to refuse — is represented exactly. [`OpKind`] classifies
//! op names; [`crate::FunctionBuilder`] emits well-typed statements for the ops anelm uses.

use std::fmt;

use crate::literal::Literal;
use crate::types::TensorType;

/// The `coremlc-version` the C++ system writes (required by the MIL parser; value reportedly irrelevant).
pub const COREMLC_VERSION: &str = "3505.4.1";

/// `program(x.y)` version. It also fixes how scalar types are spelled in printed text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProgramVersion {
    /// `program(1.0)`: scalars are spelled `tensor<int32, []>(1)` (the C++ system, FG tests).
    V1_0,
    /// `program(1.3)`: scalars are spelled `int32(1)` (the MX code).
    V1_3,
}

impl ProgramVersion {
    /// The text inside `program(...)`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProgramVersion::V1_0 => "1.0",
            ProgramVersion::V1_3 => "1.3",
        }
    }

    /// Parse `"1.0"` / `"1.3"`.
    pub fn from_str_opt(s: &str) -> Option<Self> {
        match s {
            "1.0" => Some(ProgramVersion::V1_0),
            "1.3" => Some(ProgramVersion::V1_3),
            _ => None,
        }
    }

    /// True when scalars are written as bare types (`int32(1)`, `string("x")`).
    pub fn bare_scalars(self) -> bool {
        self == ProgramVersion::V1_3
    }
}

/// Function opset (`func main<ios16>`). fp16 programs use ios16, int8 programs ios18.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Opset {
    /// `ios15`.
    Ios15,
    /// `ios16`: all fp16 kernels.
    Ios16,
    /// `ios17` (used by neither reference; parsed so a checker can name it).
    Ios17,
    /// `ios18`: int8 kernels (`constexpr_blockwise_shift_scale`) and the MX dialect.
    Ios18,
}

impl Opset {
    /// The spelling inside `<...>`.
    pub fn as_str(self) -> &'static str {
        match self {
            Opset::Ios15 => "ios15",
            Opset::Ios16 => "ios16",
            Opset::Ios17 => "ios17",
            Opset::Ios18 => "ios18",
        }
    }

    /// Parse `ios15` … `ios18`.
    pub fn from_str_opt(s: &str) -> Option<Self> {
        [Opset::Ios15, Opset::Ios16, Opset::Ios17, Opset::Ios18]
            .into_iter()
            .find(|o| o.as_str() == s)
    }
}

impl fmt::Display for Opset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A whole MIL program: version, `buildInfo` entries, functions.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// `program(...)` version.
    pub version: ProgramVersion,
    /// `buildInfo` dict entries in order (key, value). Must contain `coremlc-version`.
    pub build_info: Vec<(String, String)>,
    /// Functions; anelm always emits exactly one, `main`.
    pub functions: Vec<Function>,
}

impl Program {
    /// A `program(1.0)` with the C++ system's buildInfo (`coremlc-version` = 3505.4.1).
    pub fn new(functions: Vec<Function>) -> Self {
        Program {
            version: ProgramVersion::V1_0,
            build_info: vec![("coremlc-version".to_string(), COREMLC_VERSION.to_string())],
            functions,
        }
    }

    /// The function called `name`.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// The `main` function.
    pub fn main(&self) -> Option<&Function> {
        self.function("main")
    }

    /// The value of a `buildInfo` key.
    pub fn build_info_value(&self, key: &str) -> Option<&str> {
        self.build_info.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Every BLOBFILE reference in the program, in statement order.
    pub fn blob_refs(&self) -> Vec<BlobRef<'_>> {
        let mut out = Vec::new();
        for f in &self.functions {
            for s in &f.body {
                for lit in s.literals() {
                    if let Literal::Blob { ty, path, offset } = lit {
                        out.push(BlobRef {
                            value: &s.output.name,
                            ty,
                            path,
                            offset: *offset,
                        });
                    }
                }
            }
        }
        out
    }
}

/// One BLOBFILE reference found in a program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlobRef<'a> {
    /// The value the statement defines.
    pub value: &'a str,
    /// Declared tensor type of the stored data.
    pub ty: &'a TensorType,
    /// Weight file path.
    pub path: &'a str,
    /// Chunk header offset.
    pub offset: u64,
}

/// A named, typed value: function input or statement result.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Value {
    /// Identifier.
    pub name: String,
    /// Type.
    pub ty: TensorType,
}

impl Value {
    /// A value of type `ty` called `name`.
    pub fn new(name: impl Into<String>, ty: TensorType) -> Self {
        Value { name: name.into(), ty }
    }
}

/// A function: `func <name><<opset>>(inputs) { body } -> (outputs);`.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// Function name (`main`).
    pub name: String,
    /// Opset target.
    pub opset: Opset,
    /// Inputs in surface-index order.
    pub inputs: Vec<Value>,
    /// Statements in order.
    pub body: Vec<Statement>,
    /// Output value names in output-surface order.
    pub outputs: Vec<String>,
}

impl Function {
    /// The statement that defines `name`, if any.
    pub fn statement(&self, name: &str) -> Option<&Statement> {
        self.body.iter().find(|s| s.output.name == name)
    }

    /// The type of a value (input or statement result).
    pub fn value_type(&self, name: &str) -> Option<&TensorType> {
        self.inputs
            .iter()
            .find(|v| v.name == name)
            .map(|v| &v.ty)
            .or_else(|| self.statement(name).map(|s| &s.output.ty))
    }

    /// Output values with their types (undefined names are skipped).
    pub fn output_values(&self) -> Vec<Value> {
        self.outputs
            .iter()
            .filter_map(|n| self.value_type(n).map(|t| Value::new(n.clone(), t.clone())))
            .collect()
    }
}

/// One operand: a value name or an inline literal.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    /// Reference to a named value.
    Var(String),
    /// Inline literal (accepted by the parser; anelm's emitter always names consts instead).
    Lit(Literal),
}

/// One argument value: a single operand or a tuple (`values = (a, b)`).
#[derive(Debug, Clone, PartialEq)]
pub enum Argument {
    /// `x = a`.
    Single(Operand),
    /// `values = (a, b, c)`.
    Tuple(Vec<Operand>),
}

impl Argument {
    /// A single named-value argument.
    pub fn var(name: impl Into<String>) -> Self {
        Argument::Single(Operand::Var(name.into()))
    }

    /// A tuple of named values.
    pub fn vars<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Argument::Tuple(names.into_iter().map(|n| Operand::Var(n.into())).collect())
    }

    /// Operands in order (one for `Single`).
    pub fn operands(&self) -> &[Operand] {
        match self {
            Argument::Single(o) => std::slice::from_ref(o),
            Argument::Tuple(v) => v,
        }
    }
}

/// `<type> <output> = <op>(<inputs>)[<attributes>];`
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// The value defined.
    pub output: Value,
    /// Op name (`conv`, `const`, ...).
    pub op: String,
    /// Named arguments in printed order.
    pub inputs: Vec<(String, Argument)>,
    /// Attributes in printed order: `name` first, then `val` for consts, or inline op attributes.
    pub attributes: Vec<(String, Literal)>,
}

impl Statement {
    /// Classification of the op name.
    pub fn kind(&self) -> OpKind {
        OpKind::from_name(&self.op)
    }

    /// The argument called `param`.
    pub fn input(&self, param: &str) -> Option<&Argument> {
        self.inputs.iter().find(|(k, _)| k == param).map(|(_, a)| a)
    }

    /// The value name bound to `param`, if it is a single named value.
    pub fn input_var(&self, param: &str) -> Option<&str> {
        match self.input(param)? {
            Argument::Single(Operand::Var(v)) => Some(v),
            _ => None,
        }
    }

    /// The attribute called `key`.
    pub fn attribute(&self, key: &str) -> Option<&Literal> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, l)| l)
    }

    /// The `name` attribute's string.
    pub fn op_name(&self) -> Option<&str> {
        self.attribute("name")?.as_str()
    }

    /// For `const`: the `val` attribute.
    pub fn const_value(&self) -> Option<&Literal> {
        if self.op == "const" {
            self.attribute("val")
        } else {
            None
        }
    }

    /// Every literal in the statement (inline operands and attributes).
    pub fn literals(&self) -> impl Iterator<Item = &Literal> {
        let ops = self
            .inputs
            .iter()
            .flat_map(|(_, a)| a.operands())
            .filter_map(|o| match o {
                Operand::Lit(l) => Some(l),
                Operand::Var(_) => None,
            });
        ops.chain(self.attributes.iter().map(|(_, l)| l))
    }

    /// Names of the values this statement reads, in order.
    pub fn uses(&self) -> impl Iterator<Item = &str> {
        self.inputs
            .iter()
            .flat_map(|(_, a)| a.operands())
            .filter_map(|o| match o {
                Operand::Var(v) => Some(v.as_str()),
                Operand::Lit(_) => None,
            })
    }
}

/// The ops anelm knows by name. Anything else is [`OpKind::Other`] (still parsed and printed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `const`.
    Const,
    /// `conv`.
    Conv,
    /// `matmul`.
    Matmul,
    /// `add`.
    Add,
    /// `sub`.
    Sub,
    /// `mul`.
    Mul,
    /// `real_div`.
    RealDiv,
    /// `pow`.
    Pow,
    /// `sqrt`.
    Sqrt,
    /// `sigmoid`.
    Sigmoid,
    /// `silu`.
    Silu,
    /// `softmax`.
    Softmax,
    /// `concat`.
    Concat,
    /// `slice_by_index`.
    SliceByIndex,
    /// `slice_by_size`.
    SliceBySize,
    /// `reshape`.
    Reshape,
    /// `transpose`.
    Transpose,
    /// `reduce_sum`.
    ReduceSum,
    /// `cast`.
    Cast,
    /// `constexpr_blockwise_shift_scale`.
    ConstexprBlockwiseShiftScale,
    /// `constexpr_affine_dequantize`.
    ConstexprAffineDequantize,
    /// `quantize`.
    Quantize,
    /// `dequantize`.
    Dequantize,
    /// `tile`.
    Tile,
    /// Any other op name.
    Other,
}

impl OpKind {
    const NAMES: [(OpKind, &'static str); 24] = [
        (OpKind::Const, "const"),
        (OpKind::Conv, "conv"),
        (OpKind::Matmul, "matmul"),
        (OpKind::Add, "add"),
        (OpKind::Sub, "sub"),
        (OpKind::Mul, "mul"),
        (OpKind::RealDiv, "real_div"),
        (OpKind::Pow, "pow"),
        (OpKind::Sqrt, "sqrt"),
        (OpKind::Sigmoid, "sigmoid"),
        (OpKind::Silu, "silu"),
        (OpKind::Softmax, "softmax"),
        (OpKind::Concat, "concat"),
        (OpKind::SliceByIndex, "slice_by_index"),
        (OpKind::SliceBySize, "slice_by_size"),
        (OpKind::Reshape, "reshape"),
        (OpKind::Transpose, "transpose"),
        (OpKind::ReduceSum, "reduce_sum"),
        (OpKind::Cast, "cast"),
        (OpKind::ConstexprBlockwiseShiftScale, "constexpr_blockwise_shift_scale"),
        (OpKind::ConstexprAffineDequantize, "constexpr_affine_dequantize"),
        (OpKind::Quantize, "quantize"),
        (OpKind::Dequantize, "dequantize"),
        (OpKind::Tile, "tile"),
    ];

    /// Classify an op name.
    pub fn from_name(name: &str) -> OpKind {
        OpKind::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map_or(OpKind::Other, |(k, _)| *k)
    }

    /// The op name; `None` for [`OpKind::Other`].
    pub fn name(self) -> Option<&'static str> {
        OpKind::NAMES.iter().find(|(k, _)| *k == self).map(|(_, n)| *n)
    }

    /// The oldest opset that has this op (ops introduced in iOS 18 need `ios18`).
    pub fn min_opset(self) -> Opset {
        match self {
            OpKind::ConstexprBlockwiseShiftScale => Opset::Ios18,
            OpKind::Quantize | OpKind::Dequantize => Opset::Ios17,
            _ => Opset::Ios15,
        }
    }
}
