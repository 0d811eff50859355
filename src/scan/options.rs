//! [`ScanOptions`]: the settings of a scan, their defaults and bounds, and
//! [`ScanOptions::scan`], which checks them and starts the stream.

use std::collections::VecDeque;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::pool::Pool;
use super::{Cache, Held, Scan};
use crate::context::UringContext;
use crate::error::{invalid, shut_down_error};
use crate::id::FileId;
use crate::permit::Priority;
use crate::shared::Ctx;

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
/// Bytes of read-ahead (`chunk_size × (in_flight − 1)`) from which a
/// scan's reads skip the inline path and go to a ring (DESIGN, "Scans").
const RING_AHEAD: usize = 512 << 10;

/// Settings of a scan; [`scan`](ScanOptions::scan) starts one.
///
/// A free-standing builder, built on the context's owned reads: a scan holds
/// no more of the [`UringContext`] than any caller of `read_owned` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanOptions {
    pub(super) chunk_size: usize,
    /// `chunk_size` was set by the caller (else it depends on `O_DIRECT`).
    chunk_set: bool,
    pub(super) in_flight: usize,
    /// `in_flight` was set by the caller (else it depends on `O_DIRECT`).
    in_flight_set: bool,
    pub(super) align: usize,
    /// With every buffer held by a chunk, `next()` waits for one to be
    /// dropped instead of failing.
    pub(super) wait_for_dropped: bool,
    /// The scan's reads' priority.
    pub(super) priority: Priority,
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
            priority: Priority::Background,
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
    /// at most 1 GiB. Default: 1 MiB, or 2 MiB (one huge page) on a file
    /// opened with `O_DIRECT` (see the [design document](crate::design), "Scans").
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

    /// The priority of the scan's reads (default
    /// [`Priority::Background`], whatever the context handle's priority).
    ///
    /// A scan reads ahead at full speed and would otherwise set the latency
    /// of every point read behind it; as a background op it still uses
    /// every slot while no latency op is active, so a scan alone loses
    /// nothing. Set [`Priority::Latency`] for a scan a user waits on, such
    /// as a query's.
    #[must_use]
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Whether this scan's reads skip the inline path (see `RING_AHEAD`).
    pub(super) fn ring_only(&self) -> bool {
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
        self.scan_in(ctx.ctx(), fid.into(), range)
    }

    /// [`scan`](Self::scan) holding the context as `ctx` does (borrowed, or
    /// a handle for a `'static` scan).
    pub(crate) fn scan_in<'a>(
        &self,
        ctx: Ctx<'a>,
        fid: FileId,
        range: impl RangeBounds<u64>,
    ) -> io::Result<Scan<'a>> {
        let ctx = ctx.with_priority(self.priority);
        if ctx.closed.load(Ordering::Acquire) {
            return Err(shut_down_error());
        }
        let direct = ctx.files.get(fid)?.direct;
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
            pool: Arc::new(Pool::new(opts.in_flight.min(INITIAL_SLOTS))),
            stopped: start == end,
            cache: Cache::Unknown,
            yielded: false,
            held: Held::No,
        })
    }
}
