//! The candidate stores behind one small trait: apply a batch in one write transaction and
//! commit it durably; point reads and prefix scans from a fresh read snapshot each.

use std::path::Path;
use std::time::{Duration, Instant};

/// Which table: metadata (inode, entry, xattr, superblock keys, tag byte first) or file data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Meta,
    Data,
}

pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
}

impl Op {
    /// Logical bytes: key and value of a put, key of a delete.
    pub fn logical_len(&self) -> u64 {
        match self {
            Op::Put(k, v) => (k.len() + v.len()) as u64,
            Op::Del(k) => k.len() as u64,
        }
    }
}

#[derive(Default, Clone, Copy)]
pub struct Timing {
    /// Begin of the write transaction to a durable commit.
    pub total: Duration,
    /// The commit call alone (writes not yet made, fsync).
    pub commit: Duration,
}

pub trait Store: Send + Sync {
    /// One write transaction with every op, then a durable commit. `before_commit` runs just
    /// before the commit call (the crash test uses it to aim its kill).
    fn apply(&self, t: Table, ops: &[Op], before_commit: &mut dyn FnMut()) -> Timing;
    /// The value under `key`, if any (copied out, as an inode cache would).
    fn get(&self, t: Table, key: &[u8]) -> Option<Vec<u8>>;
    /// Calls `f` on every pair whose key starts with `prefix`, in order; returns the count.
    fn scan_prefix(&self, t: Table, prefix: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize;
    /// Waits for background work (fjall's flushes and compactions) to end.
    fn settle(&self) {}
    /// Integrity check where the store has one.
    fn check(&mut self) -> Option<bool> {
        None
    }
}

pub const ENGINES: &[&str] = &["redb", "redb-qr", "fjall", "fjall-ingest", "lmdb"];

/// Opens (creating if needed) the store `engine` in `dir`.
pub fn open(engine: &str, dir: &Path, cache: usize) -> Result<Box<dyn Store>, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    match engine {
        "redb" => Redb::open(dir, cache, false).map(|s| Box::new(s) as Box<dyn Store>),
        "redb-qr" => Redb::open(dir, cache, true).map(|s| Box::new(s) as Box<dyn Store>),
        "fjall" => Fjall::open(dir, cache, false).map(|s| Box::new(s) as Box<dyn Store>),
        "fjall-ingest" => Fjall::open(dir, cache, true).map(|s| Box::new(s) as Box<dyn Store>),
        "lmdb" => Lmdb::open(dir).map(|s| Box::new(s) as Box<dyn Store>),
        _ => Err(format!("unknown engine {engine}; one of {ENGINES:?}")),
    }
}

/// The first key after every key that starts with `prefix` (None: no bound).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

// ---------------------------------------------------------------- redb

const R_META: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("meta");
const R_DATA: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("data");

pub struct Redb {
    db: redb::Database,
    quick_repair: bool,
}

fn rdef(t: Table) -> redb::TableDefinition<'static, &'static [u8], &'static [u8]> {
    match t {
        Table::Meta => R_META,
        Table::Data => R_DATA,
    }
}

impl Redb {
    fn open(dir: &Path, cache: usize, quick_repair: bool) -> Result<Self, String> {
        let db = redb::Builder::new()
            .set_cache_size(cache)
            .set_repair_callback(|s| {
                if s.progress() == 0.0 {
                    eprintln!("redb: repairing after an unclean shutdown");
                }
            })
            .create(dir.join("store.redb"))
            .map_err(|e| e.to_string())?;
        let mut tx = db.begin_write().map_err(|e| e.to_string())?;
        tx.set_quick_repair(quick_repair);
        tx.open_table(R_META).map_err(|e| e.to_string())?;
        tx.open_table(R_DATA).map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())?;
        Ok(Redb { db, quick_repair })
    }
}

