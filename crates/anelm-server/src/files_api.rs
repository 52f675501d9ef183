//! OpenAI's Files API over the job store: `POST /v1/files` (multipart, `purpose: batch`),
//! `GET /v1/files`, `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`.
//! An upload is checked whole before anything is stored (size, purpose, one JSON object per
//! line) and stored in one transaction.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::AppState;
use crate::api_error::ApiError;
use crate::batch_runner::Jobs;
use crate::job_store::StoreError;

/// A store failure as a 500 that says what failed.
pub fn store_error(e: StoreError) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string())
}

/// Run blocking store work off the async threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))?
        .map_err(store_error)
}

/// The job store, or a 503 saying how to get one.
pub fn jobs(st: &AppState) -> Result<Arc<Jobs>, ApiError> {
    st.jobs.get().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "files and batches need a data directory: this server runs without one (start it with --data-dir DIR)",
        )
    })
}

/// Look `id` up with `f` after the key and id checks; `None` is a 404 naming the `what` that
/// was not found.
pub async fn by_id<T: Send + 'static>(
    st: &AppState,
    headers: &HeaderMap,
    what: &str,
    id: &str,
    f: impl FnOnce(&crate::job_store::JobStore, &str) -> Result<Option<T>, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    st.check_key(headers)?;
    let jobs = jobs(st)?;
    if !plausible_id(id) {
        return Err(not_found(what, id));
    }
    let (store, key) = (jobs.store.clone(), id.to_string());
    blocking(move || f(&store, &key))
        .await?
        .ok_or_else(|| not_found(what, id))
}

/// A 404 for an unknown id.
pub fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no {what} with id '{id}'"),
    )
}

/// An id as it may appear: short, of letters, digits, `-` and `_` (anything else cannot exist).
pub fn plausible_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Check a batch input file: every non-blank line one JSON object. Names the first bad line.
pub fn check_jsonl(content: &[u8]) -> Result<usize, ApiError> {
    let text = std::str::from_utf8(content)
        .map_err(|e| ApiError::bad_request(format!("the file is not UTF-8 text: {e}"), Some("file")))?;
    let mut n = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(_)) => n += 1,
            Ok(_) => {
                return Err(ApiError::bad_request(
                    format!(
                        "line {} of the file is not a JSON object (a batch file is JSONL: one request object per line)",
                        i + 1
                    ),
                    Some("file"),
                ));
            }
            Err(e) => {
                return Err(ApiError::bad_request(
                    format!("line {} of the file is not valid JSON: {e}", i + 1),
                    Some("file"),
                ));
            }
        }
    }
    if n == 0 {
        return Err(ApiError::bad_request("the file holds no requests", Some("file")));
    }
    Ok(n)
}

/// `POST /v1/files`.
pub async fn upload(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let jobs = jobs(&st)?;
    let mut multipart =
        multipart.map_err(|e| ApiError::bad_request(format!("expected a multipart/form-data upload: {e}"), None))?;
    let limit = jobs.max_file_bytes;
    let too_big = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the file is larger than {limit} bytes (the server's --max-file-bytes)"),
        )
    };
    let mut purpose: Option<String> = None;
    let mut file: Option<(String, Vec<u8>)> = None;
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_big()),
            Err(e) => return Err(ApiError::bad_request(format!("could not read the upload: {e}"), None)),
        };
        match field.name().unwrap_or("") {
            "purpose" => {
                let text = field
                    .text()
                    .await
                    .map_err(|e| ApiError::bad_request(format!("could not read `purpose`: {e}"), Some("purpose")))?;
                purpose = Some(text);
            }
            "file" => {
                let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                let mut field = field;
                let mut bytes = Vec::new();
                loop {
                    match field.chunk().await {
                        Ok(Some(c)) => {
                            if bytes.len() + c.len() > limit {
                                return Err(too_big());
                            }
                            bytes.extend_from_slice(&c);
                        }
                        Ok(None) => break,
                        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_big()),
                        Err(e) => {
                            return Err(ApiError::bad_request(
                                format!("could not read the file: {e}"),
                                Some("file"),
                            ));
                        }
                    }
                }
                file = Some((name, bytes));
            }
            other => {
                return Err(ApiError::bad_request(
                    format!("unknown upload field '{other}' (expected `file` and `purpose`)"),
                    Some(other),
                ));
            }
        }
    }
    let purpose = purpose.ok_or_else(|| ApiError::bad_request("`purpose` is required", Some("purpose")))?;
    if purpose != "batch" {
        return Err(ApiError::bad_request(
            format!(
                "purpose '{purpose}' is not supported: anelm stores files for the Batch API only (purpose 'batch')"
            ),
            Some("purpose"),
        ));
    }
    let (name, bytes) = file.ok_or_else(|| ApiError::bad_request("`file` is required", Some("file")))?;
    check_jsonl(&bytes)?;
    let store = jobs.store.clone();
    let row = blocking(move || store.insert_file(&purpose, &name, &bytes)).await?;
    Ok(Json(row.to_json()).into_response())
}

