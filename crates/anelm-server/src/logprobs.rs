//! Token log-probabilities in OpenAI's two response shapes: the chat form
//! (`choices[].logprobs.content[]` with `token`, `logprob`, `bytes`, `top_logprobs`) and the
//! legacy completions form (`tokens`, `token_logprobs`, `top_logprobs` maps, `text_offset`).

use anelm_engine::TokenLogprob;
use anelm_model::tokenizer::Tokenizer;
use serde_json::{Map, Value, json};

fn text_of(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// A finite JSON number for a log-probability (−∞, which JSON cannot hold, becomes −9999 as
/// OpenAI reports impossible tokens).
fn finite(lp: f32) -> f64 {
    if lp.is_finite() { f64::from(lp) } else { -9999.0 }
}

/// The chat form's `logprobs` object for `tokens`.
pub fn chat(tok: &Tokenizer, tokens: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let (text, bytes) = text_of(tok, id);
        json!({"token": text, "logprob": finite(lp), "bytes": bytes})
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t.token, t.logprob);
            let top: Vec<Value> = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            if let Some(o) = e.as_object_mut() {
                o.insert("top_logprobs".into(), Value::Array(top));
            }
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The completions form's `logprobs` object for `tokens`, whose text starts at byte `offset` of
/// the completion.
pub fn completions(tok: &Tokenizer, tokens: &[TokenLogprob], mut offset: usize) -> Value {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut lps = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        let (text, bytes) = text_of(tok, t.token);
        offsets.push(offset);
        offset += bytes.len();
        texts.push(Value::String(text));
        lps.push(json!(finite(t.logprob)));
        let mut top = Map::new();
        for &(id, lp) in &t.top {
            top.insert(text_of(tok, id).0, json!(finite(lp)));
        }
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}
