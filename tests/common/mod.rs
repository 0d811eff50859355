//! Shared helpers for the integration tests: position-derived test files,
//! a cheap deterministic RNG, runtime builders, watchdogs and context builders.

pub mod seccomp;

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use uring_positioned_io::{BackendChoice, BackendKind, Builder, UringContext};

pub mod fuse;

// ---------------------------------------------------------------------------
// Deterministic content and randomness
// ---------------------------------------------------------------------------

/// SplitMix64 finaliser: a good 64-bit mixing function.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 8-byte word at word index `word` of the file identified by `seed`.
pub fn pattern_word(seed: u64, word: u64) -> u64 {
    mix64(seed.wrapping_mul(0x1000_0000_01B3) ^ mix64(word))
}

/// Byte at absolute position `pos` of the file identified by `seed`.
pub fn pattern_byte(seed: u64, pos: u64) -> u8 {
    pattern_word(seed, pos / 8).to_le_bytes()[(pos % 8) as usize]
}

/// Fill `out` with the content of file `seed` starting at `offset`.
pub fn fill_pattern(seed: u64, offset: u64, out: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < out.len() {
        let word = pattern_word(seed, pos / 8).to_le_bytes();
        let start = (pos % 8) as usize;
        let n = (8 - start).min(out.len() - i);
        out[i..i + n].copy_from_slice(&word[start..start + n]);
        i += n;
        pos += n as u64;
    }
}

/// The bytes a correct read of `len` bytes at `offset` of a file of
/// `file_len` bytes with content `seed` returns (truncated at EOF).
pub fn expected(seed: u64, file_len: u64, offset: u64, len: usize) -> Vec<u8> {
    let avail = file_len.saturating_sub(offset).min(len as u64) as usize;
    let mut v = vec![0u8; avail];
    fill_pattern(seed, offset, &mut v);
    v
}

/// Check `got` against the pattern of file `seed` at `offset`, with a
/// readable message pointing at the first wrong byte.
pub fn check_pattern(seed: u64, offset: u64, got: &[u8]) -> Result<(), String> {
    let mut want = vec![0u8; got.len()];
    fill_pattern(seed, offset, &mut want);
    if want == got {
        return Ok(());
    }
    let i = want.iter().zip(got).position(|(a, b)| a != b).unwrap();
    Err(format!(
        "data mismatch for seed {seed:#x} at file offset {} (buffer index {i}, len {}): got {:#04x}, want {:#04x}",
        offset + i as u64,
        got.len(),
        got[i],
        want[i]
    ))
}

/// Small, fast, deterministic PRNG (xorshift64*), seeded through SplitMix.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(mix64(seed) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }
    /// True with probability `pct`/100.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

// ---------------------------------------------------------------------------
// Test files
// ---------------------------------------------------------------------------

/// A file on disk whose content is `pattern_byte(seed, pos)` for every pos.
#[derive(Clone, Debug)]
pub struct TestFile {
    pub path: PathBuf,
    pub seed: u64,
    pub len: u64,
}

impl TestFile {
    pub fn open(&self) -> File {
        File::open(&self.path).unwrap_or_else(|e| panic!("open {:?}: {e}", self.path))
    }
    pub fn expected(&self, offset: u64, len: usize) -> Vec<u8> {
        expected(self.seed, self.len, offset, len)
    }
    /// Reference read with pread(2) through std.
    pub fn pread(&self, offset: u64, len: usize) -> Vec<u8> {
        let f = self.open();
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let n = f
                .read_at(&mut buf[done..], offset + done as u64)
                .expect("pread");
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        buf
    }
    /// Ask the kernel to drop this file's page cache, asking again (a few
    /// times) while `mincore` still finds pages of it: a folio the kernel
    /// holds a reference to at that moment (writeback, a page-table scan)
    /// survives one `POSIX_FADV_DONTNEED`, and with large folios that is a
    /// whole range of a test's "cold" reads. Tests that must know the range
    /// is gone use [`drop_cache_until_gone`].
    pub fn drop_cache(&self) {
        let f = self.open();
        for _ in 0..10 {
            drop_cache(&f);
            if self.len == 0 || resident_pages(&f, 0, self.len as usize) == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// `path` opened read-write, created if missing, not truncated.
pub fn open_rw(path: &Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("open {path:?} read-write: {e}"))
}

/// Create a file of `len` bytes with the content of `seed` in `dir`.
pub fn make_file(dir: &Path, seed: u64, len: u64) -> TestFile {
    let path = dir.join(format!("f-{seed:016x}-{len}"));
    let mut f = File::create(&path).expect("create test file");
    let mut chunk = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(chunk.len() as u64) as usize;
        fill_pattern(seed, pos, &mut chunk[..n]);
        f.write_all(&chunk[..n]).expect("write test file");
        pos += n as u64;
    }
    TestFile { path, seed, len }
}

/// A temp dir holding `sizes.len()` files with distinct seeds derived from `base_seed`.
pub struct FileSet {
    pub dir: tempfile::TempDir,
    pub files: Vec<TestFile>,
}

impl FileSet {
    pub fn new(base_seed: u64, sizes: &[u64]) -> FileSet {
        assert_held();
        let dir = tempfile::tempdir().expect("tempdir");
        let files = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| make_file(dir.path(), mix64(base_seed ^ ((i as u64) << 32)), len))
            .collect();
        FileSet { dir, files }
    }
    pub fn open_all(&self) -> Vec<File> {
        self.files.iter().map(TestFile::open).collect()
    }
    /// fsync every file (needed before `drop_caches` can evict the pages).
    pub fn sync_all(&self) {
        for f in &self.files {
            f.open().sync_all().expect("fsync");
        }
    }
    pub fn drop_caches(&self) {
        for f in &self.files {
            f.drop_cache();
        }
    }
}

