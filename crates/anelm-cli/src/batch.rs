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
    /// Start a server for one job: serve MODEL, run FILE as a batch, write its results, stop.
    /// If this command is stopped, the batch stays in the data directory and resumes the next
    /// time a server opens it (`anelm serve --data-dir DIR`; `anelm batch results ID` then).
    Run {
        /// One request per line: {"custom_id", "method": "POST", "url", "body"}.
        file: PathBuf,
        /// The model to serve (as `anelm serve --model`).
        #[arg(long, short = 'm')]
        model: PathBuf,
        /// Where the output lines go.
        #[arg(short, long)]
        output: PathBuf,
        /// Where the error lines go (default: OUTPUT with `.errors` before its extension).
        #[arg(long)]
        errors: Option<PathBuf>,
        /// The endpoint (default: the `url` of the file's first line).
        #[arg(long)]
        endpoint: Option<String>,
        /// The server's data directory (default: `anelm serve`'s).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Concurrent sessions of the server.
        #[arg(long, default_value_t = 4)]
        sessions: usize,
        /// Further `anelm serve` flags, after `--`.
        #[arg(last = true)]
        serve_args: Vec<String>,
    },
}

const FINAL: &[&str] = &["completed", "failed", "expired", "cancelled"];

/// Run `anelm batch`.
pub fn run(a: BatchArgs) -> Result<()> {
    if let BatchCommand::Run {
        file,
        model,
        output,
        errors,
        endpoint,
        data_dir,
        sessions,
        serve_args,
    } = a.command
    {
        return run_with_server(RunJob {
            file,
            model,
            output,
            errors,
            endpoint,
            data_dir,
            sessions,
            serve_args,
        });
    }
    let server = Server::parse(&a.url, a.api_key.clone())?;
    match a.command {
        BatchCommand::Run { .. } => unreachable!("handled above"),
        BatchCommand::Submit {
            file,
            endpoint,
            completion_window,
            metadata,
            wait,
        } => {
            let mut meta = Map::new();
            for kv in &metadata {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--metadata {kv}: expected KEY=VALUE"))?;
                meta.insert(k.to_string(), json!(v));
            }
            let (id, endpoint, batch) = start(&server, &file, endpoint, &completion_window, meta)?;
            let id = id.as_str();
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
                let body = file_content(&server, fid)?;
                let lines = body.iter().filter(|&&c| c == b'\n').count();
                if to == "-" {
                    use std::io::Write;
                    std::io::stdout().write_all(&body)?;
                } else {
                    std::fs::write(to, &body).with_context(|| format!("could not write {to}"))?;
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

/// `anelm batch run`'s arguments.
struct RunJob {
    file: PathBuf,
    model: PathBuf,
    output: PathBuf,
    errors: Option<PathBuf>,
    endpoint: Option<String>,
    data_dir: Option<PathBuf>,
    sessions: usize,
    serve_args: Vec<String>,
}

/// Stops the job's server when the command ends (SIGTERM: its lines in flight finish or stay
/// pending for the next start).
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: kill(2) on the pid of our own child, not yet reaped.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        #[cfg(not(unix))]
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_with_server(job: RunJob) -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .context("no free port for the job's server")?;
    let exe = std::env::current_exe().context("cannot find the anelm executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "serve",
        "--port",
        &port.to_string(),
        "--sessions",
        &job.sessions.to_string(),
    ])
    .arg("--model")
    .arg(&job.model);
    if let Some(d) = &job.data_dir {
        cmd.arg("--data-dir").arg(d);
    }
    cmd.args(&job.serve_args).stdout(std::process::Stdio::null());
    let mut child = Child(cmd.spawn().context("could not start `anelm serve` for the job")?);
    let server = Server::parse(&format!("http://127.0.0.1:{port}/v1"), None)?;
    let root = Server {
        base: String::new(),
        ..server.clone()
    };
    let t = std::time::Instant::now();
    loop {
        if let Some(status) = child.0.try_wait()? {
            bail!("the job's server exited ({status}) before it was ready: see its messages above");
        }
        if root.send("GET", "/health", None, &[]).is_ok_and(|r| r.status == 200) {
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("the job's server was not ready after 600 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (id, endpoint, batch) = start(&server, &job.file, job.endpoint, "168h", Map::new())?;
    eprintln!(
        "batch {id}: {} requests to {endpoint}",
        batch["request_counts"]["total"]
    );
    follow(&server, &id)?;
    let b = server.get_json(&format!("/batches/{id}"))?;
    let errors = job.errors.unwrap_or_else(|| job.output.with_extension("errors.jsonl"));
    for (key, path) in [("output_file_id", &job.output), ("error_file_id", &errors)] {
        let Some(fid) = b[key].as_str() else { continue };
        let body = file_content(&server, fid)?;
        std::fs::write(path, &body).with_context(|| format!("could not write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    drop(child);
    Ok(())
}

/// Upload `file` and start a batch over it: the batch id, its endpoint (`endpoint`, else the
/// `url` of the file's first line) and the batch object.
fn start(
    server: &Server,
    file: &std::path::Path,
    endpoint: Option<String>,
    window: &str,
    metadata: Map<String, Value>,
) -> Result<(String, String, Value)> {
    let content = std::fs::read(file).with_context(|| format!("could not read {}", file.display()))?;
    let endpoint = match endpoint {
        Some(e) => e,
        None => first_url(&content).with_context(|| {
            format!(
                "{}: no `url` on its first line; pass --endpoint /v1/chat/completions (or /v1/completions, /v1/embeddings, /v1/responses)",
                file.display()
            )
        })?,
    };
    let name = file
        .file_name()
        .map_or("batch.jsonl".into(), |n| n.to_string_lossy().into_owned());
    let uploaded = server.upload("/files", &[("purpose", "batch")], &name, &content)?;
    let file_id = uploaded["id"].as_str().context("the upload answered without an id")?;
    let mut req = json!({"input_file_id": file_id, "endpoint": endpoint, "completion_window": window});
    if !metadata.is_empty() {
        req["metadata"] = Value::Object(metadata);
    }
    let batch = server.post_json("/batches", &req)?;
    let id = batch["id"]
        .as_str()
        .context("the server answered without a batch id")?
        .to_string();
    Ok((id, endpoint, batch))
}

/// A stored file's bytes (an error quoting the server's message otherwise).
fn file_content(server: &Server, id: &str) -> Result<Vec<u8>> {
    let r = server.send("GET", &format!("/files/{id}/content"), None, &[])?;
    if r.status != 200 {
        r.json()?;
    }
    Ok(r.body)
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
