//! `anelm batch`: start, watch, fetch and cancel batch jobs on a running `anelm serve` through
//! its OpenAI Files and Batch APIs — the same calls any OpenAI client makes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};

use crate::http_client::Server;

/// Arguments of `anelm batch`.
#[derive(Args, Debug)]
pub struct BatchArgs {
    #[command(subcommand)]
    pub command: BatchCommand,
    /// The server's OpenAI base URL.
    #[arg(long, global = true, env = "ANELM_URL", default_value = "http://127.0.0.1:8080/v1")]
    pub url: String,
    /// The server's API key (if it was started with --api-key).
    #[arg(long, global = true, env = "ANELM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum BatchCommand {
    /// Upload a JSONL file of requests and start a batch over it; prints the batch id.
    Submit {
        /// One request per line: {"custom_id", "method": "POST", "url", "body"}.
        file: PathBuf,
        /// The endpoint (default: the `url` of the file's first line).
        #[arg(long)]
        endpoint: Option<String>,
        /// How long the batch may take before it expires.
        #[arg(long, default_value = "24h")]
        completion_window: String,
        /// Metadata to attach, KEY=VALUE (repeatable).
        #[arg(long, value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// Follow the batch with a progress bar until it ends.
        #[arg(long)]
        wait: bool,
    },
    /// One batch with a progress bar until it ends (or, without an id, the recent batches).
    Status {
        /// The batch id.
        id: Option<String>,
        /// Print the batch object once as JSON instead of following it.
        #[arg(long)]
        json: bool,
    },
    /// Write a finished batch's results (and, with --errors, its failed lines) to files.
    Results {
        /// The batch id.
        id: String,
        /// Where the output lines go ("-" for stdout).
        #[arg(short, long, default_value = "-")]
        output: String,
        /// Where the error lines go.
        #[arg(long)]
        errors: Option<PathBuf>,
    },
    /// Cancel a batch (lines already done keep their results).
    Cancel {
        /// The batch id.
        id: String,
    },
}

const FINAL: &[&str] = &["completed", "failed", "expired", "cancelled"];

