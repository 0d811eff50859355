//! The background [`Driver`] future of a ring and what runs in it: one poll
//! ([`Ring::poll_drive`]: submit, reap, finish, batch, go round or sleep),
//! the driver's one-shot timerfd ([`DriverTimer`]), giving up at
//! `shutdown()`'s deadline ([`Ring::give_up`]), the driver's own drop
//! ([`Ring::driver_dropped`]), and the blocking drive a waiting future runs
//! once no driver exists ([`Ring::drive_blocking`]).
//!
//! SAFETY (the state lock, briefly): the driver has no lock of its own and
//! never holds the state lock across an `io_uring_enter`, a reap or a wake;
//! it takes it only to read a snapshot of the ring's progress or to set a
//! flag (`gave_up`, `driver_gone`) and collect wakers. It reaches what the
//! kernel may touch only through `submit.rs` (the counted enter) and
//! `complete.rs` (the one reaper), whose invariants it relies on and does
//! not change; it has no `unsafe` of its own.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::submit::{EnterPlan, ENTER_GETEVENTS};
use super::{deadline_after, transient, AfterUnlock, Ring, RETRY_AFTER};
use crate::error::Closed;
use crate::sys;
use crate::thread;
use crate::util::lock;

/// Driver rounds per poll before it yields to other tasks.
const ROUNDS: usize = 32;

/// With COOP_TASKRUN the kernel does not interrupt a sleeping thread to run
/// completion work, so the driver re-enters at this period while ops are out.
const COOP_TICK: Duration = Duration::from_micros(200);

