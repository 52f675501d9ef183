//! JSON schemas as real code writes them (pydantic, zod, instructor), rewritten before
//! llguidance compiles them so that every keyword is enforced rather than refused:
//!
//! - `format`: the formats llguidance lacks or accepts too loosely for the validators clients
//!   run (pydantic's `EmailStr`, `date`, `uuid4`, `IPv4Network`, `Base64Str`, ...) become an
//!   anchored `pattern` whose every match is valid (a subset of the format when the exact
//!   language is not regular); formats that constrain nothing a JSON string can violate
//!   (`binary`, `password`, `path`) and unknown formats are annotations and are dropped;
//!   `int32`/`int64` on integers become bounds.
//! - `uniqueItems: true` becomes the marker [`UNIQUE_MARK`], which llguidance ignores and the
//!   run-time rule of [`crate::unique_items`] enforces; `uniqueItems: false` is dropped.
//! - `propertyNames` (pydantic's `dict[Literal[...], V]`, zod's records) becomes `properties`
//!   or `patternProperties` with `additionalProperties: false`.
//! - `dependentRequired` becomes an `allOf` of "absent or present with its dependencies".
//! - `not: {}` (zod's `never`) is the `false` schema, `not: false` is dropped.
//! - `unevaluatedProperties` on an object without applicators is `additionalProperties`.
//! - `contentMediaType: application/json` with a scalar `contentSchema` (pydantic's `Json[int]`)
//!   becomes a `pattern` of that scalar's JSON text.
//!
//! Annotations (`title`, `description`, `examples`, `default`, `$schema`, `$comment`,
//! `deprecated`, `readOnly`, `writeOnly`, `discriminator`) never change which values are valid and
//! are left for llguidance to ignore. Keywords with no rewrite here (`if`/`then`/`else`,
//! `contains`, a general `not`, `$dynamicRef`) are refused by llguidance with its reason.

use serde_json::{Map, Value, json};

/// The keyword a unique array carries after [`rewrite`] (llguidance ignores `x-` keywords).
pub const UNIQUE_MARK: &str = "x-anelm-unique-items";

const OCTET: &str = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
const IPV6_FULL: &str = r"[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){7}";
const DATE: &str = concat!(
    r"(?:[1-9][0-9]{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    r"|[1-9][0-9](?:0[48]|[2468][048]|[13579][26])-02-29)"
);
const TIME: &str =
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{3}(?:[0-9]{3})?)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
// Short enough that a small model finishes it; every match passes `email-validator` (a dot in
// the domain, a 2-3 letter top-level domain, so never a special-use one like `.test`).
const EMAIL: &str = r"[a-zA-Z0-9_+-]{1,16}(?:\.[a-zA-Z0-9_+-]{1,16})?@(?:[a-zA-Z0-9]{1,20}\.){1,2}[a-zA-Z]{2,3}";
const URL: &str = r"https?://[a-z0-9]{1,30}(?:\.[a-z0-9]{1,30}){0,3}\.[a-z]{2,6}(?:/[a-zA-Z0-9._~-]{0,40}){0,6}(?:\?[a-zA-Z0-9=&_.-]{0,60})?";
// Base64 of ASCII bytes (so `Base64Str` decodes to valid UTF-8 too): the first character of a
// group keeps byte 1's top bit clear, the second byte 2's, the third byte 3's.
const B64_GROUP: &str = "[A-Za-f][A-HQ-Xg-nw-z0-3][ABEFIJMNQRUVYZcdghklopstwx014589]";
const B64_TAIL: &str = "(?:[A-Za-f][AQgw]==|[A-Za-f][A-HQ-Xg-nw-z0-3][AEIMQUYcgkosw048]=)";

/// What a `format` becomes.
enum FormatRule {
    /// llguidance's own regex is exact enough: keep the keyword.
    Keep,
    /// Replace it by this (unanchored) regular expression.
    Pattern(String),
    /// An annotation: any string is valid.
    Drop,
}

fn uuid(version: Option<char>) -> String {
    match version {
        Some(v) => format!("[0-9a-f]{{8}}-[0-9a-f]{{4}}-{v}[0-9a-f]{{3}}-[89ab][0-9a-f]{{3}}-[0-9a-f]{{12}}"),
        None => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}".into(),
    }
}

fn ipv4() -> String {
    format!(r"{OCTET}(?:\.{OCTET}){{3}}")
}

