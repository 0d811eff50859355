//! Buffers the kernel may write into: the [`IoBufMut`] contract for owned
//! buffers and its implementations (`Vec<u8>`, `Box<[u8]>`, [`AlignedBuf`],
//! `bytes::BytesMut` with the `bytes` feature), owned windows of a buffer
//! ([`Slice`]), [`AlignedBuf`] for `O_DIRECT`, and the per-ring
//! bounce-buffer pool.

use std::alloc::{self, Layout};
use std::fmt;
use std::io;
use std::ops::{Bound, Deref, DerefMut, RangeBounds};
use std::ptr::NonNull;

use crate::sys;

/// A buffer that can be handed to the kernel by value for a zero-copy read
/// ([`UringContext::read_owned`](crate::UringContext::read_owned) and the
/// other owned reads).
///
/// A buffer has `bytes_total()` bytes of storage, of which the first
/// `bytes_init()` are initialised (a `Vec`'s `len()` of its `capacity()`).
/// **An owned read fills the spare capacity**, `bytes_init()..bytes_total()`:
/// the bytes already there are kept, and a read of `n` bytes makes the
/// buffer's initialised length `bytes_init() + n` (through
/// [`set_init`](Self::set_init)), so a `Vec::with_capacity(4096)` comes back
/// with `len() == n`. A buffer with no spare capacity is an error
/// (`InvalidInput`), not a read of nothing that would look like the end of
/// the file: [`clear`](Vec::clear) it to reuse it, or read into
/// [`buf.slice(..)`](Self::slice) to overwrite its bytes. A [`Slice`] —
/// a window of a buffer — is all spare capacity: a read fills the window
/// from its start.
///
/// While a read is in flight the crate owns the buffer: if the read future is
/// dropped, the buffer is parked inside the context until the kernel has
/// finished with it, and only then dropped.
///
/// # Safety
///
/// An implementation promises, for as long as the value lives:
///
/// - `stable_ptr` and `stable_mut_ptr` return the same address, the start
///   of `bytes_total()` bytes that the value owns and that are valid for
///   reads and writes; that memory neither moves nor is freed while the
///   value is alive, *even when the value itself is moved* (heap storage,
///   not inline storage), and nothing else reads or writes it while the
///   crate holds the value.
/// - `bytes_init() <= bytes_total()`, and the first `bytes_init()` bytes are
///   initialised.
/// - `bytes_init()` and `bytes_total()` change only through `&mut self`
///   (the crate reads them once, when a read starts, and holds the value
///   until it is over), and [`set_init`](Self::set_init) never lowers
///   `bytes_init()`.
///
/// # Example
///
/// A block type that reads straight into its heap storage:
///
/// ```
/// use uring_positioned_io::{IoBufMut, UringContext};
///
/// struct Block {
///     id: u64,
///     bytes: Box<[u8]>, // storage, all of it initialised (zeroed)
///     filled: usize,    // bytes holding data read from the file
/// }
///
/// // SAFETY: the bytes live in the boxed slice's heap block, which does not
/// // move when `Block` moves and lives exactly as long as it does; all of
/// // it is initialised, and `filled <= bytes.len()` always holds.
/// unsafe impl IoBufMut for Block {
///     fn stable_ptr(&self) -> *const u8 {
///         self.bytes.as_ptr()
///     }
///     fn stable_mut_ptr(&mut self) -> *mut u8 {
///         self.bytes.as_mut_ptr()
///     }
///     fn bytes_init(&self) -> usize {
///         self.filled
///     }
///     fn bytes_total(&self) -> usize {
///         self.bytes.len()
///     }
///     unsafe fn set_init(&mut self, pos: usize) {
///         self.filled = self.filled.max(pos.min(self.bytes.len()));
///     }
/// }
///
/// # fn main() -> std::io::Result<()> {
/// # use std::io::Write;
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(b"block data")?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// let block = Block { id: 7, bytes: vec![0u8; 4096].into_boxed_slice(), filled: 0 };
/// let (n, block) = ctx.read_owned(0, 0, block).await;
/// assert_eq!((n?, block.id, &block.bytes[..block.filled]), (10, 7, &b"block data"[..]));
/// # Ok(())
/// # })
/// # }
/// ```
pub unsafe trait IoBufMut: Unpin + Send + 'static {
    /// Start of the storage.
    fn stable_ptr(&self) -> *const u8;

    /// Start of the storage (the same address as
    /// [`stable_ptr`](Self::stable_ptr)), for writing.
    fn stable_mut_ptr(&mut self) -> *mut u8;

    /// How many bytes from the start are initialised and kept by a read,
    /// which writes after them (a `Vec`'s `len()`; 0 for a [`Slice`], whose
    /// whole window is written).
    fn bytes_init(&self) -> usize;

    /// Size of the storage in bytes (a `Vec`'s `capacity()`).
    fn bytes_total(&self) -> usize;

    /// Records that the first `pos` bytes are initialised: the crate calls
    /// it after a read of `n` bytes with `pos = bytes_init() + n`. A buffer
    /// with a length grows it to `pos` if it is shorter (never shrinks it).
    ///
    /// # Safety
    ///
    /// `pos <= bytes_total()`, and the first `pos` bytes at
    /// [`stable_mut_ptr`](Self::stable_mut_ptr) are initialised.
    unsafe fn set_init(&mut self, pos: usize);

    /// An owned window `range` of this buffer's storage, which a read fills
    /// from its start (see [`Slice`]); [`Slice::into_inner`] gives the
    /// whole buffer back. An unbounded end is `bytes_total()`.
    ///
    /// # Panics
    ///
    /// If the range ends beyond `bytes_total()`, starts after its end, or
    /// starts beyond `bytes_init()` (that would leave uninitialised bytes
    /// before the window) — like indexing a slice out of bounds.
    /// [`try_slice`](Self::try_slice) returns an error instead.
    ///
    /// ```
    /// use uring_positioned_io::IoBufMut;
    ///
    /// let buf = b"header:????".to_vec();
    /// let window = buf.slice(7..);
    /// assert_eq!((window.begin(), window.end(), &window[..]), (7, 11, &b"????"[..]));
    /// assert_eq!(window.into_inner(), b"header:????");
    /// ```
    #[must_use]
    fn slice(self, range: impl RangeBounds<usize>) -> Slice<Self>
    where
        Self: Sized,
    {
        match self.try_slice(range) {
            Ok(s) => s,
            Err(e) => panic!("IoBufMut::slice: {e}"),
        }
    }

    /// An owned window `range` of this buffer's storage, as
    /// [`slice`](Self::slice), or an error that hands the buffer back.
    ///
    /// # Errors
    ///
    /// [`SliceError`] (`InvalidInput` as an `io::Error`) if the range ends
    /// beyond `bytes_total()`, starts after its end, or starts beyond
    /// `bytes_init()`.
    ///
    /// ```
    /// use uring_positioned_io::IoBufMut;
    ///
    /// let err = Vec::<u8>::with_capacity(16).try_slice(4..8).unwrap_err();
    /// assert!(err.to_string().contains("beyond its 0 initialised bytes"));
    /// let buf: Vec<u8> = err.into_inner(); // nothing is lost
    /// assert!(buf.capacity() >= 16);
    /// ```
    fn try_slice(self, range: impl RangeBounds<usize>) -> Result<Slice<Self>, SliceError<Self>>
    where
        Self: Sized,
    {
        let (init, total) = (self.bytes_init(), self.bytes_total());
        match window(&range, 0, total) {
            Some((begin, end)) if begin <= init => Ok(Slice {
                buf: self,
                begin,
                end,
            }),
            Some((begin, _)) => Err(SliceError::new(
                self,
                format!("the window starts at {begin}, beyond its {init} initialised bytes"),
            )),
            None => Err(SliceError::new(
                self,
                format!(
                    "the window {:?}..{:?} does not fit in its {total} bytes",
                    range.start_bound(),
                    range.end_bound()
                ),
            )),
        }
    }
}

