//! The inline path's clock (see `inline::turn_over_after`): how long a
//! task has been doing inline reads.
//!
//! `Instant::now` reads the vDSO's `clock_gettime`, which orders its read
//! of the CPU's counter after every earlier load (`lfence; rdtsc` or
//! `rdtscp`). After a block cache hit that means waiting for the hit's copy
//! to arrive from memory before the next hit's loads may start. On x86-64
//! with an invariant time-stamp counter, once the counter's rate is known,
//! a reading here is one plain `rdtsc`, which waits for nothing.
//!
//! The rate is calibrated against `Instant`, lazily: the first reading in
//! the process pairs the two clocks, and the first reading a millisecond or
//! more later pairs them again and divides. Until then, and where there is
//! no usable counter (another architecture, a counter that is not
//! invariant, a rate that makes no sense, a counter the hypervisor traps),
//! readings are `Instant`s. A stretch only needs its length roughly right:
//! counters of different CPUs that disagree slightly make a stretch a
//! little longer or shorter, never a read wrong.

use std::time::{Duration, Instant};

/// A reading of the clock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stamp {
    /// The time-stamp counter (its rate calibrated).
    #[cfg(target_arch = "x86_64")]
    Tsc(u64),
    Std(Instant),
}

/// The clock now.
#[inline]
pub(crate) fn now() -> Stamp {
    #[cfg(target_arch = "x86_64")]
    if tsc::calibrated() {
        return Stamp::Tsc(tsc::read());
    }
    Stamp::Std(Instant::now())
}

