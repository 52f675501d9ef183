//! `/v1/embeddings` in OpenAI's shape: `input` as a string, an array of strings, an array of
//! token ids or an array of token arrays; `encoding_format` `float` or `base64` (little-endian
//! f32); `dimensions` truncates each vector and renormalises it; `usage.prompt_tokens` counts the
//! tokens embedded (after truncation to the model's longest input). All inputs of a request go
//! through the model together (packed forwards), on a blocking thread.
//!
//! Limits, each a 400 with an OpenAI error body: at most [`MAX_INPUTS`] inputs and
//! [`MAX_TOKENS`] tokens per request; an empty input list, an empty string, a non-string item,
//! a token array longer than the model's longest input, or an unknown field.

use std::sync::Arc;

use anelm_engine::{Embedder, EngineError};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::api_error::ApiError;

/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;
/// Most tokens one request may embed in all (after each text is truncated to the model's
/// longest input).
pub const MAX_TOKENS: usize = 65_536;

/// Fields `/v1/embeddings` accepts (`user` is bookkeeping and ignored).
const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// The embedding model a server holds.
pub struct Embeddings {
    /// The model.
    pub model: Arc<Embedder>,
    /// Name reported by `/v1/models` and echoed in responses.
    pub id: String,
    /// The server has no text model (`--model` is an embedding model): text endpoints answer
    /// 400.
    pub only: bool,
}

/// The 400 a text endpoint answers on a server whose only model is an embedding model.
pub fn text_refusal(st: &AppState) -> Option<ApiError> {
    let e = st.embeddings.get().filter(|e| e.only)?;
    Some(ApiError::bad_request(
        format!(
            "this model does not generate text: '{}' is an embedding model; use /v1/embeddings, or start anelm serve with --model CHAT --embedding-model EMB",
            e.id
        ),
        Some("model"),
    ))
}

/// What the inputs are, before tokenization.
#[derive(Debug, PartialEq)]
enum Inputs {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

/// A parsed request.
#[derive(Debug, PartialEq)]
struct Parsed {
    inputs: Inputs,
    base64: bool,
    dimensions: Option<usize>,
}

fn bad(param: &str, what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("'{param}' {what}"), Some(param))
}

fn token(v: &Value, vocab: usize) -> Option<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| (n as usize) < vocab)
}

fn token_array(items: &[Value], i: Option<usize>, vocab: usize) -> Result<Vec<u32>, ApiError> {
    let at = i.map_or(String::new(), |i| format!(" (input {i})"));
    if items.is_empty() {
        return Err(bad("input", format_args!("has an empty token array{at}")));
    }
    items
        .iter()
        .map(|v| {
            token(v, vocab).ok_or_else(|| {
                bad(
                    "input",
                    format_args!("has {v}{at}, which is not a token id below the vocabulary size {vocab}"),
                )
            })
        })
        .collect()
}