/// `range` relative to `base`, as absolute `(begin, end)` within
/// `base..limit`; `None` if it does not fit (or overflows).
fn window(range: &impl RangeBounds<usize>, base: usize, limit: usize) -> Option<(usize, usize)> {
    let begin = match range.start_bound() {
        Bound::Included(&b) => base.checked_add(b)?,
        Bound::Excluded(&b) => base.checked_add(b)?.checked_add(1)?,
        Bound::Unbounded => base,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => base.checked_add(e)?.checked_add(1)?,
        Bound::Excluded(&e) => base.checked_add(e)?,
        Bound::Unbounded => limit,
    };
    (begin <= end && end <= limit).then_some((begin, end))
}

// SAFETY: a Vec's elements live on the heap; moving the Vec moves only its
// (ptr, len, cap) header, so the pointer stays valid for `capacity` bytes,
// of which the first `len` are initialised; `set_len` only grows here.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, pos: usize) {
        if pos > self.len() {
            // SAFETY: the caller promises `pos <= capacity` and that the
            // first `pos` bytes are initialised.
            unsafe { self.set_len(pos) };
        }
    }
}

/// Always full (no spare capacity): read into it through
/// [`slice`](IoBufMut::slice), e.g. `boxed.slice(..)`.
// SAFETY: a boxed slice is an initialised heap allocation that does not
// move with the box; its length never changes.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
    unsafe fn set_init(&mut self, _pos: usize) {}
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

