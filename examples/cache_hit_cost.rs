//! What a block cache hit costs against an `mmap` read of the same cached
//! block, and against the bound for any user-space cache: the block's bytes
//! at a known address in huge pages, with no lookup at all.
//!
//! ```sh
//! cargo run --release --features cache --example cache_hit_cost -- [MiB] [rounds]
//! ```
//!
//! Writes a file of `MiB` MiB (default 1024) in the system's temporary
//! directory, reads it into the page cache, maps it (`MAP_POPULATE`,
//! `MADV_RANDOM`), copies it into an anonymous huge-page arena, and fills a
//! [`BlockCache`] with every block. Then, on one thread, it reads random
//! 4 KiB blocks five ways in turn, 100 ms each, for `rounds` rounds
//! (default 20), and prints each way's median nanoseconds per read and its
//! median ratio to `mmap` within a round (so that a noisy neighbour slows
//! every way of a round alike):
//!
//! - `mmap`: copy the block out of the mapping, then sum it;
//! - `get`: `cache.get(file, block)`, sum the `BlockRef` in place;
//! - `read`: `cache.read(file, offset, &mut buf)`, sum the copy;
//! - `get_many16`: `cache.get_many(file, blocks)` of 16 blocks at a time,
//!   sum each in place (the time per block);
//! - `arena-ref`: sum the block in the arena in place (no lookup);
//! - `arena-copy`: copy the block out of the arena, then sum it;
//! - `table-copy`: `arena-copy` after the least lookup any cache makes:
//!   the block's 4-byte entry in a table (its frame's number) and a check
//!   of the frame's 32-byte tag, both in huge pages.
//!
//! Every way touches all 4 KiB of every block it reads. The arena ways are
//! what a cache's lookup has to be added to; the gap between `get` and
//! `arena-ref` is the whole cost of the lookup, pin and bookkeeping, and
//! the gap between `read` and `table-copy` that of everything a `read` hit
//! does besides one table load, one tag check and the copy.

use std::io::{self, Write as _};
use std::time::{Duration, Instant};

use uring_positioned_io::{BlockCache, CacheOptions, UringContext};

const BLOCK: usize = 4096;
const WAYS: [&str; 7] = [
    "mmap",
    "get",
    "read",
    "get_many16",
    "arena-ref",
    "arena-copy",
    "table-copy",
];

/// Sums a block as eight independent lanes (the compiler vectorises it).
fn sum(b: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    for c in b.chunks_exact(64) {
        for (l, a) in acc.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[l * 8..l * 8 + 8].try_into().expect("8 bytes"));
            *a = a.wrapping_add(w);
        }
    }
    acc.iter().fold(0, |x, y| x.wrapping_add(*y))
}

