//! `anelm bench --concurrency 1,2,4,8`: N streaming requests of M tokens at each concurrency
//! level against a server (one it starts in-process, or `--url`), reporting aggregate and
//! per-stream generation tok/s, time to first token and p50/p95 latency, as markdown, JSON and
//! an SVG chart.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use anelm_engine::{LoadedModel, SchedulerConfig};
use anelm_server::{AppState, ServerConfig, router};

/// What one concurrency level measured.
pub struct Level {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// The requests carried the JSON-schema constraint.
    pub constrained: bool,
    /// Requests run.
    pub requests: usize,
    /// Generated tokens over all requests / wall time of the level.
    pub aggregate_tok_s: f64,
    /// Mean over requests of (tokens − 1) / (last token − first token).
    pub per_stream_tok_s: f64,
    /// Median time to first token, seconds.
    pub ttft_p50: f64,
    /// Median request latency, seconds.
    pub latency_p50: f64,
    /// 95th-percentile request latency, seconds.
    pub latency_p95: f64,
    /// Rounds measured (each figure above is the median over them).
    pub rounds: usize,
    /// Lowest and highest aggregate tok/s of the rounds.
    pub aggregate_range: (f64, f64),
    /// Median over rounds of this level's aggregate ÷ the first level's in the same round
    /// (paired, so a slow drift of the machine cancels out of the ratio).
    pub vs_first: f64,
    /// Constrained levels: median over rounds of aggregate ÷ the same concurrency's
    /// unconstrained aggregate in the same round.
    pub vs_unconstrained: Option<f64>,
    /// With speculative decoding: the server's draft counters over the level's runs.
    pub speculation: Option<Speculation>,
}

/// What the server's `/metrics` counted of speculative decoding over a level's runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Speculation {
    /// Decode passes of streams.
    pub passes: f64,
    /// Tokens drafted.
    pub drafted: f64,
    /// Drafted tokens the streams kept.
    pub accepted: f64,
}

impl Speculation {
    /// Accepted ÷ drafted.
    pub fn acceptance(&self) -> f64 {
        self.accepted / self.drafted.max(1.0)
    }

    /// Tokens each decode pass produced: the pass's own token plus its accepted drafts.
    pub fn tokens_per_pass(&self) -> f64 {
        (self.passes + self.accepted) / self.passes.max(1.0)
    }

    fn since(&self, before: &Speculation) -> Speculation {
        Speculation {
            passes: self.passes - before.passes,
            drafted: self.drafted - before.drafted,
            accepted: self.accepted - before.accepted,
        }
    }

    fn add(&mut self, o: &Speculation) {
        self.passes += o.passes;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
    }
}

/// The server's speculation counters from `GET /metrics` at `addr`.
fn scrape_speculation(addr: &str) -> Result<Speculation> {
    let server = crate::http_client::Server {
        addr: addr.to_string(),
        base: String::new(),
        api_key: None,
    };
    let reply = server.send("GET", "/metrics", None, &[])?;
    if reply.status != 200 {
        bail!("GET /metrics at {addr} answered {}", reply.status);
    }
    let text = String::from_utf8_lossy(&reply.body);
    let value = |name: &str| -> Result<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .with_context(|| format!("the server's /metrics has no {name} (is it anelm 0.1 with speculation?)"))
    };
    Ok(Speculation {
        passes: value("anelm_decode_passes_total")?,
        drafted: value("anelm_draft_tokens_total")?,
        accepted: value("anelm_draft_accepted_total")?,
    })
}

struct One {
    tokens: usize,
    ttft: f64,
    gen_time: f64,
    latency: f64,
}

/// The scheduler settings of the benchmark's in-process servers.
pub fn bench_scheduler(sessions: usize, threads: usize, ctx_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        sessions,
        queue: 1024,
        ctx_size,
        prefill_chunk: anelm_engine::DEFAULT_PREFILL_CHUNK,
        max_step_tokens: anelm_engine::DEFAULT_PREFILL_CHUNK + sessions,
        threads,
        share_prefixes: true,
        cache_mem: None,
        prompt_cache: None,
        speculate: None,
        draft_model: None,
    }
}

