//! The completion side of a ring: reaping CQEs ([`Ring::reap`], the only
//! reaper — the driver, the blocking drive and the teardown all call it),
//! applying one completion to the op table ([`apply_one`]), a future
//! collecting its op ([`Ring::poll_complete`], [`Ring::finish`]) or walking
//! away from it ([`Ring::abandon`]), and [`AfterUnlock`], the wakers and
//! resources released only once the locks are gone.
//!
//! SAFETY (`reap_lock`, then the state lock per batch): the completion queue
//! is consumed only under `reap_lock`, so there is one `CompletionQueue` of
//! the ring at a time; each batch of CQEs is applied to the op table under
//! the state lock. A CQE means the kernel is done with its op's buffer, so
//! only after it may an op leave the table, a pool buffer go back on the
//! free list, or a pool buffer be copied out (in `finish`, under the state
//! lock, before it is pushed back); a future that walks away before
//! the CQE leaves its op, and whatever it parked, in the table until then.

use std::any::Any;
use std::io;
use std::mem::MaybeUninit;
use std::sync::MutexGuard;
use std::task::{Context, Poll, Waker};

use io_uring::{cqueue, opcode};

use super::table::{Abandoned, OnCqe, OpBuf, Polled, Record};
use super::{Keep, Ring, State, INTERNAL, NOT_SUBMITTED};
use crate::error::{self, shut_down_error, Closed};
use crate::util::lock;

/// Where a completed bounce buffer's bytes go: crate code that copies them
/// into the op's destination (it runs under the state lock).
pub(crate) type CopyTo<'c> = &'c mut dyn FnMut(&[u8]);

/// CQEs taken per lock of the op table.
const REAP_BATCH: usize = 256;

/// The most completions the driver hands to a relay ([`Ring::reap_relayed`]):
/// low depths' rounds, not a deep ring's, which is worth spreading over the
/// workers (DESIGN, "The driver").
pub(super) const RELAY_MAX: usize = 16;

/// What a completed ring op tells its future.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) res: io::Result<usize>,
    /// See [`Record::tainted`].
    pub(crate) tainted: bool,
}

/// A removed op and what its future parked with it.
pub(super) type Released = (Record<Keep>, Option<Box<dyn Any + Send>>);

/// Wakers to wake and resources to release once the lock is gone.
#[derive(Default)]
pub(super) struct AfterUnlock {
    pub(super) wakers: Vec<Waker>,
    pub(super) released: Vec<Released>,
}

impl AfterUnlock {
    /// Must be called without any of the ring's locks held.
    pub(super) fn run(self) {
        self.wakers.into_iter().for_each(Waker::wake);
        for r in self.released {
            super::drop_caught(r);
        }
    }
}

impl Ring {
    /// Takes every CQE off the queue, completes its op and wakes its future.
    /// Returns how many there were.
    pub(super) fn reap(&self) -> usize {
        self.reap_inner(false)
    }

    /// [`reap`](Self::reap) for the driver: of 2 to [`RELAY_MAX`] woken
    /// futures only the first is woken now, the rest queued in `relay`, each
    /// woken by the one before ([`Ring::relay_next`]), so the round runs on
    /// this worker without waking an idle one (DESIGN, "The driver").
    ///
    /// Liveness: the driver wakes what is left at its next poll
    /// ([`Ring::relay_flush`]); a future never polled delays the rest one round.
    pub(super) fn reap_relayed(&self) -> usize {
        self.reap_inner(true)
    }

    /// Wakes the next future of the relay, if any. Called by a future that
    /// has collected its completion or walked away from its op.
    pub(super) fn relay_next(&self) {
        let next = lock(&self.relay).pop_front();
        if let Some(w) = next {
            w.wake();
        }
    }

    /// Wakes every future still in the relay.
    pub(super) fn relay_flush(&self) {
        let rest = std::mem::take(&mut *lock(&self.relay));
        rest.into_iter().for_each(Waker::wake);
    }

