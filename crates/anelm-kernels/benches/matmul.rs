//! `cargo bench -p anelm-kernels`: matmul throughput per weight format and shape, as weight
//! GB/s and GFLOP/s, next to this machine's measured memory bandwidth (a streaming read of a
//! buffer much larger than the caches), for one lane (decode) and 32 lanes (prefill / batched
//! streams), on the best instruction set and on the scalar reference.
//!
//! A second table sweeps a whole decode step's matrices (SmolLM2-135M's shapes: 30 layers of Q4_1
//! plus a Q8_0 LM head, ~96 MB, more than the caches hold) the way a forward pass streams them, so
//! the figure includes cold-cache effects that one hot matrix hides.
//!
//! Options (after `--`): `--quick` (fewer formats/shapes), `--threads N` (default: all cores),
//! `--formats Q4_K,Q6_K` (only these formats in the per-shape table), `--shape 248320x1024`
//! (this one shape instead of the built-in three: one larger than the last-level cache shows the
//! kernel at the weight stream's rate, as a decode step meets it),
//! `--sweep-layers N` (the sweep's layer count, default SmolLM2's 30; 300 makes a step stream
//! ~800 MB, more than any last-level cache), `--bandwidth-only` (print the streaming-read GB/s alone and stop),
//! `--cpu-time` (with `--threads 1`: time by the thread's CPU clock instead of the wall clock, so
//! other processes on a shared machine do not show up in the figures; memory stalls still do).
//! A plain harness (no criterion): each figure is the median of repeated timed runs after a warm-up.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use anelm_kernels::{Activations, Isa, PackedMatrix, WeightFormat, matmul_with, quantize_row};
use common::thread_cpu_time;

static CPU_TIME: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn median_time(mut f: impl FnMut(), min_total: Duration) -> Duration {
    f(); // warm-up
    let cpu = CPU_TIME.load(std::sync::atomic::Ordering::Relaxed);
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < min_total && times.len() < 200) {
        let (t, c) = (Instant::now(), thread_cpu_time());
        f();
        times.push(if cpu { thread_cpu_time() - c } else { t.elapsed() });
    }
    times.sort();
    times[times.len() / 2]
}

/// GB/s of a streaming read (sum of u64s) over a 512 MiB buffer, split across the kernel pool
/// the matmuls run on (called from this thread, as a forward pass calls it).
fn memory_bandwidth() -> f64 {
    let words = (512usize << 20) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = 1 << 16;
    let sums: Vec<std::sync::atomic::AtomicU64> = (0..words / chunk).map(|_| Default::default()).collect();
    let t = median_time(
        || {
            anelm_kernels::pool::global().run(sums.len(), &|i| {
                let s = buf[i * chunk..(i + 1) * chunk]
                    .iter()
                    .fold(0u64, |a, &b| a.wrapping_add(b));
                sums[i].store(s, std::sync::atomic::Ordering::Relaxed);
            });
            black_box(&sums);
        },
        Duration::from_secs(2),
    );
    (words * 8) as f64 / t.as_secs_f64() / 1e9
}

