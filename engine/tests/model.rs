//! Model-based randomized test: long random sequences of namespace and data operations are
//! applied to lanefs and to a deliberately simple reference model (a tree of `BTreeMap`s),
//! and every result and errno is compared, under all three locking modes. The filesystem's
//! invariant checker runs every few hundred operations.
//!
//! Each run prints its seeds; `LANEFS_SEED=<n>` replays one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use lanefs::{Client, Config, Errno, Filesystem, Locking, OpenOptions};
use rand::Rng;

#[path = "common/seed.rs"]
mod seed;

type Ino = u64;

#[derive(Clone, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, Ino>),
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    nlink: u32,
}

/// The reference: inodes in a map, directories as ordered maps of names.
struct Model {
    nodes: HashMap<Ino, Node>,
    next: Ino,
}

const ROOT: Ino = 1;
type R<T> = Result<T, Errno>;

impl Model {
    fn new() -> Model {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                kind: Kind::Dir(BTreeMap::new()),
                nlink: 2,
            },
        );
        Model { nodes, next: 2 }
    }

    fn dir(&self, ino: Ino) -> Option<&BTreeMap<Vec<u8>, Ino>> {
        match &self.nodes[&ino].kind {
            Kind::Dir(d) => Some(d),
            _ => None,
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> &mut BTreeMap<Vec<u8>, Ino> {
        match &mut self.nodes.get_mut(&ino).unwrap().kind {
            Kind::Dir(d) => d,
            _ => panic!("not a dir"),
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        self.dir(ino).is_some()
    }

    /// Resolves all components but the last.
    fn parent(&self, path: &[&str]) -> R<(Ino, Vec<u8>)> {
        let mut cur = ROOT;
        let (last, init) = path.split_last().expect("non-empty");
        for c in init {
            let d = self.dir(cur).ok_or(Errno::ENOTDIR)?;
            cur = *d.get(c.as_bytes()).ok_or(Errno::ENOENT)?;
        }
        if !self.is_dir(cur) {
            return Err(Errno::ENOTDIR);
        }
        Ok((cur, last.as_bytes().to_vec()))
    }

    fn lookup(&self, path: &[&str]) -> R<Ino> {
        let (p, n) = self.parent(path)?;
        self.dir(p).unwrap().get(&n).copied().ok_or(Errno::ENOENT)
    }

    fn alloc(&mut self, kind: Kind) -> Ino {
        let ino = self.next;
        self.next += 1;
        let nlink = if matches!(kind, Kind::Dir(_)) { 2 } else { 1 };
        self.nodes.insert(ino, Node { kind, nlink });
        ino
    }

    fn drop_link(&mut self, ino: Ino) {
        let n = self.nodes.get_mut(&ino).unwrap();
        n.nlink -= 1;
        if n.nlink == 0 || matches!(n.kind, Kind::Dir(_)) && n.nlink == 1 {
            self.nodes.remove(&ino);
        }
    }

    fn create(&mut self, path: &[&str], dir: bool) -> R<()> {
        let (p, n) = self.parent(path)?;
        if self.dir(p).unwrap().contains_key(&n) {
            return Err(Errno::EEXIST);
        }
        let ino = self.alloc(if dir {
            Kind::Dir(BTreeMap::new())
        } else {
            Kind::File(Vec::new())
        });
        self.dir_mut(p).insert(n, ino);
        if dir {
            self.nodes.get_mut(&p).unwrap().nlink += 1;
        }
        Ok(())
    }

    fn unlink(&mut self, path: &[&str]) -> R<()> {
        let (p, n) = self.parent(path)?;
        let ino = *self.dir(p).unwrap().get(&n).ok_or(Errno::ENOENT)?;
        if self.is_dir(ino) {
            return Err(Errno::EISDIR);
        }
        self.dir_mut(p).remove(&n);
        self.drop_link(ino);
        Ok(())
    }

    fn rmdir(&mut self, path: &[&str]) -> R<()> {
        let (p, n) = self.parent(path)?;
        let ino = *self.dir(p).unwrap().get(&n).ok_or(Errno::ENOENT)?;
        let d = self.dir(ino).ok_or(Errno::ENOTDIR)?;
        if !d.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        self.dir_mut(p).remove(&n);
        self.nodes.remove(&ino);
        self.nodes.get_mut(&p).unwrap().nlink -= 1;
        Ok(())
    }

    fn link(&mut self, from: &[&str], to: &[&str]) -> R<()> {
        let src = self.lookup(from)?;
        let (p, n) = self.parent(to)?;
        if self.dir(p).unwrap().contains_key(&n) {
            return Err(Errno::EEXIST);
        }
        if self.is_dir(src) {
            return Err(Errno::EPERM);
        }
        self.dir_mut(p).insert(n, src);
        self.nodes.get_mut(&src).unwrap().nlink += 1;
        Ok(())
    }

    /// Whether `a` is `d` or an ancestor of `d` (by searching downwards from `a`).
    fn contains(&self, a: Ino, d: Ino) -> bool {
        if a == d {
            return true;
        }
        self.dir(a)
            .is_some_and(|m| m.values().any(|&c| self.is_dir(c) && self.contains(c, d)))
    }

    fn rename(&mut self, from: &[&str], to: &[&str], flags: u32) -> R<()> {
        let (p1, n1) = self.parent(from)?;
        let (p2, n2) = self.parent(to)?;
        let src = *self.dir(p1).unwrap().get(&n1).ok_or(Errno::ENOENT)?;
        let dst = self.dir(p2).unwrap().get(&n2).copied();
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & libc::RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        let (sdir, ddir) = (self.is_dir(src), dst.is_some_and(|d| self.is_dir(d)));
        if p1 != p2 && sdir && self.contains(src, p2) {
            return Err(Errno::EINVAL);
        }
        if let Some(t) = dst {
            if p1 != p2 && ddir && self.contains(t, p1) {
                return Err(if exchange {
                    Errno::EINVAL
                } else {
                    Errno::ENOTEMPTY
                });
            }
            if t == src {
                return Ok(());
            }
        }
        if exchange {
            let t = dst.unwrap();
            self.dir_mut(p1).insert(n1, t);
            self.dir_mut(p2).insert(n2, src);
            if p1 != p2 && sdir != ddir {
                let (gain, lose) = if sdir { (p2, p1) } else { (p1, p2) };
                self.nodes.get_mut(&gain).unwrap().nlink += 1;
                self.nodes.get_mut(&lose).unwrap().nlink -= 1;
            }
            return Ok(());
        }
        if let Some(t) = dst {
            if sdir && !ddir {
                return Err(Errno::ENOTDIR);
            }
            if !sdir && ddir {
                return Err(Errno::EISDIR);
            }
            if ddir && !self.dir(t).unwrap().is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
        }
        self.dir_mut(p1).remove(&n1);
        self.dir_mut(p2).insert(n2, src);
        if sdir && p1 != p2 {
            self.nodes.get_mut(&p1).unwrap().nlink -= 1;
            self.nodes.get_mut(&p2).unwrap().nlink += 1;
        }
        if let Some(t) = dst {
            if ddir {
                self.nodes.remove(&t);
                self.nodes.get_mut(&p2).unwrap().nlink -= 1;
            } else {
                self.drop_link(t);
            }
        }
        Ok(())
    }

    fn write(&mut self, path: &[&str], off: usize, data: &[u8]) -> R<usize> {
        let ino = self.lookup(path)?;
        match &mut self.nodes.get_mut(&ino).unwrap().kind {
            Kind::File(v) => {
                if v.len() < off + data.len() {
                    v.resize(off + data.len(), 0);
                }
                v[off..off + data.len()].copy_from_slice(data);
                Ok(data.len())
            }
            Kind::Dir(_) => Err(Errno::EISDIR),
        }
    }

    fn truncate(&mut self, path: &[&str], n: usize) -> R<()> {
        let ino = self.lookup(path)?;
        match &mut self.nodes.get_mut(&ino).unwrap().kind {
            Kind::File(v) => {
                v.resize(n, 0);
                Ok(())
            }
            Kind::Dir(_) => Err(Errno::EISDIR),
        }
    }

    fn read(&self, path: &[&str]) -> R<Vec<u8>> {
        match &self.nodes[&self.lookup(path)?].kind {
            Kind::File(v) => Ok(v.clone()),
            Kind::Dir(_) => Err(Errno::EISDIR),
        }
    }

    /// (is_dir, nlink, size) with tmpfs directory sizes.
    fn stat(&self, path: &[&str]) -> R<(bool, u32, u64)> {
        let n = &self.nodes[&self.lookup(path)?];
        Ok(match &n.kind {
            Kind::File(v) => (false, n.nlink, v.len() as u64),
            Kind::Dir(d) => (true, n.nlink, 40 + 20 * d.len() as u64),
        })
    }

    fn readdir(&self, path: &[&str]) -> R<Vec<Vec<u8>>> {
        let d = self.dir(self.lookup(path)?).ok_or(Errno::ENOTDIR)?;
        Ok(d.keys().cloned().collect())
    }
}

fn e(r: std::io::Result<impl Sized>) -> R<()> {
    r.map(|_| ()).map_err(|e| Errno(e.raw_os_error().unwrap()))
}

fn join(p: &[&str]) -> String {
    format!("/{}", p.join("/"))
}

fn run(seed: u64, locking: Locking, steps: usize) {
    let mut rng = seed::rng(seed);
    let fs = Arc::new(Filesystem::new(Config {
        locking,
        ..Config::default()
    }));
    let c = Client::root(fs.clone());
    let mut m = Model::new();
    let parts = ["a", "b", "c", "d"];
    let mut ok = 0usize;
    for i in 0..steps {
        let depth = rng.random_range(1..=3);
        let p: Vec<&str> = (0..depth).map(|_| parts[rng.random_range(0..4)]).collect();
        let depth = rng.random_range(1..=3);
        let q: Vec<&str> = (0..depth).map(|_| parts[rng.random_range(0..4)]).collect();
        let what = rng.random_range(0..13);
        let ctx = format!(
            "seed {seed} [{}] step {i}: op {what} {p:?} {q:?}",
            locking.name()
        );
        let nodes_before = (m.nodes.len(), m.next);
        match what {
            0 | 1 => assert_eq!(
                e(c.open(join(&p), OpenOptions::new().write(true).create_new(true))),
                m.create(&p, false),
                "{ctx}"
            ),
            2 | 3 => assert_eq!(e(c.create_dir(join(&p))), m.create(&p, true), "{ctx}"),
            4 => assert_eq!(e(c.remove_file(join(&p))), m.unlink(&p), "{ctx}"),
            5 => assert_eq!(e(c.remove_dir(join(&p))), m.rmdir(&p), "{ctx}"),
            6 | 7 => {
                let flags =
                    [0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE][rng.random_range(0..4)];
                assert_eq!(
                    e(c.rename_with_flags(join(&p), join(&q), flags)),
                    m.rename(&p, &q, flags),
                    "{ctx} flags {flags}"
                );
            }
            8 => assert_eq!(e(c.hard_link(join(&p), join(&q))), m.link(&p, &q), "{ctx}"),
            9 => {
                let off = rng.random_range(0..10_000);
                let data = vec![rng.random::<u8>(); rng.random_range(1..5000)];
                let got = c
                    .open(join(&p), OpenOptions::new().write(true))
                    .and_then(|f| f.write_at(&data, off as u64));
                assert_eq!(
                    got.map_err(|e| Errno(e.raw_os_error().unwrap())),
                    m.write(&p, off, &data),
                    "{ctx}"
                );
            }
            10 => {
                let n = rng.random_range(0..12_000);
                assert_eq!(
                    e(c.truncate(join(&p), n as u64)),
                    m.truncate(&p, n),
                    "{ctx}"
                );
            }
            11 => {
                let got = c
                    .read(join(&p))
                    .map_err(|e| Errno(e.raw_os_error().unwrap()));
                assert_eq!(got, m.read(&p), "{ctx}");
                let st = c
                    .metadata(join(&p))
                    .map(|md| (md.is_dir(), md.attr.nlink, md.len()));
                assert_eq!(
                    st.map_err(|e| Errno(e.raw_os_error().unwrap())),
                    m.stat(&p),
                    "{ctx}"
                );
            }
            _ => {
                let got = c.read_dir(join(&p)).map(|v| {
                    let mut n: Vec<Vec<u8>> = v.into_iter().map(|e| e.name).collect();
                    n.sort();
                    n
                });
                assert_eq!(
                    got.map_err(|e| Errno(e.raw_os_error().unwrap())),
                    m.readdir(&p),
                    "{ctx}"
                );
            }
        }
        // A step "did something" if the model changed or a read-only step succeeded.
        if (m.nodes.len(), m.next) != nodes_before || (what >= 9 && m.stat(&p).is_ok()) {
            ok += 1;
        }
        if i % 500 == 499 {
            fs.check_invariants()
                .unwrap_or_else(|err| panic!("{ctx}: invariants:\n{err}"));
            let live = fs.check_invariants().unwrap().inodes;
            assert_eq!(live, m.nodes.len() as u64, "{ctx}: inode count");
        }
    }
    assert_eq!(fs.open_handles(), 0, "seed {seed}: handles leaked");
    eprintln!(
        "  [{}] {ok} of {steps} steps took effect, {} inodes at the end",
        locking.name(),
        m.nodes.len()
    );
    // About a fifth take effect (1175 to 1400 of 6000 over hundreds of seeds; 1175 failed
    // a bound of a fifth once): a tenth says the steps are not mostly refused.
    assert!(
        ok * 10 > steps,
        "seed {seed}: only {ok} of {steps} steps took effect"
    );
}

#[test]
fn random_operations_match_the_model_in_every_locking_mode() {
    let seeds = seed::seeds("model test", seed::fresh(3));
    for seed in seeds {
        eprintln!("model test: seed {seed} (LANEFS_SEED={seed} replays it alone)");
        for locking in Locking::ALL {
            run(seed, locking, 6000);
        }
    }
}
