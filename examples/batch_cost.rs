//! The CPU cost of a batch of 16 reads against 16 separate reads, per read,
//! on one `current_thread` runtime with one ring (so every instruction is on
//! this thread and a run under `valgrind --tool=callgrind` is comparable).
//!
//! ```sh
//! cargo run --release --example batch_cost -- <mode> <path> [rounds] [spread] [stretch_us]
//! ```
//!
//! `mode` is `batch` (`read_batch`), `merged` (`read_batch().merge_gap(0)`),
//! `stream` (`read_batch().unordered()`), `join` (16 `ctx.read` under
//! `join_all`), `join-owned` (16 `read_owned` under `join_all`); append
//! `-ring` to any mode to turn the page-cache fast path off (the reads go
//! through the ring; if the file is cached, the kernel serves them inside
//! `io_uring_enter`). `spread` (default 1) spaces the 16 blocks of a batch
//! `spread` blocks apart: 1 = adjacent, which `merged` makes one read.
//! `stretch_us` sets `Builder::inline_stretch` (the inline path's fairness
//! yield). Prints CPU time per read (user + system of the process, `getrusage`;
//! device interrupts and softirq work charged to other processes are not
//! counted), enters and SQEs per batch.

use std::time::Instant;

use futures::StreamExt;
use uring_positioned_io::UringContext;

const BLOCK: usize = 4096;

/// (user, system) CPU seconds of the process.
fn cpu() -> (f64, f64) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct (RUSAGE_SELF: every thread of the
    // process, io_uring's io-wq workers included).
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    (t(ru.ru_utime), t(ru.ru_stime))
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).cloned().unwrap_or_else(|| "batch".into());
    let path = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "bench-data/data-000".into());
    let rounds: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let spread: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1);
    // Optional: the inline path's fairness stretch, in µs.
    let stretch: Option<u64> = args.get(5).and_then(|s| s.parse().ok());
    let (mode, ring) = match mode.strip_suffix("-ring") {
        Some(m) => (m.to_string(), true),
        None => (mode, false),
    };
    let file = std::fs::File::open(&path)?;
    let blocks = file.metadata()?.len() / BLOCK as u64;
    let per_batch = 16 * spread;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut builder = UringContext::builder().rings(1).inline_nowait(!ring);
        if let Some(us) = stretch {
            builder = builder.inline_stretch(std::time::Duration::from_micros(us));
        }
        let ctx = builder.build(vec![file])?;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut bytes = 0usize;
        let one = |base: u64| (0..16u64).map(move |i| (0u32, (base + i * spread) * BLOCK as u64));
        let (t0, c0, s0) = (Instant::now(), cpu(), ctx.stats());
        for _ in 0..rounds {
            let base = next() % (blocks - per_batch);
            match mode.as_str() {
                "batch" | "merged" => {
                    let b = ctx.read_batch(one(base).map(|(f, o)| (f, o, Vec::with_capacity(BLOCK))));
                    let b = if mode == "merged" { b.merge_gap(0) } else { b };
                    for (r, buf) in b.await {
                        bytes += r?;
                        std::hint::black_box(&buf);
                    }
                }
                "stream" => {
                    let mut s = ctx
                        .read_batch(one(base).map(|(f, o)| (f, o, Vec::with_capacity(BLOCK))))
                        .unordered();
                    while let Some((_, r, buf)) = s.next().await {
                        bytes += r?;
                        std::hint::black_box(&buf);
                    }
                }
                "join" => {
                    let mut bufs = vec![[0u8; BLOCK]; 16];
                    let reads = one(base)
                        .zip(bufs.iter_mut())
                        .map(|((f, o), buf)| ctx.read(f, o, buf));
                    for r in futures::future::join_all(reads).await {
                        bytes += r?;
                    }
                }
                "join-owned" => {
                    let reads = one(base).map(|(f, o)| ctx.read_owned(f, o, Vec::with_capacity(BLOCK)));
                    for (r, buf) in futures::future::join_all(reads).await {
                        bytes += r?;
                        std::hint::black_box(&buf);
                    }
                }
                m => panic!("unknown mode {m}"),
            }
        }
        let (c1, s1) = (cpu(), ctx.stats());
        let reads = rounds * 16;
        assert_eq!(bytes as u64, reads * BLOCK as u64, "every read full");
        println!(
            "{mode}{} spread {spread}: {:.3} us CPU/read (user {:.3}, sys {:.3}), {:.3} enters/batch, {:.2} SQEs/batch, {:.0} k reads/s",
            if ring { "-ring" } else { "" },
            (c1.0 + c1.1 - c0.0 - c0.1) * 1e6 / reads as f64,
            (c1.0 - c0.0) * 1e6 / reads as f64,
            (c1.1 - c0.1) * 1e6 / reads as f64,
            (s1.enters - s0.enters) as f64 / rounds as f64,
            (s1.submitted - s0.submitted) as f64 / rounds as f64,
            reads as f64 / t0.elapsed().as_secs_f64() / 1e3,
        );
        ctx.shutdown().await;
        Ok(())
    })
}
