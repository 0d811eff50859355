//! Batches of owned reads submitted together ([`UringContext::read_batch`]):
//! all results at once ([`ReadBatch`], a future), or each as it completes
//! ([`ReadBatchStream`], from [`ReadBatch::unordered`]), with nearby ranges
//! optionally merged into one read ([`ReadBatch::merge_gap`]).
//!
//! A batch is its reads' own `read_owned` futures, polled together under a
//! [`Deferral`], so each ring submits the whole batch in one enter.
//!
//! A merged read is one exact owned read into an aligned buffer of its own,
//! copied into each member's buffer from its start; if it fails, its members are
//! read one by one, so each gets the result an unmerged read would have.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

use crate::buf::{AlignedBuf, IoBufMut, BOUNCE_ALIGN};
use crate::context::UringContext;
use crate::files::FileRoute;
use crate::id::FileId;
use crate::inline;
use crate::ops::read::{Owned, Read, ReadCore, UringReadOwnedFuture};
use crate::ring::Deferral;
use crate::shared::{Backend, Ctx, Inner};

/// Default bound of a merged read's length ([`ReadBatch::max_merged_len`]).
const DEFAULT_MAX_MERGED_LEN: usize = 128 * 1024;

/// One read of a batch, as given.
struct Request<B> {
    index: usize,
    fid: FileId,
    offset: u64,
    buf: B,
}

/// What a batch reads with: one read per request, or one for several.
enum Unit<'a, B: IoBufMut> {
    Single(usize, UringReadOwnedFuture<'a, B>),
    Merged(Merged<'a, B>),
    Done,
}

/// Reads whose ranges were merged into one.
struct Merged<'a, B: IoBufMut> {
    ctx: Ctx<'a>,
    start: u64,
    /// Sorted by offset; each with its `bytes_total()` measured at planning.
    members: Vec<(Request<B>, usize)>,
    state: MergedState<'a, B>,
}

enum MergedState<'a, B: IoBufMut> {
    /// Boxed: a merged read is rare beside the members it replaces, and
    /// its own buffer is an allocation already.
    Reading(Box<ReadCore<'a, Owned<AlignedBuf>>>),
    /// The merged read failed: every member is read on its own.
    Split(Vec<Option<(usize, UringReadOwnedFuture<'a, B>)>>),
}

/// Copies `src` into `buf` from its start, as an owned read would write
/// it, and raises its initialised length to cover it; returns the bytes
/// copied.
fn put<B: IoBufMut>(buf: &mut B, src: &[u8]) -> usize {
    let n = src.len().min(buf.bytes_total());
    if n > 0 {
        // SAFETY: IoBufMut promises bytes_total() writable bytes at
        // stable_mut_ptr() while `buf` lives; n <= bytes_total(). `src` is
        // the merged read's own buffer, never `buf`'s storage. After the
        // copy the first n bytes are initialised.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), buf.stable_mut_ptr(), n);
            buf.set_init(n);
        }
    }
    n
}

impl<B: IoBufMut> Merged<'_, B> {
    /// Polls the merged read (or its members once split); hands each
    /// finished member's result to `emit`. Returns whether all are done.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        emit: &mut dyn FnMut(usize, io::Result<usize>, B),
    ) -> bool {
        if let MergedState::Reading(core) = &mut self.state {
            let Poll::Ready(res) = core.poll_op(cx) else {
                return false;
            };
            let n = core.op.done();
            let data = core.op.dest.take(n);
            if let Ok(n) = res {
                // Exact: short only at the end of the file.
                let n = n.min(data.len());
                for (mut req, room) in self.members.drain(..) {
                    let rel = usize::try_from(req.offset - self.start).unwrap_or(usize::MAX);
                    let avail = n.saturating_sub(rel).min(room);
                    let got = if avail > 0 {
                        put(&mut req.buf, &data[rel..rel + avail])
                    } else {
                        0
                    };
                    emit(req.index, Ok(got), req.buf);
                }
                return true;
            }
            let ctx = &self.ctx;
            let reads = self
                .members
                .drain(..)
                .map(|(r, _)| Some((r.index, read_owned(ctx, r))))
                .collect();
            self.state = MergedState::Split(reads);
        }
        let MergedState::Split(reads) = &mut self.state else {
            unreachable!("a merged read is split once it fails")
        };
        let mut all = true;
        for slot in reads.iter_mut() {
            let Some((index, read)) = slot else { continue };
            match Pin::new(read).poll(cx) {
                Poll::Ready((res, buf)) => {
                    emit(*index, res, buf);
                    *slot = None;
                }
                Poll::Pending => all = false,
            }
        }
        all
    }
}