fn format_rule(name: &str) -> FormatRule {
    use FormatRule::*;
    match name {
        "hostname" | "ipv4" | "ipv6" => Keep,
        // Bounded (llguidance's takes any number of digits, which overflows `timedelta`).
        "duration" => Pattern("P(?:[0-9]{1,4}D|(?:[0-9]{1,4}D)?T(?:[0-9]{1,2}H)?(?:[0-9]{1,2}M)?[0-9]{1,2}S)".into()),
        "idn-hostname" => Pattern(r"[a-z0-9]{1,30}(?:\.[a-z0-9]{1,30}){0,3}".into()),
        "date" => Pattern(DATE.into()),
        "time" => Pattern(TIME.into()),
        "date-time" => Pattern(format!("{DATE}T{TIME}")),
        "email" | "idn-email" | "name-email" => Pattern(EMAIL.into()),
        "uri" | "iri" | "uri-reference" | "iri-reference" | "multi-host-uri" | "url" => Pattern(URL.into()),
        "uuid" => Pattern(uuid(None)),
        "uuid1" | "uuid3" | "uuid4" | "uuid5" | "uuid6" | "uuid7" | "uuid8" => Pattern(uuid(name.chars().last())),
        "ipvanyaddress" => Pattern(ipv4()),
        "ipv4network" | "ipvanynetwork" => Pattern(format!(
            r"{OCTET}\.0\.0\.0/8|{OCTET}\.{OCTET}\.0\.0/16|{OCTET}\.{OCTET}\.{OCTET}\.0/24|{}/32",
            ipv4()
        )),
        "ipv4interface" | "ipvanyinterface" => Pattern(format!("{}/(?:3[0-2]|[12]?[0-9])", ipv4())),
        "ipv6network" => Pattern(format!("{IPV6_FULL}/128")),
        "ipv6interface" => Pattern(format!("{IPV6_FULL}/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9])")),
        "base64" => Pattern(format!("(?:{B64_GROUP}[A-Za-z0-9+/])*{B64_TAIL}?")),
        "base64url" => Pattern(format!("(?:{B64_GROUP}[A-Za-z0-9_-])*{B64_TAIL}?")),
        "color" => Pattern("#[0-9a-f]{6}".into()),
        "regex" => Pattern("[a-zA-Z0-9 _-]*".into()),
        "json-pointer" => Pattern("(?:/(?:[^~/]|~[01])*)*".into()),
        "relative-json-pointer" => Pattern("(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^~/]|~[01])*)*)".into()),
        _ => Drop,
    }
}

/// Integer bounds of the number formats OpenAPI and zod write (`z.bigint()` is `int64`).
fn integer_format_bounds(name: &str) -> Option<(i64, i64)> {
    // Within ±2^53 so the bounds are exact as the f64 llguidance keeps them in.
    const SAFE: i64 = (1 << 53) - 1;
    match name {
        "int8" => Some((-128, 127)),
        "uint8" => Some((0, 255)),
        "int16" => Some((-32768, 32767)),
        "uint16" => Some((0, 65535)),
        "int32" => Some((-(1 << 31), (1 << 31) - 1)),
        "uint32" => Some((0, (1 << 32) - 1)),
        "int64" => Some((-SAFE, SAFE)),
        "uint64" => Some((0, SAFE)),
        _ => None,
    }
}

/// A JSON schema error found while rewriting, with the JSON pointer of the schema at fault.
#[derive(Debug, PartialEq)]
pub struct RewriteError(pub String);

/// Rewrite `schema` (see the module docs) so llguidance enforces every keyword.
pub fn rewrite(schema: &Value) -> Result<Value, RewriteError> {
    let mut s = schema.clone();
    walk(&mut s, "#")?;
    Ok(s)
}

/// Keywords whose value maps names (not keywords) to sub-schemas: a property may be called
/// `default` or `enum` there.
const NAMED_SCHEMAS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keywords whose value is data, not schemas.
fn is_data_keyword(k: &str) -> bool {
    matches!(k, "const" | "enum" | "default" | "examples")
}

/// Whether a rewritten schema has a unique array anywhere (the run-time rule is then needed).
pub fn has_unique_arrays(schema: &Value) -> bool {
    match schema {
        Value::Object(o) => {
            o.get(UNIQUE_MARK) == Some(&Value::Bool(true))
                || o.iter().any(|(k, v)| match v {
                    Value::Object(m) if NAMED_SCHEMAS.contains(&k.as_str()) => m.values().any(has_unique_arrays),
                    _ => !is_data_keyword(k) && has_unique_arrays(v),
                })
        }
        Value::Array(a) => a.iter().any(has_unique_arrays),
        _ => false,
    }
}

