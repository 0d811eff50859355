//! A reference for `uring-bench lines`, not a method of the study: the
//! fastest a *copying* reader is likely to count a cached file on two CPUs,
//! written by hand without a runtime or a ring. One thread `pread`s 1 MiB
//! chunks into a ring of 8 page-aligned buffers; the counting thread counts
//! them in file order and reads every fourth chunk itself (the split the
//! crate's scan uses, `CONSUMER_SHARE`), so both CPUs copy and one counts.
//! The threads hand chunks over with atomics and `park`/`unpark`, no
//! spinning.
//!
//! It answers what the crate's hot scan is measured against: how close to
//! `mmap` + `memchr` (no copy at all) a reader that copies out of the page
//! cache can get on this machine, in the same run.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use uring_positioned_io::AlignedBuf;

const CHUNK: usize = 1 << 20;
const BUFS: usize = 8;
/// Chunk `k` is read by the counting thread when `k % SHARE == SHARE - 1`.
const SHARE: usize = 4;
/// `filled[k]` before chunk `k` is read.
const EMPTY: usize = usize::MAX;
/// `filled[k]` when the reading thread failed at chunk `k`.
const FAILED: usize = usize::MAX - 1;

/// One of the buffers, written by one thread at a time (see `count`).
struct Buf(std::cell::UnsafeCell<AlignedBuf>);

// SAFETY: the threads hand each buffer over through `filled` (Release, then
// Acquire) and `consumed` (the same): at any moment one thread owns it.
unsafe impl Sync for Buf {}

/// Reads `len` bytes at `off` into `buf` (less only at end of file).
fn fill(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Counts `p`'s lines with `count_chunk`; returns the count and the reads.
pub fn count(p: &Path, count_chunk: fn(&[u8]) -> u64) -> io::Result<(u64, Option<u64>)> {
    let file = File::open(p)?;
    let len = file.metadata()?.len();
    let chunks = usize::try_from(len.div_ceil(CHUNK as u64)).map_err(io::Error::other)?;
    let bufs: Vec<Buf> = (0..BUFS)
        .map(|_| Buf(std::cell::UnsafeCell::new(AlignedBuf::new(CHUNK, 4096))))
        .collect();
    // Bytes read into chunk k (or EMPTY, FAILED), published by the reader.
    let filled: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(EMPTY)).collect();
    // Chunks the counting thread is done with; the reader may fill chunk k
    // once k < consumed + BUFS.
    let consumed = AtomicUsize::new(0);
    let gave_up = AtomicBool::new(false);
    let counter = thread::current();
    thread::scope(|s| {
        let reader = s.spawn(|| -> io::Result<u64> {
            let mut reads = 0;
            for k in (0..chunks).filter(|k| k % SHARE != SHARE - 1) {
                while k >= consumed.load(Ordering::Acquire) + BUFS {
                    if gave_up.load(Ordering::Acquire) {
                        return Ok(reads);
                    }
                    thread::park();
                }
                // SAFETY: buffer k % BUFS was last used for chunk k - BUFS (or
                // never), which the counting thread is done with (consumed >
                // k - BUFS, read with Acquire); it will not touch the buffer
                // again until filled[k] is published below. No other chunk
                // below consumed + BUFS maps to it.
                let buf = unsafe { &mut *bufs[k % BUFS].0.get() };
                let r = fill(&file, &mut buf[..], (k * CHUNK) as u64);
                reads += 1;
                let got = match r {
                    Ok(n) => n,
                    Err(e) => {
                        filled[k].store(FAILED, Ordering::Release);
                        counter.unpark();
                        return Err(e);
                    }
                };
                filled[k].store(got, Ordering::Release);
                counter.unpark();
            }
            Ok(reads)
        });
        let counted = (|| -> io::Result<(u64, u64)> {
            let (mut n, mut reads) = (0, 0);
            for k in 0..chunks {
                let got = if k % SHARE == SHARE - 1 {
                    // SAFETY: consumed == k: the reader fills only its own
                    // chunks below k + BUFS, and none of them maps to this
                    // buffer (k is the only one in k..k + BUFS that does).
                    let buf = unsafe { &mut *bufs[k % BUFS].0.get() };
                    reads += 1;
                    fill(&file, &mut buf[..], (k * CHUNK) as u64)?
                } else {
                    loop {
                        match filled[k].load(Ordering::Acquire) {
                            EMPTY => thread::park(),
                            FAILED => return Err(io::Error::other("the reading thread failed")),
                            got => break got,
                        }
                    }
                };
                // SAFETY: the buffer holds chunk k, published by the reader
                // (Acquire above) or read by this thread; the reader will not
                // write it again before `consumed` passes k.
                let buf = unsafe { &*bufs[k % BUFS].0.get() };
                n += count_chunk(&buf[..got]);
                consumed.store(k + 1, Ordering::Release);
                reader.thread().unpark();
            }
            Ok((n, reads))
        })();
        if counted.is_err() {
            gave_up.store(true, Ordering::Release);
            reader.thread().unpark();
        }
        let their = reader
            .join()
            .map_err(|_| io::Error::other("the reading thread panicked"))?;
        // The reader's own error first: the counter's says only that it failed.
        let their = their?;
        let (n, mine) = counted?;
        Ok((n, Some(mine + their)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Every chunk is counted once, in order, whoever reads it; a last
    /// partial chunk and a file of fewer chunks than buffers too.
    #[test]
    fn counts_what_a_plain_read_counts() {
        for size in [0, 100, CHUNK * 3 + 17, CHUNK * 21 + 4095] {
            let mut f = tempfile::NamedTempFile::new().unwrap();
            let data: Vec<u8> = (0..size)
                .map(|i| if i % 61 == 0 { b'\n' } else { b'x' })
                .collect();
            f.write_all(&data).unwrap();
            let want = data.iter().filter(|&&b| b == b'\n').count() as u64;
            let (n, reads) = count(f.path(), |b| {
                b.iter().filter(|&&c| c == b'\n').count() as u64
            })
            .unwrap();
            assert_eq!(n, want, "{size} bytes");
            assert_eq!(reads, Some(size.div_ceil(CHUNK) as u64), "{size} bytes");
        }
    }
}
