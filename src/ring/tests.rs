//! The ring driven directly, with no driver and no `UringContext`: a real
//! io_uring over a temp file registered as fixed file 0, whose SQEs are
//! handed to the kernel, and whose CQEs are reaped, by the test itself
//! (`plan_enter`/`enter`, `reap`/`reap_relayed`). Covers the overflow
//! backlog, breaking the ring and the relay of a small round of
//! completions. Every test runs under a watchdog thread, and asserts only
//! structure (queue lengths, counters, results, wake counts), never timing.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::Runtime;

use super::complete::RELAY_MAX;
use super::submit::DEFAULT_SHALLOW_BATCH;
use super::{Dst, Ring, RingConfig, RingOp};
use crate::files::{FileEntry, FileTable, RoutePolicy};
use crate::id::FileId;
use crate::permit::{Acquired, Permit, Priority, SlotsConfig};
use crate::util::lock;

/// Bytes per read; one pool buffer each.
const CHUNK: usize = 4096;

/// Runs `body` on its own thread and fails if it has not returned within a
/// generous deadline (a lost op would otherwise hang the test).
fn watchdog(body: impl FnOnce() + Send + 'static) {
    let _alone = crate::util::address_space_lock();
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        body();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => thread.join().expect("test body"),
        Err(RecvTimeoutError::Disconnected) => match thread.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the body returned without reporting"),
        },
        Err(RecvTimeoutError::Timeout) => panic!("watchdog: the test did not finish in 60 s"),
    }
}

/// A ring over one temp file of `chunks` chunks of known bytes.
struct Fixture {
    ring: Ring,
    file: Arc<FileEntry>,
    data: Vec<u8>,
    _table: FileTable,
    /// Last: the ring's descriptors are deregistered from its reactor first.
    _rt: Runtime,
}