/// The owned read of request `r`, holding the context as the batch does.
fn read_owned<'a, B: IoBufMut>(ctx: &Ctx<'a>, r: Request<B>) -> UringReadOwnedFuture<'a, B> {
    UringReadOwnedFuture::new(ctx.share(), r.fid, r.offset, r.buf).named("read_batch")
}

/// How a batch merges nearby reads.
#[derive(Debug, Clone, Copy)]
struct Merge {
    gap: u64,
    max_len: usize,
}

/// What [`ReadBatch`] and [`ReadBatchStream`] share: the requests, then the
/// reads made of them.
struct BatchCore<'a, B: IoBufMut> {
    ctx: Ctx<'a>,
    requests: Vec<Request<B>>,
    merge: Option<Merge>,
    max_len: usize,
    units: Vec<Unit<'a, B>>,
    /// Indices of the units still to poll (`Done` ones pruned at half).
    live: Vec<usize>,
    /// `Done` units still in `live`.
    dead: usize,
    /// Where in `live` the next poll starts (where the last ran out of budget).
    next: usize,
    planned: bool,
    /// The first poll has polled every unit (binding each read to its file).
    polled: bool,
    /// The first poll yielded for fairness (`turn_over`): at most once.
    yielded: bool,
    left: usize,
}

impl<'a, B: IoBufMut> BatchCore<'a, B> {
    fn new(ctx: Ctx<'a>, requests: Vec<Request<B>>) -> Self {
        BatchCore {
            ctx,
            left: requests.len(),
            requests,
            merge: None,
            max_len: DEFAULT_MAX_MERGED_LEN,
            units: Vec::new(),
            live: Vec::new(),
            dead: 0,
            next: 0,
            planned: false,
            polled: false,
            yielded: false,
        }
    }

    /// Whether the batch yields before its first poll polls any read: the
    /// task has used up its stretch on the inline path. The batch makes
    /// `inline::turn_over`'s check once, for all its reads (a yield between
    /// them would split its submission), and never yields twice (DESIGN,
    /// "Batches").
    fn turn_over(&mut self) -> bool {
        let inner: &Inner = &self.ctx;
        if self.left == 0 || !inner.inline_nowait || matches!(inner.backend, Backend::Fallback) {
            return false;
        }
        let over = inline::turn_over(inner.inline_stretch);
        if self.yielded {
            return false;
        }
        self.yielded = over;
        over
    }

    /// Whether request `r` (reading `room` bytes, its `bytes_total()`) may be
    /// merged: it reads 1..=`max_len` bytes ending within `i64::MAX`, on a
    /// local file system (`FileRoute::Ring`: only there is a short count the
    /// end of the file), aligned to `BOUNCE_ALIGN` on an `O_DIRECT` file.
    fn mergeable(&self, r: &Request<B>, room: usize, max_len: usize) -> bool {
        if room == 0 || room > max_len {
            return false;
        }
        let Some(end) = r.offset.checked_add(room as u64) else {
            return false;
        };
        if end > i64::MAX.unsigned_abs() {
            return false;
        }
        let Ok(file) = self.ctx.files.get(r.fid) else {
            return false;
        };
        if file.route != FileRoute::Ring {
            return false;
        }
        if file.direct {
            let align = BOUNCE_ALIGN as u64;
            let at = r.buf.stable_ptr() as usize;
            return r.offset % align == 0 && room % BOUNCE_ALIGN == 0 && at % BOUNCE_ALIGN == 0;
        }
        true
    }