impl Store for Redb {
    fn apply(&self, t: Table, ops: &[Op], before_commit: &mut dyn FnMut()) -> Timing {
        let t0 = Instant::now();
        let mut tx = self.db.begin_write().unwrap();
        tx.set_quick_repair(self.quick_repair);
        {
            let mut table = tx.open_table(rdef(t)).unwrap();
            for op in ops {
                match op {
                    Op::Put(k, v) => {
                        table.insert(k.as_slice(), v.as_slice()).unwrap();
                    }
                    Op::Del(k) => {
                        table.remove(k.as_slice()).unwrap();
                    }
                }
            }
        }
        before_commit();
        let t1 = Instant::now();
        tx.commit().unwrap();
        Timing { total: t0.elapsed(), commit: t1.elapsed() }
    }

    fn get(&self, t: Table, key: &[u8]) -> Option<Vec<u8>> {
        use redb::ReadableDatabase;
        let rx = self.db.begin_read().unwrap();
        let table = rx.open_table(rdef(t)).unwrap();
        table.get(key).unwrap().map(|v| v.value().to_vec())
    }

    fn scan_prefix(&self, t: Table, prefix: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        use redb::ReadableDatabase;
        let rx = self.db.begin_read().unwrap();
        let table = rx.open_table(rdef(t)).unwrap();
        let mut n = 0;
        let iter = match prefix_end(prefix) {
            Some(end) => table.range::<&[u8]>(prefix..end.as_slice()).unwrap(),
            None => table.range::<&[u8]>(prefix..).unwrap(),
        };
        for kv in iter {
            let (k, v) = kv.unwrap();
            f(k.value(), v.value());
            n += 1;
        }
        n
    }

    fn check(&mut self) -> Option<bool> {
        Some(self.db.check_integrity().unwrap())
    }
}

// ---------------------------------------------------------------- fjall

pub struct Fjall {
    db: fjall::Database,
    meta: fjall::Keyspace,
    data: fjall::Keyspace,
    /// Apply a batch by sorted ingestion (new tables, fsynced, registered atomically in one new
    /// version) instead of a journaled write batch.
    ingest: bool,
}

impl Fjall {
    fn open(dir: &Path, cache: usize, ingest: bool) -> Result<Self, String> {
        let db = fjall::Database::builder(dir)
            .cache_size(cache as u64)
            .open()
            .map_err(|e| e.to_string())?;
        let meta = db.keyspace("meta", fjall::KeyspaceCreateOptions::default).map_err(|e| e.to_string())?;
        // Data blocks are what key-value separation is for: values over 1 KiB go to blob files.
        let data = db
            .keyspace("data", || {
                fjall::KeyspaceCreateOptions::default()
                    .with_kv_separation(Some(fjall::KvSeparationOptions::default()))
            })
            .map_err(|e| e.to_string())?;
        Ok(Fjall { db, meta, data, ingest })
    }

    fn ks(&self, t: Table) -> &fjall::Keyspace {
        match t {
            Table::Meta => &self.meta,
            Table::Data => &self.data,
        }
    }
}

impl Store for Fjall {
    fn apply(&self, t: Table, ops: &[Op], before_commit: &mut dyn FnMut()) -> Timing {
        let t0 = Instant::now();
        let ks = self.ks(t);
        if self.ingest {
            // Sorted by key; of several ops on one key the last wins.
            let mut idx: Vec<usize> = (0..ops.len()).collect();
            let key = |i: usize| match &ops[i] {
                Op::Put(k, _) | Op::Del(k) => k.as_slice(),
            };
            idx.sort_by(|&a, &b| key(a).cmp(key(b)).then(a.cmp(&b)));
            let mut ing = ks.start_ingestion().unwrap();
            for (n, &i) in idx.iter().enumerate() {
                if idx.get(n + 1).is_some_and(|&j| key(j) == key(i)) {
                    continue;
                }
                match &ops[i] {
                    Op::Put(k, v) => ing.write(k.as_slice(), v.as_slice()).unwrap(),
                    Op::Del(k) => ing.write_tombstone(k.as_slice()).unwrap(),
                }
            }
            before_commit();
            let t1 = Instant::now();
            ing.finish().unwrap();
            return Timing { total: t0.elapsed(), commit: t1.elapsed() };
        }
        let mut b = fjall::OwnedWriteBatch::with_capacity(self.db.clone(), ops.len())
            .durability(Some(fjall::PersistMode::SyncAll));
        for op in ops {
            match op {
                Op::Put(k, v) => b.insert(ks, k.as_slice(), v.as_slice()),
                Op::Del(k) => b.remove(ks, k.as_slice()),
            }
        }
        before_commit();
        let t1 = Instant::now();
        b.commit().unwrap();
        Timing { total: t0.elapsed(), commit: t1.elapsed() }
    }

