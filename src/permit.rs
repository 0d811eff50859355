//! In-flight slots and the scheduler that hands them out.
//!
//! Every op that goes to a ring or to the blocking pool holds a [`Permit`]
//! until it is over (its CQE, or its blocking task's return), even when its
//! future was dropped long before. A permit is one of the ring's (or the
//! pool's) in-flight slots. [`Slots`] decides who gets a free slot, by two
//! rules (DESIGN, "Scheduling"):
//!
//! - **Priority classes.** An op is [`Priority::Latency`] or
//!   [`Priority::Background`]. While latency ops are active on these slots
//!   (in flight, waiting, or one finished within [`LATENCY_WINDOW_NS`]),
//!   background ops hold at most `background_share` slots, each for a
//!   piece of at most `background_piece` bytes ([`Permit::piece_limit`]);
//!   that many slots are also theirs even under a flood of latency ops, so
//!   neither class starves. Otherwise background ops use every slot.
//! - **Work-conserving file shares.** A file's ops may hold more than the
//!   file's share (`Builder::max_in_flight_per_file`) while no op of
//!   another file waits for these slots, except the last `reserve` slots,
//!   which stay for files under their share (ops that storage never
//!   answers may hold a slot for ever: no preemption). When another file's
//!   op waits, a file at or over its share gets no new slot until it is
//!   back under it.
//!
//! Waiters queue per class in arrival order; every release hands the freed
//! slot to the first waiter the rules admit, latency first (background
//! first while it is under its share). State sits under one mutex per
//! [`Slots`], taken once to acquire and once to release.

use std::cell::Cell;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;
use tokio::runtime::Handle;

/// Blocking work, built before it has a slot, run with the slot it is
/// granted (see `blocking`): it may wait in the queue in its op's place.
pub(crate) type Job = Box<dyn FnOnce(Permit) + Send>;

/// What starts a job granted a slot by a release on this thread (see
/// `blocking::hand_off`), given the runtime the slots were made on.
pub(crate) type StartJob = fn(Job, Permit, Option<&Handle>);

/// How urgent an op is, for the in-flight slots it competes for.
///
/// Point reads and the write path default to [`Latency`](Self::Latency);
/// scans to [`Background`](Self::Background). Set it for every op of a
/// handle with [`UringContext::with_priority`](crate::UringContext::with_priority)
/// (or [`UringFile::with_priority`](crate::UringFile::with_priority)), and
/// for a scan with [`ScanOptions::priority`](crate::ScanOptions::priority).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Priority {
    /// Someone waits for it: a lookup, a commit. Takes a free slot first.
    #[default]
    Latency,
    /// Only needs to finish eventually: compaction, scans, backups, bulk
    /// loads. Uses every free slot while no latency op is active; while one
    /// is, holds at most `Builder::background_share` slots of each ring
    /// (and of the blocking pool), which it keeps even under a flood of
    /// latency ops. Also asks the kernel for the lowest best-effort I/O
    /// priority (level 7), which a device with the `bfq` scheduler honours
    /// (see [`UringContext::ioprio_honoured`](crate::UringContext::ioprio_honoured)).
    Background,
}

impl Priority {
    pub(crate) fn index(self) -> usize {
        match self {
            Priority::Latency => 0,
            Priority::Background => 1,
        }
    }

    /// The SQE's `ioprio` (and `ioprio_set(2)`'s value) for this class: 0
    /// (the thread's own) for latency ops; best effort, lowest level, for
    /// background ops.
    pub(crate) fn ioprio(self) -> u16 {
        const IOPRIO_CLASS_BE: u16 = 2;
        const IOPRIO_CLASS_SHIFT: u16 = 13;
        match self {
            Priority::Latency => 0,
            Priority::Background => (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | 7,
        }
    }
}

/// How long after a latency op finished background ops stay limited to
/// their share: lookups at a steady rate keep the limit on between them, so
/// that each finds the device's queue short, not only those that arrive
/// while another is in flight.
const LATENCY_WINDOW_NS: u64 = 10_000_000;

fn window_ns() -> u64 {
    LATENCY_WINDOW_NS
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: read at every latency op's
/// release, where a tick's precision (1–4 ms) is enough for the window and
/// a fine clock would be most of the release's cost.
fn coarse_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// A file's key in the scheduler: its index and generation, unique within
/// the context.
pub(crate) type FileKey = u64;

/// The scheduler's settings for one set of slots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotsConfig {
    /// The slots.
    pub(crate) limit: usize,
    /// A file's share: what its ops may hold while another file's op waits.
    pub(crate) share: usize,
    /// Slots background ops may hold while latency ops are active, and keep
    /// under a flood of them (at least 1).
    pub(crate) background_share: usize,
    /// The largest piece a background read or write moves while latency
    /// ops are active.
    pub(crate) background_piece: usize,
}

impl SlotsConfig {
    /// The slots a file over its share leaves free: the last `limit / 32`
    /// (at least 1 when the share binds at all).
    fn reserve(&self) -> usize {
        if self.share >= self.limit {
            0
        } else {
            (self.limit / 32).clamp(1, self.limit - self.share)
        }
    }
}

/// Counters of one priority class on one set of slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClassCounts {
    /// Slots granted.
    pub(crate) ops: u64,
    /// Bytes the ops that took slots moved or asked to move (counted as
    /// each piece starts, see [`Slots::count_bytes`]).
    pub(crate) bytes: u64,
    /// Ops that had to wait for their slot, and the time they waited.
    pub(crate) waited: u64,
    pub(crate) wait_ns: u64,
    /// Slots held now.
    pub(crate) in_flight: u64,
}

