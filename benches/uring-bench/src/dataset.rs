//! The dataset: `files` files of `file_size` bytes, every 4 KiB block a pure
//! function of (seed, file, block) (see [`crate::verify`]). A manifest records
//! the parameters so a matching dataset is reused instead of regenerated.

use crate::kinds::Regime;
use crate::verify::{fill_block, verify_block, VerifyMode, BLOCK};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const FORMAT: &str = "uring-bench-dataset-v1";
const MANIFEST: &str = "manifest.json";
const CHUNK: usize = 1 << 20;

/// What the dataset must look like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub files: u32,
    pub file_size: u64,
    pub block_size: u64,
    pub seed: u64,
}

/// A generated (or reused) dataset on disk.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub dir: PathBuf,
    pub files: u32,
    pub file_size: u64,
    pub seed: u64,
    pub paths: Vec<PathBuf>,
    /// Whether `ensure` had to write the data (false: reused).
    pub generated: bool,
}

/// Generation progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Bar,
    Quiet,
}

fn file_path(dir: &Path, i: u32) -> PathBuf {
    dir.join(format!("data-{i:04}.bin"))
}

/// Threads that generate or warm the dataset: one per CPU, at most 8 (2 if
/// the CPU count is unknown).
fn io_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(8))
}

pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Free bytes available to this user on the filesystem holding `dir`.
pub fn free_space(dir: &Path) -> io::Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is plain integers, for which all zeroes is valid.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated; statvfs writes only into the struct we own.
    if unsafe { libc::statvfs(c.as_ptr(), &raw mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

impl Dataset {
    pub fn blocks_per_file(&self) -> u64 {
        self.file_size / BLOCK as u64
    }

    pub fn total_bytes(&self) -> u64 {
        u64::from(self.files) * self.file_size
    }

    /// Reuses the dataset in `dir` if its manifest and files match, otherwise
    /// generates it (unless `allow_generate` is false, which gives an error).
    pub fn ensure(
        dir: &Path,
        files: u32,
        file_size: u64,
        seed: u64,
        allow_generate: bool,
        progress: Progress,
    ) -> Result<Dataset, String> {
        if files == 0 {
            return Err("--files must be at least 1".into());
        }
        if file_size < BLOCK as u64 || file_size % BLOCK as u64 != 0 {
            return Err(format!(
                "--file-size must be a non-zero multiple of {BLOCK} bytes (got {file_size})"
            ));
        }
        let want = Manifest {
            format: FORMAT.into(),
            files,
            file_size,
            block_size: BLOCK as u64,
            seed,
        };
        let mut ds = Dataset {
            dir: dir.to_path_buf(),
            files,
            file_size,
            seed,
            paths: (0..files).map(|i| file_path(dir, i)).collect(),
            generated: false,
        };
        match ds.check_existing(&want) {
            Ok(()) => return Ok(ds),
            Err(why) if !allow_generate => {
                return Err(format!(
                    "no usable dataset in {}: {why}. Run without --no-generate to create it \
                     ({files} files x {:.2} GiB).",
                    dir.display(),
                    gib(file_size)
                ))
            }
            Err(_) => {}
        }
        ds.generate(&want, progress)?;
        ds.generated = true;
        Ok(ds)
    }

    fn check_existing(&self, want: &Manifest) -> Result<(), String> {
        let text = std::fs::read_to_string(self.dir.join(MANIFEST))
            .map_err(|e| format!("cannot read {}: {e}", self.dir.join(MANIFEST).display()))?;
        let have: Manifest =
            serde_json::from_str(&text).map_err(|e| format!("unreadable manifest: {e}"))?;
        // A dataset with more files of the same size and seed contains ours
        // (file i is the same in both), so it is reused as is.
        let superset = Manifest {
            files: have.files,
            ..want.clone()
        };
        if have != superset || have.files < want.files {
            return Err(format!(
                "manifest describes {} files x {} bytes (seed {:#x}), wanted {} x {} (seed {:#x})",
                have.files, have.file_size, have.seed, want.files, want.file_size, want.seed
            ));
        }
        let mut buf = vec![0u8; BLOCK];
        for (i, p) in self.paths.iter().enumerate() {
            let f = File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let len = f.metadata().map_err(|e| e.to_string())?.len();
            if len != self.file_size {
                return Err(format!(
                    "{} has {len} bytes, expected {}",
                    p.display(),
                    self.file_size
                ));
            }
            // spot-check the first and last block of every file
            for b in [0, self.blocks_per_file() - 1] {
                f.read_exact_at(&mut buf, b * BLOCK as u64)
                    .map_err(|e| format!("{}: {e}", p.display()))?;
                verify_block(VerifyMode::Full, self.seed, i as u32, b, &buf)
                    .map_err(|e| format!("{}: {e}", p.display()))?;
            }
        }
        Ok(())
    }

    fn generate(&self, want: &Manifest, progress: Progress) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let _ = std::fs::remove_file(self.dir.join(MANIFEST));
        // Space already used by our own files will be overwritten in place.
        let reusable: u64 = self
            .paths
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len().min(self.file_size))
            .sum();
        let need = self.total_bytes().saturating_sub(reusable);
        let free =
            free_space(&self.dir).map_err(|e| format!("statvfs {}: {e}", self.dir.display()))?;
        let margin = 256 << 20;
        if need + margin > free {
            return Err(format!(
                "not enough disk space in {}: the dataset needs {:.2} GiB more ({} files x {:.2} GiB) \
                 plus {:.2} GiB headroom, but only {:.2} GiB is available. Use --data-dir on a bigger \
                 filesystem or fewer/smaller files (--files, --file-size).",
                self.dir.display(),
                gib(need),
                self.files,
                gib(self.file_size),
                gib(margin),
                gib(free)
            ));
        }
        let bar = match progress {
            Progress::Bar => {
                let b = indicatif::ProgressBar::new(self.total_bytes());
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "generating dataset [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
                    )
                    .expect("valid template")
                    .progress_chars("=> "),
                );
                b
            }
            Progress::Quiet => indicatif::ProgressBar::hidden(),
        };
        let next = AtomicU64::new(0);
        let threads = io_threads();
        let result: Result<(), String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| -> Result<(), String> {
                        let mut chunk = vec![0u8; CHUNK];
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= u64::from(self.files) {
                                return Ok(());
                            }
                            let i = i as u32;
                            let p = &self.paths[i as usize];
                            let f = OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(false)
                                .open(p)
                                .map_err(|e| format!("create {}: {e}", p.display()))?;
                            f.set_len(self.file_size)
                                .map_err(|e| format!("{}: {e}", p.display()))?;
                            let mut off = 0u64;
                            while off < self.file_size {
                                let n = (self.file_size - off).min(CHUNK as u64) as usize;
                                for (j, blk) in chunk[..n].chunks_exact_mut(BLOCK).enumerate() {
                                    let b = off / BLOCK as u64 + j as u64;
                                    fill_block(self.seed, i, b, blk);
                                }
                                f.write_all_at(&chunk[..n], off)
                                    .map_err(|e| format!("write {} at {off}: {e}", p.display()))?;
                                off += n as u64;
                                bar.inc(n as u64);
                            }
                            f.sync_all()
                                .map_err(|e| format!("fsync {}: {e}", p.display()))?;
                        }
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("generator thread panicked".into()))
            })
        });
        bar.finish_and_clear();
        result?;
        let text = serde_json::to_string_pretty(want).expect("manifest serialises");
        std::fs::write(self.dir.join(MANIFEST), text)
            .map_err(|e| format!("write manifest in {}: {e}", self.dir.display()))?;
        Ok(())
    }

    /// Opens files `0..n` read-only, optionally with O_DIRECT.
    pub fn open(&self, n: u32, direct: bool) -> io::Result<Vec<File>> {
        self.paths[..n as usize]
            .iter()
            .map(|p| {
                let mut o = OpenOptions::new();
                o.read(true);
                if direct {
                    o.custom_flags(libc::O_DIRECT);
                }
                o.open(p)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
            })
            .collect()
    }

    /// Opens files `0..n` for an engine: like [`Dataset::open`], and buffered
    /// descriptors get POSIX_FADV_RANDOM (no readahead) — the same hint the
    /// mmap engine gives with MADV_RANDOM and fio gives by default.
    pub fn open_for_random_reads(&self, n: u32, direct: bool) -> io::Result<Vec<File>> {
        let files = self.open(n, direct)?;
        if !direct {
            for f in &files {
                // SAFETY: valid fd for the duration of the call.
                let r =
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
                if r != 0 {
                    return Err(io::Error::from_raw_os_error(r));
                }
            }
        }
        Ok(files)
    }

    /// Drops every dataset file's clean pages from the page cache
    /// (posix_fadvise DONTNEED; needs no privileges). Pages mapped by a live
    /// mapping stay, so engines must have unmapped before this is called.
    pub fn evict(&self) -> io::Result<()> {
        for f in self.open(self.files, false)? {
            fadvise(&f, libc::POSIX_FADV_DONTNEED)?;
        }
        Ok(())
    }

    /// Fraction of the pages of files `0..n` resident in the page cache (mincore).
    pub fn residency(&self, n: u32) -> io::Result<f64> {
        let (mut resident, mut total) = (0u64, 0u64);
        for f in self.open(n, false)? {
            let (r, t) = resident_pages(&f)?;
            resident += r;
            total += t;
        }
        Ok(if total == 0 {
            0.0
        } else {
            resident as f64 / total as f64
        })
    }

    /// Reads files `0..n` once so they are in the page cache (skips files
    /// that are already fully resident).
    pub fn warm(&self, n: u32) -> io::Result<()> {
        let files = self.open(n, false)?;
        let next = AtomicU64::new(0);
        let threads = io_threads();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| -> io::Result<()> {
                        let mut buf = vec![0u8; CHUNK];
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                            let Some(f) = files.get(i) else { return Ok(()) };
                            let mut off = 0u64;
                            while off < self.file_size {
                                let n = f.read_at(&mut buf, off)?;
                                if n == 0 {
                                    break;
                                }
                                off += n as u64;
                            }
                        }
                    })
                })
                .collect();
            hs.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("warm thread panicked")))
            })
        })
    }

    /// Applies the regime before a cell (hot: files `0..hot_files` read into
    /// the page cache unless already there; cold: every file evicted);
    /// returns the measured residency (None for direct).
    pub fn prepare(
        &self,
        regime: Regime,
        hot_files: u32,
        quiet: bool,
    ) -> Result<Option<f64>, String> {
        match regime {
            Regime::Hot => {
                let r = self
                    .residency(hot_files)
                    .map_err(|e| format!("mincore: {e}"))?;
                if r < 0.999 {
                    if !quiet {
                        println!(
                            "warming the hot set ({hot_files} files, {:.0}% cached)",
                            r * 100.0
                        );
                    }
                    self.warm(hot_files)
                        .map_err(|e| format!("warming the hot set: {e}"))?;
                    return Ok(Some(
                        self.residency(hot_files)
                            .map_err(|e| format!("mincore: {e}"))?,
                    ));
                }
                Ok(Some(r))
            }
            Regime::Cold => {
                self.evict()
                    .map_err(|e| format!("posix_fadvise(DONTNEED): {e}"))?;
                Ok(Some(
                    self.residency(self.files)
                        .map_err(|e| format!("mincore: {e}"))?,
                ))
            }
            Regime::Direct => Ok(None),
        }
    }
}

