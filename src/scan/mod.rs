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
//! A scan owns at most `in_flight` buffers of `chunk_size` bytes; each is
//! being read into (an owned [`UringContext::read_owned`]), held by the
//! consumer as a [`Chunk`], or free, so memory is bounded by
//! `chunk_size × in_flight`. Chunks are yielded strictly in file order; a
//! short read is continued where it stopped, and a read of 0 is the end of
//! the file. Reads are aligned to [`align`](ScanOptions::align), so
//! `O_DIRECT` files work. With every buffer held, `next()` errs or waits
//! ([`ScanOptions::wait_for_dropped_chunks`]). Dropping the stream is sound:
//! the context keeps abandoned owned buffers until the kernel is done.
//! The reasons, and the cached/uncached read-ahead policy, are in DESIGN,
//! "Scans".
//!
//! # Files
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the stream ([`Scan`]) and its [`Chunk`]s |
//! | `options.rs` | [`ScanOptions`]: the settings, their defaults and bounds, and the start of a scan |
//! | `pool.rs` | the buffers of one scan, shared by the stream and its chunks |

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::ops::{Deref, RangeBounds};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;

use crate::buf::{AlignedBuf, IoBufMut, Slice};
use crate::context::UringContext;
use crate::id::FileId;
use crate::ops::read::UringReadOwnedFuture;
use crate::shared::Ctx;

mod options;
mod pool;

pub use options::ScanOptions;
use pool::{Pool, SlotBuf};

/// With read-ahead on the ring, one chunk in this many is still read on the
/// consumer's thread when the file is cached: the consumer shares the copying.
const CONSUMER_SHARE: u64 = 4;
/// Largest read that checks whether the file goes on when every buffer is
/// held (see [`Held`]): one block of the alignment, at most a page.
const PROBE: usize = 4096;

#[allow(
    clippy::large_enum_variant,
    reason = "a scan's few slots are reading most of the time; boxing would allocate per read"
)]
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
/// page cache on this thread anyway (a runtime worker, or a thread that
/// polls drivers); only a consumer outside the runtime gets another CPU.
fn copies_ring_reads_itself() -> bool {
    tokio::task::try_id().is_some() || crate::thread::on_driver_thread()
}

/// Reads the rest of `slot` (from `read_from`) into `buf`.
fn read_rest<'a>(
    ctx: &Ctx<'a>,
    fid: FileId,
    slot: &Slot<'a>,
    buf: SlotBuf,
    ring_only: bool,
) -> UringReadOwnedFuture<'a, Slice<SlotBuf>> {
    // read_from <= want <= buf.len() (all initialised): the window fits.
    let win = buf.slice(slot.read_from..slot.want);
    let read =
        UringReadOwnedFuture::new(ctx.share(), fid, slot.offset + slot.read_from as u64, win);
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
    /// The chunk's read may take the inline path although the
    /// scan's read-ahead goes to the ring: the consumer's share.
    consumer: bool,
    state: SlotState<'a>,
}

/// A scan in progress: a [`Stream`] of the range's [`Chunk`]s in file order.
/// Made by [`ScanOptions::scan`] or [`Scan::new`] (borrowing the context),
/// or by [`UringFile::scan`](crate::UringFile::scan) and
/// [`UringFile::scan_with`](crate::UringFile::scan_with) (a `Scan<'static>`,
/// holding it: a scan to move into a task).
pub struct Scan<'a> {
    ctx: Ctx<'a>,
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
    /// A chunk has been handed out: the consumer's share starts only then,
    /// so the first burst's readahead starts in order.
    yielded: bool,
    /// Where the stream is with a consumer holding every buffer (without
    /// `wait_for_dropped_chunks`).
    held: Held<'a>,
}

/// The steps to the error when a consumer holds every buffer and the scan
/// does not wait for a dropped chunk; any read started puts it back to `No`.
enum Held<'a> {
    No,
    /// A read of a block at `next` checks that the file goes on: if it ends
    /// there, the stream ends rather than failing (boxed: rare).
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
    /// Every one so far was served whole from the page cache: a consumer
    /// whose thread would copy the ring's reads has the blocking pool copy them.
    Hit,
    /// One was not: the rest of the scan leaves every read to the ring (a
    /// miss on the consumer's thread starts readahead out of order). Final.
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
        self.pool.allocated()
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
            let fut =
                UringReadOwnedFuture::new(self.ctx.share(), self.fid, self.next, buf.slice(..want));
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
                                &self.ctx,
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
                            &self.ctx,
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
                    Ok(buf) => Held::Probing(Box::new(UringReadOwnedFuture::new(
                        self.ctx.share(),
                        self.fid,
                        self.next,
                        buf,
                    ))),
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

#[cfg(feature = "bytes")]
impl From<Chunk> for bytes::Bytes {
    /// The chunk's bytes as `Bytes`, without copying (feature `bytes`):
    /// the `Bytes` (and its clones and slices) keep the chunk, so its
    /// buffer goes back to the scan only when the last of them is dropped.
    /// A consumer holding many such `Bytes` holds the scan's buffers, as
    /// holding the chunks would ([`ScanOptions::wait_for_dropped_chunks`]).
    ///
    /// ```
    /// use futures::TryStreamExt;
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"scanned bytes", 0).await?;
    /// let chunk = file.scan(..)?.try_next().await?.expect("a chunk");
    /// let ptr = chunk.as_ptr();
    /// let bytes = bytes::Bytes::from(chunk);
    /// assert_eq!((bytes.as_ptr(), &bytes[..]), (ptr, &b"scanned bytes"[..]));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    fn from(chunk: Chunk) -> bytes::Bytes {
        bytes::Bytes::from_owner(chunk)
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