/// posix_fadvise(DONTNEED) on the whole file so later reads go to the device.
/// Turns readahead off for this open file (`POSIX_FADV_RANDOM`), so that
/// which pages are cached stays exactly what the test read (a
/// `RWF_NOWAIT` probe or a small read would otherwise pull in neighbours).
pub fn no_readahead(f: &File) {
    // SAFETY: plain syscall on a valid, open fd.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
}

/// Evicts the file's pages from the page cache. Dirty pages cannot be
/// evicted, so the data is written back first (a freshly written test file
/// would otherwise stay cached and every "cold" read would be a hit).
pub fn drop_cache(f: &File) {
    let _ = f.sync_data();
    // SAFETY: plain syscall on a valid, open fd.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// How many of the pages of `f` in `offset..offset + len` are in the page
/// cache (`mincore` on a mapping; touches nothing).
pub fn resident_pages(f: &File, offset: u64, len: usize) -> usize {
    let page = 4096usize;
    // SAFETY: a read-only shared mapping of a valid fd; it is only passed
    // to mincore and unmapped below, never dereferenced.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mmap for mincore");
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `addr..addr + len` is the mapping made above; `vec` has one
    // byte per page of it.
    let r = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(addr, len) };
    assert_eq!(r, 0, "mincore");
    vec.iter().filter(|&&b| b & 1 != 0).count()
}

/// Evicts `f`'s pages in `offset..offset + len` until none is cached (a
/// page under writeback or in a per-CPU LRU batch can survive one
/// `POSIX_FADV_DONTNEED` on a busy machine); panics if they stay.
pub fn drop_cache_until_gone(f: &File, offset: u64, len: usize) {
    for _ in 0..50 {
        drop_cache(f);
        if resident_pages(f, offset, len) == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "{} pages of {offset}..+{len} stay cached after 50 evictions",
        resident_pages(f, offset, len)
    );
}

/// CPU time (user + system) of the whole process so far.
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &raw mut ru), 0);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.try_into().unwrap_or(0))
            + Duration::from_micros(t.tv_usec.try_into().unwrap_or(0))
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Number of open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(std::iter::Iterator::count)
        .unwrap_or(0)
}

