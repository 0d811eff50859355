//! `uring-bench zipf-policies`: eviction policies on the draws of the
//! `mem-fair` zipf workload, simulated (no I/O, no cache memory): how close
//! a cache that learns from the reads it sees gets to the ideal, a cache
//! that always holds the most likely blocks.
//!
//! Policies, each given the same draws and the same capacity in blocks:
//! - `LRU`;
//! - `S3-FIFO, 1-bit`, as `BlockCache` runs it (`src/cache/table.rs`): a
//!   small FIFO of a tenth of the capacity, a ghost of keys evicted from
//!   it (fingerprints in a direct-mapped table of as many slots as the
//!   capacity), a main FIFO with one access bit (a CLOCK); a block
//!   accessed in small moves to main when it reaches the head;
//! - the same with the ghost an exact FIFO of as many keys as the
//!   capacity, as the S3-FIFO paper keeps it;
//! - `S3-FIFO, 2-bit`: the same with a counter of up to 3 hits in main (one
//!   spent each time the block goes round), as the S3-FIFO paper does;
//! - `W-TinyLFU`: a 1 % LRU window before a segmented LRU (80 % protected),
//!   admitting the window's victim only if it was read more often than the
//!   main victim, with exact counts halved every 10 × capacity reads
//!   (Caffeine's design, with counts no sketch can beat);
//! - `ideal`: the `capacity` most likely blocks, fixed (under independent
//!   draws, no policy that does not know the next reads does better).

use std::collections::VecDeque;

use rand_distr::{Distribution, Zipf};

use crate::cli::ZipfPoliciesArgs;
use crate::verify::BLOCK;

/// No entry (a key's slot in a list, or a list's end).
const NONE: u32 = u32::MAX;

/// Doubly linked lists over the keys `0..n`, each key in at most one.
struct Lists {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Which list holds the key (`u8::MAX`: none).
    list: Vec<u8>,
    head: Vec<u32>,
    tail: Vec<u32>,
    len: Vec<usize>,
}

impl Lists {
    fn new(keys: usize, lists: usize) -> Lists {
        Lists {
            prev: vec![NONE; keys],
            next: vec![NONE; keys],
            list: vec![u8::MAX; keys],
            head: vec![NONE; lists],
            tail: vec![NONE; lists],
            len: vec![0; lists],
        }
    }

    fn of(&self, k: u32) -> Option<usize> {
        let l = self.list[k as usize];
        (l != u8::MAX).then_some(usize::from(l))
    }

    fn push_back(&mut self, l: usize, k: u32) {
        let t = self.tail[l];
        self.prev[k as usize] = t;
        self.next[k as usize] = NONE;
        if t == NONE {
            self.head[l] = k;
        } else {
            self.next[t as usize] = k;
        }
        self.tail[l] = k;
        self.list[k as usize] = l as u8;
        self.len[l] += 1;
    }

    fn remove(&mut self, k: u32) {
        let Some(l) = self.of(k) else { return };
        let (p, n) = (self.prev[k as usize], self.next[k as usize]);
        if p == NONE {
            self.head[l] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            self.tail[l] = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.list[k as usize] = u8::MAX;
        self.len[l] -= 1;
    }

    fn pop_front(&mut self, l: usize) -> Option<u32> {
        let k = self.head[l];
        if k == NONE {
            return None;
        }
        self.remove(k);
        Some(k)
    }

    fn front(&self, l: usize) -> Option<u32> {
        let k = self.head[l];
        (k != NONE).then_some(k)
    }
}

/// A policy: `access` says whether the key was cached (a hit), and caches it.
trait Policy {
    fn access(&mut self, k: u32) -> bool;
}

struct Lru {
    cap: usize,
    l: Lists,
}

impl Policy for Lru {
    fn access(&mut self, k: u32) -> bool {
        if self.l.of(k).is_some() {
            self.l.remove(k);
            self.l.push_back(0, k);
            return true;
        }
        if self.l.len[0] >= self.cap {
            self.l.pop_front(0);
        }
        self.l.push_back(0, k);
        false
    }
}

/// Where a key is in S3-FIFO.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum S3 {
    Out,
    Small,
    Main,
}

