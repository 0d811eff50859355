//! The per-ring bounce-buffer pool: [`BufferPool`].

use std::fmt;
use std::io;

use crate::buf::{AlignedBuf, BOUNCE_ALIGN};

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
        unsafe { self.region.storage_ptr().add(index * self.size) }
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
    }
}
