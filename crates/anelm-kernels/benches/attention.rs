//! `cargo bench -p anelm-kernels --bench attention`: the attention row loops of one task (a
//! group of query heads sharing a KV head, over an f16 cache plane), as ns per cached row and
//! per (row, head), for the head widths and group sizes of the supported models.
//!
//! `ANELM_ATTN_WIDE=0` runs the 256-bit loops instead of the 512-bit ones (where this CPU has
//! AVX-512), for A/B. Each figure is the median of repeated runs on this thread's CPU clock
//! (Linux/macOS), so other processes on a shared machine count less (memory stalls still count).

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::thread_cpu_time;

use anelm_kernels::{CacheRows, dot_rows_group, f32_to_f16, weighted_rows_group};

fn median_ns(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<Duration> = (0..301)
        .map(|_| {
            let t = thread_cpu_time();
            f();
            thread_cpu_time() - t
        })
        .collect();
    times.sort();
    times[times.len() / 2].as_nanos() as f64
}

fn main() {
    let wide = anelm_kernels::Tuning::get().attention_wide;
    println!(
        "512-bit loops: {}\n",
        if wide {
            "on where available"
        } else {
            "off (ANELM_ATTN_WIDE=0)"
        }
    );
    println!("| head dim | heads | rows | scores ns/row | weighted ns/row | ns per (row, head) |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut rnd = common::uniform(0x9E37_79B9);
    for (d, g) in [
        (64usize, 1usize),
        (64, 2),
        (64, 3),
        (128, 1),
        (128, 2),
        (128, 4),
        (128, 8),
        (256, 4),
    ] {
        for rows in [160usize, 1024] {
            // One KV head's plane (rows × d, contiguous), as the cache stores it.
            let plane: Vec<u16> = (0..rows * d).map(|_| f32_to_f16(rnd())).collect();
            let q: Vec<f32> = (0..g * d).map(|_| rnd()).collect();
            let p: Vec<f32> = (0..g * rows).map(|_| rnd().abs() / rows as f32).collect();
            let mut scores = vec![0f32; g * rows];
            let mut out = vec![0f32; g * d];
            let m = CacheRows::F16(&plane);
            let dot = median_ns(|| {
                dot_rows_group(black_box(&q), d, m, d, 0, 0..rows, &mut scores, rows);
                black_box(&scores);
            });
            let weighted = median_ns(|| {
                out.fill(0.0);
                weighted_rows_group(black_box(&p), rows, m, d, 0, 0..rows, &mut out, d);
                black_box(&out);
            });
            let per_row = (dot + weighted) / rows as f64;
            println!(
                "| {d} | {g} | {rows} | {:.1} | {:.1} | {:.2} |",
                dot / rows as f64,
                weighted / rows as f64,
                per_row / g as f64
            );
        }
    }
}
