//! The buffers of one scan ([`Pool`]), shared by the stream and its chunks:
//! slots ([`SlotBuf`]) of regions ([`Region`]) allocated as they are first
//! needed, a free list, and the stream's waker for a dropped chunk.

use std::io;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use crate::buf::{AlignedBuf, IoBufMut};

/// Largest allocation of a scan's buffers (a `Region`), unless one chunk is
/// larger: the defaults fit one region; huge settings map a chunk at a time.
const REGION_BYTES: usize = 8 << 20;

/// The buffers of one scan, shared by the stream and its chunks.
pub(super) struct Pool {
    state: Mutex<PoolState>,
    /// Buffers handed out so far (never more than the scan's buffers).
    allocated: AtomicUsize,
}

struct PoolState {
    free: Vec<SlotBuf>,
    /// The memory of the buffers handed out so far: regions of up to
    /// `REGION_BYTES` each, made as they are needed.
    regions: Vec<Arc<Region>>,
    /// The stream, waiting for a chunk to be dropped.
    waker: Option<Waker>,
}

/// Memory of a scan's buffers: one allocation of `slots × chunk` bytes (at
/// most `REGION_BYTES`, or one chunk), whose slots are buffers. From 2 MiB
/// it is a huge-page mapping ([`AlignedBuf::try_new_huge`]): zero-filled by
/// the kernel, faulted in a huge page at a time (DESIGN, "Scans").
struct Region {
    /// Owns the memory (freed when the last slot and the pool are gone);
    /// never read or written through: only through `base`.
    _mem: AlignedBuf,
    /// Start of slot 0; slot `i` is `chunk` bytes at `base + i × chunk`.
    base: NonNull<u8>,
    chunk: usize,
}

// SAFETY: a Region is a handle on memory it owns and never touches itself;
// each slot is read and written only through the one `SlotBuf` made for
// it, which the pool, a read in flight or a chunk owns at a time.
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` gives access to nothing but `base` and `chunk`.
unsafe impl Sync for Region {}

impl Region {
    /// Zeroed memory for `slots` buffers of `chunk` bytes aligned to `align`.
    fn new(slots: usize, chunk: usize, align: usize) -> io::Result<Region> {
        let len = slots.checked_mul(chunk).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("scan: {slots} buffers of {chunk} bytes overflow the address space"),
            )
        })?;
        let mut mem = AlignedBuf::try_new_huge(len, align).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("scan: cannot allocate {slots} chunk buffers of {chunk} bytes: {e}"),
            )
        })?;
        // The allocation does not move when `mem` does.
        let base = NonNull::new(mem.stable_mut_ptr()).expect("an allocation is not null");
        Ok(Region {
            _mem: mem,
            base,
            chunk,
        })
    }
}

/// Slot `index` of a [`Region`]: one chunk buffer. Exactly one exists per
/// slot (the pool makes each once and never clones it), so whoever holds it
/// has the slot's bytes to itself; it keeps the region alive.
pub(super) struct SlotBuf {
    region: Arc<Region>,
    index: usize,
}

impl SlotBuf {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: index < slots, so the offset stays inside the allocation.
        unsafe {
            self.region
                .base
                .as_ptr()
                .add(self.index * self.region.chunk)
        }
    }
}

impl Deref for SlotBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the slot's `chunk` bytes are inside the region, which this
        // buffer keeps alive, initialised (zero-filled, then written only by
        // reads), and nobody else reaches them while this buffer exists.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.region.chunk) }
    }
}

// SAFETY: the slot's `chunk` bytes stay where they are (the region's
// allocation never moves) and allocated while this buffer, which holds an
// `Arc` of the region, lives; no other `SlotBuf` covers them; all of them
// are initialised (zero-filled at allocation), so `bytes_init` is
// `bytes_total` and never changes.
unsafe impl IoBufMut for SlotBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr()
    }
    fn bytes_init(&self) -> usize {
        self.region.chunk
    }
    fn bytes_total(&self) -> usize {
        self.region.chunk
    }
    unsafe fn set_init(&mut self, _pos: usize) {}
}

impl Pool {
    /// No buffer yet; room for `free` returned ones before the free list
    /// grows.
    pub(super) fn new(free: usize) -> Pool {
        Pool {
            state: Mutex::new(PoolState {
                free: Vec::with_capacity(free),
                regions: Vec::new(),
                waker: None,
            }),
            allocated: AtomicUsize::new(0),
        }
    }

    /// Buffers handed out so far.
    pub(super) fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A free buffer, a slot not handed out yet (of `slots` buffers of
    /// `chunk` bytes in all, in regions of up to `REGION_BYTES` made as
    /// they are needed), or `None` after registering `waker` to be woken by
    /// the next returned buffer. `Err` if a region cannot be allocated.
    pub(super) fn take(
        &self,
        slots: usize,
        chunk: usize,
        align: usize,
        waker: &Waker,
    ) -> io::Result<Option<SlotBuf>> {
        let mut st = self.lock();
        if let Some(b) = st.free.pop() {
            return Ok(Some(b));
        }
        let next = self.allocated.load(Ordering::Relaxed);
        if next < slots {
            // Whole chunks per region (at least one): map only what is used.
            let per_region = (REGION_BYTES / chunk).max(1);
            let (which, index) = (next / per_region, next % per_region);
            if which == st.regions.len() {
                let n = per_region.min(slots - which * per_region);
                st.regions.push(Arc::new(Region::new(n, chunk, align)?));
            }
            let region = st.regions[which].clone();
            self.allocated.store(next + 1, Ordering::Relaxed);
            return Ok(Some(SlotBuf { region, index }));
        }
        if !st.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            st.waker = Some(waker.clone());
        }
        Ok(None)
    }

    pub(super) fn put(&self, buf: SlotBuf) {
        let waker = {
            let mut st = self.lock();
            st.free.push(buf);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}