fn parse(body: &[u8], info: &anelm_engine::EmbedderInfo) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    let obj: &Map<String, Value> = v
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object", None))?;
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(k, "is not supported by anelm on /v1/embeddings"));
    }
    let inputs = match obj.get("input") {
        None | Some(Value::Null) => return Err(bad("input", "is required")),
        Some(Value::String(s)) => Inputs::Texts(vec![s.clone()]),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(bad("input", "must not be an empty list"));
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => Inputs::Texts(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| {
                        x.as_str().map(str::to_string).ok_or_else(|| {
                            bad(
                                "input",
                                format_args!("item {i} is not a string (every item must be one)"),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Value::Number(_) => Inputs::Tokens(vec![token_array(items, None, info.vocab_size)?]),
            Value::Array(_) => Inputs::Tokens(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| match x {
                        Value::Array(t) => token_array(t, Some(i), info.vocab_size),
                        _ => Err(bad(
                            "input",
                            format_args!("item {i} is not a token array (every item must be one)"),
                        )),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            _ => {
                return Err(bad(
                    "input",
                    "must be a string, an array of strings, an array of token ids, or an array of token arrays",
                ));
            }
        },
        Some(_) => {
            return Err(bad(
                "input",
                "must be a string, an array of strings, an array of token ids, or an array of token arrays",
            ));
        }
    };
    let n = match &inputs {
        Inputs::Texts(t) => t.len(),
        Inputs::Tokens(t) => t.len(),
    };
    if n > MAX_INPUTS {
        return Err(bad(
            "input",
            format_args!("has {n} inputs; at most {MAX_INPUTS} per request"),
        ));
    }
    if let Inputs::Texts(t) = &inputs
        && let Some(i) = t.iter().position(String::is_empty)
    {
        return Err(bad("input", format_args!("item {i} is an empty string")));
    }
    if let Inputs::Tokens(t) = &inputs
        && let Some((i, s)) = t.iter().enumerate().find(|(_, s)| s.len() > info.max_tokens)
    {
        return Err(bad(
            "input",
            format_args!(
                "item {i} has {} tokens; this model takes at most {} per input",
                s.len(),
                info.max_tokens
            ),
        ));
    }
    let base64 = match obj.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(_) => return Err(bad("encoding_format", "must be \"float\" or \"base64\"")),
    };
    let dimensions = match obj.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(d) => Some(
            d.as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .filter(|&d| (1..=info.dimensions).contains(&d))
                .ok_or_else(|| {
                    bad(
                        "dimensions",
                        format_args!("must be an integer from 1 to {} for this model", info.dimensions),
                    )
                })?,
        ),
    };
    if let Some(m) = obj.get("model")
        && !m.is_string()
        && !m.is_null()
    {
        return Err(bad("model", "must be a string"));
    }
    Ok(Parsed {
        inputs,
        base64,
        dimensions,
    })
}

/// Standard base64 (RFC 4648, with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Truncate to `d` values and scale back to unit length.
fn shorten(v: &mut Vec<f32>, d: usize) {
    v.truncate(d);
    anelm_engine::pooling::l2_normalize(v);
}

/// `POST /v1/embeddings`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let body = st.body(body)?;
    let privacy = crate::upstream::Privacy::of(&headers, st.upstreams.private_by_default)?;
    if let Some(forwarded) = st.route_upstream(privacy, &body, "/embeddings").await {
        return forwarded;
    }
    let Some(emb) = st.embeddings.get() else {
        if let Some(e) = crate::rerank::refusal(&st, "embed texts") {
            return Err(e);
        }
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "this server has no embedding model: start anelm serve with --embedding-model DIR (a sentence-transformers directory)",
        ));
    };
    let parsed = parse(&body, emb.model.info())?;
    let model = emb.model.clone();
    let vectors = tokio::task::spawn_blocking(move || -> Result<(Vec<Vec<f32>>, usize), ApiError> {
        let seqs = match parsed.inputs {
            Inputs::Tokens(t) => t,
            Inputs::Texts(t) => {
                let refs: Vec<&str> = t.iter().map(String::as_str).collect();
                model
                    .tokenize(&refs)
                    .map_err(|e| ApiError::bad_request(format!("tokenization failed: {e}"), Some("input")))?
            }
        };
        let tokens: usize = seqs.iter().map(Vec::len).sum();
        if tokens > MAX_TOKENS {
            return Err(bad(
                "input",
                format_args!("has {tokens} tokens in all; at most {MAX_TOKENS} per request"),
            ));
        }
        let mut vectors = model.embed_tokens(&seqs).map_err(|e| match e {
            EngineError::InvalidRequest(m) => bad("input", m),
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", other.to_string()),
        })?;
        if let Some(d) = parsed.dimensions.filter(|&d| d < model.info().dimensions) {
            vectors.iter_mut().for_each(|v| shorten(v, d));
        }
        Ok((vectors, tokens))
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("embedding task failed: {e}"),
        )
    })??;
    let (vectors, tokens) = vectors;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if parsed.base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": emb.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> anelm_engine::EmbedderInfo {
        anelm_engine::EmbedderInfo {
            architecture: "bert".into(),
            dimensions: 8,
            max_tokens: 4,
            vocab_size: 100,
            pooling: vec![anelm_engine::pooling::PoolingMode::Mean],
            normalize: true,
        }
    }

    fn err(body: &str) -> String {
        match parse(body.as_bytes(), &info()) {
            Err(e) => {
                assert_eq!(e.status, StatusCode::BAD_REQUEST);
                e.message
            }
            Ok(p) => panic!("{body} parsed as {p:?}"),
        }
    }

    #[test]
    fn input_forms() {
        let p = parse(br#"{"input": "hi"}"#, &info()).unwrap();
        assert_eq!(p.inputs, Inputs::Texts(vec!["hi".into()]));
        let p = parse(
            br#"{"input": ["a", "b"], "encoding_format": "base64", "dimensions": 3}"#,
            &info(),
        )
        .unwrap();
        assert_eq!(p.inputs, Inputs::Texts(vec!["a".into(), "b".into()]));
        assert!(p.base64);
        assert_eq!(p.dimensions, Some(3));
        let p = parse(br#"{"input": [1, 2, 3]}"#, &info()).unwrap();
        assert_eq!(p.inputs, Inputs::Tokens(vec![vec![1, 2, 3]]));
        let p = parse(br#"{"input": [[1], [2, 3]]}"#, &info()).unwrap();
        assert_eq!(p.inputs, Inputs::Tokens(vec![vec![1], vec![2, 3]]));
    }

    #[test]
    fn bad_inputs_name_the_problem() {
        assert!(err(r#"{"input": []}"#).contains("empty list"));
        assert!(err(r#"{"input": ["a", 3]}"#).contains("item 1 is not a string"));
        assert!(err(r#"{"input": ["a", ""]}"#).contains("item 1 is an empty string"));
        assert!(err(r#"{"input": [[1], 2]}"#).contains("item 1 is not a token array"));
        assert!(err(r#"{"input": [1, 100]}"#).contains("vocabulary size 100"));
        assert!(err(r#"{"input": [[1, 2, 3, 4, 5]]}"#).contains("at most 4 per input"));
        assert!(err(r#"{"input": {"a": 1}}"#).contains("must be a string"));
        assert!(err(r#"{"model": "m"}"#).contains("required"));
        assert!(err(r#"{"input": "a", "dimensions": 9}"#).contains("from 1 to 8"));
        assert!(err(r#"{"input": "a", "encoding_format": "int8"}"#).contains("float"));
        assert!(err(r#"{"input": "a", "temperature": 1}"#).contains("'temperature'"));
        let many = format!(r#"{{"input": [{}]}}"#, vec!["\"a\""; MAX_INPUTS + 1].join(","));
        assert!(err(&many).contains("at most 2048"));
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&1.0f32.to_le_bytes()), "AACAPw==");
    }

    #[test]
    fn shorten_renormalises() {
        let mut v = vec![0.6, 0.0, 0.8, 0.0];
        shorten(&mut v, 2);
        assert_eq!(v, vec![1.0, 0.0]);
    }
}
