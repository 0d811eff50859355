//! Owned windows of a buffer: [`Slice`], made by [`IoBufMut::slice`], and
//! [`SliceError`], the window that does not fit.

use std::fmt;
use std::io;
use std::ops::{Bound, Deref, DerefMut, RangeBounds};

use super::{IoBuf, IoBufMut};

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
/// start**, at most `end - begin` bytes (its `bytes_total()`), whatever it
/// held, and leaves the bytes around it as they were; the buffer's
/// initialised length grows to cover the bytes read if they end beyond it.
/// It is how to give an owned read an explicit length: `buf.slice(..n)`
/// reads `n` bytes (at most) into the start of `buf`.
/// [`into_inner`](Self::into_inner) gives the whole buffer back.
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
    /// The window `range` of the whole of `buf`, or an error that hands
    /// `buf` back ([`IoBufMut::try_slice`]).
    pub(super) fn new(buf: B, range: impl RangeBounds<usize>) -> Result<Slice<B>, SliceError<B>> {
        let (init, total) = (buf.bytes_init(), buf.bytes_total());
        match window(&range, 0, total) {
            Some((begin, end)) if begin <= init => Ok(Slice { buf, begin, end }),
            Some((begin, _)) => Err(SliceError::new(
                buf,
                format!("the window starts at {begin}, beyond its {init} initialised bytes"),
            )),
            None => Err(SliceError::new(
                buf,
                format!(
                    "the window {:?}..{:?} does not fit in its {total} bytes",
                    range.start_bound(),
                    range.end_bound()
                ),
            )),
        }
    }

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
// buffer's own IoBufMut promises stable. bytes_init() is the initialised
// part of the window, which only grows (the buffer's never lowers);
// `set_init` hands the buffer `begin + pos`, whose first `begin` bytes
// were initialised already (begin <= bytes_init() of the buffer) and whose
// rest the caller promises initialised, and the buffer never lowers its
// own length.
unsafe impl<B: IoBufMut> IoBufMut for Slice<B> {
    fn stable_ptr(&self) -> *const u8 {
        self.buf.stable_ptr().wrapping_add(self.begin)
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.buf.stable_mut_ptr().wrapping_add(self.begin)
    }
    fn bytes_init(&self) -> usize {
        self.init_len()
    }
    fn bytes_total(&self) -> usize {
        self.end - self.begin
    }
    fn registered(&self) -> Option<super::Registered> {
        self.buf.registered()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_check_their_window() {
        let v = b"0123456789".to_vec();
        let s = v.slice(2..8);
        assert_eq!(
            (&s[..], s.bytes_init(), s.bytes_total()),
            (&b"234567"[..], 6, 6)
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
}