    fn reap_inner(&self, relay: bool) -> usize {
        let mut total = 0;
        let mut space = [const { MaybeUninit::<cqueue::Entry>::uninit() }; REAP_BATCH];
        loop {
            let mut out = AfterUnlock::default();
            {
                let _only_reaper = lock(&self.reap_lock);
                // SAFETY: `reap_lock` is held: the only CompletionQueue of this ring.
                let cqes = unsafe { self.uring.completion_shared() }.fill(&mut space);
                if cqes.is_empty() {
                    return total;
                }
                total += cqes.len();
                let mut st = lock(&self.state);
                for cqe in &*cqes {
                    apply_one(&mut st, cqe.user_data(), cqe.result(), true, &mut out);
                }
            }
            // Wakers and parked buffers are user code: run them with neither
            // lock held (a waker may poll a future that reaps in turn).
            if relay && (2..=RELAY_MAX).contains(&out.wakers.len()) {
                let mut wakers = std::mem::take(&mut out.wakers).into_iter();
                let first = wakers.next();
                lock(&self.relay).extend(wakers);
                first.into_iter().for_each(Waker::wake);
            }
            out.run();
        }
    }

    /// Whether the completion queue holds no CQE right now.
    pub(super) fn cq_is_empty(&self) -> bool {
        let _only_reaper = lock(&self.reap_lock);
        // SAFETY: `reap_lock` is held: the only CompletionQueue of this ring.
        unsafe { self.uring.completion_shared() }.is_empty()
    }

