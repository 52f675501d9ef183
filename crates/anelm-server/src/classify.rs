//! `POST /v1/classify`: the probability of each label for each input, in one forward, for
//! routing and tagging. `{"model", "input": string | [string], "labels": [string], "raw": bool}`
//! → `{"object": "list", "model", "data": [{"object": "classification", "index", "label",
//! "labels": [{"label", "probability", "logprob"?}]}], "usage"}` (`label`: the most probable).
//!
//! What it computes depends on the model `model` names:
//! - a sequence classifier (a cross-encoder directory served with `--model` or
//!   `--rerank-model`): its own head over the input alone, softmax over its `id2label` logits
//!   (sigmoid for one label). `labels` may be omitted (all of them, in the head's order) or list
//!   some of the head's labels (those are returned, not renormalised).
//! - a causal language model (the chat model, or a decoder reranker): the input as a user
//!   message through the chat template (thinking off), or as given with `"raw": true`; at the
//!   prompt's last position, the logit of each label's first token; `probability` is the softmax
//!   over those logits only (they sum to 1 over the labels) and `logprob` the token's
//!   log-probability over the whole vocabulary. `labels` (at least two, starting with distinct
//!   tokens) is required.

use std::sync::Arc;

use anelm_engine::label_scores::label_probabilities;
use anelm_engine::{LoadedModel, Reranker};
use anelm_model::chat_template::ChatMessage;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::api_error::ApiError;
use crate::rerank::engine_error;

/// Most inputs one request may carry.
pub const MAX_INPUTS: usize = 256;
/// Most labels one request may name.
pub const MAX_LABELS: usize = 64;

const FIELDS: &[&str] = &["model", "input", "labels", "raw", "user"];

#[derive(Debug, PartialEq)]
struct Parsed {
    model: Option<String>,
    inputs: Vec<String>,
    labels: Option<Vec<String>>,
    raw: bool,
}

fn bad(param: &str, what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("'{param}' {what}"), Some(param))
}

fn strings(v: &Value, param: &str, max: usize) -> Result<Vec<String>, ApiError> {
    let items = match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) if items.is_empty() => return Err(bad(param, "must not be an empty list")),
        Value::Array(items) if items.len() > max => {
            return Err(bad(param, format_args!("has {} items; at most {max}", items.len())));
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(param, format_args!("item {i} is not a string")))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad(param, "must be a string or a list of strings")),
    };
    if let Some(i) = items.iter().position(String::is_empty) {
        return Err(bad(param, format_args!("item {i} is an empty string")));
    }
    Ok(items)
}

fn parse(body: &[u8]) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    let obj: &Map<String, Value> = v
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object", None))?;
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(k, "is not supported by anelm on /v1/classify"));
    }
    let inputs = match obj.get("input") {
        None | Some(Value::Null) => return Err(bad("input", "is required")),
        Some(v) => strings(v, "input", MAX_INPUTS)?,
    };
    let labels = match obj.get("labels") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Array(_)) => Some(strings(v, "labels", MAX_LABELS)?),
        Some(_) => return Err(bad("labels", "must be a list of strings")),
    };
    let raw = match obj.get("raw") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("raw", "must be true or false")),
    };
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("model", "must be a string")),
    };
    Ok(Parsed {
        model,
        inputs,
        labels,
        raw,
    })
}

/// One input's answer: (label, probability, logprob) in output order, and the tokens read.
type Scored = (Vec<(String, f32, Option<f32>)>, usize);

