//! The MIL text printer: writes the exact dialect of the references.
//!
//! Layout (4-space indents, one statement per line):
//! ```text
//! program(1.0)
//! [buildInfo = dict<tensor<string, []>, tensor<string, []>>({{"coremlc-version", "3505.4.1"}})]
//! {
//!     func main<ios16>(tensor<fp16, [1, 2560, 1, 32]> x) {
//!         tensor<fp16, [1, 4096, 1, 32]> y = conv(...)[name = tensor<string, []>("y")];
//!     } -> (y);
//! }
//! ```
//! Under `program(1.3)` scalar types are written bare (`int32(1)`, `string("valid")`,
//! `dict<string, string>`), as in the MX dialect.

use std::fmt;

use crate::ir::{Argument, Function, Operand, Program, ProgramVersion, Statement};
use crate::literal::{Literal, TensorData};
use crate::types::{DType, TensorType};

/// Print a whole program as MIL text (ends with a newline).
pub fn print_program(p: &Program) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = write_program(&mut s, p);
    s
}

/// Print one statement (without indentation or newline) in the spelling of `version`.
pub fn print_statement(st: &Statement, version: ProgramVersion) -> String {
    let mut s = String::new();
    let _ = write_statement(&mut s, st, version.bare_scalars());
    s
}

/// Print one literal in the spelling of `version`, e.g. `tensor<int32, [2]>([1, 1])`.
pub fn print_literal(lit: &Literal, version: ProgramVersion) -> String {
    let mut s = String::new();
    let _ = write_literal(&mut s, lit, version.bare_scalars());
    s
}

/// Print a type in the spelling of `version` (`tensor<int32, []>` vs `int32` for scalars).
pub fn print_type(ty: &TensorType, version: ProgramVersion) -> String {
    let mut s = String::new();
    let _ = write_type(&mut s, ty, version.bare_scalars());
    s
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_program(f, self)
    }
}

fn write_program(w: &mut impl fmt::Write, p: &Program) -> fmt::Result {
    let bare = p.version.bare_scalars();
    writeln!(w, "program({})", p.version.as_str())?;
    let mut key_ty = String::new();
    write_type(&mut key_ty, &TensorType::scalar(DType::String), bare)?;
    write!(w, "[buildInfo = dict<{key_ty}, {key_ty}>({{")?;
    for (i, (k, v)) in p.build_info.iter().enumerate() {
        if i > 0 {
            w.write_str(", ")?;
        }
        w.write_char('{')?;
        write_string(w, k)?;
        w.write_str(", ")?;
        write_string(w, v)?;
        w.write_char('}')?;
    }
    w.write_str("})]\n{\n")?;
    for f in &p.functions {
        write_function(w, f, bare)?;
    }
    w.write_str("}\n")
}

fn write_function(w: &mut impl fmt::Write, f: &Function, bare: bool) -> fmt::Result {
    write!(w, "    func {}<{}>(", f.name, f.opset.as_str())?;
    for (i, v) in f.inputs.iter().enumerate() {
        if i > 0 {
            w.write_str(", ")?;
        }
        write_type(w, &v.ty, bare)?;
        write!(w, " {}", v.name)?;
    }
    w.write_str(") {\n")?;
    for st in &f.body {
        w.write_str("        ")?;
        write_statement(w, st, bare)?;
        w.write_char('\n')?;
    }
    writeln!(w, "    }} -> ({});", f.outputs.join(", "))
}

fn write_statement(w: &mut impl fmt::Write, st: &Statement, bare: bool) -> fmt::Result {
    write_type(w, &st.output.ty, bare)?;
    write!(w, " {} = {}(", st.output.name, st.op)?;
    for (i, (k, a)) in st.inputs.iter().enumerate() {
        if i > 0 {
            w.write_str(", ")?;
        }
        write!(w, "{k} = ")?;
        match a {
            Argument::Single(o) => write_operand(w, o, bare)?,
            Argument::Tuple(os) => {
                w.write_char('(')?;
                for (j, o) in os.iter().enumerate() {
                    if j > 0 {
                        w.write_str(", ")?;
                    }
                    write_operand(w, o, bare)?;
                }
                w.write_char(')')?;
            }
        }
    }
    w.write_char(')')?;
    if !st.attributes.is_empty() {
        w.write_char('[')?;
        for (i, (k, l)) in st.attributes.iter().enumerate() {
            if i > 0 {
                w.write_str(", ")?;
            }
            write!(w, "{k} = ")?;
            write_literal(w, l, bare)?;
        }
        w.write_char(']')?;
    }
    w.write_char(';')
}

fn write_operand(w: &mut impl fmt::Write, o: &Operand, bare: bool) -> fmt::Result {
    match o {
        Operand::Var(v) => w.write_str(v),
        Operand::Lit(l) => write_literal(w, l, bare),
    }
}

fn write_type(w: &mut impl fmt::Write, ty: &TensorType, bare: bool) -> fmt::Result {
    if bare && ty.is_scalar() {
        w.write_str(ty.dtype.name())
    } else {
        write!(w, "{ty}")
    }
}

fn write_literal(w: &mut impl fmt::Write, lit: &Literal, bare: bool) -> fmt::Result {
    match lit {
        Literal::Blob { ty, path, offset } => {
            write_type(w, ty, bare)?;
            w.write_str("(BLOBFILE(path = ")?;
            write_literal(w, &Literal::string(path.clone()), bare)?;
            w.write_str(", offset = ")?;
            write_literal(w, &Literal::uint64(*offset), bare)?;
            w.write_str("))")
        }
        Literal::Tensor { ty, data } => {
            write_type(w, ty, bare)?;
            w.write_char('(')?;
            if ty.is_scalar() {
                write_elements(w, data)?;
            } else {
                w.write_char('[')?;
                write_elements(w, data)?;
                w.write_char(']')?;
            }
            w.write_char(')')
        }
    }
}

fn write_elements(w: &mut impl fmt::Write, data: &TensorData) -> fmt::Result {
    fn list<T>(
        w: &mut impl fmt::Write,
        v: &[T],
        mut f: impl FnMut(&mut dyn fmt::Write, &T) -> fmt::Result,
    ) -> fmt::Result {
        for (i, x) in v.iter().enumerate() {
            if i > 0 {
                w.write_str(", ")?;
            }
            f(w, x)?;
        }
        Ok(())
    }
    match data {
        TensorData::Fp16(v) => list(w, v, |w, x| write!(w, "{}", f32::from(*x))),
        TensorData::Fp32(v) => list(w, v, |w, x| write!(w, "{x}")),
        TensorData::Int8(v) => list(w, v, |w, x| write!(w, "{x}")),
        TensorData::Int32(v) => list(w, v, |w, x| write!(w, "{x}")),
        TensorData::Uint64(v) => list(w, v, |w, x| write!(w, "{x}")),
        TensorData::Bool(v) => list(w, v, |w, x| write!(w, "{x}")),
        TensorData::String(v) => list(w, v, |w, x| write_string(w, x)),
    }
}

fn write_string(w: &mut (impl fmt::Write + ?Sized), s: &str) -> fmt::Result {
    w.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => w.write_str("\\\"")?,
            '\\' => w.write_str("\\\\")?,
            '\n' => w.write_str("\\n")?,
            '\t' => w.write_str("\\t")?,
            '\r' => w.write_str("\\r")?,
            c => w.write_char(c)?,
        }
    }
    w.write_char('"')
}
