//! [`AlignedBuf`]: aligned heap buffers for `O_DIRECT`, from the global
//! allocator or, for huge ones, mappings of their own backed by
//! transparent huge pages.

use std::alloc::{self, Layout};
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::IoBufMut;
use crate::sys;

/// A heap buffer with a chosen alignment, as `O_DIRECT` reads require
/// (usually 512 or 4096 bytes): `capacity()` bytes of aligned storage, of
/// which the first `len()` are initialised and visible (it derefs to them),
/// like a `Vec<u8>` that cannot grow.
///
/// An owned read fills it from its start, up to its `capacity()`, and
/// raises its `len()` to the count if shorter (never lowers it), as for a
/// `Vec`. [`with_capacity`](Self::with_capacity) makes an empty one
/// (uninitialised: its `len()` after a read is the count);
/// [`new`](Self::new) a zeroed, full one, also a plain `&mut [u8]`.
/// A window [`slice`](IoBufMut::slice) reads part of it.
///
/// [`new_huge`](Self::new_huge) makes a buffer that can be backed by
/// transparent huge pages, for large `O_DIRECT` reads (see there).
///
/// ```
/// # use std::io::Write;
/// use uring_positioned_io::{AlignedBuf, UringContext};
///
/// # fn main() -> std::io::Result<()> {
/// let mut buf = AlignedBuf::try_new(8192, 4096)?;
/// assert_eq!(buf.as_ptr() as usize % 4096, 0);
/// buf[..4].copy_from_slice(b"head");
/// assert!(AlignedBuf::try_new(16, 3).is_err()); // not a power of two
///
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(&[9u8; 10_000])?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// let block = AlignedBuf::with_capacity(4096, 4096);
/// assert_eq!((block.len(), block.capacity()), (0, 4096));
/// let (n, block) = ctx.read_owned(0, 4096, block).await;
/// assert_eq!((n?, block.len(), block[0]), (4096, 4096, 9));
/// // Reuse: read again from its start, into the same storage.
/// let (n, mut block) = ctx.read_owned(0, 8192, block).await;
/// assert_eq!((n?, block.len()), (1808, 4096)); // to the end of the file
/// block.truncate(1808); // keep only the bytes just read
/// # Ok(())
/// # })
/// # }
/// ```
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    /// Initialised (visible) bytes.
    len: usize,
    /// Allocated bytes.
    cap: usize,
    align: usize,
    /// A mapping of its own (`map`), not the global allocator's.
    mapped: bool,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to `align`: a full buffer
    /// (`len() == capacity() == len`).
    ///
    /// # Panics
    ///
    /// If `align` is not a power of two, or on allocation failure (like `Vec`).
    /// [`AlignedBuf::try_new`] returns an error instead.
    #[must_use]
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        Self::unwrap(Self::try_new(len, align), len, align)
    }

    /// Allocates `len` zeroed bytes aligned to `align`, as
    /// [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `align` is not a power of two or `len` is too large
    /// for any allocation; `OutOfMemory` if the allocator says no.
    pub fn try_new(len: usize, align: usize) -> io::Result<AlignedBuf> {
        Self::allocate(len, align, true, false).map(|mut b| {
            b.len = len;
            b
        })
    }

    /// Allocates `capacity` bytes aligned to `align`, not initialised: an
    /// empty buffer (`len() == 0`) for owned reads to fill.
    ///
    /// # Panics
    ///
    /// If `align` is not a power of two, or on allocation failure (like
    /// `Vec`). [`AlignedBuf::try_with_capacity`] returns an error instead.
    #[must_use]
    pub fn with_capacity(capacity: usize, align: usize) -> AlignedBuf {
        Self::unwrap(Self::try_with_capacity(capacity, align), capacity, align)
    }

    /// Allocates `capacity` bytes aligned to `align`, as
    /// [`with_capacity`](Self::with_capacity).
    ///
    /// # Errors
    ///
    /// As [`try_new`](Self::try_new).
    pub fn try_with_capacity(capacity: usize, align: usize) -> io::Result<AlignedBuf> {
        Self::allocate(capacity, align, false, false)
    }

    fn unwrap(res: io::Result<AlignedBuf>, len: usize, align: usize) -> AlignedBuf {
        match res {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::OutOfMemory => {
                alloc::handle_alloc_error(Self::layout(len, align).expect("valid layout"))
            }
            Err(e) => panic!("AlignedBuf of {len} bytes aligned to {align}: {e}"),
        }
    }

    /// Allocates `len` zeroed bytes aligned to `align`, as
    /// [`new`](Self::new), and where `len` is at least 2 MiB as a memory
    /// mapping of its own, aligned to 2 MiB (or to `align` if larger) and
    /// advised `MADV_HUGEPAGE`. Where transparent huge pages are enabled
    /// (`always` or `madvise`), its memory is then physically contiguous in
    /// 2 MiB pieces, and an `O_DIRECT` read into it reaches the device in a
    /// few large segments instead of one per 4 KiB page (the
    /// [design document](crate::design), "Scans"). Scans of `O_DIRECT` files use it.
    ///
    /// The cost: four system calls to make and one to free it, and the
    /// first touch of each 2 MiB may wait for the kernel to find (or
    /// compact) a free huge page (with THP `defrag` at its default,
    /// `madvise`). Allocate such buffers once and reuse them.
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new); [`try_new_huge`](Self::try_new_huge) returns
    /// an error instead.
    #[must_use]
    pub fn new_huge(len: usize, align: usize) -> AlignedBuf {
        Self::unwrap(Self::try_new_huge(len, align), len, align)
    }

    /// [`new_huge`](Self::new_huge), returning an error instead of
    /// panicking.
    ///
    /// # Errors
    ///
    /// As [`try_new`](Self::try_new).
    pub fn try_new_huge(len: usize, align: usize) -> io::Result<AlignedBuf> {
        Self::allocate(len, align, true, true).map(|mut b| {
            b.len = len;
            b
        })
    }

    /// An empty buffer with `cap` bytes of storage, zeroed or not; its own
    /// huge-page mapping if `huge` and it is large enough.
    fn allocate(cap: usize, align: usize, zeroed: bool, huge: bool) -> io::Result<AlignedBuf> {
        let layout = Self::layout(cap, align)?;
        if huge && cap >= HUGE {
            return Self::map(cap, align);
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe {
            if zeroed {
                alloc::alloc_zeroed(layout)
            } else {
                alloc::alloc(layout)
            }
        };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("could not allocate a buffer of {cap} bytes"),
            )
        })?;
        Ok(AlignedBuf {
            ptr,
            len: 0,
            cap,
            align,
            mapped: false,
        })
    }

    /// A huge buffer of at least [`HUGE`] bytes: its own zeroed anonymous
    /// mapping, aligned to [`HUGE`] and advised `MADV_HUGEPAGE` (see
    /// [`new_huge`](Self::new_huge)).
    fn map(cap: usize, align: usize) -> io::Result<AlignedBuf> {
        let oom = || {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("could not map a buffer of {cap} bytes"),
            )
        };
        let len = mapped_len(cap);
        // Aligned to 2 MiB, or to `align` where that is more.
        let a = align.max(HUGE);
        let span = len.checked_add(a).ok_or_else(oom)?;
        let raw = sys::mmap_anonymous(span).map_err(|_| oom())?;
        let start = raw as usize;
        let base = start.next_multiple_of(a);
        let (head, tail) = (base - start, span - (base - start) - len);
        // SAFETY: [start, base) and [base + len, start + span) are the
        // unaligned ends of the mapping made above, which nothing uses;
        // unmapping them leaves exactly [base, base + len) mapped.
        unsafe {
            if head > 0 {
                let _ = sys::munmap(raw, head);
            }
            if tail > 0 {
                let _ = sys::munmap((base + len) as *mut libc::c_void, tail);
            }
        }
        // Advice only: without THP it fails or does nothing, harmlessly.
        let _ = sys::advise_huge_pages(base as *mut libc::c_void, len);
        let ptr = NonNull::new(base as *mut u8).ok_or_else(oom)?;
        Ok(AlignedBuf {
            ptr,
            len: 0,
            cap,
            align,
            mapped: true,
        })
    }

    fn layout(len: usize, align: usize) -> io::Result<Layout> {
        Layout::from_size_align(len.max(1), align).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a buffer of {len} bytes aligned to {align}: the alignment must be a power of two and the size at most isize::MAX rounded down to it"
                ),
            )
        })
    }

    /// Whether the storage is a mapping of its own (see
    /// [`new_huge`](Self::new_huge)), not memory of the allocator's.
    #[cfg_attr(not(feature = "cache"), allow(dead_code))]
    pub(crate) fn is_own_mapping(&self) -> bool {
        self.mapped
    }

    /// Start of the storage, to write through from shared access: the
    /// allocation's own pointer, not one made from a reference (the ring's
    /// bounce-buffer pool hands out pieces of one buffer this way).
    pub(crate) fn storage_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The buffer's alignment in bytes.
    #[must_use]
    pub fn align(&self) -> usize {
        self.align
    }

    /// Bytes of storage (what an owned read fills, from the start, at most).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The initialised bytes (also what it derefs to).
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        self
    }

    /// The initialised bytes, mutable.
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }

    /// Makes the buffer empty (`len() == 0`), keeping its storage: after
    /// the next owned read its `len()` is that read's count.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Shortens the buffer to `len` bytes (no effect if it is not longer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Appends as much of `data` as the capacity holds; how many bytes.
    pub(crate) fn extend_from_slice(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.cap - self.len);
        // SAFETY: `len + n <= cap`: the destination is inside the
        // allocation, which `data` (a shared borrow) cannot overlap while
        // `self` is borrowed mutably.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(self.len), n);
        }
        self.len += n;
        n
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for `cap` bytes owned by self, of which the
        // first `len` (<= cap) are initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: `map` made exactly [ptr, ptr + mapped_len(cap)) a
            // mapping of its own, which this buffer alone owns.
            unsafe {
                let _ = sys::munmap(self.ptr.as_ptr().cast(), mapped_len(self.cap));
            }
            return;
        }
        // SAFETY: allocated in `allocate` with exactly this layout.
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.cap.max(1), self.align),
            );
        }
    }
}

