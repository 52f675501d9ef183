//! Structural and type checking of a whole program.
//!
//! A program passes when: buildInfo has `coremlc-version`; every name is an identifier;
//! every value is defined once before use; every op has a unique `name` attribute; every
//! literal matches its type; each op is available in the function's opset; and, for ops
//! with an inference rule, the declared result type equals the inferred one.

use std::collections::HashSet;

use crate::error::BuildError;
use crate::infer::{Scope, infer};
use crate::ir::{Function, Program, Statement};
use crate::printer::print_type;

/// True if `s` is a MIL identifier: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(crate) fn ident(s: &str) -> Result<(), BuildError> {
    if is_identifier(s) {
        Ok(())
    } else {
        Err(BuildError::BadIdentifier(s.to_string()))
    }
}

impl Program {
    /// Check the whole program (see the module docs for the rules).
    pub fn check(&self) -> Result<(), BuildError> {
        if self.build_info_value("coremlc-version").is_none() {
            return Err(BuildError::MissingBuildInfo);
        }
        for f in &self.functions {
            f.check()?;
        }
        Ok(())
    }
}

impl Function {
    /// Check one function (see the module docs for the rules).
    pub fn check(&self) -> Result<(), BuildError> {
        ident(&self.name)?;
        let mut scope = Scope::default();
        let mut op_names = HashSet::new();
        for v in &self.inputs {
            ident(&v.name)?;
            if scope.types.insert(v.name.clone(), v.ty.clone()).is_some() {
                return Err(BuildError::Redefined(v.name.clone()));
            }
        }
        for st in &self.body {
            check_statement(st, self, &scope, &mut op_names)?;
            if let Some(v) = st.const_value() {
                scope.consts.insert(st.output.name.clone(), v.clone());
            }
            scope.types.insert(st.output.name.clone(), st.output.ty.clone());
        }
        for o in &self.outputs {
            if !scope.types.contains_key(o) {
                return Err(BuildError::UndefinedOutput(o.clone()));
            }
        }
        Ok(())
    }
}

pub(crate) fn check_statement(
    st: &Statement,
    f: &Function,
    scope: &Scope,
    op_names: &mut HashSet<String>,
) -> Result<(), BuildError> {
    let out = &st.output.name;
    ident(out)?;
    ident(&st.op)?;
    if scope.types.contains_key(out) {
        return Err(BuildError::Redefined(out.clone()));
    }
    for u in st.uses() {
        if !scope.types.contains_key(u) {
            return Err(BuildError::Undefined(u.to_string()));
        }
    }
    for (k, _) in &st.inputs {
        ident(k)?;
    }
    for (k, _) in &st.attributes {
        ident(k)?;
    }
    for lit in st.literals() {
        lit.validate()?;
    }
    let name = st.op_name().ok_or_else(|| BuildError::MissingName(out.clone()))?;
    if !op_names.insert(name.to_string()) {
        return Err(BuildError::DuplicateOpName(name.to_string()));
    }
    let needs = st.kind().min_opset();
    if needs > f.opset {
        return Err(BuildError::OpsetTooOld {
            op: st.op.clone(),
            needs: needs.to_string(),
            declared: f.opset.to_string(),
        });
    }
    if let Some(inferred) = infer(st, scope)? {
        if inferred != st.output.ty {
            let v = crate::ProgramVersion::V1_0;
            return Err(BuildError::DeclaredTypeMismatch {
                op: st.op.clone(),
                value: out.clone(),
                declared: print_type(&st.output.ty, v),
                inferred: print_type(&inferred, v),
            });
        }
    }
    Ok(())
}
