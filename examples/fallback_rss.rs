//! RSS of a process using the fallback backend (`pread` on tokio's blocking
//! pool) under blocking-thread churn: bursts of mixed operations (borrowed
//! reads, writes, `fdatasync`, `statx`, batches of reads) from many tasks,
//! each followed by an idle pause longer than the runtime's
//! `thread_keep_alive`, so that the blocking threads exit and the next
//! burst creates new ones. One line per cycle: operations so far, threads
//! created so far, most threads alive during the burst, RSS at the end of
//! the burst (threads still alive) and after the pause, and what
//! glibc's malloc holds (`mallinfo2`: arenas, bytes from the system, in
//! use, free), and operations per second of burst time so far.
//!
//! ```sh
//! nice -n 10 cargo run --release --example fallback_rss -- [options]
//! ```
//!
//! Options (all optional):
//! - `--cycles N` bursts (default 20)
//! - `--ops N` operations per burst (default 20000)
//! - `--tasks N` tasks issuing them at once (default 256)
//! - `--in-flight N` `Builder::max_in_flight` (default: the builder's)
//! - `--keep-alive-ms N` the runtime's `thread_keep_alive` (default 300;
//!   tokio's own default is 10 s)
//! - `--max-blocking N` the runtime's `max_blocking_threads` (default: tokio's, 512)
//! - `--pause-ms N` idle time after each burst (default: keep-alive + 700)
//! - `--max-kib N` largest read or write, a power of two (default 1024)
//! - `--per-arena` prints each malloc arena's size after each cycle
//! - `--vary` draws each burst's tasks from `tasks/8..=tasks` and each
//!   pause from `0..=2 * keep-alive`, so that threads exit and are created
//!   while others are busy
//! - `--owned` reads and writes owned buffers (`read_owned`, `write_owned`:
//!   no bounce buffer) instead of borrowed ones
//! - `--fresh` gives each borrowed read or write a buffer of its own
//!   (allocated and freed around it, as `--owned` does) instead of one
//!   per task
//! - `--trim` calls `malloc_trim(0)` after each pause (to tell memory that
//!   malloc could give back from memory it cannot)
//! - `--stack-kib N` the runtime's `thread_stack_size` (default: Rust's, 2 MiB)

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uring_positioned_io::{BackendChoice, UringContext};

const DATA_LEN: u64 = 64 << 20;

fn arg(args: &[String], name: &str) -> Option<u64> {
    args.iter()
        .position(|a| a == name)
        .map(|i| args[i + 1].parse().expect("a number after the option"))
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .map_or(0, |v| {
            v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0)
        })
}

fn mallinfo() -> libc::mallinfo2 {
    // SAFETY: mallinfo2 only reads malloc's statistics.
    unsafe { libc::mallinfo2() }
}

/// The number of malloc arenas (main included): `<heap nr=` entries of
/// `malloc_info`.
fn arenas() -> usize {
    malloc_info_xml().matches("<heap nr=").count()
}

/// Each arena's (system bytes, free bytes) in MiB, from `malloc_info`.
fn arena_sizes() -> Vec<(f64, f64)> {
    let xml = malloc_info_xml();
    let num = |s: &str, key: &str| -> f64 {
        s.find(key).map_or(0.0, |i| {
            let rest = &s[i + key.len()..];
            let end = rest.find('"').unwrap_or(0);
            rest[..end].parse::<f64>().unwrap_or(0.0) / 1048576.0
        })
    };
    xml.split("<heap nr=")
        .skip(1)
        .map(|h| {
            let h = h.split("</heap>").next().unwrap_or("");
            let sys = h
                .find("<system type=\"current\"")
                .map_or(0.0, |i| num(&h[i..], "size=\""));
            let free = h
                .find("<total type=\"fast\"")
                .map_or(0.0, |i| num(&h[i..], "size=\""))
                + h.find("<total type=\"rest\"")
                    .map_or(0.0, |i| num(&h[i..], "size=\""));
            (sys, free)
        })
        .collect()
}

