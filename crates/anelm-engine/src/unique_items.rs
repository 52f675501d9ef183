//! `uniqueItems: true` at run time, which no context-free grammar can express: the constraint
//! follows the JSON as it is written, finds the arrays the schema marks unique (by the path from
//! the root, through `$ref`, `anyOf` and `items`), keeps each one's items so far, and refuses a
//! token that would complete an item equal to an earlier one (equal as JSON values: `1` and
//! `1.0`, or objects with keys in another order, are the same item).
//!
//! Arrays whose items come from a small finite set (an enum, `Literal`s, booleans, a narrow
//! integer range) also look ahead: a token is kept only while the item can still become a value
//! not yet used, and a separator only while one is left, so the answer never walks into an item
//! it cannot finish. A token must pass both the grammar and this rule.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use crate::json_schema::{UNIQUE_MARK, has_unique_arrays};

/// Most values a finite item set may have to be looked ahead over.
const MAX_DOMAIN: usize = 256;
/// Most `$ref`/`anyOf` hops followed from one schema (recursive schemas).
const MAX_HOPS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lex {
    /// Between tokens of the JSON text.
    Ws,
    /// Inside a string starting at `start` (its quote); `key` for an object's key.
    Str { esc: bool, key: bool, start: usize },
    /// Inside a number or `true`/`false`/`null` starting at `start`.
    Scalar { start: usize },
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    obj: bool,
    /// Object: the next string is a key.
    want_key: bool,
    /// Object: the current key's bytes (without quotes) in the text.
    key: (usize, usize),
    /// Array: items completed so far.
    index: usize,
    /// The schemas this container may be under (an index into `nodes`), if known.
    node: Option<usize>,
    /// Array: its set of items, when the schema makes it unique.
    set: Option<usize>,
    /// Array: where the current item starts.
    item: Option<usize>,
}

#[derive(Clone, Debug)]
struct ItemSet {
    /// Canonical text of each item so far.
    seen: HashSet<String>,
    /// The items' exact texts not used yet, when they come from a small finite set.
    left: Option<Vec<String>>,
}

/// The parsing state the rule needs; cloned to try a token.
#[derive(Clone, Debug)]
struct Cursor {
    lex: Lex,
    frames: Vec<Frame>,
    done: bool,
    /// While trying a token: the items it completed in finite sets (set, text).
    tried: Vec<(usize, Vec<u8>)>,
}

/// The run-time `uniqueItems` rule of one stream (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct UniqueItems {
    root: Arc<Value>,
    /// Bytes of the output before the JSON starts (a tagged grammar's opening text).
    skip: usize,
    text: Vec<u8>,
    cur: Cursor,
    /// Candidate schemas (JSON pointers into `root`) of each container opened.
    nodes: Vec<Vec<String>>,
    sets: Vec<ItemSet>,
    scratch: Vec<Frame>,
}

/// What trying a token found.
enum Verdict {
    Ok,
    Refused,
}

