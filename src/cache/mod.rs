//! A block cache over a context ([`BlockCache`], feature `cache`): fixed-size
//! blocks of registered files kept in memory the cache owns, for engines
//! that keep their own cache over `O_DIRECT` files.
//!
//! - **Hits** are served on the caller's thread at the first poll: a load
//!   from the file's dense block table (`table.rs`), then a pin on the
//!   frame that holds the block and a check of its tag (`get`), or a copy
//!   checked against the frame's generation (`read`, `frames.rs`); no lock,
//!   no hash, no allocation, no syscall. They spend tokio's coop budget and
//!   the inline path's stretch (`inline::turn_over`), so a task looping on
//!   hits yields.
//! - **Misses** are *flights* (`Flight`): one owned read per block into a
//!   free frame (`frames.rs`), all the misses of one call in one
//!   [`read_batch`](crate::UringContext::read_batch) (one `io_uring_enter`
//!   per ring). A flight (`flight.rs`) is a future every caller missing
//!   the same block while it is in flight joins (the `flights` map): any of
//!   them drives it, and it goes on while one is left; the last one dropped
//!   drops the read (its buffer parked in the context until the kernel is
//!   done).
//! - **Coherence**: a flight inserts its block only if its entry is still
//!   in `flights`, under the `flights` lock; a change through the context
//!   ([`Invalidate`], before the write's future resolves) removes the
//!   entries of the blocks it touches under the same lock, then the cached
//!   blocks, under every registration of the changed file. A read started
//!   before the write may return old bytes, but never leaves them in the
//!   cache, and a read started after it never joins an older flight.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::context::UringContext;
use crate::error::{self, os_error};
use crate::id::FileId;
use crate::thread::thread_slot;
use crate::util::lock;

mod flight;
mod frames;
mod options;
mod state;
mod table;

pub(crate) use crate::changes::Invalidate;
use flight::{Waiting, WeakFlight};
pub use frames::BlockRef;
use frames::Core;
pub use options::{CacheOptions, CacheStats};
use state::admit;
pub use state::GetBlock;
use table::{Policy, Tables};

#[cfg(feature = "bytes")]
impl From<BlockRef> for bytes::Bytes {
    /// The block's bytes as `Bytes`, without copying: the `Bytes` (and its
    /// clones and slices) keep the block alive.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[3u8; 4096])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
    /// let block = cache.get(0, 0).await?;
    /// let ptr = block.as_ptr();
    /// let bytes = bytes::Bytes::from(block);
    /// assert_eq!((bytes.as_ptr(), bytes.len()), (ptr, 4096));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    fn from(block: BlockRef) -> bytes::Bytes {
        bytes::Bytes::from_owner(block)
    }
}

/// A block of a registration: the file's index and generation (its checked
/// id, so that a file registered later under the same index never sees
/// these blocks), and the block's index.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    file: u64,
    block: u64,
}

#[inline]
fn file_key(id: FileId) -> u64 {
    (u64::from(id.index()) << 32) | u64::from(id.gen())
}

/// A cheap hash for [`Key`]s (two integers): a `SplitMix64` step per word.
#[derive(Clone, Copy, Default)]
struct KeyHash;

struct KeyHasher(u64);

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        let mut z = (self.0 ^ v).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.0 = z ^ (z >> 31);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// What a flight gives each block: the block, or what failed.
type Outcome = Result<BlockRef, Arc<FlightError>>;

/// A failed block read, as every waiter gets it (an `io::Error` cannot be
/// cloned; each gets a new one with the same kind, errno and words).
#[derive(Debug)]
struct FlightError {
    kind: io::ErrorKind,
    errno: Option<i32>,
    what: String,
}

impl FlightError {
    /// `e`, its words prefixed with `what` (if any).
    fn new(e: &io::Error, what: Option<String>) -> FlightError {
        let errno = os_error(e);
        let mut cause = e.to_string();
        if let (Some(code), Some(_)) = (errno, e.get_ref()) {
            // An explained error: its kernel words are added back by
            // `error::explained`.
            let os = format!(" ({})", io::Error::from_raw_os_error(code));
            if let Some(n) = cause.strip_suffix(&os).map(str::len) {
                cause.truncate(n);
            }
        }
        let what = match (what, e.get_ref()) {
            // A bare errno: its words are the kernel's, added back.
            (Some(what), None) if errno.is_some() => what,
            (Some(what), _) => format!("{what}: {cause}"),
            (None, None) if errno.is_some() => String::new(),
            (None, _) => cause,
        };
        FlightError {
            kind: e.kind(),
            errno,
            what,
        }
    }

    fn to_io(&self) -> io::Error {
        match self.errno {
            Some(code) if self.what.is_empty() => io::Error::from_raw_os_error(code),
            Some(code) => error::explained(
                self.kind,
                io::Error::from_raw_os_error(code),
                self.what.clone(),
            ),
            None => io::Error::new(self.kind, self.what.clone()),
        }
    }
}

