//! CPU per read and throughput on cached data: this crate against a raw
//! io-uring loop, in the same run.
//!
//! ```text
//! cargo bench --bench cpu_per_read -- [--secs S] [--file-mib M] [--depths 32,512]
//! ```
//!
//! Regime: one file of M MiB (default 1024) in the page cache (read once
//! before timing), random aligned 4 KiB reads, every block verified. CPU per
//! read is (user + sys) / reads from getrusage over the timed part.
//! Engines:
//! - `raw-ring`: one thread, one ring, fixed file, keeps `depth` reads in
//!   flight, submits a batch per enter and reaps (the floor for ring overhead);
//! - `crate ring/1w`: this crate, ring path only (`inline_nowait(false)`),
//!   current_thread runtime, one ring;
//! - `crate ring/2w`: ring path only, multi_thread with 2 workers, 2 rings;
//! - `crate nowait/2w`: the default (page-cache hits served inline with
//!   RWF_NOWAIT), multi_thread with 2 workers.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};
use uring_positioned_io::UringContext;

const BLOCK: usize = 4096;

fn word(block: u64) -> u64 {
    block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03
}

fn fill(block: u64, buf: &mut [u8]) {
    let w = word(block);
    for (i, c) in buf.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&(w.wrapping_add(i as u64)).to_le_bytes());
    }
}

fn verify(block: u64, buf: &[u8]) {
    let w = word(block);
    let first = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let last = u64::from_le_bytes(buf[BLOCK - 8..].try_into().unwrap());
    assert!(
        first == w && last == w.wrapping_add((BLOCK / 8 - 1) as u64),
        "block {block} has wrong contents"
    );
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct Cell {
    reads: u64,
    wall: Duration,
    cpu: Duration,
    per_enter: f64,
}

impl Cell {
    fn rate(&self) -> f64 {
        self.reads as f64 / self.wall.as_secs_f64()
    }
    fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.reads as f64
    }
}

fn raw_ring(file: &File, blocks: u64, depth: usize, secs: f64) -> Cell {
    let mut ring = IoUring::new(depth.next_power_of_two() as u32).expect("io_uring");
    ring.submitter()
        .register_files(&[file.as_raw_fd()])
        .expect("register file");
    let mut bufs = vec![vec![0u8; BLOCK]; depth];
    let mut blk = vec![0u64; depth];
    let mut rng = Rng(0x1234_5678);
    let (mut reads, mut enters) = (0u64, 0u64);
    let push = |ring: &mut IoUring, i: usize, b: u64, buf: &mut Vec<u8>| {
        let e = opcode::Read::new(types::Fixed(0), buf.as_mut_ptr(), BLOCK as u32)
            .offset(b * BLOCK as u64)
            .build()
            .user_data(i as u64);
        // SAFETY: buf is one of `bufs`, alive and untouched until its CQE is reaped.
        unsafe { ring.submission().push(&e).expect("sq has room") };
    };
    for i in 0..depth {
        blk[i] = rng.next() % blocks;
        push(&mut ring, i, blk[i], &mut bufs[i]);
    }
    let mut in_flight = depth;
    let (t0, c0) = (Instant::now(), cpu_time());
    let deadline = t0 + Duration::from_secs_f64(secs);
    // Once the deadline passes, nothing new is pushed and the loop drains
    // what is in flight before the buffers go away.
    while in_flight > 0 {
        ring.submit_and_wait(1).expect("enter");
        enters += 1;
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        let stop = Instant::now() >= deadline;
        for (i, res) in done {
            assert_eq!(res, BLOCK as i32, "raw read failed");
            verify(blk[i], &bufs[i]);
            reads += 1;
            in_flight -= 1;
            if !stop {
                blk[i] = rng.next() % blocks;
                push(&mut ring, i, blk[i], &mut bufs[i]);
                in_flight += 1;
            }
        }
    }
    Cell {
        reads,
        wall: t0.elapsed(),
        cpu: cpu_time() - c0,
        per_enter: reads as f64 / enters as f64,
    }
}

