//! `anelm bench --shared-prefix TOKENS --concurrency C`: time to first token of C concurrent
//! requests whose prompts share a TOKENS-token prefix (a long system prompt), against two
//! in-process servers on the same model, one sharing prefixes between sessions and one not,
//! alternating per round. Each round uses a fresh prefix, so no idle session's cache from an
//! earlier round can serve it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use anelm_engine::{LoadedModel, SchedulerConfig};

/// One server's figures over the rounds.
pub struct PrefixTtft {
    /// Prefix sharing on.
    pub sharing: bool,
    /// Median over rounds of the median TTFT of the burst, seconds.
    pub ttft_p50: f64,
    /// Median over rounds of the slowest TTFT of the burst, seconds.
    pub ttft_max: f64,
    /// Median over rounds of the time until every request of the burst has its first token.
    pub all_first: f64,
}

/// Start an in-process server on an ephemeral port, sharing prefixes or not; returns host:port.
fn start(lm: Arc<LoadedModel>, sessions: usize, threads: usize, share: bool) -> Result<String> {
    let cfg = SchedulerConfig {
        share_prefixes: share,
        ..crate::bench_serve::bench_scheduler(sessions, threads, 4096)
    };
    crate::bench_serve::start_server_with(lm, cfg)
}

/// A prefix of at least `tokens` tokens, different for every `round`.
fn prefix(lm: &LoadedModel, tokens: usize, round: usize) -> Result<String> {
    let mut text = format!("Session {round}. You are the assistant of a small public library. ");
    let rules = [
        "Answer briefly and cite the shelf. ",
        "Never invent a title or an author. ",
        "Prefer paper books to e-books when both exist. ",
        "Opening hours are nine to six on weekdays. ",
        "Children's books are on the ground floor. ",
    ];
    let mut i = 0;
    while lm.tokenizer.encode(&text)?.len() < tokens {
        text.push_str(rules[i % rules.len()]);
        i += 1;
    }
    Ok(text)
}

/// Time to first token of one streamed completion.
fn first_token(addr: &str, prompt: &str) -> Result<Duration> {
    let body =
        json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": true, "ignore_eos": true}).to_string();
    let t0 = Instant::now();
    let mut first = None;
    crate::bench_serve::post_stream(addr, &body, |v| {
        if first.is_none() && v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
            first = Some(t0.elapsed());
        }
    })?;
    first.context("the stream had no text")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Run the comparison (see the module docs).
pub fn run(
    lm: Arc<LoadedModel>,
    tokens: usize,
    concurrency: usize,
    rounds: usize,
    threads: usize,
) -> Result<Vec<PrefixTtft>> {
    let servers = [
        (true, start(lm.clone(), concurrency, threads, true)?),
        (false, start(lm.clone(), concurrency, threads, false)?),
    ];
    // Warm-up on both.
    for (_, addr) in &servers {
        first_token(addr, "Hello")?;
    }
    let mut figures: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(), Default::default()];
    for round in 0..rounds {
        for (k, (sharing, addr)) in servers.iter().enumerate() {
            let p = prefix(&lm, tokens, round * 2 + k)?;
            eprintln!(
                "round {}/{rounds}, prefix sharing {}: {concurrency} requests sharing {tokens} tokens",
                round + 1,
                if *sharing { "on" } else { "off" }
            );
            let t0 = Instant::now();
            let handles: Vec<_> = (0..concurrency)
                .map(|i| {
                    let (addr, prompt) = (
                        addr.clone(),
                        format!("{p}\nQuestion {i}: where are the atlases?\nAnswer:"),
                    );
                    std::thread::spawn(move || first_token(&addr, &prompt))
                })
                .collect();
            let mut ttfts = Vec::with_capacity(concurrency);
            for h in handles {
                ttfts.push(
                    h.join()
                        .map_err(|_| anyhow::anyhow!("a client thread panicked"))??
                        .as_secs_f64(),
                );
            }
            let all = t0.elapsed().as_secs_f64();
            let max = ttfts.iter().copied().fold(0.0, f64::max);
            figures[k].0.push(median(&mut ttfts));
            figures[k].1.push(max);
            figures[k].2.push(all);
        }
    }
    Ok(servers
        .iter()
        .zip(figures.iter_mut())
        .map(|((sharing, _), (p50, max, all))| PrefixTtft {
            sharing: *sharing,
            ttft_p50: median(p50),
            ttft_max: median(max),
            all_first: median(all),
        })
        .collect())
}

/// The markdown table.
pub fn markdown(rows: &[PrefixTtft]) -> String {
    let mut s =
        String::from("| prefix sharing | TTFT p50 | TTFT max | all first tokens |\n| :---: | ---: | ---: | ---: |\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.0} ms | {:.0} ms | {:.0} ms |\n",
            if r.sharing { "on" } else { "off" },
            r.ttft_p50 * 1e3,
            r.ttft_max * 1e3,
            r.all_first * 1e3
        ));
    }
    s
}