fn fixture(entries: u32, in_flight: usize, chunks: usize) -> Fixture {
    let data: Vec<u8> = (0..chunks * CHUNK)
        .map(|i| u8::try_from(i * 7 % 251).unwrap())
        .collect();
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(&data).unwrap();
    let policy = RoutePolicy {
        fuse_via_blocking_pool: false,
        network_via_blocking_pool: false,
    };
    let table = FileTable::new(vec![f], 1, 1, policy).unwrap();
    let file = table.get(FileId::from(0)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let cfg = RingConfig {
        entries,
        in_flight,
        slots: SlotsConfig {
            limit: in_flight,
            share: in_flight,
            background_share: in_flight,
            background_piece: 128 << 10,
        },
        sqpoll_idle: None,
        coop_taskrun: false,
        pool_count: chunks,
        pool_size: CHUNK,
        file_capacity: 1,
        shutdown_timeout: Duration::from_secs(5),
        shallow_batch: DEFAULT_SHALLOW_BATCH,
        owner: 0,
    };
    let ring = {
        let _in_rt = rt.enter();
        Ring::new(&cfg, &table.raw_fds()).unwrap()
    };
    Fixture {
        ring,
        file,
        data,
        _table: table,
        _rt: rt,
    }
}

impl Fixture {
    fn permit(&self) -> Permit {
        match self.ring.permits.acquire(Priority::Latency, None) {
            Acquired::Now(p) => p,
            _ => panic!("a free in-flight slot"),
        }
    }

    /// Queues a read of chunk `i` into a bounce buffer; returns its key.
    fn read(&self, i: usize) -> usize {
        let op = RingOp::Read {
            offset: (i * CHUNK) as u64,
            dst: Dst::Bounce(CHUNK),
        };
        self.ring
            .submit(Some(self.file.clone()), self.permit(), op)
            .unwrap()
    }

    /// Polls op `key` with `waker`: its result and the bytes copied out.
    fn poll(&self, key: usize, waker: &Waker) -> Poll<(std::io::Result<usize>, Vec<u8>)> {
        let mut got = Vec::new();
        let polled = {
            let mut copy = |b: &[u8]| got.extend_from_slice(b);
            self.ring
                .poll_complete(key, &mut Context::from_waker(waker), Some(&mut copy))
        };
        polled.map(|c| (c.res, got))
    }

    /// Collects op `key`, which must have completed, and checks it read
    /// chunk `i`.
    fn collect_ok(&self, key: usize, i: usize) {
        match self.poll(key, futures::task::noop_waker_ref()) {
            Poll::Ready((Ok(n), got)) => {
                assert_eq!(n, CHUNK, "op {i}: a whole chunk");
                assert!(
                    got == self.data[i * CHUNK..(i + 1) * CHUNK],
                    "op {i}: the bytes of chunk {i}"
                );
            }
            Poll::Ready((Err(e), _)) => panic!("op {i} failed: {e}"),
            Poll::Pending => panic!("op {i} is not complete"),
        }
    }

    fn live(&self) -> usize {
        lock(&self.ring.state).live
    }

    /// (SQEs in the SQ not consumed by the kernel, SQEs in the backlog),
    /// as the state records them once it has accounted for what the kernel
    /// consumed.
    fn queued(&self) -> (usize, usize) {
        let mut st = lock(&self.ring.state);
        self.ring.account_consumed(&mut st);
        (st.in_sq.len(), st.backlog.len())
    }

    /// CQEs waiting in the completion queue.
    fn cq_len(&self) -> usize {
        let _only_reaper = lock(&self.ring.reap_lock);
        // SAFETY: `reap_lock` is held: the only CompletionQueue of this ring.
        unsafe { self.ring.uring.completion_shared() }.len()
    }

    /// Blocks (in the kernel) until the CQ holds at least `n` CQEs.
    fn wait_cqes(&self, n: usize) {
        while self.cq_len() < n {
            let plan = super::EnterPlan {
                to_submit: 0,
                flags: 0,
                batch: u32::MAX,
            };
            self.ring.enter(plan, u32::try_from(n).unwrap()).unwrap();
        }
    }

    /// Reaps until no op is live (every CQE applied).
    fn reap_all(&self) {
        while self.live() > 0 {
            if self.ring.reap() == 0 {
                crate::sys::wait_readable(self.ring.cq_ready.get_ref(), Duration::from_millis(50));
            }
        }
    }

    /// Moves the backlog into the SQ and submits the SQ with one enter;
    /// returns how many SQEs the kernel took.
    fn enter(&self) -> usize {
        let plan = self.ring.plan_enter(false).expect("SQEs to submit");
        self.ring.enter(plan, 0).unwrap()
    }

    /// Whether all `n` in-flight slots are free again.
    fn all_permits_free(&self, n: usize) -> bool {
        let held: Vec<Permit> = (0..n)
            .map_while(
                |_| match self.ring.permits.acquire(Priority::Latency, None) {
                    Acquired::Now(p) => Some(p),
                    _ => None,
                },
            )
            .collect();
        let next_waits = matches!(
            self.ring.permits.acquire(Priority::Latency, None),
            Acquired::Wait(_)
        );
        held.len() == n && next_waits
    }
}

/// A waker that counts its wakes and logs its id, in order, to a shared log.
struct Counting {
    id: usize,
    hits: AtomicUsize,
    log: Log,
}

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.hits.fetch_add(1, Ordering::SeqCst);
        lock(&self.log).push(self.id);
    }
}

/// The ids of the wakers woken, in order.
type Log = Arc<Mutex<Vec<usize>>>;

fn counting(n: usize) -> (Vec<Arc<Counting>>, Vec<Waker>, Log) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let counts: Vec<_> = (0..n)
        .map(|id| {
            Arc::new(Counting {
                id,
                hits: AtomicUsize::new(0),
                log: log.clone(),
            })
        })
        .collect();
    let wakers = counts.iter().map(|c| Waker::from(c.clone())).collect();
    (counts, wakers, log)
}

fn hits(counts: &[Arc<Counting>]) -> Vec<usize> {
    counts
        .iter()
        .map(|c| c.hits.load(Ordering::SeqCst))
        .collect()
}

