//! The block cache's buffers ([`Pool`]): block-sized slots ([`PoolBuf`])
//! carved from large aligned regions, made as they are first needed and
//! reused after, never one allocation per miss.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::buf::{AlignedBuf, IoBufMut, Slice};
use crate::util::lock;

/// Largest region: one huge page where the system gives them.
const REGION_BYTES: usize = 2 << 20;

/// Alignment of a region, so that every slot is aligned to
/// `min(block size, 4096)`: what `O_DIRECT` asks of memory on common devices.
const REGION_ALIGN: usize = 4096;

/// The buffers of one cache, shared by the cache and every block alive.
pub(super) struct Pool {
    block: usize,
    /// Slots per region.
    per_region: usize,
    free: Mutex<Vec<Slot>>,
    /// Regions made so far (the one slots are being carved from is last).
    regions: Mutex<Carver>,
    /// Slots carved so far (the pool's memory, in blocks).
    carved: AtomicUsize,
    /// Slots handed out and not yet back: reads in flight (or parked in the
    /// context after their future was dropped) and blocks alive.
    taken: AtomicUsize,
    /// Of those, slots holding a block ([`Pool::block_made`]).
    live: AtomicUsize,
}

struct Carver {
    region: Option<Arc<Region>>,
    next: usize,
}

/// Memory of `slots` buffers of `block` bytes: one [`AlignedBuf`] of
/// `slots × block` bytes, from 2 MiB its own mapping backed by transparent
/// huge pages where the system allows ([`AlignedBuf::try_new_huge`]): it
/// comes zero-filled and physically contiguous in 2 MiB pieces.
struct Region {
    /// Owns the memory (freed when the last slot is gone); never read or
    /// written through: only through `base`.
    _mem: AlignedBuf,
    /// Start of slot 0; slot `i` is `block` bytes at `base + i × block`.
    base: NonNull<u8>,
    block: usize,
}

// SAFETY: a Region is a handle on memory it owns and never touches itself;
// each slot is read and written only through the one `Slot` made for it,
// which the pool's free list, a read in flight or a block owns at a time.
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` gives access to nothing but `base` and `block`.
unsafe impl Sync for Region {}

/// One slot of a region. Exactly one exists per slot (the carver makes each
/// once and it is never cloned), so whoever holds it has the bytes to itself.
struct Slot {
    region: Arc<Region>,
    index: usize,
}

impl Slot {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: index < the region's slots, so the offset stays inside
        // its allocation.
        unsafe {
            self.region
                .base
                .as_ptr()
                .add(self.index * self.region.block)
        }
    }
}

impl Pool {
    /// No memory yet; regions of up to `REGION_BYTES` (at least one block,
    /// at most `max_region_blocks`) made as slots are needed.
    pub(super) fn new(block: usize, max_region_blocks: usize) -> Pool {
        Pool {
            block,
            per_region: (REGION_BYTES / block).clamp(1, max_region_blocks.max(1)),
            free: Mutex::new(Vec::new()),
            regions: Mutex::new(Carver {
                region: None,
                next: 0,
            }),
            carved: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
        }
    }

    /// An empty buffer of one block: a free slot, or a new one.
    pub(super) fn take(self: &Arc<Pool>) -> io::Result<PoolBuf> {
        let slot = lock(&self.free).pop();
        let slot = match slot {
            Some(s) => s,
            None => self.carve()?,
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        Ok(PoolBuf {
            slot: Some(slot),
            filled: 0,
            pool: self.clone(),
        })
    }

    fn carve(&self) -> io::Result<Slot> {
        let mut c = lock(&self.regions);
        let region = match &c.region {
            Some(r) if c.next < self.per_region => r.clone(),
            _ => {
                let len = self.per_region * self.block;
                let mut mem = AlignedBuf::try_new_huge(len, REGION_ALIGN).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("block cache: cannot allocate {len} bytes of block buffers: {e}"),
                    )
                })?;
                // The allocation does not move when `mem` does.
                let base = NonNull::new(mem.stable_mut_ptr()).expect("an allocation is not null");
                let r = Arc::new(Region {
                    _mem: mem,
                    base,
                    block: self.block,
                });
                c.region = Some(r.clone());
                c.next = 0;
                r
            }
        };
        let index = c.next;
        c.next += 1;
        self.carved.fetch_add(1, Ordering::Relaxed);
        Ok(Slot { region, index })
    }

    /// A buffer became a block (see [`live`](Self::live)).
    pub(super) fn block_made(&self) {
        self.live.fetch_add(1, Ordering::Relaxed);
    }

    /// A block was dropped (its buffer follows).
    pub(super) fn block_gone(&self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// Slots carved so far.
    pub(super) fn carved(&self) -> usize {
        self.carved.load(Ordering::Relaxed)
    }

    /// Slots handed out (reads in flight and blocks alive).
    pub(super) fn taken(&self) -> usize {
        self.taken.load(Ordering::Relaxed)
    }

    /// Slots holding a block.
    pub(super) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

/// One block-sized buffer of the pool; back on the free list when dropped.
/// A read fills it from its start, a short one continued into
/// [`rest`](Self::rest) (it is an owned buffer: a read future
/// dropped while the kernel holds it parks it in the context until the
/// kernel is done, and only then does it come back).
pub(super) struct PoolBuf {
    slot: Option<Slot>,
    filled: usize,
    pool: Arc<Pool>,
}

impl PoolBuf {
    fn slot(&self) -> &Slot {
        self.slot
            .as_ref()
            .expect("a pool buffer has its slot until dropped")
    }

    /// The pool it comes from.
    pub(super) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The bytes read so far.
    pub(super) fn filled(&self) -> usize {
        self.filled
    }

    /// The part of the block not read yet (`filled()..`), as a window an
    /// owned read fills from its start: how a short read is continued.
    pub(super) fn rest(self) -> Slice<PoolBuf> {
        let filled = self.filled;
        self.slice(filled..)
    }

    /// The bytes read so far, as a slice.
    pub(super) fn data(&self) -> &[u8] {
        // SAFETY: the slot's first `filled` bytes are inside the region,
        // which this buffer keeps alive, initialised (zero-filled, then
        // written by reads), and only this buffer reaches them; `&self`
        // excludes a read into it (which needs the buffer by value).
        unsafe { std::slice::from_raw_parts(self.slot().ptr(), self.filled) }
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            lock(&self.pool.free).push(slot);
            self.pool.taken.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: the slot's `block` bytes stay where they are (the region's
// allocation never moves) and allocated while this buffer, which holds an
// `Arc` of the region, lives; no other buffer covers them; all of them are
// initialised (zero-filled at allocation), `filled <= block` always holds
// and only `set_init` (through `&mut self`) raises it.
unsafe impl IoBufMut for PoolBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.slot().ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.slot().ptr()
    }
    fn bytes_init(&self) -> usize {
        self.filled
    }
    fn bytes_total(&self) -> usize {
        self.pool.block
    }
    unsafe fn set_init(&mut self, pos: usize) {
        self.filled = self.filled.max(pos.min(self.pool.block));
    }
}
