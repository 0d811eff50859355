//! Latency histograms of the ops of a context (opt-in:
//! [`Builder::latency_histograms`](crate::Builder::latency_histograms)):
//! the time from an op's first poll to its result, per priority class and
//! kind of op, in log-linear buckets (8 per power of two: a quantile is
//! within 1/8 of the true value), recorded with relaxed atomic additions
//! into per-thread shards and summed by [`UringContext::latencies`].
//!
//! [`UringContext::latencies`]: crate::UringContext::latencies

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::permit::Priority;

/// Sub-buckets per power of two.
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// Powers of two covered above the linear range: up to 2^40 ns (about 18
/// minutes); longer ops count in the last bucket.
const OCTAVES: usize = 38;
/// Buckets of a histogram: `SUB` linear ones for 0..SUB ns, then `SUB`
/// per power of two.
const BUCKETS: usize = SUB + OCTAVES * SUB;

/// The bucket of `ns` nanoseconds.
#[allow(
    clippy::cast_possible_truncation,
    reason = "both casts are of values below 64"
)]
fn bucket(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    // The highest bit's position (≥ SUB_BITS), then the next SUB_BITS bits.
    let top = ns.ilog2();
    let sub = ((ns >> (top - SUB_BITS)) & (SUB as u64 - 1)) as usize;
    let octave = (top - SUB_BITS) as usize;
    (SUB + octave * SUB + sub).min(BUCKETS - 1)
}

/// Nanoseconds since the first call in this process, plus one (never 0):
/// an op's start fits in a word.
pub(crate) fn now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let ns = EPOCH.get_or_init(Instant::now).elapsed().as_nanos();
    u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1
}

/// The smallest value, in nanoseconds, that falls into bucket `i`.
fn lower(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let octave = (i - SUB) / SUB;
    let sub = ((i - SUB) % SUB) as u64;
    (SUB as u64 + sub) << octave
}

/// What kind of op a latency belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// Reads and vectored reads (including those the page cache served
    /// inline).
    Read,
    /// Writes.
    Write,
    /// `fsync`, `fdatasync`, `sync_file_range`, `fallocate`.
    Sync,
    /// `statx`, `open`.
    Other,
}

const KINDS: usize = 4;

impl OpKind {
    fn index(self) -> usize {
        self as usize
    }
}

/// One shard's counters: per class, per kind, the buckets, then the sum
/// of the nanoseconds and the largest value.
struct Shard {
    hist: Box<[AtomicU64]>,
}

const PER_HIST: usize = BUCKETS + 2;

