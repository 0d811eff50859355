//! Buffers the kernel may write into: the [`IoBufMut`] contract for owned
//! buffers, [`AlignedBuf`] for `O_DIRECT`, and the per-ring bounce-buffer pool.

use std::alloc::{self, Layout};
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A buffer that can be handed to the kernel by value for a zero-copy read
/// ([`UringContext::read_owned`](crate::UringContext::read_owned)).
///
/// While a read is in flight the crate owns the buffer: if the read future is
/// dropped, the buffer is parked inside the context until the kernel has
/// finished with it, and only then dropped.
///
/// # Safety
///
/// Implementors promise that `stable_mut_ptr` returns a pointer valid for
/// writes of `bytes_total()` bytes, and that the pointed-to memory neither
/// moves nor is freed while the value is alive, *even when the value itself
/// is moved* (heap storage, not inline storage).
///
/// # Example
///
/// A page-cache block type that reads straight into its heap storage:
///
/// ```
/// use uring_positioned_io::{IoBufMut, UringContext};
///
/// struct Block {
///     id: u64,
///     bytes: Box<[u8]>,
/// }
///
/// // SAFETY: the bytes live in the boxed slice's heap block, which does not
/// // move when `Block` moves and lives exactly as long as it does.
/// unsafe impl IoBufMut for Block {
///     fn stable_mut_ptr(&mut self) -> *mut u8 {
///         self.bytes.as_mut_ptr()
///     }
///     fn bytes_total(&self) -> usize {
///         self.bytes.len()
///     }
/// }
///
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
/// let block = Block { id: 7, bytes: vec![0u8; 4096].into_boxed_slice() };
/// let (n, block) = ctx.read_owned(0, 0, block).await;
/// assert_eq!((n?, block.id), (0, 7)); // empty file: nothing read
/// # Ok(())
/// # })
/// # }
/// ```
pub unsafe trait IoBufMut: Unpin + Send + 'static {
    /// Start of the writable region.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// Length of the writable region in bytes.
    fn bytes_total(&self) -> usize;
}

// SAFETY: a Vec's elements live on the heap; moving the Vec moves only its
// (ptr, len, cap) header, so the pointer stays valid for `len` bytes.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: a boxed slice is a heap allocation that does not move with the box.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: AlignedBuf owns a heap allocation of `len` bytes that lives until drop.
unsafe impl IoBufMut for AlignedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

/// A zero-initialised heap buffer with a chosen alignment, as `O_DIRECT`
/// reads require (usually 512 or 4096 bytes).
///
/// ```
/// use uring_positioned_io::AlignedBuf;
///
/// let mut buf = AlignedBuf::try_new(8192, 4096)?;
/// assert_eq!(buf.as_ptr() as usize % 4096, 0);
/// buf[..4].copy_from_slice(b"head");
/// assert!(AlignedBuf::try_new(16, 3).is_err()); // not a power of two
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to `align`.
    ///
    /// # Panics
    ///
    /// If `align` is not a power of two, or on allocation failure (like `Vec`).
    /// [`AlignedBuf::try_new`] returns an error instead.
    #[must_use]
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        match Self::try_new(len, align) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::OutOfMemory => {
                alloc::handle_alloc_error(Self::layout(len, align).expect("valid layout"))
            }
            Err(e) => panic!("AlignedBuf::new({len}, {align}): {e}"),
        }
    }

    /// Allocates `len` zeroed bytes aligned to `align`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `align` is not a power of two or `len` is too large
    /// for any allocation; `OutOfMemory` if the allocator says no.
    pub fn try_new(len: usize, align: usize) -> io::Result<AlignedBuf> {
        let layout = Self::layout(len, align)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("could not allocate a buffer of {len} bytes"),
            )
        })?;
        Ok(AlignedBuf { ptr, len, align })
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

    /// The buffer's alignment in bytes.
    #[must_use]
    pub fn align(&self) -> usize {
        self.align
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid, initialised (zeroed) memory of `len` bytes owned by self.
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
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len.max(1), self.align),
            );
        }
    }
}

#[allow(clippy::missing_fields_in_debug, reason = "the pointer says nothing")]
impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align)
            .finish()
    }
}

/// Page alignment of every bounce buffer, so borrowed reads also work on
/// files opened with `O_DIRECT`.
pub(crate) const BOUNCE_ALIGN: usize = 4096;

/// One contiguous, page-aligned region cut into `count` bounce buffers of
/// `size` bytes. The region belongs to a ring and is freed only after the
/// ring has reaped every operation (see `Ring::drop`). Which buffer is free
/// is tracked by the ring's locked state, not here.
pub(crate) struct BufferPool {
    region: AlignedBuf,
    size: usize,
    count: usize,
}

impl BufferPool {
    /// `count` buffers of `size` bytes rounded up to 4 KiB. The builder has
    /// already bounded both (see `Builder::buffer_pool`); the arithmetic is
    /// checked all the same, and an allocation failure is an error.
    pub(crate) fn new(count: usize, size: usize) -> io::Result<BufferPool> {
        let too_big = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("buffer_pool({count}, {size}): the pool size overflows"),
            )
        };
        let size = size
            .max(1)
            .checked_next_multiple_of(BOUNCE_ALIGN)
            .ok_or_else(too_big)?;
        let total = size.checked_mul(count).ok_or_else(too_big)?;
        Ok(BufferPool {
            region: AlignedBuf::try_new(total, BOUNCE_ALIGN)?,
            size,
            count,
        })
    }

    pub(crate) fn buf_size(&self) -> usize {
        self.size
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Pointer to buffer `index`.
    pub(crate) fn ptr(&self, index: usize) -> *mut u8 {
        assert!(index < self.count, "bounce buffer index out of range");
        // SAFETY: index < count, so the offset stays inside the region.
        unsafe { self.region.ptr.as_ptr().add(index * self.size) }
    }

    /// The iovecs to register with the ring, one per buffer.
    pub(crate) fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.count)
            .map(|i| libc::iovec {
                iov_base: self.ptr(i).cast(),
                iov_len: self.size,
            })
            .collect()
    }
}

#[allow(
    clippy::missing_fields_in_debug,
    reason = "the region is summed up by count and size"
)]
impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("count", &self.count)
            .field("size", &self.size)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        for &(len, align) in &[(0, 512), (1, 4096), (8192, 4096), (100, 64)] {
            let b = AlignedBuf::new(len, align);
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn pool_buffers_are_disjoint_and_page_aligned() {
        let p = BufferPool::new(3, 5000).unwrap();
        assert_eq!(p.buf_size(), 8192);
        for i in 0..3 {
            assert_eq!(p.ptr(i) as usize % BOUNCE_ALIGN, 0);
        }
        assert_eq!(p.ptr(1) as usize - p.ptr(0) as usize, 8192);
        assert_eq!(p.iovecs().len(), 3);
    }

    #[test]
    fn sizes_that_overflow_are_errors() {
        for (count, size) in [
            (usize::MAX / 4096 + 2, 4096),
            (2, usize::MAX - 10),
            (1 << 62, 1 << 12),
        ] {
            let e = BufferPool::new(count, size).expect_err("must not wrap");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
        let e = AlignedBuf::try_new(usize::MAX - 4095, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = AlignedBuf::try_new(16, 3).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