fn random(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if args.iter().any(|a| a == "--cpu-time") {
        assert_eq!(threads, 1, "--cpu-time measures one thread: add --threads 1");
        CPU_TIME.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    // The matmuls and the bandwidth read run on the kernel pool, called from this thread (a
    // rayon `install` per call added a wake-up to every figure with more than one thread).
    anelm_kernels::pool::init_global(threads);
    let bw = memory_bandwidth();
    if args.iter().any(|a| a == "--bandwidth-only") {
        // For scripts that compare a decode rate with the bound (bench-vs-llamacpp.sh).
        println!("{bw:.2}");
        return;
    }
    println!(
        "threads: {threads}, best ISA: {}, memory bandwidth (streaming read): {bw:.1} GB/s",
        Isa::best().name()
    );
    for unit in anelm_kernels::ComputeUnit::ALL {
        if let Some(p) = unit.peak_gops() {
            println!("measured peak of {}: {p:.0} GOPS", unit.describe());
        }
    }
    println!();
    println!("| format | rows × cols | lanes | isa | time | weight GB/s | % of bandwidth | GFLOP/s |");
    println!("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |");
    let custom: Option<(usize, usize)> = args
        .iter()
        .position(|a| a == "--shape")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.split_once('x'))
        .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)));
    let shapes: Vec<(usize, usize)> = match custom {
        Some(shape) => vec![shape],
        None if quick => vec![(1536, 576)],
        None => vec![(1536, 576), (576, 1536), (9216, 2560)],
    };
    let formats: Vec<WeightFormat> = match args.iter().position(|a| a == "--formats").and_then(|i| args.get(i + 1)) {
        Some(list) => WeightFormat::ALL
            .into_iter()
            .filter(|f| list.split(',').any(|n| n.eq_ignore_ascii_case(f.name())))
            .collect(),
        None if quick => vec![WeightFormat::Q4_1, WeightFormat::Q8_0],
        None => WeightFormat::ALL.to_vec(),
    };
    let mut seed = 1u64;
    let layers = args
        .iter()
        .position(|a| a == "--sweep-layers")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    decode_sweep(bw, layers, &mut seed);
    for &(rows, cols) in &shapes {
        for &fmt in &formats {
            // K-quants need 256-column rows: a shape they cannot hold is skipped, not an error.
            let Ok(rb) = fmt.row_bytes(cols) else {
                continue;
            };
            let wf = random(rows * cols, &mut seed);
            let mut w = vec![0u8; rb * rows];
            for r in 0..rows {
                quantize_row(fmt, &wf[r * cols..(r + 1) * cols], &mut w[r * rb..(r + 1) * rb]).expect("quantize");
            }
            for lanes in [1usize, 32] {
                let x = random(lanes * cols, &mut seed);
                let mut act = Activations::new();
                act.quantize(fmt, &x, lanes, cols).expect("activations");
                let mut out = vec![0f32; lanes * rows];
                // Every SIMD path this CPU runs (A/B of e.g. avx2 vs avx2+vnni), plus the scalar
                // reference for single-lane shapes.
                let mut isas: Vec<Isa> = [Isa::Avx2Vnni, Isa::Avx2, Isa::Neon]
                    .into_iter()
                    .filter(|i| i.available())
                    .collect();
                if isas.is_empty() || (lanes == 1 && !quick) {
                    isas.push(Isa::Scalar);
                }
                // The interleaved layout too, where this CPU packs the format (`packed` row, on
                // `Isa::best()`); on aarch64 with dotprod also `packed neon`, the `smull`
                // kernels, for an A/B of `sdot`.
                let packed = PackedMatrix::pack(fmt, &w, rows, cols).expect("pack");
                let mut packed_isas = vec![(Isa::best(), "packed")];
                if Isa::best() == Isa::NeonDot {
                    packed_isas.push((Isa::Neon, "packed neon"));
                }
                let runs = isas.iter().map(|&i| (i, false, i.name())).chain(
                    packed
                        .iter()
                        .flat_map(|_| packed_isas.iter().map(|&(i, n)| (i, true, n))),
                );
                for (isa, on_packed, name) in runs.collect::<Vec<_>>() {
                    let t = median_time(
                        || {
                            match &packed {
                                Some(p) if on_packed => p.matmul_with(isa, &act, &mut out),
                                _ => matmul_with(isa, fmt, &w, rows, cols, &act, &mut out),
                            }
                            .expect("matmul");
                            black_box(&out);
                        },
                        Duration::from_millis(400),
                    );
                    let s = t.as_secs_f64();
                    let gbs = w.len() as f64 / s / 1e9;
                    let gflops = 2.0 * (rows * cols * lanes) as f64 / s / 1e9;
                    println!(
                        "| {} | {rows} × {cols} | {lanes} | {} | {:.1} µs | {gbs:.2} | {:.0}% | {gflops:.1} |",
                        fmt.name(),
                        name,
                        s * 1e6,
                        100.0 * gbs / bw
                    );
                }
            }
        }
    }
}

