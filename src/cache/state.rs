//! The cache's machinery behind [`BlockCache`](super::BlockCache): admitting
//! a hit (coop budget and inline stretch), looking blocks up, starting or
//! joining flights, inserting what lands, and dropping what a change
//! through the context makes stale.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use super::flight::{Flight, Outcomes, Waiting};
use super::frames::{FrameBuf, PREFETCH_BYTES};
use super::{
    file_key, BlockRef, Entry, FileRef, FlightError, Invalidate, Key, KeyHash, Lookup, Outcome,
    State, MAX_SHORT,
};
use crate::buf::IoBufMut;
use crate::error;
use crate::id::FileId;
use crate::inline;
use crate::thread::thread_slot;
use crate::util::lock;

/// Spends one unit of tokio's coop budget and yields once the task has
/// spent its inline stretch (`inline::turn_over_after`, for a call that
/// asks for `bytes` bytes), as a page-cache read served inline does: a
/// task looping on hits lets the others run.
pub(super) fn admit(state: &State, bytes: usize) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(move |cx| poll_admit(state, bytes, cx))
}

#[inline]
pub(super) fn poll_admit(state: &State, bytes: usize, cx: &mut Context<'_>) -> Poll<()> {
    let coop = ready!(tokio::task::coop::poll_proceed(cx));
    if inline::turn_over_after(state.ctx.inner.inline_stretch, bytes) {
        cx.waker().wake_by_ref();
        return Poll::Pending;
    }
    coop.made_progress();
    Poll::Ready(())
}

/// Who asks [`State::join_or_start`] for blocks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Asker {
    /// A caller that waits for each block.
    Waiter,
    /// A prefetch: nothing waits; the new flight is driven in the
    /// background.
    Prefetch,
}