fn walk(node: &mut Value, at: &str) -> Result<(), RewriteError> {
    let Value::Object(o) = node else {
        return Ok(());
    };
    // Sub-schemas first, so a rewrite here sees rewritten children.
    for &key in NAMED_SCHEMAS {
        if let Some(Value::Object(m)) = o.get_mut(key) {
            for (name, sub) in m.iter_mut() {
                walk(sub, &format!("{at}/{key}/{name}"))?;
            }
        }
    }
    for key in [
        "items",
        "additionalItems",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    ] {
        match o.get_mut(key) {
            Some(v @ Value::Object(_)) => walk(v, &format!("{at}/{key}"))?,
            Some(Value::Array(a)) if key == "items" => {
                for (i, sub) in a.iter_mut().enumerate() {
                    walk(sub, &format!("{at}/{key}/{i}"))?;
                }
            }
            _ => {}
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(a)) = o.get_mut(key) {
            for (i, sub) in a.iter_mut().enumerate() {
                walk(sub, &format!("{at}/{key}/{i}"))?;
            }
        }
    }
    rewrite_format(o);
    rewrite_unique(o);
    rewrite_property_names(o, at)?;
    rewrite_dependent_required(o, at)?;
    rewrite_unevaluated(o);
    rewrite_content(o);
    match o.get("not") {
        Some(Value::Bool(false)) => {
            o.remove("not");
        }
        Some(Value::Bool(true)) => *node = Value::Bool(false),
        Some(Value::Object(n)) if n.keys().all(|k| is_annotation(k)) => *node = Value::Bool(false),
        _ => {}
    }
    Ok(())
}

fn is_annotation(k: &str) -> bool {
    matches!(
        k,
        "title" | "description" | "examples" | "default" | "$comment" | "deprecated" | "readOnly" | "writeOnly"
    )
}

/// Whether the schema can describe strings (a `type` naming `string`, or no `type`).
fn may_be_string(o: &Map<String, Value>) -> bool {
    match o.get("type") {
        None => true,
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        Some(_) => false,
    }
}

/// Add an anchored `pattern` to a string schema, beside any it has (then through `allOf`).
fn add_pattern(o: &mut Map<String, Value>, regex: &str) {
    let anchored = format!("^(?:{regex})$");
    if !o.contains_key("pattern") {
        o.insert("pattern".into(), Value::String(anchored));
        return;
    }
    let extra = json!({"type": "string", "pattern": anchored});
    match o.get_mut("allOf") {
        Some(Value::Array(a)) => a.push(extra),
        _ => {
            o.insert("allOf".into(), json!([extra]));
        }
    }
}

fn rewrite_format(o: &mut Map<String, Value>) {
    let Some(Value::String(name)) = o.get("format").cloned() else {
        return;
    };
    if o.get("type").and_then(Value::as_str) == Some("integer") {
        o.remove("format");
        if let Some((lo, hi)) = integer_format_bounds(&name) {
            let tighter = |o: &mut Map<String, Value>, key: &str, bound: i64, min: bool| {
                let cur = o.get(key).and_then(Value::as_f64);
                if cur.is_none_or(|c| if min { c < bound as f64 } else { c > bound as f64 }) {
                    o.insert(key.into(), json!(bound));
                }
            };
            tighter(o, "minimum", lo, true);
            tighter(o, "maximum", hi, false);
        }
        return;
    }
    if !may_be_string(o) {
        // `format` on numbers (`float`, `double`) and the like is an annotation.
        o.remove("format");
        return;
    }
    match format_rule(&name) {
        FormatRule::Keep => {}
        FormatRule::Drop => {
            o.remove("format");
        }
        FormatRule::Pattern(rx) => {
            o.remove("format");
            add_pattern(o, &rx);
        }
    }
}

fn rewrite_unique(o: &mut Map<String, Value>) {
    match o.remove("uniqueItems") {
        Some(Value::Bool(true)) => {
            o.insert(UNIQUE_MARK.into(), Value::Bool(true));
        }
        Some(Value::Bool(false)) | None => {}
        Some(other) => {
            // Not a boolean: leave it for llguidance to refuse.
            o.insert("uniqueItems".into(), other);
        }
    }
}

