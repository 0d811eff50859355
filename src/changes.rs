//! The hook through which a context tells its block caches that bytes of a
//! file changed ([`Listeners`], kept in `Inner`): a write or `fallocate`
//! through the context before its future resolves (`ops::Core`), again when
//! the kernel or the blocking pool finishes one whose future was dropped
//! before it resolved ([`LateChange`]), each told under every registration
//! of the file; and `unregister_file` (the whole file, under that
//! registration only).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};

use crate::files::FileEntry;
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
pub(crate) struct Listeners(Arc<List>);

#[derive(Default)]
struct List {
    any: AtomicBool,
    list: RwLock<Vec<Weak<dyn Invalidate>>>,
}

impl Listeners {
    /// Adds a listener; listeners already dropped are forgotten here.
    pub(crate) fn add(&self, listener: Weak<dyn Invalidate>) {
        let mut list = self
            .0
            .list
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        list.retain(|l| l.strong_count() > 0);
        list.push(listener);
        self.0.any.store(true, Ordering::Release);
    }

    /// Tells every live listener that `len` bytes at `offset` of the file
    /// of registration `file` changed (or may have): under this
    /// registration's id and under every other registration of the same
    /// file ([`FileEntry::for_each_alias`]).
    pub(crate) fn changed(&self, file: &FileEntry, offset: u64, len: u64) {
        self.0.changed(file, offset, len);
    }

    /// Tells every live listener that `len` bytes at `offset` of
    /// registration `file` are gone: this registration's only
    /// (`unregister_file`).
    pub(crate) fn notify(&self, file: FileId, offset: u64, len: u64) {
        self.0.notify(file, offset, len);
    }

    /// A notice of the same change to give when it is dropped: kept with
    /// work that may change the file after its future is gone (an op the
    /// kernel still owns, a job the blocking pool still runs), so that a
    /// block a cache read in the meantime is dropped once the bytes land.
    /// It goes to the registrations of the file at that time. `None` while
    /// the context has no listener (nothing to tell).
    pub(crate) fn later(&self, file: &Arc<FileEntry>, offset: u64, len: u64) -> Option<LateChange> {
        (self.0.any.load(Ordering::Acquire) && len != 0).then(|| LateChange {
            listeners: self.0.clone(),
            file: file.clone(),
            offset,
            len,
        })
    }
}

impl List {
    fn changed(&self, file: &FileEntry, offset: u64, len: u64) {
        if !self.any.load(Ordering::Acquire) || len == 0 {
            return;
        }
        file.for_each_alias(|id| self.notify(id, offset, len));
    }

    fn notify(&self, file: FileId, offset: u64, len: u64) {
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

/// A change told to the listeners when this is dropped (see
/// [`Listeners::later`]). It holds the list, not the context: parked with
/// an op in its ring, it makes no cycle. The file's entry it holds is one
/// its op holds anyway until the same moment.
pub(crate) struct LateChange {
    listeners: Arc<List>,
    file: Arc<FileEntry>,
    offset: u64,
    len: u64,
}

impl Drop for LateChange {
    fn drop(&mut self) {
        self.listeners.changed(&self.file, self.offset, self.len);
    }
}
