//! The block cache's memory ([`Core`]): a set of block-sized *frames*, each
//! with a small atomic header, carved from large aligned regions as they
//! are first needed and reused after, never one allocation per miss.
//!
//! A frame is, at any time, exactly one of:
//!
//! - **exclusive** (`EXCLUSIVE` set, no pins): on the free list, or owned
//!   by one [`FrameBuf`] (a read filling it). Only then are its bytes
//!   written, and no pin can be taken on it.
//! - **pinned** (`PINS` > 0): [`BlockRef`]s hold it; its bytes never
//!   change. Mapped in a file's table (resident) or not (`RETIRED`: the last
//!   unpin recycles it).
//! - **resident and unpinned** (state 0): mapped in a file's table; the
//!   evictor may claim it (`0 → EXCLUSIVE`, refused while pinned).
//!
//! The core outlives the cache while frames are pinned: every `RETIRED`
//! frame holds one strong count of the core's `Arc` (taken when the bit is
//! set, given back by whoever recycles the frame), and the cache, when
//! dropped, retires every frame still pinned ([`Core::close`]). A
//! [`BlockRef`] therefore needs no reference count of its own beyond the
//! frame's pin.

use std::fmt;
use std::io;
use std::ops::{Deref, Range};
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex};

use crate::buf::{AlignedBuf, IoBufMut, Registered};
use crate::ring::{RegionGuard, Regions};
use crate::util::lock;

/// Largest region: one huge page where the system gives them.
const REGION_BYTES: usize = 2 << 20;

/// Alignment of a region, so that every frame is aligned to
/// `min(block size, 4096)`: what `O_DIRECT` asks of memory on common devices.
const REGION_ALIGN: usize = 4096;

/// A frame's state word: owned by a free list or a read.
pub(super) const EXCLUSIVE: u64 = 1 << 63;
/// A frame's state word: pinned but in no table; the last unpin recycles it.
pub(super) const RETIRED: u64 = 1 << 62;
/// A frame's state word: its generation, which every fill of the frame
/// advances (`FrameBuf::into_block`), so that a reader who copied without
/// a pin can tell whether the frame was refilled meanwhile.
const GEN: u64 = ((1 << 30) - 1) << GEN_SHIFT;
const GEN_SHIFT: u32 = 32;
/// A frame's state word: the pins.
const PINS: u64 = (1 << GEN_SHIFT) - 1;

/// The tag of a frame that holds no block.
pub(super) const NO_FILE: u64 = u64::MAX;

/// Bytes of each frame a multi-get prefetches with its header: the first
/// few lines (the hardware's stream prefetcher follows the reader through
/// the rest), so that a batch's prefetches do not push each other out of
/// the CPU's caches before the reader comes.
pub(super) const PREFETCH_BYTES: usize = 256;

/// Asks the CPU to load the cache lines of `bytes` bytes from `ptr` (a
/// hint: nothing waits for them).
#[cfg_attr(target_arch = "x86_64", inline(always))]
#[cfg_attr(not(target_arch = "x86_64"), inline)]
pub(super) fn prefetch_lines(ptr: NonNull<u8>, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch is a hint: it never faults and changes no
            // memory, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.as_ptr().wrapping_add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, bytes);
}

