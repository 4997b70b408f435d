//! What a lookup, a path walk, a `stat` and a create or unlink cost in lock acquisitions,
//! counted by the engine's own statistics, after many threads have worked in the same
//! directory: a lookup or a path walk takes one lock per component (a dirent-map shard, read),
//! a `stat` takes none, and a create or unlink takes a fixed set whatever other threads did
//! (in particular, not the index-shard locks of the other threads' runs).

use std::sync::Arc;

use lanefs::{Client, Config, Ctx, Filesystem, LockClass, ROOT_INO, StatsSnapshot};

const THREADS: usize = 48;

/// A filesystem with `/spool/in`, in which `THREADS` threads (each its own thread slot)
/// created and removed files, leaving `t{i}` each.
fn busy_spool() -> (Arc<Filesystem>, Client) {
    let fs = Arc::new(Filesystem::new(Config::default()));
    let c = Client::root(fs.clone());
    c.create_dir_all("/spool/in").unwrap();
    c.create_dir("/hot").unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let fs = fs.clone();
            s.spawn(move || {
                let c = Client::root(fs);
                for i in 0..20 {
                    c.write(format!("/spool/in/tmp{t}-{i}"), b"").unwrap();
                    c.remove_file(format!("/spool/in/tmp{t}-{i}")).unwrap();
                    c.write(format!("/hot/x{t}-{i}"), b"").unwrap();
                }
                c.write(format!("/spool/in/t{t}"), b"").unwrap();
            });
        }
    });
    (fs, c)
}

fn locks_taken(fs: &Filesystem, f: impl FnOnce()) -> StatsSnapshot {
    let before = fs.stats();
    f();
    fs.stats().since(&before)
}

fn total(d: &StatsSnapshot) -> u64 {
    d.total_acquisitions()
}

#[test]
fn a_path_walk_takes_one_lock_per_component() {
    let (fs, c) = busy_spool();
    let d = locks_taken(&fs, || {
        assert!(c.metadata("/spool/in/t0").unwrap().is_file());
    });
    assert_eq!(
        total(&d),
        3,
        "three components, three dirent-shard reads: {:?}",
        d.hottest_locks()
    );
    assert_eq!(d.lock(LockClass::DirentShard).acquired, 3);
    // The directory itself: its size counts 49 entries without a lock.
    let d = locks_taken(&fs, || {
        let m = c.metadata("/spool/in").unwrap();
        assert_eq!(m.len(), (THREADS as u64 + 2) * 20);
    });
    assert_eq!(total(&d), 2, "{:?}", d.hottest_locks());
}

#[test]
fn a_lookup_takes_one_lock_and_a_stat_none() {
    let (fs, c) = busy_spool();
    let ctx = Ctx::root();
    let spool = fs.lookup(&ctx, ROOT_INO, b"spool").unwrap().ino;
    let inn = fs.lookup(&ctx, spool, b"in").unwrap().ino;
    let d = locks_taken(&fs, || {
        fs.lookup(&ctx, inn, b"t7").unwrap();
    });
    assert_eq!(total(&d), 1, "{:?}", d.hottest_locks());
    let d = locks_taken(&fs, || {
        fs.getattr(inn).unwrap();
        fs.lookup(&ctx, inn, b"..").unwrap();
        fs.lookup(&ctx, inn, b".").unwrap();
    });
    assert_eq!(total(&d), 0, "{:?}", d.hottest_locks());
    drop(c);
}

#[test]
fn a_create_and_unlink_by_path_take_a_fixed_set_of_locks() {
    let (fs, c) = busy_spool();
    let d = locks_taken(&fs, || {
        c.write("/hot/mine", b"").unwrap();
        c.remove_file("/hot/mine").unwrap();
    });
    let got = |c| d.lock(c).acquired;
    let all = d.hottest_locks();
    // Of the index shards: one to add the entry, one to take it out, and none of the 48
    // other threads' runs in /hot.
    assert_eq!(got(LockClass::IndexShard), 2, "{all:?}");
    assert_eq!(got(LockClass::Stripe), 2, "{all:?}");
    // Map shards: the walk to /hot twice, the create's existence check and insert, the
    // unlink's read of the name and its removal.
    assert_eq!(got(LockClass::DirentShard), 6, "{all:?}");
    // An inode number taken and given back; a handle opened and closed.
    assert_eq!(got(LockClass::InoAlloc), 2, "{all:?}");
    assert_eq!(got(LockClass::Handles), 2, "{all:?}");
    // The rest: the freed file's data lock, the file's ctime at the unlink, and the
    // directory's times at the create and at the unlink when the coarse clock ticked since
    // they were last stored: 16 to 18.
    assert_eq!(got(LockClass::FileData), 1, "{all:?}");
    assert!((16..=18).contains(&total(&d)), "{all:?}");
}
