//! The settings of a [`BlockCache`](crate::BlockCache) and its counters.

/// Settings of a [`BlockCache`](crate::BlockCache).
///
/// ```
/// use uring_positioned_io::CacheOptions;
///
/// let opts = CacheOptions { capacity_bytes: 256 << 20, ..CacheOptions::default() };
/// assert_eq!(opts.block_size, 4096);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// Most bytes of blocks the cache keeps (whole blocks; a block at the
    /// end of a file counts as a whole block). Default 64 MiB.
    pub capacity_bytes: u64,
    /// Bytes per block: a power of two, at least 512 (default 4096). Misses
    /// read whole blocks at multiples of it, so for a file opened with
    /// `O_DIRECT` it must be a multiple of the device's logical block size.
    pub block_size: usize,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            capacity_bytes: 64 << 20,
            block_size: 4096,
        }
    }
}

/// Counters of a [`BlockCache`](crate::BlockCache) (a snapshot; see [`BlockCache::stats`](crate::BlockCache::stats)).
///
/// ```
/// # use std::io::Write;
/// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(&[1u8; 8192])?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
/// cache.get(0, 1).await?; // a miss
/// cache.get(0, 1).await?; // a hit
/// let s = cache.stats();
/// assert_eq!((s.misses, s.hits, s.resident_bytes), (1, 1, 4096));
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Blocks served from the cache.
    pub hits: u64,
    /// Blocks read from the file: each is one read (the coalesced ones
    /// are not counted again).
    pub misses: u64,
    /// Blocks asked for while a read of them was in flight, which waited
    /// for that read instead of issuing their own.
    pub coalesced: u64,
    /// Blocks the eviction policy dropped to make room.
    pub evictions: u64,
    /// Bytes of the blocks in the cache (at most the capacity).
    pub resident_bytes: u64,
    /// Bytes of blocks no longer in the cache (invalidated, or never
    /// admitted) that live [`BlockRef`](crate::BlockRef)s still hold (a
    /// held block is never evicted: it stays resident while held).
    pub pinned_bytes: u64,
    /// Bytes of buffers that reads are filling now (or that a dropped
    /// read's kernel op still holds).
    pub in_flight_bytes: u64,
    /// Bytes of buffer memory the cache has allocated so far, in use or
    /// free for reuse: at most the capacity plus the peak of pinned and
    /// in-flight bytes (rounded up to the allocation unit).
    pub pool_bytes: u64,
}
