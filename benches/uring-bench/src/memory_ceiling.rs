//! The memory ceiling of the memory-fair `hot` workload: how many uniformly
//! random 4 KiB blocks of the hot set this machine's CPUs verify per second
//! when the blocks sit in plain anonymous memory (2 MiB pages where the
//! kernel gives them, as the `BlockCache`'s frames), found by index: no
//! lookup, no runtime, no clock read, no histogram. Each thread verifies
//! the blocks as the engines do, either where they lie (what a zero-copy
//! reader must at least pay) or after copying each into its own buffer
//! (what a copy-out reader must at least pay).
//!
//! Every engine's hot reads/s sit below these figures: what separates them
//! is the engines' own work and their lookups (a page table walk for
//! `mmap`, a table and a frame header for the cache).

use std::time::{Duration, Instant};

use memmap2::{Advice, MmapMut};
use serde::Serialize;

use crate::buf::AlignedBlock;
use crate::verify::{fill_block, verify_block, VerifyMode, BLOCK};

/// Blocks verified between two looks at the clock.
const STRIDE: u64 = 256;

/// One measurement: reads/s over all threads, each way.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    pub threads: usize,
    pub bytes: u64,
    /// Share of the copy held in 2 MiB pages (`None`: not known).
    pub huge_share: Option<f64>,
    /// Blocks verified where they lie.
    pub in_place: f64,
    /// Blocks copied into the thread's buffer, then verified there.
    pub copied: f64,
}

impl Ceiling {
    /// The median of each figure over `runs` (none: `None`).
    pub fn median(runs: &[Ceiling]) -> Option<Ceiling> {
        let first = runs.first()?;
        let med = |f: fn(&Ceiling) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Some(Ceiling {
            threads: first.threads,
            bytes: first.bytes,
            huge_share: first.huge_share,
            in_place: med(|c| c.in_place),
            copied: med(|c| c.copied),
        })
    }
}

/// A copy of the hot set (blocks `0..blocks_per_file` of files
/// `0..files`, generated with `seed`) in anonymous memory.
pub struct HotCopy {
    map: MmapMut,
    seed: u64,
    files: u32,
    blocks_per_file: u64,
    huge_share: Option<f64>,
}

impl HotCopy {
    pub fn new(seed: u64, files: u32, blocks_per_file: u64) -> Result<HotCopy, String> {
        let blocks = u64::from(files) * blocks_per_file;
        let len = usize::try_from(blocks)
            .ok()
            .and_then(|b| b.checked_mul(BLOCK))
            .filter(|&l| l > 0)
            .ok_or_else(|| format!("memory ceiling: a hot set of {blocks} blocks"))?;
        let mut map =
            MmapMut::map_anon(len).map_err(|e| format!("memory ceiling: {len} bytes: {e}"))?;
        // Without huge pages the copy is in 4 KiB pages: `huge_share` says so.
        let _ = map.advise(Advice::HugePage);
        for (i, block) in map.chunks_exact_mut(BLOCK).enumerate() {
            let i = i as u64;
            fill_block(
                seed,
                (i / blocks_per_file) as u32,
                i % blocks_per_file,
                block,
            );
        }
        let huge_share = anon_huge_bytes(map.as_ptr() as usize).map(|b| b as f64 / len as f64);
        Ok(HotCopy {
            map,
            seed,
            files,
            blocks_per_file,
            huge_share,
        })
    }

    /// `threads` threads verifying random blocks for `secs` seconds where
    /// they lie, then as long again copying each out first.
    pub fn measure(&self, threads: usize, secs: f64, mode: VerifyMode) -> Result<Ceiling, String> {
        let secs = Duration::from_secs_f64(secs);
        let in_place = self.run(threads, secs, mode, false)?;
        let copied = self.run(threads, secs, mode, true)?;
        Ok(Ceiling {
            threads,
            bytes: self.map.len() as u64,
            huge_share: self.huge_share,
            in_place,
            copied,
        })
    }

    fn run(
        &self,
        threads: usize,
        secs: Duration,
        mode: VerifyMode,
        copy: bool,
    ) -> Result<f64, String> {
        let blocks = u64::from(self.files) * self.blocks_per_file;
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads.max(1) as u64)
                .map(|t| {
                    s.spawn(move || -> Result<f64, String> {
                        let mut buf = AlignedBlock::new();
                        let mut x = self.seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        let start = Instant::now();
                        let mut n = 0u64;
                        loop {
                            for _ in 0..STRIDE {
                                x = splitmix(x);
                                // Uniform over the blocks (multiply-shift).
                                let i = ((u128::from(x) * u128::from(blocks)) >> 64) as u64;
                                let at = i as usize * BLOCK;
                                let data = &self.map[at..at + BLOCK];
                                let (file, block) =
                                    ((i / self.blocks_per_file) as u32, i % self.blocks_per_file);
                                let res = if copy {
                                    buf.copy_from_slice(data);
                                    verify_block(mode, self.seed, file, block, &buf)
                                } else {
                                    verify_block(mode, self.seed, file, block, data)
                                };
                                res.map_err(|e| format!("memory ceiling: {e}"))?;
                            }
                            n += STRIDE;
                            let spent = start.elapsed();
                            if spent >= secs {
                                return Ok(n as f64 / spent.as_secs_f64());
                            }
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join()
                        .map_err(|_| "memory ceiling: a thread panicked".to_string())?
                })
                .sum()
        })
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Bytes of the mapping that starts at `addr` held in transparent huge
/// pages (`AnonHugePages` of its `/proc/self/smaps` entry).
fn anon_huge_bytes(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let range = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'))
            .and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
        if let Some((a, b)) = range {
            inside = (a..b).contains(&addr);
        } else if inside {
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                return kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .map(|k| k << 10);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_every_block_it_reads() {
        let copy = HotCopy::new(7, 2, 16).unwrap();
        let c = copy.measure(2, 0.05, VerifyMode::Full).unwrap();
        assert!(c.in_place > 0.0 && c.copied > 0.0);
        assert_eq!(c.bytes, 2 * 16 * BLOCK as u64);
        // A block that is not the dataset's fails the run.
        let mut bad = HotCopy::new(7, 1, 4).unwrap();
        bad.map[3 * BLOCK + 100] ^= 1;
        assert!(bad.measure(1, 0.05, VerifyMode::Checksum).is_err());
    }
}
