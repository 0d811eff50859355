//! Sequential scans: a file range as a [`Stream`] of [`Chunk`]s in file
//! order, with several reads kept in flight ahead of the consumer.
//!
//! ```
//! use std::io::Write;
//! use futures::StreamExt;
//! use uring_positioned_io::{ScanOptions, UringContext};
//!
//! # fn main() -> std::io::Result<()> {
//! let mut file = tempfile::tempfile()?;
//! file.write_all(b"one\ntwo\nthree\n")?;
//!
//! let rt = tokio::runtime::Runtime::new()?;
//! rt.block_on(async {
//!     let ctx = UringContext::new(vec![file])?;
//!     // 64 KiB chunks, 4 reads in flight ahead of the consumer, whole file.
//!     let mut scan = ScanOptions::new()
//!         .chunk_size(64 << 10)
//!         .in_flight(4)
//!         .scan(&ctx, 0, ..)?;
//!     let mut lines = 0;
//!     while let Some(chunk) = scan.next().await {
//!         let chunk = chunk?; // derefs to [u8]; chunk.offset() is its file offset
//!         lines += chunk.iter().filter(|&&b| b == b'\n').count();
//!     } // a dropped chunk gives its buffer back to the scan
//!     assert_eq!(lines, 3);
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # How it works
//!
//! A scan owns a small pool of at most `in_flight` buffers of
//! `chunk_size` bytes (fewer for a range that needs fewer), the slots of
//! allocations of up to 8 MiB (or one chunk) made as they are first
//! needed: one for the default 8 × 1 MiB. Each buffer is either being read
//! into (an owned, zero-copy [`UringContext::read_owned`]), or held by the
//! consumer as a [`Chunk`], or free. The stream starts a read whenever a
//! buffer is free (or not handed out yet), so up to `in_flight` reads run ahead of the
//! consumer; chunks are yielded strictly in file order. A consumer holding
//! chunks holds buffers, and dropping a chunk puts its buffer back. Memory
//! is therefore bounded by `chunk_size × in_flight`, and in steady state
//! nothing is allocated per chunk.
//!
//! # A consumer holding every buffer
//!
//! With every buffer held by a chunk not dropped yet, no read can start.
//! What `next()` does then is [`ScanOptions::wait_for_dropped_chunks`]:
//!
//! - by default it returns an error (kind `ResourceBusy`) saying that all
//!   the buffers are held and what to do, rather than wait for a drop that
//!   a consumer keeping every chunk (`collect()`, a `Vec` of chunks) would
//!   never make; a range that ends at end of file right after the chunks
//!   held ends instead (a small read checks). The error does not end the
//!   stream: the next `next()` goes on if a chunk has been dropped since,
//!   and returns `None` otherwise. A consumer that keeps at most
//!   `in_flight − 1` chunks never sees it;
//! - with `wait_for_dropped_chunks(true)` it waits (`Pending`) until a
//!   chunk is dropped, on any thread, which wakes the stream: the
//!   backpressure a pipeline wants, whose consumer hands chunks to other
//!   tasks that drop them later.
//!
//! Reads are aligned: every read starts at a multiple of
//! [`align`](ScanOptions::align) (default 4096) into an aligned buffer and
//! asks for a multiple of it, so files opened with `O_DIRECT` work; a range
//! that starts or ends inside a block reads the whole block and the chunk
//! shows only the bytes of the range.
//!
//! # End of file, short reads and errors
//!
//! The file's length is not known up front (the context does not expose it):
//! the scan ends at the range's end or at end of file, whichever comes first.
//! A read that returns fewer bytes than asked is continued from exactly where
//! it stopped, never skipped; end of file is a read that returns 0. On an
//! `O_DIRECT` file a read is short only at end of file, where the
//! continuation (at an unaligned offset) returns 0 on iomap file systems
//! (ext4, XFS, btrfs); should the file system refuse it with `EINVAL`
//! instead, that too is taken as end of file — only for a continuation
//! from inside a block, never for a chunk's first read. An error is
//! yielded once and ends the stream (reads interrupted with `EINTR` are
//! retried), except the error of a consumer holding every buffer (above).
//!
//! # Cached and uncached files
//!
//! When at least 512 KiB of reads are kept ahead of the consumer
//! (`chunk_size × (in_flight − 1)`, as with the defaults), the scan's reads
//! go straight to a ring instead of first trying the page cache on the
//! consumer's thread (`preadv2(RWF_NOWAIT)`, which plain reads do). On an
//! uncached file, such attempts start the kernel's readahead out of order
//! and break its window into small requests; on a cached one, the ring lets
//! the thread that submits (usually another runtime worker) copy the next
//! chunk while the consumer works on this one. One chunk in four (from the
//! second chunk handed out on) still tries the page cache on the consumer's
//! thread, so that on a cached file the consumer takes a share of the
//! copying; the first such read that misses turns this off for the rest of
//! the scan. A consumer whose own thread would do the ring's copying (a
//! task, which runs on a runtime worker whose poll submits the ring reads
//! and copies them in its `io_uring_enter`; or `block_on` of a
//! `current_thread` runtime, the ring's only thread) has the other reads
//! copied by the context's blocking pool instead, on another thread, once
//! its share has hit the page cache. With less ahead, the ring's round trip
//! would not be hidden, so every read takes the page cache inline. The
//! measurements are in the crate's `docs/DESIGN.md` ("Scans").
//!
//! From 2 MiB in all, the buffers' allocation is a mapping of its own
//! ([`AlignedBuf::new_huge`]), backed by transparent huge pages where the
//! system allows it: it comes zero-filled and is faulted in 2 MiB at a time.
//! On a file opened with `O_DIRECT` the default chunk is 2 MiB rather than
//! 1 MiB, so that each chunk is one physically contiguous huge page, which
//! lets each read reach the device in a few segments instead of one per
//! 4 KiB page.
//!
//! # Dropping
//!
//! Dropping the stream drops the reads it has in flight, which is sound: the
//! context keeps the buffers of abandoned owned reads until the kernel is
//! done with them, then frees them. Those buffers never come back to the
//! pool, and need not: the stream that would reuse them is gone. Chunks
//! already yielded stay valid after the stream is dropped.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::ops::{Bound, Deref, RangeBounds};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::Stream;

