//! POSIX atomicity under races, through the library API (inode calls, with and without
//! kernel-style lookup references, and the path API), written by a helper without reading
//! the other tests: names renamed over (files, symlinks, directories), exchanged, replaced by
//! whiteouts, or removed while other threads look them up, open them, list their directory,
//! change their attributes and xattrs, or add entries to a directory being removed; then
//! link counts, `..`, reachability, leaked references and `check_invariants`. A failure is
//! counted with examples and printed; each test asserts there was none. `DUR_MS=<ms>`
//! (default 1500) sets how long each race runs, `LOCKMODE=lanes|dirlock|coarse` the locking.

use lanefs::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn dur() -> Duration {
    Duration::from_millis(
        std::env::var("DUR_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1500),
    )
}

struct Fails(Mutex<HashMap<String, (u64, Vec<String>)>>);
impl Fails {
    fn new() -> Arc<Self> {
        Arc::new(Fails(Mutex::new(HashMap::new())))
    }
    fn add(&self, k: &str, ex: String) {
        let mut m = self.0.lock().unwrap();
        let e = m.entry(k.to_string()).or_default();
        e.0 += 1;
        if e.1.len() < 3 {
            e.1.push(ex);
        }
    }
    /// Counts `r`'s error, if any, under `k`.
    fn io<T>(&self, k: &str, r: std::io::Result<T>) {
        if let Err(e) = r {
            self.add(k, format!("{e}"));
        }
    }
    /// Counts `r`'s errno, if any, under `k`.
    fn errno<T>(&self, k: &str, r: Result<T>) {
        if let Err(e) = r {
            self.add(k, format!("{e:?}"));
        }
    }
    fn report(&self, test: &str) -> u64 {
        let m = self.0.lock().unwrap();
        let mut t = 0;
        for (k, (n, ex)) in m.iter() {
            println!("[{test}] FAIL {k}: {n} e.g. {ex:?}");
            t += n;
        }
        if m.is_empty() {
            println!("[{test}] clean");
        }
        t
    }
}

fn fsnew() -> Arc<Filesystem> {
    let mut cfg = Config::default();
    if let Ok(m) = std::env::var("LOCKMODE") {
        cfg.locking = m.parse().unwrap();
    }
    Arc::new(Filesystem::new(cfg))
}
/// Makes a regular file `name` with permissions `perm` in `dir` (as root).
fn mkreg(fs: &Filesystem, dir: Ino, name: &[u8], perm: u32) -> Ino {
    fs.mknod(&Ctx::root(), dir, name, libc::S_IFREG | perm, 0)
        .unwrap()
        .ino
}
fn kctx() -> Ctx {
    Ctx::root().via_kernel()
}

fn check(fs: &Arc<Filesystem>, fails: &Fails) {
    let rep = match fs.check_invariants() {
        Err(e) => {
            fails.add("check_invariants", e);
            return;
        }
        Ok(r) => r,
    };
    let c = Client::root(fs.clone());
    let mut seen = HashSet::new();
    seen.insert(fs.root());
    let mut stack = vec![std::path::PathBuf::from("/")];
    while let Some(d) = stack.pop() {
        for e in c.read_dir(&d).unwrap() {
            seen.insert(e.ino);
            if e.kind == FileType::Directory {
                stack.push(d.join(std::ffi::OsStr::new(std::str::from_utf8(&e.name).unwrap())));
            }
        }
    }
    let st = fs.statfs();
    if rep.inodes != seen.len() as u64 || st.files - st.ffree != seen.len() as u64 {
        fails.add(
            "inode leak (refs?)",
            format!(
                "check {} statfs used {} reachable {} handles {}",
                rep.inodes,
                st.files - st.ffree,
                seen.len(),
                fs.open_handles()
            ),
        );
    }
    if fs.over_forgets() != 0 {
        fails.add("over_forgets", format!("{}", fs.over_forgets()));
    }
}

/// What each racing thread of a [`Race`] gets: the filesystem, the stop flag (set when the
/// race ends) and the failure counts.
struct Racer {
    fs: Arc<Filesystem>,
    stop: Arc<AtomicBool>,
    fails: Arc<Fails>,
}

/// The threads of one race on a filesystem.
struct Race {
    fs: Arc<Filesystem>,
    stop: Arc<AtomicBool>,
    fails: Arc<Fails>,
    hs: Vec<std::thread::JoinHandle<()>>,
}

impl Race {
    fn new(fs: &Arc<Filesystem>) -> Race {
        Race {
            fs: fs.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            fails: Fails::new(),
            hs: Vec::new(),
        }
    }
    fn racer(&self) -> Racer {
        Racer {
            fs: self.fs.clone(),
            stop: self.stop.clone(),
            fails: self.fails.clone(),
        }
    }
    /// Starts a thread for each of `ts`, running `body` with it.
    fn spawn<T: Send + 'static>(
        &mut self,
        ts: impl IntoIterator<Item = T>,
        body: impl FnOnce(T, Racer) + Clone + Send + 'static,
    ) {
        for t in ts {
            let (body, racer) = (body.clone(), self.racer());
            self.hs.push(std::thread::spawn(move || body(t, racer)));
        }
    }
    /// Starts one thread running `body`.
    fn one(&mut self, body: impl FnOnce(Racer) + Send + 'static) {
        let racer = self.racer();
        self.hs.push(std::thread::spawn(move || body(racer)));
    }
    /// Lets the threads race for [`dur`], then stops and joins them; returns the failures
    /// they counted.
    fn run(self) -> Arc<Fails> {
        std::thread::sleep(dur());
        self.stop.store(true, Relaxed);
        for h in self.hs {
            h.join().unwrap();
        }
        self.fails
    }
    /// [`Race::finish`], then asserts that test `test` counted no failure ([`done`]).
    fn done(self, test: &str) {
        done(test, &self.finish());
    }
    /// [`Race::run`], then [`check`] of the filesystem.
    fn finish(self) -> Arc<Fails> {
        let fs = self.fs.clone();
        let fails = self.run();
        check(&fs, &fails);
        fails
    }
}

/// Asserts that `test` counted no failure (each is printed by `report`).
fn done(test: &str, fails: &Fails) {
    assert_eq!(fails.report(test), 0, "{test}: failures (printed above)");
}

// T1: path API on a file renamed over
#[test]
fn t1_path_file_renamed_over() {
    let fs = fsnew();
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    c.write("/d/b", b"AAAA").unwrap();
    let ops = Arc::new(AtomicU64::new(0));
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let c = Client::root(fs.clone());
        let mut k = 0u64;
        while !stop.load(Relaxed) {
            let tmp = format!("/d/tmp{t}");
            let data = if k % 2 == 0 { b"BBBB" } else { b"CCCC" };
            fails.io("renamer write", c.write(&tmp, data));
            fails.io("renamer rename", c.rename(&tmp, "/d/b"));
            k += 1;
        }
    });
    race.spawn(0..3, {
        let ops = ops.clone();
        move |t, Racer { fs, stop, fails }| {
            let c = Client::root(fs.clone());
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                k += 1;
                ops.fetch_add(1, Relaxed);
                match k % 9 {
                    0 => fails.io("metadata", c.metadata("/d/b")),
                    1 => match c.read("/d/b") {
                        Ok(v) if [&b"AAAA"[..], b"BBBB", b"CCCC"].contains(&&v[..]) => {}
                        Ok(v) => fails.add("read content", format!("{v:?}")),
                        Err(e) => fails.add("read", format!("{e}")),
                    },
                    2 => fails.io("chmod", c.set_permissions("/d/b", 0o644)),
                    3 => fails.io("utimes", c.set_times("/d/b", Some(TimeSet::Now), None)),
                    4 => fails.io("access", c.access("/d/b", MAY_READ)),
                    5 => {
                        if !c.exists("/d/b") {
                            fails.add("exists", String::new())
                        }
                    }
                    6 => fails.io("flags", c.flags("/d/b")),
                    7 => {
                        let l = format!("/d/l{t}");
                        match c.hard_link("/d/b", &l) {
                            Ok(()) => {
                                c.remove_file(&l).unwrap();
                            }
                            // The source renamed over since the walk: its inode has no name
                            // left, and Linux (`vfs_link`) refuses it with ENOENT too.
                            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                            Err(e) => fails.add("hard_link(b, l)", format!("{e}")),
                        }
                    }
                    _ => match c.open("/d/b", OpenOptions::new().write(true).create(true)) {
                        Ok(_) => {}
                        Err(e) => fails.add("open O_CREAT", format!("{e}")),
                    },
                }
            }
        }
    });
    let fails = race.finish();
    println!("ops {}", ops.load(Relaxed));
    done("t1", &fails);
}