/// Copies `n` bytes from `src`, memory another agent (the kernel) may
/// write meanwhile, into `dst[..n]`, where `n`, usually `dst.len()`, comes
/// from a load that may still be waiting for memory (a frame's length).
///
/// On x86-64 one `rep movsb` (an `asm!` block: the compiler assumes
/// nothing about the bytes it reads, as with a copy done by a syscall).
/// Its length is picked by a branch, not computed from `n`: the CPU
/// predicts `n == dst.len()` and starts the copy at once, while the load
/// of `n` is still on its way, instead of waiting for it before the
/// source's lines are even asked for. A shorter copy (a block at the end
/// of a file) costs one mispredicted branch. Elsewhere volatile loads of
/// a word at a time.
///
/// # Safety
///
/// `n <= dst.len()`; `src..src + n` is allocated, readable memory, and no
/// Rust code writes it while this runs.
#[inline]
unsafe fn copy_shared(src: *const u8, dst: &mut [u8], n: usize) {
    debug_assert!(n <= dst.len());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rep movsb` copies rcx bytes from rsi to rdi, forward (the
    // direction flag is clear at every call boundary, as the ABI requires);
    // rcx is `dst.len()` only where it equals `n`, else `n`; `src` is
    // readable for `n` bytes and `dst` writable for `n <= dst.len()` (the
    // caller's promise, and a `&mut [u8]`), and they do not overlap (`dst`
    // is exclusive). It uses no stack; the comparison changes the flags.
    unsafe {
        std::arch::asm!(
            "cmp rcx, {n}",
            "je 2f",
            "mov rcx, {n}",
            "2:",
            "rep movsb",
            n = in(reg) n,
            inout("rcx") dst.len() => _,
            inout("rsi") src => _,
            inout("rdi") dst.as_mut_ptr() => _,
            options(nostack)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let out = dst.as_mut_ptr();
        let mut i = 0;
        let word = size_of::<usize>();
        let head = src.align_offset(word).min(n);
        while i < head {
            // SAFETY: i < n: inside both ranges.
            unsafe { out.add(i).write(src.add(i).read_volatile()) };
            i += 1;
        }
        while i + word <= n {
            #[allow(
                clippy::cast_ptr_alignment,
                reason = "`src + i` is aligned for `usize` past the head"
            )]
            // SAFETY: i + word <= n: inside both ranges; `src + i` is
            // aligned for `usize` (past the head); `dst` may not be.
            unsafe {
                let v = src.add(i).cast::<usize>().read_volatile();
                out.add(i).cast::<usize>().write_unaligned(v);
            }
            i += word;
        }
        while i < n {
            // SAFETY: i < n: inside both ranges.
            unsafe { out.add(i).write(src.add(i).read_volatile()) };
            i += 1;
        }
    }
}

/// Billions of pins on one frame: only `mem::forget`ting `BlockRef`s gets
/// there. Aborts, as `Arc` does when its count would overflow: a count that
/// wrapped would let the frame be reused under live references.
#[cold]
fn pins_overflow() -> ! {
    std::process::abort()
}

/// A frame found in a state its caller rules out: its accounting (frames
/// and the core's strong count) is broken. Stops the process where it went
/// wrong, naming the frame, rather than free memory later that a
/// [`BlockRef`] may still read.
#[cold]
fn frame_state_broken(f: u32, state: u64, what: &str) -> ! {
    eprintln!("uring-positioned-io: block cache frame {f} {what} (state {state:#x}); aborting");
    std::process::abort()
}

/// A frame's header.
pub(super) struct Frame {
    /// `EXCLUSIVE`, `RETIRED` and the pins (see the module's comment).
    state: AtomicU64,
    /// The block it holds while mapped: the file's key and the block's
    /// index (`NO_FILE` otherwise). A hit checks them after pinning.
    file: AtomicU64,
    block: AtomicU64,
    /// Valid bytes (a short block at the end of a file holds fewer).
    len: AtomicU32,
    /// Set by hits, cleared by the evictor (the policy's frequency bit).
    freq: AtomicU8,
}

impl Frame {
    fn new() -> Frame {
        Frame {
            state: AtomicU64::new(EXCLUSIVE),
            file: AtomicU64::new(NO_FILE),
            block: AtomicU64::new(0),
            len: AtomicU32::new(0),
            freq: AtomicU8::new(0),
        }
    }

    /// Pins the frame unless it is exclusive (free, or being filled).
    #[inline]
    fn try_pin(&self) -> bool {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            if s & EXCLUSIVE != 0 {
                return false;
            }
            if s & PINS == PINS {
                pins_overflow();
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// The start of a copy made without a pin (`Core::copy_if_holds`): the
    /// state word, if the frame is not exclusive and holds block `block` of
    /// `file`.
    #[inline]
    fn copy_begin(&self, file: u64, block: u64) -> Option<u64> {
        // Acquire: the fill's bytes and length (stored before the state,
        // with Release, by `FrameBuf::into_block`).
        let s = self.state.load(Ordering::Acquire);
        (s & EXCLUSIVE == 0 && self.holds(file, block)).then_some(s)
    }

    /// Whether the bytes copied since `copy_begin` returned `seen` are the
    /// block's: the frame is not exclusive and still in the same
    /// generation, so it was not claimed (and so not written) in between.
    #[inline]
    fn copy_still(&self, seen: u64) -> bool {
        // The copy's loads before this one.
        std::sync::atomic::fence(Ordering::Acquire);
        let now = self.state.load(Ordering::Relaxed);
        now & EXCLUSIVE == 0 && (now ^ seen) & GEN == 0
    }

    /// Whether it holds block `block` of file `file`.
    #[inline]
    fn holds(&self, file: u64, block: u64) -> bool {
        self.file.load(Ordering::Relaxed) == file && self.block.load(Ordering::Relaxed) == block
    }

    /// The block it holds (`(NO_FILE, _)`: none).
    pub(super) fn tag(&self) -> (u64, u64) {
        (
            self.file.load(Ordering::Relaxed),
            self.block.load(Ordering::Relaxed),
        )
    }

    /// Marks it accessed (only if not already: a hit does not dirty the
    /// line for nothing).
    #[inline]
    fn touch(&self) {
        if self.freq.load(Ordering::Relaxed) == 0 {
            self.freq.store(1, Ordering::Relaxed);
        }
    }

    /// Clears the access bit: whether it was set.
    pub(super) fn take_freq(&self) -> bool {
        self.freq.swap(0, Ordering::Relaxed) != 0
    }

    /// The evictor's claim on a resident, unpinned frame.
    pub(super) fn try_claim(&self) -> bool {
        let s = self.state.load(Ordering::Relaxed);
        s & !GEN == 0
            && self
                .state
                .compare_exchange(s, EXCLUSIVE | s, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    /// Makes a mapped frame the block `(file, block)`; the caller maps it
    /// in the table after this.
    pub(super) fn set_tag(&self, file: u64, block: u64) {
        self.block.store(block, Ordering::Relaxed);
        self.file.store(file, Ordering::Relaxed);
    }

    /// Forgets the block it held: a reader pinning it from a stale table
    /// entry sees no match.
    pub(super) fn clear_tag(&self) {
        self.file.store(NO_FILE, Ordering::Relaxed);
    }
}

/// The frames of one cache. Aligned to 128 bytes, so that in its `Arc`
/// the counts (changed by every read's buffer, on any thread) sit on lines
/// of their own, apart from the fields every hit reads.
#[repr(align(128))]
pub(super) struct Core {
    block: usize,
    /// log2 of the frames per region.
    region_shift: u32,
    /// The regions made so far, published in order; a frame's region is
    /// `regions[frame >> region_shift]`. Fixed length: the most frames the
    /// cache ever makes is `regions.len() << region_shift`.
    regions: Box<[RegionSlot]>,
    /// Headers per header slab (a multiple of the frames per region).
    slab_frames: usize,
    /// Regions that the capacity fills: the next one is made ahead while
    /// fewer are made.
    fill_regions: usize,
    free: Mutex<Free>,
    /// Frames carved so far (the cache's memory, in blocks).
    carved: AtomicUsize,
    /// Frames owned by a [`FrameBuf`] (reads in flight, or parked in the
    /// context after their future was dropped).
    taken: AtomicUsize,
    /// Frames pinned and in no table.
    retired: AtomicUsize,
    /// Set by [`close`](Core::close): the cache is gone.
    closed: AtomicBool,
    /// Where regions are registered with the context's rings (none on the
    /// fallback backend), and the registrations, undone before the
    /// regions' memory is freed (`Drop`).
    registrar: Option<Regions>,
    registrations: Mutex<Vec<RegionGuard>>,
}

/// A region: `1 << region_shift` frames, their bytes in one
/// [`AlignedBuf`] (from 2 MiB its own mapping backed by transparent huge
/// pages where the system allows, [`AlignedBuf::try_new_huge`]), their
/// headers side by side in a header slab. A hit finds both one load away,
/// in this array, which stays in the CPU's caches.
#[derive(Default)]
struct RegionSlot {
    /// Frame 0's bytes; frame `i`'s are `block` bytes at `base + i × block`.
    base: AtomicPtr<u8>,
    /// Frame 0's header; frame `i`'s is at `frames + i`.
    frames: AtomicPtr<Frame>,
    /// Its registration with the context's rings: [`Registered`] as
    /// `(owner, region + 1)`, 0 if none.
    fixed: AtomicU64,
}

struct Free {
    list: Vec<u32>,
    /// Regions made so far.
    regions: usize,
    /// Frames of the last region carved so far.
    next: usize,
    /// The memory of the regions and of the header slabs (never read or
    /// written through: only through the regions' pointers), freed with
    /// the core: when no frame is pinned or owned any more (each would
    /// hold a strong count of it).
    mem: Vec<AlignedBuf>,
    /// Headers of the current slab not yet given to a region, and where
    /// they start.
    slab_left: usize,
    slab_next: *mut Frame,
    /// The next region's memory, made ahead ([`Spare`]), and whether a
    /// thread is making it.
    spare: Option<Spare>,
    making_spare: bool,
}

/// A spare region being made. However the job ends (run, or dropped unrun
/// with its runtime), its drop tells the core, and gives it the spare if
/// the cache is still there and still filling; otherwise the spare is
/// dropped (unregistered and freed) here, after the core's lock.
struct SpareJob {
    core: std::sync::Weak<Core>,
    spare: Option<Spare>,
}

impl Drop for SpareJob {
    fn drop(&mut self) {
        let spare = self.spare.take();
        let unneeded = self.core.upgrade().and_then(|core| {
            let mut free = lock(&core.free);
            free.making_spare = false;
            if free.regions < core.fill_regions {
                free.spare = spare;
                None
            } else {
                spare
            }
        });
        drop(unneeded);
    }
}

/// A region [`Core::carve`] made: its index, and whether it was a spare
/// already registered.
struct NewRegion {
    index: usize,
    prepared: bool,
}

/// A region's memory made ahead of need, on the runtime's blocking pool,
/// while the cache fills: faulted in and registered with the context's rings,
/// so that the miss that carves it neither waits for fresh memory nor
/// holds a ring's lock while the kernel pins it. Dropped unused (the cache
/// gone), it is unregistered before its memory is freed (field order).
struct Spare {
    guard: Option<RegionGuard>,
    mem: AlignedBuf,
}

impl Spare {
    /// `len` bytes of region memory, faulted in, registered where
    /// `registrar`'s rings take it.
    fn make(len: usize, registrar: Option<&Regions>) -> io::Result<Spare> {
        let mut mem = AlignedBuf::try_new_huge(len, REGION_ALIGN)?;
        let base = mem.stable_mut_ptr();
        if mem.is_own_mapping() {
            // As `Core::carve`'s.
            let _ = crate::sys::advise_dont_fork(base.cast(), len);
        }
        // SAFETY: the buffer's `len` bytes, which only this thread has.
        unsafe { crate::sys::populate_write(base, len) };
        // SAFETY: anonymous memory that stays allocated and mapped while
        // the guard lives (it drops first, with the spare or the core).
        let guard = registrar.and_then(|r| unsafe { r.register(base, len) });
        Ok(Spare { guard, mem })
    }
}

/// Bytes of a header slab: one huge page. The headers of every frame in it
/// sit in one TLB entry (they are touched at every hit), and a cache of
/// fewer frames gets a slab of its size.
const SLAB_BYTES: usize = 2 << 20;

// SAFETY: the core's memory is reached only through frames, each written
// only while exclusive to one owner (a `FrameBuf`) and read only while
// pinned (see the module's comment); every other field is atomic or
// behind a mutex.
unsafe impl Send for Core {}
// SAFETY: as above.
unsafe impl Sync for Core {}

impl Core {
    /// No memory yet. Frames of `block` bytes, regions of up to 2 MiB (at
    /// least one frame, at most `capacity` rounded up to a power of two),
    /// and room for at least `max_frames` frames.
    /// Its regions are registered with the rings `registrar` stands for,
    /// where they take them.
    pub(super) fn new(
        block: usize,
        capacity: usize,
        max_frames: usize,
        registrar: Option<Regions>,
    ) -> Core {
        let per_region = (REGION_BYTES / block).clamp(1, capacity.next_power_of_two());
        let regions = max_frames.div_ceil(per_region);
        Core {
            block,
            region_shift: per_region.trailing_zeros(),
            regions: (0..regions).map(|_| RegionSlot::default()).collect(),
            slab_frames: (SLAB_BYTES / size_of::<Frame>())
                .min(capacity)
                .next_multiple_of(per_region),
            fill_regions: capacity.div_ceil(per_region),
            free: Mutex::new(Free {
                list: Vec::new(),
                regions: 0,
                next: per_region,
                mem: Vec::new(),
                slab_left: 0,
                slab_next: std::ptr::null_mut(),
                spare: None,
                making_spare: false,
            }),
            carved: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            retired: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            registrar,
            registrations: Mutex::new(Vec::new()),
        }
    }

    /// Whether a spare region is being made, and where the one made is.
    #[cfg(test)]
    pub(super) fn spare(&self) -> (bool, Option<usize>) {
        let free = lock(&self.free);
        let base = free.spare.as_ref().map(|s| s.mem.storage_ptr() as usize);
        (free.making_spare, base)
    }

    /// Region `r`'s memory.
    #[cfg(test)]
    pub(super) fn region_base(&self, r: usize) -> *mut u8 {
        self.regions[r].base.load(Ordering::Acquire)
    }

    /// The registration of frame `f`'s region, if it has one.
    pub(super) fn registered(&self, f: u32) -> Option<Registered> {
        let fixed = self.regions[f as usize >> self.region_shift]
            .fixed
            .load(Ordering::Acquire);
        let region = u16::try_from(fixed & 0xffff).ok()?.checked_sub(1)?;
        Some(Registered {
            owner: fixed >> 16,
            region,
        })
    }

    /// Frame `f`'s header and bytes.
    ///
    /// # Safety
    ///
    /// `f` was carved (the index came from a frame of this core).
    #[inline]
    unsafe fn frame(&self, f: u32) -> (&Frame, NonNull<u8>) {
        let f = f as usize;
        let slot = &self.regions[f >> self.region_shift];
        let i = f & ((1 << self.region_shift) - 1);
        // SAFETY: a carved frame's region was published (its slot's
        // pointers stored with Release) before its index reached anyone
        // (through the free-list mutex or a table entry stored with
        // Release, loaded with Acquire); regions are freed only with the
        // core. i < the region's frames: both offsets stay inside their
        // allocations.
        unsafe {
            let hdr = &*slot.frames.load(Ordering::Acquire).add(i);
            let base = slot.base.load(Ordering::Acquire);
            (hdr, NonNull::new_unchecked(base.add(i * self.block)))
        }
    }

    /// Frame `f`'s header.
    pub(super) fn header(&self, f: u32) -> &Frame {
        debug_assert!((f as usize) < self.carved());
        // SAFETY: frames indices handed to the cache's machinery all came
        // from this core (tables and queues hold nothing else).
        unsafe { self.frame(f) }.0
    }

    /// An empty buffer of one block: a free frame, or a new one.
    pub(super) fn take(self: &Arc<Core>) -> io::Result<FrameBuf> {
        let mut free = lock(&self.free);
        let f = if let Some(f) = free.list.pop() {
            drop(free);
            f
        } else {
            let (f, new_region) = self.carve(&mut free)?;
            let spare = !free.making_spare
                && free.spare.is_none()
                && new_region.is_some()
                && free.regions < self.fill_regions;
            free.making_spare |= spare;
            drop(free);
            if let Some(NewRegion { index, prepared }) = new_region {
                if !prepared {
                    self.register(index);
                }
            }
            if spare {
                self.make_spare();
            }
            f
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        // SAFETY: f was just carved or came back to the free list.
        let (_, ptr) = unsafe { self.frame(f) };
        Ok(FrameBuf {
            core: Some(self.clone()),
            frame: f,
            ptr,
            filled: 0,
        })
    }

    /// Registers region `r` (carved from new memory, not a spare) with the
    /// context's rings, where they take it: from then on reads into its
    /// frames are `READ_FIXED`. Done outside the free list's lock, by the
    /// miss that carved the region: faulting its pages in takes a while on
    /// fresh memory, and other misses meanwhile read into the region with
    /// plain reads.
    fn register(&self, r: usize) {
        let Some(registrar) = &self.registrar else {
            return;
        };
        let slot = &self.regions[r];
        let base = slot.base.load(Ordering::Acquire);
        let len = self.block << self.region_shift;
        // Faulted in first, so that the rings' locks are not held while
        // the kernel zeroes fresh pages. Only the advice: reads may be
        // filling frames of the region already.
        let _ = crate::sys::advise_populate_write(base, len);
        // SAFETY: the region is anonymous memory, allocated for the core
        // and freed only with it, after `Drop` has dropped the
        // registration.
        let Some(guard) = (unsafe { registrar.register(base, len) }) else {
            return;
        };
        self.registered_as(slot, guard);
    }

    /// Region `slot` is registered: its frames say so from now on.
    fn registered_as(&self, slot: &RegionSlot, guard: RegionGuard) {
        let reg = guard.registered();
        if reg.owner < 1 << 48 {
            slot.fixed.store(
                reg.owner << 16 | (u64::from(reg.region) + 1),
                Ordering::Release,
            );
        }
        lock(&self.registrations).push(guard);
    }

    /// Makes the next region's memory ahead ([`Spare`]) on the runtime's
    /// blocking pool, for the miss that carves it next. Without a tokio
    /// runtime on this thread, that miss makes it as the first one did.
    fn make_spare(self: &Arc<Core>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            lock(&self.free).making_spare = false;
            return;
        };
        let job = SpareJob {
            core: Arc::downgrade(self),
            spare: None,
        };
        let len = self.block << self.region_shift;
        let registrar = self.registrar.clone();
        drop(rt.spawn_blocking(move || {
            let mut job = job;
            job.spare = Spare::make(len, registrar.as_ref()).ok();
        }));
    }

    /// A new frame, in a new region when the last is used up: the spare
    /// made ahead if there is one (registered already), else new memory
    /// (returned, for [`register`](Self::register) once the lock is
    /// released).
    fn carve(&self, free: &mut Free) -> io::Result<(u32, Option<NewRegion>)> {
        let mut new_region = None;
        let per_region = 1usize << self.region_shift;
        if free.next == per_region {
            if free.regions == self.regions.len() {
                return Err(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!(
                        "block cache: all {} frames are resident, pinned or in flight",
                        self.regions.len() << self.region_shift
                    ),
                ));
            }
            let oom = |len: usize, what: &str, e: io::Error| {
                io::Error::new(
                    e.kind(),
                    format!("block cache: cannot allocate {len} bytes of {what}: {e}"),
                )
            };
            if free.slab_left == 0 {
                let len = self.slab_frames * size_of::<Frame>();
                let mut mem = AlignedBuf::try_new_huge(len, align_of::<Frame>().max(64))
                    .map_err(|e| oom(len, "frame headers", e))?;
                free.slab_next = mem.stable_mut_ptr().cast();
                free.slab_left = self.slab_frames;
                free.mem.push(mem);
            }
            let len = per_region * self.block;
            let (mut mem, guard) = if let Some(Spare { guard, mem }) = free.spare.take() {
                (mem, guard)
            } else {
                let mem = AlignedBuf::try_new_huge(len, REGION_ALIGN)
                    .map_err(|e| oom(len, "frames", e))?;
                (mem, None)
            };
            // The allocations do not move when their `AlignedBuf`s do.
            let base = mem.stable_mut_ptr();
            if mem.is_own_mapping() && guard.is_none() {
                // Registered once carved, so pinned: a `fork` would copy it into
                // the child at once. The child gets none of it instead, as
                // it gets none of the rings' memory. (A spare was advised
                // when made.)
                let _ = crate::sys::advise_dont_fork(base.cast(), len);
            }
            free.mem.push(mem);
            let frames = free.slab_next;
            for i in 0..per_region {
                // SAFETY: the slab's next `per_region` headers (it holds a
                // multiple of `per_region`, aligned for `Frame`) are given
                // to no region yet: nothing else reaches them.
                unsafe { frames.add(i).write(Frame::new()) };
            }
            // SAFETY: as above, within the slab (or one past its end).
            free.slab_next = unsafe { frames.add(per_region) };
            free.slab_left -= per_region;
            let slot = &self.regions[free.regions];
            new_region = Some(NewRegion {
                index: free.regions,
                prepared: guard.is_some(),
            });
            if let Some(guard) = guard {
                self.registered_as(slot, guard);
            }
            slot.base.store(base, Ordering::Release);
            slot.frames.store(frames, Ordering::Release);
            free.regions += 1;
            free.next = 0;
        }
        let f = ((free.regions - 1) << self.region_shift) | free.next;
        free.next += 1;
        self.carved.fetch_add(1, Ordering::Relaxed);
        let f = u32::try_from(f).expect("frame indices fit u32 (checked at BlockCache::new)");
        Ok((f, new_region))
    }

    /// Puts an exclusive frame back on the free list.
    fn recycle(&self, f: u32) {
        let h = self.header(f);
        debug_assert_eq!(h.state.load(Ordering::Relaxed) & !GEN, EXCLUSIVE);
        h.clear_tag();
        h.freq.store(0, Ordering::Relaxed);
        lock(&self.free).list.push(f);
    }

    /// A frame the evictor claimed ([`Frame::try_claim`]) and unmapped.
    pub(super) fn free_claimed(&self, f: u32) {
        self.recycle(f);
    }

    /// Frame `f`, just unmapped from its table: recycled if no pin holds
    /// it, retired (recycled by its last unpin) otherwise.
    pub(super) fn unmapped(self: &Arc<Core>, f: u32) {
        let h = self.header(f);
        h.clear_tag();
        let mut s = h.state.load(Ordering::Relaxed);
        loop {
            if s & (EXCLUSIVE | RETIRED) != 0 {
                // Unmapped twice, or never mapped: recycling or retiring
                // it again would hand the frame, or a count of the core,
                // out twice.
                frame_state_broken(f, s, "unmapped while not mapped");
            }
            if s & PINS == 0 {
                match h.state.compare_exchange(
                    s,
                    EXCLUSIVE | s,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return self.recycle(f),
                    Err(now) => s = now,
                }
                continue;
            }
            match self.retire(h, s) {
                Ok(()) => return,
                Err(now) => s = now,
            }
        }
    }

    /// Retires frame header `h`, pinned and mapped, if its state is still
    /// `s`: `Err` with the state found otherwise.
    fn retire(self: &Arc<Core>, h: &Frame, s: u64) -> Result<(), u64> {
        // The strong count the bit holds is taken before the bit is set:
        // from then on the frame's last unpin, on any thread, may give it
        // back at once.
        let count = Arc::clone(self);
        self.retired.fetch_add(1, Ordering::Relaxed);
        match h
            .state
            .compare_exchange(s, s | RETIRED, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {
                after_retire();
                std::mem::forget(count);
                Ok(())
            }
            Err(now) => {
                self.retired.fetch_sub(1, Ordering::Relaxed);
                Err(now)
            }
        }
    }

    /// Frame `f`, retired and pinned (a flight's block), now mapped in a
    /// table (its tag set first): resident.
    pub(super) fn mapped(self: &Arc<Core>, f: u32) {
        let h = self.header(f);
        let prev = h.state.fetch_and(!RETIRED, Ordering::AcqRel);
        if prev & RETIRED == 0 || prev & PINS == 0 {
            // The count below is not this frame's to give back: giving it
            // back would free the memory under the cache later, far from
            // here. Stop where it went wrong instead.
            frame_state_broken(f, prev, "mapped while not retired and pinned");
        }
        debug_assert!(
            Arc::strong_count(self) >= 2,
            "the caller's count and the frame's"
        );
        self.retired.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the RETIRED bit held one strong count of this core (taken
        // in `FrameBuf::into_block` or `unmapped`); the caller holds
        // another (`self`), so this is not the last.
        unsafe { Arc::decrement_strong_count(Arc::as_ptr(self)) };
    }

    /// The cache is going: every frame still pinned is retired, so that it
    /// keeps the core alive until its last unpin.
    pub(super) fn close(self: &Arc<Core>) {
        self.closed.store(true, Ordering::Relaxed);
        for f in 0..self.carved() {
            let f = u32::try_from(f).expect("frame indices fit u32");
            let h = self.header(f);
            let mut s = h.state.load(Ordering::Relaxed);
            while s & (EXCLUSIVE | RETIRED) == 0 && s & PINS > 0 {
                match self.retire(h, s) {
                    Ok(()) => break,
                    Err(now) => s = now,
                }
            }
        }
    }

    /// Starts loading frame `f`'s header and the lines of `bytes` (of the
    /// block, clamped to it) into the CPU's caches, so that a hit's pin or
    /// check and the reader's touch of the bytes wait for memory once,
    /// together, rather than one after the other: a pin is a full barrier,
    /// and loads after it start only once the header has arrived.
    #[inline]
    pub(super) fn prefetch(&self, f: u32, bytes: Range<usize>) {
        // SAFETY: f came from a table entry: a carved frame.
        let (h, ptr) = unsafe { self.frame(f) };
        prefetch_lines(NonNull::from(h).cast(), 1);
        let start = bytes.start.min(self.block) & !63;
        let end = bytes.end.min(self.block);
        // SAFETY: `start <= block`: inside the frame, or one past its end.
        let from = unsafe { ptr.add(start) };
        prefetch_lines(from, end.saturating_sub(start));
    }

    /// A pin on block `(file, block)` in frame `f` if the frame holds it
    /// now (a hit), its access bit set.
    #[inline]
    pub(super) fn pin_if_holds(&self, f: u32, file: u64, block: u64) -> Option<BlockRef> {
        // SAFETY: f came from a table entry: a carved frame.
        let (h, ptr) = unsafe { self.frame(f) };
        if !h.try_pin() {
            return None;
        }
        let r = BlockRef {
            core: NonNull::from(self),
            hdr: NonNull::from(h),
            ptr,
            len: h.len.load(Ordering::Relaxed) as usize,
            frame: f,
        };
        if !h.holds(file, block) {
            return None; // `r` unpins
        }
        h.touch();
        Some(r)
    }

    /// Copies bytes `skip..` of block `(file, block)` into `dst`, if frame
    /// `f` holds it, without pinning the frame: the frame's generation and
    /// state, read before and after the copy, show that no fill began in
    /// between, so the bytes copied are the block's. Returns the bytes
    /// copied and the block's length, or `None` (what was copied is zeroed)
    /// if the frame does not hold the block or was claimed meanwhile.
    ///
    /// A pin costs two atomic read-modify-writes, each a full barrier on
    /// x86 that waits for the copy's stores; this costs two loads.
    #[inline]
    pub(super) fn copy_if_holds(
        &self,
        f: u32,
        file: u64,
        block: u64,
        skip: usize,
        dst: &mut [u8],
    ) -> Option<(usize, usize)> {
        // SAFETY: f came from a table entry: a carved frame.
        let (h, ptr) = unsafe { self.frame(f) };
        let seen = h.copy_begin(file, block)?;
        let len = (h.len.load(Ordering::Relaxed) as usize).min(self.block);
        let n = len.saturating_sub(skip).min(dst.len());
        // What a whole block leaves room for: `n` unless the block is
        // short, and known without waiting for the frame's length.
        let room = self.block.saturating_sub(skip).min(dst.len());
        // SAFETY: `n <= room` (`len <= block`), and `skip + n <= len <=
        // block`: inside the frame, whose region lives as long as the core
        // (`self`). The bytes may be being written meanwhile, by the kernel
        // only: a frame's bytes are written only while it is exclusive, by
        // reads into a `FrameBuf` (owned reads: io_uring or `pread`, never
        // a copy by this process), or at allocation, before its index is
        // published. `copy_still` below discards any such copy.
        unsafe { copy_shared(ptr.as_ptr().add(skip), &mut dst[..room], n) };
        if !h.copy_still(seen) {
            // What was copied may be another block's bytes: none of them
            // stay in the caller's buffer.
            dst[..n].fill(0);
            return None;
        }
        h.touch();
        Some((n, len))
    }

    /// Frames carved so far.
    pub(super) fn carved(&self) -> usize {
        self.carved.load(Ordering::Relaxed)
    }

    /// Frames reads are filling.
    pub(super) fn taken(&self) -> usize {
        self.taken.load(Ordering::Relaxed)
    }

    /// Frames pinned and in no table.
    pub(super) fn retired(&self) -> usize {
        self.retired.load(Ordering::Relaxed)
    }
}