use crate::buf::{AlignedBuf, IoBufMut, Slice};
use crate::context::UringContext;
use crate::error::{invalid, shut_down_error};
use crate::id::FileId;
use crate::ops::read::UringReadOwnedFuture;

const DEFAULT_CHUNK: usize = 1 << 20;
/// Default chunk of a scan of an `O_DIRECT` file: a transparent huge page,
/// so that each chunk buffer can be physically contiguous (the buffers are
/// slots of one `AlignedBuf::new_huge` mapping, see `Region`).
const DEFAULT_DIRECT_CHUNK: usize = 2 << 20;
/// Default buffers of a buffered scan: 8 × 1 MiB. On a cached file the
/// deeper read-ahead keeps the copying worker busy (DESIGN, "Scans").
const DEFAULT_IN_FLIGHT: usize = 8;
/// Default buffers of an `O_DIRECT` scan: 4 × 2 MiB, the same 8 MiB.
const DEFAULT_DIRECT_IN_FLIGHT: usize = 4;
/// Largest `chunk_size`: a chunk is one read, and one read moves at most
/// ~2 GiB (`MAX_RW_COUNT`); a chunk of more than 1 GiB buys nothing.
const MAX_CHUNK: usize = 1 << 30;
/// Largest `in_flight`: far past where more read-ahead helps (DESIGN,
/// "Scans").
const MAX_IN_FLIGHT: usize = 1024;
/// Slots reserved up front; a deeper scan grows its queue as it goes.
const INITIAL_SLOTS: usize = 16;
const DEFAULT_ALIGN: usize = 4096;
/// Largest allocation of a scan's buffers (a `Region`), unless one chunk is
/// larger: the default 8 MiB of buffers is one region, four huge pages;
/// settings far beyond that (1024 chunks of 1 GiB) map their buffers a
/// chunk at a time, as they are needed.
const REGION_BYTES: usize = 8 << 20;
/// Bytes of read-ahead (`chunk_size × (in_flight − 1)`) from which a
/// scan's reads skip the page-cache fast path and go to a ring (see the
/// module's "Cached and uncached files", and DESIGN, "Scans", for where
/// the crossover was found).
const RING_AHEAD: usize = 512 << 10;
/// With read-ahead on the ring, one chunk in this many is still read on the
/// consumer's thread when the file is cached, so that the consumer takes a
/// share of the copying (see the module's "Cached and uncached files").
const CONSUMER_SHARE: u64 = 4;
/// Largest read that checks whether the file goes on when every buffer is
/// held (see [`Held`]): one block of the alignment, at most a page.
const PROBE: usize = 4096;

