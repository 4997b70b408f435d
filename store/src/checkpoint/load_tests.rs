use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lanefs::{Client, Config, Ctx, Filesystem, MemoryStore};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::{Checkpoint, Compact, DATA, META, kv};
use crate::disk::SimDisk;

const FIRST_COOKIE: u64 = 1 << 48;

/// A new store on a simulated disk: the disk, its directory, its options, and it open.
fn new_store() -> (SimDisk, &'static Path, crate::Options, crate::Opened) {
    let disk = SimDisk::new();
    let dir = Path::new("/s");
    // Loaded whole: these tests are about what that load refuses.
    let opts = crate::Options {
        disk: Arc::new(disk.clone()),
        lazy: false,
        ..crate::Options::default()
    };
    let o = crate::open(dir, Config::default(), opts.clone()).unwrap();
    (disk, dir, opts, o)
}

/// A checkpointed store of 30 directories of 10 files (many of the tests' 64-entry
/// windows); then `damage` changes its `meta` table directly (redb's checksums stay
/// right), and the opening must fail with an error containing `want`, within a minute:
/// the tree's reader and the thread applying what it read stop each other, whichever
/// fails.
fn refused(damage: impl FnOnce(&mut redb::Table<&[u8], &[u8]>), want: &str) {
    let (disk, dir, opts, o) = new_store();
    let c = Client::root(Arc::new(o.fs));
    for d in 0..30 {
        c.create_dir(format!("/d{d:02}")).unwrap();
        for f in 0..10 {
            c.write(format!("/d{d:02}/f{f}"), b"x").unwrap();
        }
    }
    o.store.checkpoint().unwrap();
    drop(c);
    o.store.close().unwrap();
    {
        let db = super::database::open_db(&disk, &dir.join(super::FILE), false, 1 << 20).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(META).unwrap();
            damage(&mut t);
        }
        txn.commit().unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = crate::open(dir, Config::default(), opts).map(drop);
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Err(e)) => {
            eprintln!("refused: {e}");
            assert!(e.contains(want), "{e}")
        }
        Ok(Ok(())) => panic!("a damaged checkpoint opened"),
        Err(_) => panic!("opening a damaged checkpoint hung"),
    }
}

/// The inode number of `/dNN/fN` as the checkpoint's entry names it.
fn target(t: &redb::Table<&[u8], &[u8]>, parent: &[u8], name: &[u8]) -> u64 {
    let root = kv::named_key(kv::ENTRY, 1, parent);
    let d = kv::EntryVal::decode(t.get(&root[..]).unwrap().unwrap().value()).unwrap();
    let k = kv::named_key(kv::ENTRY, d.target.ino.0, name);
    kv::EntryVal::decode(t.get(&k[..]).unwrap().unwrap().value())
        .unwrap()
        .target
        .ino
        .0
}

/// The reader fails (a named inode is missing) in a late window.
#[test]
fn a_missing_inode_refuses_the_opening() {
    refused(
        |t| {
            let ino = target(t, b"d27", b"f3");
            t.remove(&kv::ino_key(kv::INODE, ino)[..]).unwrap();
        },
        "is named but missing",
    );
}

/// The applying thread fails (a second name for an inode with one link: a create of a
/// number in use) in the first window, while the reader has more to send.
#[test]
fn an_entry_the_engine_refuses_refuses_the_opening() {
    second_name(FIRST_COOKIE | 0xffff_ffff, "in use");
}

/// A cookie no entry can have (below the first, or past the last slot) is refused, not
/// used as a slot's index.
#[test]
fn an_entry_with_a_cookie_out_of_range_refuses_the_opening() {
    second_name(999, "out of range");
    second_name(200 << 48, "out of range");
    refused(
        |t| {
            let k = kv::ino_key(kv::COOKIE, 100);
            t.insert(&k[..], &(100u64 << 48).to_le_bytes()[..]).unwrap();
        },
        "out of range",
    );
}

/// `refused` with an entry `/again` naming `/d00/f0`, with `cookie`.
fn second_name(cookie: u64, want: &str) {
    refused(
        |t| {
            let d = target(t, b"d00", b"f0");
            let e = kv::EntryVal {
                target: lanefs::InodeId {
                    ino: lanefs::Ino(d),
                    generation: {
                        let k = kv::ino_key(kv::INODE, d);
                        let v = t.get(&k[..]).unwrap().unwrap();
                        lanefs::Generation(kv::InodeVal::decode(v.value()).unwrap().generation)
                    },
                },
                cookie,
            };
            let k = kv::named_key(kv::ENTRY, 1, b"again");
            t.insert(&k[..], &e.encode()[..]).unwrap();
        },
        want,
    );
}