// T2: symlink renamed over by another symlink; path walks through it
#[test]
fn t2_symlink_renamed_over() {
    let fs = fsnew();
    let c = Client::root(fs.clone());
    for d in ["/t1", "/t2", "/d"] {
        c.create_dir(d).unwrap();
    }
    c.write("/t1/f", b"1").unwrap();
    c.write("/t2/f", b"2").unwrap();
    c.symlink("/t1", "/d/s").unwrap();
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let c = Client::root(fs.clone());
        let mut k = 0;
        while !stop.load(Relaxed) {
            let tmp = format!("/d/tmp{t}");
            let tgt = if k % 2 == 0 { "/t2" } else { "/t1" };
            let _ = c.remove_file(&tmp);
            fails.io("mk symlink", c.symlink(tgt, &tmp));
            fails.io("rename symlink", c.rename(&tmp, "/d/s"));
            k += 1;
        }
    });
    race.spawn(0..3, move |_, Racer { fs, stop, fails }| {
        let c = Client::root(fs.clone());
        let mut k = 0u64;
        while !stop.load(Relaxed) {
            k += 1;
            match k % 6 {
                0 => match c.read_link("/d/s") {
                    Ok(v) if v == b"/t1" || v == b"/t2" => {}
                    r => fails.add("read_link", format!("{r:?}")),
                },
                1 => fails.io("metadata(follow)", c.metadata("/d/s")),
                2 => match c.read("/d/s/f") {
                    Ok(v) if v == b"1" || v == b"2" => {}
                    r => fails.add("read /d/s/f", format!("{r:?}")),
                },
                3 => fails.io("lstat", c.symlink_metadata("/d/s")),
                4 => fails.io("read_dir(/d/s)", c.read_dir("/d/s")),
                _ => fails.io("stat /d/s/f", c.metadata("/d/s/f")),
            }
        }
    });
    race.done("t2");
}

// T3: inode API with kernel refs: lookup b then ops by ino
#[test]
fn t3_kernel_ops_on_renamed_over() {
    let fs = fsnew();
    let k = kctx();
    let r = Ctx::root();
    let root = fs.root();
    let d = fs.mkdir(&r, root, b"d", 0o755).unwrap().ino;
    let (a, fh) = fs.create(&r, d, b"b", 0o644, libc::O_RDWR).unwrap();
    fs.write(&r, fh, 0, b"AAAA").unwrap();
    fs.release(fh).unwrap();
    fs.setxattr(&r, a.ino, b"user.k", b"v", 0).unwrap();
    fs.symlink(&r, d, b"s", b"tgtA").unwrap();
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let r = Ctx::root();
        let mut n = 0;
        while !stop.load(Relaxed) {
            n += 1;
            let tmp = format!("tmp{t}");
            match fs.create(&r, d, tmp.as_bytes(), 0o644, libc::O_RDWR | libc::O_EXCL) {
                Ok((a, fh)) => {
                    fs.write(&r, fh, 0, b"BBBB").unwrap();
                    fs.setxattr(&r, a.ino, b"user.k", b"v", 0).unwrap();
                    fs.release(fh).unwrap();
                    fails.errno("rename file", fs.rename(&r, d, tmp.as_bytes(), d, b"b", 0));
                }
                Err(e) => fails.add("create tmp", format!("{e:?}")),
            }
            let stmp = format!("stmp{t}");
            let tg = if n % 2 == 0 { &b"tgtA"[..] } else { b"tgtB" };
            fails.errno("symlink", fs.symlink(&r, d, stmp.as_bytes(), tg));
            fails.errno(
                "rename symlink",
                fs.rename(&r, d, stmp.as_bytes(), d, b"s", 0),
            );
        }
    });
    race.spawn(0..3, move |t, Racer { fs, stop, fails }| {
        let k = kctx();
        let r = Ctx::root();
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            let ctx = if t == 2 { &r } else { &k };
            match fs.lookup(ctx, d, b"b") {
                Err(e) => fails.add(
                    if t == 2 {
                        "lookup b (lib)"
                    } else {
                        "lookup b (kernel)"
                    },
                    format!("{e:?}"),
                ),
                Ok(a) if t != 2 => {
                    let ino = a.ino;
                    match n % 6 {
                        0 => fails.errno("getattr", fs.getattr(ino)),
                        1 => match fs.getxattr(&k, ino, b"user.k") {
                            Ok(v) if v == b"v" => {}
                            r => fails.add("getxattr", format!("{r:?}")),
                        },
                        2 => match fs.listxattr(&k, ino) {
                            Ok(v) if v == b"user.k\0" => {}
                            r => fails.add("listxattr", format!("{r:?}")),
                        },
                        3 => match fs.open(&k, ino, libc::O_RDONLY) {
                            Ok(fh) => {
                                let mut b = [0u8; 8];
                                match fs.read(fh, 0, &mut b) {
                                    Ok(4) => {}
                                    r => fails.add("read via fh", format!("{r:?}")),
                                }
                                fs.release(fh).unwrap();
                            }
                            Err(e) => fails.add("open(ino)", format!("{e:?}")),
                        },
                        4 => fails.errno("setxattr", fs.setxattr(&k, ino, b"user.k", b"v", 0)),
                        _ => {
                            fails.errno(
                                "setattr",
                                fs.setattr(
                                    &k,
                                    ino,
                                    &SetAttr {
                                        mode: Some(0o644),
                                        ..Default::default()
                                    },
                                    None,
                                ),
                            );
                        }
                    }
                    fs.forget(ino, 1);
                }
                Ok(_) => {}
            }
            match fs.lookup(ctx, d, b"s") {
                Err(e) => fails.add("lookup s", format!("{e:?}")),
                Ok(a) => {
                    if t != 2 {
                        match fs.readlink(a.ino) {
                            Ok(v) if v == b"tgtA" || v == b"tgtB" => {}
                            r => fails.add("readlink(kernel ref)", format!("{r:?}")),
                        }
                        fs.forget(a.ino, 1);
                    }
                }
            }
        }
    });
    let fails = race.finish();
    let _ = (k, a);
    done("t3", &fails);
}

// T4: readdir while renames over stable names, creates/unlinks churn
#[test]
fn t4_readdir() {
    let fs = fsnew();
    let r = Ctx::root();
    let d = fs.mkdir(&r, fs.root(), b"d", 0o755).unwrap().ino;
    let stable: Vec<String> = (0..200).map(|i| format!("s{i:03}")).collect();
    for s in &stable {
        fs.mknod(&r, d, s.as_bytes(), libc::S_IFREG | 0o644, 0)
            .unwrap();
    }
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let r = Ctx::root();
        let mut n = 0usize;
        while !stop.load(Relaxed) {
            n += 1;
            let tmp = format!("t{t}_{}", n % 50);
            let _ = fs.mknod(&r, d, tmp.as_bytes(), libc::S_IFREG | 0o644, 0);
            match n % 4 {
                0 => {
                    let s = format!("s{:03}", (n * 7 + t) % 200);
                    fails.errno(
                        "rename over stable",
                        fs.rename(&r, d, tmp.as_bytes(), d, s.as_bytes(), 0),
                    );
                }
                1 => {
                    let _ = fs.unlink(&r, d, tmp.as_bytes());
                }
                2 => {
                    let o = format!("u{t}_{}", n % 30);
                    let _ = fs.rename(&r, d, tmp.as_bytes(), d, o.as_bytes(), 0);
                }
                _ => {
                    let s = format!("s{:03}", (n * 13 + t) % 200);
                    let s2 = format!("s{:03}", (n * 5 + 1) % 200);
                    if s != s2 {
                        if let Err(e) =
                            fs.rename(&r, d, s.as_bytes(), d, s2.as_bytes(), RENAME_EXCHANGE)
                        {
                            fails.add("exchange", format!("{e:?}"))
                        }
                    }
                }
            }
        }
    });
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let ctx = if t == 0 { Ctx::root() } else { kctx() };
        let mut n = 0usize;
        while !stop.load(Relaxed) {
            n += 1;
            let fh = fs.opendir(&ctx, d).unwrap();
            let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
            let mut off = 0u64;
            let mut last = 0u64;
            let chunk = 1 + n % 17;
            loop {
                let mut got = 0;
                let mut refs = Vec::new();
                let r = fs.readdir(&ctx, fh, off, t == 1, |e, a| {
                    if got == chunk {
                        return false;
                    }
                    got += 1;
                    if e.offset <= last && !(e.offset == 1 && last == 0) {
                        fails.add(
                            "offset not increasing",
                            format!("{} after {}", e.offset, last),
                        );
                    }
                    last = e.offset;
                    off = e.offset;
                    *seen.entry(e.name.to_vec()).or_default() += 1;
                    if a.is_some() && e.name != b"." && e.name != b".." {
                        refs.push(e.ino);
                    }
                    true
                });
                for i in refs {
                    fs.forget(i, 1);
                }
                if let Err(e) = r {
                    fails.add("readdir err", format!("{e:?}"));
                    break;
                }
                if got < chunk {
                    break;
                }
            }
            fs.releasedir(fh).unwrap();
            for (nm, c) in &seen {
                if *c > 1 {
                    fails.add("name twice", format!("{}", String::from_utf8_lossy(nm)));
                }
            }
            for s in &stable {
                if !seen.contains_key(s.as_bytes()) {
                    fails.add(
                        if t == 0 {
                            "stable name missing"
                        } else {
                            "stable name missing (plus/kernel)"
                        },
                        s.clone(),
                    );
                }
            }
        }
    });
    let fails = race.finish();
    let a = fs.getattr(d).unwrap();
    let mut cnt = 0;
    let fh = fs.opendir(&r, d).unwrap();
    fs.readdir(&r, fh, 0, false, |_, _| {
        cnt += 1;
        true
    })
    .unwrap();
    fs.releasedir(fh).unwrap();
    if a.size != cnt as u64 * 20 {
        fails.add("dir size", format!("size {} entries {}", a.size, cnt));
    }
    done("t4", &fails);
}

