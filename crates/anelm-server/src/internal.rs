//! One engine under every API surface: the Responses, Anthropic Messages and Ollama routes (and
//! batch lines) translate their request into an OpenAI chat-completions (or completions) body
//! and run it through the same handler as `/v1/chat/completions` — the same scheduler,
//! priority, constrained decoding, tool calls, reasoning split, prefix sharing, upstream routing
//! and privacy rules — then translate the answer back. This module is that call: a whole JSON
//! answer, or the stream's chunks one by one.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::Value;

use crate::AppState;
use crate::api_error::ApiError;

/// The endpoint a translated request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// Run `body` through the endpoint's handler with the caller's `headers` (key, privacy,
/// priority). Returns the handler's answer as it is: its own error (with `Retry-After` where it
/// has one), or a response — which, forwarded from an upstream, may still be a non-2xx one.
pub async fn respond(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: &Value,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let bytes = Bytes::from(body.to_string());
    crate::handle(st, headers, Ok(bytes), endpoint == Endpoint::Chat).await
}

/// A non-2xx response (an upstream's answer) as an [`ApiError`], keeping its `Retry-After`.
async fn response_error(resp: Response) -> ApiError {
    let status = resp.status();
    let retry = resp
        .headers()
        .get(axum::http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    let e = error_of(status, &bytes);
    match retry {
        Some(secs) => e.retry_after(secs),
        None => e,
    }
}

/// The error a non-2xx answer carries, rebuilt as an [`ApiError`] (status, message, type, param).
pub fn error_of(status: StatusCode, body: &[u8]) -> ApiError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let message = v
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let kind = match v.pointer("/error/type").and_then(Value::as_str) {
        Some("invalid_request_error") => "invalid_request_error",
        Some("authentication_error") => "authentication_error",
        Some("permission_error") => "permission_error",
        Some("rate_limit_error") => "rate_limit_error",
        _ if status.is_client_error() => "invalid_request_error",
        _ => "server_error",
    };
    let mut e = ApiError::new(status, kind, message);
    e.param = v.pointer("/error/param").and_then(Value::as_str).map(str::to_string);
    e
}

/// A whole (non-streaming) answer as JSON, or the error the handler gave.
pub async fn call(st: Arc<AppState>, headers: HeaderMap, body: &Value, endpoint: Endpoint) -> Result<Value, ApiError> {
    let resp = respond(st, headers, body, endpoint).await?;
    if !resp.status().is_success() {
        return Err(response_error(resp).await);
    }
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))
}

/// The chunks of a streamed answer, in order (`stream: true` is set on the body here).
pub struct ChunkStream {
    body: axum::body::BodyDataStream,
    buf: Vec<u8>,
    done: bool,
}

/// Start a streamed answer; an error before the first chunk (a bad request, a full queue) is
/// returned as such.
pub async fn stream(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: &Value,
    endpoint: Endpoint,
) -> Result<ChunkStream, ApiError> {
    let mut body = body.clone();
    body["stream"] = Value::Bool(true);
    let resp = respond(st, headers, &body, endpoint).await?;
    if !resp.status().is_success() {
        return Err(response_error(resp).await);
    }
    Ok(ChunkStream::new(resp.into_body()))
}

impl ChunkStream {
    /// Read server-sent events from `body`.
    pub fn new(body: Body) -> Self {
        Self {
            body: body.into_data_stream(),
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next chunk; `None` after `[DONE]` or the end of the body. A chunk that is an error
    /// object (the generation failed) comes back as `Err`.
    pub async fn next(&mut self) -> Option<Result<Value, ApiError>> {
        loop {
            if self.done {
                return None;
            }
            // One event: up to a blank line.
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&event);
                let data: String = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect::<Vec<_>>()
                    .join("\n");
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                if data == "[DONE]" {
                    self.done = true;
                    return None;
                }
                let v: Value = match serde_json::from_str(&data) {
                    Ok(v) => v,
                    Err(e) => {
                        return Some(Err(ApiError::new(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "server_error",
                            format!("a stream chunk was not JSON: {e}"),
                        )));
                    }
                };
                if let Some(err) = v.get("error") {
                    let msg = err
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("generation failed");
                    return Some(Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        msg.to_string(),
                    )));
                }
                return Some(Ok(v));
            }
            match self.body.next().await {
                Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        e.to_string(),
                    )));
                }
                None => {
                    self.done = true;
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_are_read_across_chunk_boundaries() {
        let parts: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"data: {\"a\":")),
            Ok(Bytes::from_static(b"1}\n\n:keep-alive\n\ndata: {\"b\":2}\n")),
            Ok(Bytes::from_static(
                b"\ndata: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n",
            )),
        ];
        let body = Body::from_stream(futures_util::stream::iter(parts));
        let mut s = ChunkStream::new(body);
        assert_eq!(s.next().await.unwrap().unwrap()["a"], 1);
        assert_eq!(s.next().await.unwrap().unwrap()["b"], 2);
        assert_eq!(s.next().await.unwrap().unwrap_err().message, "boom");
        assert!(s.next().await.is_none());
        assert!(s.next().await.is_none());
    }

    #[test]
    fn errors_keep_status_message_and_param() {
        let e = error_of(
            StatusCode::BAD_REQUEST,
            br#"{"error":{"message":"no","type":"invalid_request_error","param":"max_tokens"}}"#,
        );
        assert_eq!(
            (e.status, e.message.as_str(), e.param.as_deref()),
            (StatusCode::BAD_REQUEST, "no", Some("max_tokens"))
        );
        let e = error_of(StatusCode::SERVICE_UNAVAILABLE, b"not json");
        assert_eq!((e.kind, e.message.as_str()), ("server_error", "not json"));
    }
}