/// xorshift64: the blocks to read.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mib: usize = args
        .next()
        .map_or(Ok(1024), |a| a.parse())
        .map_err(io::Error::other)?;
    let rounds: usize = args
        .next()
        .map_or(Ok(20), |a| a.parse())
        .map_err(io::Error::other)?;
    if mib == 0 || rounds == 0 {
        return Err(io::Error::other("MiB and rounds must be at least 1"));
    }
    let len = mib << 20;
    let blocks = (len / BLOCK) as u64;

    let mut file = tempfile::tempfile()?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..mib {
        for w in chunk.chunks_exact_mut(8) {
            w.copy_from_slice(&rng.next().to_le_bytes());
        }
        file.write_all(&chunk)?;
    }
    // SAFETY: a read-only mapping of a file nothing writes while it is
    // mapped (the temporary file is this process's alone).
    let map = unsafe { memmap2::MmapOptions::new().populate().map(&file)? };
    map.advise(memmap2::Advice::Random)?;
    let mut arena = memmap2::MmapOptions::new().len(len).map_anon()?;
    arena.advise(memmap2::Advice::HugePage)?;
    arena.copy_from_slice(&map);
    // The least lookup: a frame number per block and a tag per frame (here
    // frame `b` holds block `b`; the loads depend on each other all the
    // same).
    let mut table = memmap2::MmapOptions::new()
        .len(len / BLOCK * 4)
        .map_anon()?;
    table.advise(memmap2::Advice::HugePage)?;
    let mut tags = memmap2::MmapOptions::new()
        .len(len / BLOCK * 32)
        .map_anon()?;
    tags.advise(memmap2::Advice::HugePage)?;
    for b in 0..len / BLOCK {
        table[b * 4..b * 4 + 4]
            .copy_from_slice(&u32::try_from(b).expect("below 2^32").to_le_bytes());
        tags[b * 32..b * 32 + 8].copy_from_slice(&(b as u64).to_le_bytes());
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ctx = rt.block_on(async { UringContext::new(vec![file.try_clone()?]) })?;
    let cache = BlockCache::new(
        &ctx,
        CacheOptions {
            capacity_bytes: (len + len / 16) as u64,
            block_size: BLOCK,
        },
    )?;
    rt.block_on(async {
        for first in (0..blocks).step_by(256) {
            for b in cache.get_many(0, first..(first + 256).min(blocks)).await {
                b?;
            }
        }
        io::Result::Ok(())
    })?;

    let (map, arena, table, tags) = (&map[..], &arena[..], &table[..], &tags[..]);
    let mut buf = vec![0u8; BLOCK];
    let mut sink = 0u64;
    let mut per_read: Vec<[f64; 7]> = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut ns = [0f64; 7];
        for (way, ns) in ns.iter_mut().enumerate() {
            let start = Instant::now();
            let mut reads = 0u64;
            rt.block_on(async {
                while start.elapsed() < Duration::from_millis(100) {
                    if way == 3 {
                        for _ in 0..4 {
                            let many: Vec<u64> = (0..16).map(|_| rng.next() % blocks).collect();
                            for b in cache.get_many(0, many).await {
                                sink = sink.wrapping_add(sum(&b?));
                            }
                            reads += 16;
                        }
                        continue;
                    }
                    for _ in 0..64 {
                        let block = rng.next() % blocks;
                        let at = block as usize * BLOCK;
                        sink = sink.wrapping_add(match way {
                            0 => {
                                buf.copy_from_slice(&map[at..at + BLOCK]);
                                sum(&buf)
                            }
                            1 => sum(&cache.get(0, block).await?),
                            2 => {
                                cache.read(0, at as u64, &mut buf).await?;
                                sum(&buf)
                            }
                            4 => sum(&arena[at..at + BLOCK]),
                            6 => {
                                let e = &table[block as usize * 4..][..4];
                                let f = u32::from_le_bytes(e.try_into().expect("4 bytes")) as usize;
                                let tag = &tags[f * 32..][..8];
                                if u64::from_le_bytes(tag.try_into().expect("8 bytes")) != block {
                                    return Err(io::Error::other("a tag that is not its block's"));
                                }
                                buf.copy_from_slice(&arena[f * BLOCK..(f + 1) * BLOCK]);
                                sum(&buf)
                            }
                            _ => {
                                buf.copy_from_slice(&arena[at..at + BLOCK]);
                                sum(&buf)
                            }
                        });
                        reads += 1;
                    }
                }
                io::Result::Ok(())
            })?;
            *ns = start.elapsed().as_nanos() as f64 / reads as f64;
        }
        per_read.push(ns);
    }
    let stats = cache.stats();
    println!(
        "{mib} MiB, {rounds} rounds of 100 ms per way; cache: {} hits, {} misses during the rounds and fill",
        stats.hits, stats.misses
    );
    println!("{:<11} {:>8} {:>8}", "way", "ns/read", "× mmap");
    for (w, name) in WAYS.iter().enumerate() {
        let ns = median(per_read.iter().map(|r| r[w]).collect());
        let ratio = median(per_read.iter().map(|r| r[0] / r[w]).collect());
        println!("{name:<11} {ns:>8.0} {ratio:>7.2}×");
    }
    // Keeps the sums (and so the reads) from being optimised away.
    std::hint::black_box(sink);
    Ok(())
}
