//! Typed flags for the ops that take them: [`FallocateMode`] for
//! `fallocate(2)` and [`SyncRange`] for `sync_file_range(2)`. Small
//! newtypes over the kernel's bits, with associated constants and `|`:
//! only the flags the crate passes on and accounts for (a block cache
//! drops what each `fallocate` mode may change) can be named.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// The flag type's common methods and operators; `$names` are the named
/// flags, in `Debug` order; `$first` and `$second` two of them for the
/// examples, `$libc` the constant `$first` stands for.
macro_rules! flags {
    ($t:ident, $bits:ty, $first:ident = $libc:literal, $second:ident, [$($name:ident),*]) => {
        impl $t {
            #[doc = concat!(
                "No flag set (the `Default`).\n\n```\n",
                "use uring_positioned_io::", stringify!($t), ";\n",
                "assert!(", stringify!($t), "::empty().is_empty());\n",
                "assert_eq!(", stringify!($t), "::empty(), ", stringify!($t), "::default());\n",
                "```"
            )]
            #[must_use]
            pub const fn empty() -> Self {
                $t(0)
            }

            #[doc = concat!(
                "The bits passed to the kernel.\n\n```\n",
                "use uring_positioned_io::", stringify!($t), ";\n",
                "assert_eq!(", stringify!($t), "::", stringify!($first), ".bits(), ", $libc, ");\n",
                "```"
            )]
            #[must_use]
            pub const fn bits(self) -> $bits {
                self.0
            }

            #[doc = concat!(
                "Whether every flag of `other` is set in `self`.\n\n```\n",
                "use uring_positioned_io::", stringify!($t), ";\n",
                "let both = ", stringify!($t), "::", stringify!($first), " | ",
                stringify!($t), "::", stringify!($second), ";\n",
                "assert!(both.contains(", stringify!($t), "::", stringify!($first), "));\n",
                "assert!(!", stringify!($t), "::", stringify!($first), ".contains(both));\n",
                "```"
            )]
            #[must_use]
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            #[doc = concat!(
                "Whether no flag is set.\n\n```\n",
                "use uring_positioned_io::", stringify!($t), ";\n",
                "assert!(!", stringify!($t), "::", stringify!($first), ".is_empty());\n",
                "```"
            )]
            #[must_use]
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl BitOr for $t {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                $t(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $t {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let names: Vec<&str> = [$((stringify!($name), $t::$name)),*]
                    .into_iter()
                    .filter(|(_, flag)| self.contains(*flag))
                    .map(|(name, _)| name)
                    .collect();
                if names.is_empty() {
                    write!(f, "{}(empty)", stringify!($t))
                } else {
                    write!(f, "{}({})", stringify!($t), names.join(" | "))
                }
            }
        }
    };
}

/// The mode of [`UringContext::fallocate`](crate::UringContext::fallocate)
/// and [`UringFile::fallocate`](crate::UringFile::fallocate): the
/// `FALLOC_FL_*` flags of `fallocate(2)`, combined with `|`. The empty mode
/// ([`FallocateMode::ALLOCATE`], the `Default`) allocates the range and
/// extends the file to cover it. Which modes a file system supports is its
/// own: one it lacks fails with the kernel's `EOPNOTSUPP`, and so does a
/// combination the kernel refuses (such as `PUNCH_HOLE` without
/// `KEEP_SIZE`).
///
/// ```
/// use uring_positioned_io::{FallocateMode, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
/// ctx.write_all(0, 0, &[1u8; 8192]).await?;
/// // Deallocate 4 KiB in the middle; the size stays, the hole reads as zeroes.
/// let hole = FallocateMode::PUNCH_HOLE | FallocateMode::KEEP_SIZE;
/// assert_eq!(hole.bits(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE);
/// match ctx.fallocate(0, hole, 4096, 4096).await {
///     Ok(()) => {
///         let mut buf = [9u8; 4096];
///         ctx.read_exact(0, 4096, &mut buf).await?;
///         assert!(buf.iter().all(|&b| b == 0));
///     }
///     // A file system without holes.
///     Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP)),
/// }
/// assert_eq!(ctx.file_size(0).await?, 8192);
/// assert_eq!(format!("{hole:?}"), "FallocateMode(KEEP_SIZE | PUNCH_HOLE)");
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FallocateMode(i32);