/// The background poll future of one ring: submits the queued SQEs, reaps
/// the CQEs, wakes their futures, and sleeps on the ring fd when idle.
pub(crate) struct Driver {
    ring: Arc<Ring>,
    timer: DriverTimer,
    /// Returned `Ready`: every op was back when it stopped.
    finished: bool,
    /// A pending `yield_now`, so the other ready tasks on this worker queue
    /// their SQEs before the enter (else each enter would carry one op).
    batching: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Driver {
    pub(crate) fn new(ring: Arc<Ring>) -> Driver {
        Driver {
            ring,
            timer: DriverTimer::default(),
            finished: false,
            batching: None,
        }
    }

    fn start_batching(&mut self) {
        // `yield_now` returns once this worker ran its ready tasks: bounded.
        self.batching = Some(Box::pin(tokio::task::yield_now()));
    }
}

impl Future for Driver {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        thread::mark_driver_thread();
        // Ops that queue SQEs from now on leave the wake to us (see
        // `notify_driver`); cleared only when this poll ends in a sleep.
        this.ring.polling.store(true, Ordering::SeqCst);
        let mut yielded = false;
        loop {
            if let Some(y) = &mut this.batching {
                if y.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.batching = None;
                yielded = true;
            }
            // Woken by an op's SQE: let the other ready tasks queue theirs
            // before entering.
            if !yielded && this.ring.submit_pending.load(Ordering::Acquire) {
                this.start_batching();
                continue;
            }
            match this.ring.poll_drive(cx, &mut this.timer) {
                Drive::Done => {
                    this.finished = true;
                    return Poll::Ready(());
                }
                Drive::Sleep => {
                    this.ring.polling.store(false, Ordering::SeqCst);
                    // An op that queued an SQE while `polling` was still set
                    // did not wake us: go round instead of sleeping.
                    if this.ring.submit_pending.load(Ordering::SeqCst) {
                        this.ring.polling.store(true, Ordering::SeqCst);
                        continue;
                    }
                    return Poll::Pending;
                }
                Drive::Batch => {
                    yielded = false;
                    this.start_batching();
                }
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Finished, or dropped with its runtime: no future may wait for this
        // driver (or its relay), nor skip waking a driver that is gone.
        self.ring.polling.store(false, Ordering::SeqCst);
        self.ring.relay_flush();
        self.ring.driver_dropped(self.finished);
        if !self.finished && lock(&self.ring.state).live > 0 {
            // Dropped with its runtime while ops are in the kernel. A future
            // still waiting drives the ring itself, but one dropped (now, or
            // as the runtime drops the rest of its tasks) leaves its op
            // parked: nothing else would reap it, and what it keeps may hold
            // the context (a buffer with a handle in it), keeping the ring
            // alive for ever. A thread reaps until the kernel is done.
            let ring = self.ring.clone();
            let _ = std::thread::Builder::new()
                .name("uring-reaper".into())
                .spawn(move || ring.reap_parked());
        }
    }
}

/// What a driver poll ended with.
enum Drive {
    /// Closed and every op is back from the kernel.
    Done,
    /// Nothing to do: woken by the ring fd, an op or the timer.
    Sleep,
    /// Ops are being queued: come back once the ready tasks have run.
    Batch,
}

impl Ring {
    /// Polls the ring fd's readiness: `Ready` when there may be CQEs to
    /// reap (or the reactor failed, which breaks the ring), `Pending` with
    /// the driver's waker registered otherwise.
    fn poll_cq_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.cq_ready.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => {
                // Readiness is edge-triggered: clear it only once the CQ is
                // seen empty (a CQE posted after this check raises a new
                // edge, which `clear_ready` does not erase).
                if self.cq_is_empty() {
                    guard.clear_ready();
                }
                Poll::Ready(())
            }
            Poll::Ready(Err(e)) => {
                self.break_ring(&e);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The body of the background poll future (see [`Driver`]).
    fn poll_drive(&self, cx: &mut Context<'_>, timer: &mut DriverTimer) -> Drive {
        self.driver_waker.register(cx.waker());
        // Whoever the last round's relay has not reached (normally nobody).
        self.relay_flush();
        self.driver_polls.fetch_add(1, Ordering::Relaxed);
        self.idle.store(false, Ordering::SeqCst);
        for _ in 0..ROUNDS {
            self.submit_pending.store(false, Ordering::SeqCst);
            let mut retry_later = false;
            if let Some(plan) = self.plan_enter(false) {
                match self.enter(plan, 0) {
                    Ok(_) => {}
                    // CQ overflow backlog, or no memory for requests right
                    // now: reaping makes room; retry after a pause.
                    Err(e) if transient(&e) => retry_later = true,
                    Err(e) => self.break_ring(&e),
                }
            }
            let reaped = self.reap_relayed();
            let (closed, live, backlog, unconsumed, gave_up, orphaned) = {
                let mut st = lock(&self.state);
                self.account_consumed(&mut st);
                (
                    st.closed.clone(),
                    st.live,
                    st.backlog.len(),
                    st.in_sq.len(),
                    st.gave_up,
                    st.orphaned,
                )
            };
            let broken = matches!(closed, Some(Closed::Broken(_)));
            // Done when every op is back, or when nobody can wait for the
            // rest: the context is gone and its shutdown timeout passed.
            if closed.is_some() && (live == 0 || (gave_up && orphaned)) {
                self.relay_flush();
                self.done.store(true, Ordering::Release);
                self.drained.notify_waiters();
                return Drive::Done;
            }
            if reaped > 1 {
                // Let the woken futures queue their next ops for one enter
                // (not for one CQE: the yield wakes another worker).
                self.submit_pending.store(true, Ordering::SeqCst);
                return Drive::Batch;
            }
            if reaped > 0 {
                continue;
            }
            if self.submit_pending.load(Ordering::SeqCst) && !retry_later {
                // More SQEs are coming in: let them accumulate first.
                return Drive::Batch;
            }
            // Work the next enter can move: a backlog, or (without SQPOLL)
            // SQEs queued since the last enter.
            let stuck = !broken && (backlog > 0 || (unconsumed > 0 && !self.sqpoll));
            if stuck && !retry_later && !self.sqpoll {
                continue;
            }
            // Sleep until a CQE (ring fd), an SQE (driver_waker) or the
            // timer; with SQEs left unsubmitted the timer is armed.
            if self.poll_cq_ready(cx).is_ready() {
                continue;
            }
            let due = if retry_later || (stuck && self.sqpoll) {
                Some(RETRY_AFTER)
            } else if self.coop_taskrun && live > 0 && !broken {
                Some(COOP_TICK)
            } else {
                None
            };
            let deadline = (matches!(closed, Some(Closed::Shutdown)) && !gave_up).then(|| {
                *timer
                    .close_deadline
                    .get_or_insert_with(|| super::deadline_after(self.shutdown_timeout))
            });
            match timer.poll(self, cx, due, deadline) {
                TimerPoll::Fired => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        self.give_up();
                    }
                    if self.coop_taskrun && !broken {
                        // An enter with GETEVENTS runs the deferred completion work.
                        let _ = self.enter(
                            EnterPlan {
                                to_submit: 0,
                                flags: ENTER_GETEVENTS,
                                batch: u32::MAX,
                            },
                            0,
                        );
                    }
                    continue;
                }
                TimerPoll::Failed(e) => {
                    // Without a timer the driver cannot sleep safely with
                    // work left: treat the ring as broken rather than spin.
                    if due.is_some() || deadline.is_some() {
                        self.break_ring(&e);
                        continue;
                    }
                }
                TimerPoll::Pending => {}
            }
            if !stuck && !retry_later && !broken && closed.is_none() && !self.coop_taskrun {
                // The next op to queue an SQE may submit it itself (see
                // `Ring::submit`). Not with COOP_TASKRUN: its completions
                // need the driver's tick, armed only by a driver that knows
                // of the op.
                self.idle.store(true, Ordering::SeqCst);
            }
            return Drive::Sleep;
        }
        // Busy: let the other tasks on this worker run, then continue.
        Drive::Batch
    }

