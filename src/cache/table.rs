//! Where the cache finds a block ([`Tables`]): per registered file, a dense
//! two-level table from block index to frame; and which block goes when a
//! new one comes ([`Policy`], S3-FIFO).
//!
//! Tables are read without a lock (a hit: a few loads of hot pointers,
//! then the entry) and changed only under the policy's mutex. Nothing a
//! reader can reach is freed before the tables are: a file's table is
//! reused by the next registration at its index (its key changes first),
//! chunks stay, and a top level replaced by a larger one is kept.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::frames::{prefetch_lines, Core, NO_FILE};
use super::{Key, KeyHash};
use crate::buf::{AlignedBuf, IoBufMut};

/// Entries per chunk of a file's table.
const CHUNK_SHIFT: u32 = 12;
const CHUNK: usize = 1 << CHUNK_SHIFT;
/// Files per group of the directory, and groups: every file index a
/// context can have (the kernel's fixed-file limit, 2^20).
const GROUP_SHIFT: u32 = 10;
const GROUPS: usize = 1 << 10;
/// Blocks beyond this index are read but not cached: a file's top level
/// is at most `MAX_CHUNKS` pointers.
const MAX_CHUNKS: usize = 1 << 20;

type Chunk = [AtomicU32; CHUNK];

/// Largest slab of chunks: one huge page.
const CHUNK_SLAB_BYTES: usize = 2 << 20;

/// Block `block`'s entry in its chunk.
#[inline]
fn slot(block: u64) -> usize {
    usize::try_from(block & (CHUNK as u64 - 1)).expect("below CHUNK")
}

/// Block `block`'s chunk (`usize::MAX` if beyond what a table holds).
#[inline]
fn chunk_of(block: u64) -> usize {
    usize::try_from(block >> CHUNK_SHIFT).unwrap_or(usize::MAX)
}

/// One file's table: `key` is the registration it holds blocks of (the
/// file's index and generation; `NO_FILE`: none yet).
struct FileTable {
    key: AtomicU64,
    top: AtomicPtr<Top>,
}

/// A table's top level: chunk pointers, null until a block of the chunk
/// is cached. Entry `e` of a chunk is frame `e - 1`, or none if 0.
struct Top {
    chunks: Box<[AtomicPtr<Chunk>]>,
}

type Group = [FileTable];

pub(super) struct Tables {
    groups: Box<[AtomicPtr<FileTable>]>,
}

impl Tables {
    pub(super) fn new() -> Tables {
        Tables {
            groups: (0..GROUPS).map(|_| AtomicPtr::default()).collect(),
        }
    }

    #[inline]
    fn table(&self, file: u64) -> Option<&FileTable> {
        let index = (file >> 32) as usize;
        let g = self
            .groups
            .get(index >> GROUP_SHIFT)?
            .load(Ordering::Acquire);
        if g.is_null() {
            return None;
        }
        // SAFETY: a group is `1 << GROUP_SHIFT` tables made by
        // `Policy::table_mut` (published with Release), freed only when
        // the tables are.
        let t = unsafe { &*g.add(index & ((1 << GROUP_SHIFT) - 1)) };
        Some(t)
    }

    /// The frame mapped for block `block` of `file`, if any (it may be
    /// being replaced: the frame's tag says).
    #[inline]
    pub(super) fn lookup(&self, file: u64, block: u64) -> Option<u32> {
        self.entry(file, block)?
            .load(Ordering::Acquire)
            .checked_sub(1)
    }

    /// Block `block` of `file`'s entry, if its chunk exists.
    #[inline]
    fn entry(&self, file: u64, block: u64) -> Option<&AtomicU32> {
        let t = self.table(file)?;
        if t.key.load(Ordering::Acquire) != file {
            return None;
        }
        let top = t.top.load(Ordering::Acquire);
        if top.is_null() {
            return None;
        }
        // SAFETY: tops are freed only with the tables (a replaced one is
        // kept in `Policy::old_tops`).
        let top = unsafe { &*top };
        let chunk = top.chunks.get(chunk_of(block))?.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: chunks are freed only with the policy (its slabs), when
        // the cache goes, not while anyone can read the tables.
        Some(&unsafe { &*chunk }[slot(block)])
    }
}