impl State {
    /// The file `fid` names now, as the context's reads find it.
    #[inline]
    pub(super) fn resolve(&self, fid: FileId) -> io::Result<FileRef> {
        let inner = &self.ctx.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(error::shut_down_error());
        }
        let (id, direct) = match inner.files.current(fid) {
            Some(found) => found,
            None => self.resolve_in_shard(fid)?,
        };
        Ok(FileRef {
            id,
            key: file_key(id),
            direct,
        })
    }

    /// [`resolve`](Self::resolve) when the file table's word did not
    /// answer: no such registration (the shard's lookup words why), or one
    /// made since.
    #[cold]
    fn resolve_in_shard(&self, fid: FileId) -> io::Result<(FileId, bool)> {
        let shard = self.ctx.inner.files.shard(thread_slot());
        let entry = shard.lookup(fid)?;
        Ok((entry.id(), entry.direct))
    }

    #[inline]
    pub(super) fn hit(&self) {
        self.hits.add();
    }

    /// Block `block` of `file` if it is cached (a hit, counted): one table
    /// load, a pin on the frame, and a check that the frame still holds
    /// the block. No lock, no hash, no allocation.
    #[inline]
    pub(super) fn cached(&self, file: u64, block: u64) -> Option<BlockRef> {
        let f = self.tables.lookup(file, block)?;
        self.pin(f, file, block)
    }

    /// The frame that block `block` of `file` is mapped to, if any, its
    /// header and the lines of `bytes` (of the block) on their way into
    /// the CPU's caches (see `Core::prefetch`): what a hit then pins
    /// (`pin`) or copies (`copy_hit`).
    #[inline]
    pub(super) fn probe(&self, file: u64, block: u64, bytes: Range<usize>) -> Option<u32> {
        let f = self.tables.lookup(file, block)?;
        self.core.prefetch(f, bytes);
        Some(f)
    }

    /// A hit (counted) on frame `f` if it still holds block `block` of
    /// `file`.
    #[inline]
    pub(super) fn pin(&self, f: u32, file: u64, block: u64) -> Option<BlockRef> {
        let b = self.core.pin_if_holds(f, file, block)?;
        self.hit();
        Some(b)
    }

    /// Bytes of block `block` before a read at `offset` starts in it (0 if
    /// it starts in an earlier block).
    #[inline]
    pub(super) fn skip(&self, block: u64, offset: u64) -> usize {
        usize::try_from(offset.saturating_sub(block << self.shift)).unwrap_or(usize::MAX)
    }

    /// Copies what block `block` of `file` holds of a read at `offset`
    /// into `dst` if frame `f` holds it (a hit, counted), without pinning
    /// it (`Core::copy_if_holds`): the bytes copied, and whether the file
    /// ends in this block. `None`: not copied (what was is zeroed).
    #[inline]
    pub(super) fn copy_hit(
        &self,
        f: u32,
        file: u64,
        block: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> Option<(usize, bool)> {
        let skip = self.skip(block, offset);
        if skip >= self.block {
            return None;
        }
        let (n, len) = self.core.copy_if_holds(f, file, block, skip, dst)?;
        self.hit();
        Some((n, len < self.block))
    }

    /// Copies what block `block` holds of a read at `offset` into `dst`
    /// (the rest of the read): the bytes copied, and whether the file ends
    /// in this block.
    pub(super) fn copy_out(
        &self,
        data: &[u8],
        block: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> (usize, bool) {
        let skip = self.skip(block, offset);
        let avail = data.len().saturating_sub(skip);
        let n = avail.min(dst.len());
        if n > 0 {
            dst[..n].copy_from_slice(&data[skip..skip + n]);
        }
        (n, data.len() < self.block)
    }

    /// The blocks of `file`, each from the cache, an existing flight, or
    /// one new flight for all the others; waits for all of them.
    pub(super) async fn fetch(
        self: &Arc<Self>,
        file: FileRef,
        blocks: &[u64],
    ) -> Vec<io::Result<BlockRef>> {
        if let Some(&b) = blocks
            .iter()
            .find(|&&b| b > i64::MAX.unsigned_abs() >> self.shift)
        {
            let e = beyond_max(file.id, b);
            return blocks.iter().map(|_| Err(clone_io(&e))).collect();
        }
        let mut unique: Vec<u64> = Vec::with_capacity(blocks.len());
        let mut at: HashMap<u64, usize, KeyHash> = HashMap::default();
        let mut frames: Vec<Option<u32>> = Vec::with_capacity(blocks.len());
        for &b in blocks {
            at.entry(b).or_insert_with(|| {
                unique.push(b);
                frames.push(self.probe(file.key, b, 0..PREFETCH_BYTES));
                unique.len() - 1
            });
        }
        // Every frame was asked for before the first pin (a full barrier):
        // the hits' trips to memory overlap.
        let mut found: Vec<Option<BlockRef>> = unique
            .iter()
            .zip(frames)
            .map(|(&b, f)| {
                // A frame that moved since is looked up again; a block not
                // mapped then is looked up again under the flights lock.
                f.and_then(|f| {
                    self.pin(f, file.key, b)
                        .or_else(|| self.cached(file.key, b))
                })
            })
            .collect();
        let missing: Vec<u64> = unique
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(b, _)| *b)
            .collect();
        if !missing.is_empty() {
            let (lookups, _) = self.join_or_start(file, &missing, Asker::Waiter);
            let waits = lookups.into_iter().map(|l| async move {
                match l {
                    Lookup::Hit(b) => Ok(b),
                    Lookup::Wait(mut wait) => std::future::poll_fn(|cx| wait.poll_block(cx)).await,
                }
            });
            let mut results = futures::future::join_all(waits).await.into_iter();
            let mut failed: HashMap<u64, io::Error, KeyHash> = HashMap::default();
            for (b, f) in unique.iter().zip(found.iter_mut()) {
                if f.is_none() {
                    match results.next().expect("one result per missing block") {
                        Ok(block) => *f = Some(block),
                        Err(e) => {
                            failed.insert(*b, e);
                        }
                    }
                }
            }
            return blocks
                .iter()
                .map(|b| match &found[at[b]] {
                    Some(block) => Ok(block.clone()),
                    None => Err(clone_io(&failed[b])),
                })
                .collect();
        }
        blocks
            .iter()
            .map(|b| Ok(found[at[b]].clone().expect("every block was found")))
            .collect()
    }

    /// Block `block` of `file`, which was not cached a moment ago: from
    /// the cache after all, the flight reading it, or a new flight.
    pub(super) async fn one(self: &Arc<Self>, file: FileRef, block: u64) -> io::Result<BlockRef> {
        if block > i64::MAX.unsigned_abs() >> self.shift {
            return Err(beyond_max(file.id, block));
        }
        match self.join_or_start(file, &[block], Asker::Waiter).0.pop() {
            Some(Lookup::Hit(b)) => Ok(b),
            Some(Lookup::Wait(mut wait)) => std::future::poll_fn(|cx| wait.poll_block(cx)).await,
            None => unreachable!("one lookup per block"),
        }
    }

    /// Under the flights lock: each of `blocks` of `file` (none of which
    /// was cached a moment ago) from the cache after all, from the flight
    /// already reading it, or from one new flight for all the others.
    /// A [`Waiter`](Asker::Waiter) gets a lookup per block (a joined
    /// flight counted as coalesced); a [`Prefetch`](Asker::Prefetch) gets
    /// the new flight, if one was started, to drive (not polled yet).
    pub(super) fn join_or_start(
        self: &Arc<Self>,
        file: FileRef,
        blocks: &[u64],
        asker: Asker,
    ) -> (Vec<Lookup>, Option<Waiting>) {
        let waits = asker == Asker::Waiter;
        let mut flights = lock(&self.flights);
        let epoch = flights.epochs.get(&file.key).copied().unwrap_or(0);
        let mut out = Vec::with_capacity(if waits { blocks.len() } else { 0 });
        let mut new = Vec::new();
        for &block in blocks {
            let key = Key {
                file: file.key,
                block,
            };
            // A flight started before a change to its file is not joined,
            // even for a block outside the changed range: a write beyond
            // the end of the file grows the block that held the end, which
            // that flight may have read short. Its land caches nothing of
            // the block once a new flight holds the entry.
            let (reading, joined) = match flights.map.get(&key) {
                Some(e) if e.epoch == epoch && waits => (false, e.flight.join(e.slot)),
                Some(e) if e.epoch == epoch => (e.flight.alive(), None),
                _ => (false, None),
            };
            if let Some(wait) = joined {
                flights.coalesced += 1;
                out.push(Some(Lookup::Wait(wait)));
                continue;
            }
            if reading {
                // A prefetch of a block a flight reads: nothing to do.
                continue;
            }
            // A flight that ended between the caller's look and this lock
            // inserted its block under this lock.
            if waits {
                if let Some(b) = self.cached(key.file, key.block) {
                    out.push(Some(Lookup::Hit(b)));
                    continue;
                }
                out.push(None);
            } else if self.tables.lookup(key.file, key.block).is_some() {
                continue;
            }
            new.push(block);
        }
        let mut started = None;
        if !new.is_empty() {
            let id = flights.next_id;
            flights.next_id += 1;
            flights.misses += new.len() as u64;
            let flight = Flight::new(run_flight(self.clone(), (id, epoch), file, new.clone()));
            // The waiters are made under the lock: once it is released, a
            // caller that joins the flight and gives up would otherwise be
            // its last waiter, and drop the read.
            if waits {
                let mut slots = 0..;
                for o in &mut out {
                    if o.is_none() {
                        let slot = slots.next().unwrap_or(0);
                        *o = Some(Lookup::Wait(Waiting::first(&flight, slot)));
                    }
                }
            } else {
                started = Some(Waiting::first(&flight, 0));
            }
            let weak = Flight::weak(&flight);
            for (slot, &block) in new.iter().enumerate() {
                flights.map.insert(
                    Key {
                        file: file.key,
                        block,
                    },
                    Entry {
                        id,
                        epoch,
                        flight: weak.clone(),
                        slot,
                    },
                );
            }
        }
        drop(flights);
        (out.into_iter().flatten().collect(), started)
    }

    /// A flight's end: under the flights lock, each block whose entry is
    /// still this flight's is cached (if it was read) and the entry
    /// removed; an entry a change removed meanwhile means the bytes may be
    /// older than the change: not cached. A short block is cached only if
    /// the file saw no change at all since the flight started (`epoch`).
    pub(super) fn land(
        &self,
        (id, epoch): (u64, u64),
        file: u64,
        blocks: &[u64],
        outcomes: Option<&[Outcome]>,
    ) {
        let mut flights = lock(&self.flights);
        let unchanged = flights.epochs.get(&file).copied().unwrap_or(0) == epoch;
        let mut policy = None;
        for (i, &block) in blocks.iter().enumerate() {
            let key = Key { file, block };
            if flights.map.get(&key).is_none_or(|e| e.id != id) {
                continue;
            }
            flights.map.remove(&key);
            let Some(Ok(b)) = outcomes.map(|o| &o[i]) else {
                continue;
            };
            if b.len() < self.block {
                let short = flights.short.entry(file).or_default();
                if !unchanged || (!short.contains(&block) && short.len() >= MAX_SHORT) {
                    continue;
                }
                if !short.contains(&block) {
                    short.push(block);
                }
            }
            let policy = policy.get_or_insert_with(|| lock(&self.policy));
            policy.admit(&self.tables, &self.core, key, b.frame());
        }
    }

    /// Drops `len` bytes at `offset` of `file` (saturating): in-flight
    /// reads of those blocks will not cache them, and cached ones go.
    pub(super) fn drop_range(&self, file: u64, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = offset >> self.shift;
        let last = (offset.saturating_add(len) - 1) >> self.shift;
        let whole = first == 0 && last == u64::MAX >> self.shift;
        let short = {
            let mut flights = lock(&self.flights);
            if whole {
                // Every entry of the file goes below, so no flight started
                // before can land or be joined: the epoch can start again
                // (a file unregistered leaves nothing behind).
                flights.epochs.remove(&file);
            } else {
                *flights.epochs.entry(file).or_default() += 1;
            }
            if last - first < flights.map.len() as u64 {
                for block in first..=last {
                    flights.map.remove(&Key { file, block });
                }
            } else {
                flights
                    .map
                    .retain(|k, _| k.file != file || !(first..=last).contains(&k.block));
            }
            flights.short.remove(&file).unwrap_or_default()
        };
        let mut policy = lock(&self.policy);
        let (tables, core) = (&self.tables, &self.core);
        // The file may have grown over its short blocks.
        for block in short {
            policy.drop_blocks(tables, core, file, block, block);
        }
        policy.drop_blocks(tables, core, file, first, last);
    }
}