/// With the `bytes` feature: reads fill `len()..capacity()`.
// SAFETY: a BytesMut's storage is a heap allocation (never inline) that it
// views uniquely — other handles split off it view disjoint ranges — and
// that does not move when the BytesMut moves; its first `len()` bytes are
// initialised, and `set_len` only grows here.
#[cfg(feature = "bytes")]
unsafe impl IoBufMut for bytes::BytesMut {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, pos: usize) {
        if pos > self.len() {
            // SAFETY: the caller promises `pos <= capacity` and that the
            // first `pos` bytes are initialised.
            unsafe { self.set_len(pos) };
        }
    }
}

/// A buffer whose bytes can be handed to the kernel by value for a
/// zero-copy write ([`UringContext::write_owned`](crate::UringContext::write_owned)
/// and [`write_all_owned`](crate::UringContext::write_all_owned)): the
/// read side of a buffer, as [`IoBufMut`] is its write side.
///
/// **An owned write writes the buffer's data**, `data_len()` bytes at
/// `data_ptr()`: a `Vec`'s `len()` bytes, a [`Slice`]'s initialised part of
/// its window; and hands the buffer back unchanged. (The methods are
/// named apart from [`IoBufMut`]'s so that both traits can be in scope.) While the write is in flight the crate owns
/// the buffer; if the future is dropped, the buffer is parked in the context
/// until the kernel is done reading it.
///
/// # Safety
///
/// An implementation promises, for as long as the value lives: `data_ptr`
/// is the start of `data_len()` initialised bytes that the value owns (or
/// borrows for `'static`), that neither move nor are freed while the value
/// is alive, *even when the value itself is moved*, and that nothing writes
/// while the crate holds the value; `data_len()` changes only through
/// `&mut self`.
pub unsafe trait IoBuf: Unpin + Send + 'static {
    /// Start of the bytes.
    fn data_ptr(&self) -> *const u8;
    /// How many bytes from [`data_ptr`](Self::data_ptr) a write writes.
    fn data_len(&self) -> usize;
}

/// Implements [`IoBuf`] from a type's [`IoBufMut`] implementation (whose
/// contract is stronger).
macro_rules! io_buf_from_mut {
    ($($t:ty),*) => {$(
        // SAFETY: IoBufMut promises stable, owned storage whose first
        // bytes_init() bytes are initialised (a superset of IoBuf).
        unsafe impl IoBuf for $t {
            fn data_ptr(&self) -> *const u8 {
                IoBufMut::stable_ptr(self)
            }
            fn data_len(&self) -> usize {
                IoBufMut::bytes_init(self)
            }
        }
    )*};
}
io_buf_from_mut!(Vec<u8>, Box<[u8]>, AlignedBuf);
#[cfg(feature = "bytes")]
io_buf_from_mut!(bytes::BytesMut);

/// With the `bytes` feature: writes the whole `Bytes`.
// SAFETY: a `Bytes` views immutable storage (heap or `'static`) that stays
// in place while any handle to it lives; its length never changes.
#[cfg(feature = "bytes")]
unsafe impl IoBuf for bytes::Bytes {
    fn data_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn data_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: `'static` bytes never move, are never freed, and are immutable.
unsafe impl IoBuf for &'static [u8] {
    fn data_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn data_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: a String's bytes live on the heap (as a Vec's) and are all
