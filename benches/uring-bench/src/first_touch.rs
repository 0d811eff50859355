//! What this machine charges to touch memory the process has never used:
//! the page fault and the kernel's zeroing of each page, in 2 MiB pages
//! (transparent huge pages, as the `BlockCache`'s frames are) and in
//! 4 KiB pages, per 4 KiB touched.
//!
//! A cache that starts empty pays this once per frame as it fills: the
//! first read into a frame faults it in (inside `io_uring_enter` for an
//! `O_DIRECT` read, which pins the frame's pages). The `direct` and
//! `cold` cells and the memory-fair `fill` measure caches filling, so this
//! figure is part of what they measure; the page cache's engines take
//! their pages from the kernel's free lists instead. On a VM whose balloon
//! reports free pages to the host, a fresh huge page is memory the host
//! took back, and touching it costs the host's faults as well.
//! Memory freed and mapped again at once (`reused`) shows the zeroing
//! alone.

use serde::Serialize;
use std::time::Instant;

/// Bytes touched per figure.
pub const BYTES: usize = 128 << 20;

const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// µs per 4 KiB touched, each way.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct FirstTouch {
    /// Fresh memory in 2 MiB pages (`MADV_HUGEPAGE`); `None` where the
    /// mapping could not be advised.
    pub huge_us: Option<f64>,
    /// The same again at once, in the pages just freed.
    pub huge_reused_us: Option<f64>,
    /// Fresh memory in 4 KiB pages (`MADV_NOHUGEPAGE`).
    pub small_us: f64,
    /// Whether a virtio balloon reports free pages to the host (`None`: no
    /// balloon).
    pub free_page_reporting: Option<bool>,
}

impl FirstTouch {
    /// One line for the console and the reports.
    pub fn summary(&self) -> String {
        let us = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}"));
        format!(
            "first touch of fresh memory per 4 KiB: 2 MiB pages {} µs ({} reused), 4 KiB pages {:.2} µs{}",
            us(self.huge_us),
            us(self.huge_reused_us),
            self.small_us,
            match self.free_page_reporting {
                Some(true) => "; the balloon reports free pages to the host",
                Some(false) => "; a balloon that does not report free pages",
                None => "",
            }
        )
    }
}

/// Touches `bytes` of fresh anonymous memory (rounded up to 2 MiB) once
/// per 4 KiB: µs per 4 KiB, or `None` if `huge` and the kernel refused the
/// advice (a refused `MADV_NOHUGEPAGE` means 4 KiB pages already).
fn touch(bytes: usize, huge: bool) -> Result<Option<f64>, String> {
    let len = bytes.div_ceil(HUGE) * HUGE;
    // One huge page more, so that an aligned range of `len` fits.
    let mut map = memmap2::MmapOptions::new()
        .len(len + HUGE)
        .map_anon()
        .map_err(|e| format!("first-touch probe: mmap of {len} bytes: {e}"))?;
    let skip = map.as_ptr().align_offset(HUGE);
    let region = &mut map[skip..skip + len];
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: `region` is a 2 MiB-aligned range of a private anonymous
    // mapping this function owns; the advice changes only how its pages
    // are backed, not its contents or its lifetime.
    let rc = unsafe { libc::madvise(region.as_mut_ptr().cast(), len, advice) };
    // Refused: no huge pages for the first (`None`); for the second, a
    // kernel without transparent huge pages, whose pages are 4 KiB anyway.
    if rc != 0 && huge {
        return Ok(None);
    }
    let t = Instant::now();
    for page in region.chunks_mut(PAGE) {
        // A volatile write: the touch must happen, once per page.
        // SAFETY: `page` is a valid, exclusive, non-empty slice.
        unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 1) };
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(Some(secs * 1e6 / (len / PAGE) as f64))
}

/// Whether a virtio balloon (device id 5) offers free page reporting
/// (feature bit 5, `VIRTIO_BALLOON_F_REPORTING`), from sysfs.
fn free_page_reporting() -> Option<bool> {
    let devices = std::fs::read_dir("/sys/bus/virtio/devices").ok()?;
    for dev in devices.flatten() {
        let path = dev.path();
        let id = std::fs::read_to_string(path.join("device")).unwrap_or_default();
        if id.trim() != "0x0005" {
            continue;
        }
        let features = std::fs::read_to_string(path.join("features")).ok()?;
        return Some(features.as_bytes().get(5) == Some(&b'1'));
    }
    None
}

/// Measures the three figures over `bytes` each (about 1 s on a VM whose
/// fresh huge pages cost the host's faults, ~0.1 s elsewhere).
pub fn measure(bytes: usize) -> Result<FirstTouch, String> {
    let huge_us = touch(bytes, true)?;
    let huge_reused_us = if huge_us.is_some() {
        touch(bytes, true)?
    } else {
        None
    };
    let small_us = touch(bytes, false)?.expect("measured whatever the advice");
    Ok(FirstTouch {
        huge_us,
        huge_reused_us,
        small_us,
        free_page_reporting: free_page_reporting(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_each_way() {
        let t = measure(8 << 20).unwrap();
        assert!(t.small_us > 0.0, "{t:?}");
        for v in [t.huge_us, t.huge_reused_us].into_iter().flatten() {
            assert!(v > 0.0, "{t:?}");
        }
        let line = t.summary();
        assert!(
            line.contains("2 MiB pages") && line.contains("4 KiB pages"),
            "{line}"
        );
    }
}
