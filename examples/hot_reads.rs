//! Hot random 4 KiB reads: `depth` tasks on a 2-worker multi-thread
//! runtime, each doing `reads / depth` random `ctx.read(fid, off, &mut buf)`
//! over `files` page-cache-hot files of `mib` MiB (every block checked).
//! Prints reads/s, CPU µs per read (getrusage over the timed part: total,
//! user, system) and polls per read (a poll beyond the first is a `Pending`:
//! mostly the page-cache path's fairness yields).
//!
//! ```text
//! cargo run --release --example hot_reads -- [depth] [reads] [files] [mib] [dir]
//! ```
//! Defaults: 512 tasks, 2_000_000 reads, 16 files of 64 MiB in
//! `$TMPDIR/uring-hot-reads` (written once, then reused).
//!
//! It uses only API that already existed at the first releases of the
//! crate (`UringContext::new`, `read`, `shutdown`), so the same file can be
//! copied into a worktree of an older commit to compare builds, e.g.
//! `git worktree add ../old <commit> && cp examples/hot_reads.rs
//! ../old/examples/`, then alternate the two binaries (`farm-bench --vs`,
//! or a loop).

use std::fs::File;
use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use uring_positioned_io::UringContext;

const BLOCK: usize = 4096;

/// The process's (user, system) CPU time so far.
fn cpu_time() -> (Duration, Duration) {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &raw mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Counts the polls of the future it wraps (a poll beyond the first is a
/// `Pending`: a fairness yield, the coop budget, or a wait for the ring).
struct Counted<'a, F>(F, &'a mut u64);

impl<F: Future + Unpin> Future for Counted<'_, F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        *this.1 += 1;
        Pin::new(&mut this.0).poll(cx)
    }
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: u64| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let depth = arg(0, 512) as usize;
    let reads = arg(1, 2_000_000);
    let nfiles = arg(2, 16) as usize;
    let mib = arg(3, 64);
    let dir = a.get(4).cloned().unwrap_or_else(|| {
        let d = std::env::temp_dir().join("uring-hot-reads");
        d.to_string_lossy().into_owned()
    });
    std::fs::create_dir_all(&dir).unwrap();
    let blocks = mib * 256;
    let mut files = Vec::new();
    for i in 0..nfiles {
        let path = format!("{dir}/f{i}.dat");
        if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) != blocks * BLOCK as u64 {
            let mut f = std::io::BufWriter::new(File::create(&path).unwrap());
            let mut b = vec![0u8; BLOCK];
            for blk in 0..blocks {
                b[..8].copy_from_slice(&(blk ^ (i as u64) << 40).to_le_bytes());
                f.write_all(&b).unwrap();
            }
            f.flush().unwrap();
        }
        // Warm the page cache.
        let mut f = File::open(&path).unwrap();
        let mut sink = vec![0u8; 1 << 20];
        while f.read(&mut sink).unwrap() > 0 {}
        files.push(File::open(&path).unwrap());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let per_task = reads / depth as u64;
    let (wall, cpu, total, polls) = rt.block_on(async move {
        let ctx = UringContext::new(files).expect("context");
        // Warm-up: one read per file before the clock starts.
        let mut b = vec![0u8; BLOCK];
        for f in 0..nfiles as u32 {
            ctx.read(f, 0, &mut b).await.unwrap();
        }
        let (t0, c0) = (Instant::now(), cpu_time());
        let tasks: Vec<_> = (0..depth)
            .map(|t| {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let mut x = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let mut buf = vec![0u8; BLOCK];
                    let mut polls = 0u64;
                    for _ in 0..per_task {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let fid = (x >> 48) as usize % nfiles;
                        let blk = (x & 0xFFFF_FFFF) % blocks;
                        let read = ctx.read(fid as u32, blk * BLOCK as u64, &mut buf);
                        let n = Counted(read, &mut polls).await.expect("read");
                        assert_eq!(n, BLOCK);
                        let w = u64::from_le_bytes(buf[..8].try_into().unwrap());
                        assert_eq!(w, blk ^ (fid as u64) << 40, "wrong block");
                    }
                    (per_task, polls)
                })
            })
            .collect();
        let (mut total, mut polls) = (0, 0);
        for t in tasks {
            let (n, p) = t.await.unwrap();
            total += n;
            polls += p;
        }
        let c1 = cpu_time();
        let r = (
            t0.elapsed(),
            (c1.0.saturating_sub(c0.0), c1.1.saturating_sub(c0.1)),
            total,
            polls,
        );
        ctx.shutdown().await;
        r
    });
    let rate = total as f64 / wall.as_secs_f64();
    let (user, sys) = cpu;
    let per_read = |d: Duration| d.as_secs_f64() * 1e6 / total as f64;
    println!(
        "depth {depth} reads {total} wall {:.3} s  {:.3} M reads/s  cpu {:.3} us/read  user {:.3} sys {:.3}  ({:.2} CPUs)  polls/read {:.3}",
        wall.as_secs_f64(),
        rate / 1e6,
        per_read(user + sys),
        per_read(user),
        per_read(sys),
        (user + sys).as_secs_f64() / wall.as_secs_f64(),
        polls as f64 / total as f64
    );
}
