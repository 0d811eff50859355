//! `uring-bench slow-file`: one file on slow storage, many reads in
//! flight — the crate against `spawn_blocking` + `pread`, what a tokio user
//! would otherwise write.
//!
//! The storage is a FUSE file system the bench mounts itself (needs root
//! and `/dev/fuse`; otherwise it says why and exits with success): one
//! read-only file of 1 TiB whose content is the dataset's block format, so
//! every block read is verified, and whose every read is answered after
//! 1 to `--max-delay-ms` milliseconds, by the MiB it falls in (a timer
//! thread replies; the handlers never block). Mounted twice: with
//! `FOPEN_DIRECT_IO` (no page cache, each `pread` one FUSE request) and
//! with the page cache (`FOPEN_KEEP_CACHE`). Every read is of a block no
//! earlier read touched, so the page cache never answers one.
//!
//! Engines, each on a fresh 2-worker tokio runtime with `--in-flight`
//! tasks reading in a loop: `spawn-blocking` (`spawn_blocking` +
//! `FileExt::read_at` into a new buffer), `pool` (the crate's default route
//! for FUSE files: `pread` on the blocking pool, `ctx.read` into the task's
//! buffer through a bounce buffer), `pool-owned` (the same route with
//! `ctx.read_owned`: the task's one buffer goes to the read and comes back,
//! no copy) and `ring` (the crate with
//! `fuse_via_blocking_pool(false)`: the rings, with `IOSQE_ASYNC`). A 1 ms
//! interval timer on the same runtime reports its worst gap. Before the
//! measured rounds, one short unmeasured cell of each engine (thread pools
//! and the server warmed); each round runs the engines in a rotated order,
//! and the ratios are per round, against `spawn-blocking` in the same
//! round, then the median.

use std::collections::BinaryHeap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, INodeNo, KernelConfig, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
};
use uring_positioned_io::UringContext;

use crate::cli::{SlowCache, SlowFileArgs};
use crate::fuse_file::{Mount, OneFile, INO};

use crate::kinds::DEFAULT_SEED;
use crate::machine::loadavg;
use crate::verify::{fill_block, verify_block, VerifyMode, BLOCK};

const MIB: u64 = 1 << 20;
const FILE_LEN: u64 = 1 << 40;
const NAME: &str = "slow";
/// The dataset file number the blocks carry.
const FILE_NO: u32 = 0;
/// Measured seconds of each warm-up cell.
const WARM_UP_SECS: f64 = 0.5;

/// How long a read of the MiB `mib` takes: 1 to `max` ms, each once in
/// every `max` MiB.
fn delay_of(mib: u64, max: u64) -> Duration {
    Duration::from_millis(1 + (mib * 7) % max)
}

/// A reply due at `at`.
struct Due {
    at: Instant,
    reply: ReplyData,
    offset: u64,
    size: u32,
}

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    /// Earliest first in a max-heap.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.cmp(&self.at)
    }
}

/// The bytes of `size` at `offset` (within the file): dataset blocks.
fn content(offset: u64, size: u32) -> Vec<u8> {
    let end = (offset + u64::from(size)).min(FILE_LEN);
    let first = offset / BLOCK as u64;
    let last = end.div_ceil(BLOCK as u64);
    let mut blocks = vec![0u8; ((last - first) as usize) * BLOCK];
    for (k, chunk) in blocks.chunks_exact_mut(BLOCK).enumerate() {
        fill_block(DEFAULT_SEED, FILE_NO, first + k as u64, chunk);
    }
    let from = (offset - first * BLOCK as u64) as usize;
    blocks.drain(..from);
    blocks.truncate((end - offset) as usize);
    blocks
}

/// The timer thread: replies to each read at its time; once every sender
/// is gone, replies to the rest at once and ends.
fn timer_loop(rx: mpsc::Receiver<Due>) {
    let mut heap = BinaryHeap::new();
    let mut open = true;
    while open || !heap.is_empty() {
        let now = Instant::now();
        while heap.peek().is_some_and(|d: &Due| d.at <= now || !open) {
            let d = heap.pop().expect("peeked");
            d.reply.data(&content(d.offset, d.size));
        }
        let wait = heap.peek().map_or(Duration::from_secs(3600), |d| {
            d.at.saturating_duration_since(now)
        });
        match rx.recv_timeout(wait) {
            Ok(d) => heap.push(d),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
        }
        while let Ok(d) = rx.try_recv() {
            heap.push(d);
        }
    }
}

struct SlowFs {
    file: OneFile,
    direct_io: bool,
    max_delay_ms: u64,
    timer: std::sync::Mutex<mpsc::Sender<Due>>,
}