/// A hasher for [`FileKey`]s (already unique integers).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// What the slots know of one file with ops holding or waiting for them.
#[derive(Debug, Default, Clone, Copy)]
struct FileCounts {
    held: usize,
    waiting: [usize; 2],
}

#[derive(Debug)]
enum WaiterState {
    Waiting(Option<Waker>),
    Granted,
    /// Its job was granted a slot and handed to a thread to run.
    Handed,
    Closed,
}

struct Waiter {
    class: Priority,
    file: Option<FileKey>,
    since: Instant,
    state: WaiterState,
    /// Granted while latency ops were active: its pieces are capped.
    capped: bool,
    /// The blocking work it waits to run, built already: granted a slot,
    /// it is handed to a thread at once, with no wake of its task (see
    /// `blocking::hand_off`).
    job: Option<Job>,
    /// The bytes its job moves, counted when it is granted a slot.
    job_bytes: u64,
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("class", &self.class)
            .field("file", &self.file)
            .field("since", &self.since)
            .field("state", &self.state)
            .field("capped", &self.capped)
            .field("job", &self.job.is_some())
            .field("job_bytes", &self.job_bytes)
            .finish()
    }
}

#[derive(Debug)]
struct State {
    cfg: SlotsConfig,
    free: usize,
    closed: bool,
    in_flight: [usize; 2],
    /// Waiters per class, in arrival order (keys into `waiters`).
    queues: [VecDeque<usize>; 2],
    waiters: Slab<Waiter>,
    files: HashMap<FileKey, FileCounts, BuildHasherDefault<KeyHasher>>,
    /// When the last latency op let go of its slot ([`coarse_now`]).
    latency_done: Option<u64>,
    /// A thread sleeps out the latency window (see `Shared::runtime`).
    window_timer: bool,
    counts: [ClassCounts; 2],
}

/// Wakers to call, and granted jobs to start, once the lock is released.
struct Wakes {
    first: [Option<Waker>; 4],
    more: Vec<Waker>,
    jobs: Vec<(Job, Priority, Option<FileKey>, u64)>,
}

impl Wakes {
    fn new() -> Wakes {
        Wakes {
            first: [None, None, None, None],
            more: Vec::new(),
            jobs: Vec::new(),
        }
    }
    fn push(&mut self, w: Waker) {
        match self.first.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(w),
            None => self.more.push(w),
        }
    }
    fn wake(self, shared: &Arc<Shared>) {
        self.first.into_iter().flatten().for_each(Waker::wake);
        self.more.into_iter().for_each(Waker::wake);
        for (job, class, file, bytes) in self.jobs {
            shared.bytes[class.index()].fetch_add(bytes, Ordering::Relaxed);
            let permit = Permit {
                shared: shared.clone(),
                class,
                file,
                piece_limit: usize::MAX,
            };
            match shared.start_job {
                Some(start) => start(job, permit, shared.runtime.as_ref()),
                // Only slots that start jobs take them (`acquire_job`).
                None => drop((job, permit)),
            }
        }
    }
}

impl State {
    fn file(&mut self, key: FileKey) -> &mut FileCounts {
        self.files.entry(key).or_default()
    }

    fn forget_if_idle(&mut self, key: FileKey) {
        if let Some(c) = self.files.get(&key) {
            if c.held == 0 && c.waiting == [0, 0] {
                self.files.remove(&key);
            }
        }
    }

    /// A slot of `key`'s ops is free again (one hash of the key).
    fn release_file(&mut self, key: FileKey) {
        if let Entry::Occupied(mut e) = self.files.entry(key) {
            let c = e.get_mut();
            c.held -= 1;
            if c.held == 0 && c.waiting == [0, 0] {
                e.remove();
            }
        }
    }

    fn latency_active(&self, now: &mut Option<u64>) -> bool {
        if self.in_flight[0] > 0 || !self.queues[0].is_empty() {
            return true;
        }
        self.latency_done.is_some_and(|done| {
            now.get_or_insert_with(coarse_now).saturating_sub(done) < window_ns()
        })
    }