/// Settings of a scan; [`scan`](ScanOptions::scan) starts one.
///
/// A scan is a free-standing builder rather than a method of
/// [`UringContext`]: it is built on the context's owned reads
/// (`read_owned` of aligned buffers), holding no more of the context than
/// any caller of `read_owned` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanOptions {
    chunk_size: usize,
    /// `chunk_size` was set by the caller (else it depends on `O_DIRECT`).
    chunk_set: bool,
    in_flight: usize,
    /// `in_flight` was set by the caller (else it depends on `O_DIRECT`).
    in_flight_set: bool,
    align: usize,
    /// With every buffer held by a chunk, `next()` waits for one to be
    /// dropped instead of failing.
    wait_for_dropped: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            chunk_size: DEFAULT_CHUNK,
            chunk_set: false,
            in_flight: DEFAULT_IN_FLIGHT,
            in_flight_set: false,
            align: DEFAULT_ALIGN,
            wait_for_dropped: false,
        }
    }
}

impl ScanOptions {
    /// Defaults: 1 MiB chunks, 8 reads in flight, 4096-byte alignment; on a
    /// file opened with `O_DIRECT`, 2 MiB chunks and 4 reads in flight (8 MiB
    /// of buffers either way).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes per chunk and per read; a non-zero multiple of the alignment,
    /// at most 1 GiB. Default: 1 MiB, or 2 MiB on a file opened with `O_DIRECT` (see the
    /// module's "Cached and uncached files").
    #[must_use]
    pub fn chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_size = bytes;
        self.chunk_set = true;
        self
    }

    /// Buffers of the scan (default 8, or 4 on a file opened with
    /// `O_DIRECT`): the reads in flight ahead of the consumer plus the
    /// chunks it holds (with all of them held, see
    /// [`wait_for_dropped_chunks`](Self::wait_for_dropped_chunks)). From 1
    /// to 1024. A scan holds up to `chunk_size ×
    /// in_flight` of memory, 8 MiB with the defaults: many scans at once (a
    /// k-way merge over many files, say) want fewer or smaller chunks.
    #[must_use]
    pub fn in_flight(mut self, reads: usize) -> Self {
        self.in_flight = reads;
        self.in_flight_set = true;
        self
    }

    /// Alignment of every read's offset, length and buffer (default 4096, as
    /// `O_DIRECT` needs on most devices); a power of two. 1 reads exactly
    /// the range on buffered files.
    #[must_use]
    pub fn align(mut self, bytes: usize) -> Self {
        self.align = bytes;
        self
    }

    /// What `next()` does when every buffer is held by a chunk not dropped
    /// yet, so that no read can start (default `false`).
    ///
    /// `false`: `next()` returns an error of kind
    /// [`ResourceBusy`](io::ErrorKind::ResourceBusy) saying so, rather than
    /// waiting for a drop that a consumer holding its chunks (`collect()`,
    /// say) would never make. Chunks dropped before the call count,
    /// whichever thread dropped them; a read in flight is waited for as
    /// usual. Before failing, the scan checks with a small read that the
    /// file goes on, so a range that ends at end of file right after the
    /// chunks held ends the stream instead. The error does not end the
    /// stream: the next `next()` goes on if a chunk has been dropped since,
    /// and otherwise returns `None` (so loops that take every item, such as
    /// `collect()`, stop).
    ///
    /// `true`: `next()` waits until a chunk is dropped, on any thread (the
    /// drop wakes the stream). This is for pipelines: a consumer that hands
    /// chunks to other tasks or threads, which drop them later, uses the
    /// scan's buffers as backpressure (with `false`, such a consumer gets
    /// the error whenever it is ahead of them). A consumer that holds every
    /// chunk itself then waits forever.
    ///
    /// So: `false` when the code calling `next()` drops the chunks itself
    /// (a loop that keeps at most `in_flight − 1` of them never sees the
    /// error); `true` when other tasks drop them.
    #[must_use]
    pub fn wait_for_dropped_chunks(mut self, wait: bool) -> Self {
        self.wait_for_dropped = wait;
        self
    }

    /// Whether this scan's reads skip the page-cache fast path (see the
    /// module's "Cached and uncached files").
    fn ring_only(&self) -> bool {
        self.chunk_size.saturating_mul(self.in_flight - 1) >= RING_AHEAD
    }

    /// The settings' own checks.
    fn check(&self) -> io::Result<()> {
        if !self.align.is_power_of_two() {
            return invalid(format!(
                "ScanOptions::align({}): must be a power of two",
                self.align
            ));
        }
        if self.chunk_size == 0 || self.chunk_size % self.align != 0 {
            return invalid(format!(
                "ScanOptions::chunk_size({}): must be a non-zero multiple of the alignment {}",
                self.chunk_size, self.align
            ));
        }
        if self.chunk_size > MAX_CHUNK {
            return invalid(format!(
                "ScanOptions::chunk_size({}): at most {MAX_CHUNK} (1 GiB; a chunk is one read)",
                self.chunk_size
            ));
        }
        if self.in_flight == 0 || self.in_flight > MAX_IN_FLIGHT {
            return invalid(format!(
                "ScanOptions::in_flight({}): must be from 1 to {MAX_IN_FLIGHT}",
                self.in_flight
            ));
        }
        Ok(())
    }

    /// Starts a scan of `range` of file `fid` (`..` for the whole file; an
    /// end beyond the file stops at end of file). Nothing is read until the
    /// stream is polled; what can be checked without reading is checked
    /// here.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for settings out of range (naming them), a range
    /// whose start is beyond its end or beyond `i64::MAX`, or an `fid` that
    /// every call taking it refuses (not registered, or a checked id of
    /// another context or of an unregistered file: see [`FileId`]), with
    /// the same error as theirs; the shut-down error if the context is
    /// shut down.
    pub fn scan<'a>(
        &self,
        ctx: &'a UringContext,
        fid: impl Into<FileId>,
        range: impl RangeBounds<u64>,
    ) -> io::Result<Scan<'a>> {
        let fid = fid.into();
        if ctx.inner.closed.load(Ordering::Acquire) {
            return Err(shut_down_error());
        }
        let direct = ctx.file_is_direct(fid)?;
        let mut opts = *self;
        if direct {
            if !opts.chunk_set {
                opts.chunk_size = DEFAULT_DIRECT_CHUNK.max(opts.align);
            }
            if !opts.in_flight_set {
                opts.in_flight = DEFAULT_DIRECT_IN_FLIGHT;
            }
        }
        opts.check()?;
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        if start > end {
            return invalid(format!(
                "scan of {fid}, range {start}..{end}: start beyond end"
            ));
        }
        if start > i64::MAX.unsigned_abs() {
            // Named here, with the caller's numbers, as a read at such an
            // offset is refused (even an empty one).
            return invalid(format!(
                "scan of {fid}, range {start}..{end}: starts beyond i64::MAX, where no file has data"
            ));
        }
        let align = self.align as u64;
        let next = start - start % align;
        // Buffers the range can use at most: a short range need not map
        // `in_flight` of them.
        let chunks = (end - next).div_ceil(opts.chunk_size as u64);
        let slots = usize::try_from(chunks).map_or(opts.in_flight, |c| c.min(opts.in_flight));
        Ok(Scan {
            ctx,
            fid,
            opts,
            start,
            end,
            next,
            buffers: slots,
            slots: VecDeque::with_capacity(opts.in_flight.min(INITIAL_SLOTS)),
            pool: Arc::new(Pool {
                state: Mutex::new(PoolState {
                    free: Vec::with_capacity(opts.in_flight.min(INITIAL_SLOTS)),
                    regions: Vec::new(),
                    waker: None,
                }),
                allocated: AtomicUsize::new(0),
            }),
            stopped: start == end,
            cache: Cache::Unknown,
            yielded: false,
            held: Held::No,
        })
    }
}

