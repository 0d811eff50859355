//! A flight: one read of some blocks that every caller missing them waits
//! for ([`Waiting`]), driven by whichever of them polls, going on while one
//! of them is left, dropped with the last.
//!
//! The future is polled by one waiter at a time, outside the flight's lock,
//! with a waker that wakes every waiter (the flight itself): any of them may
//! be the next to poll, so none is left waiting on one that gave up. A wake
//! that comes while a waiter polls is held for that waiter: if its poll
//! ends `Pending` it wakes itself (the future asked to be polled again);
//! if its poll ends the flight it takes the outcome at once, and only the
//! others are woken. Tokio takes a task woken during its own poll for one
//! that yields: it queues it again and wakes an idle worker to share the
//! queue, a wasted poll and a worker's wake-up for a read already answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};

use futures::task::ArcWake;
use slab::Slab;

use super::Outcome;
use crate::util::lock;

/// What a flight's future gives: each block's outcome, in its order.
pub(super) type Outcomes = Arc<[Outcome]>;

type FlightFuture = Pin<Box<dyn Future<Output = Outcomes> + Send>>;

/// A read of some blocks that every caller missing them waits for.
pub(super) struct Flight {
    state: Mutex<FlightState>,
}

struct FlightState {
    /// The read: `None` while a waiter polls it, once it has ended, or
    /// once every waiter has gone.
    future: Option<FlightFuture>,
    /// A waiter polls the future now (outside this lock).
    polling: bool,
    /// The future's waker was woken during that poll.
    woken: bool,
    /// Once the read has ended, while a waiter is left.
    outcomes: Option<Outcomes>,
    /// Each waiter's waker, while it waits (`None` once woken).
    waiters: Slab<Option<Waker>>,
}

impl Flight {
    /// A flight that runs `future` once a waiter polls it.
    pub(super) fn new(future: impl Future<Output = Outcomes> + Send + 'static) -> Arc<Flight> {
        Arc::new(Flight {
            state: Mutex::new(FlightState {
                future: Some(Box::pin(future)),
                polling: false,
                woken: false,
                outcomes: None,
                waiters: Slab::new(),
            }),
        })
    }
}

impl Flight {
    /// The weak handle the `flights` map keeps.
    pub(super) fn weak(this: &Arc<Flight>) -> WeakFlight {
        WeakFlight(Arc::downgrade(this))
    }
}

impl FlightState {
    /// Whether a waiter is left: the read goes on, or has ended and its
    /// outcomes are kept for the waiters.
    fn alive(&self) -> bool {
        self.future.is_some() || self.outcomes.is_some() || self.polling
    }
}

/// Wakes every waiter (none while one polls: that one is told instead).
impl ArcWake for Flight {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        let mut s = lock(&arc_self.state);
        if s.polling {
            s.woken = true;
            return;
        }
        wake_all(s, None);
    }
}

/// Wakes every waiting waiter but `except`, outside the lock (a waker may
/// do anything, such as dropping a waiter of this flight).
fn wake_all(mut s: std::sync::MutexGuard<'_, FlightState>, except: Option<usize>) {
    let mut one = None;
    let mut more = Vec::new();
    for (key, w) in &mut s.waiters {
        if Some(key) == except {
            continue;
        }
        if let Some(w) = w.take() {
            if one.is_none() {
                one = Some(w);
            } else {
                more.push(w);
            }
        }
    }
    drop(s);
    one.into_iter().chain(more).for_each(Waker::wake);
}

/// A weak handle on a flight (the `flights` map's): it does not keep the
/// read going.
#[derive(Clone)]
pub(super) struct WeakFlight(Weak<Flight>);

impl WeakFlight {
    /// Whether the read goes on (a waiter is left).
    pub(super) fn alive(&self) -> bool {
        self.0.upgrade().is_some_and(|f| lock(&f.state).alive())
    }

    /// A new waiter for block `slot` of the flight, unless every waiter has
    /// gone (the read was dropped).
    pub(super) fn join(&self, slot: usize) -> Option<Waiting> {
        Waiting::join(&self.0.upgrade()?, slot)
    }
}

/// One caller's wait for block `slot` of a flight. Dropped before the
/// flight ends, it wakes the other waiters, so that one of them polls the
/// flight next (it may have been woken for them); the last one dropped
/// drops the read.
pub(super) struct Waiting {
    flight: Arc<Flight>,
    slot: usize,
    key: usize,
    done: bool,
}