/// One decode step's worth of distinct matrices (SmolLM2-135M-Instruct Q4_1 shapes), swept in
/// forward order with 1 and 4 lanes: weight bytes per step ÷ time, against the streaming-read
/// bandwidth (the single-stream decode bound).
fn decode_sweep(bw: f64, layers: usize, seed: &mut u64) {
    let (h, ffn, kv, vocab) = (576usize, 1536usize, 192usize, 49152usize);
    let mut mats: Vec<(WeightFormat, usize, usize, Vec<u8>)> = Vec::new();
    let make = |fmt: WeightFormat, rows: usize, cols: usize, seed: &mut u64| {
        let rb = fmt.row_bytes(cols).expect("shape fits the format's blocks");
        let row = random(cols, seed);
        let mut one = vec![0u8; rb];
        quantize_row(fmt, &row, &mut one).expect("quantize");
        // Distinct bytes per matrix are not needed for timing, distinct memory is.
        let w: Vec<u8> = one.iter().copied().cycle().take(rb * rows).collect();
        (fmt, rows, cols, w)
    };
    for _ in 0..layers {
        for (rows, cols) in [(h + 2 * kv, h), (h, h), (ffn, h), (ffn, h), (h, ffn)] {
            mats.push(make(WeightFormat::Q4_1, rows, cols, seed));
        }
    }
    mats.push(make(WeightFormat::Q8_0, vocab, h, seed));
    let bytes: usize = mats.iter().map(|m| m.3.len()).sum();
    println!(
        "decode sweep: SmolLM2-135M shapes ({layers} layers), {} matrices, {:.1} MB per step\n",
        mats.len(),
        bytes as f64 / 1e6
    );
    println!("| lanes | isa | time per step | weight GB/s | % of bandwidth |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    for lanes in [1usize, 4] {
        let mut acts: Vec<(WeightFormat, usize, Activations)> = Vec::new();
        for (fmt, cols) in [
            (WeightFormat::Q4_1, h),
            (WeightFormat::Q4_1, ffn),
            (WeightFormat::Q8_0, h),
        ] {
            let mut a = Activations::new();
            a.quantize(fmt, &random(lanes * cols, seed), lanes, cols)
                .expect("activations");
            acts.push((fmt, cols, a));
        }
        let mut out = vec![0f32; lanes * vocab];
        for isa in [Isa::Avx2Vnni, Isa::Avx2, Isa::Neon, Isa::Scalar]
            .into_iter()
            .filter(|i| i.available())
        {
            let t = median_time(
                || {
                    for (fmt, rows, cols, w) in &mats {
                        let act = &acts.iter().find(|a| a.0 == *fmt && a.1 == *cols).expect("activation").2;
                        matmul_with(isa, *fmt, w, *rows, *cols, act, &mut out[..lanes * rows]).expect("matmul");
                    }
                    black_box(&out);
                },
                Duration::from_millis(600),
            );
            let s = t.as_secs_f64();
            let gbs = bytes as f64 / s / 1e9;
            println!(
                "| {lanes} | {} | {:.2} ms | {gbs:.2} | {:.0}% |",
                isa.name(),
                s * 1e3,
                100.0 * gbs / bw
            );
        }
        // The interleaved layout for Q4_1 and Q8_0 (the CPU backend's default where it exists).
        let packed: Vec<Option<PackedMatrix>> = mats
            .iter()
            .map(|(fmt, rows, cols, w)| PackedMatrix::pack(*fmt, w, *rows, *cols).expect("pack"))
            .collect();
        if packed.iter().any(Option::is_some) {
            let t = median_time(
                || {
                    for ((fmt, rows, cols, w), p) in mats.iter().zip(&packed) {
                        let act = &acts.iter().find(|a| a.0 == *fmt && a.1 == *cols).expect("activation").2;
                        let out = &mut out[..lanes * rows];
                        match p {
                            Some(p) => p.matmul(act, out),
                            None => matmul_with(Isa::best(), *fmt, w, *rows, *cols, act, out),
                        }
                        .expect("matmul");
                    }
                    black_box(&out);
                },
                Duration::from_millis(600),
            );
            let s = t.as_secs_f64();
            let gbs = bytes as f64 / s / 1e9;
            println!(
                "| {lanes} | packed (Q4_1, Q8_0) + {} | {:.2} ms | {gbs:.2} | {:.0}% |",
                Isa::best().name(),
                s * 1e3,
                100.0 * gbs / bw
            );
        }
    }
    println!();
}
