//! File-descriptor accounting: 1000 files registered and unregistered,
//! then the context dropped, leave no descriptor open. It counts the
//! process's descriptors, which tests running beside it would change: it
//! runs alone (`common::serial()`), in a binary of its own.

use crate::common;

use std::time::Duration;

use common::Flavor;
use uring_positioned_io::BackendChoice;

/// Many registered files at once: each fid reads its own file; unregistering
/// all of them gives every fd back.
fn many_registered_files(choice: BackendChoice) {
    let _serial = common::serial();
    let sizes: Vec<u64> = (0..40).map(|i| 10_000 + i * 1111).collect();
    let set = common::FileSet::new(0x3a3, &sizes);
    let files = set.files.clone();
    let (fds_before, _) = common::fd_baseline();
    common::run(
        "many_registered_files",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::build_ctx(choice, Vec::new(), |b| b);
            let fds_start = common::fd_count();
            let mut fids = Vec::new();
            for i in 0..1000usize {
                let file = &files[i % files.len()];
                match ctx.register_file(file.open()) {
                    Ok(fid) => fids.push((fid, i % files.len())),
                    Err(e) => {
                        // A full file table must be an error, not a panic.
                        eprintln!("{choice:?}: register_file #{i} failed: {e}");
                        assert!(i >= 64, "register_file failed after only {i} files: {e}");
                        break;
                    }
                }
            }
            let distinct: std::collections::BTreeSet<u32> =
                fids.iter().map(|(f, _)| f.index()).collect();
            assert_eq!(
                distinct.len(),
                fids.len(),
                "register_file handed out a fid twice"
            );
            let futs = fids.iter().map(|&(fid, fi)| {
                let ctx = &ctx;
                let file = &files[fi];
                async move {
                    let off = (u64::from(fid.index()) * 97) % file.len;
                    let mut buf = vec![0u8; 3000];
                    let n = ctx.read(fid, off, &mut buf).await.expect("read");
                    assert_eq!(
                        &buf[..n],
                        &file.expected(off, 3000)[..],
                        "fid {}",
                        fid.index()
                    );
                }
            });
            futures::future::join_all(futs).await;
            for &(fid, _) in &fids {
                ctx.unregister_file(fid).expect("unregister");
            }
            let fds = common::wait_fd_count_at_most_async(fds_start, Duration::from_secs(5)).await;
            assert!(
                fds <= fds_start,
                "unregistering {} files left fds open: {fds_start} -> {fds}",
                fids.len()
            );
            eprintln!("{choice:?}: {} files registered at once", fids.len());
            drop(set);
        },
    );
    let fds_after = common::wait_fd_count_at_most(fds_before, Duration::from_secs(5));
    assert!(
        fds_after <= fds_before,
        "fd leak: {fds_before} -> {fds_after}"
    );
}

backend_tests!(many_registered_files);