impl Waiting {
    /// The first waiter of a new flight.
    pub(super) fn first(flight: &Arc<Flight>, slot: usize) -> Waiting {
        Waiting::join(flight, slot).expect("a new flight has its future")
    }

    /// A new waiter, unless every waiter has gone.
    fn join(flight: &Arc<Flight>, slot: usize) -> Option<Waiting> {
        // Checked and joined under one lock: the last waiter's drop takes
        // the future under it.
        let mut s = lock(&flight.state);
        if !s.alive() {
            return None;
        }
        let key = s.waiters.insert(None);
        drop(s);
        Some(Waiting {
            flight: flight.clone(),
            slot,
            key,
            done: false,
        })
    }

    /// The weak handle the `flights` map keeps.
    #[cfg(test)]
    fn weak(&self) -> WeakFlight {
        Flight::weak(&self.flight)
    }

    /// The block this waiter waits for: its index in the outcomes.
    pub(super) fn slot(&self) -> usize {
        self.slot
    }

    /// The flight's outcomes once it has ended, polling its future if no
    /// other waiter is.
    pub(super) fn poll_flight(&mut self, cx: &mut Context<'_>) -> Poll<Outcomes> {
        let flight = &self.flight;
        let mut s = lock(&flight.state);
        if let Some(out) = &s.outcomes {
            let out = out.clone();
            drop(s);
            self.done = true;
            return Poll::Ready(out);
        }
        if s.polling {
            // The waiter polling will wake this one if it ends the flight,
            // and the future's waker wakes it otherwise.
            s.waiters[self.key] = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let Some(mut future) = s.future.take() else {
            unreachable!("a flight with a waiter, not polled and not ended, has its future");
        };
        s.polling = true;
        s.woken = false;
        // Registered before the poll: a wake from the future during it is
        // held (`woken`), and one after it reaches this waiter.
        s.waiters[self.key] = Some(cx.waker().clone());
        drop(s);
        let waker = futures::task::waker_ref(flight);
        let res = future.as_mut().poll(&mut Context::from_waker(&waker));
        let mut s = lock(&flight.state);
        s.polling = false;
        match res {
            Poll::Ready(out) => {
                s.outcomes = Some(out.clone());
                s.waiters[self.key] = None;
                wake_all(s, Some(self.key));
                self.done = true;
                // Dropped after the lock: it holds the cache's state.
                drop(future);
                Poll::Ready(out)
            }
            Poll::Pending => {
                s.future = Some(future);
                if std::mem::take(&mut s.woken) {
                    // The future asked to be polled again during this poll:
                    // this waiter does it (the others were not woken).
                    s.waiters[self.key] = None;
                    drop(s);
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut s = lock(&self.flight.state);
        s.waiters.remove(self.key);
        if self.done || s.outcomes.is_some() {
            // The last waiter of an ended flight: the blocks' pins go now,
            // not with the flight (a waker the ring still holds keeps it).
            let outcomes = if s.waiters.is_empty() {
                s.outcomes.take()
            } else {
                None
            };
            drop(s);
            drop(outcomes);
            return;
        }
        if s.waiters.is_empty() {
            // The last waiter: the read goes (its buffers parked in the
            // context until the kernel is done), outside the lock.
            let future = s.future.take();
            drop(s);
            drop(future);
            return;
        }
        // This waiter may have been the one woken to poll the future: pass
        // the wake on.
        wake_all(s, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::{count_waker, CountWaker};
    use std::sync::atomic::Ordering;

    fn empty() -> Outcomes {
        Arc::from(Vec::<Outcome>::new())
    }

    fn poll(w: &mut Waiting, waker: &Waker) -> Poll<Outcomes> {
        w.poll_flight(&mut Context::from_waker(waker))
    }

    fn wakes(count: &CountWaker) -> usize {
        count.0.load(Ordering::SeqCst)
    }

    /// Two callers wait for one flight. While A polls the flight's future,
    /// the read completes (every waiter is woken) and B, woken, polls too:
    /// it finds the future being polled and waits again, while A's poll
    /// ends `Pending` (it looked before the read was done). A then gives
    /// up instead of polling again: B must be woken, or nobody polls the
    /// flight again.
    #[test]
    fn a_waiter_given_up_after_a_wake_passes_it_on() {
        let b_cell: Arc<Mutex<Option<Waiting>>> = Arc::default();
        let ((b_count, b_waker), (a_count, a_waker)) = (count_waker(), count_waker());
        let mut polls = 0;
        let (inner_b, inner_b_waker) = (b_cell.clone(), b_waker.clone());
        let flight = Flight::new(std::future::poll_fn(move |cx| {
            polls += 1;
            match polls {
                1 => Poll::Pending,
                2 => {
                    // The read completes: the kernel's wake.
                    cx.waker().wake_by_ref();
                    // B, woken, polls meanwhile (on another thread).
                    let mut b = lock(&inner_b).take().expect("B");
                    assert!(poll(&mut b, &inner_b_waker).is_pending());
                    *lock(&inner_b) = Some(b);
                    Poll::Pending
                }
                _ => Poll::Ready(empty()),
            }
        }));
        let mut a = Waiting::first(&flight, 0);
        let mut b = Waiting::first(&flight, 0);
        assert!(poll(&mut b, &b_waker).is_pending(), "B starts the read");
        *lock(&b_cell) = Some(b);
        assert!(
            poll(&mut a, &a_waker).is_pending(),
            "A polls as it completes"
        );
        assert_eq!(wakes(&a_count), 1, "A asked to poll again");
        let woken = wakes(&b_count);
        drop(a);
        assert!(wakes(&b_count) > woken, "B woken when A gives up");
        let mut b = lock(&b_cell).take().expect("B");
        assert!(poll(&mut b, &b_waker).is_ready());
    }

    /// A flight that ends inside a waiter's poll answers that waiter without
    /// waking it, and wakes the others; a wake during a poll that ends
    /// `Pending` is passed on; one between polls goes straight through.
    #[test]
    fn a_waiter_answered_in_its_own_poll_is_not_woken() {
        let mut polls = 0;
        let flight = Flight::new(std::future::poll_fn(move |cx| {
            polls += 1;
            // The read's completion, seen during the poll.
            cx.waker().wake_by_ref();
            if polls < 3 {
                Poll::Pending
            } else {
                Poll::Ready(empty())
            }
        }));
        let mut w = Waiting::first(&flight, 0);
        let mut other = Waiting::first(&flight, 0);
        let (count, waker) = count_waker();
        let (other_count, other_waker) = count_waker();
        assert!(poll(&mut other, &other_waker).is_pending());
        assert_eq!(wakes(&other_count), 1, "its own wake, passed on");
        assert!(poll(&mut w, &waker).is_pending());
        assert_eq!(wakes(&count), 1, "woken while Pending");
        futures::task::waker_ref(&flight).wake_by_ref();
        assert_eq!(wakes(&count), 1, "already woken: not registered");
        assert!(poll(&mut other, &other_waker).is_ready());
        assert_eq!(wakes(&count), 1, "not waiting since its last wake");
        assert!(poll(&mut w, &waker).is_ready());
        assert_eq!(wakes(&count), 1, "answered at its poll");
    }

    /// The last waiter dropped drops the read, and nobody can join it
    /// after; a flight that ended can be joined while a waiter is left,
    /// and its outcomes (the blocks' pins) go with the last one.
    #[test]
    fn the_last_waiter_drops_the_read() {
        struct Dropped(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let guard = Dropped(gone.clone());
        let flight = Flight::new(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            empty()
        });
        let mut a = Waiting::first(&flight, 0);
        let b = Waiting::first(&flight, 0);
        let weak = a.weak();
        let (_, waker) = count_waker();
        assert!(poll(&mut a, &waker).is_pending());
        drop(a);
        assert!(!gone.load(Ordering::SeqCst), "B still waits");
        drop(b);
        assert!(gone.load(Ordering::SeqCst), "dropped with the last waiter");
        assert!(weak.join(0).is_none());
        drop(flight);
        let ended = Flight::new(async { empty() });
        let mut c = Waiting::first(&ended, 0);
        let out = match poll(&mut c, &waker) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("ended at its first poll"),
        };
        let d = c.weak().join(0).expect("an ended flight with a waiter");
        drop((c, d));
        // `ended` stands for a waker of the flight the ring still holds.
        assert_eq!(
            Arc::strong_count(&out),
            1,
            "the outcomes went with the last waiter"
        );
        assert!(Flight::weak(&ended).join(0).is_none());
    }
}
