//! The inline path's policy: whether a read tries `preadv2(RWF_NOWAIT)`
//! (`sys::pread_nowait`) on its own thread before it goes to a ring
//! ([`History`], per ring), and when a thread doing such reads yields
//! ([`turn_over`], [`stretch`]). The op engine (`ops/mod.rs`) takes the
//! inline step; the read op (`ops/read.rs`) makes the syscall.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::runtime::RuntimeFlavor;

use crate::clock;
use crate::thread::{self, thread_slot};

/// Inline page-cache misses in a row after which the inline path only probes.
const MISS_STREAK: u32 = 16;

/// While probing, one read in this many tries the page cache inline.
const PROBE_EVERY: u32 = 16;

/// Counters of inline hits, one per group of threads (`thread_slot`), each
/// on its own cache line.
const HIT_SHARDS: usize = 8;

#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// One ring's record of its inline reads, and the decision it feeds: the
/// ring keeps it (its hits are summed into `Stats::inline_completed`).
///
/// A hit writes only its thread's counter: one counter for the ring would
/// bounce its cache line (and the miss streak beside it, which every read
/// loads) between the workers sharing the ring on every read (see DESIGN,
/// "Measured costs").
#[derive(Debug, Default)]
pub(crate) struct History {
    /// Reads served inline, by thread group.
    hits: [Padded<AtomicU64>; HIT_SHARDS],
    /// Page-cache misses of the inline path in a row (see `worth_trying`);
    /// written only on misses and at the first hit after them.
    misses: Padded<AtomicU32>,
}

impl History {
    /// Whether a read should try the page cache inline first. After
    /// [`MISS_STREAK`] misses in a row (a cold working set), only every
    /// [`PROBE_EVERY`]th read tries, so cold reads do not pay a failing
    /// `preadv2` each; one hit turns the inline path fully back on.
    pub(crate) fn worth_trying(&self) -> bool {
        self.misses.0.load(Ordering::Relaxed) < MISS_STREAK
            || self.misses.0.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == 0
    }

