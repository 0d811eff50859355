//! `mmap`: one OS thread per read in flight, copying 4 KiB out of read-only
//! MADV_RANDOM mappings (page faults do the I/O). The mappings live only for
//! the cell, so cold-cache eviction between cells is effective.

use super::{run_threads, CellSpec, Measured};
use crate::verify::BLOCK;

pub fn run(spec: &CellSpec) -> Result<Measured, String> {
    let files = spec.open_files()?;
    let maps = files
        .iter()
        .map(|f| {
            // SAFETY: read-only shared mapping of a dataset file nobody
            // writes while the benchmark runs.
            let m = unsafe { memmap2::Mmap::map(f) }.map_err(|e| format!("mmap: {e}"))?;
            m.advise(memmap2::Advice::Random)
                .map_err(|e| format!("madvise(MADV_RANDOM): {e}"))?;
            Ok(m)
        })
        .collect::<Result<Vec<_>, String>>()?;
    run_threads(spec, |t, buf| {
        let off = t.offset() as usize;
        buf.copy_from_slice(&maps[t.file as usize][off..off + BLOCK]);
        Ok(BLOCK)
    })
}
