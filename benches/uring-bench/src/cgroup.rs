//! Memory cgroups for `mem-fair`: one per engine run, a child of the cgroup
//! this process is in, with a memory limit. cgroup v2 (`memory.max`,
//! `memory.peak`) when a v2 hierarchy has the memory controller, else v1
//! (`memory.limit_in_bytes`, `memory.max_usage_in_bytes`). The directory is
//! removed when the [`MemCgroup`] is dropped.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which cgroup interface holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Version {
    V1,
    V2,
}

/// Where new memory cgroups are made: a directory with the memory
/// controller under which this process may create children.
#[derive(Debug, Clone)]
pub struct Parent {
    pub version: Version,
    pub dir: PathBuf,
}

/// Mount points of `fstype` from `/proc/self/mountinfo`, with their super
/// options (v1: the controllers).
fn mounts(fstype: &str) -> Vec<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split_whitespace();
            if post.next()? != fstype {
                return None;
            }
            let opts = post.nth(1).unwrap_or("").to_string();
            Some((PathBuf::from(pre.split_whitespace().nth(4)?), opts))
        })
        .collect()
}

/// This process's cgroup path in the hierarchy whose `/proc/self/cgroup`
/// line satisfies `pick` (controllers field).
fn own_path(pick: impl Fn(&str, &str) -> bool) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (id, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        pick(id, ctrls).then(|| path.trim_start_matches('/').to_string())
    })
}

/// The parent for memory cgroups, or why there is none.
pub fn find_parent() -> Result<Parent, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root: cannot create memory cgroups".into());
    }
    let mut why = Vec::new();
    // v2: the memory controller enabled for the children of our cgroup, or
    // enabled there by us (possible when our cgroup's parent delegates it
    // and our cgroup has no processes of its own, or is the root).
    if let (Some((mnt, _)), Some(path)) = (
        mounts("cgroup2").into_iter().next(),
        own_path(|id, _| id == "0"),
    ) {
        let dir = mnt.join(&path);
        let has = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"))
        };
        if has("cgroup.subtree_control")
            || (has("cgroup.controllers")
                && std::fs::write(dir.join("cgroup.subtree_control"), "+memory").is_ok())
        {
            return Ok(Parent {
                version: Version::V2,
                dir,
            });
        }
        why.push(format!(
            "cgroup v2 at {} has no memory controller for child cgroups",
            dir.display()
        ));
    } else {
        why.push("no cgroup v2 hierarchy".into());
    }
    let v1 = mounts("cgroup")
        .into_iter()
        .find(|(_, o)| o.split(',').any(|c| c == "memory"));
    match (v1, own_path(|_, c| c.split(',').any(|c| c == "memory"))) {
        (Some((mnt, _)), Some(path)) => {
            let dir = mnt.join(path);
            if dir.join("memory.limit_in_bytes").exists() {
                return Ok(Parent {
                    version: Version::V1,
                    dir,
                });
            }
            why.push(format!("{} has no memory.limit_in_bytes", dir.display()));
        }
        _ => why.push("no cgroup v1 memory hierarchy".into()),
    }
    Err(why.join("; "))
}

/// A memory cgroup with a limit, removed on drop.
#[derive(Debug)]
pub struct MemCgroup {
    pub version: Version,
    pub dir: PathBuf,
}

impl MemCgroup {
    /// Creates `name` under `parent` with a memory limit of `limit` bytes
    /// (and no swap, on v2).
    pub fn create(parent: &Parent, name: &str, limit: u64) -> Result<MemCgroup, String> {
        let dir = parent.dir.join(name);
        if dir.exists() {
            // a leftover of an interrupted run of ours: empty, so removable
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = MemCgroup {
            version: parent.version,
            dir,
        };
        match cg.version {
            Version::V1 => cg.write("memory.limit_in_bytes", &limit.to_string())?,
            Version::V2 => {
                cg.write("memory.max", &limit.to_string())?;
                // absent without swap accounting
                let _ = cg.write("memory.swap.max", "0");
            }
        }
        Ok(cg)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let p = self.dir.join(file);
        std::fs::write(&p, value).map_err(|e| format!("write {value:?} to {}: {e}", p.display()))
    }

    fn read_u64(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Moves the calling process into the cgroup.
    pub fn join_self(dir: &Path) -> Result<(), String> {
        let p = dir.join("cgroup.procs");
        std::fs::write(&p, std::process::id().to_string())
            .map_err(|e| format!("join {}: {e}", p.display()))
    }

    /// The highest memory use the cgroup has seen (bytes).
    pub fn peak(&self) -> Option<u64> {
        match self.version {
            Version::V1 => self.read_u64("memory.max_usage_in_bytes"),
            Version::V2 => self.read_u64("memory.peak"),
        }
    }

    /// How often the cgroup hit its limit (v1 `memory.failcnt`, v2 the
    /// `max` count of `memory.events`): > 0 once reclaim began.
    pub fn limit_hits(dir: &Path, version: Version) -> Option<u64> {
        match version {
            Version::V1 => std::fs::read_to_string(dir.join("memory.failcnt"))
                .ok()?
                .trim()
                .parse()
                .ok(),
            Version::V2 => {
                let t = std::fs::read_to_string(dir.join("memory.events")).ok()?;
                t.lines()
                    .find_map(|l| l.strip_prefix("max "))
                    .and_then(|v| v.trim().parse().ok())
            }
        }
    }

    /// Whether the cgroup's processes were OOM-killed.
    pub fn oom_killed(&self) -> bool {
        let field = |file: &str, key: &str| {
            std::fs::read_to_string(self.dir.join(file))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix(key))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
        };
        match self.version {
            Version::V1 => field("memory.oom_control", "oom_kill ") > 0,
            Version::V2 => field("memory.events", "oom_kill ") > 0,
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // the last process may still be leaving it: retry briefly
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        eprintln!(
            "warning: could not remove the cgroup {} (remove it with rmdir)",
            self.dir.display()
        );
    }
}