    /// Whether an op of `class` on `file` may take a free slot now (there
    /// is one).
    fn admits(&self, class: Priority, file: Option<FileKey>, now: &mut Option<u64>) -> bool {
        debug_assert!(self.free > 0);
        let cfg = &self.cfg;
        if class == Priority::Background
            && self.in_flight[1] >= cfg.background_share
            && self.latency_active(now)
        {
            return false;
        }
        let Some(key) = file else {
            return true;
        };
        let mine = self.files.get(&key).copied().unwrap_or_default();
        if mine.held < cfg.share {
            return true;
        }
        // Over its share: not the reserved slots, and only while no other
        // file's op of this class (or a more urgent one) waits.
        if self.free <= cfg.reserve() {
            return false;
        }
        let classes = class.index() + 1;
        (0..classes).all(|c| self.queues[c].len() == mine.waiting[c])
    }

    /// When background waiters held back only by the latency window may
    /// go: `Some` if one waits, background holds its share, and no latency
    /// op is in flight or waiting, so that no release may come to let them
    /// go once the window is over.
    fn window_deadline(&self) -> Option<u64> {
        if self.queues[1].is_empty()
            || self.closed
            || self.free == 0
            || self.in_flight[0] > 0
            || !self.queues[0].is_empty()
            || self.in_flight[1] < self.cfg.background_share
        {
            return None;
        }
        self.latency_done.map(|done| done + window_ns())
    }

    /// Accounts a slot to an op of `class` on `file`; whether its pieces
    /// are capped (a background op while latency ops are active).
    fn take(&mut self, class: Priority, file: Option<FileKey>, now: &mut Option<u64>) -> bool {
        let capped = class == Priority::Background && self.latency_active(now);
        self.free -= 1;
        self.in_flight[class.index()] += 1;
        self.counts[class.index()].ops += 1;
        if let Some(key) = file {
            self.file(key).held += 1;
        }
        capped
    }

    /// Hands free slots to the waiters the rules admit.
    fn dispatch(&mut self, wakes: &mut Wakes) {
        let mut now = None;
        let background_share = self.cfg.background_share;
        while self.free > 0 {
            // Background first while under its share (so it never starves),
            // then latency, then background beyond its share.
            let order: [usize; 2] = if self.in_flight[1] < background_share {
                [1, 0]
            } else {
                [0, 1]
            };
            let found = order.into_iter().find_map(|c| {
                self.queues[c]
                    .iter()
                    .position(|&k| {
                        let w = &self.waiters[k];
                        self.admits(w.class, w.file, &mut now)
                    })
                    .map(|i| (c, i))
            });
            let Some((c, i)) = found else { break };
            let key = self.queues[c].remove(i).expect("position in range");
            let w = &mut self.waiters[key];
            let (class, file, since) = (w.class, w.file, w.since);
            if let Some(job) = w.job.take() {
                w.state = WaiterState::Handed;
                wakes.jobs.push((job, class, file, w.job_bytes));
            } else if let WaiterState::Waiting(Some(waker)) =
                std::mem::replace(&mut w.state, WaiterState::Granted)
            {
                wakes.push(waker);
            }
            if let Some(f) = file {
                self.file(f).waiting[c] -= 1;
            }
            let capped = self.take(class, file, &mut now);
            self.waiters[key].capped = capped;
            let waited = since.elapsed();
            let counts = &mut self.counts[c];
            counts.waited += 1;
            counts.wait_ns += u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        }
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Bytes per class (see [`Slots::count_bytes`]).
    bytes: [AtomicU64; 2],
    /// Where a thread sleeps out the latency window for background ops
    /// that wait only for it (see [`State::window_deadline`]): the runtime
    /// the slots were made on.
    runtime: Option<Handle>,
    /// What starts the jobs its releases grant slots (`None`: slots that
    /// take no jobs).
    start_job: Option<StartJob>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        crate::util::lock(&self.state)
    }

    /// After a change under `st`: if background ops wait only for the
    /// latency window to end, a thread of the blocking pool sleeps until it
    /// does and hands them slots then (nothing else might: their ops in
    /// flight may never finish). At most one such thread per set of slots.
    fn arm_window(self: &Arc<Self>, st: &mut State) {
        if st.window_timer {
            return;
        }
        let (Some(deadline), Some(rt)) = (st.window_deadline(), &self.runtime) else {
            return;
        };
        st.window_timer = true;
        let shared = self.clone();
        drop(rt.spawn_blocking(move || {
            // The coarse clock lags by up to a tick: never sleep less than
            // a millisecond, so a late clock costs a second short sleep,
            // not a spin.
            let left = deadline.saturating_sub(coarse_now());
            std::thread::sleep(Duration::from_nanos(left).max(Duration::from_millis(1)));
            let mut wakes = Wakes::new();
            {
                let mut st = shared.lock();
                st.window_timer = false;
                if !st.closed {
                    st.dispatch(&mut wakes);
                    shared.arm_window(&mut st);
                }
            }
            wakes.wake(&shared);
        }));
    }
}

/// The in-flight slots of one ring or of the blocking pool.
pub(crate) struct Slots {
    shared: Arc<Shared>,
}

/// What the slots are doing now (free, held and waited for per class);
/// `<busy>` when another thread holds their lock.
impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Slots");
        match self.shared.state.try_lock() {
            Ok(st) => d
                .field("limit", &st.cfg.limit)
                .field("free", &st.free)
                .field("held", &st.in_flight)
                .field("waiting", &[st.queues[0].len(), st.queues[1].len()])
                .field("closed", &st.closed),
            Err(_) => d.field("state", &format_args!("<busy>")),
        };
        d.finish_non_exhaustive()
    }
}