struct S3Fifo {
    cap: usize,
    /// Most accesses a main block's counter holds (1: an access bit).
    max_freq: u8,
    small: VecDeque<u32>,
    main: VecDeque<u32>,
    at: Vec<S3>,
    freq: Vec<u8>,
    /// A key's ghost entry: its sequence number (0: none).
    ghost: Vec<u64>,
    ghost_fifo: VecDeque<(u32, u64)>,
    ghost_seq: u64,
    /// The ghost as `BlockCache` keeps it (instead of the exact FIFO):
    /// fingerprints in a direct-mapped table.
    hashed: Option<Vec<u32>>,
}

/// `BlockCache`'s ghost slot and fingerprint of block `k` (of one file):
/// the same hash (`KeyHash` of the file's key, then the block's), table
/// size and split as `src/cache/table.rs`'s `Ghosts`.
fn ghost_slot(k: u32, slots: usize) -> (usize, u32) {
    let z = splitmix(splitmix(0, 1), u64::from(k));
    (
        (((z & 0xFFFF_FFFF) * slots as u64) >> 32) as usize,
        (z >> 32) as u32 | 1,
    )
}

/// One `SplitMix64` step of `h` with `v` (`KeyHasher::write_u64`).
fn splitmix(h: u64, v: u64) -> u64 {
    let mut z = (h ^ v).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl S3Fifo {
    fn new(keys: usize, cap: usize, max_freq: u8, hashed_slots: Option<usize>) -> S3Fifo {
        S3Fifo {
            hashed: hashed_slots.map(|n| vec![0; n]),
            cap,
            max_freq,
            small: VecDeque::new(),
            main: VecDeque::new(),
            at: vec![S3::Out; keys],
            freq: vec![0; keys],
            ghost: vec![0; keys],
            ghost_fifo: VecDeque::new(),
            ghost_seq: 0,
        }
    }

    fn evict(&mut self) {
        let small_target = (self.cap / 10).max(1);
        loop {
            if self.small.len() > small_target || self.main.is_empty() {
                let Some(k) = self.small.pop_front() else {
                    return;
                };
                if self.freq[k as usize] > 0 {
                    self.freq[k as usize] = 0;
                    self.at[k as usize] = S3::Main;
                    self.main.push_back(k);
                    continue;
                }
                self.at[k as usize] = S3::Out;
                if let Some(t) = &mut self.hashed {
                    let (i, fp) = ghost_slot(k, t.len());
                    t[i] = fp;
                    return;
                }
                self.ghost_seq += 1;
                self.ghost[k as usize] = self.ghost_seq;
                self.ghost_fifo.push_back((k, self.ghost_seq));
                while self.ghost_fifo.len() > self.cap {
                    if let Some((g, seq)) = self.ghost_fifo.pop_front() {
                        if self.ghost[g as usize] == seq {
                            self.ghost[g as usize] = 0;
                        }
                    }
                }
                return;
            }
            let Some(k) = self.main.pop_front() else {
                return;
            };
            if self.freq[k as usize] > 0 {
                self.freq[k as usize] -= 1;
                self.main.push_back(k);
                continue;
            }
            self.at[k as usize] = S3::Out;
            return;
        }
    }
}

impl Policy for S3Fifo {
    fn access(&mut self, k: u32) -> bool {
        let i = k as usize;
        if self.at[i] != S3::Out {
            if self.freq[i] < self.max_freq {
                self.freq[i] += 1;
            }
            return true;
        }
        if self.small.len() + self.main.len() >= self.cap {
            self.evict();
        }
        self.freq[i] = 0;
        let ghost = match &mut self.hashed {
            Some(t) => {
                let (slot, fp) = ghost_slot(k, t.len());
                let hit = t[slot] == fp;
                if hit {
                    t[slot] = 0;
                }
                hit
            }
            None => std::mem::replace(&mut self.ghost[i], 0) != 0,
        };
        if ghost {
            self.at[i] = S3::Main;
            self.main.push_back(k);
        } else {
            self.at[i] = S3::Small;
            self.small.push_back(k);
        }
        false
    }
}

/// The lists of W-TinyLFU.
const WINDOW: usize = 0;
const PROBATION: usize = 1;
const PROTECTED: usize = 2;

struct WTinyLfu {
    window_cap: usize,
    main_cap: usize,
    protected_cap: usize,
    l: Lists,
    count: Vec<u32>,
    seen: usize,
    halve_every: usize,
}

impl WTinyLfu {
    fn new(keys: usize, cap: usize) -> WTinyLfu {
        let window_cap = (cap / 100).max(1);
        let main_cap = cap.saturating_sub(window_cap).max(1);
        WTinyLfu {
            window_cap,
            main_cap,
            protected_cap: main_cap * 8 / 10,
            l: Lists::new(keys, 3),
            count: vec![0; keys],
            seen: 0,
            halve_every: 10 * cap,
        }
    }
}

impl Policy for WTinyLfu {
    fn access(&mut self, k: u32) -> bool {
        self.count[k as usize] = self.count[k as usize].saturating_add(1);
        self.seen += 1;
        if self.seen >= self.halve_every {
            self.seen /= 2;
            self.count.iter_mut().for_each(|c| *c /= 2);
        }
        match self.l.of(k) {
            Some(l @ (WINDOW | PROTECTED)) => {
                self.l.remove(k);
                self.l.push_back(l, k);
                return true;
            }
            Some(_) => {
                self.l.remove(k);
                self.l.push_back(PROTECTED, k);
                if self.l.len[PROTECTED] > self.protected_cap {
                    if let Some(d) = self.l.pop_front(PROTECTED) {
                        self.l.push_back(PROBATION, d);
                    }
                }
                return true;
            }
            None => {}
        }
        self.l.push_back(WINDOW, k);
        if self.l.len[WINDOW] > self.window_cap {
            let cand = self.l.pop_front(WINDOW).expect("over its size");
            if self.l.len[PROBATION] + self.l.len[PROTECTED] < self.main_cap {
                self.l.push_back(PROBATION, cand);
            } else {
                let victim = self
                    .l
                    .front(PROBATION)
                    .or_else(|| self.l.front(PROTECTED))
                    .expect("main is full");
                if self.count[cand as usize] > self.count[victim as usize] {
                    self.l.remove(victim);
                    self.l.push_back(PROBATION, cand);
                }
            }
        }
        false
    }
}

/// A xorshift generator as a `rand` source (for `rand_distr`).
struct XorShift(u64);

impl rand_core::TryRng for XorShift {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        Ok(self.0.wrapping_mul(0x2545_f491_4f6c_dd1d))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for c in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        Ok(())
    }
}

