//! `lanefs_store::compact` (`lanefs compact DIR`): the room deleted files took in the checkpoint
//! goes back to the host, the filesystem is the same afterwards (tree, numbers, generations,
//! times, contents), and a power cut at any flush of it leaves that same filesystem.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::dump;
use lanefs::{Client, Config};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Opened, Options, compact, fsck, open};
use parking_lot::Mutex;

const DIR: &str = "/s";
const CHECKPOINT: &str = "/s/checkpoint.redb";

fn opts(disk: &SimDisk) -> Options {
    Options {
        disk: Arc::new(disk.clone()),
        segment_size: 256 << 10,
        commit_interval: Duration::from_secs(3600),
        checkpoint_records: u64::MAX,
        checkpoint_segments: usize::MAX,
        ..Options::default()
    }
}

fn reopen(disk: &SimDisk) -> Opened {
    open(Path::new(DIR), Config::default(), opts(disk)).unwrap()
}

fn len(disk: &SimDisk, path: &str) -> usize {
    disk.files()
        .into_iter()
        .find(|(p, _)| p == Path::new(path))
        .map_or(0, |(_, d)| d.len())
}

/// Bytes of file `i`: distinct for every file and offset.
fn bytes(i: usize, n: usize) -> Vec<u8> {
    (0..n).map(|k| (k * 7 + i * 131 + k / 4096) as u8).collect()
}

/// What a filesystem is, for comparing: its tree with times, and every kept file's contents.
type State = (BTreeMap<Vec<u8>, common::Node>, Vec<Vec<u8>>);

fn state(c: &Client) -> State {
    let files = (0..5)
        .map(|i| c.read(format!("/keep/k{i}")).unwrap())
        .collect();
    (dump(c.fs(), true), files)
}

/// A store where 6 MiB of files were written, checkpointed and deleted (the deletion left in
/// the journal, for compaction's checkpoint to apply), and 5 files kept; its state.
fn store_with_deleted_files(disk: &SimDisk) -> State {
    let o = reopen(disk);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/keep").unwrap();
    c.create_dir("/gone").unwrap();
    for i in 0..5 {
        c.write(format!("/keep/k{i}"), bytes(i, 100_000 + i * 999))
            .unwrap();
    }
    for i in 0..24 {
        c.write(format!("/gone/g{i}"), bytes(100 + i, 256 << 10))
            .unwrap();
    }
    fs.sync_all().unwrap();
    o.store.checkpoint().unwrap();
    assert!(
        len(disk, CHECKPOINT) > 6 << 20,
        "the files' pages are in it"
    );
    for i in 0..24 {
        c.remove_file(format!("/gone/g{i}")).unwrap();
    }
    c.remove_dir("/gone").unwrap();
    fs.sync_all().unwrap();
    let s = state(&c);
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    s
}

fn check_same(disk: &SimDisk, want: &State, what: &str) {
    fsck::check(Path::new(DIR), &opts(disk)).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
    let o = reopen(disk);
    let c = Client::root(Arc::new(o.fs));
    let got = state(&c);
    assert!(got.0 == want.0, "{what}: the tree changed");
    assert!(got.1 == want.1, "{what}: a kept file's contents changed");
    c.fs().check_invariants().unwrap();
}

#[test]
fn compaction_gives_deleted_files_room_back_and_keeps_the_rest() {
    let disk = SimDisk::new();
    let want = store_with_deleted_files(&disk);
    let before = len(&disk, CHECKPOINT);
    let r = compact(Path::new(DIR), opts(&disk)).unwrap();
    let after = len(&disk, CHECKPOINT);
    assert!(r.applied > 24, "the deletions applied: {r:?}");
    assert!(r.after < r.before, "{r:?}");
    assert!(
        after + (5 << 20) < before && after < 2 << 20,
        "checkpoint.redb {before} -> {after} bytes"
    );
    check_same(&disk, &want, "after compaction");
    // Opening a store whose checkpoint is small and dense compacts nothing.
    let o = reopen(&disk);
    drop(o);
    assert_eq!(len(&disk, CHECKPOINT), after);
}

#[test]
fn a_power_cut_at_any_flush_of_a_compaction_leaves_the_same_filesystem() {
    let disk = SimDisk::new();
    let want = store_with_deleted_files(&disk);
    let images = Arc::new(Mutex::new(Vec::new()));
    let im = images.clone();
    let mut k = 0;
    disk.on_sync(move |d, _| {
        k += 1;
        for u in [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(k)] {
            im.lock().push(d.crash(u));
        }
    });
    compact(Path::new(DIR), opts(&disk)).unwrap();
    disk.clear_hook();
    let images = std::mem::take(&mut *images.lock());
    assert!(images.len() >= 12, "{} images", images.len());
    for (i, img) in images.iter().enumerate() {
        check_same(img, &want, &format!("image {i} of {}", images.len()));
    }
    check_same(&disk, &want, "after compaction");
}

#[test]
fn compacting_a_directory_that_is_no_store_makes_none() {
    let disk = SimDisk::new();
    let e = compact(Path::new(DIR), opts(&disk)).unwrap_err();
    // The error says what the directory is (here: none at all).
    assert!(e.to_string().contains("not a lanefs store"), "{e}");
    assert!(disk.files().is_empty(), "nothing written");
}
