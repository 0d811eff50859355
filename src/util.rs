//! Small helpers every layer uses: [`lock`] and the `decision!` log macro.

/// Logs a one-time decision through `tracing` (feature `tracing`); nothing
/// otherwise. The arguments are those of `tracing::event!` after the level.
macro_rules! decision {
    ($level:ident, $($arg:tt)+) => {
        #[cfg(feature = "tracing")]
        ::tracing::$level!(target: "uring_positioned_io", $($arg)+);
    };
}
pub(crate) use decision;

/// Locks `m`, ignoring poisoning: every structure behind the crate's locks
/// stays consistent at each point where user code or a panic could
/// interrupt it (no user code runs under a lock), so a panic elsewhere while
/// holding one leaves nothing half-updated that matters for soundness.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A waker that counts its wakes (unit tests).
#[cfg(test)]
pub(crate) struct CountWaker(pub(crate) std::sync::atomic::AtomicUsize);

#[cfg(test)]
impl std::task::Wake for CountWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A new counting waker, and the count it adds to.
#[cfg(test)]
pub(crate) fn count_waker() -> (std::sync::Arc<CountWaker>, std::task::Waker) {
    let c = std::sync::Arc::new(CountWaker(std::sync::atomic::AtomicUsize::new(0)));
    (c.clone(), std::task::Waker::from(c))
}

/// Held by the unit tests that map memory on a large scale (rings, their
/// threads) or measure the process's address space, so that the
/// measurement never runs beside them.
#[cfg(test)]
pub(crate) fn address_space_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    lock(&LOCK)
}