    /// Turns the requests into reads, merging nearby ones if asked.
    fn plan(&mut self) {
        self.planned = true;
        let requests = std::mem::take(&mut self.requests);
        let Some(merge) = self.merge else {
            self.units = requests
                .into_iter()
                .map(|r| Unit::Single(r.index, read_owned(&self.ctx, r)))
                .collect();
            return;
        };
        let max_len = merge.max_len;
        let (mut cands, singles): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|r| {
                let room = r.buf.bytes_total();
                (r, room)
            })
            .partition(|(r, room)| self.mergeable(r, *room, max_len));
        self.units = singles
            .into_iter()
            .map(|(r, _)| Unit::Single(r.index, read_owned(&self.ctx, r)))
            .collect();
        cands.sort_by_key(|(r, _)| (r.fid, r.offset));
        let mut group: Vec<(Request<B>, usize)> = Vec::new();
        let mut end = 0u64;
        for (r, room) in cands {
            let r_end = r.offset + room as u64;
            let joins = group.first().is_some_and(|(first, _)| {
                first.fid == r.fid
                    && r.offset <= end.saturating_add(merge.gap)
                    && end.max(r_end) - first.offset <= max_len as u64
            });
            if !joins {
                self.flush(&mut group);
                end = 0;
            }
            end = end.max(r_end);
            group.push((r, room));
        }
        self.flush(&mut group);
    }

    /// Makes a unit of `group`: a single read, or a merged one.
    fn flush(&mut self, group: &mut Vec<(Request<B>, usize)>) {
        let ctx = &self.ctx;
        if group.len() == 1 {
            let (r, _) = group.pop().expect("one request");
            self.units.push(Unit::Single(r.index, read_owned(ctx, r)));
            return;
        }
        if group.is_empty() {
            return;
        }
        let members = std::mem::take(group);
        let (fid, start) = (members[0].0.fid, members[0].0.offset);
        let end = members
            .iter()
            .map(|(r, room)| r.offset + *room as u64)
            .max()
            .unwrap_or(start);
        // Bounded by `max_len`.
        let len = usize::try_from(end - start).unwrap_or(usize::MAX);
        match AlignedBuf::try_with_capacity(len, BOUNCE_ALIGN) {
            Ok(buf) => {
                let core = ReadCore::new(
                    ctx.share(),
                    fid,
                    Read::new(fid, start, Owned::new(buf, "read_batch")).exact(),
                );
                self.units.push(Unit::Merged(Merged {
                    ctx: ctx.share(),
                    start,
                    members,
                    state: MergedState::Reading(Box::new(core)),
                }));
            }
            // No memory for the merged buffer: read them one by one.
            Err(_) => self.units.extend(
                members
                    .into_iter()
                    .map(|(r, _)| Unit::Single(r.index, read_owned(ctx, r))),
            ),
        }
    }

    /// Binds every read to its file without reading, when the first poll
    /// yields; a read whose file is not registered is polled (to fail) now.
    fn bind_all(
        &mut self,
        cx: &mut Context<'_>,
        emit: &mut dyn FnMut(usize, io::Result<usize>, B),
    ) {
        let left = &mut self.left;
        let mut count = |i: usize, r: io::Result<usize>, b: B| {
            *left -= 1;
            emit(i, r, b);
        };
        for unit in &mut self.units {
            let bound = match unit {
                Unit::Single(_, read) => read.core.bind(),
                Unit::Merged(Merged {
                    state: MergedState::Reading(core),
                    ..
                }) => core.bind(),
                Unit::Merged(_) | Unit::Done => Ok(()),
            };
            if bound.is_err() && poll_unit(unit, cx, &mut count) {
                self.dead += 1;
            }
        }
    }

    /// Polls the unfinished reads; hands each finished one to `emit`.
    /// Returns whether every read is done. Polls after the first resume
    /// where the coop budget ran out, so n cached reads cost O(n) polls.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        emit: &mut dyn FnMut(usize, io::Result<usize>, B),
    ) -> bool {
        let yields = !self.polled && self.turn_over();
        if !self.planned {
            self.plan();
            self.live = (0..self.units.len()).collect();
        }
        if self.left == 0 {
            return true;
        }
        if yields {
            // Let other tasks run first; bind each read to its file now, as
            // a first poll would, and poll them all at the next poll.
            self.bind_all(cx, emit);
            cx.waker().wake_by_ref();
            return self.left == 0;
        }
        // Submits the queued reads together on drop (even on a panic).
        let _together = match &self.ctx.backend {
            Backend::Uring(rings) => Some(Deferral::new(rings)),
            Backend::Fallback => None,
        };
        let left = &mut self.left;
        let mut count = |i: usize, r: io::Result<usize>, b: B| {
            *left -= 1;
            emit(i, r, b);
        };
        let first = !self.polled;
        self.polled = true;
        let n = self.live.len();
        let start = if first { 0 } else { self.next.min(n) };
        self.next = 0;
        for k in 0..n {
            let pos = if start + k < n {
                start + k
            } else {
                start + k - n
            };
            let unit = &mut self.units[self.live[pos]];
            if matches!(unit, Unit::Done) {
                continue;
            }
            if !first && !tokio::task::coop::has_budget_remaining() {
                // The rest waits for the next poll, which starts here.
                self.next = pos;
                cx.waker().wake_by_ref();
                break;
            }
            if poll_unit(unit, cx, &mut count) {
                self.dead += 1;
            }
        }
        if self.dead * 2 >= self.live.len() && self.dead > 0 {
            let units = &self.units;
            self.live.retain(|&i| !matches!(units[i], Unit::Done));
            self.dead = 0;
            self.next = 0;
        }
        if self.left > 0 {
            // The task waits now: that ends its stretch.
            inline::end_stretch();
        }
        self.left == 0
    }
}

