//! A bounded inode cache (`Config::inode_cache`, engine `fs/lazy.rs`, "Eviction"): a lazily
//! opened store whose namespace is larger than its cache evicts clean files and reads them
//! again when they are next reached, and serves exactly what a store opened whole serves:
//! before its first checkpoint (nothing the journal replayed is evicted), after it, with
//! changes made between checkpoints (a changed file stays until one keeps it), with threads
//! reading, changing and checkpointing at once, and after it is closed and opened again.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use common::{Tree, assert_same_tree, dump, seed};
use lanefs::{Client, Config, Ctx, Filesystem, INODE_BYTES, OpenOptions};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Opened, open};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Inodes the cache holds (the smallest budget there is).
const CACHE: u64 = 64;

fn open_on(sim: &SimDisk, lazy: bool) -> Opened {
    let cfg = Config {
        inode_cache: Some(CACHE * INODE_BYTES),
        ..Config::default()
    };
    open(&PathBuf::from("/s"), cfg, common::lazy_opts(sim, lazy)).unwrap()
}

const DIRS: usize = 8;
const FILES: usize = 60;

/// `DIRS` directories of `FILES` files each, file `f` of directory `d` holding `bytes(d, f)`.
fn files(c: &Client, bytes: impl Fn(usize, usize) -> Vec<u8>) {
    for d in 0..DIRS {
        c.create_dir(format!("/d{d}")).unwrap();
        for f in 0..FILES {
            c.write(format!("/d{d}/f{f}"), bytes(d, f)).unwrap();
        }
    }
}

fn file(rng: &mut StdRng) -> String {
    format!(
        "/d{}/f{}",
        rng.random_range(0..DIRS),
        rng.random_range(0..FILES)
    )
}

/// One random change; errors (a name missing, a name taken) are part of the game.
fn change(c: &Client, rng: &mut StdRng) {
    let p = file(rng);
    let _ = match rng.random_range(0..10) {
        0 | 1 => {
            let len = [0, 7, 4096, 9000][rng.random_range(0..4)];
            let b: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
            c.write(&p, b)
        }
        2 => c
            .open(&p, OpenOptions::new().write(true))
            .and_then(|f| f.write_at(b"mid", rng.random_range(0..5000)).map(drop)),
        3 => c.truncate(&p, rng.random_range(0..6000)),
        4 => c.remove_file(&p),
        5 => c.rename(&p, file(rng)),
        6 => c.hard_link(&p, file(rng)),
        7 => c.set_permissions(&p, 0o600 | rng.random_range(0..0o100)),
        8 => c.metadata(&p).and_then(|m| {
            c.fs()
                .setxattr(&Ctx::root(), m.ino(), b"user.k", &[rng.random(); 5], 0)
                .map_err(Into::into)
        }),
        _ => c.symlink(
            &p,
            format!(
                "/d{}/l{}",
                rng.random_range(0..DIRS),
                rng.random_range(0..9)
            ),
        ),
    };
}

/// Runs eviction passes until the cache holds at most `bound` inodes: a parked inode goes
/// only after every epoch guard pinned when it was parked is dropped (the grace period),
/// which other threads' guards (other tests of this binary) delay, so this waits for that
/// event, pass after pass, instead of for a time. False if it does not come in 100,000
/// passes.
fn evict_down_to(fs: &Filesystem, bound: u64) -> bool {
    evict_until(fs, |fs| fs.inodes_in_memory() <= bound)
}

/// [`evict_down_to`] for what the bounded cache counts, inodes and directory entries: in
/// bytes, at most `bytes` (entries of held directories aside: [`common::cache_within`]).
fn evict_down_to_bytes(fs: &Filesystem, bytes: u64) -> bool {
    evict_until(fs, |fs| common::cache_within(fs, bytes))
}

fn evict_until(fs: &Filesystem, done: impl Fn(&Filesystem) -> bool) -> bool {
    for _ in 0..100_000 {
        if done(fs) {
            return true;
        }
        fs.evict_inodes(false);
        std::thread::yield_now();
    }
    false
}

/// The tree with what differs between two stores given the same changes taken out: inode
/// numbers, generations and cookies (a lazily opened store hands out other numbers) and
/// times.
fn shape(fs: &Filesystem) -> Tree {
    let mut t = dump(fs, false);
    for n in t.values_mut() {
        (n.ino, n.generation, n.cookie) = (lanefs::Ino(0), lanefs::Generation(0), 0);
    }
    t
}