/// `posix_fadvise(f, 0, 0, advice)`: the whole file.
pub fn fadvise(f: &File, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: valid fd for the duration of the call.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, advice) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// Pages of `f` resident in the page cache, and its pages in all (mincore).
pub fn resident_pages(f: &File) -> io::Result<(u64, u64)> {
    if f.metadata()?.len() == 0 {
        return Ok((0, 0));
    }
    // SAFETY: read-only shared mapping of a file the caller keeps open;
    // only queried with mincore, never dereferenced.
    let map = unsafe { memmap2::Mmap::map(f)? };
    let pages = map.len().div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: vec has one byte per page of the mapping.
    let r = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            vec.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let resident = vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
    Ok((resident, pages as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_reuse_verify_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let d = Dataset::ensure(dir.path(), 3, 64 * 1024, 7, true, Progress::Quiet).unwrap();
        assert!(d.generated);
        let again = Dataset::ensure(dir.path(), 3, 64 * 1024, 7, false, Progress::Quiet).unwrap();
        assert!(!again.generated);
        // a subset of an existing dataset is reused too
        let fewer = Dataset::ensure(dir.path(), 2, 64 * 1024, 7, false, Progress::Quiet).unwrap();
        assert!(!fewer.generated);
        assert_eq!(fewer.paths.len(), 2);
        let mut buf = vec![0u8; BLOCK];
        let files = d.open(3, false).unwrap();
        for (i, f) in files.iter().enumerate() {
            for b in 0..d.blocks_per_file() {
                f.read_exact_at(&mut buf, b * BLOCK as u64).unwrap();
                verify_block(VerifyMode::Checksum, 7, i as u32, b, &buf).unwrap();
                verify_block(VerifyMode::Full, 7, i as u32, b, &buf).unwrap();
            }
        }
        // different parameters: no reuse without generation
        let e = Dataset::ensure(dir.path(), 4, 64 * 1024, 7, false, Progress::Quiet).unwrap_err();
        assert!(e.contains("no usable dataset"), "{e}");
        d.evict().unwrap();
        d.warm(3).unwrap();
        assert!(d.residency(3).unwrap() > 0.0);
    }

    #[test]
    fn disk_space_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let e = Dataset::ensure(dir.path(), 1000, 1 << 40, 7, true, Progress::Quiet).unwrap_err();
        assert!(e.contains("not enough disk space"), "{e}");
    }
}
