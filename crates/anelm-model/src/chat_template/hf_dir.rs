//! Finding the chat template of a Hugging Face model directory.

use std::path::Path;

use serde_json::Value;

use super::TemplateError;

/// Find the chat template of a HF model dir: chat_template.jinja, or
/// tokenizer_config.json "chat_template" (string, or list of {name, template} → the
/// "default" one). Ok(None) when the directory has neither.
pub fn load_hf_chat_template(dir: &Path) -> Result<Option<String>, TemplateError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|source| TemplateError::Io { path: jinja, source });
    }
    let config_path = dir.join("tokenizer_config.json");
    if !config_path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&config_path).map_err(|source| TemplateError::Io {
        path: config_path.clone(),
        source,
    })?;
    let config: Value = serde_json::from_str(&text).map_err(|e| TemplateError::Config {
        path: config_path.clone(),
        message: format!("not valid JSON: {e}"),
    })?;
    let bad_shape = |what: &str| TemplateError::Config {
        path: config_path.clone(),
        message: format!("\"chat_template\" {what}"),
    };
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let mut first = None;
            for entry in list {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry
                    .get("template")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad_shape("list entries need a \"template\" string"))?;
                if name == Some("default") {
                    return Ok(Some(template.to_string()));
                }
                first.get_or_insert(template);
            }
            match first {
                Some(t) if list.len() == 1 => Ok(Some(t.to_string())),
                Some(_) => Err(bad_shape("list has no entry named \"default\"")),
                None => Ok(None),
            }
        }
        Some(_) => Err(bad_shape("must be a string or a list of {name, template}")),
    }
}