/// A slot; released when dropped (when the op it belongs to is over).
pub(crate) struct Permit {
    shared: Arc<Shared>,
    class: Priority,
    file: Option<FileKey>,
    /// The cap on the op's next piece (`usize::MAX`: none).
    piece_limit: usize,
}

impl Permit {
    /// The class of the op holding it.
    pub(crate) fn priority(&self) -> Priority {
        self.class
    }

    /// The most bytes the op's piece may move with this slot: capped for
    /// a background op granted while latency ops were active.
    pub(crate) fn piece_limit(&self) -> usize {
        self.piece_limit
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Permit({:?})", self.class)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut wakes = Wakes::new();
        {
            let mut st = self.shared.lock();
            st.free += 1;
            st.in_flight[self.class.index()] -= 1;
            if self.class == Priority::Latency {
                st.latency_done = Some(coarse_now());
            }
            if let Some(key) = self.file {
                st.release_file(key);
            }
            if !st.closed {
                st.dispatch(&mut wakes);
                self.shared.arm_window(&mut st);
            }
        }
        wakes.wake(&self.shared);
    }
}

/// The slots were closed (shutdown, broken ring, runtime gone).
#[derive(Debug)]
pub(crate) struct SlotsClosed;

/// A permit still to come: poll it with [`Wait::poll_wait`]. Dropped before
/// it resolves, it gives back a slot it was granted meanwhile.
pub(crate) struct Wait {
    shared: Arc<Shared>,
    /// The waiter's key in `State::waiters`; [`DONE`] once resolved.
    key: usize,
    /// Not `Sync`: the op futures holding it are not (their auto traits
    /// are part of the API).
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Wait")
    }
}

/// What [`Slots::take_or_queue`] did (the job, if any, comes back unless
/// it was queued).
enum Taken {
    Now(Permit, Option<(Job, u64)>),
    Queued(Wait),
    Closed(Option<(Job, u64)>),
}

/// `Wait::key` of a wait that resolved.
const DONE: usize = usize::MAX;

/// What [`Slots::acquire`] found.
pub(crate) enum Acquired {
    Now(Permit),
    Wait(Wait),
    Closed,
}

/// What [`Slots::acquire_job`] found.
pub(crate) enum JobAcquired {
    /// A slot at once: run the job with it.
    Now(Job, Permit),
    /// The job waits in the queue and runs when it is granted a slot; the
    /// `Wait` takes it back out if dropped first.
    Queued(Wait),
    Closed(Job),
}

impl Slots {
    pub(crate) fn new(cfg: SlotsConfig) -> Slots {
        Slots::on(cfg, Handle::try_current().ok(), None)
    }

    /// Slots whose latency-window timer runs on `runtime`'s blocking
    /// threads, and that take jobs ([`Slots::acquire_job`]) started by
    /// `start_job` once granted.
    pub(crate) fn on(
        cfg: SlotsConfig,
        runtime: Option<Handle>,
        start_job: Option<StartJob>,
    ) -> Slots {
        Slots {
            shared: Arc::new(Shared {
                bytes: [AtomicU64::new(0), AtomicU64::new(0)],
                runtime,
                start_job,
                state: Mutex::new(State {
                    cfg,
                    free: cfg.limit,
                    closed: false,
                    in_flight: [0, 0],
                    queues: [VecDeque::new(), VecDeque::new()],
                    waiters: Slab::new(),
                    files: HashMap::default(),
                    latency_done: None,
                    window_timer: false,
                    counts: [ClassCounts::default(); 2],
                }),
            }),
        }
    }

    /// Takes no new permits from now on; wakes every waiter and drops the
    /// jobs that waited (each tells its op it never ran).
    pub(crate) fn close(&self) {
        let mut wakes = Wakes::new();
        let mut jobs = Vec::new();
        {
            let mut st = self.shared.lock();
            st.closed = true;
            let keys: Vec<usize> = st.queues.iter_mut().flat_map(|q| q.drain(..)).collect();
            for key in keys {
                let w = &mut st.waiters[key];
                let file = w.file;
                let c = w.class.index();
                jobs.extend(w.job.take());
                if let WaiterState::Waiting(Some(waker)) =
                    std::mem::replace(&mut w.state, WaiterState::Closed)
                {
                    wakes.push(waker);
                }
                if let Some(f) = file {
                    st.file(f).waiting[c] -= 1;
                    st.forget_if_idle(f);
                }
            }
        }
        drop(jobs);
        wakes.wake(&self.shared);
    }

    /// A slot for an op of `class` on `file`, at once if the rules admit it.
    pub(crate) fn acquire(&self, class: Priority, file: Option<FileKey>) -> Acquired {
        match self.take_or_queue(class, file, None) {
            Taken::Now(permit, _) => Acquired::Now(permit),
            Taken::Queued(wait) => Acquired::Wait(wait),
            Taken::Closed(_) => Acquired::Closed,
        }
    }