impl FallocateMode {
    /// No flag: allocate the range, extending the file if it ends before
    /// the range does (mode 0).
    pub const ALLOCATE: FallocateMode = FallocateMode(0);
    /// `FALLOC_FL_KEEP_SIZE`: allocate (or, with `PUNCH_HOLE`, deallocate)
    /// without changing the file's size.
    pub const KEEP_SIZE: FallocateMode = FallocateMode(libc::FALLOC_FL_KEEP_SIZE);
    /// `FALLOC_FL_PUNCH_HOLE`: deallocate the range, which then reads as
    /// zeroes; the kernel requires `KEEP_SIZE` with it.
    pub const PUNCH_HOLE: FallocateMode = FallocateMode(libc::FALLOC_FL_PUNCH_HOLE);
    /// `FALLOC_FL_ZERO_RANGE`: zero the range (allocated, unlike a hole);
    /// with `KEEP_SIZE` the size does not grow.
    pub const ZERO_RANGE: FallocateMode = FallocateMode(libc::FALLOC_FL_ZERO_RANGE);
    /// `FALLOC_FL_COLLAPSE_RANGE`: remove the range, moving every byte
    /// after it down (file-system-block-aligned ranges only).
    pub const COLLAPSE_RANGE: FallocateMode = FallocateMode(libc::FALLOC_FL_COLLAPSE_RANGE);
    /// `FALLOC_FL_INSERT_RANGE`: insert a hole at the range, moving every
    /// byte after it up (file-system-block-aligned ranges only).
    pub const INSERT_RANGE: FallocateMode = FallocateMode(libc::FALLOC_FL_INSERT_RANGE);
}

flags!(
    FallocateMode,
    i32,
    KEEP_SIZE = "libc::FALLOC_FL_KEEP_SIZE",
    PUNCH_HOLE,
    [
        KEEP_SIZE,
        PUNCH_HOLE,
        ZERO_RANGE,
        COLLAPSE_RANGE,
        INSERT_RANGE
    ]
);

/// The flags of [`UringContext::sync_file_range`](crate::UringContext::sync_file_range)
/// and [`UringFile::sync_range`](crate::UringFile::sync_range): the
/// `SYNC_FILE_RANGE_*` flags of `sync_file_range(2)`, combined with `|`.
/// None of them makes writes durable (no metadata, no device cache flush):
/// they pace writeback.
///
/// ```
/// use uring_positioned_io::{SyncRange, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
/// ctx.write_all(0, 0, &[1u8; 8192]).await?;
/// // Start writeback of the range and wait for it.
/// let flags = SyncRange::WAIT_BEFORE | SyncRange::WRITE | SyncRange::WAIT_AFTER;
/// assert_eq!(flags, SyncRange::WRITE_AND_WAIT);
/// ctx.sync_file_range(0, 0, 8192, flags).await?;
/// // Only start it.
/// ctx.sync_file_range(0, 0, 0, SyncRange::WRITE).await?;
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SyncRange(u32);

impl SyncRange {
    /// `SYNC_FILE_RANGE_WAIT_BEFORE`: wait for writeback of the range
    /// already under way before anything else.
    pub const WAIT_BEFORE: SyncRange = SyncRange(libc::SYNC_FILE_RANGE_WAIT_BEFORE);
    /// `SYNC_FILE_RANGE_WRITE`: start writeback of the range's dirty pages.
    pub const WRITE: SyncRange = SyncRange(libc::SYNC_FILE_RANGE_WRITE);
    /// `SYNC_FILE_RANGE_WAIT_AFTER`: wait for the range's writeback to end.
    pub const WAIT_AFTER: SyncRange = SyncRange(libc::SYNC_FILE_RANGE_WAIT_AFTER);
    /// All three: write the range back and wait for it (still not durable).
    pub const WRITE_AND_WAIT: SyncRange = SyncRange(
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER,
    );
}

flags!(
    SyncRange,
    u32,
    WRITE = "libc::SYNC_FILE_RANGE_WRITE",
    WAIT_AFTER,
    [WAIT_BEFORE, WRITE, WAIT_AFTER]
);