/// More reads than the SQ holds, with nobody entering: the extra SQEs wait
/// in the backlog, each enter moves what fits, and every read completes
/// with its bytes; counters, slots and buffers all come back.
#[test]
fn backlog_holds_what_the_sq_cannot_and_loses_nothing() {
    watchdog(|| {
        const N: usize = 6;
        // The smallest ring the kernel makes of 2 entries: an SQ of 2.
        let fx = fixture(2, N, N);
        let keys: Vec<usize> = (0..N).map(|i| fx.read(i)).collect();
        // Not a driver thread and no driver: `submit` only notified.
        assert_eq!(fx.ring.counters().enters, 0, "submit never entered");
        assert_eq!(
            fx.queued(),
            (2, N - 2),
            "2 in the SQ, the rest in the backlog"
        );
        assert_eq!(fx.live(), N);
        // Every read is pending before anything reached the kernel.
        for &k in &keys {
            assert!(fx.poll(k, futures::task::noop_waker_ref()).is_pending());
        }

        // Each enter submits the 2 SQEs of the SQ; the next plan moves the
        // next 2 out of the backlog.
        assert_eq!(fx.enter(), 2);
        assert_eq!(fx.ring.counters().submitted, 2);
        assert_eq!(fx.queued(), (0, N - 2), "the kernel took the SQ");
        assert_eq!(fx.enter(), 2);
        assert_eq!(fx.queued(), (0, N - 4));
        assert_eq!(fx.enter(), 2);
        assert_eq!(fx.queued(), (0, 0), "the backlog is drained");
        assert!(fx.ring.plan_enter(false).is_none(), "nothing left to enter");

        fx.reap_all();
        for (i, &k) in keys.iter().enumerate() {
            fx.collect_ok(k, i);
        }
        let c = fx.ring.counters();
        assert_eq!((c.submitted, c.completed), (N as u64, N as u64));
        assert_eq!(fx.live(), 0);
        {
            let st = lock(&fx.ring.state);
            assert_eq!(st.ops.len(), 0, "every op left the table");
            assert_eq!(st.free_bufs.len(), N, "every pool buffer is back");
        }
        assert!(fx.all_permits_free(N), "every in-flight slot is back");
    });
}

/// Breaking the ring fails exactly the ops the kernel never saw (the
/// backlog and the unconsumed SQ) with the ring's error and wakes them;
/// ops the kernel has complete normally; new submits are refused; the
/// slots close, waking a waiting acquire.
#[test]
fn broken_ring_fails_only_what_the_kernel_never_saw() {
    watchdog(|| {
        const N: usize = 6;
        // 6 ops and a spare slot for a submit after the break: all 7 taken.
        let fx = fixture(2, N + 1, N);
        let (counts, wakers, _) = counting(N);
        let mut keys: Vec<usize> = (0..2).map(|i| fx.read(i)).collect();
        assert_eq!(fx.enter(), 2, "ops 0 and 1 are in the kernel");
        keys.extend((2..N).map(|i| fx.read(i)));
        {
            // Not yet accounted: the record still lists ops 0 and 1, which
            // the kernel consumed; `break_ring` must tell them apart.
            let st = lock(&fx.ring.state);
            assert_eq!((st.in_sq.len(), st.backlog.len()), (4, 2));
        }
        for (&k, w) in keys.iter().zip(&wakers) {
            if let Poll::Ready((res, _)) = fx.poll(k, w) {
                // Ops 0 and 1 may be done, but their CQEs are not reaped.
                panic!("op {k} ready before any reap: {res:?}");
            }
        }
        let spare = fx.permit();
        let Acquired::Wait(mut waiting) = fx.ring.permits.acquire(Priority::Latency, None) else {
            panic!("every slot is taken");
        };
        let noop = &mut Context::from_waker(futures::task::noop_waker_ref());
        assert!(waiting.poll_wait(noop).is_pending());

        let why = "test: io_uring_enter failed for good";
        fx.ring.break_ring(&std::io::Error::other(why));

        // The 4 never submitted are woken, once each; the 2 in the kernel not.
        assert_eq!(hits(&counts), [0, 0, 1, 1, 1, 1]);
        assert_eq!(fx.queued(), (0, 0), "SQ record and backlog emptied");
        assert_eq!(fx.live(), 2, "only the ops in the kernel are live");
        for &k in &keys[2..] {
            match fx.poll(k, futures::task::noop_waker_ref()) {
                Poll::Ready((Err(e), got)) => {
                    let msg = e.to_string();
                    assert!(msg.contains("broken") && msg.contains(why), "{msg}");
                    assert!(got.is_empty(), "no bytes from a failed op");
                }
                other => panic!("op {k}: expected the ring's error, got {other:?}"),
            }
        }
        // A broken ring never enters with SQEs again, and refuses new ops.
        assert!(fx.ring.plan_enter(false).is_none());
        let op = RingOp::Read {
            offset: 0,
            dst: Dst::Bounce(CHUNK),
        };
        let refused = fx
            .ring
            .submit(Some(fx.file.clone()), spare, op)
            .unwrap_err();
        assert!(refused.to_string().contains(why), "{refused}");
        assert_eq!(fx.live(), 2, "a refused submit queues nothing");
        // The slots are closed: the waiting acquire and any new one see it.
        assert!(matches!(waiting.poll_wait(noop), Poll::Ready(Err(_))));
        assert!(matches!(
            fx.ring.permits.acquire(Priority::Latency, None),
            Acquired::Closed
        ));

        // Ops 0 and 1 complete as usual, woken by their CQE.
        fx.reap_all();
        assert_eq!(hits(&counts), [1, 1, 1, 1, 1, 1]);
        fx.collect_ok(keys[0], 0);
        fx.collect_ok(keys[1], 1);
        let c = fx.ring.counters();
        assert_eq!((c.submitted, c.completed), (2, 2));
        let st = lock(&fx.ring.state);
        assert_eq!((st.live, st.ops.len()), (0, 0));
        assert_eq!(st.free_bufs.len(), N, "every pool buffer is back");
    });
}

