//! Fairness: a 1 ms tokio interval keeps ticking while 512 tasks read cached
//! data in tight loops (no explicit yields) on the same runtime. A read path
//! that completes inline without ever yielding to the scheduler (or that
//! blocks a worker) starves the ticker and fails the lenient bounds below.
//!
//! Not a benchmark: bounds are deliberately loose, and to stay meaningful on
//! a shared, noisy 2-vCPU machine every measurement is paired with a control
//! run (512 tasks doing the same `pread` synchronously and yielding after
//! each one). If the control itself misses the bounds, the machine is too
//! busy to judge and the result is reported as inconclusive instead of
//! failing.

use crate::common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Flavor, Rng, TestFile};
use uring_positioned_io::{BackendChoice, UringContext};

const READERS: u64 = 512;
const WINDOW: Duration = Duration::from_secs(1);
/// A single stall longer than this fails outright.
const MAX_GAP: Duration = Duration::from_millis(250);
/// Ticks later than this count as stalled time.
const GRACE: Duration = Duration::from_millis(10);
/// At most this share of the window may be spent in stalls (> `GRACE`).
/// A healthy run on a quiet 2-vCPU VM stays below ~15 %; a runtime whose
/// ticker only gets a turn once per "round" of 512 busy tasks sits at ~100 %.
const MAX_STALLED_SHARE: f64 = 0.5;
const MIN_TICKS: usize = 500;
/// How much more stalled than the worst control run the library must be to
/// fail (so that noise on a busy machine is not reported as a library bug).
const MARGIN: f64 = 0.3;
/// Share of the window this process's threads may wait for a CPU before a
/// failed run is put down to the machine's load (see `run_delay`).
const RUN_DELAY_BUSY: f64 = 0.1;

#[derive(Debug)]
struct Measurement {
    ticks: usize,
    max_gap: Duration,
    p99_gap: Duration,
    stalled_share: f64,
    long_gaps: usize,
    reads: u64,
    readers_without_progress: usize,
    /// Time this process's threads spent runnable but waiting for a CPU
    /// during the window (`run_delay` of `/proc/self/task/*/schedstat`), as
    /// a share of the window: the OS's CPU contention, which no task
    /// scheduling policy inside the runtime can cause or cure.
    run_delay_share: f64,
    /// CPU time this process used during the window, in CPUs (1.0 = one
    /// CPU busy for the whole window).
    cpus_used: f64,
}

impl Measurement {
    /// Whether the ticker was served within the bounds.
    fn timer_ok(&self) -> Result<(), String> {
        if self.max_gap >= MAX_GAP {
            return Err(format!("max gap between 1 ms ticks was {:?}", self.max_gap));
        }
        if self.stalled_share >= MAX_STALLED_SHARE {
            return Err(format!(
                "{:.0} % of the {WINDOW:?} window was spent in gaps > {GRACE:?} ({} gaps > 25 ms, max {:?})",
                self.stalled_share * 100.0,
                self.long_gaps,
                self.max_gap
            ));
        }
        if self.ticks < MIN_TICKS {
            return Err(format!(
                "only {} ticks of a 1 ms interval in {WINDOW:?}",
                self.ticks
            ));
        }
        Ok(())
    }

    /// A control run well inside the bounds: the machine can be judged.
    fn clearly_healthy(&self) -> Result<(), String> {
        if self.stalled_share < MAX_STALLED_SHARE * 0.6
            && self.max_gap < Duration::from_millis(60)
            && self.ticks >= MIN_TICKS
        {
            Ok(())
        } else {
            Err(format!(
                "stalled {:.0} %, max gap {:?}, p99 gap {:?}, {} ticks",
                self.stalled_share * 100.0,
                self.max_gap,
                self.p99_gap,
                self.ticks
            ))
        }
    }
}

enum Load {
    /// Reads through the library.
    Library(UringContext),
    /// Synchronous pread + yield after every read: what a fair inline read
    /// path looks like.
    Control(Arc<File>),
}