/// A flight's entry for one of its blocks.
struct Entry {
    id: u64,
    /// The file's changes seen when the flight started (`Flights::epochs`).
    epoch: u64,
    flight: WeakFlight,
    slot: usize,
}

/// Most short blocks (the end of a file, or beyond it) cached per file.
const MAX_SHORT: usize = 64;

#[derive(Default)]
struct Flights {
    map: HashMap<Key, Entry, KeyHash>,
    next_id: u64,
    /// Blocks read (one per block of each new flight), and lookups that
    /// joined a flight already reading their block: counted under the
    /// lock, beside the words it writes anyway.
    misses: u64,
    coalesced: u64,
    /// Per file: changes seen since its last drop of the whole file (none:
    /// 0). A short block (the end of the file) lands only if no change
    /// came meanwhile, and a flight is joined only if none came since it
    /// started: a write anywhere after the end may have extended the file
    /// over it.
    epochs: HashMap<u64, u64, KeyHash>,
    /// Per file: the short blocks cached (some may have been evicted
    /// since), all dropped at the file's next change.
    short: HashMap<u64, Vec<u64>, KeyHash>,
}

/// A block being looked up: there, or a flight to wait for.
enum Lookup {
    Hit(BlockRef),
    Wait(Waiting),
}

/// The file a call works on, as found in the context's table.
#[derive(Clone, Copy)]
struct FileRef {
    /// Its checked id: every read goes to this registration.
    id: FileId,
    key: u64,
    direct: bool,
}

/// Most blocks [`BlockCache::read`] fetches in one batch.
const READ_WINDOW: u64 = 64;

/// Threads with a hit counter of their own, and counters the others share.
const OWN_HITS: usize = 32;
const SHARED_HITS: usize = 8;

#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

/// The hit count, without a locked instruction on most hits: each of the
/// first `OWN_HITS` threads of the process (`thread_slot`, never reused)
/// has a word only it writes, with a plain load and store; any other
/// thread adds to a shared word atomically. Each word is on its own lines.
#[derive(Default)]
struct Hits {
    own: [Padded; OWN_HITS],
    shared: [Padded; SHARED_HITS],
}