/// Submits reads of chunks `0..n` each polled once with its own waker,
/// waits until all their CQEs are in the CQ, and reaps them in one round
/// with `reap_relayed`. Returns the keys.
fn relayed_round(fx: &Fixture, n: usize, wakers: &[Waker]) -> Vec<usize> {
    let keys: Vec<usize> = (0..n).map(|i| fx.read(i)).collect();
    for (&k, w) in keys.iter().zip(wakers) {
        assert!(fx.poll(k, w).is_pending());
    }
    assert_eq!(fx.enter(), n);
    fx.wait_cqes(n);
    assert_eq!(fx.ring.reap_relayed(), n, "one round of {n}");
    assert_eq!(fx.live(), 0);
    keys
}

/// A small round is relayed: the reap wakes one future, and each that
/// collects its op, or is dropped, wakes the next, until all are woken
/// once each.
#[test]
fn relay_wakes_a_small_round_one_after_another() {
    watchdog(|| {
        const N: usize = 5;
        const DROPPED: usize = 2;
        let fx = fixture(8, N, N);
        let (counts, wakers, log) = counting(N);
        let keys = relayed_round(&fx, N, &wakers);
        for step in 0..N {
            // Exactly one more future has been woken: the turn is its.
            assert_eq!(lock(&log).len(), step + 1, "step {step}: one wake per turn");
            assert_eq!(lock(&fx.ring.relay).len(), N - 1 - step);
            let turn = *lock(&log).last().unwrap();
            assert!(
                !lock(&log)[..step].contains(&turn),
                "step {step}: a future not woken before"
            );
            if step == DROPPED {
                // Dropped instead of collecting: still passes the turn on.
                let bufs = lock(&fx.ring.state).free_bufs.len();
                fx.ring.abandon(keys[turn], None);
                assert_eq!(lock(&fx.ring.state).free_bufs.len(), bufs + 1);
            } else {
                fx.collect_ok(keys[turn], turn);
            }
        }
        assert_eq!(hits(&counts), [1; N], "all woken, once each");
        assert!(lock(&fx.ring.relay).is_empty());
        let st = lock(&fx.ring.state);
        assert_eq!((st.live, st.ops.len(), st.free_bufs.len()), (0, 0, N));
    });
}

/// The relay's bounds: one completion is woken directly; a round of
/// `RELAY_MAX` is relayed (one woken, the rest queued); a round of
/// `RELAY_MAX + 1` is woken all at once, nothing queued.
#[test]
fn relay_bounds() {
    watchdog(|| {
        const BIG: usize = RELAY_MAX + 1;
        let fx = fixture(32, BIG, BIG);
        for (n, woken, queued) in [(1, 1, 0), (RELAY_MAX, 1, RELAY_MAX - 1), (BIG, BIG, 0)] {
            let (counts, wakers, log) = counting(n);
            let keys = relayed_round(&fx, n, &wakers);
            assert_eq!(
                lock(&log).len(),
                woken,
                "round of {n}: futures woken by the reap"
            );
            assert_eq!(lock(&fx.ring.relay).len(), queued, "round of {n}: queued");
            // Collecting them all (whoever's turn it is) empties the relay.
            for (i, &k) in keys.iter().enumerate() {
                fx.collect_ok(k, i);
            }
            assert!(lock(&fx.ring.relay).is_empty());
            assert_eq!(hits(&counts), vec![1; n], "round of {n}: each woken once");
            assert_eq!(lock(&fx.ring.state).ops.len(), 0);
        }
    });
}
