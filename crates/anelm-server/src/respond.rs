//! Turning a request's scheduler events into its OpenAI response: one JSON body, or
//! server-sent chunks. A request with `n` choices runs `n` streams whose events arrive tagged
//! with their choice; each choice's text is split into reasoning and answer (thinking models),
//! read for tool calls (requests with tools) and carries its log-probabilities.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use anelm_engine::{
    CancelToken, Completion, Event, FinishReason, LoadedModel, Part, ReasoningSplitter, TokenLogprob, ToolFormat, tools,
};
use axum::Json;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api_error::ApiError;
use crate::logprobs;

/// Cancels the request's streams when the response (or its stream) is dropped early.
pub struct CancelOnDrop(pub Vec<CancelToken>);
impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        for c in &self.0 {
            c.cancel();
        }
    }
}

/// OpenAI's name for why a stream ended.
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

/// `usage` over the finished choices: the prompt counts once (the choices share it).
fn usage(done: &[Option<Completion>]) -> Value {
    let prompt = done.iter().flatten().map(|c| c.prompt_tokens).max().unwrap_or(0);
    let completion: usize = done.iter().flatten().map(|c| c.tokens.len()).sum();
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// How long the request's work took, in llama.cpp's non-standard `timings` shape (Ollama's
/// `*_duration` fields are read from it): prefill (queueing excluded) and generation, the
/// slowest choice's.
fn timings(done: &[Option<Completion>]) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let prompt = done
        .iter()
        .flatten()
        .map(|c| ms(c.time_to_first_token.saturating_sub(c.queued)))
        .fold(0.0, f64::max);
    let predicted = done
        .iter()
        .flatten()
        .map(|c| ms(c.total.saturating_sub(c.time_to_first_token)))
        .fold(0.0, f64::max);
    let prompt_n = done.iter().flatten().map(|c| c.prompt_tokens).max().unwrap_or(0);
    let predicted_n: usize = done.iter().flatten().map(|c| c.tokens.len()).sum();
    json!({"prompt_n": prompt_n, "prompt_ms": prompt, "predicted_n": predicted_n, "predicted_ms": predicted})
}

/// What every response of one request names: its id, the model, the endpoint's shape, and how
/// its text is read.
#[derive(Clone)]
pub struct Reply {
    /// The response id.
    pub id: String,
    /// The `model` echoed.
    pub model: String,
    /// Chat endpoint (else completions).
    pub chat: bool,
    /// The model (its tokenizer spells log-probabilities' tokens).
    pub lm: Arc<LoadedModel>,
    /// The request offered tools, which the model writes in this format: the answer is read
    /// for calls (and, streaming, held back until it is complete).
    pub tools: Option<ToolFormat>,
    /// More than one call per answer allowed.
    pub parallel_tool_calls: bool,
    /// A thinking model's chat prompt: its `<think>` text goes to `reasoning_content`.
    pub thinking_prompt: Option<Arc<str>>,
    /// Choices (`n`).
    pub choices: usize,
    /// The request used the legacy `functions`: a call is answered as `function_call` with
    /// `finish_reason` `function_call`.
    pub legacy_functions: bool,
}

/// An answer read for tool calls: the text outside them and the calls in OpenAI's form.
struct Answer {
    content: Option<String>,
    tool_calls: Vec<Value>,
}

impl Reply {
    /// `text` read for tool calls when the request offered tools.
    fn answer(&self, choice: usize, text: String) -> Answer {
        let Some(format) = self.tools else {
            return Answer {
                content: Some(text),
                tool_calls: Vec::new(),
            };
        };
        let (content, mut calls) = tools::parse_tool_calls(format, &text);
        if !self.parallel_tool_calls {
            calls.truncate(1);
        }
        if calls.is_empty() {
            return Answer {
                content: Some(text),
                tool_calls: Vec::new(),
            };
        }
        let tool_calls = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"id": format!("call_{}_{choice}_{i}", self.id), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments.to_string()}})
            })
            .collect();
        Answer {
            content: (!content.is_empty()).then_some(content),
            tool_calls,
        }
    }

    /// `finish_reason` for a finished answer: `tool_calls` (legacy: `function_call`) when it
    /// made calls.
    fn finish(&self, answer: &Answer, f: FinishReason) -> &'static str {
        if !answer.tool_calls.is_empty() && f == FinishReason::Stop {
            if self.legacy_functions {
                "function_call"
            } else {
                "tool_calls"
            }
        } else {
            finish_reason(f)
        }
    }

    /// The `logprobs` value of a choice for `tokens`, whose text starts at byte `offset`.
    fn logprobs(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        if self.chat {
            logprobs::chat(&self.lm.tokenizer, tokens)
        } else {
            logprobs::completions(&self.lm.tokenizer, tokens, offset)
        }
    }
}

