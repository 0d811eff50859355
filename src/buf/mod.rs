//! Buffers the kernel may write into or write from: the [`IoBufMut`]
//! contract for owned buffers and its implementations (`Vec<u8>`,
//! `Box<[u8]>`, [`AlignedBuf`], `bytes::BytesMut` with the `bytes`
//! feature), and [`IoBuf`], its read side for owned writes. The rest is
//! split by type:
//!
//! | file | what |
//! |---|---|
//! | `slice.rs` | [`Slice`], an owned window of a buffer, and [`SliceError`] |
//! | `aligned.rs` | [`AlignedBuf`] for `O_DIRECT`, with its huge-page mappings |
//!
//! The per-ring bounce-buffer pool is the ring's own (`ring/pool.rs`).

use std::ops::RangeBounds;

mod aligned;
mod slice;

pub use aligned::AlignedBuf;
pub use slice::{Slice, SliceError};

/// Where a buffer's storage is registered with a context's rings (see
/// [`IoBufMut::registered`]): region `region` of the registered-memory
/// table of the context whose rings carry `owner`. Made only by the crate.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    pub(crate) owner: u64,
    pub(crate) region: u16,
}

/// Page alignment of every bounce buffer, so borrowed reads also work on
/// files opened with `O_DIRECT`.
pub(crate) const BOUNCE_ALIGN: usize = 4096;

/// A buffer that can be handed to the kernel by value for a zero-copy read
/// ([`UringContext::read_owned`](crate::UringContext::read_owned) and the
/// other owned reads). **An owned read writes at the buffer's start, at
/// most `bytes_total()` bytes** — a `Vec`'s `capacity()`, not its `len()`
/// — and to read `n` bytes you read into [`buf.slice(..n)`](Self::slice).
///
/// A buffer has `bytes_total()` bytes of storage at
/// [`stable_mut_ptr`](Self::stable_mut_ptr), of which the first
/// `bytes_init()` are initialised (a `Vec`'s `len()` of its `capacity()`).
/// After a read of `n` bytes the crate calls [`set_init(n)`](Self::set_init),
/// which raises the initialised length to `n` if it is shorter and never
/// lowers it: `vec![0u8; 4096]` read with `n == 10` keeps `len() == 4096`
/// (its first 10 bytes are the file's), and `Vec::with_capacity(4096)` comes
/// back with `len() == 10`. This is the meaning tokio-uring, monoio and
/// compio give these methods. A read into a buffer that already holds bytes
/// overwrites them from the start; the returned count says how many bytes
/// are the file's. A buffer with no storage (`bytes_total() == 0`, e.g.
/// `Vec::new()`) is an error (`InvalidInput`), not a read of nothing that
/// would look like the end of the file. A [`Slice`] — a window
/// `begin..end` of a buffer — is read from the window's start, at most
/// `end - begin` bytes, leaving the bytes around it as they were.
///
/// ```
/// # use std::io::Write;
/// use uring_positioned_io::{IoBufMut, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # let mut file = tempfile::tempfile()?;
/// # file.write_all(b"0123456789")?;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![file])?;
/// // A full Vec is read from its start; its len() stays.
/// let (n, buf) = ctx.read_owned(0, 4, vec![b'.'; 8]).await;
/// assert_eq!((n?, &buf[..]), (6, &b"456789.."[..]));
/// // An empty Vec with capacity comes back with len() the count.
/// let (n, buf) = ctx.read_owned(0, 0, Vec::with_capacity(64)).await;
/// assert_eq!((n?, &buf[..]), (10, &b"0123456789"[..]));
/// // Exactly 3 bytes, into bytes 2..5: a window.
/// let (n, buf) = ctx.read_owned(0, 0, vec![b'.'; 8].slice(2..5)).await;
/// assert_eq!((n?, &buf.into_inner()[..]), (3, &b"..012..."[..]));
/// # Ok(())
/// # })
/// # }
/// ```
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
///   reads and writes (a read writes anywhere in them, initialised or
///   not); that memory neither moves nor is freed while the value is
///   alive, *even when the value itself is moved* (heap storage, not
///   inline storage), and nothing else reads or writes it while the crate
///   holds the value.
/// - `bytes_init() <= bytes_total()`, and the first `bytes_init()` bytes are
///   initialised.
/// - `bytes_init()` and `bytes_total()` change only through `&mut self`
///   (the crate reads `bytes_total()` once, when a read starts, and holds
///   the value until it is over), and [`set_init`](Self::set_init) never
///   lowers `bytes_init()` (it may raise it to `pos`, which the caller
///   promises initialised; the crate calls it with the count of a read).
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

    /// How many bytes from the start are initialised (a `Vec`'s `len()`).
    /// A read does not look at it: it writes from the start whatever it is.
    fn bytes_init(&self) -> usize;

    /// Size of the storage in bytes (a `Vec`'s `capacity()`): how many bytes
    /// an owned read may write, from the start.
    fn bytes_total(&self) -> usize;

    /// Records that the first `pos` bytes are initialised: the crate calls
    /// it after a read of `n` bytes with `pos = n`. A buffer with a length
    /// raises it to `pos` if it is shorter, and never lowers it.
    ///
    /// # Safety
    ///
    /// `pos <= bytes_total()`, and the first `pos` bytes at
    /// [`stable_mut_ptr`](Self::stable_mut_ptr) are initialised.
    unsafe fn set_init(&mut self, pos: usize);

    /// Not part of the public API: the fixed buffer of a context's rings
    /// that holds this storage (the block cache's frames), which makes a
    /// ring read into it a `READ_FIXED`. Only the crate can make a
    /// [`Registered`]; the kernel checks the range all the same.
    #[doc(hidden)]
    fn registered(&self) -> Option<Registered> {
        None
    }

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
        Slice::new(self, range)
    }
}

/// A read fills it from index 0 up to its `capacity()`; its `len()` is
/// raised to the count if shorter (`Vec::with_capacity(n)` comes back with
/// `len()` the count, `vec![0u8; n]` keeps `len() == n`).
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

/// All initialised (`bytes_init() == bytes_total() == len()`): a read
/// fills it from its start, up to its length.
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

/// With the `bytes` feature: as a `Vec`, a read fills it from the start of
/// its view up to its `capacity()`, and raises its `len()` to the count if
/// shorter (never lowers it).
// SAFETY: a BytesMut's storage is a heap allocation (never inline) that it
// views uniquely — other handles split off it view disjoint ranges — and
// that does not move when the BytesMut moves; `as_mut_ptr()` is the start
// of its view and `capacity()` bytes from there are its own; its first
// `len()` bytes are initialised, and `set_len` only grows here.
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
