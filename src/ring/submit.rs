//! The SQ producer side of a ring: queueing an op ([`Ring::submit`]),
//! pushing its SQE or parking it in the backlog, moving the backlog into the
//! SQ, counting the SQEs the kernel has consumed, waking the driver, and the
//! one counted `io_uring_enter` path ([`Ring::plan_enter`] under the lock,
//! [`Ring::enter`] without it). Breaking the ring and failing the ops that
//! never reached the kernel are here too: they rest on this side's record
//! of which SQEs the kernel has.
//!
//! SAFETY (the state lock): the submission queue's producer side is touched
//! only under the state lock (`submission_shared` is called with the
//! `&mut State` of that lock in hand), so there is one `SubmissionQueue` of
//! the ring at a time. Every SQE pushed points into memory owned by its op
//! in `State::ops` (a pool buffer, a one-off `AlignedBuf`, or an owned
//! caller buffer), which stays in place until the op's CQE; the kernel may
//! read the SQE, and write into that memory, from the moment it is in the
//! SQ. `in_sq` records every pushed SQE in order, so which ones the kernel
//! has consumed is known under the lock; an enter submits only the SQEs
//! `plan_enter` counted under it, and none once the ring is broken — which
//! is what makes failing unconsumed SQEs locally sound.

use std::io;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use io_uring::squeue;

use super::complete::{apply_one, AfterUnlock};
use super::{errno, transient, Keep, Ring, RingOp, State, INTERNAL, NOT_SUBMITTED};
use crate::error::Closed;
use crate::files::FileEntry;
use crate::permit::Permit;
use crate::thread;
use crate::util::lock;

// io_uring_enter flags (include/uapi/linux/io_uring.h).
pub(super) const ENTER_GETEVENTS: u32 = 1;
const ENTER_SQ_WAKEUP: u32 = 2;

/// One `io_uring_enter`, planned under the state lock.
#[derive(Debug, Clone, Copy)]
pub(super) struct EnterPlan {
    pub(super) to_submit: u32,
    pub(super) flags: u32,
    /// Most SQEs to hand over per enter (`Builder::shallow_batch` on a shallow
    /// ring, unless a batch asked for one enter; else all of them in one).
    pub(super) batch: u32,
}

/// A ring with at most this many ops in the kernel (counting the ones being
/// submitted) is *shallow*: the device is not full, and latency is what counts.
const SHALLOW_DEPTH: u64 = 64;

/// Most SQEs one enter hands to a shallow ring (`Builder::shallow_batch`):
/// the block layer plugs a whole submission batch, so small enters reach
/// the disk sooner. A deep ring keeps one enter (DESIGN, "Low depth").
pub(crate) const DEFAULT_SHALLOW_BATCH: u32 = 8;

fn address(ring: &Ring) -> usize {
    std::ptr::from_ref(ring) as usize
}

/// While alive, ops queued on this thread to one of `rings` wait; on drop
/// each of those rings submits them at once (a batch holds one while it
/// polls its reads). Other rings submit as usual, so nothing is left queued
/// with nobody to submit it.
pub(crate) struct Deferral<'a> {
    rings: &'a [Arc<Ring>],
    /// Where this deferral's rings start in the thread's list (`None`:
    /// the thread is exiting and defers nothing).
    mark: Option<usize>,
}

impl<'a> Deferral<'a> {
    pub(crate) fn new(rings: &'a [Arc<Ring>]) -> Self {
        let mark = thread::with_deferred(|d| {
            let mut d = d.borrow_mut();
            let mark = d.len();
            d.extend(rings.iter().map(|r| address(r)));
            mark
        });
        Deferral { rings, mark }
    }
}

impl Drop for Deferral<'_> {
    fn drop(&mut self) {
        if let Some(mark) = self.mark {
            thread::with_deferred(|d| d.borrow_mut().truncate(mark));
        }
        for ring in self.rings {
            if ring.has_unsubmitted() {
                ring.whole_batch.store(true, Ordering::Release);
                ring.submit_queued();
            }
        }
    }
}

impl Ring {
    /// Queues one op on `file` (`None`: an op on no file) in the SQ (or the
    /// backlog) and returns its key, for
    /// [`poll_complete`](Ring::poll_complete) or [`abandon`](Ring::abandon).
    pub(crate) fn submit(
        &self,
        file: Option<Arc<FileEntry>>,
        permit: Permit,
        op: RingOp<'_>,
    ) -> io::Result<usize> {
        let large = self.large_bounce(&op)?;
        let st = lock(&self.state);
        if let Some(closed) = &st.closed {
            return Err(closed.error());
        }
        let ioprio = permit.priority().ioprio();
        let (mut st, buf, entry) = self.sqe(st, file.as_deref(), &op, large, ioprio)?;
        let key = st.ops.insert(
            buf,
            Keep {
                _file: file,
                _permit: permit,
            },
        );
        let user_data = st.ops.user_data(key).expect("op just inserted");
        self.push_locked(&mut st, entry.user_data(user_data));
        st.live += 1;
        drop(st);
        if self.batching_here() {
            // `Deferral::drop` submits the batch's reads at once.
            return Ok(key);
        }
        self.submit_queued();
        Ok(key)
    }