impl Drop for Core {
    /// The last strong count is gone: the cache was dropped, and no frame
    /// is pinned or being filled (each would hold a count). Anything else
    /// means a count was given back twice and the memory is about to be
    /// freed under a live reference: abort rather than let it be used.
    fn drop(&mut self) {
        let (closed, retired, taken) = (
            *self.closed.get_mut(),
            *self.retired.get_mut(),
            *self.taken.get_mut(),
        );
        if !closed || retired != 0 || taken != 0 {
            eprintln!(
                "uring-positioned-io: block cache memory freed while in use \
                 (cache dropped: {closed}, frames pinned: {retired}, filling: {taken}); aborting"
            );
            std::process::abort();
        }
        // Unregistered before `free` (the regions' memory) goes.
        self.registrations
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

/// One frame being filled by a read: exclusive to it; back on the free
/// list when dropped, or a block ([`into_block`](Self::into_block)). A read
/// fills it from `filled` on (it is an owned buffer: a read future dropped
/// while the kernel holds it parks it in the context until the kernel is
/// done, and only then does it come back; its `Arc` keeps the memory).
pub(super) struct FrameBuf {
    core: Option<Arc<Core>>,
    frame: u32,
    ptr: NonNull<u8>,
    filled: usize,
}

// SAFETY: the buffer owns its frame exclusively (EXCLUSIVE, no pin can be
// taken on it), and the core it points into is kept alive by its `Arc`.
unsafe impl Send for FrameBuf {}
// SAFETY: `&FrameBuf` reads nothing through the pointer but by `&self`
// methods that read the bytes it owns.
unsafe impl Sync for FrameBuf {}

impl FrameBuf {
    fn core(&self) -> &Arc<Core> {
        self.core
            .as_ref()
            .expect("a frame buffer has its core until dropped")
    }

    /// The bytes read so far.
    pub(super) fn filled(&self) -> usize {
        self.filled
    }

    /// The frame, holding the bytes read: a block, pinned once and in no
    /// table yet (`RETIRED`), so that dropping every pin recycles it.
    pub(super) fn into_block(mut self) -> BlockRef {
        let core = self.core.take().expect("a frame buffer has its core");
        // SAFETY: the frame was carved by this core.
        let (h, ptr) = unsafe { core.frame(self.frame) };
        h.clear_tag();
        h.len.store(
            u32::try_from(self.filled).expect("a block fits u32 (at most 1 GiB)"),
            Ordering::Relaxed,
        );
        // Release: the bytes read (the kernel's writes, seen by this
        // thread when the read completed) before any pin. A new generation:
        // a copy made without a pin before the frame was refilled fails its
        // check (`Core::copy_if_holds`).
        let s = h.state.load(Ordering::Relaxed);
        debug_assert_eq!(s & !GEN, EXCLUSIVE);
        let generation = s.wrapping_add(1 << GEN_SHIFT) & GEN;
        h.state.store(generation | RETIRED | 1, Ordering::Release);
        core.retired.fetch_add(1, Ordering::Relaxed);
        core.taken.fetch_sub(1, Ordering::Relaxed);
        let r = BlockRef {
            core: NonNull::from(&*core),
            hdr: NonNull::from(h),
            ptr,
            len: self.filled,
            frame: self.frame,
        };
        // The RETIRED bit now holds the buffer's strong count.
        std::mem::forget(core);
        r
    }
}

impl Drop for FrameBuf {
    fn drop(&mut self) {
        if let Some(core) = self.core.take() {
            core.taken.fetch_sub(1, Ordering::Relaxed);
            core.recycle(self.frame);
        }
    }
}

// SAFETY: the frame's `block` bytes stay where they are (the region's
// allocation never moves) and allocated while this buffer, which holds an
// `Arc` of the core, lives; no one else reads or writes them (the frame
// is exclusive); all of them are initialised (zero-filled at allocation),
// `filled <= block` always holds and only `set_init` (through `&mut self`)
// raises it.
unsafe impl IoBufMut for FrameBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.filled
    }
    fn bytes_total(&self) -> usize {
        self.core().block
    }
    unsafe fn set_init(&mut self, pos: usize) {
        self.filled = self.filled.max(pos.min(self.core().block));
    }
    fn registered(&self) -> Option<Registered> {
        self.core().registered(self.frame)
    }
}