impl Drop for Tables {
    fn drop(&mut self) {
        for g in &*self.groups {
            let g = g.load(Ordering::Acquire);
            if g.is_null() {
                continue;
            }
            // SAFETY: made by `Box::into_raw` of a boxed slice of
            // `1 << GROUP_SHIFT` tables; freed once, here.
            let group: Box<Group> =
                unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(g, 1 << GROUP_SHIFT)) };
            for t in &*group {
                let top = t.top.load(Ordering::Acquire);
                if !top.is_null() {
                    // SAFETY: the table's current top, made by
                    // `Box::into_raw`, freed once, here (its chunks are the
                    // policy's slabs').
                    drop(unsafe { Box::from_raw(top) });
                }
            }
        }
    }
}

/// Which queue a resident frame is in.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum Queue {
    #[default]
    None,
    Small,
    Main,
}

/// What the policy knows of a frame.
#[derive(Clone, Copy, Default)]
struct Meta {
    queue: Queue,
    /// Bumped whenever the frame is mapped: a queue entry with another
    /// stamp is stale (the frame left the queue, maybe for another).
    stamp: u32,
}

/// S3-FIFO over resident frames: new blocks enter a small FIFO (a tenth of
/// the capacity); one accessed while there moves to the main FIFO when it
/// reaches the head, one not accessed is evicted and its key kept as a
/// ghost; a block missed while a ghost enters main directly. Main is a
/// CLOCK: a head accessed since it was last seen goes round again. Pinned
/// frames are skipped (sent round again).
pub(super) struct Policy {
    capacity: usize,
    /// Frames mapped in the tables.
    resident: usize,
    /// Frames evicted so far.
    evictions: u64,
    small: VecDeque<(u32, u32)>,
    main: VecDeque<(u32, u32)>,
    meta: Vec<Meta>,
    ghost: Ghosts,
    /// Tops replaced by larger ones (readers may still be on them).
    old_tops: Vec<Top>,
    /// The tables' chunks.
    slabs: ChunkSlabs,
}

/// S3-FIFO's ghost: keys recently evicted from the small FIFO, as 32-bit
/// fingerprints in a direct-mapped table of as many slots as the capacity
/// (the length of the paper's ghost FIFO). A new ghost takes its slot
/// whoever held it, so ghosts age out as they would from a FIFO, at
/// random rather than in order; a lookup costs one load, where a map plus
/// a FIFO would cost several waits for memory under the policy's lock.
/// Simulated on the zipf draws (`uring-bench zipf-policies`), it keeps as
/// many hits as the exact FIFO.
struct Ghosts {
    /// Empty until the first eviction, when the cache holds its capacity
    /// (of which the slots are under 1 %).
    slots: Vec<u32>,
    capacity: usize,
}

impl Ghosts {
    fn new(capacity: usize) -> Ghosts {
        Ghosts {
            slots: Vec::new(),
            capacity: capacity.max(1),
        }
    }

    /// `key`'s slot, and its fingerprint (never 0, an empty slot).
    #[inline]
    fn slot(&self, key: Key) -> (usize, u32) {
        let z = KeyHash.hash_one(key);
        // The low half scaled onto the slots; the high half the print.
        let n = self.capacity as u64;
        let i = usize::try_from(((z & 0xFFFF_FFFF) * n) >> 32).expect("below the slots");
        (i, (z >> 32) as u32 | 1)
    }

    fn insert(&mut self, key: Key) {
        if self.slots.is_empty() {
            // Without memory for them, no ghosts (the next insert tries
            // again): blocks then enter main only from small.
            if self.slots.try_reserve_exact(self.capacity).is_err() {
                return;
            }
            self.slots.resize(self.capacity, 0);
        }
        let (i, print) = self.slot(key);
        self.slots[i] = print;
    }