// T5: rename a dir over an empty dir while creating inside the target
#[test]
fn t5_dir_renamed_over_vs_create_inside() {
    let fs = fsnew();
    let r = Ctx::root();
    let p = fs.mkdir(&r, fs.root(), b"p", 0o755).unwrap().ino;
    fs.mkdir(&r, p, b"t", 0o755).unwrap();
    let mut race = Race::new(&fs);
    race.one(move |Racer { fs, stop, fails }| {
        let r = Ctx::root();
        let (mut ok, mut ne) = (0, 0);
        while !stop.load(Relaxed) {
            let _ = fs.mkdir(&r, p, b"e", 0o755);
            match fs.rename(&r, p, b"e", p, b"t", 0) {
                Ok(()) => ok += 1,
                Err(Errno::ENOTEMPTY) => ne += 1,
                Err(e) => fails.add("rename e->t", format!("{e:?}")),
            }
        }
        println!("t5 renames ok {ok} enotempty {ne}");
    });
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let k = kctx();
        let name = format!("x{t}");
        let (mut ok, mut en) = (0, 0);
        while !stop.load(Relaxed) {
            let tino = match fs.lookup(&k, p, b"t") {
                Ok(a) => a.ino,
                Err(e) => {
                    fails.add("lookup t", format!("{e:?}"));
                    continue;
                }
            };
            match fs.mknod(&k, tino, name.as_bytes(), libc::S_IFREG | 0o644, 0) {
                Ok(a) => {
                    ok += 1;
                    let da = fs.getattr(tino).unwrap();
                    if da.nlink == 0 {
                        fails.add("entry created in removed dir", format!("{:?}", da.ino));
                    }
                    fails.errno("unlink own", fs.unlink(&k, tino, name.as_bytes()));
                    fs.forget(a.ino, 1);
                }
                Err(Errno::ENOENT) => en += 1,
                Err(e) => fails.add("mknod in t", format!("{e:?}")),
            }
            fs.forget(tino, 1);
        }
        println!("t5 mknod ok {ok} enoent {en}");
    });
    let fails = race.finish();
    let pa = fs.getattr(p).unwrap();
    let ta = fs.lookup(&r, p, b"t").unwrap();
    if pa.nlink != 2 + 1 + fs.lookup(&r, p, b"e").map(|_| 1).unwrap_or(0) {
        fails.add("p nlink", format!("{}", pa.nlink));
    }
    if ta.size != 40 {
        fails.add("t size", format!("{}", ta.size));
    }
    done("t5", &fails);
}

// T6: cross-directory directory moves; `..` and walks
#[test]
fn t6_cross_dir_moves() {
    let fs = fsnew();
    let c = Client::root(fs.clone());
    let np = 3;
    let nc = 6;
    let mut pinos = HashSet::new();
    for i in 0..np {
        c.create_dir(format!("/p{i}")).unwrap();
        pinos.insert(c.metadata(format!("/p{i}")).unwrap().ino());
        c.write(format!("/p{i}/stable"), b"s").unwrap();
    }
    for j in 0..nc {
        c.create_dir(format!("/p0/c{j}")).unwrap();
        c.write(format!("/p0/c{j}/f"), b"f").unwrap();
    }
    let pinos = Arc::new(pinos);
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, .. }| {
        let c = Client::root(fs.clone());
        let mut n: usize = t;
        while !stop.load(Relaxed) {
            n = n.wrapping_mul(1103515245).wrapping_add(12345);
            let j = (n >> 8) % nc;
            let a = (n >> 16) % np;
            let b = (n >> 20) % np;
            let _ = c.rename(format!("/p{a}/c{j}"), format!("/p{b}/c{j}"));
        }
    });
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let c = Client::root(fs.clone());
        let k = kctx();
        let mut n = 0usize;
        while !stop.load(Relaxed) {
            n += 1;
            let i = n % np;
            let j = (n / 3) % nc;
            match n % 4 {
                0 => fails.io("stat unrelated stable", c.metadata(format!("/p{i}/stable"))),
                1 => {
                    if let Ok(m) = c.metadata(format!("/p{i}/c{j}/..")) {
                        if !pinos.contains(&m.ino()) {
                            fails.add("'..' not a p", format!("{}", m.ino()))
                        }
                    }
                }
                2 => {
                    // find cj through kernel lookups; its `..` must be the p we found it in
                    for i in 0..np {
                        let pi = c.metadata(format!("/p{i}")).unwrap().ino();
                        if let Ok(a) = fs.lookup(&k, pi, format!("c{j}").as_bytes()) {
                            match fs.lookup(&k, a.ino, b"..") {
                                Ok(pa) => {
                                    if !pinos.contains(&pa.ino) {
                                        fails.add("kernel '..' not a p", format!("{}", pa.ino))
                                    }
                                    fs.forget(pa.ino, 1);
                                }
                                Err(e) => fails.add("kernel lookup ..", format!("{e:?}")),
                            }
                            fails.errno("lookup f in cj", fs.lookup(&r(), a.ino, b"f").map(drop));
                            fs.forget(a.ino, 1);
                        }
                    }
                }
                _ => {
                    let _ = t;
                    if let Ok(v) = c.read_dir(format!("/p{i}")) {
                        if !v.iter().any(|e| e.name == b"stable") {
                            fails.add("readdir p missing stable", String::new())
                        }
                    } else {
                        fails.add("read_dir p", String::new())
                    }
                }
            }
        }
    });
    fn r() -> Ctx {
        Ctx::root()
    }
    let fails = race.finish();
    let mut total = 0;
    for i in 0..np {
        let p = format!("/p{i}");
        let pino = c.metadata(&p).unwrap().ino();
        let ents = c.read_dir(&p).unwrap();
        let subdirs = ents
            .iter()
            .filter(|e| e.kind == FileType::Directory)
            .count() as u32;
        total += subdirs;
        let m = c.metadata(&p).unwrap();
        if m.attr.nlink != 2 + subdirs {
            fails.add(
                "p nlink",
                format!("{p}: {} vs {}", m.attr.nlink, 2 + subdirs),
            );
        }
        if m.len() != (2 + ents.len() as u64) * 20 {
            fails.add("p size", p.to_string());
        }
        for e in ents.iter().filter(|e| e.kind == FileType::Directory) {
            let dd = c
                .metadata(format!("{p}/{}/..", String::from_utf8_lossy(&e.name)))
                .unwrap()
                .ino();
            if dd != pino {
                fails.add("'..' wrong at rest", format!("{p}/{:?}", e.name));
            }
        }
    }
    if total != nc as u32 {
        fails.add("subdir count", format!("{total}"));
    }
    done("t6", &fails);
}