    /// `shutdown()`'s deadline passed with ops still in the kernel: let
    /// `shutdown()` return and fail the borrowed ops (their buffers stay
    /// with the ring). Owned ops keep waiting: their buffer cannot be handed
    /// back while the kernel may write into it.
    fn give_up(&self) {
        let wakers = {
            let mut st = lock(&self.state);
            st.gave_up = true;
            st.ops.take_wakers()
        };
        self.drained.notify_waiters();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The driver task is being dropped (its runtime is shutting down, or it
    /// finished). Ops in the kernel are tainted (their submitting threads
    /// exit, and io_uring may cut them short); ops never submitted fail;
    /// waiting futures are woken to drive the ring themselves.
    fn driver_dropped(&self, finished: bool) {
        let mut out = AfterUnlock::default();
        {
            let mut st = lock(&self.state);
            st.driver_gone = true;
            if st.closed.is_none() {
                st.closed = Some(Closed::RuntimeGone);
            }
            self.fail_unsubmitted(&mut st, false, &mut out);
            if !finished {
                st.ops.taint_in_kernel();
            }
            out.wakers.extend(st.ops.take_wakers());
        }
        self.permits.close();
        self.drained.notify_waiters();
        out.run();
    }

    /// Once the driver is gone with its runtime: reaps until no op is left
    /// in the kernel, or `shutdown_timeout` has passed (then what parked
    /// ops keep stays with the ring, as at any teardown that gives up on
    /// the kernel).
    fn reap_parked(&self) {
        let deadline = deadline_after(self.shutdown_timeout);
        while Instant::now() < deadline && lock(&self.state).live > 0 {
            self.drive_blocking();
        }
    }

    /// Blocking drive once no driver task exists: submit, wait a little, reap.
    pub(super) fn drive_blocking(&self) {
        if let Some(plan) = self.plan_enter(false) {
            let _ = self.enter(plan, 0);
        }
        if self.reap() == 0 {
            if self.coop_taskrun {
                // COOP_TASKRUN's deferred completion work runs only in an enter.
                let _ = self.enter(
                    EnterPlan {
                        to_submit: 0,
                        flags: ENTER_GETEVENTS,
                        batch: u32::MAX,
                    },
                    0,
                );
            }
            sys::wait_readable(self.cq_ready.get_ref(), Duration::from_millis(50));
            self.reap();
        }
    }
}

/// The driver's one-shot timer (a timerfd in the reactor, so the context
/// needs no time driver): armed for the earliest of a back-off / COOP tick
/// and `shutdown()`'s deadline.
#[derive(Debug, Default)]
pub(crate) struct DriverTimer {
    armed_until: Option<Instant>,
    close_deadline: Option<Instant>,
}

enum TimerPoll {
    Fired,
    Pending,
    Failed(io::Error),
}

impl DriverTimer {
    fn poll(
        &mut self,
        ring: &Ring,
        cx: &mut Context<'_>,
        due: Option<Duration>,
        deadline: Option<Instant>,
    ) -> TimerPoll {
        let now = Instant::now();
        let want = match (due.map(|d| now + d), deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(want) = want else {
            return TimerPoll::Pending;
        };
        if want <= now {
            return TimerPoll::Fired;
        }
        // Re-arm only for an earlier expiry (or if not armed).
        if self.armed_until.is_none_or(|t| want < t || t <= now) {
            if let Err(e) = sys::arm_timer(ring.timer.get_ref(), want - now) {
                return TimerPoll::Failed(e);
            }
            self.armed_until = Some(want);
        }
        match ring.timer.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => {
                let _ = sys::drain_counter(ring.timer.get_ref());
                guard.clear_ready();
                self.armed_until = None;
                TimerPoll::Fired
            }
            Poll::Ready(Err(e)) => TimerPoll::Failed(e),
            Poll::Pending => TimerPoll::Pending,
        }
    }
}
