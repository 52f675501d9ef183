//! The non-standard `speculate` request field: whether a request's decode steps draft tokens and
//! verify them in one pass (the output is the same either way; only the speed changes).
//! `"lookup"` drafts by prompt lookup with the default options, `{"type": "lookup",
//! "draft_tokens": 8, "max_ngram": 3, "min_ngram": 1}` with others, `"draft"` with the draft
//! model the server was started with (`anelm serve --speculate PATH`; a request for one fails
//! when it has none), `"off"` turns it off; absent or `null`, the server's `--speculate` setting
//! applies.

use anelm_engine::{LookupOptions, Speculation};
use serde_json::Value;

use crate::api_error::ApiError;

const PARAM: &str = "speculate";

fn bad(what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("speculate {what}"), Some(PARAM))
}

/// Parse the field.
pub fn parse(v: Option<&Value>) -> Result<Speculation, ApiError> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(Speculation::ServerDefault),
        Some(Value::String(s)) => {
            return match s.as_str() {
                "off" => Ok(Speculation::Off),
                "lookup" => Ok(Speculation::Lookup(LookupOptions::default())),
                "draft" => Ok(Speculation::Model),
                other => Err(bad(format!(
                    "must be \"off\", \"lookup\" or \"draft\", not \"{other}\""
                ))),
            };
        }
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("must be \"off\", \"lookup\", \"draft\" or an object")),
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("lookup") => {}
        Some("off") if obj.len() == 1 => return Ok(Speculation::Off),
        Some("draft") if obj.len() == 1 => return Ok(Speculation::Model),
        Some("draft") => {
            return Err(bad(
                "\"draft\" takes no options (the server's --draft-tokens sets how many it drafts)",
            ));
        }
        _ => return Err(bad("objects need \"type\": \"lookup\"")),
    }
    let mut o = LookupOptions::default();
    for (key, value) in obj {
        let slot = match key.as_str() {
            "type" => continue,
            "draft_tokens" => &mut o.draft_tokens,
            "max_ngram" => &mut o.max_ngram,
            "min_ngram" => &mut o.min_ngram,
            other => {
                return Err(bad(format!(
                    "has no field \"{other}\" (it takes type, draft_tokens, max_ngram, min_ngram)"
                )));
            }
        };
        *slot = value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| bad(format!("{key} must be a non-negative integer")))?;
    }
    o.validate().map_err(|e| bad(format!("options: {e}")))?;
    Ok(Speculation::Lookup(o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_field_takes_its_forms() {
        assert_eq!(parse(None).unwrap(), Speculation::ServerDefault);
        assert_eq!(parse(Some(&Value::Null)).unwrap(), Speculation::ServerDefault);
        assert_eq!(parse(Some(&json!("off"))).unwrap(), Speculation::Off);
        assert_eq!(parse(Some(&json!("draft"))).unwrap(), Speculation::Model);
        assert_eq!(parse(Some(&json!({"type": "draft"}))).unwrap(), Speculation::Model);
        assert_eq!(
            parse(Some(&json!("lookup"))).unwrap(),
            Speculation::Lookup(LookupOptions::default())
        );
        assert_eq!(
            parse(Some(&json!({"type": "lookup", "draft_tokens": 4, "max_ngram": 2}))).unwrap(),
            Speculation::Lookup(LookupOptions {
                draft_tokens: 4,
                max_ngram: 2,
                ..LookupOptions::default()
            })
        );
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (v, says) in [
            (json!("fast"), "must be \"off\", \"lookup\" or \"draft\""),
            (json!(true), "must be \"off\", \"lookup\", \"draft\" or an object"),
            (json!({"type": "draft", "draft_tokens": 4}), "takes no options"),
            (json!({"draft_tokens": 4}), "need \"type\""),
            (json!({"type": "lookup", "drafts": 4}), "no field \"drafts\""),
            (json!({"type": "lookup", "draft_tokens": -1}), "non-negative integer"),
            (json!({"type": "lookup", "draft_tokens": 0}), "draft tokens must be"),
            (json!({"type": "lookup", "min_ngram": 5}), "n-gram range"),
        ] {
            let body = parse(Some(&v)).unwrap_err().to_json();
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(says), "{v}: {body}");
            assert_eq!(body["error"]["param"], "speculate", "{v}");
        }
    }
}
