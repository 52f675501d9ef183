//! Chat templates: the Jinja programs (Hugging Face `chat_template`, GGUF
//! `tokenizer.chat_template`) that lay a conversation out as the model's prompt.
//!
//! Rendered with minijinja set up like transformers' environment: `trim_blocks`
//! and `lstrip_blocks`, loop controls, Python string/dict/list methods
//! (`.strip()`, `.startswith()`, `.split()`, `.items()`, ...), `namespace`,
//! `raise_exception(msg)`, `strftime_now(fmt)` and a Python-compatible `tojson`.

mod error;
mod hf_dir;
mod strftime;
mod tojson;

pub use error::TemplateError;
pub use hf_dir::load_hf_chat_template;

use minijinja::{Environment, ErrorKind, Value};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant", "tool", ...
    pub role: String,
    /// The message text.
    pub content: String,
    /// The tool calls an assistant message made, in OpenAI's form (`{"id", "type": "function",
    /// "function": {"name", "arguments"}}`); templates that know tools render them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// Name under which the template is stored in its environment.
const NAME: &str = "chat_template";
/// Prefix marking errors produced by `raise_exception`.
const RAISED: &str = "raise_exception: ";

/// The layout used when a model has no template: ChatML
/// (`<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
/// `<|im_start|>assistant\n` when a generation prompt is asked for).
pub const FALLBACK_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A compiled chat template. `Send + Sync`; render from any thread.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// `raise_exception(msg)`: abort rendering with the template's own message.
fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{msg}"),
    ))
}

/// `strftime_now(fmt)`: the current UTC time formatted.
fn strftime_now(fmt: String) -> String {
    strftime::Civil::now().format(&fmt)
}

/// An environment configured like transformers' chat-template sandbox.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson::tojson);
    env
}

/// A minijinja error with its line, for messages.
fn describe(err: &minijinja::Error) -> String {
    let mut msg = err.to_string();
    if let Some(line) = err.line()
        && !msg.contains("line")
    {
        msg.push_str(&format!(" (line {line})"));
    }
    msg
}

/// Turn a render error into a [`TemplateError`], recognising `raise_exception`.
fn render_error(err: &minijinja::Error) -> TemplateError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(mj) = e.downcast_ref::<minijinja::Error>()
            && let Some(msg) = mj.detail().and_then(|d| d.strip_prefix(RAISED))
        {
            return TemplateError::Raised(msg.to_string());
        }
        cur = e.source();
    }
    TemplateError::Render { message: describe(err) }
}

impl ChatTemplate {
    /// Compile a Jinja chat template (HF / GGUF `tokenizer.chat_template`).
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self, TemplateError> {
        let mut env = environment();
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| TemplateError::Parse { message: describe(&e) })?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
        })
    }

    /// Used when a model has no template: a plain ChatML layout ([`FALLBACK_TEMPLATE`]).
    pub fn fallback() -> Self {
        let mut env = environment();
        // The fallback is a constant that the tests compile; a failure here is a bug in
        // this file, and rendering it would then report the missing template as an Err.
        let _ = env.add_template_owned(NAME, FALLBACK_TEMPLATE);
        Self {
            env,
            source: FALLBACK_TEMPLATE.to_string(),
            bos_token: None,
            eos_token: None,
        }
    }

    /// Render; `extra` are template kwargs such as {"enable_thinking": false}. The
    /// template also sees `messages`, `add_generation_prompt`, `bos_token`, `eos_token`
    /// and `tools` (none unless given in `extra`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt, extra)
    }

    /// Whether the template lays out tool definitions itself (it reads a `tools` variable).
    pub fn takes_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// [`Self::render`] with the tool definitions (OpenAI's `tools` list) in the template's
    /// `tools` variable.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut ctx = std::collections::BTreeMap::<String, Value>::new();
        ctx.insert("tools".into(), tools.map_or(Value::from(()), Value::from_serialize));
        for (k, v) in extra {
            ctx.insert(k.clone(), Value::from_serialize(v));
        }
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::from(b.as_str()));
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::from(e.as_str()));
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Render { message: describe(&e) })?;
        template.render(Value::from_object(ctx)).map_err(|e| render_error(&e))
    }

    /// The template text as given.
    pub fn source(&self) -> &str {
        &self.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_extra() -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }

    #[test]
    fn fallback_is_chatml() {
        let t = ChatTemplate::fallback();
        let out = t
            .render(
                &[ChatMessage::new("system", "S"), ChatMessage::new("user", "U")],
                true,
                &no_extra(),
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.source(), FALLBACK_TEMPLATE);
    }

    #[test]
    fn special_tokens_and_blocks() {
        let t = ChatTemplate::new(
            "{{ bos_token }}\n{% for m in messages %}\n  {{ m.content }}{{ eos_token }}\n{% endfor %}",
            Some("<s>"),
            Some("</s>"),
        )
        .unwrap();
        // trim_blocks eats the newline after a block tag, lstrip_blocks the indent before it.
        let out = t.render(&[ChatMessage::new("user", "a")], false, &no_extra()).unwrap();
        assert_eq!(out, "<s>\n  a</s>\n");
    }

    #[test]
    fn template_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ChatTemplate>();
    }
}
