//! Random positioned reads of a file through a `UringContext`, with every
//! block checked against `pread`, then one owned, spawned read.
//!
//! ```text
//! cargo run --release --example quickstart -- [path] [reads]
//! ```
//! Without a path, a 64 MiB temporary file is written first.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use uring_positioned_io::{AlignedBuf, UringContext};

const BLOCK: usize = 4096;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let file = match args.next() {
        Some(path) => File::open(path)?,
        None => {
            let mut f = tempfile::tempfile()?;
            let block: Vec<u8> = (0..BLOCK).map(|i| (i * 7 % 251) as u8).collect();
            for i in 0..(64 << 20) / BLOCK {
                let mut b = block.clone();
                b[..8].copy_from_slice(&(i as u64).to_le_bytes());
                f.write_all(&b)?;
            }
            f
        }
    };
    let reads: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let blocks = (file.metadata()?.len() / BLOCK as u64).max(1);
    let check = file.try_clone()?;

    let ctx = UringContext::new(vec![file])?;
    println!("backend: {}", ctx.backend());

    let start = Instant::now();
    let tasks: Vec<_> = (0..64u64)
        .map(|t| {
            let ctx = ctx.clone();
            let check = check.try_clone().expect("dup fd");
            tokio::spawn(async move {
                let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let (mut buf, mut want) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
                for _ in 0..reads / 64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (x % blocks) * BLOCK as u64;
                    let n = ctx.read(0, off, &mut buf).await?;
                    let m = check.read_at(&mut want, off)?;
                    assert_eq!(buf[..n], want[..m], "block at {off} differs from pread");
                }
                std::io::Result::Ok(())
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("reader task")?;
    }
    let el = start.elapsed();

    // An owned read: a checked id, an aligned buffer filled from its start
    // up to its capacity with no copy, and the future ('static: it holds a handle to
    // the context) spawned as it is.
    let fid = ctx.file_id(0)?;
    let block = AlignedBuf::with_capacity(BLOCK, BLOCK);
    let (n, block) = tokio::spawn(ctx.read_owned_static(fid, 0, block)).await?;
    let mut want = vec![0u8; BLOCK];
    let m = check.read_at(&mut want, 0)?;
    assert_eq!(
        (n?, block.as_slice()),
        (m, &want[..m]),
        "owned read differs from pread"
    );

    let s = ctx.stats();
    println!(
        "{} reads in {:.2?} ({:.0} reads/s incl. pread check); {} inline page-cache hits, {} through the ring, {:.1} reads per io_uring_enter",
        reads / 64 * 64,
        el,
        (reads / 64 * 64) as f64 / el.as_secs_f64(),
        s.inline_completed,
        s.submitted,
        s.reads_per_enter()
    );
    ctx.shutdown().await;
    Ok(())
}
