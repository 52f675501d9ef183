//! Upstream engines: the user's own bigger servers (vLLM, llama.cpp's `llama-server`, another
//! anelm) behind the same OpenAI contract. A request whose `model` names an upstream is
//! forwarded there, its answer passed back byte for byte as it arrives (streams chunk by
//! chunk); a client that goes away closes the upstream connection, which cancels the request
//! there. Private requests never leave the machine (see [`Privacy`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::Response;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::api_error::ApiError;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connection attempts before a request is given up (only before any byte was sent).
const CONNECT_ATTEMPTS: usize = 3;
/// How long the upstream may take to start answering (a long prompt prefills first).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long an upstream's model list is reused.
const MODELS_TTL: Duration = Duration::from_secs(30);

/// The request header that says whether a request may leave the machine.
pub const PRIVACY_HEADER: &str = "x-anelm-privacy";

/// Whether a request may be forwarded to an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Privacy {
    /// Stays on this machine, whatever it names (`X-Anelm-Privacy: local`, or the default of a
    /// `--private-by-default` server).
    Local,
    /// May be forwarded.
    AllowUpstream,
}

impl Privacy {
    /// The request's privacy from its header and the server's default.
    pub fn of(headers: &HeaderMap, private_by_default: bool) -> Result<Self, ApiError> {
        match headers.get(PRIVACY_HEADER).map(|v| v.to_str().map(str::trim)) {
            None => Ok(if private_by_default {
                Privacy::Local
            } else {
                Privacy::AllowUpstream
            }),
            Some(Ok(v)) if v.eq_ignore_ascii_case("local") => Ok(Privacy::Local),
            Some(Ok(v)) if v.eq_ignore_ascii_case("allow-upstream") => Ok(Privacy::AllowUpstream),
            Some(_) => Err(ApiError::bad_request(
                "X-Anelm-Privacy must be \"local\" or \"allow-upstream\"",
                None,
            )),
        }
    }
}

/// An upstream's model ids, or why they could not be read.
type ModelList = Result<Vec<String>, String>;

/// One upstream engine (`--upstream NAME=URL`).
pub struct Upstream {
    /// The name requests use in `model` (`NAME` or `NAME/ID`).
    pub name: String,
    host: String,
    port: u16,
    /// Path of the OpenAI base, e.g. `/v1`.
    base_path: String,
    key: Option<String>,
    /// The upstream's model ids when last asked (or why they could not be read).
    models: Mutex<Option<(Instant, ModelList)>>,
    /// Requests forwarded.
    pub forwarded: AtomicU64,
    /// Requests that failed to reach it or timed out.
    pub failed: AtomicU64,
}

/// A problem with an `--upstream` setting.
#[derive(Debug, thiserror::Error)]
#[error("--upstream {0}")]
pub struct UpstreamConfigError(String);

impl Upstream {
    /// An upstream named `name` at `url` (an `http://host:port/path` OpenAI base), sending
    /// `key` as its bearer token.
    pub fn new(name: &str, url: &str, key: Option<String>) -> Result<Self, UpstreamConfigError> {
        let bad = |why: &str| UpstreamConfigError(format!("{name}={url}: {why}"));
        if name.is_empty() || name.contains('/') || name.chars().any(char::is_whitespace) {
            return Err(bad("the name must be non-empty, without '/' or spaces"));
        }
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            bad("the URL must start with http:// (TLS is not built in: reach an https engine through a local proxy)")
        })?;
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad("the port is not a number"))?),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let base_path = format!("/{}", path.trim_end_matches('/'));
        Ok(Self {
            name: name.to_string(),
            host: host.to_string(),
            port,
            base_path: if base_path == "/" { String::new() } else { base_path },
            key,
            models: Mutex::new(None),
            forwarded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// `host:port`.
    fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Open a connection (with retries: nothing has been sent yet) and send one request.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let mut last = String::new();
        for attempt in 0..CONNECT_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * attempt as u64)).await;
            }
            let stream =
                match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(self.authority())).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        last = e.to_string();
                        continue;
                    }
                    Err(_) => {
                        last = "connection timed out".into();
                        continue;
                    }
                };
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| self.bad_gateway(&e.to_string()))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut req = Request::builder()
                .method(method.clone())
                .uri(format!("{}{path}", self.base_path))
                .header(header::HOST, self.authority())
                .header(header::CONTENT_TYPE, "application/json");
            if let Some(k) = &self.key {
                req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
            }
            let req = req
                .body(Full::new(body.clone()))
                .map_err(|e| self.bad_gateway(&e.to_string()))?;
            return match tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(req)).await {
                Ok(Ok(resp)) => Ok(resp),
                Ok(Err(e)) => Err(self.bad_gateway(&e.to_string())),
                Err(_) => Err(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "server_error",
                    format!(
                        "upstream '{}' did not answer within {} s",
                        self.name,
                        RESPONSE_TIMEOUT.as_secs()
                    ),
                )),
            };
        }
        Err(self.bad_gateway(&format!("could not connect to {}: {last}", self.authority())))
    }

    fn bad_gateway(&self, why: &str) -> ApiError {
        self.failed.fetch_add(1, Ordering::Relaxed);
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            format!("upstream '{}' failed: {why}", self.name),
        )
    }

    /// The upstream's own model ids (cached for a while), or why they could not be read.
    pub async fn models(&self) -> ModelList {
        if let Ok(guard) = self.models.lock()
            && let Some((at, list)) = guard.as_ref()
            && at.elapsed() < MODELS_TTL
        {
            return list.clone();
        }
        let fetched = match self.send(Method::GET, "/models", Bytes::new()).await {
            Ok(resp) if resp.status().is_success() => match resp.into_body().collect().await {
                Ok(b) => serde_json::from_slice::<Value>(&b.to_bytes())
                    .map_err(|e| e.to_string())
                    .map(|v| {
                        v["data"]
                            .as_array()
                            .map(|d| d.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect())
                            .unwrap_or_default()
                    }),
                Err(e) => Err(e.to_string()),
            },
            Ok(resp) => Err(format!("HTTP {}", resp.status())),
            Err(e) => Err(e.message),
        };
        if let Ok(mut guard) = self.models.lock() {
            *guard = Some((Instant::now(), fetched.clone()));
        }
        fetched
    }

    /// Forward a request body to `path` (e.g. `/chat/completions`) with its `model` set to
    /// `model`, and pass the answer back as it arrives.
    pub async fn forward(&self, path: &str, mut body: Value, model: &str) -> Result<Response, ApiError> {
        body["model"] = Value::String(model.to_string());
        let bytes = Bytes::from(body.to_string());
        let resp = self.send(Method::POST, path, bytes).await?;
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        let status = resp.status();
        let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
        let mut out = Response::new(Body::new(resp.into_body()));
        *out.status_mut() = status;
        out.headers_mut().insert(
            header::CONTENT_TYPE,
            content_type.unwrap_or_else(|| HeaderValue::from_static("application/json")),
        );
        out.headers_mut().insert(
            "x-anelm-route",
            HeaderValue::from_str(&self.name).unwrap_or(HeaderValue::from_static("upstream")),
        );
        Ok(out)
    }

    /// The model id to send for a request that named `requested` (`NAME` or `NAME/ID`): `ID`,
    /// or the upstream's only model when it serves exactly one, else `NAME` unchanged.
    pub async fn model_for(&self, requested: &str) -> String {
        if let Some(id) = requested.strip_prefix(&self.name).and_then(|r| r.strip_prefix('/')) {
            return id.to_string();
        }
        match self.models().await {
            Ok(list) if list.len() == 1 => list[0].clone(),
            _ => requested.to_string(),
        }
    }
}