/// A regex matching exactly the names a simple `propertyNames` schema allows, or why not.
fn names_regex(names: &Map<String, Value>) -> Option<String> {
    let keys: Vec<&str> = names.keys().map(String::as_str).filter(|k| !is_annotation(k)).collect();
    let only = |allowed: &[&str]| keys.iter().all(|k| allowed.contains(k));
    if only(&["type", "pattern"]) && names.get("pattern").is_some() {
        return names.get("pattern").and_then(Value::as_str).map(str::to_string);
    }
    if only(&["type", "minLength", "maxLength"]) {
        let lo = names.get("minLength").and_then(Value::as_u64).unwrap_or(0);
        return Some(match names.get("maxLength").and_then(Value::as_u64) {
            Some(hi) => format!("^.{{{lo},{hi}}}$"),
            None => format!("^.{{{lo},}}$"),
        });
    }
    None
}

fn rewrite_property_names(o: &mut Map<String, Value>, at: &str) -> Result<(), RewriteError> {
    let Some(names) = o.remove("propertyNames") else {
        return Ok(());
    };
    let refuse = |why: &str| {
        Err(RewriteError(format!(
            "{at}/propertyNames: {why}; anelm enforces propertyNames as an enum, a const, a pattern or \
             length bounds on an object whose other keys are only additionalProperties"
        )))
    };
    let names = match names {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => {
            o.insert("maxProperties".into(), json!(0));
            return Ok(());
        }
        Value::Object(n) => n,
        _ => return refuse("must be a schema"),
    };
    if o.contains_key("patternProperties") {
        return refuse("it is combined with patternProperties");
    }
    let value_schema = o.remove("additionalProperties").unwrap_or(Value::Bool(true));
    let listed: Option<Vec<String>> = match (names.get("enum"), names.get("const")) {
        (Some(Value::Array(e)), _) => e.iter().map(|v| v.as_str().map(str::to_string)).collect(),
        (_, Some(Value::String(c))) => Some(vec![c.clone()]),
        _ => None,
    };
    let props = o.entry("properties").or_insert_with(|| json!({}));
    let Value::Object(props) = props else {
        return refuse("properties is not an object");
    };
    if let Some(listed) = listed {
        for name in &listed {
            props.entry(name.clone()).or_insert_with(|| value_schema.clone());
        }
        for (name, sub) in props.iter_mut() {
            if !listed.contains(name) {
                *sub = Value::Bool(false);
            }
        }
    } else if let Some(rx) = names_regex(&names) {
        if !props.is_empty() {
            return refuse("a pattern is combined with properties");
        }
        o.remove("properties");
        o.insert("patternProperties".into(), json!({ rx: value_schema }));
    } else {
        return refuse("its keywords cannot be turned into a grammar");
    }
    o.insert("additionalProperties".into(), Value::Bool(false));
    Ok(())
}

fn rewrite_dependent_required(o: &mut Map<String, Value>, at: &str) -> Result<(), RewriteError> {
    let Some(deps) = o.remove("dependentRequired") else {
        return Ok(());
    };
    let Value::Object(deps) = deps else {
        return Err(RewriteError(format!(
            "{at}/dependentRequired: must be an object of name lists"
        )));
    };
    let mut all = Vec::new();
    for (name, needs) in deps {
        let Some(needs) = needs.as_array() else {
            return Err(RewriteError(format!(
                "{at}/dependentRequired/{name}: must be a list of names"
            )));
        };
        let mut required = vec![Value::String(name.clone())];
        required.extend(needs.iter().cloned());
        all.push(json!({"anyOf": [{"properties": {name: false}}, {"required": required}]}));
    }
    match o.get_mut("allOf") {
        Some(Value::Array(a)) => a.extend(all),
        _ => {
            o.insert("allOf".into(), Value::Array(all));
        }
    }
    Ok(())
}

fn rewrite_unevaluated(o: &mut Map<String, Value>) {
    let applicators = ["allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas"];
    if o.contains_key("unevaluatedProperties")
        && !applicators.iter().any(|k| o.contains_key(*k))
        && !o.contains_key("additionalProperties")
        && let Some(u) = o.remove("unevaluatedProperties")
    {
        o.insert("additionalProperties".into(), u);
    }
    if o.contains_key("unevaluatedItems")
        && !applicators.iter().any(|k| o.contains_key(*k))
        && o.contains_key("prefixItems")
        && !o.contains_key("items")
        && let Some(u) = o.remove("unevaluatedItems")
    {
        o.insert("items".into(), u);
    }
}

