//! Parser for MIL text: both the `program(1.0)` dialect (scalars as `tensor<T, []>`) and the
//! `program(1.3)` dialect (bare scalars `int32(1)`, `string("x")`, `dict<string, string>`).
//!
//! The input is untrusted (the emulator parses whatever it is given): the parser never
//! panics, and every error names the line and column of the offending token.

use half::f16;

use crate::error::ParseError;
use crate::ir::{Argument, Function, Operand, Opset, Program, ProgramVersion, Statement, Value};
use crate::lexer::{Tok, Token, lex};
use crate::literal::{Literal, TensorData};
use crate::types::{DType, TensorType};

/// Parse MIL text into a [`Program`]. Structural checks beyond syntax (definitions before
/// use, types agreeing with operands, buildInfo present) are [`Program::check`]'s job.
pub fn parse_program(src: &str) -> Result<Program, ParseError> {
    let lexed = lex(src)?;
    let mut p = Parser {
        toks: lexed.tokens,
        pos: 0,
        end: lexed.end,
    };
    p.program()
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    end: (usize, usize),
}

type R<T> = Result<T, ParseError>;

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k).map(|t| &t.tok)
    }

    fn here(&self) -> (usize, usize) {
        self.toks.get(self.pos).map_or(self.end, |t| (t.line, t.column))
    }

    fn err_at(&self, (line, column): (usize, usize), message: impl Into<String>) -> ParseError {
        ParseError {
            line,
            column,
            message: message.into(),
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            Some(t) => t.to_string(),
            None => "end of input".to_string(),
        }
    }

    fn unexpected(&self, expected: &str) -> ParseError {
        self.err_at(self.here(), format!("expected {expected}, found {}", self.found()))
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, t: &Tok) -> R<()> {
        if self.eat(t) {
            Ok(())
        } else {
            Err(self.unexpected(&t.to_string()))
        }
    }

    fn ident(&mut self, what: &str) -> R<String> {
        match self.peek() {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn keyword(&mut self, kw: &str) -> R<()> {
        match self.peek() {
            Some(Tok::Ident(s)) if s == kw => {
                self.pos += 1;
                Ok(())
            }
            _ => Err(self.unexpected(&format!("`{kw}`"))),
        }
    }

    fn string(&mut self, what: &str) -> R<String> {
        match self.peek() {
            Some(Tok::Str(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// `a, b, c` until `close` (consumed), allowing an empty list.
    fn list<T>(&mut self, close: &Tok, mut item: impl FnMut(&mut Self) -> R<T>) -> R<Vec<T>> {
        let mut out = Vec::new();
        if self.eat(close) {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            if self.eat(close) {
                return Ok(out);
            }
            if !self.eat(&Tok::Comma) {
                return Err(self.unexpected(&format!("`,` or {close}")));
            }
        }
    }

    fn program(&mut self) -> R<Program> {
        self.keyword("program")?;
        self.expect(&Tok::LParen)?;
        let at = self.here();
        let version = match self.peek() {
            Some(Tok::Number(s)) => ProgramVersion::from_str_opt(s)
                .ok_or_else(|| self.err_at(at, format!("unsupported program version {s} (expected 1.0 or 1.3)")))?,
            _ => return Err(self.unexpected("a program version such as 1.0")),
        };
        self.pos += 1;
        self.expect(&Tok::RParen)?;
        let mut build_info = Vec::new();
        if self.eat(&Tok::LBracket) {
            let attrs = self.list(&Tok::RBracket, |p| {
                let at = p.here();
                let key = p.ident("a program attribute")?;
                if key != "buildInfo" {
                    return Err(p.err_at(
                        at,
                        format!("unknown program attribute `{key}` (only buildInfo is supported)"),
                    ));
                }
                p.expect(&Tok::Eq)?;
                p.dict()
            })?;
            build_info = attrs.into_iter().flatten().collect();
        }
        self.expect(&Tok::LBrace)?;
        let mut functions = Vec::new();
        while !self.eat(&Tok::RBrace) {
            functions.push(self.function()?);
        }
        if self.peek().is_some() {
            return Err(self.unexpected("end of input after the program's closing `}`"));
        }
        Ok(Program {
            version,
            build_info,
            functions,
        })
    }

    /// `dict<string, string>({{"k", "v"}, ...})`, key/value types in either spelling.
    fn dict(&mut self) -> R<Vec<(String, String)>> {
        self.keyword("dict")?;
        self.expect(&Tok::Lt)?;
        for i in 0..2 {
            let at = self.here();
            let t = self.ty()?;
            if t != TensorType::scalar(DType::String) {
                return Err(self.err_at(at, format!("buildInfo entries must be strings, found {t}")));
            }
            if i == 0 {
                self.expect(&Tok::Comma)?;
            }
        }
        self.expect(&Tok::Gt)?;
        self.expect(&Tok::LParen)?;
        self.expect(&Tok::LBrace)?;
        let entries = self.list(&Tok::RBrace, |p| {
            p.expect(&Tok::LBrace)?;
            let k = p.string("a string key")?;
            p.expect(&Tok::Comma)?;
            let v = p.string("a string value")?;
            p.expect(&Tok::RBrace)?;
            Ok((k, v))
        })?;
        self.expect(&Tok::RParen)?;
        Ok(entries)
    }

    fn function(&mut self) -> R<Function> {
        self.keyword("func")?;
        let name = self.ident("a function name")?;
        self.expect(&Tok::Lt)?;
        let at = self.here();
        let o = self.ident("an opset such as ios16")?;
        let opset = Opset::from_str_opt(&o)
            .ok_or_else(|| self.err_at(at, format!("unknown opset `{o}` (expected ios15 … ios18)")))?;
        self.expect(&Tok::Gt)?;
        self.expect(&Tok::LParen)?;
        let inputs = self.list(&Tok::RParen, |p| {
            let ty = p.ty()?;
            let name = p.ident("an input name")?;
            Ok(Value::new(name, ty))
        })?;
        self.expect(&Tok::LBrace)?;
        let mut body = Vec::new();
        while !self.eat(&Tok::RBrace) {
            body.push(self.statement()?);
        }
        self.expect(&Tok::Arrow)?;
        self.expect(&Tok::LParen)?;
        let outputs = self.list(&Tok::RParen, |p| p.ident("an output name"))?;
        self.expect(&Tok::Semi)?;
        Ok(Function {
            name,
            opset,
            inputs,
            body,
            outputs,
        })
    }

    fn statement(&mut self) -> R<Statement> {
        let ty = self.ty()?;
        let name = self.ident("the name of the value being defined")?;
        self.expect(&Tok::Eq)?;
        let op = self.ident("an op name")?;
        self.expect(&Tok::LParen)?;
        let inputs = self.list(&Tok::RParen, |p| {
            let k = p.ident("an argument name")?;
            p.expect(&Tok::Eq)?;
            let a = if p.eat(&Tok::LParen) {
                Argument::Tuple(p.list(&Tok::RParen, Self::operand)?)
            } else {
                Argument::Single(p.operand()?)
            };
            Ok((k, a))
        })?;
        let mut attributes = Vec::new();
        if self.eat(&Tok::LBracket) {
            attributes = self.list(&Tok::RBracket, |p| {
                let k = p.ident("an attribute name")?;
                p.expect(&Tok::Eq)?;
                Ok((k, p.literal()?))
            })?;
        }
        self.expect(&Tok::Semi)?;
        Ok(Statement {
            output: Value::new(name, ty),
            op,
            inputs,
            attributes,
        })
    }

    fn starts_literal(&self) -> bool {
        match (self.peek(), self.peek_at(1)) {
            (Some(Tok::Ident(s)), Some(Tok::Lt)) => s == "tensor",
            (Some(Tok::Ident(s)), Some(Tok::LParen)) => DType::from_name(s).is_some(),
            _ => false,
        }
    }

    fn operand(&mut self) -> R<Operand> {
        if self.starts_literal() {
            return Ok(Operand::Lit(self.literal()?));
        }
        match self.peek() {
            Some(Tok::Ident(_)) => Ok(Operand::Var(self.ident("a value name")?)),
            Some(Tok::Number(_) | Tok::Str(_)) => Err(self.err_at(
                self.here(),
                "inline literals must be typed, e.g. int32(1) or tensor<int32, [2]>([1, 1])",
            )),
            _ => Err(self.unexpected("a value name or a typed literal")),
        }
    }

    /// `tensor<dtype, [d0, d1, ...]>` or a bare scalar dtype.
    fn ty(&mut self) -> R<TensorType> {
        let at = self.here();
        let head = self.ident("a type such as tensor<fp16, [1, 64, 1, 32]>")?;
        if head != "tensor" {
            return DType::from_name(&head)
                .map(TensorType::scalar)
                .ok_or_else(|| self.err_at(at, format!("unknown type `{head}`")));
        }
        self.expect(&Tok::Lt)?;
        let dat = self.here();
        let d = self.ident("an element type such as fp16")?;
        let dtype = DType::from_name(&d).ok_or_else(|| self.err_at(dat, format!("unknown element type `{d}`")))?;
        self.expect(&Tok::Comma)?;
        self.expect(&Tok::LBracket)?;
        let shape = self.list(&Tok::RBracket, |p| {
            let at = p.here();
            match p.peek() {
                Some(Tok::Number(s)) => {
                    let v = s
                        .parse::<usize>()
                        .map_err(|_| p.err_at(at, format!("bad dimension `{s}`")))?;
                    p.pos += 1;
                    Ok(v)
                }
                _ => Err(p.unexpected("a dimension")),
            }
        })?;
        self.expect(&Tok::Gt)?;
        let ty = TensorType::new(dtype, shape);
        if ty.num_elements().is_none() {
            return Err(self.err_at(at, format!("{ty} has too many elements")));
        }
        Ok(ty)
    }

    fn literal(&mut self) -> R<Literal> {
        let at = self.here();
        let ty = self.ty()?;
        self.expect(&Tok::LParen)?;
        if matches!(self.peek(), Some(Tok::Ident(s)) if s == "BLOBFILE") {
            self.pos += 1;
            self.expect(&Tok::LParen)?;
            let (mut path, mut offset) = (None, None);
            let fields = self.list(&Tok::RParen, |p| {
                let kat = p.here();
                let k = p.ident("`path` or `offset`")?;
                p.expect(&Tok::Eq)?;
                let lat = p.here();
                let v = p.literal()?;
                Ok((k, kat, lat, v))
            })?;
            for (k, kat, lat, v) in fields {
                match k.as_str() {
                    "path" => {
                        let s = v
                            .as_str()
                            .ok_or_else(|| self.err_at(lat, "BLOBFILE path must be a string"))?;
                        path = Some(s.to_string());
                    }
                    "offset" => match v.data() {
                        Some(TensorData::Uint64(o)) if o.len() == 1 => offset = o.first().copied(),
                        _ => return Err(self.err_at(lat, "BLOBFILE offset must be a uint64 scalar")),
                    },
                    other => return Err(self.err_at(kat, format!("unknown BLOBFILE field `{other}`"))),
                }
            }
            let (Some(path), Some(offset)) = (path, offset) else {
                return Err(self.err_at(at, "BLOBFILE needs both path and offset"));
            };
            self.expect(&Tok::RParen)?;
            return Ok(Literal::Blob { ty, path, offset });
        }
        let data = if ty.is_scalar() {
            let mut d = DataBuf::new(ty.dtype);
            self.element(&mut d)?;
            d.finish()
        } else {
            self.expect(&Tok::LBracket)?;
            let mut d = DataBuf::new(ty.dtype);
            if !self.eat(&Tok::RBracket) {
                loop {
                    self.element(&mut d)?;
                    if self.eat(&Tok::RBracket) {
                        break;
                    }
                    if !self.eat(&Tok::Comma) {
                        return Err(self.unexpected("`,` or `]`"));
                    }
                }
            }
            d.finish()
        };
        self.expect(&Tok::RParen)?;
        let n = ty.num_elements().unwrap_or(usize::MAX);
        if data.len() != n {
            return Err(self.err_at(at, format!("{ty} literal has {} elements, expected {n}", data.len())));
        }
        Ok(Literal::Tensor { ty, data })
    }

    fn element(&mut self, d: &mut DataBuf) -> R<()> {
        let at = self.here();
        let Some(tok) = self.peek().cloned() else {
            return Err(self.unexpected("a literal value"));
        };
        let bad = |p: &Self, what: &str| p.err_at(at, format!("expected {what}, found {tok}"));
        match (d, &tok) {
            (DataBuf::Bool(v), Tok::Ident(s)) if s == "true" || s == "false" => v.push(s == "true"),
            (DataBuf::Bool(_), _) => return Err(bad(self, "`true` or `false`")),
            (DataBuf::String(v), Tok::Str(s)) => v.push(s.clone()),
            (DataBuf::String(_), _) => return Err(bad(self, "a string")),
            (d, Tok::Number(s) | Tok::Ident(s)) => {
                let s = s.as_str();
                let num_err = |what: &str| self.err_at(at, format!("`{s}` is not a valid {what}"));
                match d {
                    DataBuf::Fp16(v) => v.push(f16::from_f64(parse_float(s).ok_or_else(|| num_err("fp16 value"))?)),
                    DataBuf::Fp32(v) => v.push(parse_f32(s).ok_or_else(|| num_err("fp32 value"))?),
                    DataBuf::Int8(v) => v.push(s.parse::<i8>().map_err(|_| num_err("int8 value"))?),
                    DataBuf::Int32(v) => v.push(s.parse::<i32>().map_err(|_| num_err("int32 value"))?),
                    DataBuf::Uint64(v) => v.push(s.parse::<u64>().map_err(|_| num_err("uint64 value"))?),
                    DataBuf::Bool(_) | DataBuf::String(_) => return Err(bad(self, "a value")),
                }
            }
            _ => return Err(bad(self, "a number")),
        }
        self.pos += 1;
        Ok(())
    }
}

enum DataBuf {
    Fp16(Vec<f16>),
    Fp32(Vec<f32>),
    Int8(Vec<i8>),
    Int32(Vec<i32>),
    Uint64(Vec<u64>),
    Bool(Vec<bool>),
    String(Vec<String>),
}

impl DataBuf {
    fn new(d: DType) -> Self {
        match d {
            DType::Fp16 => DataBuf::Fp16(Vec::new()),
            DType::Fp32 => DataBuf::Fp32(Vec::new()),
            DType::Int8 => DataBuf::Int8(Vec::new()),
            DType::Int32 => DataBuf::Int32(Vec::new()),
            DType::Uint64 => DataBuf::Uint64(Vec::new()),
            DType::Bool => DataBuf::Bool(Vec::new()),
            DType::String => DataBuf::String(Vec::new()),
        }
    }

    fn finish(self) -> TensorData {
        match self {
            DataBuf::Fp16(v) => TensorData::Fp16(v),
            DataBuf::Fp32(v) => TensorData::Fp32(v),
            DataBuf::Int8(v) => TensorData::Int8(v),
            DataBuf::Int32(v) => TensorData::Int32(v),
            DataBuf::Uint64(v) => TensorData::Uint64(v),
            DataBuf::Bool(v) => TensorData::Bool(v),
            DataBuf::String(v) => TensorData::String(v),
        }
    }
}

fn special_float(s: &str) -> Option<f64> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = match body.to_ascii_lowercase().as_str() {
        "inf" | "infinity" => f64::INFINITY,
        "nan" => f64::NAN,
        _ => return None,
    };
    Some(if neg { -v } else { v })
}

/// Parse a float literal: decimal (`-0.5`, `1e-5`, `65504`), C hex float (`0x1p-3`,
/// `-0x1.8p+1`), or `inf` / `nan` with optional sign.
pub(crate) fn parse_float(s: &str) -> Option<f64> {
    if let Some(v) = special_float(s) {
        return Some(v);
    }
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        parse_hex_float(hex)?
    } else {
        if !body
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
            || body.is_empty()
        {
            return None;
        }
        body.parse::<f64>().ok()?
    };
    Some(if neg { -v } else { v })
}

fn parse_f32(s: &str) -> Option<f32> {
    let hexish = s.contains("0x") || s.contains("0X");
    if hexish || special_float(s).is_some() {
        return parse_float(s).map(|v| v as f32);
    }
    parse_float(s)?;
    s.parse::<f32>().ok()
}

fn parse_hex_float(s: &str) -> Option<f64> {
    let (mant, exp) = match s.find(['p', 'P']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = match mant.split_once('.') {
        Some((a, b)) => (a, b),
        None => (mant, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if int.len() + frac.len() > 28 {
        return None;
    }
    let mut m: u128 = 0;
    for c in int.chars().chain(frac.chars()) {
        m = m * 16 + u128::from(c.to_digit(16)?);
    }
    let e = i64::from(exp) - 4 * frac.len() as i64;
    let e = i32::try_from(e.clamp(-2000, 2000)).ok()?;
    // Scale in two steps so intermediate powers stay finite and normal where possible.
    let half = e / 2;
    Some((m as f64) * 2f64.powi(half) * 2f64.powi(e - half))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats() {
        assert_eq!(parse_float("0x1p-3"), Some(0.125));
        assert_eq!(parse_float("-0x1.8p+1"), Some(-3.0));
        assert_eq!(parse_float("0x1P4"), Some(16.0));
        assert_eq!(parse_float("0.00001"), Some(0.00001));
        assert_eq!(parse_float("-65504"), Some(-65504.0));
        assert_eq!(parse_float("-inf"), Some(f64::NEG_INFINITY));
        assert!(parse_float("nan").is_some_and(f64::is_nan));
        assert_eq!(parse_float("0x"), None);
        assert_eq!(parse_float("1.0.0"), None);
        assert_eq!(parse_float("abc"), None);
        assert_eq!(parse_f32("0.1"), Some(0.1f32));
    }
}
