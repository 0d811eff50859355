//! `uring-cache` and `uring-cache-ref`: this crate's `BlockCache` (feature
//! `cache`, 4 KiB blocks) over the `uring` engine's context, on the same
//! runtime and tasks shape as `uring` (`workers` workers, `depth` tasks).
//!
//! - `uring-cache` copies each block out: `cache.read(file, offset, &mut buf)`.
//! - `uring-cache-ref` takes the cached block itself: `cache.get(file,
//!   block)` gives a `BlockRef`, verified in place (no copy).
//!
//! The capacity is `--cache-mib` (default: the working set plus 1/16 of
//! headroom, so that nothing is evicted). In the `hot`
//! regime the cache is filled with the whole working set before the
//! measured window (every block read once and verified), as the page cache
//! is for the other engines: the measured reads are hits. In `cold` and
//! `direct` it starts empty, so the window measures the miss path (and the
//! hits of blocks read earlier in the window). In `direct` the files are
//! opened `O_DIRECT`, the mode the cache is meant for. The counters of the
//! measured window (hit ratio, misses, coalesced, evictions) go into the
//! cell's notes.

use super::{run_tokio_tasks, tokio_runtime, AtEnd, CellSpec, Measured, WindowHooks, Worker};
use crate::kinds::{EngineKind, Regime};
use crate::stop::Stop;
use crate::verify::{verify_block, BLOCK};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
use uring_positioned_io::{BlockCache, CacheOptions, CacheStats};

/// The cache of the running cell, for `mem-fair`'s warm-up and fill
/// sampler (which watch its eviction count).
pub static SAMPLED: Mutex<Option<BlockCache>> = Mutex::new(None);

/// Blocks one `get_many` of the warm-up asks for.
const FILL_BATCH: u64 = 256;
/// Warm-up tasks (each fills whole files).
const FILL_TASKS: usize = 8;

/// The default capacity for `bytes` of working set: it plus 1/16 of
/// headroom, in whole MiB.
pub fn default_capacity(bytes: u64) -> u64 {
    (bytes + bytes / 16).div_ceil(1 << 20).max(1) << 20
}

/// The cache's capacity for a cell: `spec.cache_bytes`, or the default for
/// its working set.
fn capacity(spec: &CellSpec<'_>) -> u64 {
    spec.cache_bytes.unwrap_or_else(|| {
        default_capacity(u64::from(spec.set_files) * spec.dataset.blocks_per_file() * BLOCK as u64)
    })
}

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let name = spec.engine.name();
    let zero_copy = spec.engine == EngineKind::UringCacheRef;
    let files = spec.open_files()?;
    let rt = tokio_runtime((!spec.uring.current_thread).then_some(spec.workers), 64)?;
    let ctx = super::uring::build_context(spec, &rt, files, name)?;
    let capacity = capacity(spec);
    let cache = BlockCache::new(
        &ctx,
        CacheOptions {
            capacity_bytes: capacity,
            block_size: BLOCK,
        },
    )
    .map_err(|e| format!("{name}: {e}"))?;
    let wl = spec.workload();
    let fill = if spec.regime == Regime::Hot {
        let t0 = Instant::now();
        rt.block_on(fill(&cache, wl.files, wl.blocks, wl.seed, wl.verify))
            .map_err(|e| format!("{name}: warming the cache: {e}"))?;
        Some(t0.elapsed())
    } else {
        None
    };
    *SAMPLED.lock().unwrap_or_else(PoisonError::into_inner) = Some(cache.clone());
    // the counters when the measured window starts (after any warm-up)
    let at_window_start = Arc::new(Mutex::new(None));
    let at_start: AtEnd = {
        let (cache, slot) = (cache.clone(), at_window_start.clone());
        Box::new(move || {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(cache.stats());
        })
    };
    let at_window_end = Arc::new(Mutex::new(None));
    let at_end: AtEnd = {
        let (cache, slot) = (cache.clone(), at_window_end.clone());
        Box::new(move || {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(cache.stats());
        })
    };
    let hooks = WindowHooks {
        at_start: Some(at_start),
        at_end: Some(at_end),
    };
    let res = run_tokio_tasks(spec, &rt, hooks, |w, stop| {
        let cache = cache.clone();
        async move {
            if zero_copy {
                ref_loop(&cache, w, &stop).await
            } else {
                copy_loop(&cache, w, &stop).await
            }
        }
    });
    SAMPLED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    drop(cache);
    rt.block_on(ctx.shutdown());
    drop(ctx);
    rt.shutdown_background();
    let mut m = res?;
    let s0 = at_window_start
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .ok_or_else(|| format!("{name}: the measured window started without the cache's stats"))?;
    let s1 = at_window_end
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .ok_or_else(|| format!("{name}: the measured window ended without the cache's stats"))?;
    m.cache_hit_ratio = hit_ratio(&s0, &s1);
    m.notes.push(window_note(&s0, &s1, capacity, fill));
    Ok(m)
}