/// Start the server in-process on an ephemeral port with `cfg` ([`bench_scheduler`]); returns
/// host:port.
pub fn start_server_with(lm: Arc<LoadedModel>, cfg: SchedulerConfig) -> Result<String> {
    let state = AppState::new(ServerConfig {
        model_id: "bench".into(),
        api_key: None,
        max_body_bytes: 4 << 20,
    });
    state.set_ready(lm, cfg)?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("anelm-bench-server".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            rt.block_on(async move {
                match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                    Ok(l) => {
                        let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                        let _ = tx.send(Ok(addr));
                        let _ = axum::serve(l, router(state)).await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
        })
        .context("could not start the bench server thread")?;
    rx.recv_timeout(Duration::from_secs(30))
        .context("the bench server did not start")?
        .map_err(|e| anyhow::anyhow!("the bench server could not listen: {e}"))
}

/// What every request of a serving benchmark asks for.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    /// Tokens generated per request.
    pub tokens: usize,
    /// The `model` requests name (e.g. an upstream behind anelm); none: the server's own.
    pub model: Option<String>,
    /// The `speculate` field every request carries (`"lookup"`, `"draft"`, `"off"`); none: the server's
    /// default.
    pub speculate: Option<String>,
}

/// One streaming completion, constrained by `schema` when given (which then decides where the
/// output may end, so `ignore_eos` is left off); returns its timings.
fn one_request(addr: &str, w: &Workload, salt: usize, schema: Option<&Value>) -> Result<One> {
    let tokens = w.tokens;
    let mut body = json!({
        "prompt": format!("Request {salt}. Write a long story about a lighthouse keeper and the sea."),
        "max_tokens": tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(m) = &w.model {
        body["model"] = json!(m);
    }
    if let Some(sp) = &w.speculate {
        body["speculate"] = json!(sp);
    }
    match schema {
        Some(s) => body["grammar"] = json!({"json_schema": s}),
        None => body["ignore_eos"] = json!(true),
    }
    let body = body.to_string();
    let t0 = Instant::now();
    let mut first = None;
    let mut n = 0usize;
    post_stream(addr, &body, |v| {
        if let Some(u) = v
            .get("usage")
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64)
        {
            n = u as usize;
        } else if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
            first.get_or_insert_with(|| t0.elapsed());
        }
    })?;
    let latency = t0.elapsed().as_secs_f64();
    let ttft = first.map_or(latency, |d| d.as_secs_f64());
    Ok(One {
        tokens: n,
        ttft,
        gen_time: latency - ttft,
        latency,
    })
}

/// POST `body` to `/v1/completions` at `addr` as a stream and hand each server-sent JSON chunk to
/// `on_chunk` until `[DONE]`; an answer other than 200 is an error.
pub fn post_stream(addr: &str, body: &str, mut on_chunk: impl FnMut(&Value)) -> Result<()> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connect to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut status_ok = false;
    for line in BufReader::new(s).lines() {
        let line = line?;
        if line.starts_with("HTTP/1.1 ") {
            status_ok = line.contains(" 200 ");
            if !status_ok {
                bail!("the server answered: {line}");
            }
        }
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        on_chunk(&serde_json::from_str(data).unwrap_or(Value::Null));
    }
    if !status_ok {
        bail!("no HTTP reply from {addr}");
    }
    Ok(())
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

/// Run every level `rounds` times, level after level in each round (c1, c4, c1, c4, …), and
/// report per level the median of each figure over the rounds. With `schema`, each level runs
/// twice per round, without and then with the JSON-schema constraint, so the constraint's cost
/// is a paired ratio.
pub fn run_levels(
    addr: &str,
    levels: &[usize],
    requests: usize,
    w: &Workload,
    rounds: usize,
    schema: Option<&Value>,
) -> Result<Vec<Level>> {
    let tokens = w.tokens;
    // Warm-up: one request (and one constrained) so no level pays for first-touch costs.
    let warm = Workload { tokens: 4, ..w.clone() };
    one_request(addr, &warm, 0, None)?;
    if schema.is_some() {
        one_request(addr, &warm, 0, schema)?;
    }
    let rounds = rounds.max(1);
    let variants: Vec<Option<&Value>> = if schema.is_some() {
        vec![None, schema]
    } else {
        vec![None]
    };
    let cells: Vec<(usize, Option<&Value>)> = levels
        .iter()
        .flat_map(|&c| variants.iter().map(move |&v| (c, v)))
        .collect();
    let mut runs: Vec<Vec<Level>> = (0..cells.len()).map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, &(c, v)) in cells.iter().enumerate() {
            eprintln!(
                "round {}/{rounds}, concurrency {c}{}: {requests} requests of {tokens} tokens",
                round + 1,
                if v.is_some() { ", JSON schema" } else { "" }
            );
            let before = w.speculate.is_some().then(|| scrape_speculation(addr)).transpose()?;
            let mut level = measure_level(addr, c, requests, w, v)?;
            if let Some(before) = before {
                level.speculation = Some(scrape_speculation(addr)?.since(&before));
            }
            runs[i].push(level);
        }
    }
    let first: Vec<f64> = runs
        .first()
        .map_or_else(Vec::new, |r| r.iter().map(|l| l.aggregate_tok_s).collect());
    Ok(runs
        .iter()
        .zip(&cells)
        .enumerate()
        .map(|(i, (r, &(c, v)))| {
            let med = |f: &dyn Fn(&Level) -> f64| percentile(&mut r.iter().map(f).collect::<Vec<_>>(), 0.5);
            let agg: Vec<f64> = r.iter().map(|l| l.aggregate_tok_s).collect();
            let mut ratios: Vec<f64> = agg.iter().zip(&first).map(|(a, f)| a / f.max(1e-9)).collect();
            // The unconstrained run of the same level sits just before a constrained one.
            let vs_unconstrained = (v.is_some() && i > 0).then(|| {
                let mut paired: Vec<f64> = agg
                    .iter()
                    .zip(&runs[i - 1])
                    .map(|(a, u)| a / u.aggregate_tok_s.max(1e-9))
                    .collect();
                percentile(&mut paired, 0.5)
            });
            let speculation = w.speculate.as_ref().map(|_| {
                let mut sum = Speculation::default();
                r.iter()
                    .filter_map(|l| l.speculation.as_ref())
                    .for_each(|sp| sum.add(sp));
                sum
            });
            Level {
                concurrency: c,
                constrained: v.is_some(),
                vs_unconstrained,
                speculation,
                requests: r.first().map_or(0, |l| l.requests),
                aggregate_tok_s: med(&|l| l.aggregate_tok_s),
                per_stream_tok_s: med(&|l| l.per_stream_tok_s),
                ttft_p50: med(&|l| l.ttft_p50),
                latency_p50: med(&|l| l.latency_p50),
                latency_p95: med(&|l| l.latency_p95),
                rounds,
                aggregate_range: (
                    agg.iter().copied().fold(f64::INFINITY, f64::min),
                    agg.iter().copied().fold(0.0, f64::max),
                ),
                vs_first: percentile(&mut ratios, 0.5),
            }
        })
        .collect())
}

