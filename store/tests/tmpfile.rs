//! `O_TMPFILE` files on the disk store: one written, linked and fsynced survives a power cut
//! with its data (and a power cut at any flush before shows it whole or not at all); one
//! never linked leaves nothing after a power cut (no name, no inode, no space, fsck clean),
//! whether or not a checkpoint held it; one held unnamed by a checkpoint and linked after it
//! comes back named.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use common::{HOUR, PowerCuts, dump, on_demand};
use lanefs::{Client, Config, Filesystem, OpenOptions};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Opened, Options, fsck, open};

const DIR: &str = "/s";

/// On `disk`: a commit only on a sync, checkpoints only on demand.
/// Loaded whole when opened: the tests count the inodes the checkpoint holds by what the
/// open loads.
fn opts(disk: &SimDisk) -> Options {
    Options {
        lazy: false,
        ..on_demand(common::opts(disk, 64 << 10, HOUR))
    }
}

fn reopen(disk: &SimDisk) -> Opened {
    open(Path::new(DIR), Config::default(), opts(disk)).unwrap()
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).mode(0o640);
    o
}

/// Inodes in use.
fn inodes(fs: &Filesystem) -> u64 {
    let s = fs.statfs();
    s.files - s.ffree
}

/// Pages in use.
fn pages(fs: &Filesystem) -> u64 {
    let s = fs.statfs();
    s.blocks - s.bfree
}

/// The filesystem passes its checks, and holds no inode its tree does not name.
fn clean(fs: &Filesystem, what: &str) {
    let report = fs
        .check_invariants()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let named: HashSet<_> = dump(fs, false).values().map(|n| n.ino).collect();
    assert_eq!(report.inodes, named.len() as u64, "{what}: unnamed inodes");
    assert_eq!(inodes(fs), named.len() as u64, "{what}: inode count");
}

fn data() -> Vec<u8> {
    (0..20_000u32).map(|i| (i % 251) as u8).collect()
}