/// The buffers of one scan, shared by the stream and its chunks.
struct Pool {
    state: Mutex<PoolState>,
    /// Buffers handed out so far (never more than the scan's buffers).
    allocated: AtomicUsize,
}

struct PoolState {
    free: Vec<SlotBuf>,
    /// The memory of the buffers handed out so far: regions of up to
    /// `REGION_BYTES` each, made as they are needed.
    regions: Vec<Arc<Region>>,
    /// The stream, waiting for a chunk to be dropped.
    waker: Option<Waker>,
}

/// Memory of a scan's buffers: one allocation of `slots × chunk` bytes
/// (at most `REGION_BYTES`, or one chunk), whose slots are buffers. From
/// 2 MiB it is its own mapping, aligned to 2 MiB and backed by transparent
/// huge pages where the system allows ([`AlignedBuf::try_new_huge`]): it
/// comes zero-filled from the kernel and is faulted in a huge page at a
/// time, where buffers from the allocator would be zeroed by `memset` and
/// faulted in 4 KiB at a time (DESIGN, "Scans"). A huge page is also
/// physically contiguous, which an `O_DIRECT` read into it needs to reach
/// the device in a few segments.
struct Region {
    /// Owns the memory (freed when the last slot and the pool are gone);
    /// never read or written through: only through `base`.
    _mem: AlignedBuf,
    /// Start of slot 0; slot `i` is `chunk` bytes at `base + i × chunk`.
    base: NonNull<u8>,
    chunk: usize,
}