impl Shard {
    fn new() -> Shard {
        Shard {
            hist: (0..2 * KINDS * PER_HIST)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn base(priority: Priority, kind: OpKind) -> usize {
        (priority.index() * KINDS + kind.index()) * PER_HIST
    }
}

/// The counters of one context, one shard per thread slot (modulo their
/// number), so that threads recording at once rarely share a line.
pub(crate) struct Recorder {
    shards: Box<[Shard]>,
}

impl Recorder {
    pub(crate) fn new(shards: usize) -> Recorder {
        Recorder {
            shards: (0..shards.max(1)).map(|_| Shard::new()).collect(),
        }
    }

    /// Counts one op of `priority` and `kind` that took `took_ns` nanoseconds, from the thread with slot `slot`.
    pub(crate) fn record(&self, slot: usize, priority: Priority, kind: OpKind, took_ns: u64) {
        let ns = took_ns;
        let shard = &self.shards[slot % self.shards.len()];
        let base = Shard::base(priority, kind);
        shard.hist[base + bucket(ns)].fetch_add(1, Ordering::Relaxed);
        shard.hist[base + BUCKETS].fetch_add(ns, Ordering::Relaxed);
        shard.hist[base + BUCKETS + 1].fetch_max(ns, Ordering::Relaxed);
    }

    /// A snapshot of every histogram, summed over the shards.
    pub(crate) fn snapshot(&self) -> Latencies {
        let hist = |priority: Priority, kind: OpKind| {
            let base = Shard::base(priority, kind);
            let mut h = LatencyHistogram::default();
            for shard in &*self.shards {
                for (i, c) in h.counts.iter_mut().enumerate() {
                    *c += shard.hist[base + i].load(Ordering::Relaxed);
                }
                h.sum_ns = h
                    .sum_ns
                    .saturating_add(shard.hist[base + BUCKETS].load(Ordering::Relaxed));
                h.max_ns = h
                    .max_ns
                    .max(shard.hist[base + BUCKETS + 1].load(Ordering::Relaxed));
            }
            h
        };
        let class = |p: Priority| ClassLatencies {
            reads: hist(p, OpKind::Read),
            writes: hist(p, OpKind::Write),
            syncs: hist(p, OpKind::Sync),
            other: hist(p, OpKind::Other),
        };
        Latencies {
            latency: class(Priority::Latency),
            background: class(Priority::Background),
        }
    }
}

/// The latency histograms of a context's ops, from
/// [`UringContext::latencies`](crate::UringContext::latencies): per
/// priority class, per kind of op. Counts since the context was built;
/// [`since`](Self::since) gives those of an interval.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latencies {
    /// Ops of [`Priority::Latency`].
    pub latency: ClassLatencies,
    /// Ops of [`Priority::Background`].
    pub background: ClassLatencies,
}

impl Latencies {
    /// The ops counted after `earlier` (a snapshot of the same context
    /// taken before this one): for a metrics exporter's interval.
    /// [`max`](LatencyHistogram::max) stays the largest since the context
    /// was built.
    #[must_use]
    pub fn since(&self, earlier: &Latencies) -> Latencies {
        Latencies {
            latency: self.latency.since(&earlier.latency),
            background: self.background.since(&earlier.background),
        }
    }
}

/// The histograms of one priority class, per kind of op.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassLatencies {
    /// Reads of every form (borrowed, owned, vectored, exact, batch
    /// members, scan read-ahead), including those the page cache served
    /// inline.
    pub reads: LatencyHistogram,
    /// Writes of every form.
    pub writes: LatencyHistogram,
    /// `fsync`, `fdatasync`, `sync_file_range` and `fallocate`.
    pub syncs: LatencyHistogram,
    /// `statx` and `open`.
    pub other: LatencyHistogram,
}

impl ClassLatencies {
    fn since(&self, earlier: &ClassLatencies) -> ClassLatencies {
        ClassLatencies {
            reads: self.reads.since(&earlier.reads),
            writes: self.writes.since(&earlier.writes),
            syncs: self.syncs.since(&earlier.syncs),
            other: self.other.since(&earlier.other),
        }
    }
}

/// How long ops took, from their first poll to their result (the wait
/// for an in-flight slot included), in log-linear buckets: 8 per power of
/// two, so that a [`quantile`](Self::quantile) is within 1/8 of the true
/// value.
///
/// ```
/// # use std::io::Write;
/// use uring_positioned_io::UringContext;
/// # fn main() -> std::io::Result<()> {
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(&[1u8; 8192])?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::builder().latency_histograms(true).build(vec![file])?;
/// let mut buf = [0u8; 4096];
/// for _ in 0..10 {
///     ctx.read(0, 4096, &mut buf).await?;
/// }
/// let reads = ctx.latencies().expect("enabled").latency.reads;
/// assert_eq!(reads.count(), 10);
/// assert!(reads.quantile(0.5).unwrap() <= reads.max());
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: Box<[u64; BUCKETS]>,
    sum_ns: u64,
    max_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: Box::new([0; BUCKETS]),
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl LatencyHistogram {
    /// Ops counted.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Their mean latency (`None` if none was counted).
    #[must_use]
    pub fn mean(&self) -> Option<Duration> {
        let n = self.count();
        (n > 0).then(|| Duration::from_nanos(self.sum_ns / n))
    }

    /// The largest latency counted (zero if none was).
    #[must_use]
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// The latency below which a fraction `q` (0.0..=1.0, clamped) of the
    /// ops fall: the upper edge of the bucket holding that rank, capped at
    /// [`max`](Self::max). `None` if no op was counted.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        // The rank of the op asked for, 1-based.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "q is in 0..=1, so the product is in 0..=n"
        )]
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let upper = if i + 1 < BUCKETS {
                    lower(i + 1) - 1
                } else {
                    u64::MAX
                };
                return Some(Duration::from_nanos(upper.min(self.max_ns)));
            }
        }
        Some(self.max())
    }

    /// The buckets that counted an op: `(lowest, highest, count)`, in
    /// order; the last bucket's highest is `Duration::MAX`-like (all
    /// longer ops).
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, Duration, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| {
                let hi = if i + 1 < BUCKETS {
                    lower(i + 1) - 1
                } else {
                    u64::MAX
                };
                (Duration::from_nanos(lower(i)), Duration::from_nanos(hi), c)
            })
    }

    fn since(&self, earlier: &LatencyHistogram) -> LatencyHistogram {
        let mut h = self.clone();
        for (c, e) in h.counts.iter_mut().zip(earlier.counts.iter()) {
            *c = c.saturating_sub(*e);
        }
        h.sum_ns = h.sum_ns.saturating_sub(earlier.sum_ns);
        h
    }
}