async fn measure(load: Load, file: TestFile) -> Measurement {
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..READERS).map(|_| AtomicU64::new(0)).collect());
    let load = Arc::new(load);
    let readers: Vec<_> = (0..READERS)
        .map(|t| {
            let (load, stop, counts, file) =
                (load.clone(), stop.clone(), counts.clone(), file.clone());
            tokio::spawn(async move {
                let mut rng = Rng::new(t);
                let mut buf = vec![0u8; 4096];
                while !stop.load(Relaxed) {
                    let off = rng.below(file.len / 4096) * 4096;
                    let n = match &*load {
                        Load::Library(ctx) => ctx.read(0u32, off, &mut buf).await.expect("read"),
                        Load::Control(f) => {
                            let n = f.read_at(&mut buf, off).expect("pread");
                            tokio::task::yield_now().await;
                            n
                        }
                    };
                    assert_eq!(n, 4096);
                    if rng.chance(1) {
                        common::check_pattern(file.seed, off, &buf).unwrap();
                    }
                    counts[t as usize].fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    let delay_before = run_delay();
    let cpu_before = common::process_cpu();
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
    let delay = run_delay().saturating_sub(delay_before);
    let cpu = common::process_cpu().saturating_sub(cpu_before);
    stop.store(true, Relaxed);
    for r in readers {
        tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .expect("reader did not stop")
            .expect("reader panicked");
    }
    let stalled: Duration = gaps
        .iter()
        .filter(|g| **g > GRACE)
        .map(|g| (*g).checked_sub(Duration::from_millis(1)).unwrap())
        .sum();
    let mut sorted = gaps.clone();
    sorted.sort();
    Measurement {
        ticks: gaps.len(),
        max_gap: sorted.last().copied().unwrap_or_default(),
        p99_gap: sorted
            .get(sorted.len() * 99 / 100)
            .copied()
            .unwrap_or_default(),
        stalled_share: stalled.as_secs_f64() / WINDOW.as_secs_f64(),
        long_gaps: gaps
            .iter()
            .filter(|g| **g > Duration::from_millis(25))
            .count(),
        reads: counts.iter().map(|c| c.load(Relaxed)).sum(),
        readers_without_progress: counts.iter().filter(|c| c.load(Relaxed) == 0).count(),
        run_delay_share: delay.as_secs_f64() / WINDOW.as_secs_f64(),
        cpus_used: cpu.as_secs_f64() / WINDOW.as_secs_f64(),
    }
}

/// Total time the threads of this process have spent waiting on a run
/// queue (the second field of `/proc/self/task/*/schedstat`, in ns).
fn run_delay() -> Duration {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for task in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(ns)
}

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
        common::run("fairness", flavor, 60, move || async move {
            let label = format!("{choice:?}/{flavor:?}/inline_nowait={inline_nowait}");
            let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(inline_nowait));
            // Warm the page cache.
            common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
            let control_file = Arc::new(file.open());

            let control = measure(Load::Control(control_file.clone()), file.clone()).await;
            let lib = measure(Load::Library(ctx.clone()), file.clone()).await;
            eprintln!("{label}: control {control:?}");
            eprintln!("{label}: library {lib:?}; {:?}", ctx.stats());

            // Progress is required regardless of timing.
            assert!(
                lib.reads >= READERS,
                "{label}: readers made almost no progress: {} reads",
                lib.reads
            );
            assert_eq!(
                lib.readers_without_progress, 0,
                "{label}: {} of {READERS} reader tasks never completed a read",
                lib.readers_without_progress
            );
            if let Err(why) = lib.timer_ok() {
                if choice == BackendChoice::Fallback {
                    // The fallback's reads run on up to 64 blocking-pool
                    // threads, which compete with the runtime's threads for
                    // the CPUs in the OS scheduler, not in tokio's: the gaps
                    // measure the machine's load (this failed under a
                    // concurrent build while passing alone), not the
                    // crate's task fairness, which is what this test is for.
                    eprintln!("NOT ASSERTED {label}: {why} (fallback: OS-level CPU contention)");
                    return;
                }
                // Threads of this process that wait for a CPU while it does
                // not fill the CPUs itself are the machine's load (other
                // processes), not the runtime's task order: quiet, this share stays below 0.01; with two CPU
                // hogs on the two vCPUs it is 0.25-0.3 and a current_thread
                // runtime's rounds of 512 readers stretch past the 10 ms
                // grace for the library and the control alike.
                // Unless this process itself kept every CPU busy (a thread
                // of the crate spinning would make the runtime's threads
                // wait too, and must not be excused).
                let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
                #[allow(clippy::cast_precision_loss, reason = "a CPU count")]
                let self_inflicted = lib.cpus_used > cpus as f64 - 0.5;
                if lib.run_delay_share >= RUN_DELAY_BUSY && !self_inflicted {
                    eprintln!(
                        "INCONCLUSIVE {label}: library run failed ({why}) while this process's threads waited {:.0} % of the window for a CPU (OS-level contention)",
                        lib.run_delay_share * 100.0
                    );
                    return;
                }
                let control2 = measure(Load::Control(control_file), file.clone()).await;
                eprintln!("{label}: control again {control2:?}");
                if let (Err(a), _) | (_, Err(a)) =
                    (control.clearly_healthy(), control2.clearly_healthy())
                {
                    eprintln!(
                        "INCONCLUSIVE {label}: library run failed ({why}) but the machine is too busy \
                         to judge: a control run was not clearly within the bounds ({a})"
                    );
                    return;
                }
                // Only a clear difference to the controls counts: the
                // library must be markedly worse than a fair reader, not
                // just unlucky on a busy machine.
                let worst_control = control.stalled_share.max(control2.stalled_share);
                if lib.max_gap < MAX_GAP && lib.stalled_share < worst_control + MARGIN {
                    eprintln!(
                        "INCONCLUSIVE {label}: library run failed ({why}) but is within {:.0} points of a control run ({:.0} %)",
                        MARGIN * 100.0,
                        worst_control * 100.0
                    );
                    return;
                }
                panic!("{label}: timer starved while the library was reading: {why} (control runs were fine: {control:?}, {control2:?})");
            }
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

/// The worst gap between the ticks of a 10 ms ticker on this runtime while
/// `work` runs (from 30 ms before it until 30 ms after), and its output.
async fn worst_tick_during<T>(work: impl std::future::Future<Output = T>) -> (T, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let worst = Arc::new(AtomicU64::new(0));
    let ticker = {
        let (stop, worst) = (stop.clone(), worst.clone());
        tokio::spawn(async move {
            let mut last = Instant::now();
            while !stop.load(Relaxed) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let gap = last.elapsed().as_micros() as u64;
                worst.fetch_max(gap, Relaxed);
                last = Instant::now();
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let out = work.await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    stop.store(true, Relaxed);
    ticker.await.unwrap();
    (out, Duration::from_micros(worst.load(Relaxed)))
}

/// One large read of cached data does not hold its thread for the whole
/// copy: a `current_thread` runtime's 10 ms ticker keeps ticking through a
/// 1 GiB cached read, borrowed (inline `preadv2` in 1 MiB pieces, with the
/// fairness check between them) and owned (the ring read goes to io-wq,
/// not copied inside the submitting `io_uring_enter`). A copy of the whole
/// GiB in one go would hold the thread for a few tenths of a second. A gap
/// over the bound (150 ms) counts only if a fair reader of the same bytes (1 MiB
/// `pread`s with a yield between them), measured right after, keeps the
/// ticker well within it: otherwise the machine is too busy to judge.
#[test]
fn a_huge_cached_read_does_not_stall_the_runtime() {
    const LEN: u64 = 1 << 30;
    const BOUND: Duration = Duration::from_millis(150);
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse");
    let f = File::create(&path).unwrap();
    f.set_len(LEN).unwrap(); // a hole: zeros, no disk space
    drop(f);
    let path2 = path.clone();
    common::run("huge_read", Flavor::Current, 120, move || async move {
        let file = Arc::new(File::open(&path2).unwrap());
        // Cache it (holes come into the page cache as zero pages).
        let mut piece = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < LEN {
            off += file.read_at(&mut piece, off).unwrap() as u64;
        }
        let ctx = common::build_ctx(
            BackendChoice::IoUring,
            vec![file.try_clone().unwrap()],
            |b| b,
        );
        for owned in [false, true] {
            // The test's own 1 GiB fill and check stay outside the window.
            let mut borrowed = if owned {
                Vec::new()
            } else {
                vec![1u8; LEN as usize]
            };
            let t = Instant::now();
            let ((n, got), worst) = worst_tick_during(async {
                if owned {
                    let (r, buf) = ctx
                        .read_owned(0u32, 0, Vec::with_capacity(LEN as usize))
                        .await;
                    (r.unwrap(), buf)
                } else {
                    let n = ctx.read(0u32, 0, &mut borrowed).await.unwrap();
                    (n, borrowed)
                }
            })
            .await;
            let took = t.elapsed();
            assert_eq!(n as u64, LEN);
            let zeros = vec![0u8; 1 << 20];
            assert!(got.chunks(1 << 20).all(|c| c == &zeros[..c.len()]));
            drop(got);
            eprintln!("owned={owned}: 1 GiB cached read took {took:?}; worst 10 ms tick {worst:?}");
            if worst < BOUND {
                continue;
            }
            let ((), control) = worst_tick_during(async {
                let mut off = 0;
                while off < LEN {
                    off += file.read_at(&mut piece, off).unwrap() as u64;
                    tokio::task::yield_now().await;
                }
            })
            .await;
            eprintln!(
                "owned={owned}: control (1 MiB preads, a yield after each): worst tick {control:?}"
            );
            if control > BOUND / 3 {
                eprintln!(
                    "INCONCLUSIVE owned={owned}: a tick came {worst:?} apart, but the machine is too \
                     busy to judge (a fair reader's worst tick: {control:?})"
                );
                continue;
            }
            panic!(
                "owned={owned}: a 10 ms tick came {worst:?} apart during one cached read of 1 GiB \
                 (a fair reader's worst tick: {control:?})"
            );
        }
        drop(ctx);
    });
    drop(dir);
}

/// Yields once, to the back of the run queue (a self-wake, as the crate's
/// own fairness yields do; `tokio::task::yield_now` defers its wake-up
/// until the `current_thread` scheduler next parks or does maintenance).
async fn self_yield() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Polls `fut`, counting its polls in `polls`.
async fn counting_polls<F: std::future::Future>(fut: F, polls: &mut u32) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        *polls += 1;
        fut.as_mut().poll(cx)
    })
    .await
}

/// A task looping on batches of cached reads lets another ready task run
/// between its batches, as a task looping on cached single reads does: a
/// batch yields before its first read when the task has used up its stretch
/// of inline reads, and a batch's inline reads count toward it. Structural,
/// with a stretch of zero on a `current_thread` runtime: every batch but
/// the first returns `Pending` at least once, and another task that only
/// yields runs between every two batches. (Left to tokio's coop budget
/// alone, batches of 8 cached reads would yield once in 16 batches.) On
/// the fallback backend there are no inline reads:
/// a batch waits for the blocking pool, and returns `Pending` unless the
/// pool's threads were done before it looked (most batches here: a woken
/// pool thread can preempt the runtime's), as a single read does; then
/// tokio's coop budget bounds the run. Only printed there.
fn cached_batches_let_other_tasks_run(choice: BackendChoice) {
    const BATCHES: u64 = 300;
    const PER_BATCH: u64 = 8;
    let set = common::FileSet::new(0xfa2, &[1 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("batch_fairness", Flavor::Current, 60, move || async move {
        use futures::StreamExt;
        let ctx = common::build_ctx(choice, opened, |b| b.inline_stretch(Duration::ZERO));
        common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
        for mode in ["future", "stream", "merged"] {
            let batches = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let other = {
                let (batches, stop) = (batches.clone(), stop.clone());
                tokio::spawn(async move {
                    let (mut last, mut worst, mut runs) = (0, 0, 0u64);
                    while !stop.load(Relaxed) {
                        self_yield().await;
                        let now = batches.load(Relaxed);
                        worst = worst.max(now - last);
                        last = now;
                        runs += 1;
                    }
                    (worst, runs)
                })
            };
            let reader = {
                let (ctx, file, batches) = (ctx.clone(), file.clone(), batches.clone());
                tokio::spawn(async move {
                    let mut rng = Rng::new(0xfa2);
                    // Batches done in one poll, without a yield.
                    let mut at_once = 0u64;
                    for _ in 0..BATCHES {
                        let offs: Vec<u64> = (0..PER_BATCH)
                            .map(|_| rng.below(file.len / 4096) * 4096)
                            .collect();
                        let reads = offs.iter().map(|&o| (0u32, o, Vec::with_capacity(4096)));
                        let mut polls = 0;
                        let got: Vec<_> = match mode {
                            "future" => counting_polls(ctx.read_batch(reads), &mut polls).await,
                            "merged" => {
                                let batch = ctx.read_batch(reads).merge_gap(8192);
                                counting_polls(batch, &mut polls).await
                            }
                            _ => {
                                let stream = ctx.read_batch(reads).unordered();
                                let all = stream.collect::<Vec<_>>();
                                let mut got: Vec<_> = counting_polls(all, &mut polls).await;
                                got.sort_by_key(|(i, _, _)| *i);
                                got.into_iter().map(|(_, r, b)| (r, b)).collect()
                            }
                        };
                        if polls == 1 {
                            at_once += 1;
                        }
                        for (&o, (r, buf)) in offs.iter().zip(&got) {
                            assert_eq!(r.as_ref().ok(), Some(&4096), "{mode} @{o}");
                            assert_eq!(&buf[..], &file.expected(o, 4096)[..], "{mode} @{o}");
                        }
                        batches.fetch_add(1, Relaxed);
                    }
                    at_once
                })
            };
            let at_once = reader.await.unwrap();
            stop.store(true, Relaxed);
            let (worst, runs) = other.await.unwrap();
            eprintln!(
                "{choice:?} {mode}: {BATCHES} batches of {PER_BATCH} cached reads, {at_once} \
                 done in one poll; the other task ran {runs} times, at most {worst} batches apart"
            );
            if choice == BackendChoice::IoUring {
                assert!(
                    at_once <= 1,
                    "{choice:?} {mode}: {at_once} of {BATCHES} batches of cached reads never yielded"
                );
                assert!(
                    worst <= 2,
                    "{choice:?} {mode}: another ready task waited for {worst} batches of cached reads"
                );
            }
        }
        drop(set);
    });
}

backend_tests!(cached_batches_let_other_tasks_run);