/// One level once: `requests` requests of `tokens` tokens, `c` in flight at a time.
fn measure_level(addr: &str, c: usize, requests: usize, w: &Workload, schema: Option<&Value>) -> Result<Level> {
    let schema = schema.cloned();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..c)
        .map(|_| {
            let (next, addr, schema, w) = (next.clone(), addr.to_string(), schema.clone(), w.clone());
            std::thread::spawn(move || -> Result<Vec<One>> {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= requests {
                        return Ok(mine);
                    }
                    mine.push(one_request(&addr, &w, i + 1, schema.as_ref())?);
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))??);
    }
    let wall = t0.elapsed().as_secs_f64();
    let total: usize = all.iter().map(|o| o.tokens).sum();
    let per_stream = all
        .iter()
        .map(|o| o.tokens.saturating_sub(1) as f64 / o.gen_time.max(1e-9))
        .sum::<f64>()
        / all.len().max(1) as f64;
    let mut ttft: Vec<f64> = all.iter().map(|o| o.ttft).collect();
    let mut lat: Vec<f64> = all.iter().map(|o| o.latency).collect();
    let aggregate = total as f64 / wall;
    Ok(Level {
        concurrency: c,
        constrained: schema.is_some(),
        vs_unconstrained: None,
        speculation: None,
        requests: all.len(),
        aggregate_tok_s: aggregate,
        per_stream_tok_s: per_stream,
        ttft_p50: percentile(&mut ttft, 0.5),
        latency_p50: percentile(&mut lat, 0.5),
        latency_p95: percentile(&mut lat, 0.95),
        rounds: 1,
        aggregate_range: (aggregate, aggregate),
        vs_first: 1.0,
    })
}