impl fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count())
            .field("mean", &self.mean())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max", &self.max())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for (i, ns) in (0..10_000u64)
            .chain((0..64).map(|s| 1u64 << s))
            .chain([u64::MAX])
            .enumerate()
        {
            let b = bucket(ns);
            assert!(b < BUCKETS);
            if b + 1 < BUCKETS {
                assert!(lower(b) <= ns && ns < lower(b + 1), "{ns} in bucket {b}");
                // Within 1/8 of the value.
                assert!(
                    (lower(b + 1) - lower(b)) * 8 <= ns.max(8),
                    "{ns}: bucket too wide"
                );
            }
            if i < 10_000 {
                assert!(b >= last, "{ns}: bucket {b} before {last}");
                last = b;
            }
        }
    }

    #[test]
    fn quantiles_and_intervals() {
        let r = Recorder::new(3);
        for us in 1..=100u64 {
            r.record(
                usize::try_from(us).unwrap(),
                Priority::Latency,
                OpKind::Read,
                us * 1000,
            );
        }
        r.record(0, Priority::Background, OpKind::Sync, 5_000_000);
        let a = r.snapshot();
        let reads = &a.latency.reads;
        assert_eq!(reads.count(), 100);
        assert_eq!(reads.max(), Duration::from_micros(100));
        for (q, us) in [(0.5, 50u64), (0.99, 99), (1.0, 100), (0.0, 1)] {
            let got = u64::try_from(reads.quantile(q).unwrap().as_nanos()).unwrap();
            let want = us * 1000;
            assert!(
                got >= want && got <= want + want / 8,
                "q {q}: {got} ns for {want}"
            );
        }
        assert_eq!(reads.mean(), Some(Duration::from_nanos(50_500)));
        assert_eq!(a.background.syncs.count(), 1);
        assert_eq!(a.latency.writes.quantile(0.5), None);
        r.record(1, Priority::Latency, OpKind::Read, 7000);
        let d = r.snapshot().since(&a);
        assert_eq!(d.latency.reads.count(), 1);
        assert_eq!(d.background.syncs.count(), 0);
        assert_eq!(d.latency.reads.buckets().map(|(_, _, c)| c).sum::<u64>(), 1);
        // Odd arguments: clamped, never a panic.
        for q in [f64::NAN, -1.0, 2.0, f64::INFINITY] {
            assert!(reads.quantile(q).unwrap() <= reads.max(), "{q}");
        }
        // Snapshots diffed the wrong way round count nothing.
        assert_eq!(a.since(&r.snapshot()).latency.reads.count(), 0);
        // Ops longer than the last bucket count there, with their length.
        r.record(2, Priority::Latency, OpKind::Other, u64::MAX);
        let other = r.snapshot().latency.other;
        assert_eq!(
            (other.count(), other.max()),
            (1, Duration::from_nanos(u64::MAX))
        );
        assert_eq!(other.quantile(0.5), Some(Duration::from_nanos(u64::MAX)));
    }
}