impl Hits {
    #[inline]
    fn add(&self) {
        let slot = thread_slot();
        match self.own.get(slot) {
            // Only this thread writes its word: no update is lost.
            Some(w) => {
                w.0.store(w.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            None => {
                self.shared[slot % SHARED_HITS]
                    .0
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn sum(&self) -> u64 {
        self.own
            .iter()
            .chain(&self.shared)
            .map(|w| w.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// Aligned to 128 bytes, so that in its `Arc` the counts (changed by
/// every flight, on any thread) sit on lines of their own, apart from the
/// fields every hit reads.
#[repr(align(128))]
struct State {
    ctx: UringContext,
    shift: u32,
    block: usize,
    capacity_blocks: u64,
    /// The frames (memory and headers).
    core: Arc<Core>,
    /// Per file: block → frame; read by hits without a lock, changed under
    /// `policy`.
    tables: Tables,
    /// The eviction policy (with the resident and eviction counts); its
    /// mutex also orders every change of the tables. Taken after
    /// `flights` when both are.
    policy: Mutex<Policy>,
    flights: Mutex<Flights>,
    hits: Hits,
}

impl Drop for State {
    fn drop(&mut self) {
        // Frames still pinned keep the core (not the tables) alive.
        self.core.close();
    }
}

/// A cache of fixed-size blocks of the files of a [`UringContext`], read
/// through it (see the crate's `docs/DESIGN.md`, "Block cache"). Cheap to
/// clone; every clone is the same cache.
///
/// - [`get`](Self::get) a block (zero-copy, a [`BlockRef`]), [`get_many`](Self::get_many)
///   blocks (their misses reach the kernel together),
///   [`read`](Self::read) any byte range (copied out), [`prefetch`](Self::prefetch)
///   a range in the background.
/// - A hit completes at its first poll, on the caller's thread, with no
///   system call and no allocation. Hits take turns as page-cache reads
///   do: a task looping on hits yields once it has served them for the
///   context's [`inline_stretch`](crate::Builder::inline_stretch) or spent
///   tokio's coop budget. A longer stretch gives more hits per second
///   when many tasks loop on hits, and makes every other task on the
///   worker, timers included, wait longer for its turn.
/// - Concurrent misses of one block are one read, whose result (bytes or
///   error) every caller gets; a caller that gives up (drops its future)
///   leaves the read to the others. Errors are never cached; a short block
///   at the end of a file is cached as short.
/// - Eviction is scan-resistant (S3-FIFO): a large read of cold blocks
///   does not flush the blocks read again and again. A block held by a
///   [`BlockRef`] is never evicted.
/// - Coherent with changes **through the context**: once a write,
///   `write_all`, `fallocate` (or their owned forms) through the context
///   resolves, no read through the cache returns the bytes it replaced;
///   [`unregister_file`](UringContext::unregister_file) drops the file's
///   blocks, and a file registered later under the same index never sees
///   them. A write future dropped before it resolved may still land
///   later: its range is dropped again when the kernel or the blocking
///   pool is done with it. A file registered more than once (opened
///   again, or through a hard link: the same device and inode) is one
///   file: a change through one registration is seen through all.
///   Changes through descriptors the context does not have are not seen:
///   call [`invalidate`](Self::invalidate).
/// - Its memory is regions of up to 2 MiB (huge pages where the system
///   gives them), made as it fills and reused after; while it fills, the
///   next region is made ahead on the runtime's blocking pool (faulted in
///   and registered), so that misses do not wait for fresh memory. On the
///   io_uring backend each region is registered with the context's rings,
///   so a miss reads into it without the kernel pinning its pages for
///   every read.
///   Registered memory stays pinned: it is never swapped out, and for a
///   process without `CAP_IPC_LOCK` it counts against `RLIMIT_MEMLOCK`
///   (without room, misses use plain reads). A child made by `fork`
///   inherits none of it, as it inherits none of the rings: it must not
///   use the cache or the context.
///
/// ```
/// # use std::io::Write;
/// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(&(0..65536u32).map(|i| (i / 4096) as u8).collect::<Vec<_>>())?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// let cache = BlockCache::new(&ctx, CacheOptions { capacity_bytes: 1 << 20, block_size: 4096 })?;
/// let mut buf = [0u8; 100];
/// // Bytes 4050..4150 span blocks 0 and 1: both read (in one batch), then copied.
/// assert_eq!(cache.read(0, 4050, &mut buf).await?, 100);
/// assert_eq!((buf[0], buf[99]), (0, 1));
/// // Block 1 is now a hit.
/// assert_eq!(cache.get(0, 1).await?[0], 1);
/// // A write through the context drops what it changes.
/// ctx.write_all(0, 4096, &[9u8; 10]).await?;
/// assert_eq!(cache.get(0, 1).await?[0], 9);
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone)]
pub struct BlockCache {
    state: Arc<State>,
}

/// The settings, the counters, and the blocks being read now (`<busy>`
/// when another thread holds the flights' lock).
impl fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("BlockCache");
        d.field("block_size", &self.state.block)
            .field("capacity_bytes", &self.capacity_bytes())
            .field("stats", &self.stats());
        match self.state.flights.try_lock() {
            Ok(fl) => d.field("blocks_in_flight", &fl.map.len()),
            Err(_) => d.field("blocks_in_flight", &format_args!("<busy>")),
        };
        d.finish()
    }
}

impl BlockCache {
    /// A cache of `options.capacity_bytes` over the files of `ctx` (it
    /// keeps a handle to the context). Memory is allocated as blocks are
    /// read, in regions of up to 2 MiB (huge pages where the system gives
    /// them), and reused.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if the block size is not a power of two of at least
    /// 512 bytes, or the capacity holds no block.
    ///
    /// ```
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions { capacity_bytes: 8 << 20, block_size: 16384 })?;
    /// assert_eq!((cache.block_size(), cache.capacity_bytes()), (16384, 8 << 20));
    /// let bad = CacheOptions { block_size: 1000, ..CacheOptions::default() };
    /// assert!(BlockCache::new(&ctx, bad).is_err());
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn new(ctx: &UringContext, options: CacheOptions) -> io::Result<BlockCache> {
        let CacheOptions {
            capacity_bytes,
            block_size,
        } = options;
        let invalid = |why: String| {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("BlockCache::new: {why}"),
            ))
        };
        if !block_size.is_power_of_two() || !(512..=1 << 30).contains(&block_size) {
            return invalid(format!(
                "block_size {block_size} is not a power of two between 512 and 1 GiB"
            ));
        }
        let blocks = capacity_bytes / block_size as u64;
        if blocks == 0 {
            return invalid(format!(
                "capacity_bytes {capacity_bytes} holds no block of {block_size} bytes"
            ));
        }
        // Frames: the capacity, and room for three times as many (at least
        // 65536) pinned by `BlockRef`s or filled by reads; indices fit u32.
        let max_frames = blocks.saturating_mul(4).max(1 << 16);
        let (Ok(items), true) = (
            usize::try_from(blocks),
            max_frames < u64::from(u32::MAX) / 2,
        ) else {
            return invalid(format!("capacity_bytes {capacity_bytes} is too large"));
        };
        let state = Arc::new(State {
            ctx: ctx.clone(),
            shift: block_size.trailing_zeros(),
            block: block_size,
            capacity_blocks: blocks,
            core: Arc::new(Core::new(
                block_size,
                items,
                usize::try_from(max_frames).unwrap_or(usize::MAX),
                ctx.inner.regions.clone(),
            )),
            tables: Tables::new(),
            policy: Mutex::new(Policy::new(items)),
            flights: Mutex::new(Flights::default()),
            hits: Hits::default(),
        });
        let weak: std::sync::Weak<dyn Invalidate> = Arc::downgrade(&state) as _;
        ctx.inner.invalidation.add(weak);
        Ok(BlockCache { state })
    }

    /// Bytes per block (see [`new`](Self::new) for an example).
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.state.block
    }