// initialised; the crate holds the String, so nothing changes them.
unsafe impl IoBuf for String {
    fn data_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn data_len(&self) -> usize {
        self.len()
    }
}

/// Writes the window's initialised bytes: `begin()..end()`, or less if the
/// buffer's initialised bytes end inside the window.
// SAFETY: the window starts within the inner buffer's initialised bytes
// (checked when it is made), so `begin..min(end, init)` are initialised
// bytes of the inner buffer's stable storage.
unsafe impl<B: IoBufMut> IoBuf for Slice<B> {
    fn data_ptr(&self) -> *const u8 {
        // SAFETY: begin <= bytes_init() <= bytes_total(): in bounds.
        unsafe { IoBufMut::stable_ptr(&self.buf).add(self.begin) }
    }
    fn data_len(&self) -> usize {
        IoBufMut::bytes_init(&self.buf)
            .min(self.end)
            .saturating_sub(self.begin)
    }
}

/// An owned window `begin..end` of a buffer, made by
/// [`IoBufMut::slice`]: an owned read into it fills the window **from its
/// start** (the window is all spare capacity, whatever it held), and the
/// buffer's initialised length grows to cover the bytes read if they end
/// beyond it. [`into_inner`](Self::into_inner) gives the whole buffer back.
///
/// The window starts within the buffer's initialised bytes (so no
/// uninitialised gap can come before what is read) and ends within its
/// storage. It derefs to the initialised bytes of the window; after a read
/// of `n` bytes, `&slice[..n]` are the bytes read.
///
/// ```
/// # use std::io::Write;
/// use uring_positioned_io::{IoBufMut, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(b"0123456789")?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// // Read 4 bytes at offset 6 into bytes 2..6 of a buffer, keeping the rest.
/// let (n, slice) = ctx.read_owned(0, 6, b"ab----gh".to_vec().slice(2..6)).await;
/// assert_eq!(&slice[..n?], b"6789");
/// assert_eq!(slice.into_inner(), b"ab6789gh");
/// // Bytes 0..4 of an empty Vec: it comes back with len() 4.
/// let (n, slice) = ctx.read_owned(0, 0, Vec::with_capacity(100).slice(..4)).await;
/// assert_eq!((n?, slice.into_inner()), (4, b"0123".to_vec()));
/// # Ok(())
/// # })
/// # }
/// ```
pub struct Slice<B> {
    buf: B,
    begin: usize,
    end: usize,
}

impl<B> Slice<B> {
    /// Offset in the buffer where the window starts.
    #[must_use]
    pub fn begin(&self) -> usize {
        self.begin
    }

    /// Offset in the buffer where the window ends.
    #[must_use]
    pub fn end(&self) -> usize {
        self.end
    }

    /// The whole buffer.
    #[must_use]
    pub fn get_ref(&self) -> &B {
        &self.buf
    }

    /// The whole buffer, given back.
    #[must_use]
    pub fn into_inner(self) -> B {
        self.buf
    }
}

impl<B: IoBufMut> Slice<B> {
    /// A window `range` of this window (relative to its start), of the same
    /// buffer: `buf.slice(2..10).slice(1..3)` is `buf.slice(3..5)`.
    ///
    /// # Panics
    ///
    /// As [`IoBufMut::slice`], if the range does not fit in the window or
    /// starts beyond the buffer's initialised bytes;
    /// [`try_slice`](Self::try_slice) returns an error instead.
    #[must_use]
    pub fn slice(self, range: impl RangeBounds<usize>) -> Slice<B> {
        match self.try_slice(range) {
            Ok(s) => s,
            Err(e) => panic!("Slice::slice: {e}"),
        }
    }

    /// A window `range` of this window, as [`slice`](Self::slice), or an
    /// error that hands this window back.
    ///
    /// # Errors
    ///
    /// [`SliceError`] if the range does not fit in the window or starts
    /// beyond the buffer's initialised bytes.
    pub fn try_slice(self, range: impl RangeBounds<usize>) -> Result<Slice<B>, SliceError<Self>> {
        let init = self.buf.bytes_init();
        match window(&range, self.begin, self.end) {
            Some((begin, end)) if begin <= init => Ok(Slice {
                buf: self.buf,
                begin,
                end,
            }),
            Some((begin, _)) => Err(SliceError::new(
                self,
                format!("the window starts at {begin}, beyond its {init} initialised bytes"),
            )),
            None => {
                let msg = format!(
                    "the window {:?}..{:?} does not fit in the window {}..{}",
                    range.start_bound(),
                    range.end_bound(),
                    self.begin,
                    self.end
                );
                Err(SliceError::new(self, msg))
            }
        }
    }

