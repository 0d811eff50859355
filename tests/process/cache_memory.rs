//! The block cache's memory over a million random reads: the process's
//! resident memory grows by at most the cache's capacity (plus what reads
//! in flight hold and a small allowance for the runtime's own allocations),
//! however many blocks come and go, and the cache's buffer pool stays
//! within the capacity plus what is in flight: buffers are reused, never
//! one allocation per miss.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{check_pattern, make_file, Flavor, Rng};
use uring_positioned_io::{BackendChoice, BlockCache, CacheOptions};

const BS: usize = 4096;
/// The capacity: two thirds of the file, so that a third of the reads
/// miss and evict (and the million reads stay quick in a debug build).
const CAPACITY: u64 = 8 << 20;
const FILE: u64 = 12 << 20;
const TASKS: u64 = 8;
/// Bytes beyond the capacity the process may gain: reads in flight (eight
/// tasks, at most three blocks each), the cache's and the runtime's own
/// allocations, allocator slack, and one partly used 2 MiB buffer region.
const ALLOWANCE: u64 = 6 << 20;

/// `VmRSS` of this process, in bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

fn million_reads(choice: BackendChoice, reads: u64) {
    common::run("cache-rss", Flavor::Multi, 600, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 0xcac4e, FILE);
        let ctx = common::default_ctx(choice, vec![f.open()]);
        // The runtime, the context and the harness as they are before the
        // cache exists.
        let base = rss();
        let cache = BlockCache::new(
            &ctx,
            CacheOptions {
                capacity_bytes: CAPACITY,
                block_size: BS,
            },
        )
        .unwrap();
        let peak_rss = Arc::new(AtomicU64::new(0));
        let peak_pool = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (cache, f) = (cache.clone(), f.clone());
                let (peak_rss, peak_pool) = (peak_rss.clone(), peak_pool.clone());
                tokio::spawn(async move {
                    let mut rng = Rng::new(t + 1);
                    let mut buf = vec![0u8; 2 * BS];
                    for i in 0..reads / TASKS {
                        let off = rng.below(f.len);
                        if i % 4 == 0 {
                            // Zero-copy, dropped at once.
                            let block = cache.get(0u32, off / BS as u64).await.unwrap();
                            if i % 16 == 0 {
                                check_pattern(f.seed, off / BS as u64 * BS as u64, &block).unwrap();
                            }
                        } else {
                            let len = rng.range(1, 2 * BS as u64) as usize;
                            let n = cache.read(0u32, off, &mut buf[..len]).await.unwrap();
                            if i % 16 == 1 {
                                check_pattern(f.seed, off, &buf[..n]).unwrap();
                            }
                        }
                        if i % 4096 == 0 {
                            peak_rss.fetch_max(rss(), Ordering::Relaxed);
                            peak_pool.fetch_max(cache.stats().pool_bytes, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        peak_rss.fetch_max(rss(), Ordering::Relaxed);
        let s = cache.stats();
        let grown = peak_rss.load(Ordering::Relaxed).saturating_sub(base);
        let bound = CAPACITY + CAPACITY / 20 + ALLOWANCE;
        eprintln!(
            "{choice:?}: {reads} reads, RSS grew {} KiB (bound {} KiB), pool peak {} KiB, {s:?}",
            grown >> 10,
            bound >> 10,
            peak_pool.load(Ordering::Relaxed) >> 10
        );
        assert!(s.evictions > reads / 8, "the test did not churn: {s:?}");
        assert!(s.resident_bytes <= CAPACITY, "{s:?}");
        assert_eq!((s.pinned_bytes, s.in_flight_bytes), (0, 0), "{s:?}");
        assert!(
            grown <= bound,
            "{choice:?}: RSS grew {grown} bytes over {reads} reads, more than capacity {CAPACITY} × 1.05 + {ALLOWANCE}"
        );
        // Reads in flight: at most three blocks per task; buffers come in
        // regions of 2 MiB.
        let pool_bound = CAPACITY + TASKS * 3 * BS as u64 + (2 << 20);
        assert!(
            peak_pool.load(Ordering::Relaxed) <= pool_bound,
            "{choice:?}: the pool grew to {peak_pool:?} bytes, bound {pool_bound}"
        );
    });
}

#[test]
fn cache_memory_stays_bounded_over_a_million_reads() {
    let _serial = common::serial();
    million_reads(BackendChoice::IoUring, 1_000_000);
    million_reads(BackendChoice::Fallback, 200_000);
}