    pub(crate) fn hit(&self) {
        self.hits[thread_slot() % HIT_SHARDS]
            .0
            .fetch_add(1, Ordering::Relaxed);
        if self.misses.0.load(Ordering::Relaxed) != 0 {
            self.misses.0.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn miss(&self) {
        self.misses.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads served inline so far.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.iter().map(|h| h.0.load(Ordering::Relaxed)).sum()
    }
}

/// Ends the running task's stretch (if the thread's is its): the task is
/// about to wait (a batch returning `Pending` for its reads, or for tokio's
/// coop budget), which lets other tasks run as a fairness yield does, so its
/// next inline reads start a new stretch instead of yielding first.
pub(crate) fn end_stretch() {
    let task = tokio::task::try_id();
    thread::with_stretch(|s| {
        if s.get().is_some_and(|st| st.task == task) {
            s.set(None);
        }
    });
}

/// How long a thread may do inline reads before it yields (see
/// [`turn_over`]), on a runtime of this flavour.
///
/// A task woken on a `current_thread` runtime waits behind every ready task
/// (one queue), so its stretches must be short. On a multi-thread runtime a
/// woken task (a timer's) also lands behind the worker's ready tasks, up to
/// 256 of them, each of which may run a whole stretch. Longer stretches
/// make timers late; shorter ones cost throughput (see DESIGN, "Why an
/// inline path", fairness).
pub(crate) fn stretch(flavor: &RuntimeFlavor) -> Duration {
    match flavor {
        RuntimeFlavor::CurrentThread => Duration::from_micros(8),
        _ => Duration::from_micros(10),
    }
}

/// Whether the running task should yield before its next inline read: it
/// has spent `stretch` on inline (page-cache) reads in this poll.
///
/// Such reads complete without ever returning `Pending`, so a task looping
/// over them would run a whole coop budget (128 reads) per poll, and a
/// runtime full of such tasks would let a newly woken task (a timer, say)
/// wait for a round of all of them. Bounding the stretch keeps polls short.
/// It is counted in time rather than reads so that fast reads are not taxed
/// with a yield every few (see [`stretch`] for the values).
///
/// The stretch belongs to the task (`tokio::task::try_id`; outside a task,
/// to the thread): it starts at the task's first inline read after it last
/// yielded here or after another task's, so a task that does one or two
/// reads and ends (a point lookup) never yields. (A stretch per thread
/// would make a task yield at its first read whenever earlier tasks, or
/// idle time, had used up the thread's stretch: a lookup would go to the
/// back of the run queue before its only read.)
///
/// A batch's reads skip it; the batch calls it once, before its first read
/// (`batch::Core::turn_over`), so that its reads' inline time counts too.
#[inline]
pub(crate) fn turn_over(stretch: Duration) -> bool {
    turn_over_after(stretch, usize::MAX)
}

/// Most bytes a stretch serves between two readings of the clock
/// ([`turn_over_after`]).
const UNCLOCKED_BYTES: usize = 16 << 10;

/// [`turn_over`] for a read of at most `bytes` bytes from memory (a block
/// cache hit): the clock is read at the start of a stretch and then once
/// the reads since it was last read have asked for [`UNCLOCKED_BYTES`], or
/// for one byte per nanosecond of `stretch` if that is fewer, rather than
/// at every read. Where the clock is `Instant` (`clock::now`), a small
/// hit costs about as much as reading it; copying from memory moves more
/// than a byte per nanosecond, so a stretch overruns by less than its own
/// length (a zero stretch reads the clock at every read).
#[inline]
pub(crate) fn turn_over_after(stretch: Duration, bytes: usize) -> bool {
    let task = tokio::task::try_id();
    thread::with_stretch(|s| match s.get() {
        Some(mut st) if st.task == task => {
            st.unclocked = st.unclocked.saturating_add(bytes);
            let most = usize::try_from(stretch.as_nanos())
                .map_or(UNCLOCKED_BYTES, |ns| ns.min(UNCLOCKED_BYTES));
            if st.unclocked < most {
                s.set(Some(st));
                return false;
            }
            if st.start.elapsed() < stretch {
                st.unclocked = 0;
                s.set(Some(st));
                false
            } else {
                s.set(None);
                true
            }
        }
        _ => {
            s.set(Some(thread::Stretch {
                task,
                start: clock::now(),
                unclocked: 0,
            }));
            false
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_from_every_thread_are_counted() {
        let p = std::sync::Arc::new(History::default());
        // More threads than counters: some share one.
        let n = HIT_SHARDS * 2 + 1;
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        p.hit();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(p.hits(), n as u64 * 1000);
    }

    #[test]
    fn the_stretch_belongs_to_the_task() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let stretch = Duration::from_millis(2);
            // Task A starts a stretch, outlives it and ends without another
            // inline read.
            tokio::spawn(async move {
                assert!(!turn_over(stretch));
                std::thread::sleep(stretch * 2);
            })
            .await
            .unwrap();
            // Task B has a stretch of its own: its first read does not
            // yield; once it has used the stretch it does, and then starts
            // a new one.
            let b = tokio::spawn(async move {
                let first = turn_over(stretch);
                std::thread::sleep(stretch * 2);
                (first, turn_over(stretch), turn_over(stretch))
            })
            .await
            .unwrap();
            assert_eq!(b, (false, true, false));
        });
        // Outside a task the stretch is the thread's.
        let stretch = Duration::from_millis(2);
        assert!(!turn_over(stretch));
        std::thread::sleep(stretch * 2);
        assert!(turn_over(stretch));
    }

    #[test]
    fn small_reads_read_the_clock_every_few() {
        let stretch = Duration::from_millis(2);
        // The stretch starts (the clock read), then outlives itself; reads
        // of 4 KiB do not look at the clock until 16 KiB were asked for.
        assert!(!turn_over_after(stretch, 4096));
        std::thread::sleep(stretch * 2);
        let seen: Vec<bool> = (0..4).map(|_| turn_over_after(stretch, 4096)).collect();
        assert_eq!(seen, [false, false, false, true]);
        // A large read looks at it at once.
        assert!(!turn_over_after(stretch, 4096));
        std::thread::sleep(stretch * 2);
        assert!(turn_over_after(stretch, 1 << 20));
    }

    #[test]
    fn a_hit_ends_a_miss_streak() {
        let p = History::default();
        for _ in 0..MISS_STREAK {
            assert!(p.worth_trying());
            p.miss();
        }
        // Probing: one read in PROBE_EVERY tries.
        let tries = (0..PROBE_EVERY * 4).filter(|_| p.worth_trying()).count();
        assert_eq!(tries, 4);
        p.hit();
        assert!((0..8).all(|_| p.worth_trying()));
    }
}