// T7: RENAME_EXCHANGE of two dirs: walks through either name always work
#[test]
fn t7_exchange_dirs_walk() {
    let fs = fsnew();
    let c = Client::root(fs.clone());
    c.create_dir("/x").unwrap();
    c.create_dir("/y").unwrap();
    c.write("/x/f", b"x").unwrap();
    c.write("/y/f", b"y").unwrap();
    c.symlink("/x", "/sx").unwrap();
    let mut race = Race::new(&fs);
    race.one(move |Racer { fs, stop, fails }| {
        let c = Client::root(fs.clone());
        while !stop.load(Relaxed) {
            let r = c.rename_with_flags("/x", "/y", RENAME_EXCHANGE);
            fails.io("exchange", r);
        }
    });
    race.spawn(0..3, move |t, Racer { fs, stop, fails }| {
        let c = Client::root(fs.clone());
        let k = kctx();
        let mut n = 0usize;
        while !stop.load(Relaxed) {
            n += 1;
            let nm = if (n + t) % 2 == 0 { "/x" } else { "/y" };
            match n % 5 {
                0 => match c.read(format!("{nm}/f")) {
                    Ok(v) if v == b"x" || v == b"y" => {}
                    r => fails.add("read dir/f", format!("{nm} {r:?}")),
                },
                1 => {
                    if let Err(e) = c.metadata(format!("{nm}/f")) {
                        fails.add("stat dir/f", format!("{nm} {e}"))
                    }
                }
                2 => match c.read_dir(nm) {
                    Ok(v) if v.len() == 1 => {}
                    r => fails.add("read_dir", format!("{nm} {r:?}")),
                },
                3 => match fs.lookup(&k, fs.root(), &nm.as_bytes()[1..]) {
                    Ok(a) => {
                        if let Err(e) = fs.lookup(&Ctx::root(), a.ino, b"f") {
                            if a.kind() == FileType::Directory {
                                fails.add("lookup f in kernel-held dir", format!("{e:?}"))
                            }
                        }
                        fs.forget(a.ino, 1);
                    }
                    Err(e) => fails.add("kernel lookup x/y", format!("{e:?}")),
                },
                _ => {
                    if let Err(e) = c.metadata(format!("{nm}/./f")) {
                        fails.add("stat dir/./f", format!("{nm} {e}"))
                    }
                }
            }
        }
    });
    race.done("t7");
}

// T8: open handles survive rename-over and unlink; nlink bookkeeping under link/rename churn
#[test]
fn t8_handles_and_nlink() {
    let fs = fsnew();
    let r = Ctx::root();
    let d = fs.mkdir(&r, fs.root(), b"d", 0o755).unwrap().ino;
    let names: Vec<String> = (0..12).map(|i| format!("n{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        if i < 4 {
            fs.mknod(&r, d, n.as_bytes(), libc::S_IFREG | 0o644, 0)
                .unwrap();
        }
    }
    let mut race = Race::new(&fs);
    race.spawn(0..2, {
        let names = names.clone();
        move |t, Racer { fs, stop, .. }| {
            let r = Ctx::root();
            let mut n = t as u64 + 1;
            while !stop.load(Relaxed) {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let a = &names[(n >> 33) as usize % 12];
                let b = &names[(n >> 45) as usize % 12];
                match (n >> 20) % 5 {
                    0 => {
                        if let Ok(at) = fs.lookup(&r, d, a.as_bytes()) {
                            let _ = fs.link(&r, at.ino, d, b.as_bytes());
                        }
                    }
                    1 => {
                        let _ = fs.rename(&r, d, a.as_bytes(), d, b.as_bytes(), 0);
                    }
                    2 => {
                        let _ = fs.rename(&r, d, a.as_bytes(), d, b.as_bytes(), RENAME_EXCHANGE);
                    }
                    3 => {
                        if fs.lookup(&r, d, a.as_bytes()).is_ok() {
                            let live = names
                                .iter()
                                .filter(|x| fs.lookup(&r, d, x.as_bytes()).is_ok())
                                .count();
                            if live > 3 {
                                let _ = fs.unlink(&r, d, a.as_bytes());
                            }
                        }
                    }
                    _ => {
                        let _ = fs.mknod(&r, d, a.as_bytes(), libc::S_IFREG | 0o644, 0);
                    }
                }
            }
        }
    });
    // handle holders
    race.spawn(0..2, {
        let names = names.clone();
        move |t, Racer { fs, stop, fails }| {
            let r = Ctx::root();
            let mut n = 0usize;
            while !stop.load(Relaxed) {
                n += 1;
                let nm = &names[(n * 7 + t) % 12];
                let Ok(fh) = fs
                    .lookup(&r, d, nm.as_bytes())
                    .and_then(|a| fs.open(&r, a.ino, libc::O_RDWR))
                else {
                    continue;
                };
                let tag = format!("{t}:{n}");
                let off = 4096 * (1 + t as u64);
                match fs.write(&r, fh, off, tag.as_bytes()) {
                    Ok(_) => {}
                    Err(e) => fails.add("write via fh", format!("{e:?}")),
                }
                std::thread::yield_now();
                let mut buf = vec![0u8; tag.len()];
                match fs.read(fh, off, &mut buf) {
                    Ok(_) if buf == tag.as_bytes() => {}
                    r => fails.add(
                        "read back via fh",
                        format!("{r:?} {:?}", String::from_utf8_lossy(&buf)),
                    ),
                }
                fails.errno("flush", fs.flush(fh));
                fs.release(fh).unwrap();
            }
        }
    });
    let fails = race.finish();
    let mut count: HashMap<Ino, u32> = HashMap::new();
    for n in &names {
        if let Ok(a) = fs.lookup(&r, d, n.as_bytes()) {
            *count.entry(a.ino).or_default() += 1;
        }
    }
    for (ino, c) in &count {
        let a = fs.getattr(*ino).unwrap();
        if a.nlink != *c {
            fails.add(
                "nlink != names",
                format!("ino {ino} nlink {} names {c}", a.nlink),
            );
        }
    }
    if fs.open_handles() != 0 {
        fails.add("handles leaked", format!("{}", fs.open_handles()));
    }
    done("t8", &fails);
}