    fn get(&self, t: Table, key: &[u8]) -> Option<Vec<u8>> {
        self.ks(t).get(key).unwrap().map(|v| v.to_vec())
    }

    fn scan_prefix(&self, t: Table, prefix: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        let mut n = 0;
        for g in self.ks(t).prefix(prefix) {
            let (k, v) = g.into_inner().unwrap();
            f(&k, &v);
            n += 1;
        }
        n
    }

    fn settle(&self) {
        let mut quiet = 0;
        while quiet < 10 {
            if self.db.outstanding_flushes() == 0 && self.db.active_compactions() == 0 {
                quiet += 1;
            } else {
                quiet = 0;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

// ---------------------------------------------------------------- LMDB (heed)

type HDb = heed::Database<'static, heed::types::Bytes, heed::types::Bytes>;

pub struct Lmdb {
    env: &'static heed::Env,
    meta: HDb,
    data: HDb,
}

impl Lmdb {
    fn open(dir: &Path) -> Result<Self, String> {
        // SAFETY: one process opens the environment once; nothing else maps the file.
        let env = unsafe {
            heed::EnvOpenOptions::new()
                .map_size(64 << 30)
                .max_dbs(4)
                .max_readers(126)
                .open(dir)
        }
        .map_err(|e| e.to_string())?;
        let env: &'static heed::Env = Box::leak(Box::new(env));
        let wtxn = env.write_txn().map_err(|e| e.to_string())?;
        let (meta, data) = env
            .create_databases_and_commit(wtxn, |o, w| {
                let m = o.create_database::<heed::types::Bytes, heed::types::Bytes>(w, Some("meta"))?;
                let d = o.create_database::<heed::types::Bytes, heed::types::Bytes>(w, Some("data"))?;
                Ok::<_, heed::Error>(heed::CommitOrAbort::<_, ()>::Commit((m, d)))
            })
            .map_err(|e| e.to_string())?
            .unwrap_commit();
        Ok(Lmdb { env, meta, data })
    }

    fn db(&self, t: Table) -> HDb {
        match t {
            Table::Meta => self.meta,
            Table::Data => self.data,
        }
    }
}

impl Store for Lmdb {
    fn apply(&self, t: Table, ops: &[Op], before_commit: &mut dyn FnMut()) -> Timing {
        let t0 = Instant::now();
        let db = self.db(t);
        let mut w = self.env.write_txn().unwrap();
        for op in ops {
            match op {
                Op::Put(k, v) => db.put(&mut w, k, v).unwrap(),
                Op::Del(k) => {
                    db.delete(&mut w, k).unwrap();
                }
            }
        }
        before_commit();
        let t1 = Instant::now();
        w.commit().unwrap();
        Timing { total: t0.elapsed(), commit: t1.elapsed() }
    }

    fn get(&self, t: Table, key: &[u8]) -> Option<Vec<u8>> {
        let r = self.env.read_txn().unwrap();
        self.db(t).get(&r, key).unwrap().map(|v| v.to_vec())
    }

    fn scan_prefix(&self, t: Table, prefix: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        let r = self.env.read_txn().unwrap();
        let mut n = 0;
        // LMDB refuses an empty key, so an empty prefix is a whole-table iteration.
        let iter: Box<dyn Iterator<Item = heed::Result<(&[u8], &[u8])>>> = if prefix.is_empty() {
            Box::new(self.db(t).iter(&r).unwrap())
        } else {
            Box::new(self.db(t).prefix_iter(&r, prefix).unwrap())
        };
        for kv in iter {
            let (k, v) = kv.unwrap();
            f(k, v);
            n += 1;
        }
        n
    }
}