/// A cached block: its valid bytes (`Deref<Target = [u8]>`; shorter than
/// the block size only for the block at the end of the file, and empty
/// beyond it). A pin on the frame that holds it: cheap to clone (the
/// frame's pin count), `'static`, `Send` and `Sync`; the bytes stay valid
/// and unchanged while it lives, whatever the cache does meanwhile (a
/// pinned frame is never evicted or reused: a change unmaps it, and it is
/// recycled when its last pin goes). With the `bytes` feature it converts
/// into `bytes::Bytes` without copying.
///
/// ```
/// # use std::io::Write;
/// use uring_positioned_io::{BlockCache, CacheOptions, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(&[7u8; 5000])?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// let cache = BlockCache::new(&ctx, CacheOptions::default())?;
/// let block = cache.get(0, 1).await?; // bytes 4096..5000: the end of the file
/// assert_eq!((block.len(), block[0]), (904, 7));
/// let again = block.clone(); // the same bytes, no copy
/// assert_eq!(again.as_ptr(), block.as_ptr());
/// # Ok(())
/// # })
/// # }
/// ```
pub struct BlockRef {
    core: NonNull<Core>,
    hdr: NonNull<Frame>,
    ptr: NonNull<u8>,
    len: usize,
    frame: u32,
}

// SAFETY: a BlockRef is a pin: while it lives the frame is neither written
// nor reused (writes need the frame exclusive, which needs no pin), and the
// core (headers and memory) lives (the cache's own `Arc`, or the strong
// count a retired frame holds: `Core::close` retires every pinned frame
// when the cache goes). It gives only shared access to the bytes.
unsafe impl Send for BlockRef {}
// SAFETY: as above.
unsafe impl Sync for BlockRef {}