    /// A slot for `job`, a latency op's blocking work on `file`: at once if
    /// the rules admit it, else the job waits in the queue and the thread
    /// whose release grants it a slot starts it.
    /// `bytes`, what the job moves, are counted once it has its slot.
    pub(crate) fn acquire_job(&self, file: Option<FileKey>, bytes: u64, job: Job) -> JobAcquired {
        match self.take_or_queue(Priority::Latency, file, Some((job, bytes))) {
            Taken::Now(permit, job) => {
                self.count_bytes(Priority::Latency, bytes);
                JobAcquired::Now(job.expect("the job comes back").0, permit)
            }
            Taken::Queued(wait) => JobAcquired::Queued(wait),
            Taken::Closed(job) => JobAcquired::Closed(job.expect("the job comes back").0),
        }
    }

    fn take_or_queue(
        &self,
        class: Priority,
        file: Option<FileKey>,
        job: Option<(Job, u64)>,
    ) -> Taken {
        let mut st = self.shared.lock();
        if st.closed {
            return Taken::Closed(job);
        }
        let mut now = None;
        if st.free > 0 && st.admits(class, file, &mut now) {
            let capped = st.take(class, file, &mut now);
            let piece_limit = if capped {
                st.cfg.background_piece
            } else {
                usize::MAX
            };
            drop(st);
            let permit = Permit {
                shared: self.shared.clone(),
                class,
                file,
                piece_limit,
            };
            return Taken::Now(permit, job);
        }
        let key = st.waiters.insert(Waiter {
            class,
            file,
            since: Instant::now(),
            state: WaiterState::Waiting(None),
            capped: false,
            job_bytes: job.as_ref().map_or(0, |j| j.1),
            job: job.map(|j| j.0),
        });
        st.queues[class.index()].push_back(key);
        if let Some(f) = file {
            st.file(f).waiting[class.index()] += 1;
        }
        self.shared.arm_window(&mut st);
        Taken::Queued(Wait {
            shared: self.shared.clone(),
            key,
            _not_sync: PhantomData,
        })
    }

