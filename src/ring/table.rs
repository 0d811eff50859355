//! The life of one in-flight op, independent of the kernel.
//!
//! Every submitted op owns a slot in an [`OpTable`], keyed by the SQE's
//! `user_data`. The slot holds everything the kernel may touch (its buffer)
//! and everything that must outlive the kernel's use of it (the file's table
//! entry, the in-flight permit). The future that issued the op holds only
//! the key. State changes go through `mem::replace` and a `match`:
//!
//! ```text
//!            poll (not done)                  CQE
//! Waiting(w) ───────────────► Waiting(w') ──────────► Completed(res) ──poll──► removed, result to future
//!     │                                                    │
//!     │ future dropped                                     │ future dropped
//!     ▼                                                    ▼
//! Ignored(keep) ─────────────── CQE ───────────────► removed, resources released
//! ```
//!
//! The slot is removed, and its buffer released, only in two places: when the
//! CQE arrives for an `Ignored` op, or when the future collects a `Completed`
//! result (or is dropped after completion). Both happen after the kernel has
//! posted the CQE, i.e. after it has stopped touching the buffer.

use std::any::Any;
use std::fmt;
use std::mem;
use std::task::Waker;

use slab::Slab;

use crate::buf::AlignedBuf;

/// The buffer the kernel uses for one op.
pub(crate) enum OpBuf {
    /// Buffer `index` of the ring's bounce-buffer pool.
    Pool(u32),
    /// A one-off bounce buffer for an op larger than the pool's buffers.
    Heap(AlignedBuf),
    /// The caller's own buffer (`read_owned`); if the future is dropped it is
    /// parked in [`Lifecycle::Ignored`].
    Caller,
}

impl fmt::Debug for OpBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpBuf::Pool(i) => write!(f, "Pool({i})"),
            OpBuf::Heap(b) => write!(f, "Heap({})", b.len()),
            OpBuf::Caller => f.write_str("Caller"),
        }
    }
}

/// The state of one operation.
pub(crate) enum Lifecycle {
    /// Queued or in the kernel; the waker of the last poll, if any.
    Waiting(Option<Waker>),
    /// The future is gone; whatever the kernel may still write into is kept
    /// here until the CQE arrives.
    Ignored(Option<Box<dyn Any + Send>>),
    /// The CQE arrived with this result; waiting for the future to collect it.
    Completed(i32),
}

impl fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lifecycle::Waiting(w) => write!(f, "Waiting(has_waker: {})", w.is_some()),
            Lifecycle::Ignored(k) => write!(f, "Ignored(keeps: {})", k.is_some()),
            Lifecycle::Completed(r) => write!(f, "Completed({r})"),
        }
    }
}

/// One slot: the state plus the resources released when the slot is removed.
/// `R` is what must outlive the kernel's use (file entry, permit); generic so
/// the lifecycle can be tested without a kernel.
#[derive(Debug)]
pub(crate) struct Record<R> {
    pub(crate) lifecycle: Lifecycle,
    /// Told apart from earlier ops in the same slot: the SQE's `user_data`
    /// is the key and this tag (see [`OpTable::user_data`]), so a cancel
    /// aimed at a dropped op can never hit a later op that reused its slot.
    tag: u32,
    pub(crate) buf: OpBuf,
    pub(crate) keep: R,
    /// The thread that submitted it exited while it was in the kernel (the
    /// context's home runtime shut down): io_uring may have cut it short.
    pub(crate) tainted: bool,
}

/// What a CQE did to its slot. Nothing in here has been dropped: the caller
/// drops it after unlocking, because a waker or a parked buffer is user code.
#[derive(Debug)]
pub(crate) enum OnCqe<R> {
    /// The future is waiting: wake it (if it was ever polled).
    Wake(Option<Waker>),
    /// The future was dropped: the slot is removed, release its resources
    /// (and whatever the future parked with it).
    Release(Record<R>, Option<Box<dyn Any + Send>>),
    /// No such slot (a CQE for an internal SQE such as a cancel).
    Unknown,
}