fn crate_run(
    rt: &tokio::runtime::Runtime,
    path: &PathBuf,
    blocks: u64,
    depth: usize,
    secs: f64,
    rings: usize,
    inline: bool,
) -> Cell {
    rt.block_on(async {
        let ctx = UringContext::builder()
            .rings(rings)
            .inline_nowait(inline)
            .max_in_flight(depth.max(rings))
            .build(vec![File::open(path).unwrap()])
            .expect("context");
        let s0 = ctx.stats();
        let (t0, c0) = (Instant::now(), cpu_time());
        let deadline = t0 + Duration::from_secs_f64(secs);
        let tasks: Vec<_> = (0..depth)
            .map(|t| {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let mut rng = Rng(0x9E37_79B9 ^ ((t as u64 + 1) * 0x2545_F491));
                    let mut buf = vec![0u8; BLOCK];
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let b = rng.next() % blocks;
                        let got = ctx.read(0, b * BLOCK as u64, &mut buf).await.expect("read");
                        assert_eq!(got, BLOCK);
                        verify(b, &buf);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut reads = 0;
        for t in tasks {
            reads += t.await.unwrap();
        }
        let (wall, cpu) = (t0.elapsed(), cpu_time() - c0);
        let s = ctx.stats();
        let (sub, ent) = (s.submitted - s0.submitted, s.enters - s0.enters);
        ctx.shutdown().await;
        Cell {
            reads,
            wall,
            cpu,
            per_enter: if ent == 0 {
                0.0
            } else {
                sub as f64 / ent as f64
            },
        }
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut secs, mut mib, mut depths) = (3.0, 1024u64, vec![32usize, 512]);
    let mut only: Option<String> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--secs" => secs = args.next().and_then(|s| s.parse().ok()).expect("--secs S"),
            "--file-mib" => {
                mib = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--file-mib M")
            }
            "--depths" => {
                depths = args
                    .next()
                    .expect("--depths a,b")
                    .split(',')
                    .map(|d| d.parse().expect("depth"))
                    .collect()
            }
            "--only" => only = args.next(),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let path = std::env::temp_dir().join(format!("uring-positioned-io-bench-{mib}m.dat"));
    let blocks = mib * 256;
    if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) != blocks * BLOCK as u64 {
        eprintln!("writing {} MiB to {}", mib, path.display());
        let mut f = std::io::BufWriter::new(File::create(&path).unwrap());
        let mut b = vec![0u8; BLOCK];
        for i in 0..blocks {
            fill(i, &mut b);
            f.write_all(&b).unwrap();
        }
        f.flush().unwrap();
    }
    // Warm the page cache: this benchmark is about the hot regime.
    std::io::copy(&mut File::open(&path).unwrap(), &mut std::io::sink()).unwrap();
    let file = File::open(&path).unwrap();

    let cur = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("hot page cache, {mib} MiB file, random 4 KiB reads, verified, {secs} s per cell");
    println!(
        "{:<20} {:>6} {:>12} {:>10} {:>10} {:>12}",
        "engine", "depth", "reads/s", "cpu/read", "vs raw", "reads/enter"
    );
    for &depth in &depths {
        let raw = raw_ring(&file, blocks, depth, secs);
        let run = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
        let row = |name: &str, c: &Cell| {
            println!(
                "{:<20} {:>6} {:>12.0} {:>8.2}µs {:>9.2}x {:>12.1}",
                name,
                depth,
                c.rate(),
                c.cpu_us(),
                c.cpu_us() / raw.cpu_us(),
                c.per_enter
            )
        };
        row("raw-ring (1 thread)", &raw);
        let configs = [
            ("crate ring/1w", 1, false),
            ("crate ring/2w", 2, false),
            ("crate nowait/2w", 2, true),
        ];
        for (name, workers, inline) in configs {
            if run(name) {
                let rt = if workers == 1 { &cur } else { &multi };
                row(
                    name,
                    &crate_run(rt, &path, blocks, depth, secs, workers, inline),
                );
            }
        }
    }
}
