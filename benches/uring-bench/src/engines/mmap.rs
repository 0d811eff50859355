//! `mmap`: one OS thread per read in flight, copying 4 KiB out of read-only
//! MADV_RANDOM mappings (page faults do the I/O). The mappings live only for
//! the cell, so cold-cache eviction between cells is effective.
//!
//! `mmap-tasks`: the same copies on tokio tasks (`workers` workers, one task
//! per read in flight) that share their workers as the crate's inline reads
//! and block cache hits do: each copy spends a unit of tokio's coop budget,
//! and a task that has been copying for a stretch (the crate's default,
//! 10 µs on a multi-thread runtime, or `--uring-inline-stretch-us`) yields
//! once (self-wake, `Pending`). The stretch is timed with the CPU's
//! time-stamp counter where there is one, as the crate's is. Set beside
//! `mmap` it prices that fairness without the crate: what 512 tasks that
//! take turns every 10 µs pay against 512 threads the kernel switches every
//! few milliseconds. A page fault (cold) blocks the worker thread, as it
//! would in any async code touching a mapping.
//!
//! Hot regime: the mapping is populated (MAP_POPULATE) before the timed
//! window — the mmap analogue of "the working set was read once", and the
//! steady state of a long-running engine whose mapping has been touched.
//! Without it a 2 s hot cell (the default) over 8 GiB would spend a large
//! share of its reads on first-touch minor faults (`--mmap-populate off` measures that).

use super::{run_threads, run_tokio_tasks, tokio_runtime, CellSpec, Measured, WindowHooks, Worker};
use crate::kinds::{EngineKind, Regime};
use crate::stop::Stop;
use crate::verify::BLOCK;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let files = spec.open_files()?;
    let populate = spec.regime == Regime::Hot && spec.mmap_populate;
    let t0 = Instant::now();
    let maps = files
        .iter()
        .map(|f| {
            let mut o = memmap2::MmapOptions::new();
            if populate {
                o.populate();
            }
            // SAFETY: read-only shared mapping of a dataset file nobody
            // writes while the benchmark runs.
            let m = unsafe { o.map(f) }.map_err(|e| format!("mmap: {e}"))?;
            m.advise(memmap2::Advice::Random)
                .map_err(|e| format!("madvise(MADV_RANDOM): {e}"))?;
            Ok(m)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let setup = t0.elapsed();
    let mut m = if spec.engine == EngineKind::MmapTasks {
        on_tasks(spec, maps)?
    } else {
        run_threads(spec, |t, buf| {
            let off = t.offset() as usize;
            buf.copy_from_slice(&maps[t.file as usize][off..off + BLOCK]);
            Ok(BLOCK)
        })?
    };
    m.notes.push(if populate {
        format!(
            "mappings populated (MAP_POPULATE) before the timed window, {:.2} s",
            setup.as_secs_f64()
        )
    } else {
        "mappings not populated: first touches fault".to_string()
    });
    Ok(m)
}

/// `mmap-tasks`: the copies on `depth` tokio tasks that yield as the
/// crate's inline reads do.
fn on_tasks(spec: &CellSpec<'_>, maps: Vec<memmap2::Mmap>) -> Result<Measured, String> {
    let rt = tokio_runtime(Some(spec.workers), 1)?;
    let stretch = spec.uring.inline_stretch.unwrap_or(DEFAULT_STRETCH);
    let ticks = Ticks::calibrate();
    let maps = Arc::new(maps);
    let mut m = run_tokio_tasks(spec, &rt, WindowHooks::default(), |w, stop| {
        task_loop(maps.clone(), w, stop, ticks.of(stretch))
    })?;
    rt.shutdown_background();
    m.notes.push(format!(
        "tokio tasks on {} workers, yielding every {} µs of copies",
        spec.workers,
        stretch.as_micros()
    ));
    Ok(m)
}

/// The crate's inline stretch on a multi-thread runtime
/// (`Builder::inline_stretch`).
const DEFAULT_STRETCH: Duration = Duration::from_micros(10);

async fn task_loop(
    maps: Arc<Vec<memmap2::Mmap>>,
    mut w: Worker,
    stop: Arc<Stop>,
    stretch: u64,
) -> Worker {
    let mut buf = crate::buf::AlignedBlock::new();
    // When the task's stretch began (None: at its next copy).
    let mut began: Option<u64> = None;
    while !stop.stopped() {
        let t = w.next();
        let t0 = Instant::now();
        admit(&mut began, stretch).await;
        let off = t.offset() as usize;
        buf.copy_from_slice(&maps[t.file as usize][off..off + BLOCK]);
        if let Err(e) = w.complete(t, Ok(BLOCK), &buf, t0, stop.phase()) {
            stop.fail(e);
            break;
        }
    }
    w
}

/// What the crate's cache does before a hit (`poll_admit`): a unit of
/// tokio's coop budget, and one yield once the task's stretch is spent. A
/// poll that ends (budget spent, or the yield) ends the stretch too, as
/// another task's reads end it in the crate.
async fn admit(began: &mut Option<u64>, stretch: u64) {
    std::future::poll_fn(|cx| {
        let Poll::Ready(coop) = tokio::task::coop::poll_proceed(cx) else {
            *began = None;
            return Poll::Pending;
        };
        let now = Ticks::now();
        let start = *began.get_or_insert(now);
        if now.wrapping_sub(start) >= stretch {
            *began = None;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        coop.made_progress();
        Poll::Ready(())
    })
    .await;
}

/// A cheap unordered clock for the stretch: the time-stamp counter on
/// x86-64 (as the crate's stretch clock), nanoseconds since a fixed
/// instant elsewhere.
#[derive(Clone, Copy)]
struct Ticks {
    /// Ticks per microsecond.
    per_us: f64,
}

impl Ticks {
    /// Measures the counter's rate over a few milliseconds.
    fn calibrate() -> Ticks {
        let (i0, t0) = (Instant::now(), Ticks::now());
        std::thread::sleep(Duration::from_millis(5));
        let (t1, i1) = (Ticks::now(), Instant::now());
        let us = (i1 - i0).as_secs_f64() * 1e6;
        Ticks {
            per_us: (t1.wrapping_sub(t0) as f64 / us).max(1e-3),
        }
    }

    /// `d` in ticks.
    fn of(self, d: Duration) -> u64 {
        (d.as_secs_f64() * 1e6 * self.per_us) as u64
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn now() -> u64 {
        // SAFETY: `rdtsc` exists on every x86-64 CPU; it reads a counter and
        // touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    fn now() -> u64 {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}
