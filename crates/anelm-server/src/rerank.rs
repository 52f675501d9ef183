//! `POST /v1/rerank` (also `/rerank`, `/v1/reranking`, `/reranking`, as llama.cpp serves it),
//! in the shape Jina's and Cohere's clients and llama.cpp use: `{"model", "query", "documents":
//! [string | {"text"}], "top_n", "return_documents"}` → `{"object": "list", "model", "results":
//! [{"index", "relevance_score", "document": {"text"}}], "usage": {"prompt_tokens",
//! "total_tokens"}}`, results sorted by score, best first, cut to `top_n`. The score is a
//! cross-encoder's activated logit (the sigmoid: a probability, as sentence-transformers'
//! `CrossEncoder.predict` gives it) or a decoder reranker's P(yes).
//!
//! Bad input is a 400 with an OpenAI error body: no query, an empty query or document, no
//! documents, more than [`MAX_DOCUMENTS`], an unknown field. A pair longer than a cross-encoder
//! takes is truncated (longest first, as sentence-transformers does); a decoder reranker's
//! prompt longer than its context is refused.

use std::sync::Arc;

use anelm_engine::{EngineError, Reranker};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::api_error::ApiError;

/// Most documents one request may carry (Cohere's limit).
pub const MAX_DOCUMENTS: usize = 1000;

/// Fields the route accepts (`user` is bookkeeping and ignored).
const FIELDS: &[&str] = &["model", "query", "documents", "top_n", "return_documents", "user"];

/// The reranker a server holds.
pub struct Rerank {
    /// The model.
    pub model: Arc<Reranker>,
    /// Name reported by `/v1/models` and echoed in responses.
    pub id: String,
    /// The server has no text model (`--model` is a cross-encoder): text and embedding
    /// endpoints answer 400.
    pub only: bool,
}

/// The 400 a text or embedding endpoint answers on a server whose only model is a reranker.
pub fn refusal(st: &AppState, what: &str) -> Option<ApiError> {
    let r = st.rerank.get().filter(|r| r.only)?;
    Some(ApiError::bad_request(
        format!(
            "this model does not {what}: '{}' is a reranker; use /v1/rerank (or /v1/classify), or start anelm serve with --model CHAT --rerank-model DIR",
            r.id
        ),
        Some("model"),
    ))
}

/// A parsed request.
#[derive(Debug, PartialEq)]
struct Parsed {
    query: String,
    documents: Vec<String>,
    top_n: Option<usize>,
    return_documents: bool,
}

fn bad(param: &str, what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("'{param}' {what}"), Some(param))
}

fn parse(body: &[u8]) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    let obj: &Map<String, Value> = v
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object", None))?;
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(k, "is not supported by anelm on /v1/rerank"));
    }
    let query = match obj.get("query") {
        None | Some(Value::Null) => return Err(bad("query", "is required")),
        Some(Value::String(s)) if s.is_empty() => return Err(bad("query", "must not be empty")),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("query", "must be a string")),
    };
    let documents = match obj.get("documents") {
        None | Some(Value::Null) => return Err(bad("documents", "is required")),
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("documents", "must not be an empty list")),
        Some(Value::Array(items)) if items.len() > MAX_DOCUMENTS => {
            return Err(bad(
                "documents",
                format_args!("has {} documents; at most {MAX_DOCUMENTS} per request", items.len()),
            ));
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let text = match d {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str),
                    _ => None,
                };
                match text {
                    Some("") => Err(bad("documents", format_args!("item {i} is an empty string"))),
                    Some(s) => Ok(s.to_string()),
                    None => Err(bad(
                        "documents",
                        format_args!("item {i} is neither a string nor an object with a string 'text'"),
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(bad("documents", "must be a list of strings or {\"text\": ...} objects")),
    };
    let top_n = match obj.get("top_n") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n >= 1)
                .ok_or_else(|| bad("top_n", "must be a positive integer"))?,
        ),
    };
    let return_documents = match obj.get("return_documents") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("return_documents", "must be true or false")),
    };
    if let Some(m) = obj.get("model")
        && !m.is_string()
        && !m.is_null()
    {
        return Err(bad("model", "must be a string"));
    }
    Ok(Parsed {
        query,
        documents,
        top_n,
        return_documents,
    })
}

