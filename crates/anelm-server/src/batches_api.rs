//! OpenAI's Batch API over the job store: `POST /v1/batches`, `GET /v1/batches/{id}`,
//! `GET /v1/batches` (paginated), `POST /v1/batches/{id}/cancel`. A batch is checked whole
//! when it is created — its input file, every line's shape, `url` and `custom_id` — and a bad
//! file is refused with the line at fault, before anything is stored. Lines whose request is
//! bad in itself fail alone, in the batch's error file.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::api_error::ApiError;
use crate::batch_runner::BATCH_ENDPOINTS;
use crate::files_api::{blocking, by_id, jobs, page_limit, plausible_id};
use crate::job_store::NewLine;
use crate::upstream::Privacy;

/// Most lines one batch may hold (OpenAI's limit).
pub const MAX_LINES: usize = 50_000;

const CREATE_FIELDS: &[&str] = &["input_file_id", "endpoint", "completion_window", "metadata"];

/// `completion_window` in seconds: `24h` as OpenAI takes it, or any whole number of hours
/// from 1 to 168.
pub fn window_secs(w: &str) -> Option<u64> {
    let h: u64 = w.strip_suffix('h')?.parse().ok()?;
    (1..=168).contains(&h).then_some(h * 3600)
}

/// `metadata`: null, or an object of at most 16 string values (OpenAI's rule).
fn metadata(v: Option<&Value>) -> Result<Value, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m.to_string(), Some("metadata"));
    match v {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(Value::Object(m)) => {
            if m.len() > 16 {
                return Err(bad("metadata may hold at most 16 keys"));
            }
            for (k, v) in m {
                if k.len() > 64 || v.as_str().is_none_or(|s| s.len() > 512) {
                    return Err(bad(
                        "metadata keys must be at most 64 characters and values strings of at most 512",
                    ));
                }
            }
            Ok(Value::Object(m.clone()))
        }
        Some(_) => Err(bad("metadata must be an object of strings")),
    }
}

/// Every line of a batch input file checked against the batch's endpoint: one JSON object with
/// a unique non-empty `custom_id`, `method` POST, `url` the endpoint and an object `body`.
pub fn parse_lines(content: &[u8], endpoint: &str) -> Result<Vec<NewLine>, ApiError> {
    let text = std::str::from_utf8(content)
        .map_err(|e| ApiError::bad_request(format!("the input file is not UTF-8 text: {e}"), Some("input_file_id")))?;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        let bad = |m: String| ApiError::bad_request(format!("line {n} of the input file: {m}"), Some("input_file_id"));
        let v: Map<String, Value> = match serde_json::from_str(line) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(bad("is not a JSON object".into())),
            Err(e) => return Err(bad(format!("is not valid JSON: {e}"))),
        };
        for k in v.keys() {
            if !["custom_id", "method", "url", "body"].contains(&k.as_str()) {
                return Err(bad(format!(
                    "unknown field '{k}' (a line has custom_id, method, url and body)"
                )));
            }
        }
        let custom_id = match v.get("custom_id") {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 512 => s.clone(),
            _ => {
                return Err(bad(
                    "`custom_id` must be a non-empty string of at most 512 characters".into()
                ));
            }
        };
        if !seen.insert(custom_id.clone()) {
            return Err(bad(format!(
                "custom_id '{custom_id}' is used by an earlier line (each line needs its own)"
            )));
        }
        match v.get("method") {
            Some(Value::String(m)) if m == "POST" => {}
            _ => return Err(bad("`method` must be \"POST\"".into())),
        }
        match v.get("url") {
            Some(Value::String(u)) if u == endpoint => {}
            Some(Value::String(u)) => {
                return Err(bad(format!(
                    "`url` is {u} but the batch's endpoint is {endpoint} (one endpoint per batch)"
                )));
            }
            _ => return Err(bad("`url` must be a string (the batch's endpoint)".into())),
        }
        let body = match v.get("body") {
            Some(b @ Value::Object(_)) => b.to_string(),
            _ => return Err(bad("`body` must be a JSON object (the request)".into())),
        };
        out.push(NewLine { custom_id, body });
        if out.len() > MAX_LINES {
            return Err(ApiError::bad_request(
                format!("the input file holds more than {MAX_LINES} requests: split it into several batches"),
                Some("input_file_id"),
            ));
        }
    }
    if out.is_empty() {
        return Err(ApiError::bad_request(
            "the input file holds no requests",
            Some("input_file_id"),
        ));
    }
    Ok(out)
}