/// Huge buffers of at least this many bytes (and alignment at most this)
/// are mapped by [`AlignedBuf::map`]: the size of an x86-64 transparent
/// huge page.
const HUGE: usize = 2 << 20;

/// The length of the mapping of a mapped buffer of `cap` bytes: whole pages.
fn mapped_len(cap: usize) -> usize {
    let page = sys::page_size().unwrap_or(4096).clamp(4096, HUGE);
    cap.next_multiple_of(page)
}

#[allow(clippy::missing_fields_in_debug, reason = "the pointer says nothing")]
impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .field("align", &self.align)
            .finish()
    }
}

// SAFETY: AlignedBuf owns a heap allocation of `cap` bytes that lives until
// drop and never moves; its first `len` bytes are initialised, and
// `set_init` only grows `len`, up to `cap`.
unsafe impl IoBufMut for AlignedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn bytes_total(&self) -> usize {
        self.cap
    }
    unsafe fn set_init(&mut self, pos: usize) {
        if pos > self.len {
            self.len = pos.min(self.cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Huge buffers of 2 MiB and more are their own mappings, 2 MiB-aligned,
    /// zeroed, and given back whole: many allocations leave the address
    /// space as it was. An alignment above 2 MiB, or less than 2 MiB, takes
    /// the allocator; so do plain buffers of any size.
    #[test]
    fn big_buffers_are_huge_page_mappings() {
        fn vm_kib() -> u64 {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            let l = s.lines().find(|l| l.starts_with("VmSize:")).unwrap();
            l.split_whitespace().nth(1).unwrap().parse().unwrap()
        }
        let _alone = crate::util::address_space_lock();
        for &(len, align) in &[
            (HUGE, 4096),
            (HUGE + 1, 512),
            (3 * HUGE + 4097, 4096),
            (HUGE, HUGE),
            (HUGE, 2 * HUGE),
            (HUGE + 1, 64 << 20),
        ] {
            let mut b = AlignedBuf::new_huge(len, align);
            // Larger alignments are mapped too (the global allocator
            // zero-filled them up front).
            assert!(b.mapped, "{len} / {align}");
            assert_eq!(b.as_ptr() as usize % align.max(HUGE), 0, "{len} / {align}");
            assert_eq!((b.len(), b.capacity()), (len, len));
            assert!(b.iter().all(|&x| x == 0));
            b[len - 1] = 7;
            b[0] = 9;
            assert_eq!((b[0], b[len - 1]), (9, 7));
            assert!(!AlignedBuf::new(len, align).mapped);
        }
        assert!(!AlignedBuf::new_huge(HUGE - 4096, 4096).mapped);
        // Absurd sizes and alignments are errors, not panics.
        let e = AlignedBuf::try_new_huge(usize::MAX, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = AlignedBuf::try_new_huge(isize::MAX as usize - 4095, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        let e = AlignedBuf::try_new_huge(HUGE, 3).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // Other tests' threads (their stacks, their malloc arenas) grow the
        // address space too; a leak grows it on every try, by over a GiB.
        let grown: Vec<u64> = (0..3)
            .map(|_| {
                let before = vm_kib();
                for _ in 0..2000 {
                    drop(AlignedBuf::new_huge(3 * HUGE + 4097, 4096));
                }
                vm_kib().saturating_sub(before)
            })
            .collect();
        assert!(
            grown.iter().any(|&g| g < 64 << 10),
            "address space grew by {grown:?} KiB"
        );
    }

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        for &(len, align) in &[(0, 512), (1, 4096), (8192, 4096), (100, 64)] {
            let b = AlignedBuf::new(len, align);
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert_eq!((b.len(), b.capacity()), (len, len));
            assert!(b.iter().all(|&x| x == 0));
            let mut e = AlignedBuf::with_capacity(len, align);
            assert_eq!(e.stable_ptr() as usize % align, 0);
            assert_eq!((e.len(), e.capacity()), (0, len));
            // SAFETY: nothing: no byte is claimed initialised.
            unsafe { e.set_init(0) };
            assert!(e.is_empty());
        }
    }

    #[test]
    fn aligned_buf_len_grows_only_within_capacity() {
        let mut b = AlignedBuf::new(100, 64);
        b.truncate(10);
        assert_eq!((b.len(), b.bytes_init(), b.bytes_total()), (10, 10, 100));
        // SAFETY: every byte of `new` is zeroed, so initialised.
        unsafe { b.set_init(5) };
        assert_eq!(b.len(), 10, "set_init never shrinks");
        // SAFETY: as above.
        unsafe { b.set_init(60) };
        assert_eq!(b.len(), 60);
        b.clear();
        assert!(b.as_slice().is_empty());
    }

    #[test]
    fn bad_sizes_and_alignments_are_errors() {
        let e = AlignedBuf::try_new(usize::MAX - 4095, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = AlignedBuf::try_new(16, 3).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