fn malloc_info_xml() -> String {
    let mut out = Vec::<u8>::new();
    // SAFETY: open_memstream gives a FILE* writing into a malloc'd buffer
    // that we free after fclose; malloc_info writes its XML there.
    unsafe {
        let mut ptr: *mut libc::c_char = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        let f = libc::open_memstream(&raw mut ptr, &raw mut len);
        assert!(!f.is_null(), "open_memstream");
        libc::malloc_info(0, f);
        libc::fclose(f);
        out.extend_from_slice(std::slice::from_raw_parts(ptr.cast::<u8>(), len));
        libc::free(ptr.cast());
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn one_op(
    ctx: &UringContext,
    rng: &mut u64,
    buf: &mut Vec<u8>,
    max_shift: u64,
    owned: bool,
    fresh: bool,
) -> std::io::Result<()> {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let r = *rng;
    let kind = r % 10;
    let size = 4096usize << ((r >> 8) % (max_shift + 1)); // 4 KiB ..= max
    let offset = ((r >> 16) % (DATA_LEN / 4096)) * 4096;
    let offset = offset.min(DATA_LEN - size as u64);
    match kind {
        0..=3 if owned => {
            let (n, _) = ctx.read_owned(0u32, offset, Vec::with_capacity(size)).await;
            n?;
        }
        4 | 5 if owned => {
            let size = size.min(256 << 10);
            let (n, _) = ctx
                .write_owned(1u32, offset % (16 << 20), vec![7u8; size])
                .await;
            n?;
        }
        0..=3 if fresh => {
            ctx.read(0u32, offset, &mut vec![0u8; size]).await?;
        }
        4 | 5 if fresh => {
            let size = size.min(256 << 10);
            ctx.write(1u32, offset % (16 << 20), &vec![7u8; size])
                .await?;
        }
        0..=3 => {
            buf.resize(size, 0);
            ctx.read(0u32, offset, &mut buf[..size]).await?;
        }
        4 | 5 => {
            let size = size.min(256 << 10);
            buf.resize(size, 7);
            ctx.write(1u32, offset % (16 << 20), &buf[..size]).await?;
        }
        6 => ctx.fdatasync(1u32).await?,
        7 => {
            ctx.statx(0u32).await?;
        }
        _ => {
            let n = 8u64;
            let reads = (0..n).map(|i| {
                (
                    0u32,
                    (offset + i * 65536) % (DATA_LEN - 65536),
                    Vec::with_capacity(4096 << (i % 5)),
                )
            });
            for (res, _) in ctx.read_batch(reads).await {
                res?;
            }
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let cycles = arg(&args, "--cycles").unwrap_or(20);
    let ops = arg(&args, "--ops").unwrap_or(20_000);
    let tasks = arg(&args, "--tasks").unwrap_or(256);
    let keep_alive = Duration::from_millis(arg(&args, "--keep-alive-ms").unwrap_or(300));
    let pause = arg(&args, "--pause-ms").map_or(keep_alive + Duration::from_millis(700), |ms| {
        Duration::from_millis(ms)
    });
    let trim = args.iter().any(|a| a == "--trim");
    let owned = args.iter().any(|a| a == "--owned");
    let fresh = args.iter().any(|a| a == "--fresh");
    // Largest read or write: 4 KiB << max_shift.
    let max_shift = u64::from((arg(&args, "--max-kib").unwrap_or(1024) / 4).max(1).ilog2());

    let created = Arc::new(AtomicU64::new(0));
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.worker_threads(2)
        .enable_all()
        .thread_keep_alive(keep_alive)
        .on_thread_start({
            let created = created.clone();
            move || {
                created.fetch_add(1, Ordering::Relaxed);
            }
        });
    if let Some(n) = arg(&args, "--max-blocking") {
        rt.max_blocking_threads(n as usize);
    }
    if let Some(kib) = arg(&args, "--stack-kib") {
        rt.thread_stack_size(kib as usize * 1024);
    }
    let rt = rt.build()?;

    let dir = tempfile::tempdir()?;
    let data = std::fs::File::create(dir.path().join("data"))?;
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for i in 0..DATA_LEN >> 20 {
        data.write_all_at(&chunk, i << 20)?;
    }
    drop(data);
    let files = vec![
        std::fs::File::open(dir.path().join("data"))?,
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("log"))?,
    ];
    let mut builder = UringContext::builder().backend(BackendChoice::Fallback);
    if let Some(n) = arg(&args, "--in-flight") {
        builder = builder.max_in_flight(n as usize);
    }
    let ctx = Arc::new({
        let _enter = rt.enter();
        builder.build(files)?
    });
    println!(
        "# {}; cycles {cycles}, ops {ops}, tasks {tasks}, keep-alive {keep_alive:?}, pause {pause:?}, max-blocking {:?}, trim {trim}",
        ctx.backend(),
        arg(&args, "--max-blocking")
    );
    println!(
        "cycle  ops_total  threads_created  threads_peak  busy_rss_mib  rss_mib  anon_mib  arenas  malloc_arena_mib  malloc_mmap_mib  in_use_mib  free_mib  secs  kops_per_burst_s"
    );
    let start = Instant::now();
    let done_ops = Arc::new(AtomicU64::new(0));
    let mut burst_secs = 0.0;
    let vary = args.iter().any(|a| a == "--vary");
    let mut cycle_rng = 0x2545_F491_4F6C_DD1Du64;
    for cycle in 0..=cycles {
        cycle_rng ^= cycle_rng << 13;
        cycle_rng ^= cycle_rng >> 7;
        cycle_rng ^= cycle_rng << 17;
        let (tasks, pause) = if vary {
            // Some bursts need fewer threads than the last and some pauses
            // are shorter than the keep-alive: threads exit and are created
            // while others are busy.
            let t = tasks / 8 + cycle_rng % (tasks - tasks / 8 + 1);
            let p = (cycle_rng >> 32) % (2 * keep_alive.as_millis() as u64 + 1);
            (t, Duration::from_millis(p))
        } else {
            (tasks, pause)
        };
        let mut peak = 0;
        let mut busy_rss = 0;
        let burst = Instant::now();
        if cycle > 0 {
            peak = rt.block_on(async {
                let left = Arc::new(AtomicU64::new(ops));
                let mut handles = Vec::new();
                for t in 0..tasks {
                    let ctx = ctx.clone();
                    let left = left.clone();
                    let done_ops = done_ops.clone();
                    handles.push(tokio::spawn(async move {
                        let mut rng = ((cycle << 32) | t).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                        let mut buf = Vec::new();
                        while left
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            })
                            .is_ok()
                        {
                            one_op(&ctx, &mut rng, &mut buf, max_shift, owned, fresh)
                                .await
                                .expect("op");
                            done_ops.fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                }
                let peak = Arc::new(AtomicU64::new(0));
                let watch = tokio::spawn({
                    let peak = peak.clone();
                    async move {
                        loop {
                            peak.fetch_max(status_kib("Threads:"), Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                });
                for h in handles {
                    h.await.expect("task");
                }
                watch.abort();
                let peak = peak.load(Ordering::Relaxed).max(status_kib("Threads:"));
                busy_rss = status_kib("VmRSS:");
                peak
            });
            burst_secs += burst.elapsed().as_secs_f64();
            std::thread::sleep(pause);
            if trim {
                // SAFETY: malloc_trim only returns free memory to the system.
                unsafe { libc::malloc_trim(0) };
            }
        }
        let mi = mallinfo();
        println!(
            "{cycle:5}  {:9}  {:15}  {:12}  {:12.1}  {:7.1}  {:8.1}  {:6}  {:16.1}  {:15.1}  {:10.1}  {:8.1}  {:4.0}  {:16.1}",
            done_ops.load(Ordering::Relaxed),
            created.load(Ordering::Relaxed),
            peak,
            mib(busy_rss),
            mib(status_kib("VmRSS:")),
            mib(status_kib("RssAnon:")),
            arenas(),
            mi.arena as f64 / 1048576.0,
            mi.hblkhd as f64 / 1048576.0,
            mi.uordblks as f64 / 1048576.0,
            mi.fordblks as f64 / 1048576.0,
            start.elapsed().as_secs_f64(),
            done_ops.load(Ordering::Relaxed) as f64 / 1000.0 / burst_secs.max(1e-9),
        );
        if args.iter().any(|a| a == "--per-arena") {
            let sizes: Vec<String> = arena_sizes()
                .iter()
                .map(|(sys, free)| format!("{sys:.1}/{free:.1}"))
                .collect();
            println!("#   arenas (MiB from the system/free): {}", sizes.join(" "));
        }
    }
    drop(ctx);
    drop(rt);
    Ok(())
}