// SAFETY: a Region is a handle on memory it owns and never touches itself;
// each slot is read and written only through the one `SlotBuf` made for
// it, which the pool, a read in flight or a chunk owns at a time.
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` gives access to nothing but `base` and `chunk`.
unsafe impl Sync for Region {}

impl Region {
    /// Zeroed memory for `slots` buffers of `chunk` bytes aligned to `align`.
    fn new(slots: usize, chunk: usize, align: usize) -> io::Result<Region> {
        let len = slots.checked_mul(chunk).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("scan: {slots} buffers of {chunk} bytes overflow the address space"),
            )
        })?;
        let mut mem = AlignedBuf::try_new_huge(len, align).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("scan: cannot allocate {slots} chunk buffers of {chunk} bytes: {e}"),
            )
        })?;
        // The allocation does not move when `mem` does.
        let base = NonNull::new(mem.stable_mut_ptr()).expect("an allocation is not null");
        Ok(Region {
            _mem: mem,
            base,
            chunk,
        })
    }
}

/// Slot `index` of a [`Region`]: one chunk buffer. Exactly one exists per
/// slot (the pool makes each once and never clones it), so whoever holds it
/// has the slot's bytes to itself; it keeps the region alive.
struct SlotBuf {
    region: Arc<Region>,
    index: usize,
}

impl SlotBuf {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: index < slots, so the offset stays inside the allocation.
        unsafe {
            self.region
                .base
                .as_ptr()
                .add(self.index * self.region.chunk)
        }
    }
}

impl Deref for SlotBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the slot's `chunk` bytes are inside the region, which this
        // buffer keeps alive, initialised (zero-filled, then written only by
        // reads), and nobody else reaches them while this buffer exists.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.region.chunk) }
    }
}

// SAFETY: the slot's `chunk` bytes stay where they are (the region's
// allocation never moves) and allocated while this buffer, which holds an
// `Arc` of the region, lives; no other `SlotBuf` covers them; all of them
// are initialised (zero-filled at allocation), so `bytes_init` is
// `bytes_total` and never changes.
unsafe impl IoBufMut for SlotBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr()
    }
    fn bytes_init(&self) -> usize {
        self.region.chunk
    }
    fn bytes_total(&self) -> usize {
        self.region.chunk
    }
    unsafe fn set_init(&mut self, _pos: usize) {}
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A free buffer, a slot not handed out yet (of `slots` buffers of
    /// `chunk` bytes in all, in regions of up to `REGION_BYTES` made as
    /// they are needed), or `None` after registering `waker` to be woken by
    /// the next returned buffer. `Err` if a region cannot be allocated.
    fn take(
        &self,
        slots: usize,
        chunk: usize,
        align: usize,
        waker: &Waker,
    ) -> io::Result<Option<SlotBuf>> {
        let mut st = self.lock();
        if let Some(b) = st.free.pop() {
            return Ok(Some(b));
        }
        let next = self.allocated.load(Ordering::Relaxed);
        if next < slots {
            // Whole chunks per region (at least one), so that huge settings
            // on a short file map what they use, as lazily as before.
            let per_region = (REGION_BYTES / chunk).max(1);
            let (which, index) = (next / per_region, next % per_region);
            if which == st.regions.len() {
                let n = per_region.min(slots - which * per_region);
                st.regions.push(Arc::new(Region::new(n, chunk, align)?));
            }
            let region = st.regions[which].clone();
            self.allocated.store(next + 1, Ordering::Relaxed);
            return Ok(Some(SlotBuf { region, index }));
        }
        if !st.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            st.waker = Some(waker.clone());
        }
        Ok(None)
    }

    fn put(&self, buf: SlotBuf) {
        let waker = {
            let mut st = self.lock();
            st.free.push(buf);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

enum SlotState<'a> {
    /// Reading into a window of the buffer: the continuation of a short
    /// read fills the rest of the same buffer.
    Reading(UringReadOwnedFuture<'a, Slice<SlotBuf>>),
    Done(SlotBuf),
    Failed(io::Error),
    /// Transient, while the state is being replaced.
    Empty,
}

/// Whether a ring read issued from this thread would be copied out of the
/// page cache on this thread anyway: a task runs on a runtime worker, whose
/// own poll submits for an idle driver (and where the driver, woken from
/// it, runs next); a thread that polls drivers is such a worker, or the
/// thread of a `current_thread` runtime hosting the context. Only a
/// consumer outside the runtime (`block_on` of a multi-thread runtime, a
/// thread of its own) has the ring's copying done on another CPU.
fn copies_ring_reads_itself() -> bool {
    tokio::task::try_id().is_some() || crate::thread::on_driver_thread()
}

/// Reads the rest of `slot` (from `read_from`) into `buf`.
fn read_rest<'a>(
    ctx: &'a UringContext,
    fid: FileId,
    slot: &Slot<'a>,
    buf: SlotBuf,
    ring_only: bool,
) -> UringReadOwnedFuture<'a, Slice<SlotBuf>> {
    // read_from <= want <= buf.len() (zeroed, all initialised), so the
    // window fits.
    let win = buf.slice(slot.read_from..slot.want);
    let read = ctx.read_owned(fid, slot.offset + slot.read_from as u64, win);
    if ring_only {
        read.ring_only()
    } else {
        read
    }
}

/// One chunk being read: `want` bytes of the file at `offset` (aligned).
struct Slot<'a> {
    offset: u64,
    want: usize,
    /// Bytes in the buffer from its start, once the slot is `Done`.
    done: usize,
    /// Start (in the buffer) of the read in flight: 0, or where a short
    /// read stopped.
    read_from: usize,
    /// The chunk's read may take the page-cache fast path although the
    /// scan's read-ahead goes to the ring: the consumer's share.
    consumer: bool,
    state: SlotState<'a>,
}

/// A scan in progress: a [`Stream`] of the range's [`Chunk`]s in file order.
/// Made by [`ScanOptions::scan`] or [`Scan::new`].
pub struct Scan<'a> {
    ctx: &'a UringContext,
    fid: FileId,
    opts: ScanOptions,
    start: u64,
    end: u64,
    /// Offset of the next chunk to read (aligned).
    next: u64,
    /// Buffers of the scan: `in_flight`, or fewer for a short range.
    buffers: usize,
    slots: VecDeque<Slot<'a>>,
    pool: Arc<Pool>,
    /// End of file, end of range or an error: no more reads.
    stopped: bool,
    /// What the consumer's share has learnt of the page cache.
    cache: Cache,
    /// A chunk has been handed out. The consumer's share starts only then:
    /// a read of the first burst that took the page-cache path at once
    /// would reach the kernel before the ring's reads of the chunks in front
    /// of it, and its readahead would start out of order.
    yielded: bool,
    /// Where the stream is with a consumer holding every buffer (without
    /// `wait_for_dropped_chunks`).
    held: Held<'a>,
}

/// A consumer holds every buffer (no read in flight, none free), and the
/// scan does not wait for a dropped chunk: the steps to the error. Any read
/// started (a chunk was dropped) puts it back to `No`.
enum Held<'a> {
    No,
    /// A read of a block at `next` checks that the file goes on: if it ends
    /// there, the stream ends rather than failing.
    /// (Boxed: it is rare, and the scan stays small.)
    Probing(Box<UringReadOwnedFuture<'a, AlignedBuf>>),
    /// The file goes on (or could not be asked): the error is due once the
    /// pool, looked at once more, still has no buffer.
    GoesOn,
    /// The error was returned and no chunk has been dropped since: the next
    /// call ends the stream.
    Told,
}

/// What the reads of the consumer's share have found in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    /// No read of the share has completed yet.
    Unknown,
    /// Every one so far was served whole from the page cache: the file is
    /// cached, and a consumer whose thread would copy the ring's reads
    /// itself has the others copied by the blocking pool.
    Hit,
    /// One was not: the file is not (all) cached, and the rest of the scan
    /// leaves every read to the ring (a miss on the consumer's thread
    /// starts the kernel's readahead out of order, shrinking the disk
    /// requests even when re-probed only now and then; see DESIGN,
    /// "Scans"). Final.
    Missed,
}

impl<'a> Scan<'a> {
    /// A scan of `range` of file `fid` with default [`ScanOptions`].
    ///
    /// # Errors
    ///
    /// As [`ScanOptions::scan`].
    pub fn new(
        ctx: &'a UringContext,
        fid: impl Into<FileId>,
        range: impl RangeBounds<u64>,
    ) -> io::Result<Scan<'a>> {
        ScanOptions::new().scan(ctx, fid, range)
    }

    /// Buffers this scan has allocated so far: never more than
    /// [`in_flight`](ScanOptions::in_flight), however long the range.
    #[must_use]
    pub fn buffers_allocated(&self) -> usize {
        self.pool.allocated.load(Ordering::Relaxed)
    }

    /// Starts reads while buffers are available and the range goes on.
    fn issue(&mut self, cx: &Context<'_>) {
        let (chunk, align) = (self.opts.chunk_size, self.opts.align);
        while !self.stopped && self.next < self.end && self.slots.len() < self.opts.in_flight {
            let buf = match self.pool.take(self.buffers, chunk, align, cx.waker()) {
                Ok(Some(buf)) => buf,
                Ok(None) => break,
                Err(e) => {
                    // Yielded in order, after the chunks before it; it ends
                    // the stream as a read error would.
                    self.slots.push_back(Slot {
                        offset: self.next,
                        want: 0,
                        done: 0,
                        read_from: 0,
                        consumer: false,
                        state: SlotState::Failed(e),
                    });
                    self.stopped = true;
                    break;
                }
            };
            // Read whole aligned blocks up to the range's end.
            let left = self.end - self.next;
            let want = if left >= chunk as u64 {
                chunk
            } else {
                // left < chunk, a usize.
                usize::try_from(left)
                    .unwrap_or(chunk)
                    .next_multiple_of(align)
            };
            // want <= chunk, the buffer's length.
            let fut = self.ctx.read_owned(self.fid, self.next, buf.slice(..want));
            let mut consumer = false;
            let fut = if self.opts.ring_only() {
                let turn = (self.next / chunk as u64) % CONSUMER_SHARE == CONSUMER_SHARE - 1;
                consumer = turn && self.yielded && self.cache != Cache::Missed;
                if consumer {
                    fut
                } else if self.cache == Cache::Hit && copies_ring_reads_itself() {
                    // On a cached file the blocking pool copies instead, on
                    // another thread.
                    fut.via_blocking_pool()
                } else {
                    fut.ring_only()
                }
            } else {
                fut
            };
            self.slots.push_back(Slot {
                offset: self.next,
                want,
                done: 0,
                read_from: 0,
                consumer,
                state: SlotState::Reading(fut),
            });
            self.next = self.next.saturating_add(chunk as u64);
        }
    }

    /// Polls every read in flight; continues short reads.
    fn poll_reads(&mut self, cx: &mut Context<'_>) {
        let align = self.opts.align;
        for slot in &mut self.slots {
            while let SlotState::Reading(fut) = &mut slot.state {
                let Poll::Ready((res, win)) = Pin::new(&mut *fut).poll(cx) else {
                    break;
                };
                if slot.consumer {
                    slot.consumer = false;
                    if self.cache != Cache::Missed {
                        self.cache = if fut.served_inline() {
                            Cache::Hit
                        } else {
                            Cache::Missed
                        };
                    }
                }
                let buf = win.into_inner();
                match res {
                    Ok(n) => {
                        slot.done = slot.read_from + n;
                        if n == 0 || slot.done >= slot.want {
                            // End of file, or complete.
                            slot.state = SlotState::Done(buf);
                        } else {
                            // Short read before the end: read the rest.
                            slot.read_from = slot.done;
                            slot.state = SlotState::Reading(read_rest(
                                self.ctx,
                                self.fid,
                                slot,
                                buf,
                                self.opts.ring_only(),
                            ));
                        }
                    }
                    Err(e)
                        if crate::error::os_error(&e) == Some(libc::EINVAL)
                            && slot.read_from % align != 0 =>
                    {
                        // A continuation from inside a block that the file
                        // refuses: an O_DIRECT file, whose reads are short
                        // only at its end.
                        slot.state = SlotState::Done(buf);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                        slot.state = SlotState::Reading(read_rest(
                            self.ctx,
                            self.fid,
                            slot,
                            buf,
                            self.opts.ring_only(),
                        ));
                    }
                    Err(e) => {
                        self.pool.put(buf);
                        slot.state = SlotState::Failed(e);
                    }
                }
            }
        }
    }

    /// Ends the stream: drops the reads in flight (their buffers stay with
    /// the context until the kernel is done).
    fn stop(&mut self) {
        self.stopped = true;
        self.slots.clear();
        self.held = Held::No;
    }

    /// The error of a scan whose consumer holds every buffer.
    fn all_held(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "scan of {}: all {} buffers are held by chunks not dropped yet, so the chunk at \
                 offset {} cannot be read: drop chunks before asking for the next (collect() \
                 keeps them all), raise ScanOptions::in_flight, or, if other tasks drop the \
                 chunks, set ScanOptions::wait_for_dropped_chunks(true) to wait for them",
                self.fid,
                self.buffers,
                self.next.max(self.start)
            ),
        )
    }

    /// Every buffer is held by a chunk not dropped yet, and the scan does
    /// not wait for one: ends the stream if the file ends at `next`, else
    /// fails once; a second call with every buffer still held ends the
    /// stream. `None` from `Ready` means "look again" (the loop of
    /// `poll_next`, whose `issue` looks at the pool again).
    #[allow(clippy::option_option, reason = "Ready(None) asks the caller to loop")]
    fn poll_held(&mut self, cx: &mut Context<'_>) -> Poll<Option<Option<io::Result<Chunk>>>> {
        match std::mem::replace(&mut self.held, Held::No) {
            Held::No => {
                // The chunks held may reach the end of file exactly (their
                // reads were whole): ask the file before saying it goes on.
                let len = self.opts.align.min(PROBE);
                self.held = match AlignedBuf::try_with_capacity(len, len) {
                    Ok(buf) => {
                        Held::Probing(Box::new(self.ctx.read_owned(self.fid, self.next, buf)))
                    }
                    Err(_) => Held::GoesOn,
                };
                Poll::Ready(None)
            }
            Held::Probing(mut fut) => match Pin::new(&mut *fut).poll(cx) {
                Poll::Pending => {
                    self.held = Held::Probing(fut);
                    Poll::Pending
                }
                Poll::Ready((Ok(0), _)) => {
                    // End of file right after the chunks held.
                    self.stop();
                    Poll::Ready(Some(None))
                }
                Poll::Ready(_) => {
                    // Data, or an error the chunk's own read will meet (if
                    // it is ever read): the file goes on.
                    self.held = Held::GoesOn;
                    Poll::Ready(None)
                }
            },
            Held::GoesOn => {
                self.held = Held::Told;
                Poll::Ready(Some(Some(Err(self.all_held()))))
            }
            Held::Told => {
                // Told, and still holding every chunk: the end, so that a
                // loop taking every item (collect()) ends too.
                self.stop();
                Poll::Ready(Some(None))
            }
        }
    }
}

impl Stream for Scan<'_> {
    type Item = io::Result<Chunk>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            this.issue(cx);
            if !this.slots.is_empty() {
                // A buffer came back: whatever the consumer was told is over.
                this.held = Held::No;
            }
            this.poll_reads(cx);
            let Some(front) = this.slots.front_mut() else {
                if this.stopped || this.next >= this.end {
                    return Poll::Ready(None);
                }
                // No read in flight and, under the pool's lock (`issue`),
                // no buffer free: every buffer is held by a chunk not
                // dropped yet.
                if this.opts.wait_for_dropped {
                    // `Pool::take` registered our waker under that lock: a
                    // chunk dropped since wakes us.
                    return Poll::Pending;
                }
                match this.poll_held(cx) {
                    Poll::Ready(None) => continue,
                    Poll::Ready(Some(item)) => return Poll::Ready(item),
                    Poll::Pending => return Poll::Pending,
                }
            };
            match std::mem::replace(&mut front.state, SlotState::Empty) {
                SlotState::Done(buf) => {
                    let (offset, done, want) = (front.offset, front.done, front.want);
                    this.slots.pop_front();
                    let from = this.start.max(offset);
                    let to = this.end.min(offset + done as u64);
                    if done < want {
                        // End of file inside this chunk: nothing after it.
                        this.stop();
                    }
                    if from >= to {
                        this.pool.put(buf);
                        // An empty chunk only at end of file (or range).
                        this.stop();
                        continue;
                    }
                    this.yielded = true;
                    return Poll::Ready(Some(Ok(Chunk {
                        buf: Some(buf),
                        // Both within one chunk, a usize.
                        start: usize::try_from(from - offset).unwrap_or(0),
                        len: usize::try_from(to - from).unwrap_or(0),
                        offset: from,
                        pool: this.pool.clone(),
                    })));
                }
                SlotState::Failed(e) => {
                    this.stop();
                    return Poll::Ready(Some(Err(e)));
                }
                state => {
                    front.state = state;
                    return Poll::Pending;
                }
            }
        }
    }
}

impl fmt::Debug for Scan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scan")
            .field("fid", &self.fid)
            .field("opts", &self.opts)
            .field("range", &(self.start..self.end))
            .field("next", &self.next)
            .field("in_flight", &self.slots.len())
            .field("buffers_allocated", &self.buffers_allocated())
            .field("stopped", &self.stopped)
            .finish()
    }
}

/// A piece of the scanned range, in file order: derefs to its bytes, and
/// [`offset`](Chunk::offset) says where they are in the file. Dropping it
/// gives its buffer back to the scan (which may be waiting for one).
pub struct Chunk {
    buf: Option<SlotBuf>,
    start: usize,
    len: usize,
    offset: u64,
    pool: Arc<Pool>,
}

impl Chunk {
    /// File offset of the chunk's first byte.
    #[must_use]
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl Deref for Chunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let buf = self.buf.as_ref().expect("a live chunk has its buffer");
        &buf[self.start..self.start + self.len]
    }
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.put(buf);
        }
    }
}

#[allow(
    clippy::missing_fields_in_debug,
    reason = "the bytes are not debug output"
)]
impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}