/// Polls one unit; hands each of its finished reads to `emit`. Returns
/// whether it is done (it is then `Done`).
fn poll_unit<B: IoBufMut>(
    unit: &mut Unit<'_, B>,
    cx: &mut Context<'_>,
    emit: &mut dyn FnMut(usize, io::Result<usize>, B),
) -> bool {
    let finished = match unit {
        Unit::Single(index, read) => match Pin::new(read).poll(cx) {
            Poll::Ready((res, buf)) => {
                emit(*index, res, buf);
                true
            }
            Poll::Pending => false,
        },
        Unit::Merged(m) => m.poll(cx, emit),
        Unit::Done => false,
    };
    if finished {
        *unit = Unit::Done;
    }
    finished
}

impl<B: IoBufMut> fmt::Debug for BatchCore<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadBatch")
            .field("merge", &self.merge)
            .field("planned", &self.planned)
            .field("reads", &self.units.len())
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

/// The future of [`UringContext::read_batch`]: every read's result and
/// buffer, in the order the reads were given. A `ReadBatch<'static, _>`,
/// from [`UringContext::read_batch_static`] or
/// [`UringFile::read_batch`](crate::UringFile::read_batch), holds the
/// context and can be spawned.
///
/// Before it is first polled it can be configured: [`merge_gap`](Self::merge_gap)
/// merges reads of nearby ranges into one, [`unordered`](Self::unordered)
/// turns it into a stream of results in completion order.
///
/// Dropping it drops every read not yet complete, as dropping each
/// `read_owned` future would (their buffers stay with the context until the
/// kernel is done with them, and their reads are cancelled).
///
/// A task looping on batches of page-cache hits yields as one looping on
/// single reads does ([`Builder::inline_stretch`](crate::Builder::inline_stretch)):
/// once the task has spent its stretch on reads served inline, its next
/// batch returns `Pending` once at its first poll, before any of its reads
/// runs (each read is bound to its file there), and runs them all at the
/// next.
#[must_use = "futures do nothing unless polled"]
pub struct ReadBatch<'a, B: IoBufMut> {
    core: BatchCore<'a, B>,
    done: Vec<Option<(io::Result<usize>, B)>>,
}