/// Files in `DIRS` directories, some with data, xattrs, second names and symlinks; a
/// checkpoint; then changes only the journal holds. Closed, or cut off at a power failure.
fn make(sim: &SimDisk, rng: &mut StdRng, crash: bool) -> SimDisk {
    let o = open_on(sim, false);
    let c = Client::root(Arc::new(o.fs));
    files(&c, |d, f| vec![(d * FILES + f) as u8; f * 50]);
    for _ in 0..200 {
        change(&c, rng);
    }
    o.store.checkpoint().unwrap();
    for _ in 0..100 {
        change(&c, rng);
    }
    if crash {
        o.store.sync().unwrap();
        sim.crash(Unflushed::Kept)
    } else {
        drop(c);
        o.store.close().unwrap();
        sim.clone()
    }
}

/// For each seed: a store of about 500 files opened whole and, with a cache of 64 inodes,
/// lazily; walked before and after a checkpoint, then given the same changes (the lazy one
/// checkpointed now and then), walked after each round; then both closed and opened whole.
/// The two agree at every step, and the lazy one evicts and stays well under the tree's
/// size.
#[test]
fn a_bounded_cache_serves_what_a_whole_open_serves() {
    for s in seed::seeds("eviction", 0..6) {
        let mut rng = StdRng::seed_from_u64(s);
        let image = make(&SimDisk::new(), &mut rng, s % 2 == 1);
        let copy = image.crash(Unflushed::Kept);
        let whole = open_on(&image, false);
        let lazy = open_on(&copy, true);
        assert!(lazy.report.lazy, "seed {s}");
        let want = shape(&whole.fs);
        let total = want.len() as u64;
        let replayed_to = lazy.store.counters().lsn;
        // Before a checkpoint holds what the journal replayed, nothing may go. A pass that
        // meets that asks the store for a checkpoint, which its checkpointer may take
        // during the walk: evictions then follow it.
        assert_same_tree(&format!("seed {s}: first walk"), &want, &shape(&lazy.fs));
        let evicted = lazy.fs.inodes_evicted();
        assert!(
            evicted == 0 || lazy.store.checkpoint_lsn() >= replayed_to,
            "seed {s}: {evicted} evicted before a checkpoint held the journal up to LSN \
             {replayed_to} (it holds up to {})",
            lazy.store.checkpoint_lsn()
        );
        lazy.store.checkpoint().unwrap();
        for walk in 0..2 {
            assert_same_tree(&format!("seed {s}: walk {walk}"), &want, &shape(&lazy.fs));
        }
        // Directories go too, with their entries (each counted as `ENTRY_BYTES`), after
        // their files: the tree's entries alone are several times the budget, so the passes
        // get under it only by evicting directories.
        assert!(
            evict_down_to_bytes(&lazy.fs, CACHE * INODE_BYTES),
            "seed {s}: {} inodes and {} entries in memory ({} bytes counted), tree of \
             {total}, {} evicted ({} directories), with a cache of {CACHE} inodes",
            lazy.fs.inodes_in_memory(),
            lazy.fs.entries_in_memory(),
            lazy.fs.inode_cache_bytes(),
            lazy.fs.inodes_evicted(),
            lazy.fs.directories_evicted(),
        );
        assert!(
            lazy.fs.directories_evicted() > 0,
            "seed {s}: no directory evicted"
        );
        assert_same_tree(
            &format!("seed {s}: after eviction"),
            &want,
            &shape(&lazy.fs),
        );
        let (wfs, lfs) = (Arc::new(whole.fs), Arc::new(lazy.fs));
        let (wc, lc) = (Client::root(wfs.clone()), Client::root(lfs.clone()));
        for round in 0..6 {
            let mut r = StdRng::seed_from_u64(s ^ round);
            let mut r2 = r.clone();
            for i in 0..60 {
                change(&wc, &mut r);
                change(&lc, &mut r2);
                if i % 20 == 19 {
                    lazy.store.checkpoint().unwrap();
                }
            }
            assert_same_tree(
                &format!("seed {s}: round {round}"),
                &shape(&wfs),
                &shape(&lfs),
            );
        }
        lfs.check_invariants().unwrap();
        let mut after = Vec::new();
        for (c, fs, store, img) in [(wc, wfs, whole.store, &image), (lc, lfs, lazy.store, &copy)] {
            drop(c);
            store.close().unwrap();
            drop(fs);
            let re = open_on(img, false);
            assert_eq!(re.report.counts_wrong, None, "seed {s}");
            re.fs.check_invariants().unwrap();
            after.push(shape(&re.fs));
            re.store.close().unwrap();
        }
        assert_same_tree(&format!("seed {s}: reopened"), &after[0], &after[1]);
    }
}