// T9: a name that always exists (renamed over, exchanged, whiteout-replaced): creates must EEXIST,
// exchange/rename of it never ENOENT, lookups never ENOENT, readdir lists it once.
#[test]
fn t9_always_exists() {
    let fs = fsnew();
    let r = Ctx::root();
    let d = fs.mkdir(&r, fs.root(), b"d", 0o755).unwrap().ino;
    let d2 = fs.mkdir(&r, fs.root(), b"d2", 0o755).unwrap().ino;
    fs.mknod(&r, d, b"b", libc::S_IFREG | 0o644, 0).unwrap();
    fs.mknod(&r, d2, b"c", libc::S_IFREG | 0o644, 0).unwrap();
    fs.mknod(&r, d, b"w", libc::S_IFREG | 0o644, 0).unwrap();
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let r = Ctx::root();
        let tmp = format!("tmp{t}");
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            match n % 4 {
                0 => {
                    // rename over b, possibly from the other dir
                    let pd = if t == 0 { d } else { d2 };
                    let _ = fs.mknod(&r, pd, tmp.as_bytes(), libc::S_IFREG | 0o644, 0);
                    fails.errno(
                        "rename tmp over b",
                        fs.rename(&r, pd, tmp.as_bytes(), d, b"b", 0),
                    );
                }
                1 => fails.errno(
                    "exchange b<->c (both always exist)",
                    fs.rename(&r, d, b"b", d2, b"c", RENAME_EXCHANGE),
                ),
                2 => {
                    // w: file -> whiteout -> file
                    let _ = fs.mknod(&r, d, tmp.as_bytes(), libc::S_IFREG | 0o644, 0);
                    fails.errno(
                        "rename tmp over w",
                        fs.rename(&r, d, tmp.as_bytes(), d, b"w", 0),
                    );
                    let wt = format!("wt{t}");
                    match fs.rename(&r, d, b"w", d, wt.as_bytes(), RENAME_WHITEOUT) {
                        Ok(()) => {
                            let _ = fs.unlink(&r, d, wt.as_bytes());
                        }
                        Err(e) => fails.add("rename w whiteout", format!("{e:?}")),
                    }
                }
                _ => fails.errno(
                    "exchange c<->b",
                    fs.rename(&r, d2, b"c", d, b"b", RENAME_EXCHANGE),
                ),
            }
        }
    });
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let k = kctx();
        let r = Ctx::root();
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            match n % 8 {
                0 => match fs.mknod(&r, d, b"b", libc::S_IFREG | 0o644, 0) {
                    Err(Errno::EEXIST) => {}
                    x => fails.add("mknod b not EEXIST", format!("{x:?}")),
                },
                1 => match fs.mkdir(&r, d2, b"c", 0o755) {
                    Err(Errno::EEXIST) => {}
                    x => fails.add("mkdir c not EEXIST", format!("{x:?}")),
                },
                2 => match fs.rename(&r, d, b"b", d, b"w", RENAME_NOREPLACE) {
                    Err(Errno::EEXIST) => {}
                    x => fails.add("rename NOREPLACE b->w not EEXIST", format!("{x:?}")),
                },
                3 => match fs.create(&r, d, b"w", 0o644, libc::O_RDWR | libc::O_EXCL) {
                    Err(Errno::EEXIST) => {}
                    x => fails.add("create excl w not EEXIST", format!("{x:?}")),
                },
                4 => match fs.lookup(&k, d, b"w") {
                    Ok(a) => fs.forget(a.ino, 1),
                    Err(e) => fails.add("lookup w", format!("{e:?}")),
                },
                5 => match fs.lookup(&k, d2, b"c") {
                    Ok(a) => fs.forget(a.ino, 1),
                    Err(e) => fails.add("lookup c", format!("{e:?}")),
                },
                6 => match fs.symlink(&r, d, b"b", b"zz") {
                    Err(Errno::EEXIST) => {}
                    x => fails.add("symlink b not EEXIST", format!("{x:?}")),
                },
                _ => {
                    for (dir, nm) in [(d, &b"b"[..]), (d2, b"c")] {
                        let fh = fs.opendir(&r, dir).unwrap();
                        let mut cnt = 0;
                        let _ = t;
                        let mut wc = 0;
                        fs.readdir(&r, fh, 0, false, |e, _| {
                            if e.name == nm {
                                cnt += 1
                            }
                            if e.name == b"w" {
                                wc += 1
                            }
                            true
                        })
                        .unwrap();
                        fs.releasedir(fh).unwrap();
                        if cnt != 1 {
                            fails.add(
                                "readdir count of always-present name",
                                format!("{:?} {cnt}", String::from_utf8_lossy(nm)),
                            );
                        }
                        if dir == d && wc != 1 {
                            fails.add("readdir count of w", format!("{wc}"));
                        }
                    }
                }
            }
        }
    });
    race.done("t9");
}

// T10: rmdir (and rename-over of an empty dir) racing every way of adding an entry
#[test]
fn t10_rmdir_vs_adders() {
    let fs = fsnew();
    let r = Ctx::root();
    let p = fs.mkdir(&r, fs.root(), b"p", 0o755).unwrap().ino;
    let src = fs.mkdir(&r, fs.root(), b"src", 0o755).unwrap().ino;
    let f0 = mkreg(&fs, src, b"f0", 0o644);
    fs.mkdir(&r, p, b"t", 0o755).unwrap();
    let mut race = Race::new(&fs);
    race.one(move |Racer { fs, stop, fails }| {
        let r = Ctx::root();
        let mut n = 0u64;
        let (mut ok, mut ne) = (0, 0);
        while !stop.load(Relaxed) {
            n += 1;
            let res = if n % 3 == 0 {
                fs.rmdir(&r, p, b"t")
            } else {
                let _ = fs.mkdir(&r, p, b"e", 0o755);
                let wo = if n % 3 == 2 { RENAME_WHITEOUT } else { 0 };
                let x = fs.rename(&r, p, b"e", p, b"t", wo);
                if wo != 0 && x.is_ok() {
                    fs.unlink(&r, p, b"e").unwrap();
                }
                x
            };
            match res {
                Ok(()) => ok += 1,
                Err(Errno::ENOTEMPTY) | Err(Errno::ENOENT) => ne += 1,
                Err(e) => fails.add("rmdir/rename-over t", format!("{e:?}")),
            }
            let _ = fs.mkdir(&r, p, b"t", 0o755);
        }
        println!("t10 removals ok {ok} refused {ne}");
    });
    race.spawn(0..2, move |t, Racer { fs, stop, fails }| {
        let k = kctx();
        let r = Ctx::root();
        let mut n = 0u64;
        let mut succ = [0u64; 7];
        while !stop.load(Relaxed) {
            n += 1;
            let Ok(ta) = fs.lookup(&k, p, b"t") else {
                continue;
            };
            let tino = ta.ino;
            let nm = format!("x{t}");
            let kind = (n % 7) as usize;
            let res: Result<()> = match kind {
                0 => fs
                    .mknod(&r, tino, nm.as_bytes(), libc::S_IFREG | 0o644, 0)
                    .map(drop),
                1 => fs.mkdir(&r, tino, nm.as_bytes(), 0o755).map(drop),
                2 => fs.symlink(&r, tino, nm.as_bytes(), b"q").map(drop),
                3 => fs.link(&r, f0, tino, nm.as_bytes()).map(drop),
                4 => {
                    let s = format!("m{t}");
                    let _ = fs.mknod(&r, src, s.as_bytes(), libc::S_IFREG | 0o644, 0);
                    fs.rename(&r, src, s.as_bytes(), tino, nm.as_bytes(), 0)
                }
                5 => fs
                    .create(&r, tino, nm.as_bytes(), 0o644, libc::O_RDWR | libc::O_EXCL)
                    .map(|(_, fh)| fs.release(fh).unwrap()),
                _ => {
                    let s = format!("sd{t}");
                    let _ = fs.mkdir(&r, src, s.as_bytes(), 0o755);
                    fs.rename(&r, src, s.as_bytes(), tino, nm.as_bytes(), 0)
                }
            };
            match res {
                Ok(()) => {
                    succ[kind] += 1;
                    let a = fs.getattr(tino).unwrap();
                    if a.nlink == 0 {
                        fails.add("entry added to a removed dir", format!("kind {kind}"));
                    }
                    let rm = if kind == 1 || kind == 6 {
                        fs.rmdir(&r, tino, nm.as_bytes())
                    } else {
                        fs.unlink(&r, tino, nm.as_bytes())
                    };
                    if let Err(e) = rm {
                        fails.add("remove own entry", format!("kind {kind} {e:?}"));
                    }
                }
                Err(Errno::ENOENT) => {}
                Err(e) => fails.add("adder", format!("kind {kind} {e:?}")),
            }
            fs.forget(tino, 1);
        }
        println!("t10 adder successes {succ:?}");
    });
    let fails = race.finish();
    let fa = fs.getattr(f0).unwrap();
    if fa.nlink != 1 {
        fails.add("f0 nlink", format!("{}", fa.nlink));
    }
    let pa = fs.getattr(p).unwrap();
    let subs = [&b"t"[..], b"e"]
        .iter()
        .filter(|n| fs.lookup(&r, p, n).is_ok())
        .count() as u32;
    if pa.nlink != 2 + subs {
        fails.add("p nlink", format!("{} vs {}", pa.nlink, 2 + subs));
    }
    let sa = fs.getattr(src).unwrap();
    let mut sd = 0;
    let fh = fs.opendir(&r, src).unwrap();
    fs.readdir(&r, fh, 0, false, |e, _| {
        if e.kind == FileType::Directory && e.name != b"." && e.name != b".." {
            sd += 1
        }
        true
    })
    .unwrap();
    fs.releasedir(fh).unwrap();
    if sa.nlink != 2 + sd {
        fails.add("src nlink", format!("{} vs {}", sa.nlink, 2 + sd));
    }
    done("t10", &fails);
}

