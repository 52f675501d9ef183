//! Tokeniser for MIL text. Tracks 1-based line and column (in characters) of every token.

use std::fmt;

use crate::error::ParseError;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    /// Numeric literal text as written (`64`, `-0.5`, `0x1p-3`, `1.0`, `-inf`).
    Number(String),
    /// String literal contents with escapes resolved.
    Str(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Lt,
    Gt,
    Comma,
    Eq,
    Semi,
    Arrow,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Number(s) => write!(f, "number `{s}`"),
            Tok::Str(s) => write!(f, "string {s:?}"),
            Tok::LParen => f.write_str("`(`"),
            Tok::RParen => f.write_str("`)`"),
            Tok::LBracket => f.write_str("`[`"),
            Tok::RBracket => f.write_str("`]`"),
            Tok::LBrace => f.write_str("`{`"),
            Tok::RBrace => f.write_str("`}`"),
            Tok::Lt => f.write_str("`<`"),
            Tok::Gt => f.write_str("`>`"),
            Tok::Comma => f.write_str("`,`"),
            Tok::Eq => f.write_str("`=`"),
            Tok::Semi => f.write_str("`;`"),
            Tok::Arrow => f.write_str("`->`"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: usize,
    pub column: usize,
}

#[derive(Debug)]
/// Tokens plus the position just past the end of the input (for "unexpected end" errors).
pub(crate) struct Lexed {
    pub tokens: Vec<Token>,
    pub end: (usize, usize),
}

struct Cursor<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    column: usize,
}

impl Cursor<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn peek2(&self) -> Option<char> {
        let mut it = self.chars.clone();
        it.next();
        it.next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn take_while(&mut self, out: &mut String, f: impl Fn(char) -> bool) {
        while let Some(c) = self.peek().filter(|&c| f(c)) {
            out.push(c);
            self.bump();
        }
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

pub(crate) fn lex(src: &str) -> Result<Lexed, ParseError> {
    let mut cur = Cursor {
        chars: src.chars().peekable(),
        line: 1,
        column: 1,
    };
    let mut tokens = Vec::new();
    while let Some(c) = cur.peek() {
        let (line, column) = (cur.line, cur.column);
        let err = |message: String| ParseError { line, column, message };
        if c.is_whitespace() {
            cur.bump();
            continue;
        }
        if c == '/' && cur.peek2() == Some('/') {
            while cur.peek().is_some_and(|c| c != '\n') {
                cur.bump();
            }
            continue;
        }
        let single = match c {
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '[' => Some(Tok::LBracket),
            ']' => Some(Tok::RBracket),
            '{' => Some(Tok::LBrace),
            '}' => Some(Tok::RBrace),
            '<' => Some(Tok::Lt),
            '>' => Some(Tok::Gt),
            ',' => Some(Tok::Comma),
            '=' => Some(Tok::Eq),
            ';' => Some(Tok::Semi),
            _ => None,
        };
        let tok = if let Some(t) = single {
            cur.bump();
            t
        } else if c == '-' && cur.peek2() == Some('>') {
            cur.bump();
            cur.bump();
            Tok::Arrow
        } else if is_ident_start(c) {
            let mut s = String::new();
            cur.take_while(&mut s, is_ident_char);
            Tok::Ident(s)
        } else if c.is_ascii_digit() || c == '.' || c == '-' || c == '+' {
            let mut s = String::new();
            if c == '-' || c == '+' {
                s.push(c);
                cur.bump();
                match cur.peek() {
                    Some(d) if d.is_ascii_digit() || d == '.' => {}
                    Some(d) if d.is_ascii_alphabetic() => {
                        // `-inf`, `-nan`
                        cur.take_while(&mut s, |c| c.is_ascii_alphabetic());
                        tokens.push(Token {
                            tok: Tok::Number(s),
                            line,
                            column,
                        });
                        continue;
                    }
                    _ => return Err(err(format!("`{c}` must be followed by a number"))),
                }
            }
            // Digits, hex digits, `.`, exponent markers and exponent signs.
            let mut prev = '\0';
            while let Some(d) = cur.peek() {
                let exp_sign = (d == '-' || d == '+') && matches!(prev, 'e' | 'E' | 'p' | 'P') && !s.contains("0x");
                let hex_exp_sign = (d == '-' || d == '+') && matches!(prev, 'p' | 'P');
                if d.is_ascii_alphanumeric() || d == '.' || exp_sign || hex_exp_sign {
                    s.push(d);
                    prev = d;
                    cur.bump();
                } else {
                    break;
                }
            }
            Tok::Number(s)
        } else if c == '"' {
            cur.bump();
            let mut s = String::new();
            loop {
                match cur.bump() {
                    None => return Err(err("unterminated string literal".into())),
                    Some('"') => break,
                    Some('\\') => match cur.bump() {
                        Some('"') => s.push('"'),
                        Some('\\') => s.push('\\'),
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some('r') => s.push('\r'),
                        Some(o) => {
                            return Err(ParseError {
                                line: cur.line,
                                column: cur.column.saturating_sub(1).max(1),
                                message: format!("unknown escape `\\{o}` in string literal"),
                            });
                        }
                        None => return Err(err("unterminated string literal".into())),
                    },
                    Some(o) => s.push(o),
                }
            }
            Tok::Str(s)
        } else {
            return Err(err(format!("unexpected character {c:?}")));
        };
        tokens.push(Token { tok, line, column });
    }
    Ok(Lexed {
        tokens,
        end: (cur.line, cur.column),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().tokens.into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn numbers_and_arrows() {
        assert_eq!(
            toks("fp16(0x1p-3) -> (y) 1.0 -65504 1e-5 -inf"),
            vec![
                Tok::Ident("fp16".into()),
                Tok::LParen,
                Tok::Number("0x1p-3".into()),
                Tok::RParen,
                Tok::Arrow,
                Tok::LParen,
                Tok::Ident("y".into()),
                Tok::RParen,
                Tok::Number("1.0".into()),
                Tok::Number("-65504".into()),
                Tok::Number("1e-5".into()),
                Tok::Number("-inf".into()),
            ]
        );
    }

    #[test]
    fn positions_and_errors() {
        let l = lex("a\n  \"x\\\"y\"").unwrap();
        assert_eq!((l.tokens[1].line, l.tokens[1].column), (2, 3));
        assert_eq!(l.tokens[1].tok, Tok::Str("x\"y".into()));
        let e = lex("a\n  \"open").unwrap_err();
        assert_eq!((e.line, e.column), (2, 3));
        let e = lex("x = $").unwrap_err();
        assert_eq!((e.line, e.column), (1, 5));
    }
}
