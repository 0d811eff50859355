//! Checked file ids, on both backends, against `std` as the
//! oracle: an id handed out by one context is refused by another, and an id
//! of an unregistered file is refused even once its index holds a new file —
//! by every API that takes a fid (read, read_exact, the owned reads and
//! their `'static` forms, scan, file_route, unregister_file) — while plain indices keep their meaning.

use crate::common;

use std::io;

use common::Flavor;
use uring_positioned_io::{BackendChoice, FileId, ScanOptions, UringContext};

/// `r` is `InvalidInput` naming `fid` and saying `why`.
fn refused<T: std::fmt::Debug>(r: io::Result<T>, fid: FileId, why: &str, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&fid.to_string()),
        "{what}: does not name {fid}: {msg}"
    );
    assert!(msg.contains(why), "{what}: does not say `{why}`: {msg}");
}

/// Every API that takes a fid refuses `fid` on `ctx`, saying `why`.
async fn all_refuse(ctx: &UringContext, fid: FileId, why: &str) {
    let mut buf = vec![0u8; 64];
    refused(ctx.read(fid, 0, &mut buf).await, fid, why, "read");
    refused(
        ctx.read_exact(fid, 0, &mut buf).await,
        fid,
        why,
        "read_exact",
    );
    let (r, b) = ctx.read_owned(fid, 0, vec![7u8; 64]).await;
    refused(r, fid, why, "read_owned");
    assert_eq!(b, vec![7u8; 64], "buffer handed back as it was");
    let (r, b) = ctx.read_exact_owned(fid, 0, Vec::with_capacity(8)).await;
    refused(r, fid, why, "read_exact_owned");
    assert!(b.is_empty());
    let (r, _) = tokio::spawn(ctx.read_owned_static(fid, 0, Vec::with_capacity(8)))
        .await
        .unwrap();
    refused(r, fid, why, "read_owned_static");
    let (r, _) = ctx
        .read_exact_owned_static(fid, 0, Vec::with_capacity(8))
        .await;
    refused(r, fid, why, "read_exact_owned_static");
    refused(ctx.file_route(fid), fid, why, "file_route");
    refused(ctx.unregister_file(fid), fid, why, "unregister_file");
    refused(ScanOptions::new().scan(ctx, fid, ..), fid, why, "scan");
}

fn cross_context_ids_are_refused(choice: BackendChoice) {
    let set = common::FileSet::new(0x1d5, &[10_000, 20_000]);
    let (fa, fb) = (set.files[0].clone(), set.files[1].clone());
    let (oa, ob) = (fa.open(), fb.open());
    common::run("cross_context_ids", Flavor::Multi, 60, move || async move {
        let a = common::build_ctx(choice, vec![oa], |b| b);
        let b = common::build_ctx(choice, vec![ob], |b| b);
        let ida = a.file_ids();
        let idb = b.file_ids();
        assert_eq!((ida.len(), idb.len()), (1, 1));
        assert_eq!(ida[0], a.file_id(0).unwrap());
        assert!(ida[0].is_tagged() && ida[0].index() == 0);
        assert_ne!(ida[0], idb[0], "two contexts' file #0 have different ids");
        assert_ne!(ida[0], FileId::from(0), "a checked id is not a plain index");

        // Each id reads its own file, on its own context (std is the oracle).
        let mut buf = vec![0u8; 4096];
        a.read_exact(ida[0], 100, &mut buf).await.unwrap();
        assert_eq!(buf, fa.pread(100, 4096));
        b.read_exact(idb[0], 100, &mut buf).await.unwrap();
        assert_eq!(buf, fb.pread(100, 4096));

        // On the other context: refused, never a read of that context's file #0.
        all_refuse(&b, ida[0], "belongs to another UringContext").await;
        all_refuse(&a, idb[0], "belongs to another UringContext").await;
        // An id of another context with an index this one lacks: the same.
        let extra = a.register_file(fa.open()).unwrap();
        assert_eq!(extra.index(), 1);
        all_refuse(&b, extra, "belongs to another UringContext").await;

        // Nothing was unregistered by the refused calls: plain indices still
        // mean "file #0 of whichever context".
        b.read_exact(FileId::from(0), 0, &mut buf).await.unwrap();
        assert_eq!(buf, fb.pread(0, 4096));
        a.read_exact(0u32, 0, &mut buf).await.unwrap();
        assert_eq!(buf, fa.pread(0, 4096));
        assert!(b.file_route(idb[0]).is_ok());
    });
}

fn stale_ids_are_refused(choice: BackendChoice) {
    let set = common::FileSet::new(0x5a1e, &[10_000, 30_000]);
    let (old, new) = (set.files[0].clone(), set.files[1].clone());
    common::run("stale_ids", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, Vec::new(), |b| b);
        let fid = ctx.register_file(old.open()).unwrap();
        let mut buf = vec![0u8; 4096];
        ctx.read_exact(fid, 0, &mut buf).await.unwrap();
        assert_eq!(buf, old.pread(0, 4096));
        ctx.unregister_file(fid).unwrap();

        // Unregistered, index free: stale.
        all_refuse(&ctx, fid, "is stale").await;
        refused(
            ctx.file_id(fid.index()),
            FileId::from(fid.index()),
            "not registered",
            "file_id",
        );

        // The index is reused (no read of the old file is left), under a new
        // generation: the old id is still refused, not a read of the newcomer.
        let again = ctx.register_file(new.open()).unwrap();
        assert_eq!(again.index(), fid.index(), "index reused");
        assert_ne!(again, fid);
        all_refuse(&ctx, fid, "now holds a file registered later").await;
        ctx.read_exact(again, 20_000, &mut buf).await.unwrap();
        assert_eq!(buf, new.pread(20_000, 4096));
        // A plain index names the newcomer, as documented.
        ctx.read_exact(FileId::from(fid.index()), 20_000, &mut buf)
            .await
            .unwrap();
        assert_eq!(buf, new.pread(20_000, 4096));
        assert_eq!(ctx.file_id(fid.index()).unwrap(), again);
        ctx.unregister_file(again).unwrap();
        refused(
            ctx.unregister_file(again),
            again,
            "is stale",
            "unregister twice",
        );
    });
}

backend_tests!(cross_context_ids_are_refused, stale_ids_are_refused);
