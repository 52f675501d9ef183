//! A small blocking HTTP/1.1 client for the commands that talk to a running `anelm serve`
//! (`anelm batch`): one request per connection, JSON or multipart bodies, `Content-Length` or
//! chunked answers.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Where the server is and how to authenticate.
#[derive(Clone, Debug)]
pub struct Server {
    /// `host:port`.
    pub addr: String,
    /// Path prefix of the API (e.g. `/v1`).
    pub base: String,
    /// Bearer key, if the server wants one.
    pub api_key: Option<String>,
}

/// A response: status and body.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// The body's bytes.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON, or an error quoting the server's error message for a non-2xx status.
    pub fn json(&self) -> Result<Value> {
        let v: Value = serde_json::from_slice(&self.body).unwrap_or(Value::Null);
        if !(200..300).contains(&self.status) {
            let msg = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&self.body).into_owned());
            bail!("the server answered {}: {msg}", self.status);
        }
        Ok(v)
    }
}

impl Server {
    /// Parse `http://host:port[/base]` (the server's OpenAI base, e.g. `http://127.0.0.1:8080/v1`).
    pub fn parse(url: &str, api_key: Option<String>) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("--url {url}: expected http://HOST:PORT/v1 (TLS is not built in)"))?;
        let (addr, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, "/v1"),
        };
        if addr.is_empty() {
            bail!("--url {url}: no host");
        }
        let addr = if addr.contains(':') {
            addr.to_string()
        } else {
            format!("{addr}:80")
        };
        Ok(Self {
            addr,
            base: if base.is_empty() { "/v1".into() } else { base.into() },
            api_key,
        })
    }

    /// Send one request to `path` under the base.
    pub fn send(&self, method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> Result<Reply> {
        let mut s = TcpStream::connect(&self.addr)
            .with_context(|| format!("could not connect to {} (is `anelm serve` running?)", self.addr))?;
        s.set_read_timeout(Some(Duration::from_secs(600)))?;
        let mut head = format!(
            "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.base,
            self.addr,
            body.len()
        );
        if let Some(ct) = content_type {
            head.push_str(&format!("Content-Type: {ct}\r\n"));
        }
        if let Some(k) = &self.api_key {
            head.push_str(&format!("Authorization: Bearer {k}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        read_reply(BufReader::new(s))
    }

    /// GET `path` as JSON.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        self.send("GET", path, None, &[])?.json()
    }

    /// POST a JSON body to `path`.
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        self.send("POST", path, Some("application/json"), body.to_string().as_bytes())?
            .json()
    }

    /// POST a file as `multipart/form-data` with text `fields`.
    pub fn upload(&self, path: &str, fields: &[(&str, &str)], file_name: &str, content: &[u8]) -> Result<Value> {
        let boundary = format!(
            "anelm-{:x}",
            std::process::id() as u64 * 0x9e37_79b9 + content.len() as u64
        );
        let mut body = Vec::with_capacity(content.len() + 512);
        for (k, v) in fields {
            body.extend_from_slice(
                format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n").as_bytes(),
            );
        }
        let safe_name: String = file_name
            .chars()
            .filter(|c| *c != '"' && *c != '\r' && *c != '\n')
            .collect();
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{safe_name}\"\r\nContent-Type: application/jsonl\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(content);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        self.send(
            "POST",
            path,
            Some(&format!("multipart/form-data; boundary={boundary}")),
            &body,
        )?
        .json()
    }
}

fn read_reply(mut r: impl BufRead) -> Result<Reply> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP reply: {line:?}"))?;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = v.parse().ok();
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .with_context(|| format!("bad chunk size {line:?}"))?;
            if size == 0 {
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            line.clear();
            r.read_line(&mut line)?;
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Reply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_replies() {
        let s = Server::parse("http://127.0.0.1:8080/v1", None).unwrap();
        assert_eq!((s.addr.as_str(), s.base.as_str()), ("127.0.0.1:8080", "/v1"));
        let s = Server::parse("http://localhost:9000", None).unwrap();
        assert_eq!((s.addr.as_str(), s.base.as_str()), ("localhost:9000", "/v1"));
        assert!(Server::parse("https://x/v1", None).is_err());
        let r = read_reply(&b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"[..]).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{}"[..]));
        let r = read_reply(
            &b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"[..],
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"abcde"[..]));
        assert!(r.json().is_err());
    }
}