#[test]
fn a_linked_and_fsynced_tmpfile_survives_a_power_cut_with_its_data() {
    let disk = SimDisk::new();
    let o = reopen(&disk);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    fs.sync_all().unwrap();
    let cuts = PowerCuts::every_flush(&disk, 0);
    let f = c.open_tmpfile("/d", &rw()).unwrap();
    let data = data();
    f.write_at(&data[..9000], 0).unwrap();
    f.sync_all().unwrap(); // its records durable, with no name yet
    f.write_at(&data[9000..], 9000).unwrap();
    c.link_file(&f, "/d/named").unwrap();
    f.sync_all().unwrap();
    let images = cuts.take();
    let acknowledged = disk.crash(Unflushed::Lost);
    drop(f);
    drop(c);
    drop(fs);
    drop(o.store);

    // After the acknowledged fsync: there, with every byte.
    let r = fsck::check(Path::new(DIR), &opts(&acknowledged)).unwrap();
    assert_eq!(r.inodes, 3, "root, /d, the file: {r:?}");
    let o = reopen(&acknowledged);
    let c = Client::root(Arc::new(o.fs));
    assert_eq!(c.read("/d/named").unwrap(), data);
    let m = c.metadata("/d/named").unwrap();
    assert_eq!((m.attr.nlink, m.mode()), (1, libc::S_IFREG | 0o640));
    clean(c.fs(), "acknowledged");

    // At any flush before: the name with all the data, or neither.
    assert!(images.len() >= 6, "{} images", images.len());
    let mut named = 0;
    for (i, img) in images.iter().map(|c| &c.disk).enumerate() {
        let what = format!("image {i}");
        fsck::check(Path::new(DIR), &opts(img)).unwrap_or_else(|e| panic!("{what}: {e}"));
        let o = reopen(img);
        let c = Client::root(Arc::new(o.fs));
        match c.read("/d/named") {
            Ok(got) => {
                assert_eq!(got, data, "{what}: named with part of its data");
                named += 1;
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{what}"),
        }
        assert!(c.read_dir("/d").unwrap().len() <= 1, "{what}");
        clean(c.fs(), &what);
    }
    assert!(named > 0, "no image after the link's flush");
}

/// A tmpfile written (pages), fsynced, and never linked; `checkpoint`: a checkpoint taken
/// while it is open holds it as an orphan. After the power cut: nothing of it.
fn unnamed_tmpfile_is_gone_after_a_power_cut(checkpoint: bool, excl: bool) {
    let what = format!("checkpoint {checkpoint}, O_EXCL {excl}");
    let disk = SimDisk::new();
    let o = reopen(&disk);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.write("/keep", b"kept").unwrap();
    let (base_inodes, base_pages) = (inodes(&fs), pages(&fs));
    let mut opts_tmp = rw();
    opts_tmp.create_new(excl);
    let f = c.open_tmpfile("/", &opts_tmp).unwrap();
    f.write_at(&data(), 0).unwrap();
    f.sync_all().unwrap();
    if checkpoint {
        o.store.checkpoint().unwrap();
        assert!(o.store.checkpoint_lsn() > 0);
        // Records after the checkpoint change the orphan, durably.
        f.write_at(b"more", 40_000).unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(inodes(&fs), base_inodes + 1);
    assert!(pages(&fs) >= base_pages + 5);
    let image = disk.crash(Unflushed::Lost);
    drop(f);
    drop(c);
    drop(fs);
    drop(o.store);

    let r = fsck::check(Path::new(DIR), &opts(&image)).unwrap();
    assert_eq!(r.inodes, 2, "{what}: root and /keep: {r:?}");
    let o = reopen(&image);
    if checkpoint {
        assert_eq!(
            o.report.loaded, 3,
            "{what}: the orphan was in the checkpoint"
        );
    }
    assert_eq!(inodes(&o.fs), base_inodes, "{what}: its inode is free");
    assert_eq!(pages(&o.fs), base_pages, "{what}: its pages are free");
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    assert_eq!(c.read_dir("/").unwrap().len(), 1, "{what}: only /keep");
    assert_eq!(c.read("/keep").unwrap(), b"kept");
    clean(&fs, &what);
    // Recovery's Free of it is durable and reaches the checkpoint: the keys hold nothing of
    // it (a reopen from the checkpoint alone loads two inodes), and fsck agrees.
    o.store.checkpoint().unwrap();
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    let r = fsck::check(Path::new(DIR), &opts(&image)).unwrap();
    assert_eq!(r.inodes, 2, "{what}: {r:?}");
    let o = reopen(&image);
    assert_eq!(o.report.loaded, 2, "{what}: the checkpoint still holds it");
    assert_eq!(o.report.replayed, 0, "{what}");
    assert_eq!(pages(&o.fs), base_pages, "{what}");
    clean(&o.fs, &what);
}

#[test]
fn an_unnamed_tmpfile_leaves_nothing_after_a_power_cut() {
    unnamed_tmpfile_is_gone_after_a_power_cut(false, false);
    unnamed_tmpfile_is_gone_after_a_power_cut(false, true);
}

#[test]
fn an_unnamed_tmpfile_a_checkpoint_held_leaves_nothing_after_a_power_cut() {
    unnamed_tmpfile_is_gone_after_a_power_cut(true, false);
    unnamed_tmpfile_is_gone_after_a_power_cut(true, true);
}

#[test]
fn a_tmpfile_a_checkpoint_held_unnamed_and_linked_after_it_comes_back_named() {
    let disk = SimDisk::new();
    let o = reopen(&disk);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let f = c.open_tmpfile("/", &rw()).unwrap();
    f.write_at(b"before the checkpoint", 0).unwrap();
    o.store.checkpoint().unwrap();
    f.write_at(b", after it", 21).unwrap();
    c.link_file(&f, "/late").unwrap();
    f.sync_all().unwrap();
    let image = disk.crash(Unflushed::Lost);
    // Live, the checkpoint that applies the Link drops the orphan mark; reopened from it,
    // the file is an ordinary one.
    o.store.checkpoint().unwrap();
    drop(f);
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    let o = reopen(&disk);
    assert_eq!(o.report.replayed, 0, "all in the checkpoint");
    assert_eq!(o.report.loaded, 2, "root and /late");
    drop(o);
    for (what, img) in [
        ("journal after the checkpoint", &image),
        ("checkpoint", &disk),
    ] {
        fsck::check(Path::new(DIR), &opts(img)).unwrap_or_else(|e| panic!("{what}: {e}"));
        let o = reopen(img);
        let c = Client::root(Arc::new(o.fs));
        assert_eq!(
            c.read("/late").unwrap(),
            b"before the checkpoint, after it",
            "{what}"
        );
        assert_eq!(c.metadata("/late").unwrap().attr.nlink, 1, "{what}");
        clean(c.fs(), what);
    }
}
