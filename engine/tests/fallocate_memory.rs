//! A fallocated range costs memory that does not grow with its length (issue 35, item 1):
//! xfstests generic/103 fallocates all of `df`'s free space, and the server grew to 23 GB
//! because every fallocated page was a zeroed page. Allocated pages that hold zeros are runs
//! (`data.rs`, "Allocated zeros"); so are pages written with zeros, which is what a
//! `copy_file_range` of a sparse file becomes when the kernel does it as reads and writes.
//! A huge `truncate` up and a `pwrite` far past the end allocate nothing or one page.
//!
//! The heap is measured with a counting allocator, so this test binary holds this one test
//! (tests running beside it would move the count).

use lanefs::*;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const PAGE: u64 = 4096;

/// Heap bytes `f` leaves allocated.
fn held_by(f: impl FnOnce()) -> u64 {
    let before = live();
    f();
    live().saturating_sub(before)
}

#[test]
fn memory_does_not_grow_with_the_length_allocated() {
    let fs = Filesystem::new(Config {
        max_bytes: Some(4096 * GIB),
        max_inodes: Some(1024),
        ..Config::default()
    });
    let ctx = Ctx::root();
    let (a, fh) = fs
        .create(&ctx, ROOT_INO, b"warm", 0o644, libc::O_RDWR)
        .unwrap();
    // Warm up: tables and per-thread state that a first file allocates for good.
    fs.fallocate(&ctx, fh, 0, 0, GIB).unwrap();
    fs.write(&ctx, fh, 5 * PAGE, b"x").unwrap();
    fs.release(fh).unwrap();
    fs.unlink(&ctx, ROOT_INO, b"warm").unwrap();
    assert_eq!(fs.getattr(a.ino), Err(Errno::ENOENT));

    let (a, fh) = fs
        .create(&ctx, ROOT_INO, b"f", 0o644, libc::O_RDWR)
        .unwrap();
    let used = |fs: &Filesystem| {
        let s = fs.statfs();
        s.blocks - s.bfree
    };

    // 1 GiB, then 64 GiB more, then 1 TiB more: the same few bytes each time.
    let mut per_gib = Vec::new();
    for (off, len) in [(0, GIB), (GIB, 64 * GIB), (65 * GIB, 1024 * GIB)] {
        let held = held_by(|| fs.fallocate(&ctx, fh, 0, off, len).unwrap());
        per_gib.push(held as f64 / (len / GIB) as f64);
        assert!(
            held < 4 * KIB,
            "fallocate of {} GiB held {held} bytes",
            len / GIB
        );
    }
    let total = 1089 * GIB;
    assert_eq!(used(&fs), total / PAGE, "every page counts as allocated");
    assert_eq!(fs.zero_pages(), total / PAGE);
    assert!(
        fs.resident_pages() < 16,
        "{} pages in memory",
        fs.resident_pages()
    );
    let st = fs.getattr(a.ino).unwrap();
    assert_eq!((st.size, st.blocks), (total, total / 512));
    eprintln!("heap held per fallocated GiB: {per_gib:.3?} bytes");

    // Reads of the range are zeros, and it is data to SEEK_DATA.
    let mut buf = vec![1u8; 8192];
    assert_eq!(fs.read(fh, 500 * GIB + 100, &mut buf), Ok(8192));
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(
        fs.seek_data_hole(a.ino, 7 * GIB, libc::SEEK_HOLE),
        Ok(total)
    );

    // A write into the range makes one page; zeros written make none.
    let held = held_by(|| {
        fs.write(&ctx, fh, 10 * GIB + 1, b"data").unwrap();
    });
    assert!(held <= 2 * PAGE, "a write of 4 bytes held {held}");
    let zeros = vec![0u8; MIB as usize];
    let held = held_by(|| {
        for i in 0..256 {
            fs.write(&ctx, fh, 2000 * GIB + i * MIB, &zeros).unwrap();
        }
    });
    assert!(held < 16 * KIB, "256 MiB of zeros written held {held}");
    assert_eq!(used(&fs), (total + 256 * MIB) / PAGE);

    // A truncation up by a petabyte, and a write far past the end.
    let held = held_by(|| {
        let set = SetAttr {
            size: Some(1 << 50),
            ..SetAttr::default()
        };
        fs.setattr(&ctx, a.ino, &set, None).unwrap();
        fs.write(&ctx, fh, (1 << 52) + 3, b"far").unwrap();
    });
    assert!(held <= 2 * PAGE, "truncate up and a far write held {held}");
    assert_eq!(fs.getattr(a.ino).unwrap().size, (1 << 52) + 6);

    // Punching out most of it and truncating it away give the space back.
    fs.fallocate(
        &ctx,
        fh,
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
        GIB,
        100 * GIB,
    )
    .unwrap();
    assert_eq!(used(&fs), (total + 256 * MIB - 100 * GIB) / PAGE + 1);
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    fs.setattr(&ctx, a.ino, &set, None).unwrap();
    assert_eq!((used(&fs), fs.zero_pages()), (0, 0));
    fs.release(fh).unwrap();
    fs.check_invariants().unwrap();
}

use counting_alloc::live;
