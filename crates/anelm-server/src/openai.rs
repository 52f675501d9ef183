//! The OpenAI request fields anelm understands, parsed from raw JSON with errors that name the
//! field, and turned into a scheduler [`Request`].

use anelm_engine::{Request, SamplerParams};
use anelm_model::chat_template::ChatMessage;
use serde_json::{Map, Value};

use crate::api_error::ApiError;

/// Default `max_tokens` when a request gives none.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// What a completion request asks for, before tokenization.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// Chat messages (chat endpoint) or the raw prompt (completions endpoint).
    pub input: Input,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// Send a final chunk with `usage` when streaming.
    pub include_usage: bool,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling.
    pub sampler: SamplerParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Template kwargs (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub template_kwargs: Map<String, Value>,
    /// Echo of `model`.
    pub model: Option<String>,
    /// Non-standard (as llama.cpp's server): never sample end-of-generation tokens.
    pub ignore_eos: bool,
}

/// The prompt part of a request.
#[derive(Debug, Clone)]
pub enum Input {
    /// `/v1/chat/completions` messages.
    Chat(Vec<ChatMessage>),
    /// `/v1/completions` prompt text.
    Text(String),
}

fn bad(param: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("'{param}' {what}"), Some(param))
}

fn number(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| bad(key, "must be a finite number")),
        Some(_) => Err(bad(key, "must be a number")),
    }
}

fn count(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(|v| Some(v as usize))
            .ok_or_else(|| bad(key, "must be a non-negative integer")),
        Some(_) => Err(bad(key, "must be a non-negative integer")),
    }
}

fn content_text(v: &Value, at: usize) -> Result<String, ApiError> {
    let param = format!("messages[{at}].content");
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        // The array form: concatenate its text parts.
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(bad(&param, "parts must be {\"type\": \"text\", \"text\": ...}")),
                }
            }
            Ok(out)
        }
        _ => Err(bad(&param, "must be a string or an array of text parts")),
    }
}

/// Parse a request body for `chat` (messages) or completions (prompt).
pub fn parse(body: &[u8], chat: bool, max_context: usize) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    let Value::Object(obj) = v else {
        return Err(ApiError::bad_request("the body must be a JSON object", None));
    };
    let input = if chat {
        let Some(Value::Array(msgs)) = obj.get("messages") else {
            return Err(bad("messages", "is required and must be an array"));
        };
        if msgs.is_empty() {
            return Err(bad("messages", "must not be empty"));
        }
        let mut out = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.iter().enumerate() {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("messages[{i}].role"), "is required and must be a string"))?;
            let content = content_text(m.get("content").unwrap_or(&Value::Null), i)?;
            out.push(ChatMessage::new(role, content));
        }
        Input::Chat(out)
    } else {
        match obj.get("prompt") {
            Some(Value::String(s)) => Input::Text(s.clone()),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                Input::Text(a[0].as_str().unwrap_or_default().to_string())
            }
            _ => return Err(bad("prompt", "is required and must be a string")),
        }
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream", "must be a boolean")),
    };
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let max_tokens = match (count(&obj, "max_completion_tokens")?, count(&obj, "max_tokens")?) {
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => DEFAULT_MAX_TOKENS.min(max_context),
    };
    if max_tokens == 0 {
        return Err(bad("max_tokens", "must be at least 1"));
    }
    if max_tokens > max_context {
        return Err(bad(
            "max_tokens",
            &format!("is larger than the context of {max_context} tokens"),
        ));
    }
    // OpenAI's default temperature is 1.
    let mut sampler = SamplerParams {
        temperature: number(&obj, "temperature")?.unwrap_or(1.0) as f32,
        ..SamplerParams::default()
    };
    if let Some(p) = number(&obj, "top_p")? {
        sampler.top_p = p as f32;
    }
    if let Some(k) = count(&obj, "top_k")? {
        sampler.top_k = k;
    }
    if let Some(p) = number(&obj, "min_p")? {
        sampler.min_p = p as f32;
    }
    if let Some(p) = number(&obj, "presence_penalty")? {
        sampler.presence_penalty = p as f32;
    }
    if let Some(p) = number(&obj, "frequency_penalty")? {
        sampler.frequency_penalty = p as f32;
    }
    if let Some(p) = number(&obj, "repeat_penalty")? {
        sampler.repeat_penalty = p as f32;
    }
    if let Some(s) = count(&obj, "seed")? {
        sampler.seed = s as u64;
    }
    if sampler.presence_penalty != 0.0 || sampler.frequency_penalty != 0.0 || sampler.repeat_penalty != 1.0 {
        sampler.penalty_last_n = sampler.penalty_last_n.max(64);
    }
    sampler
        .validate()
        .map_err(|e| ApiError::bad_request(format!("sampling parameters: {e}"), None))?;
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            let v: Option<Vec<String>> = a.iter().map(|s| s.as_str().map(str::to_string)).collect();
            let v = v.ok_or_else(|| bad("stop", "must be a string or an array of strings"))?;
            if v.len() > 16 {
                return Err(bad("stop", "may hold at most 16 strings"));
            }
            v
        }
        Some(_) => return Err(bad("stop", "must be a string or an array of strings")),
    };
    let template_kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(bad("chat_template_kwargs", "must be an object")),
    };
    let model = obj.get("model").and_then(Value::as_str).map(str::to_string);
    let ignore_eos = match obj.get("ignore_eos") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("ignore_eos", "must be a boolean")),
    };
    Ok(Parsed {
        ignore_eos,
        input,
        stream,
        include_usage,
        max_tokens,
        sampler,
        stop,
        template_kwargs,
        model,
    })
}

impl Parsed {
    /// The scheduler request for already tokenized `prompt`.
    pub fn request(&self, prompt: Vec<u32>) -> Request {
        Request {
            prompt,
            max_tokens: self.max_tokens,
            sampler: self.sampler.clone(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_parsed_and_bad_ones_named() {
        let p = parse(
            br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0,"stop":"x","seed":3}"#,
            true,
            100,
        )
        .expect("valid");
        assert_eq!(p.max_tokens, 5);
        assert_eq!(p.sampler.temperature, 0.0);
        assert_eq!(p.stop, vec!["x".to_string()]);
        for (body, param) in [
            (&br#"{"messages":"hi"}"#[..], "messages"),
            (br#"{"messages":[{"content":"x"}]}"#, "messages[0].role"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
                "max_tokens",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1000}"#,
                "max_tokens",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                "stream",
            ),
            (br#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#, "stop"),
        ] {
            let e = parse(body, true, 100).expect_err("invalid");
            assert_eq!(e.param.as_deref(), Some(param), "{}", String::from_utf8_lossy(body));
        }
        assert!(parse(b"{not json", true, 100).is_err());
        assert!(parse(b"[]", false, 100).is_err());
        assert!(parse(br#"{"prompt":"a","temperature":-1}"#, false, 100).is_err());
    }
}