    /// Length of the initialised bytes of the window.
    fn init_len(&self) -> usize {
        self.buf
            .bytes_init()
            .min(self.end)
            .saturating_sub(self.begin)
    }
}

impl<B: IoBufMut> Deref for Slice<B> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: IoBufMut promises that the first bytes_init() bytes at
        // stable_ptr() are initialised and live as long as `self.buf`;
        // begin <= bytes_init() (checked when the window was made, and
        // bytes_init() never shrinks while the Slice owns the buffer), and
        // the length stops at min(end, bytes_init()).
        unsafe {
            std::slice::from_raw_parts(self.buf.stable_ptr().add(self.begin), self.init_len())
        }
    }
}

impl<B: IoBufMut> DerefMut for Slice<B> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.init_len();
        // SAFETY: as in `deref`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.buf.stable_mut_ptr().add(self.begin), len) }
    }
}

// SAFETY: the window `begin..end` lies within the buffer's storage
// (end <= bytes_total(), checked when made; the Slice owns the buffer and
// hands out no `&mut B`, so the storage cannot change size), which the
// buffer's own IoBufMut promises stable. bytes_init() is 0: a read writes
// the window from its start, and `set_init` hands the buffer
// `begin + pos`, whose first `begin` bytes were initialised already
// (begin <= bytes_init() of the buffer) and whose rest the read wrote.
unsafe impl<B: IoBufMut> IoBufMut for Slice<B> {
    fn stable_ptr(&self) -> *const u8 {
        self.buf.stable_ptr().wrapping_add(self.begin)
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.buf.stable_mut_ptr().wrapping_add(self.begin)
    }
    fn bytes_init(&self) -> usize {
        0
    }
    fn bytes_total(&self) -> usize {
        self.end - self.begin
    }
    unsafe fn set_init(&mut self, pos: usize) {
        let pos = self.begin + pos.min(self.end - self.begin);
        if pos > self.buf.bytes_init() {
            // SAFETY: see the impl's comment; pos <= end <= bytes_total().
            unsafe { self.buf.set_init(pos) };
        }
    }
}

impl<B: IoBufMut> fmt::Debug for Slice<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slice")
            .field("begin", &self.begin)
            .field("end", &self.end)
            .field("buf_init", &self.buf.bytes_init())
            .field("buf_total", &self.buf.bytes_total())
            .finish()
    }
}

/// A window that does not fit its buffer ([`IoBufMut::try_slice`]): says
/// why, and hands the buffer back ([`into_inner`](Self::into_inner)).
/// Converts into an `io::Error` of kind `InvalidInput`, so `?` works.
pub struct SliceError<B> {
    buf: B,
    msg: String,
}

impl<B> SliceError<B> {
    fn new(buf: B, why: impl fmt::Display) -> Self {
        SliceError {
            buf,
            msg: format!("cannot take an owned window of the buffer: {why}"),
        }
    }

    /// The buffer, given back.
    #[must_use]
    pub fn into_inner(self) -> B {
        self.buf
    }
}

impl<B> fmt::Debug for SliceError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SliceError").field(&self.msg).finish()
    }
}

impl<B> fmt::Display for SliceError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl<B> std::error::Error for SliceError<B> {}

impl<B> From<SliceError<B>> for io::Error {
    fn from(e: SliceError<B>) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e.msg)
    }
}

