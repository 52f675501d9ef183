//! Which class a request belongs to: interactive (the default) or background. Background work
//! (batch lines, and requests that ask for it) only fills the sessions interactive work leaves,
//! and gives a session back at the next step when an interactive request needs it.
//!
//! A request asks with the header `X-Anelm-Priority: background` (or `interactive`), or with
//! OpenAI's `service_tier: "flex"` (slower, cheaper processing: here, background). The header
//! wins when both are given.

use anelm_engine::Priority;
use axum::http::HeaderMap;
use serde_json::Value;

use crate::api_error::ApiError;

/// The request header that sets a request's priority.
pub const PRIORITY_HEADER: &str = "x-anelm-priority";

/// The priority `service_tier` asks for (`None`: it says nothing). OpenAI's tiers: `auto`,
/// `default`, `flex`, `scale`, `priority`.
pub fn of_service_tier(v: Option<&Value>) -> Result<Option<Priority>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "flex" => Ok(Some(Priority::Background)),
            "auto" | "default" | "scale" | "priority" => Ok(Some(Priority::Interactive)),
            other => Err(ApiError::bad_request(
                format!("service_tier '{other}' is not one of auto, default, flex, scale, priority"),
                Some("service_tier"),
            )),
        },
        Some(_) => Err(ApiError::bad_request(
            "service_tier must be a string",
            Some("service_tier"),
        )),
    }
}

/// The request's priority from its header, else what its body asked for, else interactive.
pub fn of(headers: &HeaderMap, from_body: Option<Priority>) -> Result<Priority, ApiError> {
    match headers.get(PRIORITY_HEADER).map(|v| v.to_str().map(str::trim)) {
        None => Ok(from_body.unwrap_or_default()),
        Some(Ok(v)) if v.eq_ignore_ascii_case("background") => Ok(Priority::Background),
        Some(Ok(v)) if v.eq_ignore_ascii_case("interactive") => Ok(Priority::Interactive),
        Some(_) => Err(ApiError::bad_request(
            "X-Anelm-Priority must be \"interactive\" or \"background\"",
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    #[test]
    fn header_then_service_tier_then_interactive() {
        let mut h = HeaderMap::new();
        assert_eq!(of(&h, None).ok(), Some(Priority::Interactive));
        assert_eq!(of(&h, Some(Priority::Background)).ok(), Some(Priority::Background));
        h.insert(PRIORITY_HEADER, HeaderValue::from_static("Interactive"));
        assert_eq!(of(&h, Some(Priority::Background)).ok(), Some(Priority::Interactive));
        h.insert(PRIORITY_HEADER, HeaderValue::from_static("background"));
        assert_eq!(of(&h, None).ok(), Some(Priority::Background));
        h.insert(PRIORITY_HEADER, HeaderValue::from_static("urgent"));
        assert!(of(&h, None).is_err());
        assert_eq!(
            of_service_tier(Some(&json!("flex"))).ok(),
            Some(Some(Priority::Background))
        );
        assert_eq!(
            of_service_tier(Some(&json!("auto"))).ok(),
            Some(Some(Priority::Interactive))
        );
        assert_eq!(of_service_tier(None).ok(), Some(None));
        assert!(of_service_tier(Some(&json!("cheap"))).is_err());
        assert!(of_service_tier(Some(&json!(1))).is_err());
    }
}