/// Counts a thread's end in the counter it holds, when dropped (a panic included).
struct Done<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Readers, writers and a checkpointer at once on a lazily opened store with a cache of 64
/// inodes: readers check files nobody changes against their known bytes; each writer owns a
/// directory and checks every change it makes by reading it back (its model: name → bytes);
/// the checkpointer keeps making changed files clean. Afterwards the tree is the readers'
/// files and the writers' models, the invariants hold, and opened again whole, the same.
#[test]
fn eviction_races_readers_writers_and_checkpoints() {
    let s = seed::seed("eviction_races");
    let sim = SimDisk::new();
    {
        let o = open_on(&sim, false);
        let c = Client::root(Arc::new(o.fs));
        files(&c, |d, f| vec![(d * FILES + f) as u8; 100]);
        for w in 0..3 {
            c.create_dir(format!("/w{w}")).unwrap();
        }
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    let o = open_on(&sim, true);
    let fs = Arc::new(o.fs);
    let store = Arc::new(o.store);
    store.checkpoint().unwrap();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let models: Vec<BTreeMap<String, Vec<u8>>> = std::thread::scope(|sc| {
        for t in 0..3u64 {
            let fs = fs.clone();
            sc.spawn(move || {
                let c = Client::root(fs);
                let mut rng = StdRng::seed_from_u64(s ^ (t << 8));
                for _ in 0..1500 {
                    let (d, f) = (rng.random_range(0..DIRS), rng.random_range(0..FILES));
                    let got = c.read(format!("/d{d}/f{f}")).unwrap();
                    assert_eq!(got, [(d * FILES + f) as u8; 100], "seed {s}: /d{d}/f{f}");
                }
            });
        }
        let (store2, done2) = (store.clone(), &done);
        sc.spawn(move || {
            while done2.load(std::sync::atomic::Ordering::SeqCst) < 3 {
                store2.checkpoint().unwrap();
                std::thread::yield_now();
            }
        });
        let writers: Vec<_> = (0..3u64)
            .map(|w| {
                let (fs, done) = (fs.clone(), &done);
                sc.spawn(move || {
                    // Counted when the writer ends, however it ends: the checkpointer stops.
                    let _done = Done(done);
                    let c = Client::root(fs);
                    let mut rng = StdRng::seed_from_u64(s ^ (w << 16) ^ 1);
                    // Names → file, files → bytes (a write through one name of a file with
                    // two changes both).
                    let mut names: BTreeMap<String, usize> = BTreeMap::new();
                    let mut files: Vec<Vec<u8>> = Vec::new();
                    let name = |rng: &mut StdRng| format!("/w{w}/n{}", rng.random_range(0..40));
                    for i in 0..800u32 {
                        let p = name(&mut rng);
                        match rng.random_range(0..5) {
                            0 | 1 => {
                                let b = i.to_le_bytes().repeat(rng.random_range(1..300));
                                c.write(&p, &b).unwrap();
                                match names.get(&p) {
                                    Some(&f) => files[f] = b,
                                    None => {
                                        names.insert(p.clone(), files.len());
                                        files.push(b);
                                    }
                                }
                            }
                            2 => {
                                let q = name(&mut rng);
                                match c.rename(&p, &q) {
                                    // The same file under both names: nothing happens.
                                    Ok(()) if names.get(&p) == names.get(&q) => {}
                                    Ok(()) => {
                                        let f = names.remove(&p).expect("renamed a file");
                                        names.insert(q, f);
                                    }
                                    Err(_) => assert!(!names.contains_key(&p)),
                                }
                            }
                            3 => match c.remove_file(&p) {
                                Ok(()) => assert!(names.remove(&p).is_some()),
                                Err(_) => assert!(!names.contains_key(&p)),
                            },
                            _ => {
                                let q = name(&mut rng);
                                if c.hard_link(&p, &q).is_ok() {
                                    names.insert(q, names[&p]);
                                }
                            }
                        }
                        // Every name the model has reads back as the model says.
                        if i % 50 == 0 {
                            for (p, &f) in &names {
                                assert_eq!(c.read(p).unwrap(), files[f], "seed {s}: {p}");
                            }
                        }
                    }
                    names
                        .into_iter()
                        .map(|(p, f)| (p, files[f].clone()))
                        .collect::<BTreeMap<String, Vec<u8>>>()
                })
            })
            .collect();
        writers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        fs.inodes_evicted() > 0 || evict_down_to(&fs, CACHE + DIRS as u64 + 4),
        "seed {s}: nothing evicted"
    );
    let check = |fs: &Filesystem, what: &str| {
        fs.check_invariants().unwrap();
        let t = dump(fs, false);
        for (w, model) in models.iter().enumerate() {
            let names: Vec<_> = t
                .keys()
                .filter(|k| k.starts_with(format!("/w{w}/").as_bytes()))
                .map(|k| String::from_utf8(k.clone()).unwrap())
                .collect();
            assert_eq!(
                names,
                model.keys().cloned().collect::<Vec<_>>(),
                "seed {s}: {what}: names of /w{w}"
            );
            for (p, b) in model {
                assert_eq!(&t[p.as_bytes()].content, b, "seed {s}: {what}: {p}");
            }
        }
        for d in 0..DIRS {
            for f in 0..FILES {
                let n = &t[format!("/d{d}/f{f}").as_bytes()];
                assert_eq!(n.content, [(d * FILES + f) as u8; 100], "seed {s}: {what}");
            }
        }
    };
    check(&fs, "live");
    drop(fs);
    Arc::try_unwrap(store)
        .unwrap_or_else(|_| panic!("store shared"))
        .close()
        .unwrap();
    let re = open_on(&sim, false);
    assert_eq!(re.report.counts_wrong, None, "seed {s}");
    check(&re.fs, "reopened whole");
}

/// A store closed cleanly after a checkpoint holds every inode in its checkpoint: opened
/// lazily, a walk that only reads evicts without waiting for a checkpoint (there is nothing to take one for).
#[test]
fn a_store_closed_cleanly_evicts_while_it_is_only_read() {
    let sim = SimDisk::new();
    {
        let o = open_on(&sim, false);
        let c = Client::root(Arc::new(o.fs));
        files(&c, |_, f| vec![f as u8; 10]);
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    let o = open_on(&sim, true);
    assert!(o.report.lazy);
    let want = (DIRS * FILES) as u64;
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    for d in 0..DIRS {
        for f in 0..FILES {
            assert_eq!(c.metadata(format!("/d{d}/f{f}")).unwrap().len(), 10);
        }
    }
    let o = (fs, o.store);
    assert!(
        evict_down_to(&o.0, CACHE + DIRS as u64 + 1),
        "{} of {want} inodes in memory, {} evicted",
        o.0.inodes_in_memory(),
        o.0.inodes_evicted()
    );
}

/// A kernel caller's READDIRPLUS takes a lookup reference on each entry it gets attributes
/// for, which keeps that inode in memory until the kernel forgets it (which it does only
/// under its own memory pressure): with the cache three quarters full or more, a listing
/// gives the kernel names only (no attributes, no reference), and the files it lists stay
/// evictable. With room in the cache, the same listing gives attributes and references, as
/// it always did.
#[test]
fn a_full_cache_lists_names_only_to_the_kernel() {
    let sim = SimDisk::new();
    {
        let o = open_on(&sim, false);
        let c = Client::root(Arc::new(o.fs));
        files(&c, |d, f| vec![d as u8; f]);
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    let kernel = Ctx::root().via_kernel();
    // (name, inode number, attributes given) of each entry of /d0 but `.` and `..`.
    let list = |fs: &Arc<Filesystem>| {
        let d0 = Client::root(fs.clone()).metadata("/d0").unwrap().ino();
        let fh = fs.opendir(&kernel, d0).unwrap();
        let mut got = Vec::new();
        fs.readdir(&kernel, fh, 0, true, |e, a| {
            if e.name != b"." && e.name != b".." {
                got.push((e.name.to_vec(), e.ino, a.is_some()));
            }
            true
        })
        .unwrap();
        fs.releasedir(fh).unwrap();
        got
    };

    // Room in the cache: attributes, and a lookup reference the kernel holds.
    let roomy = {
        let cfg = Config {
            inode_cache: Some(100_000 * INODE_BYTES),
            ..Config::default()
        };
        let disk = sim.crash(Unflushed::Kept);
        let o = open(&PathBuf::from("/s"), cfg, common::lazy_opts(&disk, true)).unwrap();
        (Arc::new(o.fs), o.store)
    };
    let (roomy, _roomy_store) = roomy;
    let got = list(&roomy);
    assert_eq!(got.len(), FILES);
    for (name, ino, attrs) in &got {
        let name = String::from_utf8_lossy(name);
        assert!(attrs, "{name}: no attributes with room in the cache");
        assert!(roomy.held_by_kernel(*ino), "{name}: not held by the kernel");
    }

    // The cache full: names only, and nothing held.
    let Opened { fs, store, .. } = open_on(&sim.crash(Unflushed::Kept), true);
    store.checkpoint().unwrap();
    let fs = Arc::new(fs);
    let c = Client::root(fs.clone());
    for d in 1..DIRS {
        for f in 0..FILES {
            c.metadata(format!("/d{d}/f{f}")).unwrap();
        }
    }
    // Full as the engine counts it: inodes, and entries at `ENTRY_BYTES` each.
    assert!(
        fs.inode_cache_bytes() >= (CACHE - CACHE / 4) * INODE_BYTES,
        "{} inodes and {} entries in memory, with a cache of {CACHE} inodes",
        fs.inodes_in_memory(),
        fs.entries_in_memory()
    );
    let got = list(&fs);
    assert_eq!(got.len(), FILES);
    for (name, ino, attrs) in &got {
        let name = String::from_utf8_lossy(name);
        assert!(!attrs, "{name}: attributes given with the cache full");
        assert!(!fs.held_by_kernel(*ino), "{name}: held by the kernel");
    }
    // What was listed is still read right, and goes again.
    for f in 0..FILES {
        assert_eq!(c.read(format!("/d0/f{f}")).unwrap(), vec![0u8; f]);
    }
    assert!(
        evict_down_to(&fs, CACHE + DIRS as u64 + 1),
        "{} inodes in memory after the listing, with a cache of {CACHE}",
        fs.inodes_in_memory()
    );
}

/// The kernel keeps every directory it walked until its own memory pressure (a scan under
/// `lanefs run`, which leaves directories to the kernel): their entries stay in memory
/// whatever the budget. A pass leaves them out of what it works to; counted, they put every
/// pass's goal out of reach, and each pass evicted every file it could, ones just loaded
/// and about to be asked for among them. Once the kernel forgets the directories, their
/// entries count again, and passes bring the whole cache under its budget.
#[test]
fn entries_of_directories_the_kernel_holds_do_not_empty_the_cache() {
    let sim = SimDisk::new();
    {
        let o = open_on(&sim, false);
        let c = Client::root(Arc::new(o.fs));
        files(&c, |_, _| b"x".to_vec());
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    let Opened { fs, store, .. } = open_on(&sim.crash(Unflushed::Kept), true);
    store.checkpoint().unwrap();
    let fs = Arc::new(fs);
    let kernel = Ctx::root().via_kernel();
    let dirs: Vec<_> = (0..DIRS)
        .map(|d| {
            fs.lookup(&kernel, lanefs::ROOT_INO, format!("d{d}").as_bytes())
                .unwrap()
                .ino
        })
        .collect();
    let c = Client::root(fs.clone());
    for f in 0..FILES {
        c.metadata(format!("/d{}/f{f}", DIRS - 1)).unwrap();
    }
    store.checkpoint().unwrap();
    for _ in 0..64 {
        fs.evict_inodes(false);
    }
    let counts = |fs: &Filesystem| {
        format!(
            "{} inodes and {} entries ({} of held directories) in memory, {} evicted, a \
             budget of {CACHE} inodes",
            fs.inodes_in_memory(),
            fs.entries_in_memory(),
            fs.held_entries(),
            fs.inodes_evicted()
        )
    };
    assert!(
        fs.held_entries() >= (DIRS * FILES) as u64
            && fs.entries_in_memory() * lanefs::ENTRY_BYTES > CACHE * INODE_BYTES,
        "the held directories' entries alone are over the budget: {}",
        counts(&fs)
    );
    assert!(fs.inodes_evicted() > 0, "nothing evicted: {}", counts(&fs));
    // The passes stop at three quarters of the budget (held entries aside), not at the
    // root and the held directories.
    assert!(
        fs.inodes_in_memory() >= 1 + DIRS as u64 + CACHE / 2,
        "the passes emptied the cache for entries they cannot free: {}",
        counts(&fs)
    );
    for ino in dirs {
        fs.forget(ino, 1);
    }
    assert!(
        evict_down_to_bytes(&fs, CACHE * INODE_BYTES),
        "forgotten directories' entries are still left out: {}",
        counts(&fs)
    );
}