// T11: cross-parent directory replace / exchange (dir<->file, dir<->dir), nlink and `..`
#[test]
fn t11_cross_parent_replace_exchange() {
    let fs = fsnew();
    let c = Client::root(fs.clone());
    for i in 0..2 {
        c.create_dir(format!("/p{i}")).unwrap();
    }
    for j in 0..6 {
        if j % 2 == 0 {
            c.create_dir(format!("/p{}/n{j}", j % 2)).unwrap()
        } else {
            c.write(format!("/p0/n{j}"), b"f").unwrap()
        }
    }
    let mut race = Race::new(&fs);
    race.spawn(0..2u64, move |t, Racer { fs, stop, .. }| {
        let c = Client::root(fs.clone());
        let mut n = t + 7;
        while !stop.load(Relaxed) {
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let a = format!("/p{}/n{}", (n >> 30) % 2, (n >> 33) % 6);
            let b = format!("/p{}/n{}", (n >> 40) % 2, (n >> 43) % 6);
            let _ = match (n >> 50) % 5 {
                0 => c.rename(&a, &b),
                1 | 2 => c.rename_with_flags(&a, &b, RENAME_EXCHANGE),
                3 => c.create_dir(&a),
                _ => c.remove_dir(&a).or_else(|_| c.write(&a, b"f")),
            };
        }
    });
    race.one(move |Racer { fs, stop, fails }| {
        let c = Client::root(fs.clone());
        let p: Vec<Ino> = (0..2)
            .map(|i| c.metadata(format!("/p{i}")).unwrap().ino())
            .collect();
        let k = kctx();
        let mut n = 0usize;
        while !stop.load(Relaxed) {
            n += 1;
            let pi = p[n % 2];
            if let Ok(a) = fs.lookup(&k, pi, format!("n{}", n % 6).as_bytes()) {
                if a.kind() == FileType::Directory {
                    match fs.lookup(&k, a.ino, b"..") {
                        Ok(pa) => {
                            if !p.contains(&pa.ino) {
                                fails.add("'..' not a p", String::new())
                            }
                            fs.forget(pa.ino, 1)
                        }
                        Err(e) => fails.add("lookup ..", format!("{e:?}")),
                    }
                }
                fs.forget(a.ino, 1);
            }
            if c.metadata(format!("/p{}", n % 2)).is_err() {
                fails.add("stat parent", String::new());
            }
        }
    });
    let fails = race.finish();
    for i in 0..2 {
        let pp = format!("/p{i}");
        let pino = c.metadata(&pp).unwrap().ino();
        let ents = c.read_dir(&pp).unwrap();
        let subs = ents
            .iter()
            .filter(|e| e.kind == FileType::Directory)
            .count() as u32;
        let m = c.metadata(&pp).unwrap();
        if m.attr.nlink != 2 + subs {
            fails.add(
                "parent nlink",
                format!("{pp} {} vs {}", m.attr.nlink, 2 + subs),
            );
        }
        for e in ents.iter().filter(|e| e.kind == FileType::Directory) {
            let path = format!("{pp}/{}/..", String::from_utf8_lossy(&e.name));
            if c.metadata(&path).unwrap().ino() != pino {
                fails.add("'..' wrong", path);
            }
            let dm = c
                .metadata(format!("{pp}/{}", String::from_utf8_lossy(&e.name)))
                .unwrap();
            if dm.attr.nlink != 2 {
                fails.add("leaf dir nlink", format!("{}", dm.attr.nlink));
            }
        }
        for e in ents.iter().filter(|e| e.kind == FileType::RegularFile) {
            let fm = c
                .metadata(format!("{pp}/{}", String::from_utf8_lossy(&e.name)))
                .unwrap();
            if fm.attr.nlink != 1 {
                fails.add("file nlink", format!("{}", fm.attr.nlink));
            }
        }
    }
    done("t11", &fails);
}

// T12: torn attributes; XATTR_CREATE exclusivity
#[test]
fn t12_attr_atomicity() {
    let fs = fsnew();
    let f = mkreg(&fs, fs.root(), b"f", 0o600);
    let mut race = Race::new(&fs);
    race.spawn(0..2u32, move |t, Racer { fs, stop, .. }| {
        let r = Ctx::root();
        let mut n = 0u32;
        while !stop.load(Relaxed) {
            n += 1;
            let v = 1000 + t * 100 + n % 50;
            let ts = Timespec {
                sec: v as i64,
                nsec: v,
            };
            let _ = fs.setattr(
                &r,
                f,
                &SetAttr {
                    mode: Some(0o600 | (v & 0o77)),
                    uid: Some(v),
                    gid: Some(v),
                    atime: Some(TimeSet::At(ts)),
                    mtime: Some(TimeSet::At(ts)),
                    size: Some(v as u64),
                    ..Default::default()
                },
                None,
            );
        }
    });
    race.spawn(0..2u32, move |t, Racer { fs, stop, fails }| {
        let r = Ctx::root();
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            let a = fs.getattr(f).unwrap();
            if a.uid >= 1000
                && !(a.gid == a.uid
                    && a.size == a.uid as u64
                    && a.mode & 0o77 == a.uid & 0o77
                    && a.mtime.sec == a.uid as i64
                    && a.atime.sec == a.uid as i64)
            {
                fails.add(
                    "torn attr",
                    format!(
                        "uid {} gid {} size {} mode {:o} mtime {} atime {}",
                        a.uid, a.gid, a.size, a.mode, a.mtime.sec, a.atime.sec
                    ),
                );
            }
            let nm = format!("user.x{}", n % 64);
            let won = [0, 1].map(|_| {
                fs.setxattr(&r, f, nm.as_bytes(), b"1", XATTR_CREATE)
                    .is_ok()
            });
            let _ = (won, t);
            if n % 2 == 0 {
                let _ = fs.removexattr(&r, f, nm.as_bytes());
            }
        }
    });
    race.done("t12");
}

