//! Helpers of the tests that run `anelm serve` as a process: start it on a free port, talk
//! HTTP/1.1 to it, read its metrics, find the Python with the openai client.
// Each test crate that includes this module uses a subset of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const KEY: &str = "test-key";
pub const BODY_LIMIT: usize = 64 * 1024;

/// A running server, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn start(sessions: usize, queue: usize) -> Server {
    start_with(sessions, queue, &[])
}

pub fn start_with(sessions: usize, queue: usize, extra: &[&str]) -> Server {
    start_env(sessions, queue, extra, &[])
}

/// [`start_with`] with environment variables for the server process.
pub fn start_env(sessions: usize, queue: usize, extra: &[&str], env: &[(&str, &str)]) -> Server {
    start_on(free_port(), sessions, queue, extra, env)
}

/// [`start_env`] on a given port (to restart a server where clients expect it).
pub fn start_on(port: u16, sessions: usize, queue: usize, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let child = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .envs(env.iter().copied())
        .args(["serve", "--port", &port.to_string(), "--api-key", KEY, "-t", "2"])
        .args(["--sessions", &sessions.to_string(), "--queue", &queue.to_string()])
        .args(extra)
        .args(if extra.contains(&"--max-body-bytes") {
            vec![]
        } else {
            vec!["--max-body-bytes".to_string(), BODY_LIMIT.to_string()]
        })
        .args(["--ctx-size", "1024"])
        // A test server keeps nothing in the user's data directory unless it is given one.
        .args(if extra.contains(&"--data-dir") {
            vec![]
        } else {
            vec!["--no-data-dir"]
        })
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start anelm serve");
    let server = Server { child, port };
    let t = Instant::now();
    loop {
        if let Ok(r) = http(port, "GET", "/health", b"", None)
            && r.status == 200
        {
            return server;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "server not healthy after 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

pub fn dechunk(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        rest = &rest[eol + 2..];
        if size == 0 || size > rest.len() {
            break;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[(size + 2).min(rest.len())..];
    }
    out
}

/// One HTTP/1.1 request with `Connection: close`, read to the end.
pub fn http(port: u16, method: &str, path: &str, body: &[u8], key: Option<&str>) -> std::io::Result<Reply> {
    http_with(port, method, path, body, key, &[])
}

/// [`http`] with extra request headers.
pub fn http_with(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    key: Option<&str>,
    extra: &[(&str, &str)],
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut more = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    for (name, value) in extra {
        more.push_str(&format!("{name}: {value}\r\n"));
    }
    if !extra.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-type")) {
        more.push_str("Content-Type: application/json\r\n");
    }
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{more}Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    // The server may answer (413) and close before it has read an oversized body.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header in the reply"))?;
    let headers = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let payload = &raw[split + 4..];
    let body = if headers.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(payload)
    } else {
        payload.to_vec()
    };
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).to_string(),
    })
}

/// Open a streaming request, read until the first generated text arrives, then hang up.
pub fn disconnect_mid_stream(port: u16, body: &str) -> std::io::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains("\"content\":\"") || seen.len() < 300 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    Ok(()) // dropped here: the client is gone
}

pub fn metric(port: u16, name: &str) -> f64 {
    let r = http(port, "GET", "/metrics", b"", Some(KEY)).expect("metrics");
    r.body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("anelm_{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing:\n{}", r.body))
}

/// One `/proc/<pid>/status` memory field in KiB (`VmRSS`, `RssAnon`, `RssFile`), where there is
/// a `/proc`.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("ANELM_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let p = home.join(".cache/anelm/venv-openai/bin/python");
    assert!(
        p.exists(),
        "no Python with the openai client: run scripts/setup-test-env.sh (scripts/test.sh does)"
    );
    p
}

/// Run `tests/<script>` with the openai client's Python against the server on `port`
/// (arguments: its `/v1` base URL, the API key, then `extra`); fails the test with the script's
/// output unless it succeeds.
pub fn run_client_script(script: &str, port: u16, extra: &[&str]) {
    let out = Command::new(python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(script))
        .arg(format!("http://127.0.0.1:{port}/v1"))
        .arg(KEY)
        .args(extra)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Start a long streaming request on the server at `port` and wait until it holds a session and
/// the queue is empty again (its first chunk, the assistant role, goes out while it is still
/// queued). Dropping the returned connection abandons it.
pub fn occupy_the_session(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let body = r#"{"messages":[{"role":"user","content":"Tell a long story"}],"max_tokens":600,"stream":true,"ignore_eos":true}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).expect("the stream starts");
    assert!(n > 0, "stream closed early");
    let t = Instant::now();
    while metric(port, "busy_sessions") < 1.0 || metric(port, "queue_depth") > 0.0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the streaming request never got the session"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

/// Send `body` to `/v1/chat/completions` or `/v1/completions` (by its `messages` or `prompt`) from
/// another thread and wait until it holds a queue place; join the handle for its reply.
pub fn take_the_queue_place(port: u16, body: &[u8]) -> std::thread::JoinHandle<Reply> {
    let before = metric(port, "queue_depth");
    let body = body.to_vec();
    let path = if String::from_utf8_lossy(&body).contains("\"messages\"") {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let waiting = std::thread::spawn(move || http(port, "POST", path, &body, Some(KEY)).expect("queued"));
    let t = Instant::now();
    while metric(port, "queue_depth") < before + 1.0 {
        assert!(t.elapsed() < Duration::from_secs(30), "the request never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    waiting
}

/// A fresh directory under the system's temp dir (a server's `--data-dir`), removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("anelm-{tag}-{}-{n}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }

    /// The path as a command-line argument.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