impl Invalidate for State {
    fn invalidate(&self, file: FileId, offset: u64, len: u64) {
        self.drop_range(file_key(file), offset, len);
    }
}

/// Polls a flight; a task about to wait for one ends its inline stretch
/// (`inline::end_stretch`), so that its hits after the wait start a new one
/// instead of yielding first.
pub(super) fn poll_flight(wait: &mut Waiting, cx: &mut Context<'_>) -> Poll<Outcomes> {
    let res = wait.poll_flight(cx);
    if res.is_pending() {
        inline::end_stretch();
    }
    res
}

impl Waiting {
    /// The waited-for block, or its error, once the flight has landed.
    pub(super) fn poll_block(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<BlockRef>> {
        let outcomes = ready!(poll_flight(self, cx));
        Poll::Ready(outcomes[self.slot()].clone().map_err(|e| e.to_io()))
    }
}

pub(super) fn beyond_max(fid: FileId, block: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("block cache: block {block} of {fid} starts beyond i64::MAX"),
    )
}

/// The same error again (kind, errno, words).
pub(super) fn clone_io(e: &io::Error) -> io::Error {
    FlightError::new(e, None).to_io()
}

/// Unregisters a flight's blocks if it is dropped before it lands (every
/// caller gave up): a later miss starts a new read.
pub(super) struct Abandon<'a> {
    state: &'a State,
    id: (u64, u64),
    file: u64,
    blocks: &'a [u64],
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.state.land(self.id, self.file, self.blocks, None);
        }
    }
}