impl<'a, B: IoBufMut> ReadBatch<'a, B> {
    pub(crate) fn new(ctx: Ctx<'a>, reads: Vec<(FileId, u64, B)>) -> Self {
        let requests: Vec<Request<B>> = reads
            .into_iter()
            .enumerate()
            .map(|(index, (fid, offset, buf))| Request {
                index,
                fid,
                offset,
                buf,
            })
            .collect();
        ReadBatch {
            done: requests.iter().map(|_| None).collect(),
            core: BatchCore::new(ctx, requests),
        }
    }

    /// Merges reads of the same file whose ranges overlap or lie at most
    /// `gap` bytes apart into one read into one buffer (up to
    /// [`max_merged_len`](Self::max_merged_len) bytes, 128 KiB by default),
    /// whose bytes are then copied into each read's buffer. A read's range
    /// is `offset..offset + bytes_total()` (a `Vec`'s capacity).
    ///
    /// Each read's result is the one it would have had on its own: the same
    /// count at the end of the file (the merged read continues until its
    /// range is full or the file ends), and if the merged read fails, its
    /// reads are issued one by one, so an error reaches only the reads it
    /// concerns. Not merged: reads of more than `max_merged_len` bytes,
    /// into 0 bytes, ending beyond `i64::MAX`, of an unknown
    /// file, of a file on FUSE or a network file system (whose server may
    /// answer any request short, which a read alone returns as it is),
    /// and, on files opened with `O_DIRECT`, reads whose offset,
    /// length or buffer address is not a multiple of 4096 (a merged read of
    /// aligned reads is aligned too). Merging trades a copy per merged byte
    /// (and reading the gaps) for fewer operations; it is off by default.
    /// Has no effect once the batch has been polled.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&(0..65536u32).map(|i| i as u8).collect::<Vec<_>>())?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// // Four 1 KiB blocks 3 KiB apart: one 13 KiB read instead of four.
    /// let reads = (0..4u64).map(|i| (0u32, i * 4096, Vec::with_capacity(1024)));
    /// for (res, block) in ctx.read_batch(reads).merge_gap(4096).await {
    ///     assert_eq!((res?, block[1]), (1024, 1));
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn merge_gap(mut self, gap: u64) -> Self {
        let max_len = self.core.max_len;
        self.core.merge = Some(Merge { gap, max_len });
        self
    }

    /// The largest merged read, in bytes (default 128 KiB): a group of
    /// nearby reads is closed before its range would grow beyond it. Only
    /// used with [`merge_gap`](Self::merge_gap).
    pub fn max_merged_len(mut self, len: usize) -> Self {
        self.core.max_len = len;
        if let Some(m) = &mut self.core.merge {
            m.max_len = len;
        }
        self
    }

    /// The results as a [`Stream`] in completion order, each with the
    /// index of its read in the batch, instead of all at once. The reads
    /// are submitted as for the future (one `io_uring_enter` per ring for
    /// the whole batch).
    ///
    /// ```
    /// # use std::io::Write;
    /// use futures::StreamExt;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[5u8; 65536])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let reads = (0..16u64).map(|i| (0u32, i * 4096, Vec::with_capacity(4096)));
    /// let mut results = ctx.read_batch(reads).unordered();
    /// let mut seen = 0u32;
    /// while let Some((index, res, block)) = results.next().await {
    ///     assert_eq!((res?, block[0]), (4096, 5));
    ///     seen |= 1 << index;
    /// }
    /// assert_eq!(seen, 0xffff);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn unordered(self) -> ReadBatchStream<'a, B> {
        ReadBatchStream {
            core: self.core,
            ready: VecDeque::new(),
        }
    }
}

impl<B: IoBufMut> fmt::Debug for ReadBatch<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

impl<B: IoBufMut> Future for ReadBatch<'_, B> {
    type Output = Vec<(io::Result<usize>, B)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let done = &mut this.done;
        if !this
            .core
            .poll(cx, &mut |i, res, buf| done[i] = Some((res, buf)))
        {
            return Poll::Pending;
        }
        Poll::Ready(
            this.done
                .iter_mut()
                .map(|r| r.take().expect("every read of the batch is done"))
                .collect(),
        )
    }
}