/// Hit ratio of each policy over the draws after the first `warmup`.
pub struct Outcome {
    pub name: &'static str,
    pub hit_ratio: f64,
}

/// Runs every policy over the same `warmup + reads` Zipf draws of ranks
/// `0..keys` (rank 0 the most likely).
pub fn simulate(
    keys: usize,
    cap: usize,
    theta: f64,
    warmup: usize,
    reads: usize,
    seed: u64,
) -> Result<Vec<Outcome>, String> {
    if keys == 0 || keys >= NONE as usize || cap == 0 {
        return Err(format!(
            "{keys} blocks with a capacity of {cap}: need 1 to {} blocks and a capacity of at least one",
            NONE - 1
        ));
    }
    let zipf = Zipf::new(keys as f64, theta)
        .map_err(|e| format!("Zipf over {keys} blocks, theta {theta}: {e}"))?;
    let mut rng = XorShift(seed | 1);
    let draws: Vec<u32> = (0..warmup + reads)
        .map(|_| (zipf.sample(&mut rng) as u64).clamp(1, keys as u64) as u32 - 1)
        .collect();
    let mut policies: Vec<(&'static str, Box<dyn Policy>)> = vec![
        (
            "LRU",
            Box::new(Lru {
                cap,
                l: Lists::new(keys, 1),
            }),
        ),
        (
            "S3-FIFO, 1-bit (BlockCache's)",
            Box::new(S3Fifo::new(keys, cap, 1, Some(cap.max(1)))),
        ),
        (
            "S3-FIFO, 1-bit, exact ghost FIFO",
            Box::new(S3Fifo::new(keys, cap, 1, None)),
        ),
        ("S3-FIFO, 2-bit", Box::new(S3Fifo::new(keys, cap, 3, None))),
        (
            "W-TinyLFU, exact counts",
            Box::new(WTinyLfu::new(keys, cap)),
        ),
    ];
    let mut out = Vec::new();
    for (name, p) in &mut policies {
        let mut hits = 0usize;
        for (i, &k) in draws.iter().enumerate() {
            if p.access(k) && i >= warmup {
                hits += 1;
            }
        }
        out.push(Outcome {
            name,
            hit_ratio: hits as f64 / reads.max(1) as f64,
        });
    }
    let ideal = draws[warmup..]
        .iter()
        .filter(|&&k| (k as usize) < cap)
        .count();
    out.push(Outcome {
        name: "ideal (the most likely blocks)",
        hit_ratio: ideal as f64 / reads.max(1) as f64,
    });
    Ok(out)
}