/// The open fds of this process with what they point to (for diagnostics).
pub fn fd_list() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(std::result::Result::ok)
                .map(|e| {
                    let target = std::fs::read_link(e.path())
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    format!("{}->{target}", e.file_name().to_string_lossy())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// fd count to compare against later: first creates and drops a runtime of
/// each flavour, because tokio keeps a process-global socket pair for its
/// signal driver once the first runtime has been built.
pub fn fd_baseline() -> (usize, Vec<String>) {
    drop(runtime(Flavor::Multi));
    drop(runtime(Flavor::Current));
    (fd_count(), fd_list())
}

/// The same wait from inside a runtime: it sleeps on the runtime's timer
/// instead of blocking a worker that the task closing the fd (a context's
/// driver, woken by the last drop) may need.
pub async fn wait_fd_count_at_most_async(want: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let n = fd_count();
        if n <= want || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Poll `fd_count()` until it is at most `want` or the deadline passes.
pub fn wait_fd_count_at_most(want: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let n = fd_count();
        if n <= want || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// Runtimes, watchdogs, serialisation
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// multi_thread runtime with 2 workers
    Multi,
    /// current_thread runtime
    Current,
}

pub fn runtime(flavor: Flavor) -> tokio::runtime::Runtime {
    match flavor {
        Flavor::Multi => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("multi_thread runtime"),
        Flavor::Current => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("current_thread runtime"),
    }
}

/// Run `f` on its own thread; fail the test if it does not finish within
/// `secs` seconds (the stuck thread is leaked; the process exits at the end
/// of the test binary). Panics inside `f` are propagated.
pub fn watchdog<T: Send + 'static>(
    name: &str,
    secs: u64,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    assert_held();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("test-{name}"))
        .spawn(move || {
            ON_BEHALF.set(true);
            let r = f();
            let _ = tx.send(());
            r
        })
        .expect("spawn test thread");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => handle
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e)),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The closure panicked before sending.
            match handle.join() {
                Ok(r) => r,
                Err(e) => std::panic::resume_unwind(e),
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            eprintln!(
                "watchdog: `{name}` timed out; this process's threads:\n{}",
                threads_report()
            );
            panic!("watchdog: test `{name}` did not finish within {secs} s (hang?)")
        }
    }
}

/// This process's threads, for a test that timed out: for each kind (name,
/// where it sleeps in the kernel, the top of its kernel stack when root may
/// read it), how many.
pub fn threads_report() -> String {
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for task in dir.flatten() {
            let read = |f: &str| std::fs::read_to_string(task.path().join(f)).unwrap_or_default();
            let stack: Vec<String> = read("stack")
                .lines()
                .take(6)
                .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
                .collect();
            let kind = format!(
                "{} in {} [{}]",
                read("comm").trim(),
                read("wchan").trim(),
                stack.join(" < ")
            );
            *kinds.entry(kind).or_default() += 1;
        }
    }
    kinds
        .into_iter()
        .map(|(kind, n)| format!("  {n} x {kind}\n"))
        .collect()
}

/// Build a runtime of `flavor` and block on the future made by `make`, on
/// a watchdog thread with a `secs` deadline, additionally wrapped in a tokio
/// timeout of the same length.
pub fn run<F, Fut, T>(name: &str, flavor: Flavor, secs: u64, make: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let label = format!("{name}/{flavor:?}");
    let inner = label.clone();
    watchdog(&label, secs + 5, move || {
        let rt = runtime(flavor);
        let out = rt.block_on(async move {
            tokio::time::timeout(Duration::from_secs(secs), make())
                .await
                .unwrap_or_else(|_| {
                    eprintln!(
                        "`{inner}` timed out; this process's threads:\n{}",
                        threads_report()
                    );
                    panic!("tokio timeout: `{inner}` took more than {secs} s")
                })
        });
        // Do not let a wedged runtime shutdown hang the test thread forever.
        rt.shutdown_timeout(Duration::from_secs(5));
        out
    })
}

/// The message of a caught panic payload.
pub fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = e.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_string()
    }
}

// The tests of one binary run in parallel threads of one process. A test
// that measures the whole process (its fds, its CPU time, its threads, timer
// gaps, its allocations) must not run beside any other: it takes `serial()`,
// and every other test takes `shared()`. `run`, `watchdog` and `FileSet::new`
// check that the calling test took one of the two.
static PROCESS: RwLock<()> = RwLock::new(());

enum Hold {
    Shared {
        _guard: RwLockReadGuard<'static, ()>,
    },
    Alone {
        _guard: RwLockWriteGuard<'static, ()>,
    },
}

thread_local! {
    /// What this test thread holds of `PROCESS`.
    static HELD: RefCell<Option<Hold>> = const { RefCell::new(None) };
    /// A watchdog thread of a test that holds `PROCESS`.
    static ON_BEHALF: Cell<bool> = const { Cell::new(false) };
}

/// While it lives, the test that took it holds its share of the process (or
/// the whole process); dropping it lets go.
#[must_use = "the test holds the process only while the guard lives"]
pub struct ProcessGuard {
    took: bool,
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        if self.took {
            HELD.with(|h| h.borrow_mut().take());
        }
    }
}

