//! In-flight slots, and each file's share of them.
//!
//! Every op that goes to a ring or to the blocking pool holds a [`Permit`]
//! until it is over (its CQE, or its blocking task's return), even when its
//! future was dropped long before. A permit is one slot of the ring's (or
//! the pool's) in-flight limit and, when the file has one, one unit of the
//! file's *share* of it (`Builder::max_in_flight_per_file`), so ops stuck on
//! one file leave the other slots to other files.
//!
//! The share is taken before the slot, so an op waiting for its file's share
//! holds no slot. Closing a [`Slots`] wakes such waiters through a `Notify`
//! (the share's holders may be ops the kernel never returns).

use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;

use futures::future::{select, Either};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The in-flight slots of one ring or of the blocking pool.
#[derive(Debug)]
pub(crate) struct Slots {
    sem: Arc<Semaphore>,
    /// Notified (to every waiter) when `sem` closes.
    closed: Arc<Notify>,
}

/// A slot, and the file's share of the slots when it has one; released
/// when dropped (when the op it belongs to is over).
pub(crate) struct Permit {
    _slot: OwnedSemaphorePermit,
    _share: Option<OwnedSemaphorePermit>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permit")
    }
}

/// The slots were closed (shutdown, broken ring, runtime gone).
#[derive(Debug)]
pub(crate) struct SlotsClosed;

/// A permit still to come.
pub(crate) type Wait = Pin<Box<dyn Future<Output = Result<Permit, SlotsClosed>> + Send>>;

/// What [`Slots::acquire`] found.
pub(crate) enum Acquired {
    Now(Permit),
    Wait(Wait),
    Closed,
}

impl Slots {
    pub(crate) fn new(n: usize) -> Slots {
        Slots {
            sem: Arc::new(Semaphore::new(n)),
            closed: Arc::new(Notify::new()),
        }
    }

    /// Takes no new permits from now on; wakes every waiter, including
    /// those waiting for a file's share.
    pub(crate) fn close(&self) {
        self.sem.close();
        self.closed.notify_waiters();
    }

    /// A slot and a unit of `share` (the file's share of these slots), at
    /// once if both are free.
    pub(crate) fn acquire(&self, share: Option<&Arc<Semaphore>>) -> Acquired {
        let held = match share.map(|s| s.clone().try_acquire_owned()) {
            None => None,
            Some(Ok(p)) => Some(p),
            Some(Err(TryAcquireError::NoPermits)) => {
                return Acquired::Wait(self.wait(share.cloned(), None));
            }
            // Shares are never closed; the slots are.
            Some(Err(TryAcquireError::Closed)) => return Acquired::Closed,
        };
        match self.sem.clone().try_acquire_owned() {
            Ok(slot) => Acquired::Now(Permit {
                _slot: slot,
                _share: held,
            }),
            Err(TryAcquireError::NoPermits) => Acquired::Wait(self.wait(None, held)),
            Err(TryAcquireError::Closed) => Acquired::Closed,
        }
    }

    /// Waits for the share (unless `held`), then for a slot.
    fn wait(&self, share: Option<Arc<Semaphore>>, held: Option<OwnedSemaphorePermit>) -> Wait {
        let (sem, closed) = (self.sem.clone(), self.closed.clone());
        Box::pin(async move {
            let share = match (held, share) {
                (Some(p), _) => Some(p),
                (None, None) => None,
                (None, Some(share)) => {
                    // Registered before the check, so a close between the
                    // check and the wait still wakes it.
                    let notified = pin!(closed.notified());
                    if sem.is_closed() {
                        return Err(SlotsClosed);
                    }
                    match select(pin!(share.acquire_owned()), notified).await {
                        Either::Left((Ok(p), _)) => Some(p),
                        Either::Left((Err(_), _)) | Either::Right(_) => return Err(SlotsClosed),
                    }
                }
            };
            let slot = sem.acquire_owned().await.map_err(|_| SlotsClosed)?;
            Ok(Permit {
                _slot: slot,
                _share: share,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll};

    fn poll(w: &mut Wait) -> Poll<Result<Permit, SlotsClosed>> {
        w.as_mut()
            .poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
    }

    #[test]
    fn a_share_leaves_slots_for_others() {
        let slots = Slots::new(4);
        let share = Arc::new(Semaphore::new(3));
        let held: Vec<_> = (0..3)
            .map(|_| match slots.acquire(Some(&share)) {
                Acquired::Now(p) => p,
                _ => panic!("a slot and a share were free"),
            })
            .collect();
        // The file's share is spent: its next read waits, holding no slot...
        let Acquired::Wait(mut w) = slots.acquire(Some(&share)) else {
            panic!("the share is spent");
        };
        assert!(poll(&mut w).is_pending());
        // ...so another file still gets the last slot.
        let Acquired::Now(other) = slots.acquire(None) else {
            panic!("a slot was free for another file");
        };
        // All four slots are out; one of the file's reads finishing gives
        // the waiter both a share and a slot.
        let mut held = held;
        held.pop();
        assert!(matches!(poll(&mut w), Poll::Ready(Ok(_))));
        drop(other);
    }

    #[test]
    fn closing_wakes_a_read_waiting_for_its_share() {
        let slots = Slots::new(4);
        let share = Arc::new(Semaphore::new(1));
        let Acquired::Now(_stuck) = slots.acquire(Some(&share)) else {
            panic!("free");
        };
        let Acquired::Wait(mut w) = slots.acquire(Some(&share)) else {
            panic!("the share is spent");
        };
        assert!(poll(&mut w).is_pending());
        slots.close();
        assert!(matches!(poll(&mut w), Poll::Ready(Err(SlotsClosed))));
        assert!(matches!(slots.acquire(None), Acquired::Closed));
        // A waiter created after the close learns it at once.
        let Acquired::Wait(mut late) = slots.acquire(Some(&share)) else {
            panic!("the share is spent");
        };
        assert!(matches!(poll(&mut late), Poll::Ready(Err(SlotsClosed))));
    }
}
