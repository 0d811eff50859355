//! `mmap`: one OS thread per read in flight, copying 4 KiB out of read-only
//! MADV_RANDOM mappings (page faults do the I/O). The mappings live only for
//! the cell, so cold-cache eviction between cells is effective.
//!
//! Hot regime: the mapping is populated (MAP_POPULATE) before the timed
//! window — the mmap analogue of "the working set was read once", and the
//! steady state of a long-running engine whose mapping has been touched.
//! Without it a 2 s hot cell (the default) over 8 GiB would spend a large
//! share of its reads on first-touch minor faults (`--mmap-populate off` measures that).

use super::{run_threads, CellSpec, Measured};
use crate::kinds::Regime;
use crate::verify::BLOCK;
use std::time::Instant;

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let files = spec.open_files()?;
    let populate = spec.regime == Regime::Hot && spec.mmap_populate;
    let t0 = Instant::now();
    let maps = files
        .iter()
        .map(|f| {
            let mut o = memmap2::MmapOptions::new();
            if populate {
                o.populate();
            }
            // SAFETY: read-only shared mapping of a dataset file nobody
            // writes while the benchmark runs.
            let m = unsafe { o.map(f) }.map_err(|e| format!("mmap: {e}"))?;
            m.advise(memmap2::Advice::Random)
                .map_err(|e| format!("madvise(MADV_RANDOM): {e}"))?;
            Ok(m)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let setup = t0.elapsed();
    let mut m = run_threads(spec, |t, buf| {
        let off = t.offset() as usize;
        buf.copy_from_slice(&maps[t.file as usize][off..off + BLOCK]);
        Ok(BLOCK)
    })?;
    m.notes.push(if populate {
        format!(
            "mappings populated (MAP_POPULATE) before the timed window, {:.2} s",
            setup.as_secs_f64()
        )
    } else {
        "mappings not populated: first touches fault".to_string()
    });
    Ok(m)
}