/// Label scores from a causal language model (see the module docs).
fn score_causal(lm: &LoadedModel, p: &Parsed) -> Result<Vec<Scored>, ApiError> {
    let labels = p.labels.clone().ok_or_else(|| {
        bad(
            "labels",
            "is required for a language model (at least two labels, starting with distinct tokens)",
        )
    })?;
    if labels.len() < 2 {
        return Err(bad("labels", "must name at least two labels"));
    }
    let mut kwargs = Map::new();
    kwargs.insert("enable_thinking".into(), Value::Bool(false));
    let prompts = p
        .inputs
        .iter()
        .map(|input| {
            let text = if p.raw {
                input.clone()
            } else {
                lm.render_chat(&[ChatMessage::new("user", input.as_str())], &[], &kwargs)
                    .map_err(|e| engine_error("input", e))?
            };
            lm.tokenizer.encode(&text).map_err(|e| bad("input", e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let scores = label_probabilities(lm, &prompts, &labels).map_err(|e| engine_error("labels", e))?;
    Ok(scores
        .into_iter()
        .map(|s| {
            let rows = labels
                .iter()
                .zip(s.probabilities.iter().zip(&s.logprobs))
                .map(|(l, (&p, &lp))| (l.clone(), p, Some(lp)))
                .collect();
            (rows, s.tokens)
        })
        .collect())
}

/// Label probabilities from a sequence classifier's head (see the module docs).
fn score_head(model: &Reranker, p: &Parsed) -> Result<Vec<Scored>, ApiError> {
    let Reranker::Cross(ce) = model else {
        return Err(bad("model", "is not a sequence classifier"));
    };
    let names = &ce.info().labels;
    let wanted: Vec<usize> = match &p.labels {
        None => (0..names.len()).collect(),
        Some(ls) => ls
            .iter()
            .map(|l| {
                names.iter().position(|n| n == l).ok_or_else(|| {
                    bad(
                        "labels",
                        format_args!(
                            "names '{l}', which this classifier does not have (its labels: {})",
                            names.join(", ")
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
    };
    let refs: Vec<&str> = p.inputs.iter().map(String::as_str).collect();
    let out = ce.classify(&refs).map_err(|e| engine_error("input", e))?;
    Ok(out
        .into_iter()
        .map(|l| {
            let rows = wanted
                .iter()
                .map(|&i| (names[i].clone(), l.logits.get(i).copied().unwrap_or(0.0), None))
                .collect();
            (rows, l.tokens)
        })
        .collect())
}

/// `POST /v1/classify`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let body = st.body(body)?;
    let p = parse(&body)?;
    // The reranker when the request names it or it is the server's only model; else the chat
    // model.
    let rerank = st
        .rerank
        .get()
        .filter(|r| r.only || p.model.as_deref() == Some(r.id.as_str()));
    let failed = |e: tokio::task::JoinError| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("classification task failed: {e}"),
        )
    };
    let (id, scored) = match rerank {
        Some(r) => {
            let model = r.model.clone();
            let scored = tokio::task::spawn_blocking(move || match model.as_ref() {
                Reranker::Cross(_) => score_head(&model, &p),
                Reranker::Decoder(d) => score_causal(d.model(), &p),
            })
            .await
            .map_err(failed)??;
            (r.id.clone(), scored)
        }
        None => {
            let ready = st.live().await?;
            let scored = tokio::task::spawn_blocking(move || score_causal(&ready.model, &p))
                .await
                .map_err(failed)??;
            (st.config.model_id.clone(), scored)
        }
    };
    let tokens: usize = scored.iter().map(|s| s.1).sum();
    let data: Vec<Value> = scored
        .into_iter()
        .enumerate()
        .map(|(i, (rows, _))| {
            let best = rows
                .iter()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(String::new(), |r| r.0.clone());
            let labels: Vec<Value> = rows
                .into_iter()
                .map(|(label, p, lp)| match lp {
                    Some(lp) => json!({"label": label, "probability": p, "logprob": lp}),
                    None => json!({"label": label, "probability": p}),
                })
                .collect();
            json!({"object": "classification", "index": i, "label": best, "labels": labels})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "model": id,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        match parse(body.as_bytes()) {
            Err(e) => e.message,
            Ok(p) => panic!("{body} parsed as {p:?}"),
        }
    }

    #[test]
    fn request_forms() {
        let p = parse(br#"{"input": "hi", "labels": ["a", "b"], "raw": true}"#).unwrap();
        assert_eq!(p.inputs, ["hi"]);
        assert_eq!(p.labels, Some(vec!["a".into(), "b".into()]));
        assert!(p.raw);
        let p = parse(br#"{"model": "m", "input": ["x", "y"]}"#).unwrap();
        assert_eq!(p.model.as_deref(), Some("m"));
        assert_eq!(p.labels, None);
    }

    #[test]
    fn bad_requests_name_the_problem() {
        assert!(err(r#"{"labels": ["a"]}"#).contains("'input' is required"));
        assert!(err(r#"{"input": []}"#).contains("empty list"));
        assert!(err(r#"{"input": ["a", ""]}"#).contains("item 1 is an empty string"));
        assert!(err(r#"{"input": "a", "labels": "a"}"#).contains("list of strings"));
        assert!(err(r#"{"input": "a", "labels": ["a", 2]}"#).contains("item 1 is not a string"));
        assert!(err(r#"{"input": "a", "raw": 1}"#).contains("true or false"));
        assert!(err(r#"{"input": "a", "temperature": 0}"#).contains("'temperature'"));
    }
}