/// Run alone: wait until no other test of this binary runs, and keep them
/// all out while the guard lives (for fd counting, CPU time and timing).
/// From a test that took `shared()`, gives up its share first.
pub fn serial() -> ProcessGuard {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        assert!(
            !matches!(*h, Some(Hold::Alone { .. })),
            "serial() taken twice by one test"
        );
        // Give up a share first: waiting for the whole process while holding
        // a share of it would wait forever.
        h.take();
        let g = PROCESS
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *h = Some(Hold::Alone { _guard: g });
    });
    ProcessGuard { took: true }
}

/// Run beside other tests, but never beside one that took `serial()`. A
/// no-op for a test that already holds its share or the whole process.
pub fn shared() -> ProcessGuard {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if h.is_some() {
            return ProcessGuard { took: false };
        }
        let g = PROCESS
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *h = Some(Hold::Shared { _guard: g });
        ProcessGuard { took: true }
    })
}

/// Fail unless the calling test took `shared()` or `serial()`.
#[track_caller]
fn assert_held() {
    let held = ON_BEHALF.get() || HELD.with(|h| h.borrow().is_some());
    assert!(
        held,
        "this test must take `common::shared()` (or `common::serial()` to run alone) first"
    );
}

// ---------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------

/// Both backends, for tests that loop over them.
pub const BOTH: [BackendChoice; 2] = [BackendChoice::IoUring, BackendChoice::Fallback];

pub fn expected_kind(choice: BackendChoice) -> Option<BackendKind> {
    match choice {
        BackendChoice::IoUring => Some(BackendKind::IoUring),
        BackendChoice::Fallback => Some(BackendKind::Fallback),
        BackendChoice::Auto => None,
    }
}

/// Build a context with `choice` (plus whatever `tweak` configures) and
/// check that the requested backend is the one actually in use.
pub fn build_ctx(
    choice: BackendChoice,
    files: Vec<File>,
    tweak: impl FnOnce(Builder) -> Builder,
) -> UringContext {
    let ctx = tweak(UringContext::builder().backend(choice))
        .build(files)
        .unwrap_or_else(|e| panic!("building a {choice:?} context failed: {e}"));
    if let Some(kind) = expected_kind(choice) {
        assert_eq!(
            ctx.backend().kind,
            kind,
            "asked for {choice:?}, got {:?}",
            ctx.backend()
        );
    }
    ctx
}

pub fn default_ctx(choice: BackendChoice, files: Vec<File>) -> UringContext {
    build_ctx(choice, files, |b| b)
}

/// Wait (yielding to the runtime) until `stats().in_flight == 0`; returns
/// the last observed value.
pub async fn wait_in_flight_zero(ctx: &UringContext, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let n = ctx.stats().in_flight;
        if n == 0 || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Read all of `file` (registered as `fid`) through `ctx` in `chunk`-sized
/// pieces and verify every byte and the EOF.
pub async fn verify_whole_file(ctx: &UringContext, fid: u32, file: &TestFile, chunk: usize) {
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    loop {
        let n = ctx
            .read(fid, off, &mut buf)
            .await
            .unwrap_or_else(|e| panic!("verify read fid {fid} @ {off}: {e}"));
        if n == 0 {
            break;
        }
        check_pattern(file.seed, off, &buf[..n]).unwrap();
        off += n as u64;
    }
    assert_eq!(
        off, file.len,
        "fid {fid}: read {off} bytes, file has {}",
        file.len
    );
}

/// Generate one `#[test]` per backend for each listed function
/// `fn name(choice: BackendChoice)`: `name::io_uring` and `name::fallback`.
/// Each takes `shared()`; a function that must run alone takes `serial()`.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn io_uring() {
                    let _shared = $crate::common::shared();
                    super::$name(::uring_positioned_io::BackendChoice::IoUring)
                }
                #[test]
                fn fallback() {
                    let _shared = $crate::common::shared();
                    super::$name(::uring_positioned_io::BackendChoice::Fallback)
                }
            }
        )*
    };
}

// ---------------------------------------------------------------------------
// Manual polling
// ---------------------------------------------------------------------------

/// Poll `fut` exactly once with the current task's real waker.
pub async fn poll_once<F: Future + ?Sized>(
    fut: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    let mut fut = fut;
    std::future::poll_fn(move |cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await
}

/// Poll `fut` exactly once with a waker that does nothing.
pub fn poll_once_noop<F: Future + ?Sized>(
    fut: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    fut.poll(&mut cx)
}

/// `path` opened read-write with `O_DIRECT` (created if missing), or `None`
/// after printing why the file system refused it (tmpfs on old kernels).
pub fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("skipped: O_DIRECT refused here: {e}");
            None
        }
    }
}