/// What a load reads is no more than the pages redb keeps in use hold: the bound that
/// lets an opening skip counting them (`Checkpoint::compact_if_mostly_free`). A store of
/// every kind of key: files with data (sparse, and pages past the size), hard links,
/// symlinks, xattrs, an orphan, nested directories.
#[test]
fn a_load_reads_no_more_than_the_pages_in_use_hold() {
    let (disk, dir, _, o) = new_store();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let mut data = 0;
    for d in 0..20 {
        c.create_dir(format!("/d{d}")).unwrap();
        c.create_dir(format!("/d{d}/sub")).unwrap();
        for f in 0..50 {
            let n = (d * 50 + f) * 997 % 70_000;
            c.write(format!("/d{d}/sub/f{f}"), vec![d as u8 + 1; n])
                .unwrap();
            data += n;
        }
        c.hard_link(format!("/d{d}/sub/f0"), format!("/d{d}/link"))
            .unwrap();
        c.symlink("/d0/sub/f1", format!("/d{d}/sym")).unwrap();
    }
    let ctx = Ctx::root();
    let f = fs.lookup(&ctx, lanefs::InodeId::ROOT.ino, b"d1").unwrap();
    fs.setxattr(&ctx, f.ino, b"user.a", &[7; 300], 0).unwrap();
    let mut read = lanefs::OpenOptions::new();
    read.read(true);
    let open_file = c.open("/d2/sub/f3", &read).unwrap();
    c.remove_file("/d2/sub/f3").unwrap();
    fs.sync_all().unwrap();
    o.store.checkpoint().unwrap();
    drop(open_file);
    drop(c);
    drop(fs);
    o.store.close().unwrap();

    let (uuid, _) = crate::identity::identity(&disk, dir, false).unwrap();
    let ck = Checkpoint::open(&disk, dir, uuid, false, true, Compact::Never, 1 << 20)
        .unwrap()
        .unwrap();
    let mut rec = Filesystem::recover(Config::default(), Arc::new(MemoryStore));
    let loaded = ck.load(&mut rec).unwrap();
    let db = ck.db.as_ref().unwrap();
    let stored = {
        let txn = db.begin_read().unwrap();
        let t = txn.open_table(DATA).unwrap();
        t.len().unwrap()
    };
    assert!(stored > 0, "the files' pages are in the checkpoint");
    assert!(
        loaded.bytes > data as u64,
        "the load counted the pages it read: {} bytes for {data} bytes of file data",
        loaded.bytes
    );
    drop(ck);
    let mut db = super::database::open_db(&disk, &dir.join(super::FILE), false, 1 << 20).unwrap();
    let stats = {
        let txn = db.begin_write().unwrap();
        let s = txn.stats().unwrap();
        txn.abort().unwrap();
        s
    };
    let in_use = stats.allocated_pages() * stats.page_size() as u64;
    assert!(
        loaded.bytes <= in_use,
        "the load read {} bytes, the pages in use hold {in_use}",
        loaded.bytes
    );
    assert!(db.check_integrity().unwrap());
}

/// Birth times: a record's time is the inode's birth time, kept by the checkpoint and by
/// the journal after it, unchanged by later changes; an inode value of format 3 (none kept)
/// loads without one, next to values that have one, and a symlink's target after it is
/// whole.
#[test]
fn birth_times_survive_checkpoints_and_replay_and_old_values_have_none() {
    let (disk, dir, opts, o) = new_store();
    let c = Client::root(Arc::new(o.fs));
    c.create_dir("/d").unwrap();
    c.write("/d/f", b"x").unwrap();
    c.symlink("some/target", "/d/l").unwrap();
    c.symlink("old/target", "/d/old").unwrap();
    let born = |c: &Client, p: &str| c.symlink_metadata(p).unwrap().attr.btime;
    let before: Vec<_> = ["/", "/d", "/d/f", "/d/l", "/d/old"]
        .iter()
        .map(|p| born(&c, p))
        .collect();
    assert!(before.iter().all(Option::is_some), "{before:?}");
    // Changes after the birth move the other times, never the birth time. (Changed until the
    // clock has moved past the birth, so that a birth time that followed ctime would show.)
    c.write("/d/f", b"more").unwrap();
    while c.metadata("/d/f").unwrap().attr.ctime <= before[2].unwrap() {
        c.set_permissions("/d/f", 0o600).unwrap();
    }
    c.rename("/d/f", "/d/g").unwrap();
    c.hard_link("/d/g", "/h").unwrap();
    let g = c.metadata("/d/g").unwrap().attr;
    assert_eq!(g.btime, before[2]);
    assert!(g.ctime > g.btime.unwrap(), "{g:?}");
    o.store.checkpoint().unwrap();
    // After the checkpoint, in the journal only.
    c.create_dir("/late").unwrap();
    let late = born(&c, "/late");
    drop(c);
    o.store.close().unwrap();
    // /d/old as a checkpoint of format 3 keeps it: no birth time.
    {
        let db = super::database::open_db(&disk, &dir.join(super::FILE), false, 1 << 20).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(META).unwrap();
            let keys: Vec<Vec<u8>> = t
                .iter()
                .unwrap()
                .map(|kv| kv.unwrap().0.value().to_vec())
                .filter(|k| k[0] == kv::INODE)
                .collect();
            let mut found = 0;
            for k in keys {
                let v = kv::InodeVal::decode(t.get(&k[..]).unwrap().unwrap().value()).unwrap();
                if v.target == b"old/target" {
                    let old = kv::InodeVal { btime: None, ..v };
                    t.insert(&k[..], &old.encode()[..]).unwrap();
                    found += 1;
                }
            }
            assert_eq!(found, 1);
        }
        txn.commit().unwrap();
    }
    let o = crate::open(dir, Config::default(), opts).unwrap();
    let c = Client::root(Arc::new(o.fs));
    assert_eq!(born(&c, "/"), before[0]);
    assert_eq!(born(&c, "/d"), before[1]);
    assert_eq!(born(&c, "/d/g"), before[2]);
    assert_eq!(born(&c, "/h"), before[2]);
    assert_eq!(born(&c, "/d/l"), before[3]);
    assert_eq!(born(&c, "/late"), late, "replayed from the journal");
    assert_eq!(born(&c, "/d/old"), None, "a value of format 3");
    assert_eq!(c.read_link("/d/old").unwrap(), b"old/target");
    assert_eq!(c.read_link("/d/l").unwrap(), b"some/target");
    drop(c);
    o.store.close().unwrap();
}