/// Run `anelm batch`.
pub fn run(a: BatchArgs) -> Result<()> {
    let server = Server::parse(&a.url, a.api_key.clone())?;
    match a.command {
        BatchCommand::Submit {
            file,
            endpoint,
            completion_window,
            metadata,
            wait,
        } => {
            let content = std::fs::read(&file).with_context(|| format!("could not read {}", file.display()))?;
            let endpoint = match endpoint {
                Some(e) => e,
                None => first_url(&content).with_context(|| {
                    format!(
                        "{}: no `url` on its first line; pass --endpoint /v1/chat/completions (or /v1/completions, /v1/embeddings)",
                        file.display()
                    )
                })?,
            };
            let mut meta = Map::new();
            for kv in &metadata {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--metadata {kv}: expected KEY=VALUE"))?;
                meta.insert(k.to_string(), json!(v));
            }
            let name = file
                .file_name()
                .map_or("batch.jsonl".into(), |n| n.to_string_lossy().into_owned());
            let uploaded = server.upload("/files", &[("purpose", "batch")], &name, &content)?;
            let file_id = uploaded["id"].as_str().context("the upload answered without an id")?;
            let mut req = json!({"input_file_id": file_id, "endpoint": endpoint,
                                 "completion_window": completion_window});
            if !meta.is_empty() {
                req["metadata"] = Value::Object(meta);
            }
            let batch = server.post_json("/batches", &req)?;
            let id = batch["id"].as_str().context("the server answered without a batch id")?;
            println!("{id}");
            eprintln!(
                "batch {id}: {} requests to {endpoint}; follow it with `anelm batch status {id}`",
                batch["request_counts"]["total"]
            );
            if wait {
                follow(&server, id)?;
            }
            Ok(())
        }
        BatchCommand::Status { id: None, .. } => {
            let list = server.get_json("/batches?limit=20")?;
            let rows = list["data"].as_array().cloned().unwrap_or_default();
            if rows.is_empty() {
                eprintln!("no batches");
            }
            for b in rows {
                let c = &b["request_counts"];
                println!(
                    "{}  {:<11} {:>6}/{:<6} failed {:<5} {}",
                    b["id"].as_str().unwrap_or("?"),
                    b["status"].as_str().unwrap_or("?"),
                    c["completed"].as_u64().unwrap_or(0) + c["failed"].as_u64().unwrap_or(0),
                    c["total"].as_u64().unwrap_or(0),
                    c["failed"].as_u64().unwrap_or(0),
                    b["endpoint"].as_str().unwrap_or("")
                );
            }
            Ok(())
        }
        BatchCommand::Status { id: Some(id), json } => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&server.get_json(&format!("/batches/{id}"))?)?
                );
                return Ok(());
            }
            follow(&server, &id)
        }
        BatchCommand::Results { id, output, errors } => {
            let b = server.get_json(&format!("/batches/{id}"))?;
            let status = b["status"].as_str().unwrap_or("?");
            if !FINAL.contains(&status) {
                bail!(
                    "batch {id} is {status}: its results are written when it ends (`anelm batch status {id}` follows it)"
                );
            }
            let write = |file_id: &Value, to: &str| -> Result<usize> {
                let Some(fid) = file_id.as_str() else {
                    return Ok(0);
                };
                let r = server.send("GET", &format!("/files/{fid}/content"), None, &[])?;
                if r.status != 200 {
                    r.json()?;
                }
                let lines = r.body.iter().filter(|&&c| c == b'\n').count();
                if to == "-" {
                    use std::io::Write;
                    std::io::stdout().write_all(&r.body)?;
                } else {
                    std::fs::write(to, &r.body).with_context(|| format!("could not write {to}"))?;
                }
                Ok(lines)
            };
            let n = write(&b["output_file_id"], &output)?;
            let e = match &errors {
                Some(p) => write(&b["error_file_id"], &p.to_string_lossy())?,
                None => 0,
            };
            eprintln!(
                "batch {id} ({status}): {n} result lines{}",
                if errors.is_some() {
                    format!(", {e} error lines")
                } else {
                    String::new()
                }
            );
            if errors.is_none() && b["error_file_id"].is_string() {
                eprintln!("some lines failed: pass --errors FILE to write them");
            }
            Ok(())
        }
        BatchCommand::Cancel { id } => {
            let b = server.post_json(&format!("/batches/{id}/cancel"), &json!({}))?;
            eprintln!("batch {id}: {}", b["status"].as_str().unwrap_or("?"));
            Ok(())
        }
    }
}

/// The `url` of the first request line.
fn first_url(content: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(content).ok()?;
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let v: Value = serde_json::from_str(line).ok()?;
    v.get("url")?.as_str().map(str::to_string)
}

/// Follow a batch with a progress bar (lines done, rate, time left) until it ends.
fn follow(server: &Server, id: &str) -> Result<()> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} lines, {per_sec}, {eta} left")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    loop {
        let b = server.get_json(&format!("/batches/{id}"))?;
        let c = &b["request_counts"];
        let (total, done, failed) = (
            c["total"].as_u64().unwrap_or(0),
            c["completed"].as_u64().unwrap_or(0),
            c["failed"].as_u64().unwrap_or(0),
        );
        let status = b["status"].as_str().unwrap_or("?").to_string();
        bar.set_length(total);
        bar.set_position(done + failed);
        bar.set_message(format!("{id} {status}, {failed} failed"));
        if FINAL.contains(&status.as_str()) {
            bar.finish();
            eprintln!(
                "batch {id} {status}: {done} completed, {failed} failed of {total}; `anelm batch results {id} -o out.jsonl` writes them"
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
