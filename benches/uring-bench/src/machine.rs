//! The machine a run is measured on, as the reports describe it: CPU model,
//! kernel, memory, load, the commit under test and the time; and the one
//! machine setting a run may change, the huge pages it reserves for fio
//! ([`HugePages`], put back as they were when dropped).

/// The number after `key` in `/proc/meminfo` (kB for sizes, a count for
/// `HugePages_*`).
pub fn meminfo_field(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A size field of `/proc/meminfo`, in bytes.
pub fn meminfo(key: &str) -> Option<u64> {
    meminfo_field(key).map(|kb| kb * 1024)
}

/// The CPU's model name from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The load averages (1, 5, 15 min) from `/proc/loadavg`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The kernel release.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The benchmark's git commit (short hash and subject), marked when the
/// checkout has uncommitted changes.
pub fn git_commit() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("git")
        .args(["-C", dir, "log", "-1", "--format=%h %s"])
        .output();
    let head = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => return "unknown (not a git checkout)".into(),
    };
    let dirty = std::process::Command::new("git")
        .args(["-C", dir, "status", "--porcelain", "--untracked-files=no"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    if dirty {
        format!("{head} (+ uncommitted changes)")
    } else {
        head
    }
}

/// UTC "YYYY-MM-DD HH:MM:SS" and a compact form for directory names.
pub fn utc_now() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // civil-from-days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (
        format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}:{ss:02}"),
        format!("{y:04}{m:02}{d:02}T{hh:02}{mm:02}{ss:02}Z"),
    )
}

/// Huge pages for fio's O_DIRECT buffers (`--mem=shmhuge`), reserved for
/// the run when too few are free and put back as they were on drop; fio's
/// default buffers of 4 KiB pages make every 1 MiB O_DIRECT read 256
/// scatter-gather segments, which a disk that pays per segment serves far
/// slower — the device's ceiling needs contiguous buffers, as the crate's
/// O_DIRECT scan has (see DESIGN, "Scans").
pub struct HugePages {
    /// `nr_hugepages` to restore, when this run raised it.
    restore: Option<u64>,
}

impl HugePages {
    const PATH: &'static str = "/proc/sys/vm/nr_hugepages";
    /// 16 × 1 MiB in flight, in 2 MiB pages, and room for fio's own use.
    const NEED: u64 = 16;

    pub fn reserve() -> Result<HugePages, String> {
        let free = meminfo_field("HugePages_Free:").ok_or("no HugePages_Free in /proc/meminfo")?;
        if free >= Self::NEED {
            return Ok(HugePages { restore: None });
        }
        let total: u64 = std::fs::read_to_string(Self::PATH)
            .map_err(|e| format!("{}: {e}", Self::PATH))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", Self::PATH))?;
        let want = total + (Self::NEED - free);
        std::fs::write(Self::PATH, want.to_string()).map_err(|e| format!("{}: {e}", Self::PATH))?;
        let held = HugePages {
            restore: Some(total),
        };
        match meminfo_field("HugePages_Free:") {
            Some(f) if f >= Self::NEED => Ok(held),
            f => Err(format!(
                "asked for {want} huge pages, {} free",
                f.unwrap_or(0)
            )),
        }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Some(n) = self.restore {
            let _ = std::fs::write(Self::PATH, n.to_string());
        }
    }
}
