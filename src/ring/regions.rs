//! Memory registered as one fixed buffer with every ring of a context
//! ([`Regions`], [`RegionGuard`]): the block cache's frames, so that a
//! miss into them is a `READ_FIXED` and the kernel need not pin and unpin
//! the frame's pages for every read (`O_DIRECT`) or walk them to copy
//! (buffered).
//!
//! A region has the same number on every ring (its slot after the bounce
//! pool's, [`Ring::register_region`]); a buffer in it says so with
//! [`Registered`], and a ring that finds its own context's number there
//! issues the fixed read. Registration is best effort: a kernel without a
//! sparse table, no `RLIMIT_MEMLOCK` room or no free number leaves the
//! region unregistered, and its reads are plain reads.

use std::sync::{Arc, Mutex, Weak};

use super::Ring;
use crate::buf::Registered;
use crate::util::lock;

/// The region numbers of one context, shared by its registrations.
#[derive(Clone)]
pub(crate) struct Regions(Arc<Table>);

struct Table {
    rings: Vec<Weak<Ring>>,
    owner: u64,
    /// Numbers `0..slots` exist (the fewest any ring has room for).
    slots: u16,
    numbers: Mutex<Numbers>,
}

#[derive(Default)]
struct Numbers {
    /// Numbers below it were handed out at least once.
    next: u16,
    /// Numbers given back.
    free: Vec<u16>,
    /// Regions registered so far.
    #[cfg(test)]
    registered: u64,
}

/// A region registered with every ring of its context, unregistered when
/// dropped (from the rings still alive: a closed ring unregisters all).
pub(crate) struct RegionGuard {
    regions: Regions,
    region: u16,
}

impl Regions {
    /// The region table of the context with these rings (`owner` is their
    /// `RingConfig::owner`).
    pub(crate) fn new(rings: &[Arc<Ring>], owner: u64) -> Regions {
        Regions(Arc::new(Table {
            rings: rings.iter().map(Arc::downgrade).collect(),
            owner,
            slots: rings.iter().map(|r| r.region_slots()).min().unwrap_or(0),
            numbers: Mutex::new(Numbers::default()),
        }))
    }

    /// Registers `len` bytes at `ptr` with every ring, or none (`None`: no
    /// free number, or a ring refused, e.g. for `RLIMIT_MEMLOCK`).
    ///
    /// # Safety
    ///
    /// The range is anonymous memory that stays allocated and mapped to the
    /// same pages until the guard is dropped (see
    /// [`Ring::register_region`]).
    pub(crate) unsafe fn register(&self, ptr: *mut u8, len: usize) -> Option<RegionGuard> {
        let region = {
            let mut n = lock(&self.0.numbers);
            match n.free.pop() {
                Some(r) => r,
                None if n.next < self.0.slots => {
                    n.next += 1;
                    n.next - 1
                }
                None => return None,
            }
        };
        // From here the guard gives the number back, and unregisters the
        // rings that took the region, if one refuses.
        let guard = RegionGuard {
            regions: self.clone(),
            region,
        };
        let mut rings = 0;
        for ring in self.0.rings.iter().filter_map(Weak::upgrade) {
            // SAFETY: the caller's promise, until the guard's drop, which
            // unregisters the region first.
            if unsafe { ring.register_region(region, ptr, len) }.is_err() {
                return None;
            }
            rings += 1;
        }
        #[cfg(test)]
        if rings > 0 {
            lock(&self.0.numbers).registered += 1;
        }
        (rings > 0).then_some(guard)
    }
}

#[cfg(test)]
impl Regions {
    /// Numbers handed out at least once, and how many of them are free.
    pub(crate) fn numbers(&self) -> (u16, usize) {
        let n = lock(&self.0.numbers);
        (n.next, n.free.len())
    }

    /// Regions registered so far.
    pub(crate) fn registered(&self) -> u64 {
        lock(&self.0.numbers).registered
    }
}

impl RegionGuard {
    /// What a buffer in this region says of itself ([`crate::IoBufMut::registered`]).
    pub(crate) fn registered(&self) -> Registered {
        Registered {
            owner: self.regions.0.owner,
            region: self.region,
        }
    }
}

impl Drop for RegionGuard {
    fn drop(&mut self) {
        let t = &self.regions.0;
        for ring in t.rings.iter().filter_map(Weak::upgrade) {
            ring.unregister_region(self.region);
        }
        lock(&t.numbers).free.push(self.region);
    }
}
