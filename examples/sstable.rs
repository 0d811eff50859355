//! A small sorted-table reader on top of the crate: the read path of an
//! LSM-tree's SSTable.
//!
//! The table is written with `std` (sorted `u64` keys with variable-length
//! values, packed into 4 KiB data blocks, then a block index and a footer),
//! and read through a `UringContext`:
//! - `get(key)`: binary search in the index, one block read (`read_owned`);
//! - `multi_get(keys)`: the blocks of all keys read in one `read_batch`
//!   (one `io_uring_enter` for the blocks the page cache cannot serve);
//! - `scan(from..to)`: the data blocks of a key range streamed with
//!   `ScanOptions` (read-ahead, recycled buffers), entries decoded in order.
//!
//! The file is evicted from the page cache before each part, so the reads
//! go through the rings. Every answer is checked against the `BTreeMap` the
//! table was built from.
//!
//! With the `cache` feature, `get` and `multi_get` read their data blocks
//! through a `BlockCache` (`get` a `BlockRef`, no copy; `multi_get` one
//! `get_many`: the cached blocks at once, the others in one batch), as an
//! LSM engine's block cache does; the gets are then run a second time,
//! served from the cache whatever the page cache holds. The scan still
//! streams from the file: a long scan would only push the point lookups'
//! blocks out of the cache (RocksDB's `fill_cache = false`). Without the
//! feature each block is an owned read into a new buffer.
//! Run: `cargo run --release --example sstable [keys]` (default 200 000),
//! or `cargo run --release --features cache --example sstable [keys]`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::ops::Range;

use futures::StreamExt;
#[cfg(feature = "cache")]
use uring_positioned_io::{BlockCache, BlockRef, CacheOptions};
use uring_positioned_io::{FileId, ScanOptions, UringContext};

const BLOCK: usize = 4096;

/// The value stored for `key` (so the check needs no second copy).
fn value_of(key: u64) -> Vec<u8> {
    let len = 8 + (key % 57) as usize;
    (0..len)
        .map(|i| (key as u8).wrapping_add(i as u8))
        .collect()
}

/// Writes the table: data blocks of `[key u64][len u16][value]...`, each
/// block zero-padded to 4 KiB (a zero `len` after the last entry ends it),
/// then the index (`first key u64` per block) and a footer (block count).
fn write_table(path: &std::path::Path, keys: &[u64]) -> io::Result<Vec<u64>> {
    let mut out = io::BufWriter::new(std::fs::File::create(path)?);
    let mut index = Vec::new();
    let mut block = Vec::with_capacity(BLOCK);
    let flush = |block: &mut Vec<u8>, out: &mut io::BufWriter<std::fs::File>| {
        block.resize(BLOCK, 0);
        let r = out.write_all(block);
        block.clear();
        r
    };
    for &k in keys {
        let v = value_of(k);
        if block.len() + 10 + v.len() + 2 > BLOCK {
            flush(&mut block, &mut out)?;
        }
        if block.is_empty() {
            index.push(k);
        }
        block.extend_from_slice(&k.to_le_bytes());
        block.extend_from_slice(&(v.len() as u16).to_le_bytes());
        block.extend_from_slice(&v);
    }
    if !block.is_empty() {
        flush(&mut block, &mut out)?;
    }
    for k in &index {
        out.write_all(&k.to_le_bytes())?;
    }
    out.write_all(&(index.len() as u64).to_le_bytes())?;
    out.flush()?;
    Ok(index)
}

/// Drops the table's pages from the page cache, so reads go to the device
/// (through the rings) instead of being served inline from memory.
fn evict(path: &std::path::Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    f.sync_all()?;
    // SAFETY: a valid descriptor for the duration of the call; no memory
    // is passed.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// Decodes the entries of one data block.
fn entries(block: &[u8]) -> impl Iterator<Item = (u64, &[u8])> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + 10 > block.len() {
            return None;
        }
        let key = u64::from_le_bytes(block[at..at + 8].try_into().unwrap());
        let len = u16::from_le_bytes(block[at + 8..at + 10].try_into().unwrap()) as usize;
        if len == 0 {
            return None;
        }
        let value = &block[at + 10..at + 10 + len];
        at += 10 + len;
        Some((key, value))
    })
}