impl BlockRef {
    /// The frame holding the block.
    pub(super) fn frame(&self) -> u32 {
        self.frame
    }

    fn header(&self) -> &Frame {
        // SAFETY: the pin keeps the core, and so the header, alive.
        unsafe { self.hdr.as_ref() }
    }
}

impl Clone for BlockRef {
    fn clone(&self) -> BlockRef {
        // Relaxed, as an `Arc`'s clone: this pin already holds the frame.
        let prev = self.header().state.fetch_add(1, Ordering::Relaxed);
        if prev & PINS >= PINS / 2 {
            pins_overflow();
        }
        BlockRef {
            core: self.core,
            hdr: self.hdr,
            ptr: self.ptr,
            len: self.len,
            frame: self.frame,
        }
    }
}

impl Drop for BlockRef {
    fn drop(&mut self) {
        let h = self.header();
        let prev = h.state.fetch_sub(1, Ordering::Release);
        if prev & PINS != 1 || prev & RETIRED == 0 {
            // Not the last pin, or the frame is resident (the cache's `Arc`
            // keeps the core): nothing more to touch.
            return;
        }
        // The last pin of a retired frame: recycle it, unless a reader
        // pinned it again from a stale table entry (its unpin does it).
        let generation = prev & GEN;
        if h.state
            .compare_exchange(
                RETIRED | generation,
                EXCLUSIVE | generation,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            // SAFETY: the RETIRED bit held a strong count of the core
            // (taken with `forget` when it was set), now ours to give back.
            let core = unsafe { Arc::from_raw(self.core.as_ptr().cast_const()) };
            core.retired.fetch_sub(1, Ordering::Relaxed);
            core.recycle(self.frame);
        }
    }
}