    /// Whether `key` was a ghost (it is not any more).
    fn take(&mut self, key: Key) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let (i, print) = self.slot(key);
        let hit = self.slots[i] == print;
        if hit {
            self.slots[i] = 0;
        }
        hit
    }

    /// Starts loading `key`'s slot (see `Policy::admit`).
    fn prefetch(&self, key: Key) {
        if !self.slots.is_empty() {
            let (i, _) = self.slot(key);
            prefetch_lines(NonNull::from(&self.slots[i]).cast(), 1);
        }
    }
}

/// The memory of the tables' chunks: slabs carved a chunk at a time, in
/// one huge page each where the capacity warrants it, so that a hit's
/// entry costs no TLB miss of its own. Freed with the policy, never
/// before: readers may be on any chunk until the tables go.
struct ChunkSlabs {
    slab_bytes: usize,
    mem: Vec<AlignedBuf>,
    /// Chunks carved from the last slab.
    used: usize,
}

impl ChunkSlabs {
    /// Slabs for a cache of `capacity` blocks: twice the bytes of its
    /// entries (a dense table of that many blocks), within one chunk and
    /// one huge page.
    fn new(capacity: usize) -> ChunkSlabs {
        let slab_bytes = capacity
            .saturating_mul(2 * size_of::<AtomicU32>())
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .clamp(size_of::<Chunk>(), CHUNK_SLAB_BYTES);
        ChunkSlabs {
            slab_bytes,
            mem: Vec::new(),
            used: 0,
        }
    }

    /// A new chunk, every entry 0 (none), or `None` without memory.
    fn carve(&mut self) -> Option<*mut Chunk> {
        let per_slab = self.slab_bytes / size_of::<Chunk>();
        if self.mem.is_empty() || self.used == per_slab {
            self.mem
                .push(AlignedBuf::try_new_huge(self.slab_bytes, align_of::<Chunk>().max(64)).ok()?);
            self.used = 0;
        }
        let slab = self.mem.last_mut().expect("a slab");
        // SAFETY: used < per_slab: the chunk lies inside the slab, aligned
        // (the slab is, and a chunk's size is a multiple of its alignment);
        // its bytes are zero (a new slab is zero-filled), which is an
        // `AtomicU32` 0, and no other chunk shares them.
        let chunk: *mut Chunk =
            unsafe { slab.stable_mut_ptr().add(self.used * size_of::<Chunk>()) }.cast();
        self.used += 1;
        Some(chunk)
    }
}

impl Policy {
    pub(super) fn new(capacity: usize) -> Policy {
        Policy {
            capacity,
            resident: 0,
            evictions: 0,
            small: VecDeque::new(),
            main: VecDeque::new(),
            meta: Vec::new(),
            ghost: Ghosts::new(capacity),
            old_tops: Vec::new(),
            slabs: ChunkSlabs::new(capacity),
        }
    }