struct Table<'a> {
    ctx: &'a UringContext,
    fid: FileId,
    /// First key of each data block.
    index: Vec<u64>,
    /// The data blocks' cache (the whole table fits in it).
    #[cfg(feature = "cache")]
    cache: BlockCache,
}

/// A data block as `get` and `multi_get` see it: a cached block, or the
/// buffer of its own read.
#[cfg(feature = "cache")]
type Block = BlockRef;
#[cfg(not(feature = "cache"))]
type Block = Vec<u8>;

/// A whole data block, or an error if the read came back short.
fn full(block: Block) -> io::Result<Block> {
    if block.len() == BLOCK {
        Ok(block)
    } else {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short data block",
        ))
    }
}

impl<'a> Table<'a> {
    /// Opens the table: reads the footer and the index through the context.
    async fn open(ctx: &'a UringContext, fid: FileId, len: u64) -> io::Result<Table<'a>> {
        let (r, footer) = ctx
            .read_exact_owned(fid, len - 8, Vec::with_capacity(8))
            .await;
        r?;
        let blocks = u64::from_le_bytes(footer[..8].try_into().unwrap());
        let index_len = blocks as usize * 8;
        let (r, raw) = ctx
            .read_exact_owned(
                fid,
                len - 8 - index_len as u64,
                Vec::with_capacity(index_len),
            )
            .await;
        r?;
        let index = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(Table {
            ctx,
            fid,
            index,
            #[cfg(feature = "cache")]
            cache: BlockCache::new(
                ctx,
                CacheOptions {
                    capacity_bytes: 32 << 20,
                    block_size: BLOCK,
                },
            )?,
        })
    }

    /// Data block `b`, from the cache (read into it on a miss).
    #[cfg(feature = "cache")]
    async fn block(&self, b: usize) -> io::Result<Block> {
        full(self.cache.get(self.fid, b as u64).await?)
    }

    /// Data block `b`, read into a new buffer.
    #[cfg(not(feature = "cache"))]
    async fn block(&self, b: usize) -> io::Result<Block> {
        let (r, block) = self
            .ctx
            .read_exact_owned(self.fid, (b * BLOCK) as u64, Vec::with_capacity(BLOCK))
            .await;
        r?;
        full(block)
    }

    /// Data blocks `blocks`: the cached ones at once, the others read in
    /// one batch.
    #[cfg(feature = "cache")]
    async fn blocks(&self, blocks: &[usize]) -> Vec<io::Result<Block>> {
        let got = self
            .cache
            .get_many(self.fid, blocks.iter().map(|&b| b as u64))
            .await;
        got.into_iter().map(|r| r.and_then(full)).collect()
    }

    /// Data blocks `blocks`, read in one batch.
    #[cfg(not(feature = "cache"))]
    async fn blocks(&self, blocks: &[usize]) -> Vec<io::Result<Block>> {
        let read = self
            .ctx
            .read_batch(
                blocks
                    .iter()
                    .map(|&b| (self.fid, (b * BLOCK) as u64, Vec::with_capacity(BLOCK))),
            )
            .await;
        read.into_iter()
            .map(|(r, buf)| r.and_then(|_| full(buf)))
            .collect()
    }

    /// The data block that would hold `key`, if any.
    fn block_of(&self, key: u64) -> Option<usize> {
        match self.index.binary_search(&key) {
            Ok(i) => Some(i),
            Err(0) => None,
            Err(i) => Some(i - 1),
        }
    }

    async fn get(&self, key: u64) -> io::Result<Option<Vec<u8>>> {
        let Some(b) = self.block_of(key) else {
            return Ok(None);
        };
        let block = self.block(b).await?;
        let found = entries(&block)
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_vec());
        Ok(found)
    }

