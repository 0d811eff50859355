//! [`FileId`]: how a file registered with a context is named, and the tag
//! that lets a context refuse ids it did not hand out.

use std::fmt;

/// A file registered with a [`UringContext`](crate::UringContext): its index
/// in the context's file table, and — for ids the context hands out — a tag
/// saying which context and which registration it belongs to.
///
/// There are two kinds of id:
///
/// - **Checked ids**, handed out by a context:
///   [`UringContext::register_file`](crate::UringContext::register_file)
///   returns one, and [`UringContext::file_id`](crate::UringContext::file_id)
///   / [`UringContext::file_ids`](crate::UringContext::file_ids) give them for
///   the files passed to [`UringContext::new`](crate::UringContext::new) (or
///   any file registered now). A checked id carries a process-unique number of the
///   context that issued it and the generation of its registration. Used with
///   another context, or after its file was unregistered (even if the index
///   now holds another file), every call taking it fails with `InvalidInput`
///   saying so; it never reads another file.
/// - **Plain indices**, made with `FileId::from(index)` (every API takes
///   `impl Into<FileId>`, so `ctx.read(0u32, ..)`, `ctx.read(i, ..)` with
///   `i: usize` — an index into the `Vec` of files — and `ctx.read(0, ..)`
///   work): the index in whichever context you pass it to, whatever is
///   registered there now — the origin of a plain index is not checked.
///   Indices are `u32`: a `usize` beyond `u32::MAX` (or a negative `i32`,
///   the type of an unsuffixed literal) converts without a panic to an id
///   that names no file, and every call taking it fails with
///   `InvalidInput` naming the value; it is never truncated to another
///   index.
///
/// The check costs two integer compares per read, on the entry the read
/// looks up anyway. A checked and a plain id for the same file are not
/// equal (`==` compares the tag too); compare [`index`](Self::index)es to
/// ignore it.
///
/// ```
/// use std::io::ErrorKind;
/// use uring_positioned_io::{FileId, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let a = UringContext::new(vec![tempfile::tempfile()?])?;
/// let b = UringContext::new(vec![tempfile::tempfile()?])?;
/// let fid = a.file_id(0)?; // checked: file #0 of `a`
/// assert!(fid.is_tagged() && fid.index() == 0);
/// let mut buf = [0u8; 16];
/// assert_eq!(a.read(fid, 0, &mut buf).await?, 0); // an empty file
/// // The same id on another context is an error, not a read of b's file #0.
/// let err = b.read(fid, 0, &mut buf).await.unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// // A plain index means "file #0 of whichever context": not checked.
/// assert_eq!(b.read(FileId::from(0), 0, &mut buf).await?, 0);
/// # Ok(())
/// # })
/// # }
/// ```
///
/// Indices of any integer type a `Vec` index comes in:
///
/// ```
/// use std::io::ErrorKind;
/// use uring_positioned_io::{FileId, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let files = vec![tempfile::tempfile()?, tempfile::tempfile()?];
/// let ctx = UringContext::new(files)?;
/// let mut buf = [0u8; 8];
/// for i in 0..2usize {
///     assert_eq!(ctx.read(i, 0, &mut buf).await?, 0); // usize: file #i
/// }
/// // Not truncated to file #0: an error naming the index.
/// let huge = FileId::from(1usize << 32);
/// let err = ctx.read(huge, 0, &mut buf).await.unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// assert!(err.to_string().contains("4294967296"), "{err}");
/// assert!(ctx.read(-1, 0, &mut buf).await.is_err());
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    index: u32,
    /// Generation of the registration at `index` (checked ids only).
    gen: u32,
    /// The issuing context's process-unique number; 0 for a plain index.
    ctx: u64,
}

impl FileId {
    /// The raw index; `u32::MAX` for an id made from an integer that is no
    /// `u32` (see [`is_out_of_range`](Self::is_out_of_range)).
    #[must_use]
    pub fn index(self) -> u32 {
        if self.is_out_of_range() {
            u32::MAX
        } else {
            self.index
        }
    }

    /// Whether this id was handed out by a context and is checked against
    /// it (see the [type's documentation](FileId)); false for
    /// `FileId::from(index)`.
    #[must_use]
    pub fn is_tagged(self) -> bool {
        self.ctx != 0 && !self.is_out_of_range()
    }