/// Block `b` of `file` from its read's result: continues a short read (not
/// on an `O_DIRECT` file, whose short read ends the file) until the block
/// is full or the file ends.
async fn finish(
    state: &State,
    file: FileRef,
    b: u64,
    (mut res, mut buf): (io::Result<usize>, FrameBuf),
) -> io::Result<BlockRef> {
    while let Ok(n) = res {
        if file.direct || n == 0 || buf.filled() >= state.block {
            break;
        }
        // The rest of the block, into the rest of the buffer: a window
        // (`Slice`) is filled from its start.
        let filled = buf.filled();
        let at = (b << state.shift) + filled as u64;
        let (r, back) = state.ctx.read_owned(file.id, at, buf.slice(filled..)).await;
        buf = back.into_inner();
        res = r;
    }
    res.map(|_| buf.into_block())
}

/// One flight: reads `blocks` of `file` into pool buffers, in one batch,
/// continuing short reads (not on `O_DIRECT` files, whose short reads end
/// the file) until a block is full or the file ends, then lands.
async fn run_flight(
    state: Arc<State>,
    id: (u64, u64),
    file: FileRef,
    blocks: Vec<u64>,
) -> Outcomes {
    let mut abandon = Abandon {
        state: &state,
        id,
        file: file.key,
        blocks: &blocks,
        armed: true,
    };
    let what = |b: u64| {
        format!(
            "block cache: read of block {b} of {} ({} bytes at offset {})",
            file.id,
            state.block,
            b << state.shift
        )
    };
    let failed = |b: u64, e: &io::Error| Arc::new(FlightError::new(e, Some(what(b))));
    let outcomes: Outcomes = if let [b] = blocks[..] {
        // One block (most misses): one read, without a batch's planning.
        Arc::new([match state.core.take() {
            Ok(buf) => {
                let res = state.ctx.read_owned(file.id, b << state.shift, buf).await;
                finish(&state, file, b, res)
                    .await
                    .map_err(|e| failed(b, &e))
            }
            Err(e) => Err(failed(b, &e)),
        }])
    } else {
        let mut bufs = Vec::with_capacity(blocks.len());
        let mut taken = Ok(());
        for &b in &blocks {
            match state.core.take() {
                Ok(buf) => bufs.push((file.id, b << state.shift, buf)),
                Err(e) => {
                    taken = Err(failed(b, &e));
                    break;
                }
            }
        }
        if let Err(e) = taken {
            blocks.iter().map(|_| Err(e.clone())).collect()
        } else {
            let mut outcomes = Vec::with_capacity(blocks.len());
            for (res, &b) in state.ctx.read_batch(bufs).await.into_iter().zip(&blocks) {
                outcomes.push(
                    finish(&state, file, b, res)
                        .await
                        .map_err(|e| failed(b, &e)),
                );
            }
            outcomes.into()
        }
    };
    state.land(id, file.key, &blocks, Some(&outcomes));
    abandon.armed = false;
    outcomes
}