/// What polling a slot found.
#[derive(Debug)]
pub(crate) enum Polled<R> {
    /// Completed: the slot is removed and handed over with the result.
    Ready(i32, Record<R>),
    /// Still waiting, and the stored waker already wakes this task.
    Pending,
    /// Still waiting, with no waker or another task's: store a new one with
    /// [`OpTable::set_waker`] (cloned outside the lock: a clone is user code).
    NeedsWaker,
}

/// The table of operations of one ring.
#[derive(Debug)]
pub(crate) struct OpTable<R> {
    slab: Slab<Record<R>>,
    next_tag: u32,
}

impl<R> Default for OpTable<R> {
    fn default() -> Self {
        OpTable {
            slab: Slab::new(),
            next_tag: 0,
        }
    }
}

/// Tags use 31 bits, so an op's `user_data` never has the top bit set (the
/// ring's internal SQEs use `u64::MAX`).
const TAG_MASK: u32 = 0x7fff_ffff;

impl<R> OpTable<R> {
    /// Number of live slots (queued, in the kernel, or completed but not collected).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    /// Adds a `Waiting` op; returns its key (see [`OpTable::user_data`]
    /// for its SQE's `user_data`).
    pub(crate) fn insert(&mut self, buf: OpBuf, keep: R) -> usize {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1) & TAG_MASK;
        self.slab.insert(Record {
            lifecycle: Lifecycle::Waiting(None),
            tag,
            buf,
            keep,
            tainted: false,
        })
    }

    /// The `user_data` of op `key`'s SQE: the key in the low 32 bits (the
    /// in-flight limit keeps keys far below 2^32), its tag above.
    pub(crate) fn user_data(&self, key: usize) -> Option<u64> {
        let op = self.slab.get(key)?;
        let key = u32::try_from(key).ok()?;
        Some(u64::from(op.tag) << 32 | u64::from(key))
    }

    /// The key a CQE's `user_data` names, if that op is still in the table
    /// (and not a later op in the same slot).
    pub(crate) fn key_of(&self, user_data: u64) -> Option<usize> {
        let key = usize::try_from(user_data & u64::from(u32::MAX)).ok()?;
        let tag = u32::try_from(user_data >> 32).ok()?;
        (self.slab.get(key)?.tag == tag).then_some(key)
    }

    /// Applies a CQE (or a result given to an op that never reached the
    /// kernel, which is the same thing for the slot).
    pub(crate) fn on_cqe(&mut self, key: usize, res: i32) -> OnCqe<R> {
        let Some(op) = self.slab.get_mut(key) else {
            return OnCqe::Unknown;
        };
        match mem::replace(&mut op.lifecycle, Lifecycle::Completed(res)) {
            Lifecycle::Waiting(waker) => OnCqe::Wake(waker),
            Lifecycle::Ignored(keep) => {
                let op = self.slab.remove(key);
                OnCqe::Release(op, keep)
            }
            Lifecycle::Completed(prev) => {
                // One SQE yields one CQE; a second one means the key was
                // reused while the kernel still owned it, which would be a bug.
                op.lifecycle = Lifecycle::Completed(prev);
                debug_assert!(false, "second CQE for op {key}");
                OnCqe::Unknown
            }
        }
    }

    /// Polls an op from its future: `Ready` (and the slot removed) once the
    /// CQE is in.
    pub(crate) fn poll(&mut self, key: usize, waker: &Waker) -> Polled<R> {
        let op = self.slab.get_mut(key).expect("polled an unknown op");
        match &op.lifecycle {
            Lifecycle::Completed(res) => {
                let res = *res;
                Polled::Ready(res, self.slab.remove(key))
            }
            Lifecycle::Waiting(Some(w)) if w.will_wake(waker) => Polled::Pending,
            Lifecycle::Waiting(_) => Polled::NeedsWaker,
            Lifecycle::Ignored(_) => unreachable!("polled an op whose future was dropped"),
        }
    }

    /// Stores `waker` for a waiting op and returns the one it replaces (to
    /// be dropped outside the lock); or, if the CQE came in meanwhile, hands
    /// the completed op over as `Err` (and gives `waker` back).
    pub(crate) fn set_waker(
        &mut self,
        key: usize,
        waker: Waker,
    ) -> Result<Option<Waker>, (i32, Record<R>, Waker)> {
        let op = self.slab.get_mut(key).expect("polled an unknown op");
        match &mut op.lifecycle {
            Lifecycle::Waiting(slot) => Ok(slot.replace(waker)),
            Lifecycle::Completed(res) => {
                let res = *res;
                Err((res, self.slab.remove(key), waker))
            }
            Lifecycle::Ignored(_) => unreachable!("polled an op whose future was dropped"),
        }
    }

    /// The future is gone. A completed op is removed and returned (release
    /// its resources); an op the kernel still owns becomes `Ignored`, keeping
    /// `keep_alive` (e.g. the caller's owned buffer) until its CQE. The
    /// waker it held is returned, to be dropped outside the lock.
    pub(crate) fn abandon(
        &mut self,
        key: usize,
        keep_alive: Option<Box<dyn Any + Send>>,
    ) -> Abandoned<R> {
        let Some(op) = self.slab.get_mut(key) else {
            return Abandoned::Gone(keep_alive);
        };
        match mem::replace(&mut op.lifecycle, Lifecycle::Ignored(None)) {
            Lifecycle::Completed(_) => {
                let op = self.slab.remove(key);
                Abandoned::Released(op, keep_alive)
            }
            Lifecycle::Waiting(waker) => {
                op.lifecycle = Lifecycle::Ignored(keep_alive);
                Abandoned::Parked(waker)
            }
            Lifecycle::Ignored(_) => unreachable!("op {key} abandoned twice"),
        }
    }

    /// Marks every op the kernel still owns as tainted (see [`Record::tainted`]).
    pub(crate) fn taint_in_kernel(&mut self) {
        self.slab
            .iter_mut()
            .filter(|(_, op)| !matches!(op.lifecycle, Lifecycle::Completed(_)))
            .for_each(|(_, op)| op.tainted = true);
    }

    /// Whether op `key` uses a bounce buffer (not caller memory).
    pub(crate) fn is_bounce(&self, key: usize) -> bool {
        self.slab
            .get(key)
            .is_some_and(|op| !matches!(op.buf, OpBuf::Caller))
    }

    /// Keys of the ops the kernel still owns (waiting or ignored).
    #[cfg(test)]
    pub(crate) fn kernel_owned(&self) -> impl Iterator<Item = usize> + '_ {
        self.slab
            .iter()
            .filter(|(_, op)| !matches!(op.lifecycle, Lifecycle::Completed(_)))
            .map(|(k, _)| k)
    }

    /// Empties the table for a teardown that gives up on the kernel: what
    /// the kernel may still write into — every buffer, and whatever a
    /// dropped future parked — is leaked; the rest of each op (`R`: the
    /// file entry and permit, which the kernel does not need, as it holds
    /// its own reference to the file) is returned to be released.
    pub(crate) fn leak_buffers(&mut self) -> Vec<R> {
        self.slab
            .drain()
            .map(|op| {
                let Record {
                    lifecycle,
                    buf,
                    keep,
                    ..
                } = op;
                mem::forget(lifecycle);
                mem::forget(buf);
                keep
            })
            .collect()
    }

    /// Wakes every waiting future (shutdown, driver gone).
    pub(crate) fn take_wakers(&mut self) -> Vec<Waker> {
        self.slab
            .iter_mut()
            .filter_map(|(_, op)| match &mut op.lifecycle {
                Lifecycle::Waiting(w) => w.take(),
                _ => None,
            })
            .collect()
    }
}