/// The whole response as one JSON body, once every choice has finished.
pub async fn collect(
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    guard: CancelOnDrop,
    reply: Reply,
) -> Result<Response, ApiError> {
    let n = reply.choices;
    let mut texts = vec![String::new(); n];
    let mut lps: Vec<Option<Vec<TokenLogprob>>> = vec![None; n];
    let mut done: Vec<Option<Completion>> = vec![None; n];
    while let Some((i, ev)) = rx.recv().await {
        if i >= n {
            continue;
        }
        match ev {
            Event::Text(t) => texts[i].push_str(&t),
            Event::Logprob(lp) => lps[i].get_or_insert_with(Vec::new).push(lp),
            Event::Failed(m) => {
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m));
            }
            Event::Done(c) => {
                done[i] = Some(c);
                if done.iter().all(Option::is_some) {
                    break;
                }
            }
        }
    }
    if !done.iter().all(Option::is_some) {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "generation ended without a result",
        ));
    }
    drop(guard);
    let mut choices = Vec::with_capacity(n);
    for (i, text) in texts.into_iter().enumerate() {
        let finish = done[i].as_ref().map_or(FinishReason::Cancelled, |c| c.finish);
        let logprobs = lps[i].as_deref().map_or(Value::Null, |l| reply.logprobs(l, 0));
        let mut choice = if reply.chat {
            let (reasoning, text) = match &reply.thinking_prompt {
                Some(prompt) => ReasoningSplitter::split(prompt, &text),
                None => (None, text),
            };
            let answer = reply.answer(i, text);
            let finish = reply.finish(&answer, finish);
            let mut message = json!({"role": "assistant", "content": answer.content});
            if let Some(r) = reasoning {
                message["reasoning_content"] = json!(r);
            }
            if reply.legacy_functions
                && let Some(call) = answer.tool_calls.first()
            {
                // A legacy `functions` answer: its (single) call as `message.function_call`.
                message["function_call"] = call["function"].clone();
            } else if !answer.tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(answer.tool_calls);
            }
            json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
        } else {
            json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(finish)})
        };
        name_stop_string(&mut choice, done[i].as_ref());
        choices.push(choice);
    }
    let obj = if reply.chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let body = json!({"id": reply.id, "object": obj, "created": crate::now(), "model": reply.model,
                      "choices": choices, "usage": usage(&done), "timings": timings(&done)});
    Ok(Json(body).into_response())
}

/// One choice's state while it streams.
struct ChoiceState {
    /// Log-probabilities of tokens whose text has not been sent yet.
    pending: Vec<TokenLogprob>,
    /// Bytes of completion text sent so far (the completions form's `text_offset`).
    offset: usize,
    /// With tools offered, the text is held here until the answer is complete and read for
    /// calls (a call cannot be told from text while it is being written).
    held: Option<String>,
    /// A thinking model's output is split into reasoning and answer as it streams.
    splitter: Option<ReasoningSplitter>,
}

/// A streamed response's state between events.
struct StreamState {
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    guard: Option<CancelOnDrop>,
    /// Frames ready to send.
    queue: VecDeque<Value>,
    choices: Vec<ChoiceState>,
    done: Vec<Option<Completion>>,
    finished: bool,
}

/// Builds the chunks of one streamed response.
struct Chunker {
    reply: Reply,
    created: u64,
}

impl Chunker {
    fn chunk(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        let choice = if self.reply.chat {
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
        } else {
            json!({"index": index, "text": delta.get("content").cloned().unwrap_or(json!("")),
                   "logprobs": logprobs, "finish_reason": finish})
        };
        let obj = if self.reply.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        json!({"id": self.reply.id, "object": obj, "created": self.created, "model": self.reply.model,
               "choices": [choice]})
    }

    /// The log-probabilities of the tokens whose text goes out in this chunk.
    fn take_logprobs(&self, c: &mut ChoiceState) -> Value {
        if c.pending.is_empty() {
            return Value::Null;
        }
        let v = self.reply.logprobs(&c.pending, c.offset);
        c.offset += c
            .pending
            .iter()
            .map(|t| self.reply.lm.tokenizer.token_bytes(t.token).len())
            .sum::<usize>();
        c.pending.clear();
        v
    }

    /// Text pieces out as chunks: reasoning at once, the answer at once or (with tools) held
    /// until complete.
    fn send(&self, queue: &mut VecDeque<Value>, index: usize, c: &mut ChoiceState, pieces: Vec<(Part, String)>) {
        for (part, text) in pieces {
            match (part, &mut c.held) {
                (Part::Content, Some(held)) => held.push_str(&text),
                (part, _) => {
                    let key = if part == Part::Reasoning {
                        "reasoning_content"
                    } else {
                        "content"
                    };
                    let lps = self.take_logprobs(c);
                    queue.push_back(self.chunk(index, json!({ key: text }), lps, None));
                }
            }
        }
    }

