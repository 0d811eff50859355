//! What a context's handles and its in-flight ops share: the context's
//! state (`Inner`) behind the handle, the backend it runs on (`Backend`, and
//! the public [`BackendKind`], [`BackendChoice`], [`BackendInfo`]), and how
//! an op holds the context (`Ctx`) and the ring it went to (`RingRef`).

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::blocking::BlockingPool;
use crate::files::{FileTable, FixedFiles, NoRings};
use crate::permit::Priority;
use crate::ring::Ring;

/// Which backend a context runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// io_uring rings driven by background tasks.
    IoUring,
    /// Every op on tokio's blocking pool (`pread`, `pwrite`, ...).
    Fallback,
}

/// The backend the builder should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// io_uring, or the fallback backend when io_uring cannot be set up here
    /// (ENOSYS, EPERM/EACCES from seccomp or `kernel.io_uring_disabled`,
    /// ENOMEM from RLIMIT_MEMLOCK, EINVAL from an older kernel).
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// Always the fallback backend.
    Fallback,
}

/// Which backend runs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The backend in use.
    pub kind: BackendKind,
    /// Why the fallback backend runs (absent for io_uring).
    pub reason: Option<String>,
}

impl fmt::Display for BackendInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.kind, &self.reason) {
            (BackendKind::IoUring, _) => f.write_str("io_uring"),
            (BackendKind::Fallback, Some(r)) => write!(f, "pread fallback ({r})"),
            (BackendKind::Fallback, None) => f.write_str("pread fallback"),
        }
    }
}

pub(crate) enum Backend {
    Uring(Box<[Arc<Ring>]>),
    Fallback,
}

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    /// Every op of the fallback backend, and the ops of files routed away
    /// from the rings (see `FileRoute`).
    pub(crate) blocking: BlockingPool,
    pub(crate) files: FileTable,
    pub(crate) inline_nowait: bool,
    /// How long a thread may read on the inline path before it yields.
    pub(crate) inline_stretch: Duration,
    /// Set by `shutdown`: every new op fails, the inline path included.
    pub(crate) closed: AtomicBool,
    /// `Builder::shutdown_timeout`.
    pub(crate) shutdown_timeout: Duration,
    pub(crate) info: BackendInfo,
    /// The block caches over this context, told of every change made
    /// through it (feature `cache`, see `changes.rs`).
    #[cfg(feature = "cache")]
    pub(crate) invalidation: crate::changes::Listeners,
    /// The numbers of memory regions registered with every ring (feature
    /// `cache`: the block caches' frames); `None` on the fallback backend.
    #[cfg(feature = "cache")]
    pub(crate) regions: Option<crate::ring::Regions>,
    /// `Builder::latency_histograms`.
    pub(crate) latencies: Option<crate::latency::Recorder>,
}

impl Inner {
    pub(crate) fn fixed(&self) -> &dyn FixedFiles {
        match &self.backend {
            Backend::Uring(rings) => rings,
            Backend::Fallback => &NoRings,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Abandoned ops may still be in the kernel: the drivers reap them
        // and exit; each ring is freed only after that (see `Ring::drop`).
        if let Backend::Uring(rings) = &self.backend {
            rings.iter().for_each(|r| r.orphan());
        }
        self.blocking.close();
    }
}

/// The context an op belongs to — borrowed for the future's lifetime (no
/// reference count touched per op), or a handle the future holds (the
/// `'static` futures, which keep the context alive) — and the op's priority.
pub(crate) struct Ctx<'a>(Held<'a>);

/// The priority sits in each variant, beside the tag: a `Ctx` is two words.
enum Held<'a> {
    Borrowed(&'a Inner, Priority),
    Shared(Arc<Inner>, Priority),
}

impl Deref for Ctx<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        match &self.0 {
            Held::Borrowed(inner, _) => inner,
            Held::Shared(inner, _) => inner,
        }
    }
}

impl<'a> Ctx<'a> {
    pub(crate) fn borrowed(inner: &'a Inner, priority: Priority) -> Ctx<'a> {
        Ctx(Held::Borrowed(inner, priority))
    }

    pub(crate) fn shared(inner: Arc<Inner>, priority: Priority) -> Ctx<'a> {
        Ctx(Held::Shared(inner, priority))
    }

    /// The priority of the op holding it.
    pub(crate) fn priority(&self) -> Priority {
        match self.0 {
            Held::Borrowed(_, p) | Held::Shared(_, p) => p,
        }
    }

    /// Another hold on the same context, for another op: the borrow
    /// copied, or the handle cloned (a reference count).
    pub(crate) fn share(&self) -> Ctx<'a> {
        Ctx(match &self.0 {
            Held::Borrowed(inner, p) => Held::Borrowed(inner, *p),
            Held::Shared(inner, p) => Held::Shared(inner.clone(), *p),
        })
    }

    /// The same hold, for ops of `priority`.
    pub(crate) fn with_priority(mut self, priority: Priority) -> Ctx<'a> {
        match &mut self.0 {
            Held::Borrowed(_, p) | Held::Shared(_, p) => *p = priority,
        }
        self
    }

    /// The ring an op issued from thread slot `slot` goes to, as the op
    /// holds it; `None` on the fallback backend.
    pub(crate) fn ring(&self, slot: usize) -> Option<RingRef<'a>> {
        match &self.0 {
            Held::Borrowed(inner, _) => {
                let inner: &'a Inner = inner;
                let Backend::Uring(rings) = &inner.backend else {
                    return None;
                };
                let index = slot % rings.len();
                Some(RingRef {
                    index,
                    ring: HeldRing::Borrowed(&rings[index]),
                })
            }
            Held::Shared(inner, _) => {
                let Backend::Uring(rings) = &inner.backend else {
                    return None;
                };
                let index = slot % rings.len();
                Some(RingRef {
                    index,
                    ring: HeldRing::Shared(rings[index].clone()),
                })
            }
        }
    }
}

/// One of the context's rings, as an op holds it — borrowed like its
/// context, or shared — with its index in the context only to name it in
/// `Debug`.
pub(crate) struct RingRef<'a> {
    pub(crate) index: usize,
    ring: HeldRing<'a>,
}

enum HeldRing<'a> {
    Borrowed(&'a Ring),
    Shared(Arc<Ring>),
}

impl Deref for RingRef<'_> {
    type Target = Ring;
    fn deref(&self) -> &Ring {
        match &self.ring {
            HeldRing::Borrowed(ring) => ring,
            HeldRing::Shared(ring) => ring,
        }
    }
}
