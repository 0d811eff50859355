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
///   `impl Into<FileId>`, so `ctx.read(0u32, ..)` works): the index in
///   whichever context you pass it to, whatever is registered there now —
///   the origin of a plain index is not checked.
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
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    index: u32,
    /// Generation of the registration at `index` (checked ids only).
    gen: u32,
    /// The issuing context's process-unique number; 0 for a plain index.
    ctx: u64,
}

impl FileId {
    /// The raw index.
    #[must_use]
    pub fn index(self) -> u32 {
        self.index
    }

    /// Whether this id was handed out by a context and is checked against
    /// it (see the [type's documentation](FileId)); false for
    /// `FileId::from(index)`.
    #[must_use]
    pub fn is_tagged(self) -> bool {
        self.ctx != 0
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

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file #{}", self.index)
    }
}

impl fmt::Debug for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_tagged() {
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
