//! A heap block aligned to 4096 bytes, usable for O_DIRECT reads by every engine.

use crate::verify::BLOCK;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// One 4 KiB, 4 KiB-aligned, owned, fully initialised buffer.
pub struct AlignedBlock {
    ptr: NonNull<u8>,
}

// SAFETY: the block owns its allocation exclusively; it is plain bytes.
unsafe impl Send for AlignedBlock {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBlock {}

fn layout() -> Layout {
    Layout::from_size_align(BLOCK, BLOCK).expect("valid layout")
}

impl AlignedBlock {
    pub fn new() -> Self {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout()) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout()));
        AlignedBlock { ptr }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Default for AlignedBlock {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for AlignedBlock {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: BLOCK initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), BLOCK) }
    }
}

impl std::ops::DerefMut for AlignedBlock {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: BLOCK initialised bytes owned exclusively by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), BLOCK) }
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout()) }
    }
}

// SAFETY: the pointer is stable for the life of the value (heap allocation
// that never moves), BLOCK bytes long and always initialised.
unsafe impl tokio_uring::buf::IoBuf for AlignedBlock {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        BLOCK
    }
    fn bytes_total(&self) -> usize {
        BLOCK
    }
}

// SAFETY: as above; all bytes are always initialised so set_init is a no-op.
unsafe impl tokio_uring::buf::IoBufMut for AlignedBlock {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    unsafe fn set_init(&mut self, _pos: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn aligned() {
        let mut b = AlignedBlock::new();
        assert_eq!(b.as_mut_ptr() as usize % BLOCK, 0);
        assert_eq!(b.len(), BLOCK);
        assert!(b.iter().all(|&x| x == 0));
    }
}