/// The configured upstreams and the routing rules.
#[derive(Default)]
pub struct Upstreams {
    /// In the order given.
    pub list: Vec<Arc<Upstream>>,
    /// Every request is private unless it says `X-Anelm-Privacy: allow-upstream`.
    pub private_by_default: bool,
    /// Where a non-private request goes when the local queue is full (instead of 429).
    pub fallback: Option<String>,
    /// Requests refused because they were private and named an upstream or found the local
    /// queue full with a fallback configured.
    pub refused_private: AtomicU64,
}

impl Upstreams {
    /// The upstream a `model` value names (`NAME` or `NAME/…`).
    pub fn named(&self, model: &str) -> Option<&Arc<Upstream>> {
        self.list
            .iter()
            .find(|u| model == u.name || model.strip_prefix(u.name.as_str()).is_some_and(|r| r.starts_with('/')))
    }

    /// The `--fallback` upstream.
    pub fn fallback(&self) -> Option<&Arc<Upstream>> {
        self.fallback
            .as_deref()
            .and_then(|f| self.list.iter().find(|u| u.name == f))
    }

    /// A private request that found the local queue full where a non-private one would have
    /// gone to the fallback: the usual 429, and counted as refused.
    pub fn refuse_private_fallback(&self) -> ApiError {
        self.refused_private.fetch_add(1, Ordering::Relaxed);
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "server_error",
            "the local request queue is full and this request is private, so it was not sent to the fallback: retry later",
        )
        .retry_after(1)
    }

    /// A private request that would have left the machine: refused, and counted.
    pub fn refuse_private(&self, why: &str) -> ApiError {
        self.refused_private.fetch_add(1, Ordering::Relaxed);
        ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            format!(
                "this request is private (X-Anelm-Privacy: local, or a --private-by-default server) and {why}; it was not forwarded"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_names_are_checked() {
        let u = Upstream::new("big", "http://10.0.0.2:8000/v1", None).expect("valid");
        assert_eq!(
            (u.host.as_str(), u.port, u.base_path.as_str()),
            ("10.0.0.2", 8000, "/v1")
        );
        let u = Upstream::new("big", "http://box/", None).expect("valid");
        assert_eq!((u.port, u.base_path.as_str()), (80, ""));
        for (name, url) in [
            ("big", "https://x/v1"),
            ("a/b", "http://x/v1"),
            ("big", "http://:80/v1"),
            ("big", "http://x:port/v1"),
        ] {
            assert!(Upstream::new(name, url, None).is_err(), "{name}={url}");
        }
        let ups = Upstreams {
            list: vec![Arc::new(Upstream::new("big", "http://x:1/v1", None).expect("valid"))],
            ..Upstreams::default()
        };
        assert!(ups.named("big").is_some() && ups.named("big/qwen").is_some());
        assert!(ups.named("bigger").is_none() && ups.named("smol").is_none());
    }

    #[test]
    fn privacy_follows_the_header_then_the_default() {
        let mut h = HeaderMap::new();
        assert_eq!(Privacy::of(&h, false).ok(), Some(Privacy::AllowUpstream));
        assert_eq!(Privacy::of(&h, true).ok(), Some(Privacy::Local));
        h.insert(PRIVACY_HEADER, HeaderValue::from_static("local"));
        assert_eq!(Privacy::of(&h, false).ok(), Some(Privacy::Local));
        h.insert(PRIVACY_HEADER, HeaderValue::from_static("allow-upstream"));
        assert_eq!(Privacy::of(&h, true).ok(), Some(Privacy::AllowUpstream));
        h.insert(PRIVACY_HEADER, HeaderValue::from_static("maybe"));
        assert!(Privacy::of(&h, false).is_err());
    }
}