    /// The table of `file`'s index, made if needed, holding `file`'s
    /// blocks (another registration's are dropped first).
    fn table_mut<'t>(
        &mut self,
        tables: &'t Tables,
        core: &Arc<Core>,
        file: u64,
    ) -> Option<&'t FileTable> {
        let index = (file >> 32) as usize;
        let slot = tables.groups.get(index >> GROUP_SHIFT)?;
        if slot.load(Ordering::Acquire).is_null() {
            let group: Box<Group> = (0..1 << GROUP_SHIFT)
                .map(|_| FileTable {
                    key: AtomicU64::new(NO_FILE),
                    top: AtomicPtr::default(),
                })
                .collect();
            slot.store(Box::into_raw(group).cast::<FileTable>(), Ordering::Release);
        }
        let t = tables.table(file).expect("the group was made");
        let key = t.key.load(Ordering::Relaxed);
        if key != file {
            if key != NO_FILE {
                self.drop_blocks(tables, core, key, 0, u64::MAX);
            }
            t.key.store(file, Ordering::Release);
        }
        Some(t)
    }

    /// Frames mapped in the tables.
    pub(super) fn resident(&self) -> usize {
        self.resident
    }

    /// Frames evicted so far.
    pub(super) fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Maps block `(file, block)` to frame `f` (pinned, retired: a flight's
    /// block), evicting a block if the cache is full: whether it was
    /// admitted (not if every resident frame is pinned, or the block is
    /// beyond what a table holds).
    pub(super) fn admit(&mut self, tables: &Tables, core: &Arc<Core>, key: Key, f: u32) -> bool {
        let chunk_index = chunk_of(key.block);
        if chunk_index >= MAX_CHUNKS {
            return false;
        }
        let Some(table) = self.table_mut(tables, core, key.file) else {
            return false;
        };
        // The entry's chunk, the top grown to hold it if needed.
        let mut top = table.top.load(Ordering::Acquire);
        // SAFETY: tops are freed only with the tables or kept in
        // `old_tops`; only this thread changes them (under the policy's
        // mutex, which it holds).
        let old = (!top.is_null()).then(|| unsafe { &*top });
        if old.is_none_or(|o| o.chunks.len() <= chunk_index) {
            let len = (chunk_index + 1).next_power_of_two().clamp(16, MAX_CHUNKS);
            let new = Box::new(Top {
                chunks: (0..len)
                    .map(|i| {
                        AtomicPtr::new(
                            old.and_then(|o| o.chunks.get(i))
                                .map_or(std::ptr::null_mut(), |p| p.load(Ordering::Relaxed)),
                        )
                    })
                    .collect(),
            });
            let new = Box::into_raw(new);
            table.top.store(new, Ordering::Release);
            if !top.is_null() {
                // SAFETY: the replaced top, made by `Box::into_raw`: kept
                // (not freed) while readers may be on it; its chunks now
                // belong to the new top.
                self.old_tops.push(*unsafe { Box::from_raw(top) });
            }
            top = new;
        }
        // SAFETY: as above.
        let top = unsafe { &*top };
        let mut chunk = top.chunks[chunk_index].load(Ordering::Acquire);
        if chunk.is_null() {
            let Some(new) = self.slabs.carve() else {
                return false;
            };
            chunk = new;
            top.chunks[chunk_index].store(chunk, Ordering::Release);
        }
        // SAFETY: chunks are freed only with the policy (its slabs), when
        // the cache goes, not while anyone can read the tables.
        let entry = &unsafe { &*chunk }[slot(key.block)];
        // The new block's entry, its ghost slot and the likely victim's
        // entry: three waits for memory (random over tables far larger
        // than the CPU's caches), taken together rather than one after
        // the other. The victim's header was loaded by the last admit.
        prefetch_lines(NonNull::from(entry).cast(), 1);
        self.ghost.prefetch(key);
        let full = self.resident >= self.capacity;
        if full {
            self.prefetch_victim(tables, core);
            if !self.evict_one(tables, core) {
                return false;
            }
            self.evictions += 1;
            self.resident -= 1;
        }
        // A frame still mapped for this block (a flight that landed after
        // an invalidation's) goes now; evicting first may have cost one
        // eviction more than needed, once.
        let old = entry.swap(0, Ordering::AcqRel);
        if let Some(o) = old.checked_sub(1) {
            self.forget(o);
            self.resident -= 1;
            core.unmapped(o);
        }
        let index = f as usize;
        if self.meta.len() <= index {
            self.meta.resize(index + 1, Meta::default());
        }
        let to_main = self.ghost.take(key);
        let meta = &mut self.meta[index];
        meta.stamp = meta.stamp.wrapping_add(1);
        meta.queue = if to_main { Queue::Main } else { Queue::Small };
        let entry_q = (f, meta.stamp);
        if to_main {
            self.main.push_back(entry_q);
        } else {
            self.small.push_back(entry_q);
        }
        self.compact();
        core.header(f).set_tag(key.file, key.block);
        entry.store(f + 1, Ordering::Release);
        core.mapped(f);
        self.resident += 1;
        if full {
            self.prefetch_next(core);
        }
        true
    }

    /// The queue the next eviction looks at first.
    fn next_queue(&self) -> &VecDeque<(u32, u32)> {
        if self.small.len() > (self.capacity / 10).max(1) || self.main.is_empty() {
            &self.small
        } else {
            &self.main
        }
    }

    /// Starts loading the table entry of the block the next eviction will
    /// most likely take (the head of its queue, unless it was accessed).
    fn prefetch_victim(&self, tables: &Tables, core: &Core) {
        if let Some(&(f, _)) = self.next_queue().front() {
            let (file, block) = core.header(f).tag();
            if let Some(e) = tables.entry(file, block) {
                prefetch_lines(NonNull::from(e).cast(), 1);
            }
        }
    }

    /// Starts loading the header and policy state of the frames at both
    /// queues' heads, for the next admit's eviction.
    fn prefetch_next(&self, core: &Core) {
        for q in [&self.small, &self.main] {
            if let Some(&(f, _)) = q.front() {
                prefetch_lines(NonNull::from(core.header(f)).cast(), 1);
                if let Some(m) = self.meta.get(f as usize) {
                    prefetch_lines(NonNull::from(m).cast(), 1);
                }
            }
        }
    }

    /// Drops stale queue entries once they outnumber the live ones.
    fn compact(&mut self) {
        let limit = 2 * self.capacity + 64;
        if self.small.len() + self.main.len() <= limit {
            return;
        }
        let meta = &self.meta;
        let live = |q: Queue| {
            move |&(f, stamp): &(u32, u32)| {
                let m = meta[f as usize];
                m.queue == q && m.stamp == stamp
            }
        };
        self.small.retain(live(Queue::Small));
        self.main.retain(live(Queue::Main));
    }

    /// Frame `f` leaves its queue (its entry there goes stale).
    fn forget(&mut self, f: u32) {
        if let Some(m) = self.meta.get_mut(f as usize) {
            m.queue = Queue::None;
        }
    }

    /// Evicts one resident, unpinned frame (unmapped and freed): whether
    /// one was found.
    fn evict_one(&mut self, tables: &Tables, core: &Core) -> bool {
        // As `next_queue`.
        let small_target = (self.capacity / 10).max(1);
        let mut budget = 2 * (self.small.len() + self.main.len()) + 8;
        while budget > 0 {
            budget -= 1;
            let from_small = self.small.len() > small_target || self.main.is_empty();
            let (queue, which) = if from_small {
                (&mut self.small, Queue::Small)
            } else {
                (&mut self.main, Queue::Main)
            };
            let Some((f, stamp)) = queue.pop_front() else {
                return false;
            };
            let meta = self.meta[f as usize];
            if meta.queue != which || meta.stamp != stamp {
                continue; // stale
            }
            let header = core.header(f);
            if header.take_freq() {
                // Accessed: round again, in main.
                self.meta[f as usize].queue = Queue::Main;
                self.main.push_back((f, stamp));
                continue;
            }
            if !header.try_claim() {
                // Pinned: not now.
                queue.push_back((f, stamp));
                continue;
            }
            let (file, block) = header.tag();
            let key = Key { file, block };
            self.meta[f as usize].queue = Queue::None;
            unmap_entry(tables, key, f);
            if from_small {
                self.ghost.insert(key);
            }
            core.free_claimed(f);
            return true;
        }
        false
    }

    /// Unmaps the blocks of `file` in `first..=last` (saturating) and the
    /// listed `extra` blocks: each frame is freed, or retired if pinned.
    pub(super) fn drop_blocks(
        &mut self,
        tables: &Tables,
        core: &Arc<Core>,
        file: u64,
        first: u64,
        last: u64,
    ) {
        let Some(t) = tables.table(file) else {
            return;
        };
        if t.key.load(Ordering::Relaxed) != file {
            return;
        }
        let top = t.top.load(Ordering::Acquire);
        if top.is_null() {
            return;
        }
        // SAFETY: the current top, alive with the tables.
        let top = unsafe { &*top };
        let c0 = chunk_of(first);
        let c1 = chunk_of(last).min(top.chunks.len().saturating_sub(1));
        for c in c0..=c1 {
            let Some(chunk) = top.chunks.get(c) else {
                break;
            };
            let chunk = chunk.load(Ordering::Acquire);
            if chunk.is_null() {
                continue;
            }
            // SAFETY: chunks are freed only with the policy (its slabs), when
            // the cache goes, not while anyone can read the tables.
            let chunk = unsafe { &*chunk };
            let base = (c as u64) << CHUNK_SHIFT;
            // `first - base` is below CHUNK in the first chunk, 0 after.
            let lo = slot(first.saturating_sub(base));
            let hi = slot(last.saturating_sub(base).min(CHUNK as u64 - 1));
            for e in &chunk[lo..=hi] {
                if e.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                if let Some(f) = e.swap(0, Ordering::AcqRel).checked_sub(1) {
                    self.forget(f);
                    self.resident -= 1;
                    core.unmapped(f);
                }
            }
        }
    }
}

