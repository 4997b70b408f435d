//! How long opening a store takes: makes a store holding N empty files (1000 per directory),
//! closes it, and times opening it again (the journal replayed into a new filesystem); then
//! times a checkpoint of it, an open from that checkpoint (the keys loaded, nothing left to
//! replay), and a `stat` of every file after that open.
//!
//! ```sh
//! cargo run --release -p lanefs-store --example recovery -- 1000000 /tmp/recovery-store
//! ```
//!
//! The directory is removed first and afterwards.

use std::time::Instant;

use lanefs::{Config, Ctx, InodeId};
use lanefs_store::{Options, open};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(1_000_000, |a| a.parse().expect("a file count"));
    let dir = std::path::PathBuf::from(args.next().unwrap_or("/tmp/lanefs-recovery".into()));
    let _ = std::fs::remove_dir_all(&dir);
    let ctx = Ctx::root();
    let t = Instant::now();
    {
        let o = open(&dir, Config::default(), Options::default()).expect("make the store");
        let fs = &o.fs;
        let mut d = InodeId::ROOT.ino;
        for i in 0..n {
            if i % 1000 == 0 {
                d = fs
                    .mkdir(
                        &ctx,
                        InodeId::ROOT.ino,
                        format!("d{}", i / 1000).as_bytes(),
                        0o755,
                    )
                    .expect("mkdir")
                    .ino;
            }
            fs.mknod(
                &ctx,
                d,
                format!("f{i:012}").as_bytes(),
                libc::S_IFREG | 0o644,
                0,
            )
            .expect("mknod");
        }
        o.store.close().expect("close");
    }
    let made = t.elapsed();
    let bytes: u64 = std::fs::read_dir(dir.join("journal"))
        .expect("the journal")
        .map(|e| e.expect("entry").metadata().expect("metadata").len())
        .sum();
    let t = Instant::now();
    let o = open(&dir, Config::default(), Options::default()).expect("reopen");
    let opened = t.elapsed();
    println!(
        "{n} files: made in {:.2} s; journal {:.1} MiB (segments, preallocated); reopened in {:.2} s, {} records replayed ({:.2} M records/s)",
        made.as_secs_f64(),
        bytes as f64 / (1 << 20) as f64,
        opened.as_secs_f64(),
        o.report.replayed,
        o.report.replayed as f64 / opened.as_secs_f64() / 1e6
    );
    let t = Instant::now();
    let applied = o.store.checkpoint().expect("checkpoint");
    let checkpointed = t.elapsed();
    o.store.close().expect("close");
    let size = std::fs::metadata(dir.join("checkpoint.redb"))
        .expect("the checkpoint")
        .len();
    println!(
        "checkpoint of {applied} records in {:.2} s ({:.0} k records/s), {:.1} MiB",
        checkpointed.as_secs_f64(),
        applied as f64 / checkpointed.as_secs_f64() / 1e3,
        size as f64 / (1 << 20) as f64
    );
    let t = Instant::now();
    let o = open(&dir, Config::default(), Options::default()).expect("reopen");
    let opened = t.elapsed();
    let t = Instant::now();
    let mut seen = 0u64;
    for d in 0..n.div_ceil(1000) {
        let dir_ino =
            o.fs.lookup(&ctx, InodeId::ROOT.ino, format!("d{d}").as_bytes())
                .expect("a directory")
                .ino;
        for i in d * 1000..((d + 1) * 1000).min(n) {
            o.fs.lookup(&ctx, dir_ino, format!("f{i:012}").as_bytes())
                .expect("a file");
            seen += 1;
        }
    }
    let scanned = t.elapsed();
    println!(
        "reopened from the checkpoint in {:.2} s ({} inodes loaded, {} records replayed); stat of all {seen} files in {:.2} s",
        opened.as_secs_f64(),
        o.report.loaded,
        o.report.replayed,
        scanned.as_secs_f64()
    );
    o.store.close().expect("close");
    let _ = std::fs::remove_dir_all(&dir);
}
