//! Seccomp filters for tests that make a syscall fail on purpose, and the
//! re-executed child process such tests run in (a filter cannot be removed,
//! so it must not outlive the test).
//!
//! A test `foo` that needs a filter is written as a pair: `child_foo`, which
//! returns at once unless [`is_child`], installs the filter and runs the
//! body, printing [`CHILD_OK`] at the end; and `foo`, which returns at once
//! in the child and otherwise calls [`run_child`]`("child_foo", secs)`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const CHILD_ENV: &str = "URING_PIO_SECCOMP_CHILD";
pub const CHILD_OK: &str = "SECCOMP-CHILD-OK";

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// io_uring_enter(2) is 426 on both x86_64 and aarch64.
pub const NR_IO_URING_ENTER: u32 = 426;

// Classic BPF opcodes (linux/bpf_common.h): BPF_LD|BPF_W|BPF_ABS,
// BPF_JMP|BPF_JEQ|BPF_K and BPF_RET|BPF_K.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
// Offsets in struct seccomp_data.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const SECCOMP_FILTER_FLAG_TSYNC: libc::c_ulong = 1;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Makes syscall `nr` fail with `errno`; everything else is allowed. With
/// `all_threads` the filter applies to every thread of the process at once
/// (TSYNC: e.g. runtime workers that already exist); otherwise to this
/// thread and the threads it creates from now on.
pub fn install_errno_filter(nr: u32, errno: i32, all_threads: bool) {
    let mut filter = [
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_NATIVE, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
        stmt(BPF_LD_W_ABS, OFF_NR),
        jump(BPF_JMP_JEQ_K, nr, 0, 1),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | (errno as u32 & 0xffff)),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    let flags = if all_threads {
        SECCOMP_FILTER_FLAG_TSYNC
    } else {
        0
    };
    // SAFETY: plain prctl/seccomp calls; `prog` and `filter` outlive the
    // call (the kernel copies the program).
    unsafe {
        assert_eq!(
            libc::prctl(
                libc::PR_SET_NO_NEW_PRIVS,
                1 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong
            ),
            0,
            "PR_SET_NO_NEW_PRIVS: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(
            libc::syscall(
                libc::SYS_seccomp,
                SECCOMP_SET_MODE_FILTER,
                flags,
                &raw const prog,
            ),
            0,
            "seccomp(SET_MODE_FILTER): {}",
            std::io::Error::last_os_error()
        );
    }
}

pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// Run `test` (a test of this binary) in a child process with `CHILD_ENV`
/// set, kill it after `secs`, and fail unless it succeeded and printed the
/// marker. Returns the child's stdout and stderr.
pub fn run_child(test: &str, secs: u64) -> (String, String) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child test process");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for child") {
            break Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_t.join().unwrap();
    let stderr = err_t.join().unwrap();
    eprintln!("--- child `{test}` stdout ---\n{stdout}\n--- child stderr ---\n{stderr}");
    let status =
        status.unwrap_or_else(|| panic!("child `{test}` did not finish within {secs} s (hang?)"));
    assert!(status.success(), "child `{test}` failed: {status}");
    assert!(
        stdout.contains(CHILD_OK) || stderr.contains(CHILD_OK),
        "child `{test}` did not run the test body (name filter mismatch?)"
    );
    (stdout, stderr)
}

pub fn mentions_eperm(msg: &str) -> bool {
    let m = msg.to_lowercase();
    m.contains("eperm")
        || m.contains("operation not permitted")
        || m.contains("permission")
        || m.contains("os error 1)")
}