impl Deref for BlockRef {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the frame's first `len` bytes are inside its region, which
        // the pin keeps alive, initialised (zero-filled, then written by a
        // read), and not written while any pin holds the frame.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for BlockRef {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for BlockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockRef")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
thread_local! {
    /// What a test runs where a frame has just been retired, on the thread
    /// that retired it: a last unpin there is one from another thread in
    /// the same instant.
    static AFTER_RETIRE: std::cell::Cell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::Cell::new(None) };
}

/// The test hook of [`Core::retire`] (nothing outside tests).
#[inline]
fn after_retire() {
    #[cfg(test)]
    if let Some(f) = AFTER_RETIRE.take() {
        f();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `core` holding block `(file, block)`, resident and
    /// unpinned, as a miss leaves it.
    fn resident(core: &Arc<Core>, file: u64, block: u64, byte: u8) -> u32 {
        let mut buf = core.take().unwrap();
        let f = buf.frame;
        // SAFETY: the buffer owns the frame (exclusive).
        unsafe { std::ptr::write_bytes(buf.ptr.as_ptr(), byte, core.block) };
        buf.filled = core.block;
        let b = buf.into_block();
        core.header(f).set_tag(file, block);
        core.mapped(f);
        drop(b);
        f
    }

    /// A copy made without a pin is accepted only if the frame was not
    /// claimed meanwhile, even if it was refilled with the same block.
    #[test]
    fn a_refill_during_a_copy_is_seen() {
        let core = Arc::new(Core::new(4096, 4, 4, None));
        let f = resident(&core, 1, 7, 0xaa);
        let h = core.header(f);
        let mut dst = vec![0u8; 4096];
        assert_eq!(core.copy_if_holds(f, 1, 7, 0, &mut dst), Some((4096, 4096)));
        assert!(dst.iter().all(|&b| b == 0xaa));
        assert_eq!(
            core.copy_if_holds(f, 1, 8, 0, &mut dst),
            None,
            "another block"
        );

        // Claimed (evicted) during the copy.
        let seen = h.copy_begin(1, 7).unwrap();
        assert!(h.try_claim());
        assert!(!h.copy_still(seen));
        assert_eq!(core.copy_if_holds(f, 1, 7, 0, &mut dst), None, "exclusive");
        core.free_claimed(f);

        // Refilled with the same block, in the same frame, during the copy.
        let f2 = resident(&core, 1, 7, 0xbb);
        assert_eq!(f2, f, "the freed frame is reused");
        let seen = h.copy_begin(1, 7).unwrap();
        assert!(h.copy_still(seen));
        assert!(h.try_claim());
        core.free_claimed(f);
        assert_eq!(resident(&core, 1, 7, 0xcc), f);
        assert!(h.copy_still(h.copy_begin(1, 7).unwrap()));
        assert!(!h.copy_still(seen), "the generation moved on");

        // Pins and retirement do not change the bytes: a copy stays valid.
        let seen = h.copy_begin(1, 7).unwrap();
        let pin = core.pin_if_holds(f, 1, 7).unwrap();
        assert!(h.copy_still(seen));
        core.unmapped(f);
        assert!(h.copy_still(seen), "retired while pinned");
        drop(pin);
        assert!(!h.copy_still(seen), "recycled by its last unpin");
        core.close();
    }

    /// A frame's last pin, dropped (on any thread) the moment the frame is
    /// retired, gives back the strong count the retirement holds, which
    /// must already be there: the core's own count, the only other one,
    /// stays.
    #[test]
    fn the_last_unpin_just_after_a_retirement_keeps_the_core() {
        for close in [false, true] {
            let core = Arc::new(Core::new(4096, 4, 4, None));
            let f = resident(&core, 1, 7, 0xaa);
            let pin = core.pin_if_holds(f, 1, 7).unwrap();
            AFTER_RETIRE.set(Some(Box::new(move || drop(pin))));
            if close {
                core.close();
            } else {
                core.unmapped(f);
            }
            assert!(AFTER_RETIRE.take().is_none(), "the pin went there");
            assert_eq!((Arc::strong_count(&core), core.retired()), (1, 0));
            let h = core.header(f);
            assert_eq!(
                h.state.load(Ordering::Relaxed) & !GEN,
                EXCLUSIVE,
                "recycled"
            );
            assert_eq!(core.take().unwrap().frame, f, "and free");
            core.close();
        }
    }
}