    /// Counts `bytes` for an op of `class` that holds one of these slots,
    /// once its piece is sized.
    pub(crate) fn count_bytes(&self, class: Priority, bytes: u64) {
        self.shared.bytes[class.index()].fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counters of each class (indexed by [`Priority::index`]).
    pub(crate) fn counts(&self) -> [ClassCounts; 2] {
        let st = self.shared.lock();
        let mut counts = st.counts;
        for (i, c) in counts.iter_mut().enumerate() {
            c.in_flight = st.in_flight[i] as u64;
            c.bytes = self.shared.bytes[i].load(Ordering::Relaxed);
        }
        counts
    }
}

impl Wait {
    pub(crate) fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Result<Permit, SlotsClosed>> {
        let key = self.key;
        if key == DONE {
            return Poll::Ready(Err(SlotsClosed));
        }
        let mut st = self.shared.lock();
        let w = &mut st.waiters[key];
        match &mut w.state {
            WaiterState::Waiting(waker) => {
                match waker {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            WaiterState::Granted => {
                let w = st.waiters.remove(key);
                let piece_limit = if w.capped {
                    st.cfg.background_piece
                } else {
                    usize::MAX
                };
                self.key = DONE;
                drop(st);
                Poll::Ready(Ok(Permit {
                    shared: self.shared.clone(),
                    class: w.class,
                    file: w.file,
                    piece_limit,
                }))
            }
            WaiterState::Handed | WaiterState::Closed => {
                st.waiters.remove(key);
                self.key = DONE;
                Poll::Ready(Err(SlotsClosed))
            }
        }
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        let key = std::mem::replace(&mut self.key, DONE);
        if key == DONE {
            return;
        }
        let mut st = self.shared.lock();
        let w = st.waiters.remove(key);
        match w.state {
            WaiterState::Waiting(_) => {
                let c = w.class.index();
                if let Some(i) = st.queues[c].iter().position(|&k| k == key) {
                    st.queues[c].remove(i);
                }
                if let Some(f) = w.file {
                    st.file(f).waiting[c] -= 1;
                    st.forget_if_idle(f);
                }
                // Its leaving may admit another file's over-share op.
                let mut wakes = Wakes::new();
                if !st.closed && st.free > 0 {
                    st.dispatch(&mut wakes);
                    self.shared.arm_window(&mut st);
                }
                drop(st);
                // A job that never ran is dropped outside the lock.
                drop(w.job);
                wakes.wake(&self.shared);
            }
            WaiterState::Granted => {
                // Granted but never taken: give the slot back.
                drop(st);
                drop(Permit {
                    shared: self.shared.clone(),
                    class: w.class,
                    file: w.file,
                    piece_limit: usize::MAX,
                });
            }
            // Its job took the slot with it, or the slots closed.
            WaiterState::Handed | WaiterState::Closed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::{Background, Latency};

    fn poll(w: &mut Wait) -> Poll<Result<Permit, SlotsClosed>> {
        w.poll_wait(&mut Context::from_waker(futures::task::noop_waker_ref()))
    }

    fn now(slots: &Slots, class: Priority, file: Option<FileKey>) -> Permit {
        match slots.acquire(class, file) {
            Acquired::Now(p) => p,
            Acquired::Wait(_) => panic!("{class:?} op on {file:?} had to wait"),
            Acquired::Closed => panic!("closed"),
        }
    }

    fn wait(slots: &Slots, class: Priority, file: Option<FileKey>) -> Wait {
        match slots.acquire(class, file) {
            Acquired::Wait(mut w) => {
                assert!(poll(&mut w).is_pending());
                w
            }
            _ => panic!("{class:?} op on {file:?} got a slot"),
        }
    }

    fn cfg(limit: usize, share: usize, background_share: usize) -> SlotsConfig {
        SlotsConfig {
            limit,
            share,
            background_share,
            background_piece: 128 << 10,
        }
    }

    #[test]
    fn a_file_alone_gets_every_slot_but_the_reserve() {
        let slots = Slots::new(cfg(64, 48, 64));
        // The reserve of 64 slots is 2.
        let held: Vec<_> = (0..62).map(|_| now(&slots, Latency, Some(1))).collect();
        let _next = wait(&slots, Latency, Some(1));
        // Another file gets the reserved slots at once.
        let _a = now(&slots, Latency, Some(2));
        let _b = now(&slots, Latency, Some(2));
        drop(held);
    }

    #[test]
    fn a_file_over_its_share_gives_way_to_a_waiting_file() {
        let slots = Slots::new(cfg(8, 4, 8));
        let mut one: Vec<_> = (0..7).map(|_| now(&slots, Latency, Some(1))).collect();
        let _other = now(&slots, Latency, Some(2));
        // Full: file 1 (7 held, share 4) and file 2 both wait.
        let mut w1 = wait(&slots, Latency, Some(1));
        let mut w2 = wait(&slots, Latency, Some(2));
        // A slot of file 1 frees: file 2's op gets it, though file 1's
        // waited longer.
        one.pop();
        assert!(poll(&mut w1).is_pending());
        let Poll::Ready(Ok(_two)) = poll(&mut w2) else {
            panic!("file 2 waits");
        };
        // While file 2 waits again, file 1 gets nothing.
        let mut w2b = wait(&slots, Latency, Some(2));
        one.pop();
        assert!(poll(&mut w1).is_pending());
        let Poll::Ready(Ok(_two_b)) = poll(&mut w2b) else {
            panic!("file 2 waits");
        };
        // No other file waits now, but file 1 (4 held, its share) may not
        // take the last free slot, the reserve of 8 slots...
        one.pop();
        assert!(poll(&mut w1).is_pending());
        // ...only one under its share.
        one.pop();
        assert!(matches!(poll(&mut w1), Poll::Ready(Ok(_))));
    }

    #[test]
    fn files_both_over_their_share_do_not_block_each_other_for_good() {
        let slots = Slots::new(cfg(8, 2, 8));
        let mut one: Vec<_> = (0..3).map(|_| now(&slots, Latency, Some(1))).collect();
        let two: Vec<_> = (0..3).map(|_| now(&slots, Latency, Some(2))).collect();
        let _rest: Vec<_> = (0..2).map(|_| now(&slots, Latency, Some(3))).collect();
        let mut w1 = wait(&slots, Latency, Some(1));
        let mut w2 = wait(&slots, Latency, Some(2));
        // A slot frees, but both waiters are over their share and the
        // other waits: nobody gets it...
        one.pop();
        assert!(poll(&mut w1).is_pending());
        assert!(poll(&mut w2).is_pending());
        // ...until one of them is back under its share.
        one.pop();
        assert!(matches!(poll(&mut w1), Poll::Ready(Ok(_))));
        drop(two);
        assert!(matches!(poll(&mut w2), Poll::Ready(Ok(_))));
    }

    #[test]
    fn latency_ops_go_first_and_background_keeps_its_share() {
        let slots = Slots::new(cfg(4, 4, 1));
        let mut held: Vec<_> = (0..4).map(|_| now(&slots, Latency, None)).collect();
        let mut bg = wait(&slots, Background, None);
        let mut lat: Vec<_> = (0..3).map(|_| wait(&slots, Latency, None)).collect();
        // Background holds nothing, under its share of 1: it gets the
        // first free slot even though latency ops wait...
        held.pop();
        let Poll::Ready(Ok(bg_permit)) = poll(&mut bg) else {
            panic!("background starved")
        };
        // ...and the next go to latency ops, in order.
        let mut bg2 = wait(&slots, Background, None);
        held.pop();
        let Poll::Ready(Ok(_first)) = poll(&mut lat[0]) else {
            panic!("the first latency op waits");
        };
        assert!(poll(&mut lat[1]).is_pending());
        assert!(poll(&mut bg2).is_pending());
        drop(bg_permit);
        let Poll::Ready(Ok(_second)) = poll(&mut bg2) else {
            panic!("background under its share waits");
        };
        assert!(poll(&mut lat[1]).is_pending());
    }

    #[test]
    fn background_is_capped_only_while_latency_ops_are_active() {
        let slots = Slots::new(cfg(8, 8, 2));
        // Alone, background ops take every slot.
        let bg: Vec<_> = (0..8).map(|_| now(&slots, Background, None)).collect();
        drop(bg);
        // A latency op in flight: background holds at most 2.
        let lookup = now(&slots, Latency, None);
        let _bg: Vec<_> = (0..2).map(|_| now(&slots, Background, None)).collect();
        let mut third = wait(&slots, Background, None);
        // It just finished: still active for the window.
        drop(lookup);
        assert!(poll(&mut third).is_pending());
        let mut st = slots.shared.lock();
        st.latency_done = Some(coarse_now() - 2 * window_ns());
        drop(st);
        // Long enough ago: the cap is off, for new ops at once.
        let _more: Vec<_> = (0..4).map(|_| now(&slots, Background, None)).collect();
        let counts = slots.counts();
        assert_eq!(counts[Latency.index()].ops, 1);
        assert_eq!(counts[Background.index()].in_flight, 6);
        assert_eq!(counts[Background.index()].ops, 14);
    }

    #[test]
    fn background_pieces_are_capped_only_while_latency_ops_are_active() {
        let slots = Slots::new(cfg(8, 8, 2));
        assert_eq!(now(&slots, Background, None).piece_limit(), usize::MAX);
        let lookup = now(&slots, Latency, None);
        assert_eq!(
            lookup.piece_limit(),
            usize::MAX,
            "latency ops are never capped"
        );
        let capped = now(&slots, Background, None);
        assert_eq!(capped.piece_limit(), 128 << 10);
        // A waiter granted while latency is active is capped too.
        let _other = now(&slots, Background, None);
        let mut w = wait(&slots, Background, None);
        drop(capped);
        let Poll::Ready(Ok(p)) = poll(&mut w) else {
            panic!("a background slot freed")
        };
        assert_eq!(p.piece_limit(), 128 << 10);
        drop(lookup);
    }

    #[test]
    fn a_dropped_waiter_gives_back_what_it_was_granted() {
        let slots = Slots::new(cfg(1, 1, 1));
        let held = now(&slots, Latency, Some(1));
        let w = wait(&slots, Latency, Some(1));
        drop(held);
        // Granted, never polled again, dropped: the slot is free again.
        drop(w);
        let _again = now(&slots, Latency, Some(1));
        assert!(slots.shared.lock().files.len() == 1);
        let w = wait(&slots, Latency, Some(2));
        drop(w);
        assert!(slots.shared.lock().queues[0].is_empty());
    }

    /// A multi-thread runtime whose blocking threads run the jobs.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap()
    }

    /// A job that sends its thread's id on `tx`, waits for `go` (if any),
    /// lets go of its slot and sends its thread's id again.
    fn job_on(
        tx: std::sync::mpsc::Sender<std::thread::ThreadId>,
        go: Option<std::sync::mpsc::Receiver<()>>,
    ) -> Job {
        Box::new(move |permit: Permit| {
            tx.send(std::thread::current().id()).unwrap();
            if let Some(go) = go {
                go.recv_timeout(Duration::from_secs(30)).unwrap();
            }
            drop(permit);
            tx.send(std::thread::current().id()).unwrap();
        })
    }

    const LONG: Duration = Duration::from_secs(30);

    /// One slot, whose granted jobs start as the blocking pool's do.
    fn one_job_slot(rt: &tokio::runtime::Runtime) -> Slots {
        Slots::on(
            cfg(1, 1, 1),
            Some(rt.handle().clone()),
            Some(crate::blocking::hand_off),
        )
    }

    #[test]
    fn a_queued_job_runs_on_the_thread_whose_release_grants_it() {
        let rt = runtime();
        let slots = one_job_slot(&rt);
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, gate) = std::sync::mpsc::channel();
        let JobAcquired::Now(first, permit) =
            slots.acquire_job(Some(1), 0, job_on(tx.clone(), Some(gate)))
        else {
            panic!("the first job waited");
        };
        crate::blocking::hand_off(first, permit, Some(rt.handle()));
        let runner = rx.recv_timeout(LONG).unwrap();
        // The slot is held: the next job waits in the queue.
        let JobAcquired::Queued(wait) = slots.acquire_job(Some(1), 0, job_on(tx, None)) else {
            panic!("the second job got a slot");
        };
        go.send(()).unwrap();
        assert_eq!(
            rx.recv_timeout(LONG).unwrap(),
            runner,
            "the first job ended"
        );
        assert_eq!(
            rx.recv_timeout(LONG).unwrap(),
            runner,
            "the second job started"
        );
        assert_eq!(
            rx.recv_timeout(LONG).unwrap(),
            runner,
            "the second job ended"
        );
        drop(wait);
        // Both slots came back.
        let _p = now(&slots, Latency, Some(1));
    }

    #[test]
    fn a_queued_job_dropped_before_its_grant_never_runs() {
        let rt = runtime();
        let slots = one_job_slot(&rt);
        let held = now(&slots, Latency, Some(1));
        let ran = Arc::new(AtomicU64::new(0));
        let counted = ran.clone();
        let job: Job = Box::new(move |_permit| {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let JobAcquired::Queued(wait) = slots.acquire_job(Some(1), 0, job) else {
            panic!("the job got a slot");
        };
        drop(wait);
        drop(held);
        // The slot is free again, and the job is gone: it never ran.
        let _p = now(&slots, Latency, Some(1));
        assert_eq!(Arc::strong_count(&ran), 1);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn closing_drops_the_queued_jobs() {
        let rt = runtime();
        let slots = one_job_slot(&rt);
        let held = now(&slots, Latency, None);
        let token = Arc::new(());
        let kept = token.clone();
        let job: Job = Box::new(move |_permit| drop(kept));
        let JobAcquired::Queued(wait) = slots.acquire_job(None, 0, job) else {
            panic!("the job got a slot");
        };
        slots.close();
        assert_eq!(Arc::strong_count(&token), 1, "close() kept a queued job");
        drop((wait, held));
        assert!(matches!(
            slots.acquire_job(None, 0, Box::new(drop)),
            JobAcquired::Closed(_)
        ));
    }

    #[test]
    fn a_panicking_job_hands_its_slot_to_the_next() {
        let rt = runtime();
        let slots = one_job_slot(&rt);
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let first: Job = Box::new(move |_permit| {
            gate.recv_timeout(Duration::from_secs(30)).unwrap();
            panic!("a job that panics (expected by this test)");
        });
        let JobAcquired::Now(first, permit) = slots.acquire_job(None, 0, first) else {
            panic!("the first job waited");
        };
        crate::blocking::hand_off(first, permit, Some(rt.handle()));
        let JobAcquired::Queued(wait) = slots.acquire_job(None, 0, job_on(tx, None)) else {
            panic!("the second job got a slot");
        };
        go.send(()).unwrap();
        rx.recv_timeout(LONG).expect("the queued job started");
        rx.recv_timeout(LONG).expect("the queued job ended");
        drop(wait);
        let _p = now(&slots, Latency, None);
    }

    #[test]
    fn closing_wakes_every_waiter() {
        let slots = Slots::new(cfg(2, 1, 1));
        let _stuck = now(&slots, Latency, Some(1));
        let mut w = wait(&slots, Latency, Some(1));
        let _other = now(&slots, Latency, Some(2));
        let mut b = wait(&slots, Background, None);
        slots.close();
        assert!(matches!(poll(&mut w), Poll::Ready(Err(SlotsClosed))));
        assert!(matches!(poll(&mut b), Poll::Ready(Err(SlotsClosed))));
        assert!(matches!(slots.acquire(Latency, None), Acquired::Closed));
    }

    #[test]
    fn background_keeps_moving_under_saturating_latency_load() {
        let slots = Slots::new(cfg(8, 8, 1));
        let mut held: VecDeque<Permit> = (0..8).map(|_| now(&slots, Latency, None)).collect();
        let mut bg_done = 0;
        let mut bg = wait(&slots, Background, None);
        for _ in 0..100 {
            // Latency ops always wait; one op ends per round.
            let mut lat = wait(&slots, Latency, None);
            held.pop_front();
            if let Poll::Ready(Ok(p)) = poll(&mut bg) {
                bg_done += 1;
                held.push_back(p);
                bg = wait(&slots, Background, None);
            }
            if let Poll::Ready(Ok(p)) = poll(&mut lat) {
                held.push_back(p);
            }
        }
        assert!(
            bg_done >= 10,
            "background got {bg_done} slots in 100 rounds"
        );
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// The cost of a slot taken and given back with no waiting, against
    /// the two semaphores (a file's share, then the slot) it replaced:
    /// `cargo test --release --lib permit::cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, printed"]
    fn uncontended_acquire_release() {
        use tokio::sync::Semaphore;
        const N: u32 = 2_000_000;
        let slots = Slots::new(SlotsConfig {
            limit: 512,
            share: 384,
            background_share: 2,
            background_piece: 128 << 10,
        });
        let (sem, share) = (Arc::new(Semaphore::new(512)), Arc::new(Semaphore::new(384)));
        for round in 0..3 {
            let t = Instant::now();
            for i in 0..N {
                let Acquired::Now(p) = slots.acquire(Priority::Latency, Some(u64::from(i & 7)))
                else {
                    panic!("no slot")
                };
                drop(std::hint::black_box(p));
            }
            let ours = t.elapsed() / N;
            let t = Instant::now();
            for _ in 0..N {
                let a = share.clone().try_acquire_owned().unwrap();
                let b = sem.clone().try_acquire_owned().unwrap();
                drop(std::hint::black_box((a, b)));
            }
            let sems = t.elapsed() / N;
            eprintln!("round {round}: scheduler {ours:?}, two semaphores {sems:?} per op");
        }
    }
}