/// The stream of [`ReadBatch::unordered`]: `(index, result, buffer)` for
/// each read of the batch as it completes, `index` being its position in
/// the batch; it ends after the last.
///
/// Dropping it drops every read not yet complete, exactly as dropping the
/// batch would; results already complete but not yet taken are dropped
/// with their buffers.
#[must_use = "streams do nothing unless polled"]
pub struct ReadBatchStream<'a, B: IoBufMut> {
    core: BatchCore<'a, B>,
    ready: VecDeque<(usize, io::Result<usize>, B)>,
}

impl<B: IoBufMut> fmt::Debug for ReadBatchStream<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

impl<B: IoBufMut> Stream for ReadBatchStream<'_, B> {
    type Item = (usize, io::Result<usize>, B);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(item) = this.ready.pop_front() {
            return Poll::Ready(Some(item));
        }
        let ready = &mut this.ready;
        let all = this
            .core
            .poll(cx, &mut |i, res, buf| ready.push_back((i, res, buf)));
        match this.ready.pop_front() {
            Some(item) => Poll::Ready(Some(item)),
            None if all => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.ready.len() + self.core.left;
        (n, Some(n))
    }
}

impl UringContext {
    /// Reads many `(file, offset, buffer)` at once, each as
    /// [`read_owned`](Self::read_owned) would: into the buffer from its
    /// start, `bytes_total()` bytes at most (a `Vec`'s capacity, not its
    /// `len()`; `buf.slice(..n)` reads `n` bytes); and returns every
    /// result with its buffer, in the order given. A buffer of 0 bytes gets
    /// `InvalidInput`, as alone.
    ///
    /// The reads are submitted together: those the page cache cannot serve
    /// reach the kernel in one `io_uring_enter` per ring (usually one for
    /// the whole batch) rather than one per read or per driver round. On
    /// the fallback backend, and for files routed to the blocking pool, the
    /// reads run in parallel on the blocking pool. Before awaiting it,
    /// [`ReadBatch::merge_gap`] merges reads of nearby ranges into one
    /// read, and [`ReadBatch::unordered`] makes it a stream of results in
    /// completion order. Dropping the batch drops its unfinished reads (see
    /// [`ReadBatch`]).
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[5u8; 65536])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let reads = (0..16u64).map(|i| (0u32, i * 4096, Vec::with_capacity(4096)));
    /// for (res, block) in ctx.read_batch(reads).await {
    ///     assert_eq!((res?, block.len(), block[0]), (4096, 4096, 5));
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_batch<F, B, I>(&self, reads: I) -> ReadBatch<'_, B>
    where
        F: Into<FileId>,
        B: IoBufMut,
        I: IntoIterator<Item = (F, u64, B)>,
    {
        ReadBatch::new(
            self.ctx(),
            reads
                .into_iter()
                .map(|(fid, offset, buf)| (fid.into(), offset, buf))
                .collect(),
        )
    }

    /// [`read_batch`](Self::read_batch) as a `'static` batch, which holds
    /// a handle to the context instead of borrowing it: pass it (or its
    /// [`unordered`](ReadBatch::unordered) stream) to `tokio::spawn` as it
    /// is. Its requests are owned already; it keeps the context alive until
    /// it is done or dropped, at the cost of a reference-count update per
    /// read (see [`read_owned_static`](Self::read_owned_static)).
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[6u8; 16384])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let reads = (0..4u64).map(|i| (0, i * 4096, Vec::with_capacity(4096)));
    /// let batch = tokio::spawn(ctx.read_batch_static(reads).merge_gap(0));
    /// drop(ctx); // the batch keeps the context alive
    /// for (res, block) in batch.await? {
    ///     assert_eq!((res?, block[0]), (4096, 6));
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_batch_static<F, B, I>(&self, reads: I) -> ReadBatch<'static, B>
    where
        F: Into<FileId>,
        B: IoBufMut,
        I: IntoIterator<Item = (F, u64, B)>,
    {
        ReadBatch::new(
            self.ctx_static(),
            reads
                .into_iter()
                .map(|(fid, offset, buf)| (fid.into(), offset, buf))
                .collect(),
        )
    }
}
