//! Fairness: a 1 ms tokio interval keeps ticking while 512 tasks read cached
//! data in tight loops (no explicit yields) on the same runtime. A read path
//! that completes inline forever without yielding to the scheduler (or that
//! blocks a worker) starves the ticker and fails the lenient bounds below.
//! Not a benchmark: bounds are deliberately loose.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Flavor, Rng};
use uring_positioned_io::BackendChoice;

const READERS: u64 = 512;
const WINDOW: Duration = Duration::from_secs(1);
/// A single stall longer than this fails outright.
const MAX_GAP: Duration = Duration::from_millis(250);
/// Ticks later than this count as stalled time.
const GRACE: Duration = Duration::from_millis(10);
/// At most this share of the window may be spent in stalls (> `GRACE`).
/// A healthy run on a noisy 2-vCPU VM stays below ~15 %; a runtime whose
/// ticker only gets a turn once per "round" of 512 busy tasks sits at ~100 %.
const MAX_STALLED_SHARE: f64 = 0.5;
const MIN_TICKS: usize = 500;

fn fairness(choice: BackendChoice, flavor: Flavor) {
    let _serial = common::serial();
    let set = common::FileSet::new(0xfa1, &[1 << 20]);
    let file = set.files[0].clone();
    // inline_nowait only changes the io_uring backend.
    let inline_modes: &[bool] = match choice {
        BackendChoice::Fallback => &[true],
        _ => &[false, true],
    };
    for &inline_nowait in inline_modes {
        let opened = set.open_all();
        let file = file.clone();
        common::run("fairness", flavor, 40, move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(inline_nowait));
            // Warm the page cache.
            common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
            let stop = Arc::new(AtomicBool::new(false));
            let counts: Arc<Vec<AtomicU64>> =
                Arc::new((0..READERS).map(|_| AtomicU64::new(0)).collect());
            let readers: Vec<_> = (0..READERS)
                .map(|t| {
                    let (ctx, stop, counts, file) =
                        (ctx.clone(), stop.clone(), counts.clone(), file.clone());
                    tokio::spawn(async move {
                        let mut rng = Rng::new(t);
                        let mut buf = vec![0u8; 4096];
                        while !stop.load(Relaxed) {
                            let off = rng.below(file.len / 4096) * 4096;
                            let n = ctx.read(0u32, off, &mut buf).await.expect("read");
                            assert_eq!(n, 4096);
                            if rng.chance(1) {
                                common::check_pattern(file.seed, off, &buf).unwrap();
                            }
                            counts[t as usize].fetch_add(1, Relaxed);
                        }
                    })
                })
                .collect();
            let ticker = tokio::spawn(async move {
                let mut iv = tokio::time::interval(Duration::from_millis(1));
                iv.tick().await;
                let start = Instant::now();
                let mut last = start;
                let mut gaps = Vec::with_capacity(2000);
                while start.elapsed() < WINDOW {
                    iv.tick().await;
                    let now = Instant::now();
                    gaps.push(now - last);
                    last = now;
                }
                gaps
            });
            let gaps = ticker.await.expect("ticker task");
            stop.store(true, Relaxed);
            for r in readers {
                tokio::time::timeout(Duration::from_secs(10), r)
                    .await
                    .expect("reader did not stop")
                    .expect("reader panicked");
            }
            let max_gap = gaps.iter().copied().max().unwrap_or_default();
            let total: u64 = counts.iter().map(|c| c.load(Relaxed)).sum();
            let starved = counts.iter().filter(|c| c.load(Relaxed) == 0).count();
            // Time the ticker spent waiting beyond the grace per tick.
            let stalled: Duration = gaps
                .iter()
                .filter(|g| **g > GRACE)
                .map(|g| *g - Duration::from_millis(1))
                .sum();
            let stalled_share = stalled.as_secs_f64() / WINDOW.as_secs_f64();
            let long_gaps = gaps
                .iter()
                .filter(|g| **g > Duration::from_millis(25))
                .count();
            let mut sorted = gaps.clone();
            sorted.sort();
            let p99 = sorted
                .get(sorted.len() * 99 / 100)
                .copied()
                .unwrap_or_default();
            eprintln!(
                "{choice:?}/{flavor:?}/inline_nowait={inline_nowait}: {} ticks in {WINDOW:?}, max gap {max_gap:?}, p99 gap {p99:?}, stalled {stalled:?}, gaps>25ms {long_gaps}; {total} reads, {starved} readers without progress; {:?}",
                gaps.len(),
                ctx.stats()
            );
            assert!(
                max_gap < MAX_GAP,
                "timer starved: max gap between 1 ms ticks was {max_gap:?} (inline_nowait={inline_nowait})"
            );
            assert!(
                stalled_share < MAX_STALLED_SHARE,
                "timer starved: {:.0} % of the {WINDOW:?} window was spent in gaps > {GRACE:?} between 1 ms ticks \
                 ({long_gaps} gaps > 25 ms, max {max_gap:?}, inline_nowait={inline_nowait})",
                stalled_share * 100.0
            );
            assert!(
                gaps.len() >= MIN_TICKS,
                "timer starved: only {} ticks of a 1 ms interval in {WINDOW:?} (inline_nowait={inline_nowait})",
                gaps.len()
            );
            assert!(
                total >= READERS,
                "readers made almost no progress: {total} reads"
            );
            assert_eq!(
                starved, 0,
                "{starved} of {READERS} reader tasks never completed a read"
            );
        });
    }
}

fn fairness_multi_thread(choice: BackendChoice) {
    fairness(choice, Flavor::Multi);
}

fn fairness_current_thread(choice: BackendChoice) {
    fairness(choice, Flavor::Current);
}

backend_tests!(fairness_multi_thread, fairness_current_thread);