    /// Looks up every key; the distinct blocks are read in one batch.
    async fn multi_get(&self, keys: &[u64]) -> io::Result<Vec<Option<Vec<u8>>>> {
        let mut blocks: Vec<usize> = keys.iter().filter_map(|&k| self.block_of(k)).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut by_block = BTreeMap::new();
        for (&b, r) in blocks.iter().zip(self.blocks(&blocks).await) {
            by_block.insert(b, r?);
        }
        Ok(keys
            .iter()
            .map(|&k| {
                let block = &by_block[&self.block_of(k)?];
                entries(block)
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_vec())
            })
            .collect())
    }

    /// Every entry with a key in `range`, in order, read with a scan.
    async fn scan(&self, range: Range<u64>) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let first = self.block_of(range.start).unwrap_or(0);
        let last = self.block_of(range.end.saturating_sub(1)).unwrap_or(0);
        let bytes = (first * BLOCK) as u64..((last + 1) * BLOCK) as u64;
        let mut stream = ScanOptions::new()
            .chunk_size(16 * BLOCK)
            .in_flight(4)
            .scan(self.ctx, self.fid, bytes)?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            for block in chunk?.chunks(BLOCK) {
                out.extend(
                    entries(block)
                        .filter(|(k, _)| range.contains(k))
                        .map(|(k, v)| (k, v.to_vec())),
                );
            }
        }
        Ok(out)
    }
}

fn main() -> io::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    // Every third key exists, so lookups of absent keys are tested too.
    let model: BTreeMap<u64, Vec<u8>> = (0..n).map(|i| (i * 3, value_of(i * 3))).collect();
    let keys: Vec<u64> = model.keys().copied().collect();
    let dir = std::env::temp_dir().join(format!("uring-sstable-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("000001.sst");
    let index = write_table(&path, &keys)?;
    let len = std::fs::metadata(&path)?.len();
    println!(
        "table: {n} keys in {} data blocks, {:.1} MiB",
        index.len(),
        len as f64 / f64::from(1u32 << 20)
    );

    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(async {
        let ctx = UringContext::new(vec![std::fs::File::open(&path)?])?;
        let fid = ctx.file_id(0)?;
        let table = Table::open(&ctx, fid, len).await?;
        assert_eq!(table.index, index, "index read back");

        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (n * 3 + 10)
        };
        evict(&path)?;
        let t = std::time::Instant::now();
        let gets: Vec<u64> = (0..2000).map(|_| next()).collect();
        for &k in &gets {
            assert_eq!(table.get(k).await?, model.get(&k).cloned(), "get({k})");
        }
        println!("2000 gets (cold file) in {:?}", t.elapsed());
        #[cfg(feature = "cache")]
        {
            // The same keys again: their blocks are all cached now.
            evict(&path)?;
            let before = table.cache.stats();
            let t = std::time::Instant::now();
            for &k in &gets {
                assert_eq!(table.get(k).await?, model.get(&k).cloned(), "get({k})");
            }
            let after = table.cache.stats();
            assert_eq!(after.misses, before.misses, "the second gets all hit");
            println!(
                "the same 2000 gets again in {:?} ({} cache hits)",
                t.elapsed(),
                after.hits - before.hits
            );
        }

        evict(&path)?;
        let t = std::time::Instant::now();
        for _ in 0..100 {
            let ks: Vec<u64> = (0..32).map(|_| next()).collect();
            let got = table.multi_get(&ks).await?;
            for (k, v) in ks.iter().zip(got) {
                assert_eq!(v, model.get(k).cloned(), "multi_get: {k}");
            }
        }
        println!("100 multi_gets of 32 keys in {:?}", t.elapsed());

        evict(&path)?;
        let t = std::time::Instant::now();
        let from = n / 3;
        let to = from + n;
        let got = table.scan(from..to).await?;
        let want: Vec<(u64, Vec<u8>)> = model
            .range(from..to)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_eq!(got, want, "scan({from}..{to})");
        println!("scan of {} entries in {:?}", got.len(), t.elapsed());
        println!("stats: {:?}; backend: {}", ctx.stats(), ctx.backend());
        #[cfg(feature = "cache")]
        println!("cache: {:?}", table.cache.stats());
        ctx.shutdown().await;
        io::Result::Ok(())
    });
    std::fs::remove_dir_all(&dir)?;
    result
}