/// What abandoning an op left to drop (outside the lock).
#[derive(Debug)]
#[allow(dead_code)] // the fields are held only to be dropped after unlocking
pub(crate) enum Abandoned<R> {
    /// It had completed: release it, and the parked value with it.
    Released(Record<R>, Option<Box<dyn Any + Send>>),
    /// The kernel still owns it: the parked value stays; drop the old waker.
    Parked(Option<Waker>),
    /// No such op (it was never inserted).
    Gone(Option<Box<dyn Any + Send>>),
}

#[cfg(test)]
mod tests {
    //! The lifecycle driven by synthetic completions: no kernel involved.
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use crate::util::count_waker as waker;

    /// A resource whose drop is observable: stands for the file entry/permit.
    #[derive(Debug)]
    struct Tracked(Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A slot reused after its op is gone gets a new `user_data`: a CQE or
    /// cancel aimed at the old op cannot reach the new one.
    #[test]
    fn reused_slot_gets_a_new_user_data() {
        let mut table: OpTable<()> = OpTable::default();
        let first = table.insert(OpBuf::Caller, ());
        let ud_a = table.user_data(first).unwrap();
        assert_eq!(table.key_of(ud_a), Some(first));
        assert!(matches!(table.on_cqe(first, 0), OnCqe::Wake(None)));
        let (_, wk) = waker();
        assert!(matches!(table.poll(first, &wk), Polled::Ready(0, _)));
        assert_eq!(table.key_of(ud_a), None, "removed op still addressable");
        let second = table.insert(OpBuf::Caller, ());
        assert_eq!(first, second, "slab reuses the slot");
        let ud_b = table.user_data(second).unwrap();
        assert_ne!(ud_a, ud_b);
        assert_eq!(table.key_of(ud_a), None, "old user_data names the new op");
        assert_eq!(table.key_of(ud_b), Some(second));
        // Never the internal user_data, even when the tag wraps.
        table.next_tag = TAG_MASK;
        let third = table.insert(OpBuf::Caller, ());
        let fourth = table.insert(OpBuf::Caller, ());
        assert_eq!(table.user_data(third).unwrap() >> 63, 0);
        assert_eq!(table.user_data(fourth).unwrap() >> 32, 0, "tag wraps to 0");
    }

    #[test]
    fn poll_then_complete_then_collect() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut t = OpTable::default();
        let k = t.insert(OpBuf::Pool(3), Tracked(drops.clone()));
        let (count, w) = waker();
        assert!(matches!(t.poll(k, &w), Polled::NeedsWaker));
        assert!(t.set_waker(k, w.clone()).unwrap().is_none());
        assert!(matches!(t.poll(k, &w), Polled::Pending));
        match t.on_cqe(k, 4096) {
            OnCqe::Wake(Some(w)) => w.wake(),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let Polled::Ready(res, op) = t.poll(k, &w) else {
            panic!("completed")
        };
        assert_eq!(res, 4096);
        assert!(matches!(op.buf, OpBuf::Pool(3)));
        assert_eq!(t.len(), 0);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            0,
            "released by the caller, not the table"
        );
        drop(op);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn completion_before_first_poll() {
        let mut t = OpTable::default();
        let k = t.insert(OpBuf::Caller, ());
        assert!(matches!(t.on_cqe(k, -5), OnCqe::Wake(None)));
        let (_, w) = waker();
        assert!(matches!(t.poll(k, &w), Polled::Ready(-5, _)));
    }

    #[test]
    fn drop_in_flight_keeps_resources_until_cqe() {
        let drops = Arc::new(AtomicUsize::new(0));
        let kept = Arc::new(AtomicUsize::new(0));
        let mut t = OpTable::default();
        let k = t.insert(OpBuf::Caller, Tracked(drops.clone()));
        let (_, w) = waker();
        assert!(matches!(t.poll(k, &w), Polled::NeedsWaker));
        assert!(t.set_waker(k, w.clone()).unwrap().is_none());
        // The future is dropped mid-flight and hands over its owned buffer;
        // its waker comes back out, to be dropped outside the lock.
        assert!(matches!(
            t.abandon(k, Some(Box::new(Tracked(kept.clone())))),
            Abandoned::Parked(Some(_))
        ));
        assert_eq!(t.len(), 1, "the slot stays while the kernel owns it");
        assert_eq!(kept.load(Ordering::SeqCst), 0);
        assert_eq!(t.kernel_owned().collect::<Vec<_>>(), vec![k]);
        // The key is not reused while the kernel owns the slot.
        let k2 = t.insert(OpBuf::Pool(0), Tracked(drops.clone()));
        assert_ne!(k, k2);
        match t.on_cqe(k, 10) {
            OnCqe::Release(op, kept_box) => {
                assert_eq!(
                    kept.load(Ordering::SeqCst),
                    0,
                    "the table itself drops nothing: the caller does, outside the lock"
                );
                drop((op, kept_box));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            kept.load(Ordering::SeqCst),
            1,
            "owned buffer freed after CQE"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn drop_after_completion_releases_at_once() {
        let mut t = OpTable::default();
        let k = t.insert(OpBuf::Pool(1), ());
        let _ = t.on_cqe(k, 1);
        let Abandoned::Released(op, None) = t.abandon(k, None) else {
            panic!("completed op is handed back")
        };
        assert!(matches!(op.buf, OpBuf::Pool(1)));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn drop_before_poll_then_cqe() {
        let mut t = OpTable::default();
        let k = t.insert(OpBuf::Pool(0), ());
        assert!(matches!(t.abandon(k, None), Abandoned::Parked(None)));
        assert!(matches!(t.on_cqe(k, 0), OnCqe::Release(_, None)));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn leaking_keeps_buffers_and_parked_values_releases_the_rest() {
        let kept = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(AtomicUsize::new(0));
        let mut t = OpTable::default();
        let k = t.insert(OpBuf::Caller, Tracked(released.clone()));
        let _ = t.abandon(k, Some(Box::new(Tracked(kept.clone()))));
        t.insert(
            OpBuf::Heap(AlignedBuf::new(8, 8)),
            Tracked(released.clone()),
        );
        drop(t.leak_buffers());
        assert_eq!(t.len(), 0);
        assert_eq!(
            released.load(Ordering::SeqCst),
            2,
            "files and permits released"
        );
        assert_eq!(
            kept.load(Ordering::SeqCst),
            0,
            "parked buffer leaked, not dropped"
        );
    }

    #[test]
    fn completion_between_poll_and_set_waker() {
        let mut t = OpTable::default();
        let k = t.insert(OpBuf::Pool(2), ());
        let (_, w) = waker();
        assert!(matches!(t.poll(k, &w), Polled::NeedsWaker));
        // The CQE lands while the waker is being cloned outside the lock.
        assert!(matches!(t.on_cqe(k, 7), OnCqe::Wake(None)));
        let Err((7, op, _w)) = t.set_waker(k, w.clone()) else {
            panic!("the completion must be handed over")
        };
        assert!(matches!(op.buf, OpBuf::Pool(2)));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn unknown_cqe_and_waker_refresh() {
        let mut t: OpTable<()> = OpTable::default();
        assert!(matches!(t.on_cqe(99, 0), OnCqe::Unknown));
        let k = t.insert(OpBuf::Caller, ());
        let (c1, w1) = waker();
        let (c2, w2) = waker();
        assert!(matches!(t.poll(k, &w1), Polled::NeedsWaker));
        assert!(t.set_waker(k, w1.clone()).unwrap().is_none());
        assert!(
            matches!(t.poll(k, &w2), Polled::NeedsWaker),
            "another task's waker must be replaced"
        );
        let old = t.set_waker(k, w2.clone()).unwrap();
        assert!(
            old.is_some_and(|o| o.will_wake(&w1)),
            "the old waker is handed back"
        );
        for w in t.take_wakers() {
            w.wake();
        }
        assert_eq!(c1.0.load(Ordering::SeqCst), 0);
        assert_eq!(c2.0.load(Ordering::SeqCst), 1);
    }
}