/// A heap buffer with a chosen alignment, as `O_DIRECT` reads require
/// (usually 512 or 4096 bytes): `capacity()` bytes of aligned storage, of
/// which the first `len()` are initialised and visible (it derefs to them),
/// like a `Vec<u8>` that cannot grow.
///
/// [`with_capacity`](Self::with_capacity) makes an empty one, for owned
/// reads (which fill `len()..capacity()`); [`new`](Self::new) a zeroed,
/// full one, to use as a plain `&mut [u8]` (or as owned storage through
/// [`slice`](IoBufMut::slice)).
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
/// let (n, mut block) = ctx.read_owned(0, 4096, block).await;
/// assert_eq!((n?, block.len(), block[0]), (4096, 4096, 9));
/// block.clear(); // reuse: empty again, same storage
/// let (n, block) = ctx.read_owned(0, 8192, block).await;
/// assert_eq!((n?, block.as_slice().len()), (1808, 1808)); // to the end of the file
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
    /// few large segments instead of one per 4 KiB page, which makes
    /// sequential `O_DIRECT` reads much faster on devices that pay per
    /// segment, such as virtio disks (the crate's `docs/DESIGN.md`,
    /// "Scans"). Scans of `O_DIRECT` files use it.
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

    /// A huge buffer of at least [`HUGE`] bytes: its own anonymous mapping,
    /// aligned to [`HUGE`] and advised `MADV_HUGEPAGE`, so that its memory
    /// can be transparent huge pages — physically contiguous, which lets an
    /// `O_DIRECT` read reach the device in one segment per 2 MiB instead of
    /// one per 4 KiB page (see DESIGN, "Scans"). Fresh anonymous memory is
    /// zeroed.
    fn map(cap: usize, align: usize) -> io::Result<AlignedBuf> {
        let oom = || {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("could not map a buffer of {cap} bytes"),
            )
        };
        let len = mapped_len(cap);
        // Aligned to 2 MiB, or to `align` where that is more: the global
        // allocator would zero-fill a larger alignment up front, all of it
        // before the buffer's first use.
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
        // Advice only: without transparent huge pages (or with them off) it
        // fails or does nothing, and the buffer still works.
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

    /// The buffer's alignment in bytes.
    #[must_use]
    pub fn align(&self) -> usize {
        self.align
    }

    /// Bytes of storage (the most an owned read can fill).
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

    /// Makes the buffer empty (`len() == 0`), keeping its storage: the
    /// next owned read fills it from the start.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Shortens the buffer to `len` bytes (no effect if it is not longer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
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

/// The length of the mapping of a mapped buffer of `cap` bytes: whole
/// pages. (A last partial 2 MiB stays in small pages: the mapping does not
/// cover a whole huge page there.)
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
        let before = vm_kib();
        for _ in 0..2000 {
            drop(AlignedBuf::new_huge(3 * HUGE + 4097, 4096));
        }
        let grown = vm_kib().saturating_sub(before);
        assert!(grown < 64 << 10, "address space grew by {grown} KiB");
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
    fn slices_check_their_window() {
        let v = b"0123456789".to_vec();
        let s = v.slice(2..8);
        assert_eq!(
            (&s[..], s.bytes_init(), s.bytes_total()),
            (&b"234567"[..], 0, 6)
        );
        let s = s.slice(1..=2);
        assert_eq!((s.begin(), s.end(), &s[..]), (3, 5, &b"34"[..]));
        let e = s.try_slice(1..5).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let v = e.into_inner().into_inner();
        assert_eq!(v, b"0123456789");
        // Beyond the capacity, reversed, past the initialised bytes.
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(b"abc");
        let cap = v.capacity();
        let v = v.try_slice(..=cap).unwrap_err().into_inner();
        #[allow(clippy::reversed_empty_ranges, reason = "the case under test")]
        let v = v.try_slice(3..2).unwrap_err().into_inner();
        let v = v.try_slice(4..).unwrap_err().into_inner();
        let e: io::Error = v.try_slice(usize::MAX..).unwrap_err().into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // A window may start right at the initialised end, and extends it.
        let mut v = Vec::with_capacity(8);
        v.extend_from_slice(b"abc");
        assert!(v.slice(3..6).is_empty());
        let mut v = Vec::with_capacity(8);
        v.extend_from_slice(b"ab");
        let mut s = v.slice(1..5);
        // SAFETY: writes 4 bytes into the window, then claims them.
        unsafe {
            std::ptr::copy_nonoverlapping(b"WXYZ".as_ptr(), s.stable_mut_ptr(), 4);
            s.set_init(4);
        }
        assert_eq!(s.into_inner(), b"aWXYZ");
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