pub fn run(a: &ZipfPoliciesArgs) -> Result<bool, String> {
    let keys = usize::try_from(a.dataset_size / BLOCK as u64)
        .map_err(|_| "--dataset-size: too many blocks".to_string())?;
    let cap = usize::try_from(a.cache_size / BLOCK as u64)
        .map_err(|_| "--cache-size: too many blocks".to_string())?;
    println!(
        "Zipf theta {} over {} blocks of 4 KiB ({} MiB), a cache of {} blocks ({} MiB); \
         {} reads after {} of warm-up, seed {}",
        a.theta,
        keys,
        a.dataset_size >> 20,
        cap,
        a.cache_size >> 20,
        a.reads,
        a.warmup,
        a.seed
    );
    let t = std::time::Instant::now();
    let out = simulate(keys, cap, a.theta, a.warmup, a.reads, a.seed)?;
    let ideal = out.last().map_or(0.0, |o| o.hit_ratio);
    println!("| policy | hit ratio | misses × ideal's |");
    println!("|---|---:|---:|");
    for o in &out {
        println!(
            "| {} | {:.1} % | {:.2}× |",
            o.name,
            o.hit_ratio * 100.0,
            (1.0 - o.hit_ratio) / (1.0 - ideal).max(f64::MIN_POSITIVE)
        );
    }
    println!("({:.1} s)", t.elapsed().as_secs_f64());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache as large as the key space misses each key once.
    #[test]
    fn a_cache_of_every_key_only_misses_cold() {
        for out in simulate(100, 100, 0.99, 0, 10_000, 1).unwrap() {
            let misses = ((1.0 - out.hit_ratio) * 10_000.0).round();
            assert!(misses <= 100.0, "{}: {misses} misses", out.name);
        }
    }

    /// Under skewed draws every policy beats chance and none beats the
    /// ideal; the frequency-aware ones beat LRU.
    #[test]
    fn policies_sit_between_chance_and_the_ideal() {
        let out = simulate(20_000, 2_000, 0.99, 100_000, 200_000, 7).unwrap();
        let h = |name: &str| {
            out.iter()
                .find(|o| o.name.starts_with(name))
                .unwrap()
                .hit_ratio
        };
        let ideal = h("ideal");
        for o in &out {
            assert!(
                o.hit_ratio > 0.1 && o.hit_ratio <= ideal + 0.005,
                "{}: {}",
                o.name,
                o.hit_ratio
            );
        }
        assert!(h("S3-FIFO, 1-bit") > h("LRU"));
        assert!(h("S3-FIFO, 2-bit") > h("LRU"));
        assert!(h("W-TinyLFU") > h("LRU"));
    }

    /// LRU on a cyclic scan one larger than the cache never hits.
    #[test]
    fn lru_misses_a_loop_larger_than_itself() {
        let mut p = Lru {
            cap: 3,
            l: Lists::new(4, 1),
        };
        let hits = (0..40u32).filter(|i| p.access(i % 4)).count();
        assert_eq!(hits, 0);
    }

    /// S3-FIFO keeps a block read twice while one-time blocks stream by.
    #[test]
    fn s3_fifo_keeps_a_reread_block_through_a_scan() {
        for ghost in [None, Some(20)] {
            let mut p = S3Fifo::new(1_000, 20, 1, ghost);
            p.access(0);
            p.access(0);
            for k in 1..500 {
                p.access(k);
            }
            assert!(p.access(0));
        }
    }

    /// A block missed again soon after its eviction from small is a ghost
    /// and enters main, where a scan does not reach it; with either ghost.
    #[test]
    fn s3_fifo_a_ghost_enters_main() {
        for ghost in [None, Some(20)] {
            let mut p = S3Fifo::new(1_000, 20, 1, ghost);
            p.access(0);
            // Evicted from small (not read again there).
            for k in 1..=20 {
                p.access(k);
            }
            assert_eq!(p.at[0], S3::Out);
            assert!(!p.access(0), "a miss");
            assert_eq!(p.at[0], S3::Main, "ghost {ghost:?}");
        }
    }
}
