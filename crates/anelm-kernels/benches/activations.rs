//! `cargo bench -p anelm-kernels --bench activations`: activation quantisation (the step the
//! caller runs alone before every matmul, while the pool's workers wait), as ns per 32-value
//! block, for SmolLM2's input widths (and Qwen3.5 0.8B's for the K-quants' Q8_K) and 1–8 lanes. Each figure is the median of repeated runs
//! on this thread's CPU clock (Linux/macOS).

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::thread_cpu_time;

use anelm_kernels::{Activations, WeightFormat};

fn median_ns(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<Duration> = (0..501)
        .map(|_| {
            let t = thread_cpu_time();
            for _ in 0..16 {
                f();
            }
            thread_cpu_time() - t
        })
        .collect();
    times.sort();
    times[times.len() / 2].as_nanos() as f64 / 16.0
}

fn main() {
    println!("| weights | cols | lanes | ns per call | ns per block |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut rnd = common::uniform(0x9E37_79B9);
    // SmolLM2's widths for its formats; the Qwen3.5 0.8B widths for the K-quants (Q8_K blocks).
    let cases: [(WeightFormat, &[usize]); 3] = [
        (WeightFormat::Q4_1, &[576, 1536]),
        (WeightFormat::Q8_0, &[576, 1536]),
        (WeightFormat::Q4_K, &[1024, 3584]),
    ];
    for (fmt, widths) in cases {
        for &cols in widths {
            for lanes in [1usize, 4, 8] {
                let x: Vec<f32> = (0..lanes * cols).map(|_| rnd() * 3.0).collect();
                let mut act = Activations::new();
                let ns = median_ns(|| {
                    act.quantize(fmt, black_box(&x), lanes, cols).expect("quantize");
                    black_box(&act);
                });
                let blocks = (lanes * cols / 32) as f64;
                println!("| {fmt:?} | {cols} | {lanes} | {ns:.0} | {:.1} |", ns / blocks);
            }
        }
    }
}