    /// Polls op `key` from its future. On completion the op is removed, the
    /// bytes read into its bounce buffer (if any) handed to `copy_to` (crate
    /// code that copies them out; it runs under the state lock), and the
    /// result mapped.
    pub(crate) fn poll_complete(
        &self,
        key: usize,
        cx: &mut Context<'_>,
        copy_to: Option<CopyTo<'_>>,
    ) -> Poll<Completion> {
        let mut st = lock(&self.state);
        let polled = st.ops.poll(key, cx.waker());
        let replaced = match polled {
            Polled::Ready(res, op) => {
                let done = self.finish(st, res, op, copy_to);
                self.relay_next();
                return Poll::Ready(done);
            }
            Polled::Pending => None,
            Polled::NeedsWaker => {
                // Cloning a waker is user code: not under the lock.
                drop(st);
                let waker = cx.waker().clone();
                st = lock(&self.state);
                match st.ops.set_waker(key, waker) {
                    Ok(old) => old,
                    Err((res, op, waker)) => {
                        let done = self.finish(st, res, op, copy_to);
                        drop(waker);
                        self.relay_next();
                        return Poll::Ready(done);
                    }
                }
            }
        };
        if st.gave_up && st.ops.is_bounce(key) {
            // shutdown() gave up on the kernel: a borrowed op resolves now;
            // its bounce buffer stays with the ring until a CQE, if any.
            let abandoned = st.ops.abandon(key, None);
            drop(st);
            drop((abandoned, replaced));
            return Poll::Ready(Completion {
                res: Err(error::gave_up()),
                tainted: false,
            });
        }
        let driver_gone = st.driver_gone;
        drop(st);
        drop(replaced);
        if driver_gone {
            // No driver will reap (its runtime shut down): drive from here.
            self.drive_blocking();
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// Removes a completed op: copies its bounce buffer out, recycles it,
    /// and releases the rest after unlocking.
    fn finish(
        &self,
        mut st: MutexGuard<'_, State>,
        res: i32,
        op: Record<Keep>,
        mut copy_to: Option<CopyTo<'_>>,
    ) -> Completion {
        let result = match res {
            NOT_SUBMITTED => Err(st
                .closed
                .as_ref()
                .map_or_else(shut_down_error, Closed::error)),
            res if res < 0 => Err(io::Error::from_raw_os_error(-res)),
            res => Ok(usize::try_from(res).unwrap_or(0)),
        };
        let Record {
            buf, keep, tainted, ..
        } = op;
        // An exiting submitter's requests may fail before its driver is
        // dropped: an op collected after the driver, or with EFAULT (the
        // crate only hands valid buffers), is suspect too (DESIGN, "Failure model").
        let tainted = tainted || st.driver_gone || res == -libc::EFAULT;
        let mut heap = None;
        match buf {
            OpBuf::Pool(i) => {
                if let (Ok(n), Some(copy)) = (&result, copy_to.as_mut()) {
                    let n = (*n).min(self.pool.buf_size());
                    // SAFETY: the CQE is in, so the kernel no longer writes
                    // buffer `i`; it is not on the free list (we hold the
                    // lock and have not pushed it yet) and holds >= n bytes.
                    let src = unsafe { std::slice::from_raw_parts(self.pool.ptr(i as usize), n) };
                    copy(src);
                }
                st.free_bufs.push(i);
            }
            OpBuf::Heap(b) => heap = Some(b),
            OpBuf::Caller => {}
        }
        drop(st);
        if let (Some(b), Ok(n), Some(copy)) = (&heap, &result, copy_to) {
            copy(&b[..(*n).min(b.len())]);
        }
        drop(keep);
        Completion {
            res: result,
            tainted,
        }
    }

    /// The future of op `key` is gone; `keep_alive` holds whatever else the
    /// kernel may write into (an owned buffer) until the CQE.
    ///
    /// An op still in the backlog is released at once; one the kernel may
    /// hold gets an `ASYNC_CANCEL`, and its buffer stays with the ring until
    /// its own CQE (DESIGN, "Op lifecycle").
    pub(crate) fn abandon(&self, key: usize, keep_alive: Option<Box<dyn Any + Send>>) {
        let mut out = AfterUnlock::default();
        let mut st = lock(&self.state);
        let user_data = st.ops.user_data(key);
        let abandoned = st.ops.abandon(key, keep_alive);
        let mut cancel = false;
        match &abandoned {
            Abandoned::Released(op, _) => {
                if let OpBuf::Pool(i) = op.buf {
                    st.free_bufs.push(i);
                }
            }
            Abandoned::Parked(_) => {
                if let Some(user_data) = user_data {
                    cancel = self.cancel_locked(&mut st, user_data, &mut out);
                }
            }
            Abandoned::Gone(_) => {}
        }
        drop(st);
        drop(abandoned);
        out.run();
        // A future in the relay may be dropped before (or instead of)
        // collecting its completion: pass the turn on.
        self.relay_next();
        if cancel {
            // No syscall in a drop: the driver submits the cancel.
            self.notify_driver();
        }
    }

    /// Cancels the op with `user_data` (state lock held): out of the backlog,
    /// else by queueing an async cancel. Returns whether an SQE was queued.
    fn cancel_locked(&self, st: &mut State, user_data: u64, out: &mut AfterUnlock) -> bool {
        if let Some(pos) = st
            .backlog
            .iter()
            .position(|e| e.get_user_data() == user_data)
        {
            st.backlog.remove(pos);
            apply_one(st, user_data, -libc::ECANCELED, false, out);
            return false;
        }
        // A closing ring has its cancel-all queued, or submits nothing.
        if st.closed.is_some() || st.cancel_queued {
            return false;
        }
        let cancel = opcode::AsyncCancel::new(user_data)
            .build()
            .user_data(INTERNAL);
        self.push_locked(st, cancel);
        st.cancels += 1;
        true
    }
}

/// Applies one completion (from a CQE, `kernel`, or a local failure) to
/// the op its `user_data` names. Internal SQEs (cancels) have no op.
pub(super) fn apply_one(
    st: &mut State,
    user_data: u64,
    res: i32,
    kernel: bool,
    out: &mut AfterUnlock,
) {
    if user_data == INTERNAL {
        return;
    }
    let Some(slot) = st.ops.key_of(user_data) else {
        return;
    };
    match st.ops.on_cqe(slot, res) {
        OnCqe::Wake(w) => {
            st.live -= 1;
            st.completed += u64::from(kernel);
            out.wakers.extend(w);
        }
        OnCqe::Release(op, kept) => {
            st.live -= 1;
            st.completed += u64::from(kernel);
            if let OpBuf::Pool(i) = op.buf {
                st.free_bufs.push(i);
            }
            out.released.push((op, kept));
        }
        OnCqe::Unknown => {}
    }
}