/// `POST /v1/batches`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let jobs = jobs(&st)?;
    let body = st.body(body)?;
    let private = Privacy::of(&headers, st.upstreams.private_by_default)? == Privacy::Local;
    let req: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(ApiError::bad_request("the body must be a JSON object", None)),
        Err(e) => return Err(ApiError::bad_request(format!("the body is not valid JSON: {e}"), None)),
    };
    if let Some(k) = req.keys().find(|k| !CREATE_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            format!(
                "'{k}' is not supported by anelm's Batch API (it takes {})",
                CREATE_FIELDS.join(", ")
            ),
            Some(k),
        ));
    }
    let field = |k: &str| req.get(k).and_then(Value::as_str);
    let input_file_id = field("input_file_id")
        .ok_or_else(|| ApiError::bad_request("`input_file_id` is required", Some("input_file_id")))?
        .to_string();
    let endpoint = field("endpoint")
        .ok_or_else(|| ApiError::bad_request("`endpoint` is required", Some("endpoint")))?
        .to_string();
    if !BATCH_ENDPOINTS.contains(&endpoint.as_str()) {
        return Err(ApiError::bad_request(
            format!(
                "endpoint '{endpoint}' is not supported: use one of {}",
                BATCH_ENDPOINTS.join(", ")
            ),
            Some("endpoint"),
        ));
    }
    let window = field("completion_window")
        .ok_or_else(|| ApiError::bad_request("`completion_window` is required (\"24h\")", Some("completion_window")))?
        .to_string();
    let secs = window_secs(&window).ok_or_else(|| {
        ApiError::bad_request(
            format!("completion_window '{window}' is not a number of hours from 1h to 168h (OpenAI uses \"24h\")"),
            Some("completion_window"),
        )
    })?;
    let metadata = metadata(req.get("metadata"))?;
    if !plausible_id(&input_file_id) {
        return Err(ApiError::bad_request(
            format!("no file with id '{input_file_id}'"),
            Some("input_file_id"),
        ));
    }
    let store = jobs.store.clone();
    let fid = input_file_id.clone();
    let file = blocking(move || Ok((store.file(&fid)?, store.file_content(&fid)?))).await?;
    let (Some(row), Some(content)) = file else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no file with id '{input_file_id}': upload it with POST /v1/files (purpose 'batch') first"),
        ));
    };
    if row.purpose != "batch" {
        return Err(ApiError::bad_request(
            format!("file '{input_file_id}' has purpose '{}', not 'batch'", row.purpose),
            Some("input_file_id"),
        ));
    }
    let lines = parse_lines(&content, &endpoint)?;
    let store = jobs.store.clone();
    let batch =
        blocking(move || store.create_batch(&endpoint, &input_file_id, &window, secs, &metadata, private, &lines))
            .await?;
    jobs.wake();
    Ok(Json(batch.to_json()))
}

/// `GET /v1/batches/{id}`.
pub async fn get(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row = by_id(&st, &headers, "batch", &id, |s, k| s.batch(k)).await?;
    Ok(Json(row.to_json()))
}

/// `GET /v1/batches`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let jobs = jobs(&st)?;
    let limit = page_limit(&q)?;
    let after = q.get("after").cloned();
    let store = jobs.store.clone();
    let (rows, more) = blocking(move || store.list_batches(after.as_deref(), limit)).await?;
    let data: Vec<Value> = rows.iter().map(|b| b.to_json()).collect();
    Ok(Json(json!({"object": "list", "data": data, "has_more": more,
                   "first_id": rows.first().map(|r| &r.id), "last_id": rows.last().map(|r| &r.id)})))
}

/// `POST /v1/batches/{id}/cancel`.
pub async fn cancel(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (asked, row) = by_id(&st, &headers, "batch", &id, |s, k| s.cancel_batch(k)).await?;
    if !asked && row.status != "cancelling" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            format!("batch '{id}' is {} and can no longer be cancelled", row.status),
        ));
    }
    if let Some(jobs) = st.jobs.get() {
        jobs.wake();
    }
    Ok(Json(row.to_json()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EP: &str = "/v1/chat/completions";

    fn line(id: &str, url: &str) -> String {
        format!(r#"{{"custom_id":"{id}","method":"POST","url":"{url}","body":{{"messages":[]}}}}"#)
    }

    #[test]
    fn lines_are_checked_with_their_number() {
        let good = format!("{}\n\n{}\n", line("a", EP), line("b", EP));
        let lines = parse_lines(good.as_bytes(), EP).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].custom_id, "b");
        let cases = [
            (
                format!("{}\n{}\n", line("a", EP), line("a", EP)),
                "line 2",
                "earlier line",
            ),
            (
                format!("{}\n{}\n", line("a", EP), line("b", "/v1/embeddings")),
                "line 2",
                "one endpoint",
            ),
            (format!("{}\nnot json\n", line("a", EP)), "line 2", "not valid JSON"),
            (
                r#"{"custom_id":"a","method":"GET","url":"/v1/chat/completions","body":{}}"#.to_string(),
                "line 1",
                "POST",
            ),
            (
                r#"{"custom_id":"","method":"POST","url":"/v1/chat/completions","body":{}}"#.to_string(),
                "line 1",
                "custom_id",
            ),
            (
                r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":[]}"#.to_string(),
                "line 1",
                "body",
            ),
            (
                r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{},"x":1}"#.to_string(),
                "line 1",
                "unknown field",
            ),
        ];
        for (text, at, why) in cases {
            let e = parse_lines(text.as_bytes(), EP).unwrap_err();
            assert!(
                e.message.contains(at) && e.message.contains(why),
                "{at} {why}: {}",
                e.message
            );
        }
        assert!(parse_lines(b"\n", EP).is_err());
    }

    #[test]
    fn windows_and_metadata() {
        assert_eq!(window_secs("24h"), Some(86400));
        assert_eq!(window_secs("1h"), Some(3600));
        assert_eq!(window_secs("0h"), None);
        assert_eq!(window_secs("24"), None);
        assert_eq!(window_secs("1d"), None);
        assert!(metadata(Some(&json!({"a": "b"}))).is_ok());
        assert!(metadata(Some(&json!({"a": 1}))).is_err());
        assert!(metadata(Some(&json!([1]))).is_err());
        assert_eq!(metadata(None).ok(), Some(Value::Null));
    }
}
