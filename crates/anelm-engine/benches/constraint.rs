//! What a JSON-schema constraint costs per generated token, in this thread's CPU time (other
//! processes on a shared machine do not count in it): `Stream::advance` on the default model's
//! vocabulary with and without the constraint, over the same synthetic logits, the constrained
//! stream's output kept valid by its own mask. The difference is the mask, its application and
//! the grammar's advance; divide by a decode step's time to get the share of tg it costs.
//!
//!   cargo bench -p anelm-engine --bench constraint [-- SCHEMA.json]
//!
//! Default schema: docs/bench/notes-array.schema.json (an array of short strings that does not
//! complete within the run). Needs the default model (scripts/fetch-default-model.sh).

use std::time::Duration;

use anelm_engine::default_model::default_model_location;
use anelm_engine::{Grammar, SamplerParams, Stream, StreamOptions, loader::gguf_tokenizer};

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the OS defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() {
    let path = default_model_location().expect("a home directory");
    if !path.is_file() {
        eprintln!(
            "the default model is missing at {}: run scripts/fetch-default-model.sh",
            path.display()
        );
        std::process::exit(1);
    }
    let schema_path = std::env::args()
        .skip(1)
        .find(|a| a.ends_with(".json"))
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/bench/notes-array.schema.json").into());
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("schema file")).expect("schema JSON");
    let gguf = anelm_model::gguf::GgufFile::open(&path).expect("the default model");
    let tokenizer = gguf_tokenizer(&gguf).expect("tokenizer");
    let factory_t0 = std::time::Instant::now();
    let factory = anelm_engine::ConstraintFactory::new(&tokenizer).expect("constraint factory");
    let factory_time = factory_t0.elapsed();
    let vocab = tokenizer.vocab_size();
    // Synthetic logits: the same pseudo-random rows for both runs.
    let mut seed = 0x2545_f491u32;
    let rows: Vec<Vec<f32>> = (0..64)
        .map(|_| {
            (0..vocab)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    (seed as f32 / u32::MAX as f32) * 8.0
                })
                .collect()
        })
        .collect();
    let tokens = 256;
    // `None`: unconstrained; `Some(every)`: constrained, with the mask at every step or only
    // where the greedy draw from the raw row is refused (random rows: inside a string almost
    // any draw is allowed, at the structure almost none; a model that follows the schema is
    // refused less often).
    let masked_steps = std::cell::Cell::new(0usize);
    let run = |constrained: Option<bool>| -> Duration {
        let opts = StreamOptions {
            sampler: SamplerParams::greedy(),
            ignore_eos: true,
            constraint: constrained.map(|every| {
                let mut c = factory.compile(&Grammar::JsonSchema(schema.clone())).expect("schema");
                if every {
                    c.mask_every_step();
                }
                c
            }),
            ..StreamOptions::greedy(tokens)
        };
        let mut stream = Stream::new(&tokenizer, &opts).expect("stream");
        let mut history = Vec::with_capacity(tokens);
        let mut row = rows[0].clone();
        masked_steps.set(0);
        let mut masked = 0;
        let t0 = thread_cpu_time();
        for i in 0..tokens {
            row.copy_from_slice(&rows[i % rows.len()]);
            let step = stream.advance(&mut row, &history, true).expect("advance");
            masked += usize::from(step.masked);
            if let Some(t) = step.token {
                history.push(t);
            }
            if step.finish.is_some() {
                break;
            }
        }
        let per_token = (thread_cpu_time() - t0) / history.len().max(1) as u32;
        masked_steps.set(masked);
        per_token
    };
    // Warm up every path, then alternate.
    let modes = [None, Some(true), Some(false)];
    let mut times: Vec<Vec<Duration>> = modes.iter().map(|&m| vec![run(m)]).collect();
    for t in &mut times {
        t.clear();
    }
    for _ in 0..5 {
        for (m, t) in modes.iter().zip(&mut times) {
            t.push(run(*m));
        }
    }
    for t in &mut times {
        t.sort();
    }
    let checked_masks = masked_steps.get(); // the last run was the check-first path
    let (p, c, checked) = (times[0][2], times[1][2], times[2][2]);
    let cost = c.saturating_sub(p);
    println!("schema: {schema_path}");
    println!("vocabulary: {vocab} tokens; building the constraint factory took {factory_time:.2?} (once per model)");
    println!(
        "per token (thread CPU time, median of 5 runs of {tokens}): unconstrained {:.1} us, constrained {:.1} us, \
         the constraint {:.1} us",
        p.as_secs_f64() * 1e6,
        c.as_secs_f64() * 1e6,
        cost.as_secs_f64() * 1e6
    );
    println!(
        "checking the greedy draw first: {:.1} us per token, the constraint {:.1} us; {checked_masks} of {tokens} \
         steps needed the full mask (the random rows' draw refused)",
        checked.as_secs_f64() * 1e6,
        (checked.as_secs_f64() - p.as_secs_f64()) * 1e6
    );
    println!(
        "share of tg for a decode step of S ms: {:.1} us / S at c1; at c4 four streams' masks run on the pool's \
         threads, {:.1} us / S on 2 threads",
        cost.as_secs_f64() * 1e6,
        2.0 * cost.as_secs_f64() * 1e6
    );
}
