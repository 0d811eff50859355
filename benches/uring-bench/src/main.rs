//! uring-bench: random 4 KiB positioned reads — io_uring (this crate) vs mmap,
//! pread threads, tokio::fs, tokio-uring, a raw ring and fio; hot, cold and
//! direct; every block verified. `uring-bench cpu-per-read` measures CPU per
//! read on cached data against a raw ring loop; `uring-bench lines` counts
//! the lines of a large text file every way of the study "Towards Fast IO on
//! Linux using Rust" and with this crate's scan; `uring-bench write` the
//! write path (random O_DIRECT writes, WAL group commit); `uring-bench
//! sched` cold point lookups under a full-speed scan, with the crate's
//! priority classes and without; `uring-bench zipf-policies` simulates
//! eviction policies on `mem-fair`'s Zipf draws. See docs/BENCHMARKS.md.
//!
//! This file only hands the command line to its mode: `random_reads` (the
//! default), `cpu_per_read`, `lines`, `open_loop`, `write_bench`,
//! `mem_fair`, `sched` and `zipf_policies`. They share the kinds of
//! `kinds`, the flags of `cli`, the dataset, the engines and the reports;
//! `machine` describes the machine a run is measured on.

mod buf;
mod cgroup;
mod charts;
mod cli;
mod cpu_per_read;
mod dataset;
mod engines;
mod first_touch;
mod flaky_fs;
mod fuse_file;
mod kinds;
mod lines;
mod machine;
mod mem_fair;
mod memory_ceiling;
mod open_loop;
#[cfg(feature = "parquet")]
mod parquet_bench;
mod probes;
mod random_reads;
mod report;
mod sched;
mod slow_file;
mod soak;
mod stop;
mod two_threads;
mod verify;
mod wake;
mod write_bench;
mod zipf_policies;

use clap::Parser;
use cli::{Args, Mode};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.mode {
        Some(Mode::CpuPerRead(a)) => cpu_per_read::run(a),
        Some(Mode::Lines(a)) => lines::run(a),
        Some(Mode::OpenLoop(a)) => open_loop::run(a),
        Some(Mode::Write(a)) => write_bench::run(a),
        Some(Mode::MemFair(a)) => mem_fair::run(a),
        Some(Mode::MemFairChild(a)) => mem_fair::child(a),
        Some(Mode::ZipfPolicies(a)) => zipf_policies::run(a),
        Some(Mode::Sched(a)) => sched::run(a),
        Some(Mode::SlowFile(a)) => slow_file::run(a),
        Some(Mode::Soak(a)) => soak::run(a),
        #[cfg(feature = "parquet")]
        Some(Mode::Parquet(a)) => parquet_bench::run(a),
        #[cfg(not(feature = "parquet"))]
        Some(Mode::Parquet(_)) => Err("this build has no Parquet reader: run \
             `cargo run --release -p uring-bench --features parquet -- parquet`"
            .to_string()),
        None => random_reads::run(&args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
