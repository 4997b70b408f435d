//! A freed file's data goes back to the allocator at once (issue 10, item 8), not when epoch
//! reclamation gets round to dropping its inode, which on a filesystem that goes idle after
//! `rm` is never: 4 GiB written through a mount and removed stayed resident.
//!
//! The heap is measured with a counting allocator, so this test binary holds this one test
//! (tests running beside it would move the count). Whether the allocator then hands the memory
//! to the system is the program's choice of allocator: `lanefs mount` uses mimalloc and
//! purges it (cli/src/main.rs, `start_purging`; cli/tests/memory.rs measures the server's
//! resident set).

use std::sync::Arc;

use lanefs::*;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

const MIB: usize = 1 << 20;
/// Data per file: large against anything else the engine allocates meanwhile.
const SIZE: usize = 64 * MIB;

/// Writes `SIZE` bytes to a new `/name`; returns the handle, still open.
fn write_file<'c>(c: &'c Client, name: &str) -> File<'c> {
    let mut f = c
        .open(name, OpenOptions::new().write(true).create(true))
        .unwrap();
    let chunk = vec![0x5a; MIB];
    for _ in 0..SIZE / MIB {
        std::io::Write::write_all(&mut f, &chunk).unwrap();
    }
    f
}

/// Asserts that `what` gave back (nearly) all the data written since `before` bytes were live.
fn assert_freed(before: usize, what: &str) {
    let kept = live().saturating_sub(before);
    assert!(
        kept < SIZE / 8,
        "{what}: {} MiB of the {} MiB written still allocated",
        kept / MIB,
        SIZE / MIB
    );
}

#[test]
fn freed_file_data_goes_back_to_the_allocator_at_once() {
    let fs = Arc::new(Filesystem::new(Config::default()));
    let c = Client::root(fs.clone());
    // Warm up: tables and per-thread state that a first file allocates for good.
    drop(write_file(&c, "/warm"));
    c.remove_file("/warm").unwrap();

    // Unlink of a closed file.
    let before = live();
    drop(write_file(&c, "/a"));
    assert!(live() >= before + SIZE, "the data was allocated");
    c.remove_file("/a").unwrap();
    assert_freed(before, "unlink");

    // Last close of an unlinked file.
    let before = live();
    let f = write_file(&c, "/b");
    c.remove_file("/b").unwrap();
    assert!(live() >= before + SIZE, "an open file keeps its data");
    drop(f);
    assert_freed(before, "last close of an unlinked file");

    // A rename that replaces a file.
    c.write("/d", b"small").unwrap();
    let before = live();
    drop(write_file(&c, "/c"));
    c.rename("/d", "/c").unwrap();
    assert_freed(before, "rename over a file");

    // The kernel's lookup references: freed at the last FORGET.
    let ctx = Ctx::root().via_kernel();
    let before = live();
    drop(write_file(&c, "/e"));
    let e = fs.lookup(&ctx, ROOT_INO, b"e").unwrap();
    fs.unlink(&ctx, ROOT_INO, b"e").unwrap();
    assert!(live() >= before + SIZE, "a looked-up inode keeps its data");
    fs.forget(e.ino, 1);
    assert_freed(before, "forget");

    fs.check_invariants().unwrap();
}

fn live() -> usize {
    counting_alloc::live() as usize
}
