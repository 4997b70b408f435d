//! Allocated ranges cost memory and checkpoint keys that do not grow with their length
//! (issue 35, item 1): a store mount of the default size (its host's disk) that fallocated
//! all of `df`'s free space grew to 23 GB and was killed, then again while opening that
//! store. Here the engine holds fallocated pages as runs (engine `data.rs`, "Allocated
//! zeros"), the checkpoint keeps one key per run (docs/STORE.md, "Checkpoints"), and neither
//! the journal's replay nor the checkpoint's load makes a page of them.
//!
//! The heap is measured with a counting allocator, so this test binary holds this one test.

mod common;

use std::time::Duration;

use common::{host_opts, on_demand};
use lanefs::{Config, Ctx, FALLOC_FL_KEEP_SIZE, Filesystem, ROOT_INO};
use lanefs_store::{Options, open};

#[path = "../../engine/tests/common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const PAGE: u64 = 4096;

/// A store on the host whose checkpoints the test takes, with a small cache for them.
fn opts() -> Options {
    Options {
        checkpoint_cache: 1 << 20,
        ..on_demand(host_opts(1 << 20, Duration::from_millis(5)))
    }
}

fn used(fs: &Filesystem) -> u64 {
    let s = fs.statfs();
    s.blocks - s.bfree
}

/// What a file's contents look like from outside: size, blocks, data where expected.
fn check(fs: &Filesystem, ino: lanefs::Ino, size: u64, blocks: u64, data_at: u64) {
    let a = fs.getattr(ino).unwrap();
    assert_eq!((a.size, a.blocks), (size, blocks));
    let ctx = Ctx::root();
    let fh = fs.open(&ctx, ino, libc::O_RDONLY).unwrap();
    let mut b = vec![1u8; 2 * PAGE as usize];
    assert_eq!(fs.read(fh, data_at - PAGE, &mut b), Ok(b.len()));
    assert!(b[..PAGE as usize].iter().all(|&x| x == 0));
    assert_eq!(&b[PAGE as usize..PAGE as usize + 4], b"data");
    assert_eq!(fs.read(fh, 3 * GIB + 5, &mut b), Ok(b.len()));
    assert!(b.iter().all(|&x| x == 0));
    fs.release(fh).unwrap();
    assert_eq!(fs.seek_data_hole(ino, 0, libc::SEEK_HOLE), Ok(size));
}

#[test]
fn fallocated_space_costs_no_pages_live_in_the_checkpoint_or_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ctx = Ctx::root();
    // The store's default size: its host's disk. All of `df`'s free space, as generic/103.
    let o = open(dir, Config::default(), opts()).unwrap();
    let (fs, store) = (o.fs, o.store);
    let free = fs.statfs().bavail * PAGE;
    assert!(free > 8 * GIB, "a host with {} MiB free", free / MIB);
    let before = live();
    let (a, fh) = fs
        .create(&ctx, ROOT_INO, b"big", 0o644, libc::O_RDWR)
        .unwrap();
    let main = free - 2 * GIB;
    fs.fallocate(&ctx, fh, 0, 0, main).unwrap();
    // Past the end too, and one page of data in the middle.
    fs.fallocate(&ctx, fh, FALLOC_FL_KEEP_SIZE, main, GIB)
        .unwrap();
    let data_at = 2 * GIB + 7 * PAGE;
    fs.write(&ctx, fh, data_at, b"data").unwrap();
    fs.release(fh).unwrap();
    let held = live().saturating_sub(before);
    eprintln!(
        "{} GiB fallocated: {held} bytes of heap held",
        (main + GIB) / GIB
    );
    // The count is the whole process's heap, and the store's own threads (committer,
    // checkpointer) take and give back buffers of up to a MiB or so meanwhile: 4 MiB allows
    // for them, and is far below what any per-page cost makes of at least 8 GiB (2M pages,
    // 16 MiB at 8 bytes a page).
    assert!(
        held < 4 * MIB,
        "fallocating {} GiB held {held} bytes",
        main / GIB
    );
    let pages = (main + GIB) / PAGE;
    assert_eq!(used(&fs), pages);
    assert!(fs.resident_pages() <= 1);
    check(&fs, a.ino, main, pages * 8, data_at);

    // Reopened from the journal: the Allocate records replayed make runs, not pages.
    drop(fs);
    store.close().unwrap();
    let before = live();
    let o = open(dir, Config::default(), opts()).unwrap();
    let held = live().saturating_sub(before);
    eprintln!("opened from the journal: {held} bytes of heap held");
    assert!(held < 64 * MIB, "opening held {held} bytes");
    let (fs, store) = (o.fs, o.store);
    assert_eq!(used(&fs), pages);
    assert!(fs.resident_pages() <= 1);
    check(&fs, a.ino, main, pages * 8, data_at);

    // Checkpointed: a key per run (the file is a few keys, not a key per 15 pages).
    store.checkpoint().unwrap();
    fs.evict();
    let ck = std::fs::metadata(dir.join("checkpoint.redb"))
        .unwrap()
        .len();
    eprintln!("checkpoint.redb: {} KiB", ck / 1024);
    assert!(ck < 8 * MIB, "checkpoint.redb of {ck} bytes");
    drop(fs);
    store.close().unwrap();
    let before = live();
    let o = open(dir, Config::default(), opts()).unwrap();
    let held = live().saturating_sub(before);
    eprintln!("opened from the checkpoint: {held} bytes of heap held");
    assert!(held < 64 * MIB, "opening held {held} bytes");
    let (fs, store) = (o.fs, o.store);
    assert_eq!(used(&fs), pages);
    assert_eq!(fs.resident_pages(), 0);
    check(&fs, a.ino, main, pages * 8, data_at);

    // Pages written with zeros are kept as empty pages; they load as runs too.
    let (b, fh) = fs
        .create(&ctx, ROOT_INO, b"zeros", 0o644, libc::O_RDWR)
        .unwrap();
    let zeros = vec![0u8; MIB as usize];
    for i in 0..16 {
        fs.write(&ctx, fh, i * MIB, &zeros).unwrap();
    }
    fs.release(fh).unwrap();
    // Then the big file punched in the middle and cut short: the runs split and shrink.
    let fh = fs.open(&ctx, a.ino, libc::O_RDWR).unwrap();
    let punch = lanefs::FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    fs.fallocate(&ctx, fh, punch, GIB, GIB / 2).unwrap();
    fs.release(fh).unwrap();
    store.checkpoint().unwrap();
    drop(fs);
    store.close().unwrap();
    let o = open(dir, Config::default(), opts()).unwrap();
    let (fs, store) = (o.fs, o.store);
    let a2 = fs.getattr(b.ino).unwrap();
    assert_eq!((a2.size, a2.blocks), (16 * MIB, 16 * MIB / 512));
    assert_eq!(fs.resident_pages(), 0);
    assert_eq!(used(&fs), pages - GIB / 2 / PAGE + 16 * MIB / PAGE);
    assert_eq!(
        fs.seek_data_hole(a.ino, 0, libc::SEEK_HOLE),
        Ok(GIB),
        "the punched hole"
    );
    assert_eq!(
        fs.seek_data_hole(a.ino, GIB, libc::SEEK_DATA),
        Ok(GIB + GIB / 2)
    );
    fs.check_invariants().unwrap();
    drop(fs);
    store.close().unwrap();
}

use counting_alloc::live;