fn rewrite_content(o: &mut Map<String, Value>) {
    if o.get("contentMediaType").and_then(Value::as_str) != Some("application/json") {
        return;
    }
    let Some(Value::Object(inner)) = o.get("contentSchema") else {
        return;
    };
    let rx = match inner.get("type").and_then(Value::as_str) {
        Some("integer") => "-?(?:0|[1-9][0-9]{0,15})",
        Some("number") => r"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,15})?",
        Some("boolean") => "true|false",
        Some("null") => "null",
        _ => return,
    };
    // Bounds and the like inside are not turned into the pattern: keep only the plain type.
    if inner.keys().all(|k| k == "type" || is_annotation(k)) {
        o.remove("contentSchema");
        add_pattern(o, rx);
    }
}

/// `schema` ready to sit at JSON pointer `at` inside a larger schema (a tool's `parameters`
/// inside a tool call's schema): its `$defs`/`definitions` are taken out (to go at the larger
/// schema's root, renamed with `prefix`) and its local `$ref`s point where they will be.
pub fn embed(schema: &Value, at: &str, prefix: &str) -> (Value, Map<String, Value>, Map<String, Value>) {
    let mut s = schema.clone();
    let mut take = |key: &str| match s.as_object_mut().and_then(|o| o.remove(key)) {
        Some(Value::Object(m)) => m.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)).collect(),
        _ => Map::new(),
    };
    let (mut defs, mut definitions) = (take("$defs"), take("definitions"));
    let fix = |v: &mut Value| fix_refs(v, at, prefix);
    fix(&mut s);
    defs.values_mut().for_each(fix);
    definitions.values_mut().for_each(fix);
    (s, defs, definitions)
}