/// The hit ratio of a window, from the counters at its start and end.
pub fn hit_ratio(s0: &CacheStats, s1: &CacheStats) -> Option<f64> {
    let hits = s1.hits.saturating_sub(s0.hits);
    let asked =
        hits + s1.misses.saturating_sub(s0.misses) + s1.coalesced.saturating_sub(s0.coalesced);
    (asked > 0).then(|| hits as f64 / asked as f64)
}

/// The cell's note: the window's hit ratio and counters, the capacity and
/// the warm-up.
fn window_note(
    s0: &CacheStats,
    s1: &CacheStats,
    capacity: u64,
    fill: Option<std::time::Duration>,
) -> String {
    let ratio = hit_ratio(s0, s1).map_or("-".into(), |r| format!("{:.2}%", r * 100.0));
    format!(
        "cache hit ratio {ratio} ({} hits, {} misses, {} coalesced, {} evictions in the window); \
         capacity {} MiB, {} MiB resident at the end; {}",
        s1.hits.saturating_sub(s0.hits),
        s1.misses.saturating_sub(s0.misses),
        s1.coalesced.saturating_sub(s0.coalesced),
        s1.evictions.saturating_sub(s0.evictions),
        capacity >> 20,
        s1.resident_bytes >> 20,
        fill.map_or("started empty".into(), |d| format!(
            "filled with the working set before the window ({:.1} s)",
            d.as_secs_f64()
        ))
    )
}

/// Reads every block of files `0..files` through the cache (`FILL_TASKS`
/// tasks, `FILL_BATCH` blocks per `get_many`), verifying each.
pub async fn fill(
    cache: &BlockCache,
    files: u32,
    blocks: u64,
    seed: u64,
    verify: crate::verify::VerifyMode,
) -> Result<(), String> {
    let mut tasks = Vec::new();
    for t in 0..FILL_TASKS {
        let cache = cache.clone();
        tasks.push(tokio::spawn(async move {
            for file in (0..files).skip(t).step_by(FILL_TASKS) {
                let mut b = 0;
                while b < blocks {
                    let end = (b + FILL_BATCH).min(blocks);
                    let got = cache.get_many(file, b..end).await;
                    for (block, r) in (b..end).zip(got) {
                        let r = r.map_err(|e| format!("file {file} block {block}: {e}"))?;
                        verify_block(verify, seed, file, block, &r[..])
                            .map_err(|e| format!("verification failed: {e}"))?;
                    }
                    b = end;
                }
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("warm-up task failed: {e}"))??;
    }
    Ok(())
}

/// `uring-cache`: each read copies its block out of the cache.
async fn copy_loop(cache: &BlockCache, mut w: Worker, stop: &Stop) -> Worker {
    let mut buf = crate::buf::AlignedBlock::new();
    while !stop.stopped() {
        let t = w.next();
        let t0 = Instant::now();
        let r = cache.read(t.file, t.offset(), &mut buf[..]).await;
        if let Err(e) = w.complete(t, r, &buf, t0, stop.phase()) {
            stop.fail(e);
            break;
        }
    }
    w
}

/// `uring-cache-ref`: each read takes the cached block and verifies it in
/// place.
async fn ref_loop(cache: &BlockCache, mut w: Worker, stop: &Stop) -> Worker {
    while !stop.stopped() {
        let t = w.next();
        let t0 = Instant::now();
        let r = cache.get(t.file, t.block).await;
        let res = match r {
            Ok(block) => w.complete(t, Ok(block.len()), &block[..], t0, stop.phase()),
            Err(e) => w.complete(t, Err(e), &[], t0, stop.phase()),
        };
        if let Err(e) = res {
            stop.fail(e);
            break;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_capacity_covers_the_set_with_slack() {
        assert_eq!(default_capacity(1 << 30), (1 << 30) + (64 << 20));
        assert_eq!(default_capacity(4096), 1 << 20);
        let s0 = CacheStats::default();
        let s1 = CacheStats {
            hits: 3,
            misses: 1,
            ..CacheStats::default()
        };
        assert_eq!(hit_ratio(&s0, &s1), Some(0.75));
        assert_eq!(hit_ratio(&s1, &s1), None);
    }
}