/// Clears the table entry of `key` if it maps frame `f`.
fn unmap_entry(tables: &Tables, key: Key, f: u32) {
    let Some(t) = tables.table(key.file) else {
        return;
    };
    if t.key.load(Ordering::Relaxed) != key.file {
        return;
    }
    let top = t.top.load(Ordering::Acquire);
    if top.is_null() {
        return;
    }
    // SAFETY: the current top, alive with the tables.
    let top = unsafe { &*top };
    let Some(chunk) = top.chunks.get(chunk_of(key.block)) else {
        return;
    };
    let chunk = chunk.load(Ordering::Acquire);
    if chunk.is_null() {
        return;
    }
    // SAFETY: chunks are freed only with the policy (its slabs), when
    // the cache goes, not while anyone can read the tables.
    let e = &unsafe { &*chunk }[slot(key.block)];
    let _ = e.compare_exchange(f + 1, 0, Ordering::AcqRel, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(file: u64, block: u64) -> Key {
        Key {
            file: file << 32 | 1,
            block,
        }
    }

    #[test]
    fn a_ghost_is_found_once_and_lost_to_a_newer_one_in_its_slot() {
        let mut g = Ghosts::new(1000);
        assert!(!g.take(key(1, 5)));
        assert!(g.slots.is_empty(), "no memory before the first eviction");
        g.insert(key(1, 5));
        assert_eq!(g.slots.len(), 1000);
        assert!(g.take(key(1, 5)));
        assert!(!g.take(key(1, 5)), "taken once");
        g.insert(key(1, 5));
        let (i, _) = g.slot(key(1, 5));
        let other = (6..1_000_000)
            .find(|&b| g.slot(key(1, b)).0 == i)
            .expect("a block in slot i");
        g.insert(key(1, other));
        assert!(!g.take(key(1, 5)), "replaced by a newer ghost");
        assert!(g.take(key(1, other)));
        g.insert(key(1, 7));
        assert!(!g.take(key(2, 7)), "another file's block 7");
        assert!(g.take(key(1, 7)));
    }

    #[test]
    fn ghosts_spread_over_the_slots() {
        let mut g = Ghosts::new(4096);
        for b in 0..4096 {
            g.insert(key(3, b));
        }
        let kept = (0..4096).filter(|&b| g.take(key(3, b))).count();
        // A random placement keeps 1 - 1/e of them (2589); a bad mix far
        // fewer.
        assert!((2400..2800).contains(&kept), "{kept} of 4096 kept");
    }
}