// T13: XATTR_CREATE exclusivity across threads, XATTR_REPLACE vs remove
#[test]
fn t13_xattr_create_excl() {
    let fs = fsnew();
    let r = Ctx::root();
    let f = mkreg(&fs, fs.root(), b"f", 0o600);
    let wins = Arc::new(AtomicU64::new(0));
    let fails = Fails::new();
    for round in 0..2000 {
        let nm = format!("user.r{round}");
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (fs, wins, nm) = (fs.clone(), wins.clone(), nm.clone());
                std::thread::spawn(move || {
                    if fs
                        .setxattr(&Ctx::root(), f, nm.as_bytes(), b"v", XATTR_CREATE)
                        .is_ok()
                    {
                        wins.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        fs.removexattr(&r, f, nm.as_bytes()).unwrap();
    }
    if wins.load(Relaxed) != 2000 {
        fails.add("XATTR_CREATE winners", format!("{}", wins.load(Relaxed)));
    }
    check(&fs, &fails);
    done("t13", &fails);
}

// T14: concurrent cross moves that together would make a cycle
#[test]
fn t14_rename_cycles() {
    let fs = fsnew();
    let c = Client::root(fs.clone());
    let names = ["a", "b", "c", "d"];
    for n in names {
        c.create_dir(format!("/{n}")).unwrap();
    }
    let mut race = Race::new(&fs);
    race.spawn(0..3u64, move |t, Racer { fs, stop, .. }| {
        let r = Ctx::root();
        let mut n = t + 3;
        let mut ok = 0;
        while !stop.load(Relaxed) {
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // find two dirs anywhere via kernel-less lookups from a random known dir ino set
            let all: Vec<(Ino, Ino, &str)> = {
                // BFS from root collecting (parent, ino, name)
                let mut v = Vec::new();
                let mut st = vec![fs.root()];
                while let Some(d) = st.pop() {
                    for nm in names {
                        if let Ok(a) = fs.lookup(&r, d, nm.as_bytes()) {
                            v.push((d, a.ino, nm));
                            st.push(a.ino);
                        }
                    }
                }
                v
            };
            if all.is_empty() {
                continue;
            }
            let (sp, _, sn) = all[(n >> 33) as usize % all.len()];
            let dst = if (n >> 50) % 4 == 0 {
                fs.root()
            } else {
                all[(n >> 40) as usize % all.len()].1
            };
            if fs
                .rename(&r, sp, sn.as_bytes(), dst, sn.as_bytes(), 0)
                .is_ok()
            {
                ok += 1;
            }
        }
        println!("t14 moves ok {ok}");
    });
    race.done("t14");
}

#[test]
fn t15_deterministic_removed_stats() {
    let fs = fsnew();
    let r = Ctx::root();
    let k = kctx();
    let p = fs.mkdir(&r, fs.root(), b"p", 0o755).unwrap().ino;
    let t = fs.mkdir(&k, p, b"t", 0o755).unwrap().ino; // kernel ref held
    fs.mkdir(&r, p, b"e", 0o755).unwrap();
    let fh = fs.opendir(&r, t).unwrap();
    fs.rename(&r, p, b"e", p, b"t", 0).unwrap();
    let ta = fs.getattr(t).unwrap();
    println!(
        "old t after rename-over: nlink {} size {}",
        ta.nlink, ta.size
    );
    println!("parent nlink {}", fs.getattr(p).unwrap().nlink);
    println!(
        "readdir old t: {:?}",
        fs.readdir(&r, fh, 0, false, |_, _| true)
    );
    println!(
        "lookup .. in old t: {:?}",
        fs.lookup(&r, t, b"..").map(|a| a.ino)
    );
    println!(
        "lookup . in old t: {:?}",
        fs.lookup(&r, t, b".").map(|a| a.ino)
    );
    println!(
        "mknod in old t: {:?}",
        fs.mknod(&r, t, b"z", libc::S_IFREG | 0o644, 0)
            .map(|a| a.ino)
    );
    println!(
        "setxattr old t: {:?}",
        fs.setxattr(&k, t, b"user.a", b"1", 0)
    );
    fs.releasedir(fh).unwrap();
    fs.forget(t, 1);
    let (a, fh) = fs.create(&r, p, b"f", 0o644, libc::O_RDWR).unwrap();
    fs.write(&r, fh, 0, b"hello").unwrap();
    fs.mknod(&r, p, b"g", libc::S_IFREG | 0o644, 0).unwrap();
    fs.rename(&r, p, b"g", p, b"f", 0).unwrap();
    let fa = fs.getattr(a.ino).unwrap();
    println!(
        "old f after rename-over: nlink {} size {}",
        fa.nlink, fa.size
    );
    let mut b = [0u8; 5];
    println!("read old f: {:?} {:?}", fs.read(fh, 0, &mut b), b);
    println!("write old f: {:?}", fs.write(&r, fh, 5, b"!"));
    println!(
        "setattr old f: {:?}",
        fs.setattr(
            &r,
            a.ino,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
            None
        )
        .map(|a| a.mode)
    );
    println!(
        "link old f: {:?}",
        fs.link(&r, a.ino, p, b"back").map(|a| a.nlink)
    );
    fs.release(fh).unwrap();
    println!("check {:?}", fs.check_invariants().map(|r| r.inodes));
}

// T16: O_APPEND writes never overlap; path API append too
#[test]
fn t16_append_atomic() {
    let fs = fsnew();
    let r = Ctx::root();
    let (a, fh0) = fs
        .create(&r, fs.root(), b"log", 0o644, libc::O_RDWR)
        .unwrap();
    fs.release(fh0).unwrap();
    let fails = Fails::new();
    let per = 20000usize;
    let hs: Vec<_> = (0..3u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let r = Ctx::root();
                if t == 2 {
                    let c = Client::root(fs.clone());
                    let mut f = c.open("/log", OpenOptions::new().append(true)).unwrap();
                    use std::io::Write;
                    for _ in 0..per {
                        f.write_all(&[b'a' + t; 7]).unwrap();
                    }
                } else {
                    let fh = fs.open(&r, a.ino, libc::O_WRONLY | libc::O_APPEND).unwrap();
                    for _ in 0..per {
                        assert_eq!(fs.write(&r, fh, 0, &[b'a' + t; 7]).unwrap(), 7);
                    }
                    fs.release(fh).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let sz = fs.getattr(a.ino).unwrap().size;
    if sz != (3 * per * 7) as u64 {
        fails.add("append size", format!("{sz} vs {}", 3 * per * 7));
    }
    let mut buf = vec![0u8; sz as usize];
    fs.read_inode(a.ino, 0, &mut buf).unwrap();
    let mut bad = 0;
    for ch in buf.chunks(7) {
        if !ch.iter().all(|&x| x == ch[0]) {
            bad += 1;
        }
    }
    if bad > 0 {
        fails.add("interleaved records", format!("{bad}"));
    }
    done("t16", &fails);
}

/// The renamer of T17 and T18: for each `i` in `0..n`, publishes `i` in `cur` for the
/// readers, then does rename `i` (which must succeed) between two waits of `spins` spins.
fn rename_each(n: usize, cur: &AtomicU64, spins: usize, rename: impl Fn(usize) -> Result<()>) {
    for i in 0..n {
        cur.store(i as u64, Release);
        for _ in 0..spins {
            std::hint::spin_loop();
        }
        rename(i).unwrap();
        for _ in 0..spins {
            std::hint::spin_loop();
        }
    }
}

// T17: linearizability of one-way renames: once the new name is seen, the old one is gone;
// once the old one is seen gone, the new one is there.
#[test]
fn t17_rename_linearizable() {
    for cross in [false, true] {
        for mode in 0..3 {
            let fs = fsnew();
            let r = Ctx::root();
            let d1 = fs.mkdir(&r, fs.root(), b"d1", 0o755).unwrap().ino;
            let d2 = if cross {
                fs.mkdir(&r, fs.root(), b"d2", 0o755).unwrap().ino
            } else {
                d1
            };
            let n = 20000usize;
            for i in 0..n {
                let nm = format!("n{i}");
                if mode == 1 {
                    fs.mkdir(&r, d1, nm.as_bytes(), 0o755).unwrap();
                } else {
                    fs.mknod(&r, d1, nm.as_bytes(), libc::S_IFREG | 0o644, 0)
                        .unwrap();
                }
                if mode == 2 {
                    fs.mknod(&r, d2, format!("m{i}").as_bytes(), libc::S_IFREG | 0o644, 0)
                        .unwrap();
                }
            }
            let cur = Arc::new(AtomicU64::new(0));
            let fails = Fails::new();
            let stop = Arc::new(AtomicBool::new(false));
            let readers: Vec<_> = (0..1)
                .map(|_| {
                    let (fs, cur, fails, stop) =
                        (fs.clone(), cur.clone(), fails.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let r = Ctx::root();
                        while !stop.load(Relaxed) {
                            let i = cur.load(Acquire) as usize;
                            let (o, m) = (format!("n{i}"), format!("m{i}"));
                            if mode == 2 {
                                // rename over an existing m: m must always exist; after new m seen (ino of old n), n must be gone
                                let a_m = fs.lookup(&r, d2, m.as_bytes());
                                let a_n = fs.lookup(&r, d1, o.as_bytes());
                                if a_m.is_err() {
                                    fails.add("m missing (rename over)", format!("{i}"));
                                }
                                if let (Ok(am), Ok(an)) = (&a_m, &a_n) {
                                    if am.ino == an.ino {
                                        fails.add(
                                            "both names visible after rename-over",
                                            format!("{i}"),
                                        );
                                    }
                                }
                                continue;
                            }
                            if fs.lookup(&r, d2, m.as_bytes()).is_ok()
                                && fs.lookup(&r, d1, o.as_bytes()).is_ok()
                            {
                                fails.add("new then old visible", format!("{i}"));
                            }
                            if fs.lookup(&r, d1, o.as_bytes()).is_err()
                                && fs.lookup(&r, d2, m.as_bytes()).is_err()
                            {
                                fails.add("old gone then new missing", format!("{i}"));
                            }
                        }
                    })
                })
                .collect();
            rename_each(n, &cur, 20, |i| {
                fs.rename(
                    &r,
                    d1,
                    format!("n{i}").as_bytes(),
                    d2,
                    format!("m{i}").as_bytes(),
                    0,
                )
            });
            stop.store(true, Relaxed);
            for h in readers {
                h.join().unwrap();
            }
            check(&fs, &fails);
            done(&format!("t17 cross={cross} mode={mode}"), &fails);
        }
    }
}

// T18: `..` linearizable with the entry move
#[test]
fn t18_dotdot_linearizable() {
    for exch in [false, true] {
        let fs = fsnew();
        let r = Ctx::root();
        let p1 = fs.mkdir(&r, fs.root(), b"p1", 0o755).unwrap().ino;
        let p2 = fs.mkdir(&r, fs.root(), b"p2", 0o755).unwrap().ino;
        let n = 20000usize;
        let mut inos = Vec::new();
        for i in 0..n {
            inos.push(
                fs.mkdir(&r, p1, format!("c{i}").as_bytes(), 0o755)
                    .unwrap()
                    .ino,
            );
            if exch {
                fs.mknod(&r, p2, format!("c{i}").as_bytes(), libc::S_IFREG | 0o644, 0)
                    .unwrap();
            }
        }
        let inos = Arc::new(inos);
        let cur = Arc::new(AtomicU64::new(0));
        let fails = Fails::new();
        let stop = Arc::new(AtomicBool::new(false));
        let rd = {
            let (fs, cur, fails, stop, inos) = (
                fs.clone(),
                cur.clone(),
                fails.clone(),
                stop.clone(),
                inos.clone(),
            );
            std::thread::spawn(move || {
                let r = Ctx::root();
                let mut hits = 0u64;
                while !stop.load(Relaxed) {
                    let i = cur.load(Acquire) as usize;
                    let nm = format!("c{i}");
                    let c = inos[i];
                    let in2 = fs
                        .lookup(&r, p2, nm.as_bytes())
                        .map(|a| a.ino == c)
                        .unwrap_or(false);
                    let dd = fs.lookup(&r, c, b"..").map(|a| a.ino);
                    if in2 {
                        hits += 1;
                        if dd != Ok(p2) {
                            fails.add("seen in p2, '..' then not p2", format!("{i} {dd:?}"));
                        }
                    }
                    let dd = fs.lookup(&r, c, b"..").map(|a| a.ino);
                    let in1 = fs
                        .lookup(&r, p1, nm.as_bytes())
                        .map(|a| a.ino == c)
                        .unwrap_or(false);
                    if dd == Ok(p2) && in1 {
                        fails.add("'..' is p2, then still in p1", format!("{i}"));
                    }
                }
                println!("t18 hits {hits}");
            })
        };
        rename_each(n, &cur, 30, |i| {
            fs.rename(
                &r,
                p1,
                format!("c{i}").as_bytes(),
                p2,
                format!("c{i}").as_bytes(),
                if exch { RENAME_EXCHANGE } else { 0 },
            )
        });
        stop.store(true, Relaxed);
        rd.join().unwrap();
        check(&fs, &fails);
        let a1 = fs.getattr(p1).unwrap();
        let a2 = fs.getattr(p2).unwrap();
        if a1.nlink != 2 || a2.nlink != 2 + n as u32 {
            fails.add("nlinks", format!("{} {}", a1.nlink, a2.nlink));
        }
        done(&format!("t18 exch={exch}"), &fails);
    }
}

// T19: kernel create (no O_EXCL) / open by lookup on a name renamed over; attr matches handle; refs balanced
#[test]
fn t19_kernel_create_open() {
    let fs = fsnew();
    let r = Ctx::root();
    let d = fs.mkdir(&r, fs.root(), b"d", 0o755).unwrap().ino;
    fs.mknod(&r, d, b"b", libc::S_IFREG | 0o644, 0).unwrap();
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, .. }| {
        let r = Ctx::root();
        let tmp = format!("tmp{t}");
        let mut n = 0;
        while !stop.load(Relaxed) {
            n += 1;
            let _ = fs.mknod(&r, d, tmp.as_bytes(), libc::S_IFREG | 0o644, 0);
            if n % 5 == 0 {
                let _ = fs.unlink(&r, d, b"b");
            } else {
                let _ = fs.rename(&r, d, tmp.as_bytes(), d, b"b", 0);
            }
        }
    });
    race.spawn(0..2, move |_, Racer { fs, stop, fails }| {
        let k = kctx();
        while !stop.load(Relaxed) {
            match fs.create(&k, d, b"b", 0o644, libc::O_RDWR) {
                Ok((a, fh)) => {
                    // attr must be the handle's inode: write via fh, getattr(a.ino) sees size
                    fs.write(&k, fh, 0, b"xyz").unwrap();
                    match fs.getattr(a.ino) {
                        Ok(g) if g.size >= 3 && g.generation == a.generation => {}
                        x => fails.add("create attr != handle inode", format!("{x:?}")),
                    }
                    fs.release(fh).unwrap();
                    fs.forget(a.ino, 1);
                }
                Err(e) => fails.add("kernel create non-excl", format!("{e:?}")),
            }
        }
    });
    race.done("t19");
}

// T20: a stable xattr stays readable while others on the same inode come and go; names renamed over keep theirs
#[test]
fn t20_xattr_stable() {
    let fs = fsnew();
    let r = Ctx::root();
    let f = mkreg(&fs, fs.root(), b"f", 0o644);
    fs.setxattr(&r, f, b"user.s", b"S", 0).unwrap();
    let mut race = Race::new(&fs);
    race.spawn(0..2, move |t, Racer { fs, stop, .. }| {
        let r = Ctx::root();
        let mut n = 0;
        while !stop.load(Relaxed) {
            n += 1;
            let nm = format!("user.t{t}_{}", n % 4);
            let _ = fs.setxattr(&r, f, nm.as_bytes(), &vec![b'v'; n % 300], 0);
            let _ = fs.removexattr(&r, f, nm.as_bytes());
            if n % 7 == 0 {
                let _ = fs.setxattr(&r, f, b"user.s", b"S", XATTR_REPLACE);
            }
            if n % 11 == 0 {
                let _ = fs.setxattr(&r, f, b"system.posix_acl_access", &acl_bytes(), 0);
                let _ = fs.removexattr(&r, f, b"system.posix_acl_access");
            }
        }
    });
    race.spawn(0..2, move |_, Racer { fs, stop, fails }| {
        let u = Ctx::user(1000, 1000);
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            if n % 2 == 0 {
                match fs.getxattr(&u, f, b"user.s") {
                    Ok(v) if v == b"S" => {}
                    x => fails.add("getxattr stable", format!("{x:?}")),
                }
            } else {
                match fs.listxattr(&u, f) {
                    Ok(v) if v.split(|&b| b == 0).any(|x| x == b"user.s") => {}
                    x => fails.add("listxattr stable", format!("{x:?}")),
                }
            }
        }
    });
    race.done("t20");
}

fn acl_bytes() -> Vec<u8> {
    // version 2; USER_OBJ rw-, USER 1000 r--, GROUP_OBJ r--, MASK r--, OTHER r--
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend(tag.to_le_bytes());
        v.extend(perm.to_le_bytes());
        v.extend(id.to_le_bytes());
    }
    v
}

