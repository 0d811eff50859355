//! The hook through which a context tells its block caches that bytes of a
//! file changed ([`Listeners`], kept in `Inner`): a write or `fallocate`
//! through the context before its future resolves (`ops::Core`), and
//! `unregister_file` (the whole file).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, Weak};

use crate::id::FileId;

/// What is told of a change: the registration that changed (a checked id,
/// `FileEntry::id`) and the byte range `offset..offset + len` (saturating;
/// `len` `u64::MAX`: to the end of the file, whatever its size).
pub(crate) trait Invalidate: Send + Sync {
    fn invalidate(&self, file: FileId, offset: u64, len: u64);
}

/// The block caches of a context. A context without one pays one relaxed
/// load per write.
#[derive(Default)]
pub(crate) struct Listeners {
    any: AtomicBool,
    list: RwLock<Vec<Weak<dyn Invalidate>>>,
}

impl Listeners {
    /// Adds a listener; listeners already dropped are forgotten here.
    pub(crate) fn add(&self, listener: Weak<dyn Invalidate>) {
        let mut list = self
            .list
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        list.retain(|l| l.strong_count() > 0);
        list.push(listener);
        self.any.store(true, Ordering::Release);
    }

    /// Tells every live listener that `len` bytes at `offset` of `file`
    /// changed (or may have).
    pub(crate) fn notify(&self, file: FileId, offset: u64, len: u64) {
        if !self.any.load(Ordering::Acquire) || len == 0 {
            return;
        }
        let list = self
            .list
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for l in list.iter().filter_map(Weak::upgrade) {
            l.invalidate(file, offset, len);
        }
    }
}
