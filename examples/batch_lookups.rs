//! Batched point lookups on cached data: many tasks, each doing lookups
//! back to back, a lookup being one batch of random 4 KiB reads (as an
//! `AsyncFileReader` whose `get_byte_ranges` is one `read_batch`). Prints
//! lookups/s and the latency of a lookup (p50, p99, p99.9, max) for each
//! engine, round after round, engines alternating, then the medians over
//! the rounds and each engine's ratios to `pool` of the same round.
//!
//! ```sh
//! cargo run --release --example batch_lookups -- [path] [rounds] [secs] [tasks] [reads]
//! ```
//!
//! `path` (default `bench-data/lookups`) is created (256 MiB) if missing and
//! read once to cache it. Engines, on one multi-thread runtime of the
//! default size:
//!
//! - `batch`: `ctx.read_batch(reads)` (io_uring backend, default settings);
//! - `batch+yield`: the same with `tokio::task::yield_now()` after every
//!   lookup (what a client does by hand when batches do not yield);
//! - `pool`: one `spawn_blocking` per lookup doing its `pread`s (the
//!   baseline).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uring_positioned_io::UringContext;

const BLOCK: u64 = 4096;
const FILE_LEN: u64 = 256 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Engine {
    Batch,
    BatchYield,
    Pool,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Batch => "batch",
            Engine::BatchYield => "batch+yield",
            Engine::Pool => "pool",
        }
    }
}

/// One engine's run: lookups/s and latency percentiles in µs.
#[derive(Clone, Copy, Debug)]
struct Run {
    rate: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

/// SplitMix64: the blocks a task reads.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[i])
}

/// One lookup: `reads` random blocks, checked (each block starts with its
/// own offset).
async fn lookup(
    engine: Engine,
    ctx: &UringContext,
    file: &Arc<File>,
    rng: &mut u64,
    reads: usize,
    blocks: u64,
) {
    let offs: Vec<u64> = (0..reads).map(|_| next(rng) % blocks * BLOCK).collect();
    match engine {
        Engine::Batch | Engine::BatchYield => {
            let batch = offs
                .iter()
                .map(|&o| (0u32, o, Vec::with_capacity(BLOCK as usize)));
            for (&o, (r, buf)) in offs.iter().zip(ctx.read_batch(batch).await) {
                assert_eq!(r.expect("read"), BLOCK as usize);
                assert_eq!(buf[..8], o.to_le_bytes());
            }
            if engine == Engine::BatchYield {
                tokio::task::yield_now().await;
            }
        }
        Engine::Pool => {
            let file = file.clone();
            let bufs = tokio::task::spawn_blocking(move || {
                offs.iter()
                    .map(|&o| {
                        let mut buf = vec![0u8; BLOCK as usize];
                        file.read_exact_at(&mut buf, o).expect("pread");
                        (o, buf)
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .expect("blocking task");
            for (o, buf) in bufs {
                assert_eq!(buf[..8], o.to_le_bytes());
            }
        }
    }
}

fn run(
    rt: &tokio::runtime::Runtime,
    engine: Engine,
    ctx: &UringContext,
    file: &Arc<File>,
    (secs, tasks, reads): (f64, usize, usize),
) -> Run {
    let blocks = FILE_LEN / BLOCK;
    rt.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (ctx, file, stop) = (ctx.clone(), file.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut rng = t as u64 * 7919 + 1;
                    let mut lat = Vec::with_capacity(1 << 16);
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        lookup(engine, &ctx, &file, &mut rng, reads, blocks).await;
                        lat.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    lat
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for h in handles {
            all.extend(h.await.expect("task"));
        }
        let took = start.elapsed().as_secs_f64();
        all.sort_unstable();
        Run {
            rate: all.len() as f64 / took,
            p50: percentile(&all, 0.5),
            p99: percentile(&all, 0.99),
            p999: percentile(&all, 0.999),
            max: percentile(&all, 1.0),
        }
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "bench-data/lookups".into());
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let secs: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let tasks: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(64);
    let reads: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(8);

    // Each block starts with its own offset (the check of every lookup).
    let ok = std::fs::metadata(&path).is_ok_and(|m| m.len() == FILE_LEN);
    if !ok {
        if let Some(dir) = std::path::Path::new(&path).parent() {
            std::fs::create_dir_all(dir)?;
        }
        let f = File::create(&path)?;
        let mut chunk = vec![0u8; 1 << 20];
        for base in (0..FILE_LEN).step_by(chunk.len()) {
            for (i, block) in chunk.chunks_mut(BLOCK as usize).enumerate() {
                block[..8].copy_from_slice(&(base + i as u64 * BLOCK).to_le_bytes());
            }
            f.write_all_at(&chunk, base)?;
        }
    }
    let file = Arc::new(File::open(&path)?);
    // Cache it.
    let mut chunk = vec![0u8; 1 << 20];
    for base in (0..FILE_LEN).step_by(chunk.len()) {
        file.read_exact_at(&mut chunk, base)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ctx = rt.block_on(async { UringContext::new(vec![file.try_clone()?]) })?;
    println!(
        "{tasks} tasks, lookups of {reads} random 4 KiB reads of a cached {} MiB file, \
         {rounds} rounds of {secs} s per engine; backend {}",
        FILE_LEN >> 20,
        ctx.backend()
    );
    let engines = [Engine::Pool, Engine::Batch, Engine::BatchYield];
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); engines.len()];
    // A short warm-up of each engine (threads of the blocking pool, rings).
    for &e in &engines {
        run(&rt, e, &ctx, &file, (0.3, tasks, reads));
    }
    for round in 0..rounds {
        // Alternate the order from round to round.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..engines.len()).collect()
        } else {
            (0..engines.len()).rev().collect()
        };
        for i in order {
            let r = run(&rt, engines[i], &ctx, &file, (secs, tasks, reads));
            println!(
                "round {round} {:>12}: {:>9.0} lookups/s  p50 {:>7.0} µs  p99 {:>7.0} µs  p99.9 {:>7.0} µs  max {:>7.0} µs",
                engines[i].name(),
                r.rate,
                r.p50,
                r.p99,
                r.p999,
                r.max
            );
            results[i].push(r);
        }
    }
    println!("medians over {rounds} rounds; ratios to pool of the same round (median):");
    let base = &results[0];
    for (i, e) in engines.iter().enumerate() {
        let rs = &results[i];
        let med = |f: fn(&Run) -> f64| median(rs.iter().map(f).collect());
        let ratio = |f: fn(&Run) -> f64| {
            median(
                rs.iter()
                    .zip(base)
                    .map(|(r, b)| f(r) / f(b))
                    .collect::<Vec<_>>(),
            )
        };
        println!(
            "{:>12}: {:>9.0} lookups/s ({:.2}x)  p50 {:>6.0} µs ({:.2}x)  p99 {:>6.0} µs ({:.2}x)  p99.9 {:>6.0} µs ({:.2}x)",
            e.name(),
            med(|r| r.rate),
            ratio(|r| r.rate),
            med(|r| r.p50),
            ratio(|r| r.p50),
            med(|r| r.p99),
            ratio(|r| r.p99),
            med(|r| r.p999),
            ratio(|r| r.p999),
        );
    }
    Ok(())
}