/// An engine error as the API answers it: bad input 400, anything else 500.
pub fn engine_error(param: &str, e: EngineError) -> ApiError {
    match e {
        EngineError::InvalidRequest(m) => bad(param, m),
        EngineError::Tokenizer(m) => bad(param, format_args!("could not be tokenized: {m}")),
        other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", other.to_string()),
    }
}

/// The results list: documents by score, best first (ties keep input order), cut to `top_n`.
fn results(scores: &[f32], docs: &[String], top_n: Option<usize>, with_text: bool) -> Vec<Value> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n.unwrap_or(order.len()));
    order
        .into_iter()
        .map(|i| {
            let mut r = json!({"index": i, "relevance_score": scores[i]});
            if with_text {
                r["document"] = json!({"text": docs[i]});
            }
            r
        })
        .collect()
}

/// `POST /v1/rerank`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let body = st.body(body)?;
    let privacy = crate::upstream::Privacy::of(&headers, st.upstreams.private_by_default)?;
    if let Some(forwarded) = st.route_upstream(privacy, &body, "/rerank").await {
        return forwarded;
    }
    let Some(rr) = st.rerank.get() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "this server has no reranker: start anelm serve with --rerank-model DIR (a cross-encoder directory or a yes/no reranker such as Qwen3-Reranker)",
        ));
    };
    let parsed = parse(&body)?;
    let model = rr.model.clone();
    let query = parsed.query.clone();
    let docs = parsed.documents.clone();
    let scored = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        model.rerank(&query, &refs)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("rerank task failed: {e}"),
        )
    })?
    .map_err(|e| engine_error("documents", e))?;
    let scores: Vec<f32> = scored
        .iter()
        .map(|s| s.logits.first().copied().unwrap_or(0.0))
        .collect();
    let tokens: usize = scored.iter().map(|s| s.tokens).sum();
    Ok(Json(json!({
        "object": "list",
        "model": rr.id,
        "results": results(&scores, &parsed.documents, parsed.top_n, parsed.return_documents),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        match parse(body.as_bytes()) {
            Err(e) => {
                assert_eq!(e.status, StatusCode::BAD_REQUEST);
                e.message
            }
            Ok(p) => panic!("{body} parsed as {p:?}"),
        }
    }

    #[test]
    fn request_forms() {
        let p = parse(br#"{"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": true}"#)
            .unwrap();
        assert_eq!(p.query, "q");
        assert_eq!(p.documents, ["a", "b"]);
        assert_eq!(p.top_n, Some(1));
        assert!(p.return_documents);
        let p = parse(br#"{"model": "m", "query": "q", "documents": ["a"], "top_n": null}"#).unwrap();
        assert_eq!(p.top_n, None);
        assert!(!p.return_documents);
    }

    #[test]
    fn bad_requests_name_the_problem() {
        assert!(err(r#"{"documents": ["a"]}"#).contains("'query' is required"));
        assert!(err(r#"{"query": "", "documents": ["a"]}"#).contains("must not be empty"));
        assert!(err(r#"{"query": "q", "documents": []}"#).contains("empty list"));
        assert!(err(r#"{"query": "q", "documents": ["a", ""]}"#).contains("item 1 is an empty string"));
        assert!(err(r#"{"query": "q", "documents": ["a", 3]}"#).contains("item 1 is neither"));
        assert!(err(r#"{"query": "q", "documents": [{"txt": "a"}]}"#).contains("item 0 is neither"));
        assert!(err(r#"{"query": "q", "documents": ["a"], "top_n": 0}"#).contains("positive"));
        assert!(err(r#"{"query": "q", "documents": ["a"], "rank_fields": ["x"]}"#).contains("'rank_fields'"));
        assert!(err(r#"{"query": 1, "documents": ["a"]}"#).contains("must be a string"));
        let many = format!(
            r#"{{"query": "q", "documents": [{}]}}"#,
            vec!["\"a\""; MAX_DOCUMENTS + 1].join(",")
        );
        assert!(err(&many).contains("at most 1000"));
    }

    #[test]
    fn results_sort_and_cut() {
        let docs: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let r = results(&[0.1, 0.9, 0.5], &docs, Some(2), true);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0]["index"], 1);
        assert_eq!(r[0]["document"]["text"], "b");
        assert_eq!(r[1]["index"], 2);
        let r = results(&[0.1, 0.9, 0.5], &docs, None, false);
        assert_eq!(r.len(), 3);
        assert!(r[0].get("document").is_none());
        assert_eq!(results(&[0.1], &docs[..1], Some(5), false).len(), 1);
    }
}