impl Filesystem for SlowFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Hundreds of reads are delayed at once: let the kernel send them.
        let _ = config.set_max_background(1024);
        let _ = config.set_congestion_threshold(1000);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.file.lookup(parent, name, reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.file.getattr(ino, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fopen = if self.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        };
        self.file.open(ino, flags, fopen, reply);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if u64::from(ino) != INO {
            return reply.error(Errno::ENOENT);
        }
        let at = Instant::now() + delay_of(offset / MIB, self.max_delay_ms);
        let due = Due {
            at,
            reply,
            offset,
            size,
        };
        let sent = self
            .timer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send(due);
        if let Err(mpsc::SendError(d)) = sent {
            d.reply.data(&content(d.offset, d.size));
        }
    }
}

/// The mounted file system; unmounted on drop (after every delayed read
/// is answered).
struct Mounted {
    mount: Option<Mount>,
    path: PathBuf,
    timer: Option<std::thread::JoinHandle<()>>,
}

impl Mounted {
    fn mount(direct_io: bool, max_delay_ms: u64) -> Result<Mounted, String> {
        let (tx, rx) = mpsc::channel();
        let timer = std::thread::Builder::new()
            .name("slowfs-timer".into())
            .spawn(move || timer_loop(rx))
            .map_err(|e| format!("spawn the timer thread: {e}"))?;
        let fs = SlowFs {
            file: OneFile::new(NAME, FILE_LEN),
            direct_io,
            max_delay_ms,
            timer: std::sync::Mutex::new(tx),
        };
        // Without a mount, the file system (and the timer's sender) is
        // dropped: the timer ends.
        let mount = Mount::new(fs, "slowfs", NAME)?;
        Ok(Mounted {
            path: mount.path.clone(),
            mount: Some(mount),
            timer: Some(timer),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // Unmounting ends the session, which drops the file system and
        // with it the timer's sender: the timer answers what is left.
        drop(self.mount.take());
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

use crate::cli::SlowEngine as Engine;

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::SpawnBlocking => "spawn-blocking",
            Engine::Pool => "pool",
            Engine::PoolOwned => "pool-owned",
            Engine::Ring => "ring",
        }
    }
}

/// One cell's outcome.
struct Cell {
    reads_per_sec: f64,
    timer_gap: Duration,
    /// The crate's engines: the share of reads that waited for an
    /// in-flight slot (its stats).
    waited: Option<f64>,
}

/// `engine` for `secs` with `a.in_flight` tasks; `next` hands out blocks.
fn cell(
    engine: Engine,
    path: &std::path::Path,
    a: &SlowFileArgs,
    secs: f64,
    next: &Arc<AtomicU64>,
) -> Result<Cell, String> {
    let (in_flight, max_blocking_threads) = (a.in_flight, a.max_blocking_threads as usize);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(max_blocking_threads)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let open = || File::open(path).map_err(|e| format!("{}: {e}", path.display()));
    let file = Arc::new(open()?);
    let ctx = match engine {
        Engine::SpawnBlocking => None,
        Engine::Pool | Engine::PoolOwned | Engine::Ring => Some(rt.block_on(async {
            UringContext::builder()
                .fuse_via_blocking_pool(engine != Engine::Ring)
                .build(vec![open()?])
                .map_err(|e| e.to_string())
        })?),
    };
    let next = next.clone();
    rt.block_on(async move {
        let started = Instant::now();
        let stop = started + Duration::from_secs_f64(secs);
        let ticker = tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let mut last = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            while Instant::now() < stop {
                tick.tick().await;
                let now = Instant::now();
                worst = worst.max(now - last);
                last = now;
            }
            worst
        });
        let mut tasks = Vec::new();
        for _ in 0..in_flight {
            let (ctx, file, next) = (ctx.clone(), file.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                let mut buf = vec![0u8; BLOCK];
                while Instant::now() < stop {
                    let block = next.fetch_add(1, Ordering::Relaxed) % (FILE_LEN / BLOCK as u64);
                    let off = block * BLOCK as u64;
                    let got = if let Some(ctx) = &ctx {
                        if engine == Engine::PoolOwned {
                            let (got, b) =
                                ctx.read_owned(0u32, off, std::mem::take(&mut buf)).await;
                            buf = b;
                            got.map_err(|e| e.to_string())?
                        } else {
                            ctx.read(0u32, off, &mut buf)
                                .await
                                .map_err(|e| e.to_string())?
                        }
                    } else {
                        let file = file.clone();
                        let (got, b) = tokio::task::spawn_blocking(move || {
                            let mut b = vec![0u8; BLOCK];
                            (file.read_at(&mut b, off), b)
                        })
                        .await
                        .map_err(|e| e.to_string())?;
                        buf = b;
                        got.map_err(|e| e.to_string())?
                    };
                    verify_block(
                        VerifyMode::Checksum,
                        DEFAULT_SEED,
                        FILE_NO,
                        block,
                        &buf[..got],
                    )
                    .map_err(|e| e.to_string())?;
                    n += 1;
                }
                Ok::<_, String>(n)
            }));
        }
        let mut reads = 0;
        for t in tasks {
            reads += t.await.map_err(|e| e.to_string())??;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let timer_gap = ticker.await.map_err(|e| e.to_string())?;
        let waited = ctx.map(|c| {
            let l = c.stats().latency;
            l.waited as f64 / l.ops.max(1) as f64
        });
        Ok(Cell {
            reads_per_sec: reads as f64 / elapsed,
            timer_gap,
            waited,
        })
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn run(a: &SlowFileArgs) -> Result<bool, String> {
    let max = a.max_delay_ms;
    // The mean delay over any `max` consecutive MiB.
    let mean_ms = (1..=max).sum::<u64>() as f64 / max as f64;
    let ideal = a.in_flight as f64 / (mean_ms / 1e3);
    let next = Arc::new(AtomicU64::new(0));
    for &cache in &a.cache {
        let direct_io = cache == SlowCache::Direct;
        let fs = match Mounted::mount(direct_io, max) {
            Ok(fs) => fs,
            Err(why) => {
                println!("slow-file: skipped: {why}");
                return Ok(true);
            }
        };
        let what = if direct_io {
            "FUSE direct_io (no page cache)"
        } else {
            "FUSE through the page cache"
        };
        println!(
            "== slow file, {what}: {} reads in flight, 1-{max} ms a read (mean {mean_ms:.1} ms: at most {ideal:.0} reads/s), max_blocking_threads {}, {} s cells, {} rounds (load {})",
            a.in_flight,
            a.max_blocking_threads,
            a.secs,
            a.repeat,
            loadavg()
        );
        let engines = &a.engines;
        for &e in engines {
            cell(e, &fs.path, a, WARM_UP_SECS, &next)?;
        }
        let mut rows: Vec<Vec<Cell>> = engines.iter().map(|_| Vec::new()).collect();
        for round in 0..a.repeat as usize {
            for k in 0..engines.len() {
                let i = (round + k) % engines.len();
                rows[i].push(cell(engines[i], &fs.path, a, a.secs, &next)?);
            }
        }
        let base = engines.iter().position(|&e| e == Engine::SpawnBlocking);
        println!(
            "{:>15} {:>10} {:>17} {:>15} {:>14} {:>12}",
            "engine", "reads/s", "min-max", "x spawn-block.", "timer gap ms", "slot waits"
        );
        let ratios = |i: usize| -> Vec<f64> {
            base.map_or_else(Vec::new, |b| {
                rows[i]
                    .iter()
                    .zip(&rows[b])
                    .map(|(c, b)| c.reads_per_sec / b.reads_per_sec)
                    .collect()
            })
        };
        for (i, e) in engines.iter().enumerate() {
            let r: Vec<f64> = rows[i].iter().map(|c| c.reads_per_sec).collect();
            let gap = median(
                rows[i]
                    .iter()
                    .map(|c| c.timer_gap.as_secs_f64() * 1e3)
                    .collect(),
            );
            let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = r.iter().copied().fold(0.0, f64::max);
            let waits: Vec<f64> = rows[i].iter().filter_map(|c| c.waited).collect();
            let waits = if waits.is_empty() {
                "-".to_string()
            } else {
                format!("{:.0} %", median(waits) * 100.0)
            };
            println!(
                "{:>15} {:>10.0} {:>17} {:>15.2} {:>14.1} {:>12}",
                e.name(),
                median(r.clone()),
                format!("{lo:.0}-{hi:.0}"),
                median(ratios(i)),
                gap,
                waits
            );
        }
        if base.is_some() {
            let per_round: Vec<String> = engines
                .iter()
                .enumerate()
                .filter(|&(_, &e)| e != Engine::SpawnBlocking)
                .map(|(i, e)| {
                    let r: Vec<String> = ratios(i).iter().map(|x| format!("{x:.2}")).collect();
                    format!("{} {}", e.name(), r.join(", "))
                })
                .collect();
            println!("per round, x spawn-blocking: {}", per_round.join("; "));
        }
        println!("(every block read verified)");
        drop(fs);
    }
    Ok(true)
}