    /// Whether this thread is queueing a batch's reads on this ring (a live
    /// [`Deferral`] covers it).
    pub(crate) fn batching_here(&self) -> bool {
        thread::with_deferred(|d| d.borrow().contains(&address(self))).unwrap_or(false)
    }

    /// Hands what is queued to the kernel: from this thread when the driver
    /// is idle (see below), else by waking the driver.
    pub(crate) fn submit_queued(&self) {
        if thread::on_driver_thread() && self.idle.swap(false, Ordering::AcqRel) {
            // Submitting here costs less than waking the idle driver for
            // one SQE; ops after this one find `idle` false and batch
            // through the driver.
            self.submit_now();
        } else {
            self.notify_driver();
        }
    }

    /// Whether SQEs are queued that no enter has handed to the kernel yet.
    fn has_unsubmitted(&self) -> bool {
        let mut st = lock(&self.state);
        self.account_consumed(&mut st);
        !st.backlog.is_empty() || !st.in_sq.is_empty()
    }

    /// One enter from the calling thread; what it could not move is left to
    /// the driver, which has the timer to retry.
    fn submit_now(&self) {
        let mut entered = true;
        if let Some(plan) = self.plan_enter(false) {
            match self.enter(plan, 0) {
                Ok(_) => {}
                Err(e) if transient(&e) => entered = false,
                Err(e) => return self.break_ring(&e),
            }
        }
        if !entered || self.has_unsubmitted() {
            self.notify_driver();
        }
    }

    /// Pushes an SQE, or parks it in the backlog when the queue is full.
    pub(super) fn push_locked(&self, st: &mut State, entry: squeue::Entry) {
        if st.backlog.is_empty() {
            let user_data = entry.get_user_data();
            // SAFETY: the state lock is held, so this is the only
            // SubmissionQueue of this ring in existence; the entry's buffer
            // is owned by the op table until its CQE (see this module's
            // SAFETY note).
            let pushed = unsafe { self.uring.submission_shared().push(&entry) };
            if pushed.is_ok() {
                st.in_sq.push_back(user_data);
                return;
            }
        }
        st.backlog.push_back(entry);
    }

    /// Moves as much of the backlog as fits into the SQ (the state lock is
    /// held: `st` comes from it).
    fn flush_backlog(&self, st: &mut State) {
        if st.backlog.is_empty() {
            return;
        }
        // SAFETY: the state lock is held (we have `&mut State` from it), so
        // this is the only SubmissionQueue of this ring.
        let mut sq = unsafe { self.uring.submission_shared() };
        while let Some(e) = st.backlog.front() {
            // SAFETY: every SQE's buffer is owned by its op until its CQE
            // (as in `push_locked`).
            if unsafe { sq.push(e) }.is_err() {
                break;
            }
            st.in_sq.push_back(e.get_user_data());
            st.backlog.pop_front();
        }
    }

    /// Drops from `in_sq` the SQEs the kernel has consumed (it consumes in
    /// order, so they are the oldest), counting them as submitted.
    pub(super) fn account_consumed(&self, st: &mut State) {
        if st.in_sq.is_empty() {
            return;
        }
        // SAFETY: the state lock is held (we have `&mut State` from it).
        let unconsumed = unsafe { self.uring.submission_shared() }.len();
        while st.in_sq.len() > unconsumed {
            if st.in_sq.pop_front() != Some(INTERNAL) {
                st.submitted += 1;
            }
        }
    }

    /// Tells the driver that SQEs are queued: wakes it unless it is in its
    /// poll (it checks `submit_pending` before sleeping), since a wake
    /// mid-poll only unparks another worker (DESIGN, "The driver").
    pub(super) fn notify_driver(&self) {
        // SeqCst, with the driver's store of `polling` and load of
        // `submit_pending` in `Driver::poll`: if this load sees `polling`
        // true, the driver's check after clearing it sees the flag.
        if !self.submit_pending.swap(true, Ordering::SeqCst) && !self.polling.load(Ordering::SeqCst)
        {
            self.driver_waker.wake();
        }
    }