    /// A choice finished: what it held back, its tool calls, its finish chunk.
    fn finish(&self, queue: &mut VecDeque<Value>, index: usize, c: &mut ChoiceState, done: &Completion) {
        if let Some(mut s) = c.splitter.take() {
            let rest = s.finish();
            self.send(queue, index, c, rest);
        }
        let mut finish = finish_reason(done.finish);
        if let Some(text) = c.held.take() {
            let answer = self.reply.answer(index, text);
            finish = self.reply.finish(&answer, done.finish);
            if let Some(content) = answer.content {
                let lps = self.take_logprobs(c);
                queue.push_back(self.chunk(index, json!({"content": content}), lps, None));
            }
            if self.reply.legacy_functions
                && let Some(call) = answer.tool_calls.first()
            {
                let head = json!({"function_call": {"name": call["function"]["name"], "arguments": ""}});
                queue.push_back(self.chunk(index, head, Value::Null, None));
                let args = json!({"function_call": {"arguments": call["function"]["arguments"]}});
                queue.push_back(self.chunk(index, args, Value::Null, None));
            } else {
                for (i, call) in answer.tool_calls.into_iter().enumerate() {
                    // As OpenAI streams a call: id, type and name first, then the arguments.
                    let head = json!({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                  "function": {"name": call["function"]["name"], "arguments": ""}}]});
                    queue.push_back(self.chunk(index, head, Value::Null, None));
                    let args =
                        json!({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]});
                    queue.push_back(self.chunk(index, args, Value::Null, None));
                }
            }
        }
        if !c.pending.is_empty() {
            // Tokens whose text was held back and never sent (a stop string).
            let lps = self.take_logprobs(c);
            queue.push_back(self.chunk(index, json!({"content": ""}), lps, None));
        }
        let mut last = self.chunk(index, json!({}), Value::Null, Some(finish));
        if let Some(choice) = last.pointer_mut("/choices/0") {
            name_stop_string(choice, Some(done));
        }
        queue.push_back(last);
    }
}

/// A choice that a stop string ended names it as `stop_reason` (as vLLM does), so callers that
/// report which one matched (the Messages API's `stop_sequence`) can.
fn name_stop_string(choice: &mut Value, done: Option<&Completion>) {
    if choice["finish_reason"] == "stop"
        && let Some(s) = done.and_then(|c| c.stop_string.as_deref())
        && let Some(o) = choice.as_object_mut()
    {
        o.insert("stop_reason".into(), json!(s));
    }
}

/// The response as server-sent events: chunks per choice as text arrives, then the usage chunk
/// (when asked) and `[DONE]`.
pub fn stream(
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    guard: CancelOnDrop,
    reply: Reply,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let n = reply.choices;
    let chunker = Arc::new(Chunker {
        created: crate::now(),
        reply,
    });
    let mut queue = VecDeque::new();
    if chunker.reply.chat {
        for i in 0..n {
            queue.push_back(chunker.chunk(i, json!({"role": "assistant", "content": ""}), Value::Null, None));
        }
    }
    let choices = (0..n)
        .map(|_| ChoiceState {
            pending: Vec::new(),
            offset: 0,
            held: chunker.reply.tools.map(|_| String::new()),
            splitter: chunker.reply.thinking_prompt.as_deref().map(ReasoningSplitter::new),
        })
        .collect();
    let init = StreamState {
        rx,
        guard: Some(guard),
        queue,
        choices,
        done: vec![None; n],
        finished: false,
    };
    let stream = futures_util::stream::unfold(init, move |mut st| {
        let ch = chunker.clone();
        async move {
            loop {
                if let Some(v) = st.queue.pop_front() {
                    let ev = match v {
                        Value::String(s) => SseEvent::default().data(s),
                        v => SseEvent::default().data(v.to_string()),
                    };
                    return Some((Ok(ev), st));
                }
                if st.finished {
                    return None;
                }
                match st.rx.recv().await {
                    Some((i, _)) if i >= st.choices.len() => {}
                    Some((i, Event::Logprob(lp))) => st.choices[i].pending.push(lp),
                    Some((i, Event::Text(t))) => {
                        let c = &mut st.choices[i];
                        let pieces = match &mut c.splitter {
                            Some(s) => s.push(&t),
                            None => vec![(Part::Content, t)],
                        };
                        ch.send(&mut st.queue, i, c, pieces);
                    }
                    Some((i, Event::Done(c))) => {
                        ch.finish(&mut st.queue, i, &mut st.choices[i], &c);
                        st.done[i] = Some(c);
                        if st.done.iter().all(Option::is_some) {
                            st.guard.take(); // finished: cancelling finished requests is a no-op
                            if include_usage {
                                let mut u = ch.chunk(0, json!({}), Value::Null, None);
                                if let Some(o) = u.as_object_mut() {
                                    o.insert("choices".into(), json!([]));
                                    o.insert("usage".into(), usage(&st.done));
                                    o.insert("timings".into(), timings(&st.done));
                                }
                                st.queue.push_back(u);
                            }
                            st.queue.push_back(Value::String("[DONE]".into()));
                            st.finished = true;
                        }
                    }
                    Some((_, Event::Failed(m))) => {
                        st.queue
                            .push_back(json!({"error": {"message": m, "type": "server_error"}}));
                        st.queue.push_back(Value::String("[DONE]".into()));
                        st.finished = true;
                    }
                    None => {
                        st.queue.push_back(Value::String("[DONE]".into()));
                        st.finished = true;
                    }
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