impl Stamp {
    /// The time since this reading.
    #[inline]
    pub(crate) fn elapsed(self) -> Duration {
        match self {
            #[cfg(target_arch = "x86_64")]
            Stamp::Tsc(t) => tsc::duration(tsc::read().saturating_sub(t)),
            Stamp::Std(i) => i.elapsed(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// Nanoseconds per tick, times 2^32; 0 while not calibrated.
    static NS_PER_TICK: AtomicU64 = AtomicU64::new(0);
    /// `NS_PER_TICK` when the counter is not to be used.
    const UNUSABLE: u64 = u64::MAX;

    /// How far apart the two pairings of the clocks must be.
    const SPAN: Duration = Duration::from_millis(1);

    /// Slowest and fastest counter rates believed, in ticks per second.
    const RATES: std::ops::RangeInclusive<u128> = 100_000_000..=20_000_000_000;

    /// Most nanoseconds a reading of the counter may take: a hypervisor
    /// that traps `rdtsc` takes microseconds, and `Instant` is cheaper then.
    const READ_NS: u128 = 200;

    /// The counter.
    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: `rdtsc` exists on every x86-64 CPU; it reads a counter and
        // touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// Converts ticks to time (once calibrated).
    #[inline]
    pub(super) fn duration(ticks: u64) -> Duration {
        let ns = (u128::from(ticks) * u128::from(NS_PER_TICK.load(Ordering::Relaxed))) >> 32;
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Whether the counter's rate is known (and the counter usable),
    /// calibrating it if it is time to.
    #[inline]
    pub(super) fn calibrated() -> bool {
        match NS_PER_TICK.load(Ordering::Relaxed) {
            UNUSABLE => false,
            0 => calibrate(),
            _ => true,
        }
    }

    /// Whether the counter ticks at a constant rate in every power state
    /// (CPUID leaf `0x8000_0007`, EDX bit 8).
    fn invariant() -> bool {
        #[allow(unused_unsafe, reason = "`__cpuid` is safe to call from Rust 1.89 on")]
        // SAFETY: `cpuid` exists on every x86-64 CPU and has no effect but
        // its result; an unsupported leaf returns zeroes (or the highest
        // basic leaf's values, in which bit 8 of EDX is meaningless, so the
        // extended leaves' count is checked first).
        let (top, edx) = unsafe {
            let top = core::arch::x86_64::__cpuid(0x8000_0000).eax;
            let edx = if top >= 0x8000_0007 {
                core::arch::x86_64::__cpuid(0x8000_0007).edx
            } else {
                0
            };
            (top, edx)
        };
        top >= 0x8000_0007 && edx & (1 << 8) != 0
    }

    /// The two clocks read together: the counter's reading is the middle
    /// of two that bracket the `Instant`'s, from the closest bracket of a
    /// few tries (a thread preempted in between widens one).
    fn pair() -> (Instant, u64) {
        let mut best: Option<(u64, Instant, u64)> = None;
        for _ in 0..4 {
            let a = read();
            let i = Instant::now();
            let b = read();
            let width = b.wrapping_sub(a);
            if best.is_none_or(|(w, _, _)| width < w) {
                best = Some((width, i, a.wrapping_add(width / 2)));
            }
        }
        let (_, i, t) = best.expect("four tries");
        (i, t)
    }

    /// Pairs the clocks; once a first pairing is `SPAN` old, sets the
    /// rate (or marks the counter unusable). Whether it is set now.
    #[cold]
    fn calibrate() -> bool {
        static FIRST: OnceLock<Option<(Instant, u64)>> = OnceLock::new();
        let first = FIRST.get_or_init(|| {
            if !invariant() || !cheap() {
                NS_PER_TICK.store(UNUSABLE, Ordering::Relaxed);
                return None;
            }
            let (i, t) = pair();
            Some((i, t))
        });
        let Some((i0, t0)) = *first else {
            return false;
        };
        let (i1, t1) = pair();
        let ns = i1.saturating_duration_since(i0).as_nanos();
        if ns < SPAN.as_nanos() {
            return false;
        }
        let rate = rate(ns, t1.wrapping_sub(t0));
        NS_PER_TICK.store(rate.unwrap_or(UNUSABLE), Ordering::Relaxed);
        rate.is_some()
    }

    /// Nanoseconds per tick times 2^32 from `ticks` counted in `ns`
    /// nanoseconds, if the rate is believable.
    pub(super) fn rate(ns: u128, ticks: u64) -> Option<u64> {
        let ticks = u128::from(ticks);
        if ticks == 0 || !RATES.contains(&(ticks * 1_000_000_000 / ns)) {
            return None;
        }
        u64::try_from((ns << 32) / ticks).ok()
    }

    /// Whether reading the counter is cheap (not trapped): `N` readings
    /// within `READ_NS` each, in one of a few tries (a preemption slows
    /// one).
    fn cheap() -> bool {
        const N: u32 = 32;
        (0..3).any(|_| {
            let start = Instant::now();
            let mut sum = 0u64;
            for _ in 0..N {
                sum = sum.wrapping_add(read());
            }
            std::hint::black_box(sum);
            start.elapsed().as_nanos() < READ_NS * u128::from(N)
        })
    }

    #[cfg(test)]
    pub(super) fn state() -> u64 {
        NS_PER_TICK.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_agrees_with_instant() {
        // The first readings calibrate it (a millisecond apart).
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(3) {
            std::hint::black_box(now());
        }
        // Calibration concludes (the counter used or refused) at the first
        // reading a millisecond after the first.
        #[cfg(target_arch = "x86_64")]
        {
            while tsc::state() == 0 && start.elapsed() < Duration::from_secs(1) {
                std::hint::black_box(now());
            }
            assert_ne!(tsc::state(), 0, "not calibrated after a second");
        }
        eprintln!("the inline path's clock: {:?}", now());
        // Each pair of readings is taken back to back, but a preemption
        // between them skews one pair by a scheduler slice, so the closest
        // of a few tries counts. A wrong rate (a unit off) misses on all.
        let tries: Vec<(Duration, Duration)> = (0..4)
            .map(|_| {
                let (a, i) = (now(), Instant::now());
                std::thread::sleep(Duration::from_millis(20));
                (a.elapsed(), i.elapsed())
            })
            .collect();
        assert!(
            tries
                .iter()
                .any(|&(ours, std)| ours.abs_diff(std) < std / 10),
            "the clock against Instant: {tries:?}"
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn unbelievable_rates_are_refused() {
        // 2.5 GHz: 0.4 ns per tick.
        let r = tsc::rate(1_000_000, 2_500_000).expect("believable");
        assert_eq!(r, (4u64 << 32) / 10);
        assert_eq!(tsc::rate(1_000_000, 0), None);
        assert_eq!(tsc::rate(1_000_000, 10), None, "10 kHz");
        assert_eq!(tsc::rate(1_000_000, 100_000_000), None, "100 GHz");
    }
}