    /// Most bytes of blocks the cache keeps (the capacity asked for, down
    /// to a whole number of blocks; see [`new`](Self::new) for an example).
    #[must_use]
    pub fn capacity_bytes(&self) -> u64 {
        self.state.capacity_blocks << self.state.shift
    }

    /// Block `block` of file `fid` (bytes `block × block_size` onwards):
    /// from the cache, or read (and cached) if it is not there. See
    /// [`BlockRef`] for what it holds; [`GetBlock`] for the future.
    ///
    /// # Errors
    ///
    /// As a read through the context: an unknown or stale `fid`
    /// (`InvalidInput`), the context shut down, the read's error (every
    /// caller waiting for the same read gets it; nothing is cached), a
    /// block starting beyond `i64::MAX` (`InvalidInput`).
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[1u8; 4096])?;
    /// # file.write_all(&[2u8; 4096])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
    /// let (a, b) = tokio::join!(cache.get(0, 1), cache.get(0, 1));
    /// assert_eq!((a?[0], b?[0]), (2, 2));
    /// assert_eq!(cache.get(0, 2).await?.len(), 0); // beyond the end of the file
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn get(&self, fid: impl Into<FileId>, block: u64) -> GetBlock<'_> {
        GetBlock {
            state: &self.state,
            fid: fid.into(),
            block,
            wait: None,
        }
    }

    /// Blocks `blocks` of file `fid`, in the order given (a block may be
    /// asked for twice): the cached ones at once, and every other one read
    /// together — those not already in flight in one batch, one
    /// `io_uring_enter` per ring — with each block's own result.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # for i in 0..8u8 { file.write_all(&[i; 4096])?; }
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
    /// let blocks = cache.get_many(0, [6, 1, 3]).await;
    /// let firsts: Vec<u8> = blocks.into_iter().map(|b| b.map(|b| b[0])).collect::<std::io::Result<_>>()?;
    /// assert_eq!(firsts, [6, 1, 3]);
    /// assert_eq!(cache.stats().misses, 3);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub async fn get_many(
        &self,
        fid: impl Into<FileId>,
        blocks: impl IntoIterator<Item = u64>,
    ) -> Vec<io::Result<BlockRef>> {
        let fid = fid.into();
        let blocks: Vec<u64> = blocks.into_iter().collect();
        admit(&self.state, blocks.len().saturating_mul(self.state.block)).await;
        let file = match self.state.resolve(fid) {
            Ok(f) => f,
            Err(e) => {
                let e = FlightError::new(&e, None);
                return blocks.iter().map(|_| Err(e.to_io())).collect();
            }
        };
        self.state.fetch(file, &blocks).await
    }

    /// Reads `buf.len()` bytes of file `fid` at `offset` through the cache
    /// into `buf` (any offset and length; the blocks it spans are read as
    /// [`get_many`](Self::get_many) would, then copied): the bytes read,
    /// fewer only at the end of the file. A read whose blocks are all
    /// cached completes at its first poll.
    ///
    /// Bytes of `buf` past the count returned, and all of them on an
    /// error, hold the file's bytes, zeros, or what they held before.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get), for the first block that fails.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(b"0123456789")?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
    /// let mut buf = [0u8; 8];
    /// assert_eq!(cache.read(0, 6, &mut buf).await?, 4); // the end of the file
    /// assert_eq!(&buf[..4], b"6789");
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub async fn read(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let fid = fid.into();
        let state = &*self.state;
        let file = state.resolve(fid)?;
        // No file reaches beyond i64::MAX (as the context's reads).
        let max = i64::MAX.unsigned_abs();
        if offset >= max || buf.is_empty() {
            return Ok(0);
        }
        let len = buf
            .len()
            .min(usize::try_from(max - offset).unwrap_or(usize::MAX));
        let first = offset >> state.shift;
        let last = (offset + len as u64 - 1) >> state.shift;
        // The lines the read copies of the first block load while the task
        // is admitted.
        let skip = state.skip(first, offset);
        let mut probed = state.probe(file.key, first, skip..skip.saturating_add(len));
        admit(state, len).await;
        let mut done = 0;
        let mut next = first;
        // Hits first, on this poll, without allocating.
        while next <= last {
            let Some(f) = probed
                .take()
                .or_else(|| state.tables.lookup(file.key, next))
            else {
                break;
            };
            // Copied without a pin, or, if the frame changed under the
            // copy, pinned, or looked up again if it moved since.
            if let Some((n, end)) = state.copy_hit(f, file.key, next, offset, &mut buf[done..len]) {
                done += n;
                next += 1;
                if end {
                    return Ok(done);
                }
                continue;
            }
            let hit = state
                .pin(f, file.key, next)
                .or_else(|| state.cached(file.key, next));
            let Some(block) = hit else {
                break;
            };
            let (n, end) = state.copy_out(&block, next, offset, &mut buf[done..len]);
            done += n;
            next += 1;
            if end {
                return Ok(done);
            }
        }
        if next > last {
            return Ok(done);
        }
        if next == last {
            // One block missing (most reads): join or start its flight.
            let block = self.state.one(file, next).await?;
            let (n, _) = state.copy_out(&block, next, offset, &mut buf[done..len]);
            return Ok(done + n);
        }
        // The rest, cached or not, up to `READ_WINDOW` blocks at a time in
        // one batch: a large read holds only a window of blocks at once.
        while next <= last {
            let end = last.min(next + READ_WINDOW - 1);
            let blocks: Vec<u64> = (next..=end).collect();
            for (b, res) in blocks.iter().zip(self.state.fetch(file, &blocks).await) {
                let block = res?;
                let (n, eof) = state.copy_out(&block, *b, offset, &mut buf[done..len]);
                done += n;
                if eof {
                    return Ok(done);
                }
            }
            next = end + 1;
        }
        Ok(done)
    }

    /// Starts reading the blocks of `range` of file `fid` that are neither
    /// cached nor in flight, in one batch, on a task of the current tokio
    /// runtime, and returns at once; later [`get`](Self::get)s of them wait
    /// for those reads instead of issuing their own. At most the cache's
    /// capacity is prefetched (the first blocks of the range). Errors of
    /// the reads are not reported (nothing is cached for them).
    ///
    /// # Errors
    ///
    /// An unknown or stale `fid`, the context shut down; no tokio runtime.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[4u8; 65536])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
    /// cache.prefetch(0, 0..65536)?;
    /// // Each get finds its block cached or joins the prefetch's read.
    /// for b in 0..16 {
    ///     assert_eq!(cache.get(0, b).await?[0], 4);
    /// }
    /// assert_eq!(cache.stats().misses, 16);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn prefetch(&self, fid: impl Into<FileId>, range: Range<u64>) -> io::Result<()> {
        let state = &self.state;
        let file = state.resolve(fid.into())?;
        let max = i64::MAX.unsigned_abs();
        let end = range.end.min(max);
        if range.start >= end {
            return Ok(());
        }
        let handle = tokio::runtime::Handle::try_current().map_err(|e| {
            io::Error::other(format!("block cache: prefetch needs a tokio runtime ({e})"))
        })?;
        let first = range.start >> state.shift;
        let last = ((end - 1) >> state.shift).min(first + state.capacity_blocks - 1);
        let missing: Vec<u64> = (first..=last)
            .filter(|&b| state.tables.lookup(file.key, b).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let (_, started) = state.join_or_start(file, &missing, state::Asker::Prefetch);
        if let Some(mut wait) = started {
            drop(handle.spawn(async move {
                std::future::poll_fn(|cx| state::poll_flight(&mut wait, cx)).await;
            }));
        }
        Ok(())
    }

    /// Drops the blocks of `range` of file `fid`, and of every other
    /// registration of the same file in the context (reads of them in
    /// flight complete for their callers but cache nothing): for changes
    /// the cache cannot see — writes through a descriptor the context does
    /// not have or another process, a truncation. Changes through the
    /// context (even a write whose future was dropped) are dropped without
    /// it.
    ///
    /// # Errors
    ///
    /// An unknown or stale `fid`.
    ///
    /// ```
    /// # use std::io::Write;
    /// use std::os::unix::fs::FileExt;
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[1u8; 4096])?;
    /// let other = file.try_clone()?; // a descriptor the context does not see
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
    /// assert_eq!(cache.get(0, 0).await?[0], 1);
    /// other.write_all_at(&[2u8], 0)?;
    /// assert_eq!(cache.get(0, 0).await?[0], 1); // not seen
    /// cache.invalidate(0, 0..1)?;
    /// assert_eq!(cache.get(0, 0).await?[0], 2);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn invalidate(&self, fid: impl Into<FileId>, range: Range<u64>) -> io::Result<()> {
        let fid = fid.into();
        self.state.resolve(fid)?;
        let len = range.end.saturating_sub(range.start);
        self.state.ctx.inner.files.get(fid)?.for_each_alias(|id| {
            self.state.drop_range(file_key(id), range.start, len);
        });
        Ok(())
    }

    /// A snapshot of the counters (see [`CacheStats`]).
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[1u8; 16384])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
    /// let held = cache.get(0, 0).await?;
    /// cache.invalidate(0, 0..4096)?; // out of the cache, still held
    /// let s = cache.stats();
    /// assert_eq!((s.resident_bytes, s.pinned_bytes, s.in_flight_bytes), (0, 4096, 0));
    /// drop(held);
    /// assert_eq!(cache.stats().pinned_bytes, 0);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        let s = &self.state;
        let bytes = |blocks: u64| blocks << s.shift;
        let (misses, coalesced) = {
            let f = lock(&s.flights);
            (f.misses, f.coalesced)
        };
        let (resident, evictions) = {
            let p = lock(&s.policy);
            (p.resident() as u64, p.evictions())
        };
        CacheStats {
            hits: s.hits.sum(),
            misses,
            coalesced,
            evictions,
            resident_bytes: bytes(resident),
            pinned_bytes: bytes(s.core.retired() as u64),
            in_flight_bytes: bytes(s.core.taken() as u64),
            pool_bytes: bytes(s.core.carved() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::count_waker;
    use futures::future::BoxFuture;
    use futures::FutureExt;
    use std::task::Context;

    /// Files registered, changed and unregistered one after another (an
    /// engine's short-lived files) leave no per-file bookkeeping behind.
    #[test]
    fn unregistered_files_leave_no_bookkeeping() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ctx = crate::UringContext::new(Vec::new()).unwrap();
            let cache = BlockCache::new(&ctx, CacheOptions::default()).unwrap();
            for i in 0..200u64 {
                let mut file = tempfile::tempfile().unwrap();
                std::io::Write::write_all(&mut file, &[7u8; 5000]).unwrap();
                let fid = ctx.register_file(file).unwrap();
                assert_eq!(cache.get(fid, 1).await.unwrap().len(), 5000 - 4096);
                cache.invalidate(fid, i..i + 10).unwrap();
                ctx.unregister_file(fid).unwrap();
            }
            let flights = crate::util::lock(&cache.state.flights);
            assert_eq!(
                (flights.epochs.len(), flights.short.len(), flights.map.len()),
                (0, 0, 0)
            );
        });
    }
    /// A miss of a file being unregistered, started after the caches heard
    /// of it (here by a second listener, as another thread could): its
    /// read must not land a block under the dead registration.
    #[test]
    fn a_miss_during_unregister_caches_nothing() {
        for backend in [
            crate::BackendChoice::IoUring,
            crate::BackendChoice::Fallback,
        ] {
            miss_during_unregister(backend);
        }
    }

    fn miss_during_unregister(backend: crate::BackendChoice) {
        type Pending = Mutex<Option<BoxFuture<'static, io::Result<BlockRef>>>>;
        struct MissDuring {
            cache: BlockCache,
            fid: FileId,
            get: Pending,
        }
        impl crate::changes::Invalidate for MissDuring {
            fn invalidate(&self, _: FileId, _: u64, len: u64) {
                if len != u64::MAX {
                    return;
                }
                let cache = self.cache.clone();
                let fid = self.fid;
                let mut get = async move { cache.get(fid, 1).await }.boxed();
                let (_, waker) = count_waker();
                // Polls until it is done or its read is under way (a first
                // poll may yield instead).
                for _ in 0..3 {
                    if get
                        .as_mut()
                        .poll(&mut Context::from_waker(&waker))
                        .is_ready()
                    {
                        return;
                    }
                }
                *crate::util::lock(&self.get) = Some(get);
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ctx = crate::UringContext::builder()
                .backend(backend)
                .build(Vec::new())
                .unwrap();
            let cache = BlockCache::new(&ctx, CacheOptions::default()).unwrap();
            let mut file = tempfile::tempfile().unwrap();
            std::io::Write::write_all(&mut file, &[7u8; 5000]).unwrap();
            let fid = ctx.register_file(file).unwrap();
            let during = Arc::new(MissDuring {
                cache: cache.clone(),
                fid,
                get: Mutex::default(),
            });
            let during_dyn: Arc<dyn crate::changes::Invalidate> = during.clone();
            ctx.inner.invalidation.add(Arc::downgrade(&during_dyn));
            ctx.unregister_file(fid).unwrap();
            let get = crate::util::lock(&during.get).take();
            if let Some(get) = get {
                // Its read may end either way; what it leaves is the test.
                let _ = get.await;
            }
            assert_eq!(
                cache.stats().resident_bytes,
                0,
                "{backend:?}: a block of the dead file"
            );
            let flights = crate::util::lock(&cache.state.flights);
            assert_eq!(
                (flights.epochs.len(), flights.short.len(), flights.map.len()),
                (0, 0, 0)
            );
        });
    }

    /// The buffers registered with each ring of `ctx`, as the kernel
    /// lists them in the ring's fdinfo (`0x<address>/<length>`, empty
    /// slots left out). Other tests' rings in this process are not looked
    /// at.
    fn kernel_registered_buffers(ctx: &crate::UringContext) -> Vec<Vec<String>> {
        let crate::shared::Backend::Uring(rings) = &ctx.inner.backend else {
            return Vec::new();
        };
        rings
            .iter()
            .map(|ring| {
                let info =
                    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", ring.fd())).unwrap();
                let bufs = info.split("UserBufs:").nth(1).unwrap_or_default();
                bufs.lines()
                    .skip(1)
                    .take_while(|l| l.starts_with(' '))
                    .filter_map(|l| l.split_once(": ").map(|(_, b)| b.trim().to_string()))
                    .filter(|b| b.starts_with("0x"))
                    .collect()
            })
            .collect()
    }

    /// The `VmFlags` of the mapping holding address `at` (/proc/self/smaps).
    fn vm_flags(at: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = (lo..hi).contains(&at);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.to_string();
                }
            }
        }
        panic!("no mapping holds {at:#x}")
    }

    /// A 2-worker runtime, as root (where `RLIMIT_MEMLOCK` does not apply
    /// to registration); otherwise `None`, said why.
    fn root_runtime() -> Option<tokio::runtime::Runtime> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "skipped: registration needs RLIMIT_MEMLOCK room, which only root is sure of"
            );
            return None;
        }
        Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
        )
    }

    /// In a runtime: a context of two rings on which every miss is read
    /// (the file is in the page cache: no inline reads), and a file of
    /// `blocks` 4 KiB blocks registered with it, with its bytes.
    fn two_rings_and_a_file(blocks: u32) -> (crate::UringContext, FileId, Vec<u8>) {
        let ctx = crate::UringContext::builder()
            .backend(crate::BackendChoice::IoUring)
            .rings(2)
            .inline_nowait(false)
            .build(Vec::new())
            .unwrap();
        let data: Vec<u8> = (0..blocks * 4096)
            .map(|i| ((i / 4096) ^ (i % 251)).to_le_bytes()[0])
            .collect();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &data).unwrap();
        let fid = ctx.register_file(file).unwrap();
        (ctx, fid, data)
    }

    /// A cache of `bytes` with 4 KiB blocks over `ctx`.
    fn cache_of(ctx: &crate::UringContext, bytes: u64) -> BlockCache {
        BlockCache::new(
            ctx,
            CacheOptions {
                capacity_bytes: bytes,
                block_size: 4096,
            },
        )
        .unwrap()
    }

    /// The frames' regions are registered with every ring (as root, where
    /// `RLIMIT_MEMLOCK` does not apply) and kept from forked children, a
    /// miss reads into them (with `READ_FIXED`), and dropping the cache
    /// unregisters them and gives their numbers back for the next cache.
    #[test]
    fn frames_are_registered_with_the_rings() {
        let Some(rt) = root_runtime() else {
            return;
        };
        rt.block_on(async {
            // 600 blocks: two regions of 512 frames.
            let (ctx, fid, data) = two_rings_and_a_file(600);
            let regions = ctx.inner.regions.clone().expect("a ring context's regions");
            for round in 0..2 {
                let cache = cache_of(&ctx, 4 << 20);
                let region_reads = || match &ctx.inner.backend {
                    crate::shared::Backend::Uring(rings) => rings
                        .iter()
                        .map(|r| r.region_reads.load(Ordering::Relaxed))
                        .sum::<u64>(),
                    crate::shared::Backend::Fallback => 0,
                };
                let before = region_reads();
                let mut owners = std::collections::BTreeSet::new();
                for b in 0..600u64 {
                    let block = cache.get(fid, b).await.unwrap();
                    let at = usize::try_from(b).unwrap() * 4096;
                    assert!(*block == data[at..at + 4096], "round {round}: block {b}");
                    let frame = block.frame();
                    owners.insert(cache.state.core.registered(frame).map(|r| r.region));
                }
                assert!(
                    owners.len() == 2 && owners.iter().all(Option::is_some),
                    "round {round}: the frames read into are in 2 registered regions: {owners:?}"
                );
                assert_eq!(
                    region_reads() - before,
                    600,
                    "round {round}: misses read with READ_FIXED"
                );
                let rings = kernel_registered_buffers(&ctx);
                let base = |r: usize| cache.state.core.region_base(r) as usize;
                for r in 0..2 {
                    let want = format!("0x{:x}/{}", base(r), 2 << 20);
                    let on = rings.iter().filter(|bufs| bufs.contains(&want)).count();
                    assert_eq!(
                        on, 2,
                        "round {round}: region {r} ({want}) on each of the 2 rings"
                    );
                }
                for r in 0..2 {
                    assert!(
                        vm_flags(base(r)).split_whitespace().any(|f| f == "dc"),
                        "round {round}: region {r} would be copied into a forked child"
                    );
                }
                wait_for_spare(&cache);
                drop(cache);
                let (handed, free) = regions.numbers();
                assert_eq!(
                    usize::from(handed),
                    free,
                    "round {round}: numbers given back"
                );
                let left: Vec<String> = kernel_registered_buffers(&ctx)
                    .concat()
                    .into_iter()
                    .filter(|b| b.ends_with(&format!("/{}", 2 << 20)))
                    .collect();
                assert!(
                    left.is_empty(),
                    "round {round}: regions still registered after the cache went: {left:?}"
                );
            }
        });
    }

    /// Until no spare region is being made (at most 10 s).
    fn wait_for_spare(cache: &BlockCache) {
        let t0 = std::time::Instant::now();
        while cache.state.core.spare().0 {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "a spare region still being made after 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// While the cache fills, the next region's memory is made ahead on
    /// the runtime's blocking pool, registered with the rings, and the
    /// miss that needs a new region takes it; none is made past the
    /// capacity, and one being made when the cache goes is unregistered
    /// and freed.
    #[test]
    fn the_next_region_is_made_ahead_while_the_cache_fills() {
        let Some(rt) = root_runtime() else {
            return;
        };
        rt.block_on(async {
            let (ctx, fid, data) = two_rings_and_a_file(1600);
            let regions = ctx.inner.regions.clone().expect("a ring context's regions");
            // Three regions of 512 frames.
            let cache = cache_of(&ctx, 6 << 20);
            let core = &cache.state.core;
            let get = |b: u64| {
                let cache = &cache;
                let data = &data;
                async move {
                    let block = cache.get(fid, b).await.unwrap();
                    let at = usize::try_from(b).unwrap() * 4096;
                    assert!(*block == data[at..at + 4096], "block {b}");
                    block.frame()
                }
            };
            let mut next = 0;
            for r in 0..3 {
                // The first block in region r (region 0: made by this
                // miss; the others: the spare, opened by the last round).
                let f = get(next).await;
                assert_eq!(f as usize >> 9, r, "block {next} in region {r}");
                next += 1;
                let registered = core.registered(f).is_some();
                assert!(registered, "region {r} registered before its first read");
                wait_for_spare(&cache);
                let (_, spare) = core.spare();
                if r < 2 {
                    let spare = spare.unwrap_or_else(|| panic!("a spare after region {r}"));
                    let want = format!("0x{spare:x}/{}", 2 << 20);
                    let on = kernel_registered_buffers(&ctx)
                        .iter()
                        .filter(|bufs| bufs.contains(&want))
                        .count();
                    assert_eq!(
                        on, 2,
                        "the spare ({want}) registered on each of the 2 rings"
                    );
                    for b in next..next + 511 {
                        get(b).await;
                    }
                    next += 511;
                    assert_eq!(
                        core.spare().1,
                        Some(spare),
                        "unused until region {r} is full"
                    );
                    // The next miss (block `next`, read again as the
                    // first of the next round) opens region r + 1.
                    assert_eq!(get(next).await as usize >> 9, r + 1);
                    assert_eq!(
                        core.region_base(r + 1) as usize,
                        spare,
                        "region {} is the spare",
                        r + 1
                    );
                } else {
                    assert_eq!(spare, None, "no spare past the capacity");
                }
            }
            drop(cache);
            let (handed, free) = regions.numbers();
            assert_eq!(usize::from(handed), free, "numbers given back");
        });
    }

    /// A cache dropped while its spare region is being made: the spare is
    /// unregistered and freed by the job making it.
    #[test]
    fn a_spare_of_a_cache_dropped_meanwhile_is_freed() {
        let Some(rt) = root_runtime() else {
            return;
        };
        rt.block_on(async {
            let (ctx, fid, _) = two_rings_and_a_file(0);
            let regions = ctx.inner.regions.clone().expect("a ring context's regions");
            let cache = cache_of(&ctx, 6 << 20);
            // A miss (beyond the end of the file) carves region 0 and
            // starts the spare.
            assert!(cache.get(fid, 0).await.unwrap().is_empty());
            drop(cache);
            // The job runs whether or not the cache is still there: it
            // registers the spare (region 0 was the first registration),
            // then unregisters it.
            let t0 = std::time::Instant::now();
            loop {
                let (handed, free) = regions.numbers();
                if regions.registered() == 2 && usize::from(handed) == free {
                    break;
                }
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(10),
                    "after 10 s: {} registrations, numbers {:?} (handed out, free)",
                    regions.registered(),
                    regions.numbers()
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let left: Vec<String> = kernel_registered_buffers(&ctx)
                .concat()
                .into_iter()
                .filter(|b| b.ends_with(&format!("/{}", 2 << 20)))
                .collect();
            assert!(left.is_empty(), "regions still registered: {left:?}");
        });
    }
}