impl UniqueItems {
    /// The rule for output matching `schema` (rewritten by [`crate::json_schema::rewrite`]),
    /// whose JSON starts after `skip` bytes; `None` when the schema has no unique array.
    pub(crate) fn new(schema: &Value, skip: usize) -> Option<Self> {
        has_unique_arrays(schema).then(|| Self {
            root: Arc::new(schema.clone()),
            skip,
            text: Vec::new(),
            cur: Cursor {
                lex: Lex::Ws,
                frames: Vec::new(),
                done: false,
                tried: Vec::new(),
            },
            nodes: Vec::new(),
            sets: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// Whether a unique array is open (only then can a token be refused).
    pub(crate) fn is_active(&self) -> bool {
        !self.cur.done && self.cur.frames.iter().any(|f| f.set.is_some())
    }

    /// Take `bytes`, the text of the token the stream took.
    pub(crate) fn accept(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            if self.cur.done {
                return;
            }
            let pos = self.text.len();
            self.text.push(b);
            let mut cur = std::mem::replace(
                &mut self.cur,
                Cursor {
                    lex: Lex::Ws,
                    frames: Vec::new(),
                    done: false,
                    tried: Vec::new(),
                },
            );
            let _ = self.step(&mut cur, b, pos, &[], true);
            self.cur = cur;
        }
    }

    /// Whether the rule lets a token with text `bytes` come next.
    pub(crate) fn allows(&mut self, bytes: &[u8]) -> bool {
        if !self.is_active() {
            return true;
        }
        let mut frames = std::mem::take(&mut self.scratch);
        frames.clear();
        frames.extend_from_slice(&self.cur.frames);
        let mut cur = Cursor {
            lex: self.cur.lex,
            frames,
            done: false,
            tried: Vec::new(),
        };
        let base = self.text.len();
        let skip = self.skip.min(bytes.len());
        let mut ok = true;
        for (i, &b) in bytes.iter().enumerate().skip(skip) {
            if cur.done {
                break;
            }
            if let Verdict::Refused = self.step(&mut cur, b, base + i - skip, &bytes[skip..], false) {
                ok = false;
                break;
            }
        }
        if ok && !cur.done {
            ok = self.partial_item_fits(&cur, &bytes[skip..]);
        }
        self.scratch = cur.frames;
        ok
    }

    /// Whether taking `bytes` (which [`UniqueItems::allows`]) leaves an item open that closing
    /// right away would repeat (`"ab` when `"ab"` was written): the grammar may allow nothing
    /// else there (a `maxLength`), so the caller looks one token further.
    pub(crate) fn is_risky(&mut self, bytes: &[u8]) -> bool {
        if !self.is_active() {
            return false;
        }
        let mut frames = std::mem::take(&mut self.scratch);
        frames.clear();
        frames.extend_from_slice(&self.cur.frames);
        let mut cur = Cursor {
            lex: self.cur.lex,
            frames,
            done: false,
            tried: Vec::new(),
        };
        let base = self.text.len();
        for (i, &b) in bytes.iter().enumerate() {
            let _ = self.step(&mut cur, b, base + i, bytes, false);
        }
        let risky = match (cur.frames.last(), cur.lex) {
            (
                Some(&Frame {
                    set: Some(s),
                    item: Some(item),
                    ..
                }),
                Lex::Str { key: false, .. } | Lex::Scalar { .. },
            ) => {
                let mut partial = self.slice(bytes, item, base + bytes.len());
                if matches!(cur.lex, Lex::Str { .. }) {
                    partial.push(b'"');
                }
                canonical(&partial).is_some_and(|c| self.sets[s].seen.contains(&c))
            }
            _ => false,
        };
        self.scratch = cur.frames;
        risky
    }

    /// Bytes `start..end` of the text followed by the token being tried.
    fn slice(&self, token: &[u8], start: usize, end: usize) -> Vec<u8> {
        let base = self.text.len();
        let mut out = Vec::with_capacity(end.saturating_sub(start));
        if start < base {
            out.extend_from_slice(&self.text[start..end.min(base)]);
        }
        if end > base {
            out.extend_from_slice(&token[start.max(base) - base..end - base]);
        }
        out
    }

    /// Look-ahead for finite item sets: the item being written must still be able to become a
    /// value not used yet.
    fn partial_item_fits(&self, cur: &Cursor, token: &[u8]) -> bool {
        let (Some(top), start) = (
            cur.frames.last(),
            match cur.lex {
                Lex::Str { start, key: false, .. } | Lex::Scalar { start } => Some(start),
                _ => None,
            },
        ) else {
            return true;
        };
        let (Some(set), Some(item), Some(_)) = (top.set, top.item, start) else {
            return true;
        };
        let Some(left) = &self.sets[set].left else {
            return true;
        };
        let partial = self.slice(token, item, self.text.len() + token.len());
        left.iter().any(|v| v.as_bytes().starts_with(&partial))
    }

    /// One byte of JSON at `pos`. `real`: the stream took it (update the sets); otherwise a
    /// token is being tried (`token` holds its bytes after the text) and may be refused.
    fn step(&mut self, cur: &mut Cursor, b: u8, pos: usize, token: &[u8], real: bool) -> Verdict {
        match cur.lex {
            Lex::Str { esc, key, start } => {
                if esc {
                    cur.lex = Lex::Str { esc: false, key, start };
                } else if b == b'\\' {
                    cur.lex = Lex::Str { esc: true, key, start };
                } else if b == b'"' {
                    cur.lex = Lex::Ws;
                    if key {
                        if let Some(f) = cur.frames.last_mut() {
                            f.key = (start + 1, pos);
                        }
                    } else {
                        return self.value_end(cur, pos + 1, token, real);
                    }
                }
                Verdict::Ok
            }
            Lex::Scalar { .. } => {
                if matches!(b, b',' | b']' | b'}' | b' ' | b'\n' | b'\t' | b'\r') {
                    if let Verdict::Refused = self.value_end(cur, pos, token, real) {
                        return Verdict::Refused;
                    }
                    cur.lex = Lex::Ws;
                    return self.step(cur, b, pos, token, real);
                }
                Verdict::Ok
            }
            Lex::Ws => match b {
                b' ' | b'\n' | b'\t' | b'\r' => Verdict::Ok,
                b'{' | b'[' => {
                    self.value_start(cur, pos);
                    let node = if real { self.open_node(cur) } else { None };
                    let set = match (real, node) {
                        (true, Some(n)) if b == b'[' => self.unique_set(n),
                        _ => None,
                    };
                    cur.frames.push(Frame {
                        obj: b == b'{',
                        want_key: b == b'{',
                        key: (0, 0),
                        index: 0,
                        node,
                        set,
                        item: None,
                    });
                    Verdict::Ok
                }
                b'}' | b']' => {
                    cur.frames.pop();
                    self.value_end(cur, pos + 1, token, real)
                }
                b',' => {
                    let Some(f) = cur.frames.last_mut() else {
                        return Verdict::Ok;
                    };
                    if f.obj {
                        f.want_key = true;
                        return Verdict::Ok;
                    }
                    f.item = None;
                    match (real, f.set) {
                        (false, Some(s)) => match &self.sets[s].left {
                            Some(left)
                                if left
                                    .iter()
                                    .all(|v| cur.tried.iter().any(|(t, x)| *t == s && x == v.as_bytes())) =>
                            {
                                Verdict::Refused
                            }
                            _ => Verdict::Ok,
                        },
                        _ => Verdict::Ok,
                    }
                }
                b':' => {
                    if let Some(f) = cur.frames.last_mut() {
                        f.want_key = false;
                    }
                    Verdict::Ok
                }
                b'"' => {
                    let key = cur.frames.last().is_some_and(|f| f.obj && f.want_key);
                    if !key {
                        self.value_start(cur, pos);
                    }
                    cur.lex = Lex::Str {
                        esc: false,
                        key,
                        start: pos,
                    };
                    Verdict::Ok
                }
                _ => {
                    self.value_start(cur, pos);
                    cur.lex = Lex::Scalar { start: pos };
                    Verdict::Ok
                }
            },
        }
    }

    fn value_start(&self, cur: &mut Cursor, pos: usize) {
        if let Some(f) = cur.frames.last_mut()
            && !f.obj
        {
            f.item = Some(pos);
        }
    }

    fn value_end(&mut self, cur: &mut Cursor, end: usize, token: &[u8], real: bool) -> Verdict {
        let Some(f) = cur.frames.last_mut() else {
            cur.done = true;
            return Verdict::Ok;
        };
        if f.obj {
            return Verdict::Ok;
        }
        f.index += 1;
        let (Some(s), Some(start)) = (f.set, f.item.take()) else {
            return Verdict::Ok;
        };
        let text = self.slice(token, start, end);
        let set = &mut self.sets[s];
        if real {
            if let Some(left) = &mut set.left {
                left.retain(|v| v.as_bytes() != text.as_slice());
            }
            if let Some(c) = canonical(&text) {
                set.seen.insert(c);
            }
            return Verdict::Ok;
        }
        if let Some(left) = &set.left {
            if !left.iter().any(|v| v.as_bytes() == text.as_slice())
                || cur.tried.iter().any(|(t, x)| *t == s && *x == text)
            {
                return Verdict::Refused;
            }
            cur.tried.push((s, text.clone()));
        }
        match canonical(&text) {
            Some(c) if set.seen.contains(&c) => Verdict::Refused,
            _ => Verdict::Ok,
        }
    }

    /// The candidate schemas of the container opening now, from its parent's.
    fn open_node(&mut self, cur: &Cursor) -> Option<usize> {
        let cands = match cur.frames.last() {
            None => expand(&self.root, String::new()),
            Some(parent) => {
                let parent_node = parent.node?;
                let mut out = Vec::new();
                for p in &self.nodes[parent_node] {
                    let Some(schema) = self.root.pointer(p) else { continue };
                    let children = if parent.obj {
                        let key: String =
                            serde_json::from_slice(&quoted(&self.text[parent.key.0..parent.key.1])).ok()?;
                        property_children(schema, p, &key)
                    } else {
                        item_children(schema, p, parent.index)
                    };
                    for c in children {
                        out.extend(expand(&self.root, c));
                    }
                }
                out
            }
        };
        self.nodes.push(cands);
        Some(self.nodes.len() - 1)
    }

    /// A new item set when any candidate schema of this array is unique.
    fn unique_set(&mut self, node: usize) -> Option<usize> {
        let unique: Vec<&String> = self.nodes[node]
            .iter()
            .filter(|p| {
                self.root
                    .pointer(p)
                    .is_some_and(|s| s.get(UNIQUE_MARK) == Some(&Value::Bool(true)))
            })
            .collect();
        if unique.is_empty() {
            return None;
        }
        let mut left: Option<Vec<String>> = Some(Vec::new());
        for p in unique {
            let Some(schema) = self.root.pointer(p) else { continue };
            if schema.get("prefixItems").is_some() || schema.get("items").is_some_and(Value::is_array) {
                left = None;
                break;
            }
            let items = match schema.get("items") {
                Some(Value::Object(_)) => expand(&self.root, format!("{p}/items")),
                _ => Vec::new(),
            };
            if items.is_empty() {
                left = None;
                break;
            }
            for it in items {
                let node = self.root.pointer(&it);
                // A `$ref` or union stands for its branches, which `expand` listed too.
                if node.is_some_and(|n| ["$ref", "anyOf", "oneOf", "allOf"].iter().any(|k| n.get(*k).is_some())) {
                    continue;
                }
                match (node.and_then(finite_texts), &mut left) {
                    (Some(texts), Some(l)) => {
                        for t in texts {
                            if !l.contains(&t) {
                                l.push(t);
                            }
                        }
                    }
                    _ => left = None,
                }
            }
        }
        if left.as_ref().is_some_and(|l| l.len() > MAX_DOMAIN) {
            left = None;
        }
        self.sets.push(ItemSet {
            seen: HashSet::new(),
            left,
        });
        Some(self.sets.len() - 1)
    }
}

/// A key's bytes back in quotes, to decode its escapes.
fn quoted(raw: &[u8]) -> Vec<u8> {
    let mut q = Vec::with_capacity(raw.len() + 2);
    q.push(b'"');
    q.extend_from_slice(raw);
    q.push(b'"');
    q
}

fn escape_pointer(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// The pointers of the schemas `p` stands for: through `$ref` (local ones) and the branches of
/// `anyOf`/`oneOf`/`allOf` (all of them: enforcing uniqueness where a branch may not ask for it
/// only narrows the answers).
fn expand(root: &Value, p: String) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![p];
    let mut hops = 0;
    while let Some(p) = todo.pop() {
        hops += 1;
        if hops > MAX_HOPS {
            break;
        }
        let Some(Value::Object(s)) = root.pointer(&p) else {
            continue;
        };
        if let Some(Value::String(r)) = s.get("$ref")
            && let Some(target) = r.strip_prefix('#')
        {
            todo.push(target.to_string());
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(a)) = s.get(key) {
                todo.extend((0..a.len()).map(|i| format!("{p}/{key}/{i}")));
            }
        }
        out.push(p);
    }
    out
}

fn property_children(schema: &Value, p: &str, key: &str) -> Vec<String> {
    if schema.get("properties").and_then(|m| m.get(key)).is_some() {
        return vec![format!("{p}/properties/{}", escape_pointer(key))];
    }
    let mut out: Vec<String> = match schema.get("patternProperties") {
        Some(Value::Object(m)) => m
            .keys()
            .map(|k| format!("{p}/patternProperties/{}", escape_pointer(k)))
            .collect(),
        _ => Vec::new(),
    };
    if schema.get("additionalProperties").is_some_and(Value::is_object) {
        out.push(format!("{p}/additionalProperties"));
    }
    out
}

fn item_children(schema: &Value, p: &str, index: usize) -> Vec<String> {
    for key in ["prefixItems", "items"] {
        if let Some(Value::Array(a)) = schema.get(key)
            && index < a.len()
        {
            return vec![format!("{p}/{key}/{index}")];
        }
    }
    for key in ["items", "additionalItems"] {
        if schema.get(key).is_some_and(Value::is_object) {
            return vec![format!("{p}/{key}")];
        }
    }
    Vec::new()
}

/// The exact JSON texts of the values `schema` allows, when they are few scalars.
fn finite_texts(schema: &Value) -> Option<Vec<String>> {
    let s = schema.as_object()?;
    let types: Option<Vec<&str>> = match s.get("type") {
        Some(Value::String(t)) => Some(vec![t.as_str()]),
        Some(Value::Array(ts)) => ts.iter().map(Value::as_str).collect(),
        _ => None,
    };
    let typed = |v: &Value| {
        types.as_ref().is_none_or(|ts| {
            ts.iter().any(|t| match *t {
                "string" => v.is_string(),
                "integer" => v.is_i64() || v.is_u64(),
                "number" => v.is_number(),
                "boolean" => v.is_boolean(),
                "null" => v.is_null(),
                _ => false,
            })
        })
    };
    let scalar = |v: &Value| !v.is_array() && !v.is_object();
    if let Some(c) = s.get("const") {
        return (scalar(c) && typed(c)).then(|| vec![c.to_string()]);
    }
    if let Some(Value::Array(e)) = s.get("enum") {
        if !e.iter().all(scalar) {
            return None;
        }
        return Some(e.iter().filter(|v| typed(v)).map(Value::to_string).collect());
    }
    let ts = types?;
    let mut out = Vec::new();
    for t in ts {
        match t {
            "boolean" => out.extend(["true".to_string(), "false".to_string()]),
            "null" => out.push("null".into()),
            "integer" if s.get("multipleOf").is_none() => {
                let lo = match (
                    s.get("minimum").and_then(Value::as_f64),
                    s.get("exclusiveMinimum").and_then(Value::as_f64),
                ) {
                    (Some(m), None) => m.ceil(),
                    (None, Some(x)) => x.floor() + 1.0,
                    (Some(m), Some(x)) => m.ceil().max(x.floor() + 1.0),
                    (None, None) => return None,
                };
                let hi = match (
                    s.get("maximum").and_then(Value::as_f64),
                    s.get("exclusiveMaximum").and_then(Value::as_f64),
                ) {
                    (Some(m), None) => m.floor(),
                    (None, Some(x)) => x.ceil() - 1.0,
                    (Some(m), Some(x)) => m.floor().min(x.ceil() - 1.0),
                    (None, None) => return None,
                };
                if hi - lo >= MAX_DOMAIN as f64 {
                    return None;
                }
                let (lo, hi) = (lo as i64, hi as i64);
                out.extend((lo..=hi).map(|i| i.to_string()));
            }
            _ => return None,
        }
    }
    Some(out)
}

/// An item's text as a canonical JSON string (object keys sorted, integral numbers without a
/// fraction), so items equal as JSON values compare equal; `None` when it does not parse.
fn canonical(text: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(text).ok()?;
    let mut out = String::new();
    write_canonical(&v, &mut out);
    Some(out)
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = m.get(k) {
                    write_canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => out.push_str(&(f as i64).to_string()),
            _ => out.push_str(&n.to_string()),
        },
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_schema::rewrite;
    use serde_json::json;

    fn rule(schema: Value) -> UniqueItems {
        UniqueItems::new(&rewrite(&schema).expect("rewrites"), 0).expect("has a unique array")
    }

    #[test]
    fn a_repeated_string_item_is_refused_where_it_would_complete() {
        let mut r = rule(json!({"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}));
        r.accept(br#"{"tags": ["ab", "a"#);
        assert!(r.is_active());
        assert!(!r.allows(b"b\""), "completes a second \"ab\"");
        assert!(!r.allows(b"b\"]"));
        assert!(r.allows(b"bc\""));
        assert!(r.allows(b"b"), "may still go on to \"abc\"");
        r.accept(b"bc\"");
        assert!(r.allows(b"]"));
        r.accept(b"]}");
        assert!(!r.is_active());
    }

    #[test]
    fn equal_values_in_other_spellings_are_duplicates() {
        let mut r = rule(json!({"type": "array", "uniqueItems": true}));
        r.accept(br#"[1.0, {"a": 1, "b": 2}, "#);
        assert!(!r.allows(b"1,"));
        assert!(!r.allows(br#"{"b": 2, "a": 1}"#));
        assert!(r.allows(b"12,"));
    }

    #[test]
    fn small_finite_items_look_ahead_and_stop_when_used_up() {
        let mut r = rule(json!({"$defs": {"C": {"enum": ["red", "green"], "type": "string"}},
            "type": "object", "properties": {"c": {"type": "array", "uniqueItems": true,
            "items": {"$ref": "#/$defs/C"}}}}));
        r.accept(br#"{"c": ["red", "#);
        assert!(!r.allows(b"\"r"), "only green is left");
        assert!(r.allows(b"\"g"));
        r.accept(br#""green""#);
        assert!(!r.allows(b", "), "nothing is left for another item");
        assert!(r.allows(b"]"));
    }

    #[test]
    fn booleans_and_narrow_integers_are_finite_sets() {
        let mut r = rule(json!({"type": "array", "uniqueItems": true, "items": {"type": "boolean"}}));
        r.accept(b"[true, ");
        assert!(!r.allows(b"t"));
        assert!(r.allows(b"f"));
        let mut r = rule(json!({"type": "array", "uniqueItems": true,
            "items": {"type": "integer", "minimum": 1, "maximum": 2}}));
        r.accept(b"[2, 1");
        assert!(!r.allows(b", "));
    }

    #[test]
    fn the_json_may_follow_an_opening_text_and_nested_paths_resolve() {
        let schema = rewrite(&json!({"anyOf": [{"type": "object", "properties": {
            "name": {"const": "f"}, "arguments": {"type": "object", "properties": {
                "xs": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true}}}}}]}))
        .expect("rewrites");
        let mut r = UniqueItems::new(&schema, "<tool_call>\n".len()).expect("unique");
        r.accept(b"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"xs\": [3, 4");
        assert!(r.allows(b"]"));
        r.accept(b", 3");
        assert!(!r.allows(b"]"));
        assert!(r.allows(b"5]"));
    }

    #[test]
    fn arrays_the_schema_does_not_mark_are_left_alone() {
        let mut r = rule(json!({"type": "object", "properties": {
            "a": {"type": "array", "uniqueItems": true}, "b": {"type": "array"}}}));
        r.accept(br#"{"a": [1], "b": [1, "#);
        assert!(!r.is_active());
        assert!(r.allows(b"1]"));
    }
}