// T21: no stale data resurfaces after truncate / punch hole racing writes and reads
#[test]
fn t21_truncate_stale() {
    let fs = fsnew();
    let r = Ctx::root();
    let (a, fh) = fs.create(&r, fs.root(), b"f", 0o644, libc::O_RDWR).unwrap();
    let ino = a.ino;
    fs.write(&r, fh, 0, &vec![b'O'; 65536 + 100]).unwrap();
    fs.setattr(
        &r,
        ino,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let mut race = Race::new(&fs);
    race.one(move |Racer { fs, stop, .. }| {
        let r = Ctx::root();
        let mut n = 0u64;
        let fh = fs.open(&r, ino, libc::O_RDWR).unwrap();
        while !stop.load(Relaxed) {
            n += 1;
            match n % 3 {
                0 => {
                    let _ = fs.setattr(
                        &r,
                        ino,
                        &SetAttr {
                            size: Some((n * 977) % 70000),
                            ..Default::default()
                        },
                        None,
                    );
                }
                1 => {
                    let _ = fs.fallocate(
                        &r,
                        fh,
                        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        (n * 1231) % 60000,
                        5000,
                    );
                }
                _ => {
                    let _ = fs.fallocate(&r, fh, 0, (n * 733) % 60000, 3000);
                }
            }
        }
        fs.release(fh).unwrap();
    });
    race.one(move |Racer { fs, stop, .. }| {
        let r = Ctx::root();
        let fh = fs.open(&r, ino, libc::O_RDWR).unwrap();
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            let _ = fs.write(&r, fh, (n * 4099) % 66000, &[b'W'; 300]);
        }
        fs.release(fh).unwrap();
    });
    race.one(move |Racer { fs, stop, fails }| {
        let mut buf = vec![0u8; 80000];
        while !stop.load(Relaxed) {
            let n = fs.read_inode(ino, 0, &mut buf).unwrap();
            if let Some(p) = buf[..n].iter().position(|&b| b != 0 && b != b'W') {
                fails.add("stale/garbage byte", format!("at {p} = {}", buf[p]));
            }
        }
    });
    let fails = race.run();
    fs.release(fh).unwrap();
    check(&fs, &fails);
    done("t21", &fails);
}