fn fix_refs(v: &mut Value, at: &str, prefix: &str) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get_mut("$ref")
                && let Some(local) = r.strip_prefix('#')
            {
                *r = match ["/$defs/", "/definitions/"].iter().find(|d| local.starts_with(*d)) {
                    Some(d) => format!("#{d}{prefix}{}", &local[d.len()..]),
                    None => format!("#{at}{local}"),
                };
            }
            for (k, sub) in o.iter_mut() {
                match sub {
                    Value::Object(m) if NAMED_SCHEMAS.contains(&k.as_str()) => {
                        m.values_mut().for_each(|x| fix_refs(x, at, prefix));
                    }
                    _ if is_data_keyword(k) => {}
                    _ => fix_refs(sub, at, prefix),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| fix_refs(x, at, prefix)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(v: Value) -> Value {
        rewrite(&v).expect("rewrites")
    }

    #[test]
    fn formats_llguidance_lacks_become_anchored_patterns() {
        let s = rw(json!({"type": "object", "properties": {
            "e": {"type": "string", "format": "email"},
            "u": {"type": "string", "format": "uuid4"},
            "d": {"type": "string", "format": "date"},
            "ip": {"type": "string", "format": "ipvanyaddress"},
            "host": {"type": "string", "format": "hostname"},
            "dur": {"type": "string", "format": "duration"},
        }}));
        let p = &s["properties"];
        assert!(p["e"].get("format").is_none());
        assert!(
            p["e"]["pattern"]
                .as_str()
                .is_some_and(|r| r.starts_with("^(?:") && r.ends_with(")$"))
        );
        assert!(
            p["u"]["pattern"]
                .as_str()
                .is_some_and(|r| r.contains("-4[0-9a-f]{3}-[89ab]"))
        );
        assert!(p["d"]["pattern"].as_str().is_some_and(|r| r.contains("02-29")));
        assert!(p["ip"]["pattern"].is_string());
        assert_eq!(p["host"]["format"], "hostname");
        assert!(p["dur"]["pattern"].is_string());
    }

    #[test]
    fn a_format_beside_a_pattern_goes_through_all_of() {
        let s = rw(json!({"type": "string", "pattern": "^a", "format": "email"}));
        assert_eq!(s["pattern"], "^a");
        assert_eq!(s["allOf"][0]["type"], "string");
        assert!(s["allOf"][0]["pattern"].is_string());
    }

    #[test]
    fn annotation_formats_are_dropped_and_integer_formats_bound() {
        let s = rw(json!({"anyOf": [
            {"type": "string", "format": "binary"},
            {"type": "string", "format": "password", "writeOnly": true},
            {"type": "string", "format": "no-such-format"},
            {"type": "integer", "format": "int32", "minimum": 0},
            {"type": "number", "format": "double"},
        ]}));
        for i in 0..3 {
            assert!(s["anyOf"][i].get("format").is_none(), "{s}");
        }
        assert_eq!(s["anyOf"][3]["minimum"], 0);
        assert_eq!(s["anyOf"][3]["maximum"], (1i64 << 31) - 1);
        assert!(s["anyOf"][4].get("format").is_none());
    }

    #[test]
    fn unique_items_becomes_the_marker_everywhere_but_in_values() {
        let s = rw(json!({"$defs": {"T": {"type": "array", "uniqueItems": true}},
            "properties": {"a": {"$ref": "#/$defs/T"}, "b": {"type": "array", "uniqueItems": false}},
            "default": {"uniqueItems": true}}));
        assert_eq!(s["$defs"]["T"][UNIQUE_MARK], true);
        assert!(s["$defs"]["T"].get("uniqueItems").is_none());
        assert!(s["properties"]["b"].get("uniqueItems").is_none());
        assert_eq!(s["default"]["uniqueItems"], true);
        assert!(has_unique_arrays(&s));
        // Properties named like data keywords are still walked into.
        let named = rw(json!({"type": "object", "properties": {
            "default": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}));
        assert!(has_unique_arrays(&named));
        let mut refs = json!({"properties": {"examples": {"$ref": "#/$defs/X"}}, "default": {"$ref": "#/$defs/Y"}});
        fix_refs(&mut refs, "", "tool0_");
        assert_eq!(refs["properties"]["examples"]["$ref"], "#/$defs/tool0_X");
        assert_eq!(refs["default"]["$ref"], "#/$defs/Y", "data is left alone");
        assert!(!has_unique_arrays(&rw(
            json!({"type": "array", "default": [{UNIQUE_MARK: true}]})
        )));
    }

    #[test]
    fn property_names_become_properties_or_pattern_properties() {
        let s = rw(json!({"type": "object", "additionalProperties": {"type": "integer"},
            "propertyNames": {"enum": ["a", "b"]}}));
        assert_eq!(
            s["properties"],
            json!({"a": {"type": "integer"}, "b": {"type": "integer"}})
        );
        assert_eq!(s["additionalProperties"], false);
        let s = rw(json!({"type": "object", "additionalProperties": {"type": "integer"},
            "propertyNames": {"maxLength": 3}}));
        assert_eq!(s["patternProperties"], json!({"^.{0,3}$": {"type": "integer"}}));
        let s = rw(json!({"type": "object", "propertyNames": {"format": "email"}}));
        assert_eq!(s["patternProperties"].as_object().map(|m| m.len()), Some(1), "{s}");
        let e = rewrite(&json!({"propertyNames": {"minLength": 2, "pattern": "^a"}})).expect_err("refused");
        assert!(e.0.contains("#/propertyNames"), "{}", e.0);
    }

    #[test]
    fn dependent_required_never_and_unevaluated_properties() {
        let s = rw(json!({"type": "object", "dependentRequired": {"a": ["b"]}}));
        assert_eq!(s["allOf"][0]["anyOf"][1]["required"], json!(["a", "b"]));
        assert_eq!(rw(json!({"not": {}})), json!(false));
        assert_eq!(rw(json!({"type": "string", "not": false})), json!({"type": "string"}));
        let s = rw(json!({"type": "object", "properties": {}, "unevaluatedProperties": false}));
        assert_eq!(s["additionalProperties"], false);
    }

    #[test]
    fn json_strings_of_scalars_get_their_pattern() {
        let s = rw(json!({"type": "string", "contentMediaType": "application/json",
            "contentSchema": {"type": "integer"}}));
        assert!(s["pattern"].as_str().is_some_and(|p| p.contains("[1-9]")));
        assert!(s.get("contentSchema").is_none());
    }

    #[test]
    fn an_embedded_schema_keeps_its_references() {
        let (s, defs, definitions) = embed(
            &json!({"$defs": {"A": {"properties": {"b": {"$ref": "#/$defs/B"}}}, "B": {"type": "integer"}},
                "properties": {"a": {"$ref": "#/$defs/A"}, "me": {"$ref": "#"}, "c": {"const": {"$ref": "#"}}}}),
            "/anyOf/0/properties/arguments",
            "t0_",
        );
        assert_eq!(s["properties"]["a"]["$ref"], "#/$defs/t0_A");
        assert_eq!(s["properties"]["me"]["$ref"], "#/anyOf/0/properties/arguments");
        assert_eq!(s["properties"]["c"]["const"]["$ref"], "#");
        assert_eq!(defs["t0_A"]["properties"]["b"]["$ref"], "#/$defs/t0_B");
        assert!(definitions.is_empty() && s.get("$defs").is_none());
    }
}