/// The future of [`BlockCache::get`](crate::BlockCache::get): ready at its first poll on a hit;
/// on a miss it starts (or joins) the block's read and waits for it.
/// Dropping it leaves a read it started to the other callers waiting for
/// it (or drops the read if there are none).
///
/// ```
/// # use std::io::Write;
/// use std::future::Future;
/// use std::pin::pin;
/// use std::task::{Context, Poll};
/// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(&[6u8; 4096])?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
/// cache.get(0, 0).await?;
/// // A hit: ready at the first poll (unless the task is to yield first:
/// // its coop budget or its inline stretch is spent).
/// let mut cx = Context::from_waker(futures::task::noop_waker_ref());
/// if let Poll::Ready(block) = pin!(cache.get(0, 0)).poll(&mut cx) {
///     assert_eq!(block?[0], 6);
/// }
/// # Ok(())
/// # })
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct GetBlock<'a> {
    pub(super) state: &'a Arc<State>,
    pub(super) fid: FileId,
    pub(super) block: u64,
    pub(super) wait: Option<Waiting>,
}

impl fmt::Debug for GetBlock<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetBlock")
            .field("fid", &self.fid)
            .field("block", &self.block)
            .field("waiting", &self.wait.is_some())
            .finish()
    }
}

impl Future for GetBlock<'_> {
    type Output = io::Result<BlockRef>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.wait.is_none() {
            let state = this.state;
            let file = state.resolve(this.fid)?;
            if this.block > i64::MAX.unsigned_abs() >> state.shift {
                return Poll::Ready(Err(beyond_max(file.id, this.block)));
            }
            // The frame's lines, the whole block a `BlockRef` hands out,
            // load while the task is admitted.
            let frame = state.probe(file.key, this.block, 0..state.block);
            ready!(poll_admit(state, state.block, cx));
            if let Some(b) = frame.and_then(|f| state.pin(f, file.key, this.block)) {
                return Poll::Ready(Ok(b));
            }
            match state
                .join_or_start(file, &[this.block], Asker::Waiter)
                .0
                .pop()
            {
                Some(Lookup::Hit(b)) => return Poll::Ready(Ok(b)),
                Some(Lookup::Wait(wait)) => this.wait = Some(wait),
                None => unreachable!("one lookup per block"),
            }
        }
        let wait = this.wait.as_mut().expect("waiting for a flight");
        let res = ready!(wait.poll_block(cx));
        this.wait = None;
        Poll::Ready(res)
    }
}
