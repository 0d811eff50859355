//! `fio`: the hardware's own ceiling beside the engines. Runs fio with
//! ioengine=io_uring, rw=randread, bs=4k on the same files (the same working
//! set), `jobs` jobs (default: one per CPU, at most `depth`) sharing the
//! `depth` reads in flight (iodepth = depth / jobs each; one fio job saturates
//! a CPU long before the device on small VMs), for the cell's duration, with
//! group reporting, and parses its
//! JSON output. fio does not verify our blocks; its CPU figure is fio's own
//! usr+sys for the job.

use super::{CellSpec, Cpu, Measured};
use crate::kinds::Regime;
use crate::stop::new_histogram;
use std::process::Command;
use std::time::Duration;

const PERCENTILES: [f64; 19] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99, 99.995, 99.999,
];

/// Why fio cannot run, if it cannot (not on PATH / not executable).
pub fn unavailable(fio: &std::path::Path) -> Option<String> {
    match Command::new(fio).arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`{} --version` failed: {}",
            fio.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!(
            "fio not found ({}: {e}); install it (e.g. apt-get install fio) or pass --fio PATH",
            fio.display()
        )),
    }
}

fn escape(p: &std::path::Path) -> String {
    p.display().to_string().replace(':', "\\:")
}

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let names: Vec<String> = spec.dataset.paths[..spec.set_files as usize]
        .iter()
        .map(|p| escape(p))
        .collect();
    let ms = (spec.duration.as_secs_f64() * 1000.0).round().max(1.0) as u64;
    let jobs = spec.fio_jobs.clamp(1, spec.depth);
    let iodepth = spec.depth.div_ceil(jobs);
    let percentiles: Vec<String> = PERCENTILES.iter().map(ToString::to_string).collect();
    let mut cmd = Command::new(&spec.fio);
    cmd.arg("--name=uring-bench")
        .arg(format!("--filename={}", names.join(":")))
        .arg("--rw=randread")
        .arg("--bs=4k")
        .arg("--ioengine=io_uring")
        .arg(format!("--iodepth={iodepth}"))
        .arg(format!("--iodepth_batch_complete_max={iodepth}"))
        .arg("--registerfiles=1")
        .arg("--fixedbufs=1")
        .arg(format!(
            "--direct={}",
            u8::from(spec.regime == Regime::Direct)
        ))
        // the benchmark applies the regime itself (warm / evicted)
        .arg("--invalidate=0")
        .arg("--file_service_type=random")
        .arg("--norandommap")
        .arg("--randrepeat=0")
        .arg("--time_based")
        .arg(format!("--runtime={ms}ms"))
        .arg(format!("--numjobs={jobs}"))
        .arg("--group_reporting")
        .arg(format!("--percentile_list={}", percentiles.join(":")))
        .arg("--output-format=json");
    let out = cmd
        .output()
        .map_err(|e| format!("engine fio: cannot run {}: {e}", spec.fio.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "engine fio: exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse(&stdout, jobs, iodepth)
}

fn f(v: &serde_json::Value, path: &[&str]) -> Result<f64, String> {
    let mut cur = v;
    for p in path {
        cur = cur
            .get(p)
            .ok_or_else(|| format!("engine fio: JSON output lacks {}", path.join(".")))?;
    }
    cur.as_f64()
        .ok_or_else(|| format!("engine fio: {} is not a number", path.join(".")))
}

/// Parses fio's JSON output into a [`Measured`] (latencies from fio's clat
/// percentiles; there is no per-read histogram).
pub fn parse(stdout: &str, jobs: usize, iodepth: usize) -> Result<Measured, String> {
    // fio may print notes before the JSON document.
    let start = stdout
        .find('{')
        .ok_or_else(|| format!("engine fio: no JSON in output: {}", stdout.trim()))?;
    let v: serde_json::Value = serde_json::from_str(&stdout[start..])
        .map_err(|e| format!("engine fio: bad JSON output: {e}"))?;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .ok_or("engine fio: JSON output has no jobs")?;
    let reads = f(job, &["read", "total_ios"])? as u64;
    let runtime_ms = f(job, &["read", "runtime"])?;
    let err = f(job, &["error"]).unwrap_or(0.0);
    if err != 0.0 {
        return Err(format!("engine fio: job reported error {err}"));
    }
    let secs = (runtime_ms / 1000.0).max(1e-9);
    // usr_cpu/sys_cpu are percentages of job_runtime, which group reporting
    // sums over the jobs
    let cpu_secs = f(job, &["job_runtime"]).map_or(secs * jobs as f64, |ms| ms / 1000.0);
    let usr = f(job, &["usr_cpu"])? / 100.0 * cpu_secs;
    let sys = f(job, &["sys_cpu"])? / 100.0 * cpu_secs;
    let mut cdf = Vec::new();
    if let Some(p) = job
        .pointer("/read/clat_ns/percentile")
        .and_then(|p| p.as_object())
    {
        for (k, val) in p {
            if let (Ok(q), Some(ns)) = (k.parse::<f64>(), val.as_f64()) {
                cdf.push((ns, q / 100.0));
            }
        }
    }
    let max = f(job, &["read", "clat_ns", "max"]).unwrap_or(0.0);
    let min = f(job, &["read", "clat_ns", "min"]).unwrap_or(0.0);
    cdf.push((min, 0.0));
    cdf.push((max, 1.0));
    cdf.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut m = Measured {
        hist: new_histogram(),
        reads,
        elapsed: Duration::from_secs_f64(secs),
        cpu: Cpu { user: usr, sys },
        reads_per_enter: None,
        inline_completed: None,
        notes: vec![format!(
            "fio io_uring {jobs} job(s) x iodepth={iodepth}; blocks not verified; latency = fio clat; CPU = fio usr+sys"
        )],
        cdf: Some(cdf),
        verified: false,
        // a separate process, not in our window; no tokio runtime
        syscalls: None,
        timer_lateness: None,
        enters: None,
        driver_polls: None,
        read_bytes: None,
        cache_hit_ratio: None,
        warmed: None,
    };
    if reads == 0 {
        m.notes.push("fio completed no reads".into());
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_fio_json() {
        let j = r#"note: something
{"jobs":[{"error":0,"usr_cpu":10.0,"sys_cpu":40.0,
 "read":{"total_ios":1000,"runtime":2000,
  "clat_ns":{"min":1000,"max":900000,"percentile":{"50.000000":20000,"99.900000":500000}}}}]}"#;
        let m = super::parse(j, 1, 32).unwrap();
        assert_eq!(m.reads, 1000);
        assert!((m.cpu.user + m.cpu.sys - 1.0).abs() < 1e-9);
        let cdf = m.cdf.unwrap();
        assert_eq!(cdf.first().unwrap().1, 0.0);
        assert_eq!(cdf.last().unwrap().0, 900000.0);
    }
}