    /// Whether this id was made from an integer that is no file index: a
    /// `usize` beyond `u32::MAX` or a negative `i32`. It names no file;
    /// every call taking it fails with `InvalidInput`.
    ///
    /// ```
    /// use uring_positioned_io::FileId;
    /// assert!(FileId::from(u64::MAX as usize).is_out_of_range());
    /// assert!(FileId::from(-1).is_out_of_range());
    /// assert!(!FileId::from(7usize).is_out_of_range());
    /// assert_eq!(FileId::from(7usize), FileId::from(7u32));
    /// ```
    #[must_use]
    pub fn is_out_of_range(self) -> bool {
        self.ctx == TOO_LARGE || self.ctx == NEGATIVE
    }

    /// The integer an out-of-range id was made from, as it was given.
    fn raw(self) -> i128 {
        let bits = (u64::from(self.gen) << 32) | u64::from(self.index);
        if self.ctx == NEGATIVE {
            // The bits of an i64 (sign-extended from the i32 given).
            i128::from(i64::from_ne_bytes(bits.to_ne_bytes()))
        } else {
            i128::from(bits)
        }
    }

    /// A checked id: file `index`, registration `gen`, of context `ctx` (≠ 0).
    pub(crate) fn tagged(index: u32, gen: u32, ctx: u64) -> FileId {
        FileId { index, gen, ctx }
    }

    /// The issuing context's number (0 for a plain index).
    pub(crate) fn ctx(self) -> u64 {
        self.ctx
    }

    /// The registration generation (checked ids only).
    pub(crate) fn gen(self) -> u32 {
        self.gen
    }
}

impl From<u32> for FileId {
    /// A plain index: file `index` of whichever context it is used with,
    /// unchecked (see [`FileId`]).
    fn from(index: u32) -> Self {
        FileId {
            index,
            gen: 0,
            ctx: 0,
        }
    }
}

/// Tags of the ids made from integers that are no `u32`, which no context
/// ever has (contexts are numbered up from 1); the integer's bits are kept
/// in `gen` (high half) and `index` (low half), to name it in errors.
const TOO_LARGE: u64 = u64::MAX;
const NEGATIVE: u64 = u64::MAX - 1;

impl FileId {
    fn out_of_range(bits: u64, tag: u64) -> FileId {
        FileId {
            index: u32::try_from(bits & u64::from(u32::MAX)).unwrap_or(u32::MAX),
            gen: u32::try_from(bits >> 32).unwrap_or(u32::MAX),
            ctx: tag,
        }
    }
}

impl From<usize> for FileId {
    /// A plain index, as [`From<u32>`](#impl-From%3Cu32%3E-for-FileId): the
    /// position of a file in the `Vec` given to the context. A value beyond
    /// `u32::MAX` makes an id that names no file (see
    /// [`is_out_of_range`](FileId::is_out_of_range)): calls taking it fail
    /// with `InvalidInput`; it does not panic and is not truncated.
    fn from(index: usize) -> Self {
        match u32::try_from(index) {
            Ok(index) => FileId::from(index),
            Err(_) => FileId::out_of_range(index as u64, TOO_LARGE),
        }
    }
}

impl From<i32> for FileId {
    /// A plain index given as an `i32`, the type an unsuffixed literal
    /// falls back to (`ctx.read(0, ..)`, with `FileId` implementing
    /// `From` for more than one integer type). A negative value makes an
    /// id that names no file (see
    /// [`is_out_of_range`](FileId::is_out_of_range)).
    fn from(index: i32) -> Self {
        match u32::try_from(index) {
            Ok(index) => FileId::from(index),
            Err(_) => {
                FileId::out_of_range(u64::from_ne_bytes(i64::from(index).to_ne_bytes()), NEGATIVE)
            }
        }
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_out_of_range() {
            write!(f, "file #{}", self.raw())
        } else {
            write!(f, "file #{}", self.index)
        }
    }
}

impl fmt::Debug for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_out_of_range() {
            write!(f, "FileId({}, out of range)", self.raw())
        } else if self.is_tagged() {
            write!(
                f,
                "FileId({}, context {}, generation {})",
                self.index, self.ctx, self.gen
            )
        } else {
            write!(f, "FileId({})", self.index)
        }
    }
}
