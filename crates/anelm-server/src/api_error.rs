//! Errors as OpenAI-shaped JSON bodies: `{"error": {"message", "type", "param", "code"}}` with the
//! matching HTTP status (and `Retry-After` when the queue is full).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error a handler returns to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong and what to do.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// Seconds after which a retry may succeed (queue full, loading).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// 400 for a bad field or body.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            retry_after: None,
        }
    }

    /// Any other status.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            retry_after: None,
        }
    }

    /// Ask the client to retry after `secs`.
    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

impl ApiError {
    /// The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        let code = match self.status.as_u16() {
            401 => "invalid_api_key",
            404 => "not_found",
            413 => "request_too_large",
            429 => "rate_limit_exceeded",
            503 => "unavailable",
            _ => "invalid_request",
        };
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}})
    }
}

impl ApiError {
    /// This error's status and `Retry-After` around `body` (each API surface has its own error
    /// shape).
    pub fn respond_with(&self, body: serde_json::Value) -> Response {
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond_with(self.to_json())
    }
}