/// The markdown table (with several rounds, the aggregate's range beside its median).
pub fn markdown(levels: &[Level]) -> String {
    let rounds = levels.first().map_or(1, |l| l.rounds);
    let mut s = String::new();
    if rounds > 1 {
        s.push_str(&format!(
            "medians of {rounds} rounds (levels alternating within each round); × c1 is the median of the per-round ratios\n\n"
        ));
    }
    let constrained = levels.iter().any(|l| l.constrained);
    // With speculation, one more column pair: the drafts' acceptance and the tokens per pass.
    let (spec_head, spec_rule) = if levels.iter().any(|l| l.speculation.is_some()) {
        (" acceptance | tokens/pass |", " ---: | ---: |")
    } else {
        ("", "")
    };
    if constrained {
        s.push_str(&format!(
            "| concurrency | JSON schema | requests | aggregate tok/s | × unconstrained | × c1 | per-stream tok/s | TTFT p50 | latency p50 | latency p95 |{spec_head}\n\
             | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |{spec_rule}\n",
        ));
    } else {
        s.push_str(&format!(
            "| concurrency | requests | aggregate tok/s | × c1 | per-stream tok/s | TTFT p50 | latency p50 | latency p95 |{spec_head}\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |{spec_rule}\n",
        ));
    }
    for l in levels {
        let aggregate = if rounds > 1 {
            format!(
                "{:.1} ({:.0}–{:.0})",
                l.aggregate_tok_s, l.aggregate_range.0, l.aggregate_range.1
            )
        } else {
            format!("{:.1}", l.aggregate_tok_s)
        };
        let (schema, ratio) = if constrained {
            (
                format!(" {} |", if l.constrained { "yes" } else { "no" }),
                format!(
                    " {} |",
                    l.vs_unconstrained.map_or("–".to_string(), |r| format!("{r:.3}"))
                ),
            )
        } else {
            (String::new(), String::new())
        };
        let spec = l.speculation.map_or(String::new(), |sp| {
            format!(" {:.0} % | {:.2} |", sp.acceptance() * 100.0, sp.tokens_per_pass())
        });
        s.push_str(&format!(
            "| {} |{schema} {} | {aggregate} |{ratio} {:.2} | {:.1} | {:.0} ms | {:.2} s | {:.2} s |{spec}\n",
            l.concurrency,
            l.requests,
            l.vs_first,
            l.per_stream_tok_s,
            l.ttft_p50 * 1e3,
            l.latency_p50,
            l.latency_p95
        ));
    }
    s
}

/// JSON of every level.
pub fn to_json(levels: &[Level], meta: Value) -> Value {
    let rows: Vec<Value> = levels
        .iter()
        .map(|l| {
            json!({"concurrency": l.concurrency, "json_schema": l.constrained,
            "vs_unconstrained": l.vs_unconstrained, "requests": l.requests, "aggregate_tok_s": l.aggregate_tok_s,
            "per_stream_tok_s": l.per_stream_tok_s, "ttft_p50_s": l.ttft_p50,
            "latency_p50_s": l.latency_p50, "latency_p95_s": l.latency_p95,
            "rounds": l.rounds, "aggregate_min_tok_s": l.aggregate_range.0,
            "aggregate_max_tok_s": l.aggregate_range.1, "vs_first_level": l.vs_first,
            "speculation": l.speculation.map(|sp| json!({
                "decode_passes": sp.passes, "draft_tokens": sp.drafted, "draft_accepted": sp.accepted,
                "acceptance": sp.acceptance(), "tokens_per_pass": sp.tokens_per_pass(),
            }))})
        })
        .collect();
    json!({"meta": meta, "levels": rows})
}

/// A bar chart (aggregate tok/s) with the per-stream rate as a line, as standalone SVG.
pub fn svg(levels: &[Level], title: &str) -> String {
    let (w, h, pad) = (640.0, 360.0, 50.0);
    let max = levels.iter().map(|l| l.aggregate_tok_s).fold(1.0, f64::max) * 1.1;
    let n = levels.len().max(1) as f64;
    let bw = (w - 2.0 * pad) / n;
    let y = |v: f64| h - pad - v / max * (h - 2.0 * pad);
    let esc = |t: &str| t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{pad}\" y=\"24\" font-size=\"14\">{}</text>\n\
         <line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        esc(title),
        h - pad,
        w - pad,
        h - pad
    );
    let mut line = String::new();
    for (i, l) in levels.iter().enumerate() {
        let x = pad + i as f64 * bw;
        let top = y(l.aggregate_tok_s);
        s.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#4a7ab0\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0}</text>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">c={}</text>\n",
            x + bw * 0.15,
            bw * 0.7,
            h - pad - top,
            x + bw / 2.0,
            top - 4.0,
            l.aggregate_tok_s,
            x + bw / 2.0,
            h - pad + 16.0,
            l.concurrency
        ));
        line.push_str(&format!("{:.1},{:.1} ", x + bw / 2.0, y(l.per_stream_tok_s)));
    }
    s.push_str(&format!(
        "<polyline points=\"{line}\" fill=\"none\" stroke=\"#d0603a\" stroke-width=\"2\"/>\n\
         <text x=\"{pad}\" y=\"{}\" fill=\"#4a7ab0\">bars: aggregate generation tok/s</text>\n\
         <text x=\"{}\" y=\"{}\" fill=\"#d0603a\">line: per-stream tok/s</text>\n</svg>\n",
        h - 12.0,
        w / 2.0,
        h - 12.0
    ));
    s
}