/// Pagination parameters shared by the list endpoints.
pub fn page_limit(q: &HashMap<String, String>) -> Result<usize, ApiError> {
    match q.get("limit") {
        None => Ok(20),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=10_000).contains(&n) => Ok(n),
            _ => Err(ApiError::bad_request(
                "`limit` must be an integer from 1 to 10000",
                Some("limit"),
            )),
        },
    }
}

/// `GET /v1/files`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let jobs = jobs(&st)?;
    let limit = page_limit(&q)?;
    let ascending = match q.get("order").map(String::as_str) {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(_) => return Err(ApiError::bad_request("`order` must be 'asc' or 'desc'", Some("order"))),
    };
    let purpose = q.get("purpose").cloned();
    let after = q.get("after").cloned();
    let store = jobs.store.clone();
    let (rows, more) =
        blocking(move || store.list_files(purpose.as_deref(), after.as_deref(), limit, ascending)).await?;
    let data: Vec<Value> = rows.iter().map(|r| r.to_json()).collect();
    Ok(Json(json!({"object": "list", "data": data, "has_more": more,
                   "first_id": rows.first().map(|r| &r.id), "last_id": rows.last().map(|r| &r.id)})))
}

/// `GET /v1/files/{id}`.
pub async fn get(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row = by_id(&st, &headers, "file", &id, |s, k| s.file(k)).await?;
    Ok(Json(row.to_json()))
}

/// `GET /v1/files/{id}/content`.
pub async fn content(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let bytes = by_id(&st, &headers, "file", &id, |s, k| s.file_content(k)).await?;
    Ok(([(header::CONTENT_TYPE, "application/jsonl")], bytes).into_response())
}

/// `DELETE /v1/files/{id}`.
pub async fn delete(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    by_id(&st, &headers, "file", &id, |s, k| Ok(s.delete_file(k)?.then_some(()))).await?;
    Ok(Json(json!({"id": id, "object": "file", "deleted": true})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_is_checked_line_by_line() {
        assert_eq!(check_jsonl(b"{\"a\":1}\n\n{\"b\":2}\n").ok(), Some(2));
        let e = check_jsonl(b"{\"a\":1}\n[1]\n").unwrap_err();
        assert!(e.message.contains("line 2"), "{}", e.message);
        let e = check_jsonl(b"{\"a\":1}\n{\"a\":\n").unwrap_err();
        assert!(
            e.message.contains("line 2") && e.message.contains("not valid JSON"),
            "{}",
            e.message
        );
        assert!(check_jsonl(b"\n \n").is_err());
        assert!(check_jsonl(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn ids_that_cannot_exist_are_refused_before_the_store() {
        assert!(plausible_id("file-0123abcd"));
        assert!(plausible_id("batch_0123"));
        assert!(!plausible_id("../etc/passwd"));
        assert!(!plausible_id(""));
        assert!(!plausible_id(&"a".repeat(65)));
    }
}