    /// Moves backlog into the SQ and plans an enter, if one is worth making
    /// (SQEs queued, CQ overflow to flush, task work to run, a sleeping
    /// SQPOLL thread to wake). A broken ring never submits again.
    pub(super) fn plan_enter(&self, wait: bool) -> Option<EnterPlan> {
        let mut st = lock(&self.state);
        if matches!(st.closed, Some(Closed::Broken(_))) {
            return None;
        }
        self.account_consumed(&mut st);
        self.flush_backlog(&mut st);
        // SAFETY: the state lock is held.
        let sq = unsafe { self.uring.submission_shared() };
        let pending = u32::try_from(sq.len()).unwrap_or(u32::MAX);
        let mut flags = 0;
        if wait || sq.cq_overflow() || sq.taskrun() {
            flags |= ENTER_GETEVENTS;
        }
        if self.sqpoll {
            // Pairs with the kernel thread's barrier before it sets
            // NEED_WAKEUP (see io_uring's `SubmissionQueue::need_wakeup`).
            fence(Ordering::SeqCst);
            if pending > 0 && sq.need_wakeup() {
                flags |= ENTER_SQ_WAKEUP;
            }
            return (flags != 0).then_some(EnterPlan {
                to_submit: pending,
                flags,
                batch: u32::MAX,
            });
        }
        let depth = st
            .submitted
            .saturating_sub(st.completed)
            .saturating_add(u64::from(pending));
        let whole = self.whole_batch.swap(false, Ordering::AcqRel);
        let batch = if depth <= SHALLOW_DEPTH && !whole {
            self.shallow_batch
        } else {
            u32::MAX
        };
        (pending > 0 || flags != 0).then_some(EnterPlan {
            to_submit: pending,
            flags,
            batch,
        })
    }

    /// `io_uring_enter` without the state lock, submitting exactly the SQEs
    /// `plan` counted (in enters of `plan.batch` when not waiting) and
    /// waiting for `wait` completions. After a partial failure it returns
    /// what was submitted; the rest stays in the SQ for the next round.
    pub(super) fn enter(&self, plan: EnterPlan, wait: u32) -> io::Result<usize> {
        if wait > 0 || plan.to_submit <= plan.batch {
            return self.enter_once(plan.to_submit, plan.flags, wait);
        }
        let mut done = 0usize;
        let mut left = plan.to_submit;
        while left > 0 {
            let n = left.min(plan.batch);
            match self.enter_once(n, plan.flags, 0) {
                Ok(got) => {
                    done += got;
                    if got < n as usize {
                        // The kernel stopped early (an SQE it refused):
                        // the driver's next round sees the rest.
                        break;
                    }
                    left -= n;
                }
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn enter_once(&self, to_submit: u32, flags: u32, wait: u32) -> io::Result<usize> {
        loop {
            // SAFETY: the SQEs being submitted each point into memory owned
            // by their op until its CQE (see `push_locked`); no extra
            // argument is passed (null, size 0).
            let r = unsafe {
                self.uring.submitter().enter::<libc::sigset_t>(
                    to_submit,
                    wait,
                    flags | if wait > 0 { ENTER_GETEVENTS } else { 0 },
                    None,
                )
            };
            self.enters.fetch_add(1, Ordering::Relaxed);
            match r {
                Err(e) if errno(&e) == libc::EINTR => {}
                r => return r,
            }
        }
    }

    /// io_uring_enter failed for good: stop taking ops, and fail every op
    /// the kernel never saw (backlog and SQ: nothing enters with SQEs to
    /// submit again). Ops in the kernel complete as usual.
    pub(super) fn break_ring(&self, e: &io::Error) {
        let mut out = AfterUnlock::default();
        let mut st = lock(&self.state);
        if matches!(st.closed, Some(Closed::Broken(_))) {
            return;
        }
        st.closed = Some(Closed::Broken(e.to_string()));
        crate::util::decision!(error, error = %e, "io_uring_enter failed for good: the ring takes no more ops");
        self.fail_unsubmitted(&mut st, true, &mut out);
        drop(st);
        out.run();
        self.permits.close();
    }

    /// Gives every op whose SQE is still in the backlog (and, with
    /// `sq_too`, in the SQ) the `NOT_SUBMITTED` result: they will never be
    /// submitted. Only sound for SQ entries if nothing ever enters with
    /// `to_submit > 0` on this ring again (a broken ring) and no SQPOLL
    /// thread can pick them up.
    pub(super) fn fail_unsubmitted(&self, st: &mut State, sq_too: bool, out: &mut AfterUnlock) {
        let mut keys: Vec<u64> = st.backlog.drain(..).map(|e| e.get_user_data()).collect();
        if sq_too && !self.sqpoll {
            self.account_consumed(st);
            keys.extend(st.in_sq.drain(..));
        }
        for key in keys {
            apply_one(st, key, NOT_SUBMITTED, false, out);
        }
    }
}
