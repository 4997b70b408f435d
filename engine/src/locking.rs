//! # Locking in the lanefs engine
//!
//! **Update this file whenever a lock class, what it protects, or the order of acquisition
//! changes.** It is the one place where all of them are written down (DESIGN §3); code that
//! relies on a rule below cites it.
//!
//! ## Lock classes and what they protect
//!
//! | class (`LockClass`) | instances | protects |
//! |---|---|---|
//! | `coarse` | 1 per filesystem | everything; taken around every operation, `Locking::Coarse` only |
//! | `rename` | 1 per filesystem | the parent pointers (`DirBody::parent`) of all directories; taken only by a rename that moves a directory to another parent (and, in `dirlock` mode, by every cross-directory rename, as Linux's `s_vfs_rename_mutex`) |
//! | `dirlock` | 1 per directory (`DirBody::lock`) | all entries of that directory; `Locking::DirLock` only |
//! | `stripe` | 16384 per filesystem (`NSTRIPES`) | the directory entry `(parent, name)` for every name hashing to the stripe: its existence, the inode it names, and the link count changes that adding or removing it implies |
//! | `dirent_shard` | 4096 per filesystem (`NMAP`, read-write) | one shard of the dirent map: which `(parent, name)` keys exist in it and the entry nodes they own; read by lookups, written by a publish or removal (each under the name's stripe) |
//! | `index_shard` | 256 per filesystem | one shard of the ordered index: the runs of its `(dir, slot)` pairs and their live counts; a directory entry node is freed only after its remover has taken it out of its run under this lock (`dir.rs`) |
//! | `file_data` | 1 per regular file (`RwLock`) | the file's pages, and its size (which also lives in the attributes, written under this lock) |
//! | `attr` | 1 per inode (seqlock, writers only) | mode, uid, gid, size, blocks, times |
//! | `xattr` | 1 per inode | the inode's extended attributes |
//! | `ino_alloc` | 1 per thread slot | that slot's free inode numbers and fresh range |
//! | `handles` | 1 per thread slot | that slot's shard of the open-file table |
//!
//! Global locks off every hot path (uncounted; each is a leaf):
//! - the **inode-number spill list** (`ids.rs`, 1 per filesystem): taken when a slot's free
//!   list passes 8192 numbers (once per 4096 frees) or a slot with no numbers left drains it;
//! - the **thread-slot pool** (`slots.rs`, 1 per process): taken once when a thread first
//!   calls the engine and once when it exits.
//! - the **invalidation sink** (`notify.rs`, 1 per filesystem, a read-write lock): read only
//!   by a mutation made through the library (not by the kernel) while a FUSE mount has a sink
//!   installed, after the operation has released every other lock; written when a mount
//!   installs or removes its sink.
//!
//! Not locks, but shared state with rules of their own:
//! - the **inode table**: lock-free; slots are written only by `install` (a number fresh from
//!   the allocator) and `remove` (by the winner of the inode's `DEAD` transition);
//! - the **lifecycle word** of an inode (`inode.rs`): atomic transitions only;
//! - **`DirBody::life`** (ALIVE / DYING / DEAD): written only by a thread holding the stripe
//!   of the directory's own name (rmdir, or a rename over it); see the rmdir protocol below;
//! - **`DirBody::slot_mask`**: bits only ever set, by `publish`;
//! - per-slot counters (statistics, cookie sequences, quota reserves): atomics.
//!
//! ## Ordering
//!
//! Locks are taken in this order; a lock is never taken while holding a lock listed below it.
//!
//! ```text
//! coarse
//!   rename
//!     dirlock            (two of them: lower inode number first)
//!       stripe           (two of them: lower stripe index first; equal indexes: once)
//!         dirent_shard   (leaf: held for one table probe, never with another one)
//!         index_shard    (leaf)
//!         ino_alloc      (leaf)
//!         handles        (leaf)
//!         xattr          (leaf)
//!         file_data
//!           attr         (leaf: the writer's closure only computes)
//! ```
//!
//! Every rank is acquired in non-decreasing order by every path, so no cycle of waiters can
//! form: at the top, `coarse` and `rename` are single locks; `dirlock`s and `stripe`s of one
//! operation are sorted before acquisition (at most two, by [`crate::Filesystem::rename`]);
//! the leaves never nest with each other, except `file_data → attr`. The one wait that is not
//! a lock acquisition, a creator waiting for an rmdir's outcome (below), happens with stripes
//! held, and the rmdir it waits for holds only its own stripe and takes nothing but
//! `index_shard` leaves until it decides, so the wait always ends.
//!
//! Rename takes the `rename` lock before its stripes, but only knows whether it moves a
//! directory after looking the names up. It peeks without locks, takes the locks its peek
//! calls for, and re-reads both names under the stripes; if the source turned out to be a
//! directory moving to another parent and the `rename` lock was not taken, it drops
//! everything and starts again with it ([`crate::Filesystem::rename`]).
//!
//! ## Which operation takes what (`lanes` mode)
//!
//! | operation | stripes | other locks |
//! |---|---|---|
//! | lookup, getattr, access, readlink | none | `dirent_shard` (read); for a directory's size, its `index_shard`s |
//! | path walk (`Client`) | none | as lookup, per component |
//! | create, mknod, mkdir, symlink, link | `(parent, name)` | `ino_alloc`, `index_shard`, `dirent_shard`, `attr` of the parent once per clock tick |
//! | unlink | `(parent, name)` | `dirent_shard`, `index_shard`, `attr` |
//! | rmdir | `(parent, name)` | `index_shard`s of the victim (emptiness test) |
//! | rename | `(p1, n1)` and `(p2, n2)` | `rename` first if a directory changes parent |
//! | open, release | none | `handles` of a slot |
//! | read, lseek (data/hole) | none | `handles` (not by inode), `file_data` (shared) |
//! | write, truncate, fallocate | none | `handles`, `file_data` (exclusive), `attr` |
//! | readdir | none | `handles`, `index_shard`s of the directory's slots, `dirent_shard`s (read) |
//! | setattr, xattrs | none | `attr` / `xattr` of the inode |
//!
//! A create or unlink therefore writes nothing that every other name in the same directory
//! writes: the stripe is chosen by the name, the index shard by the directory and the
//! creating thread's slot, cookies come from the slot's own sequence, inode numbers from the
//! slot's own range, and the directory's mtime/ctime is stored only when the coarse clock
//! ticks (`time.rs`). There is no entry counter and no per-directory lock.
//!
//! ## Lookups take no directory lock and no reference (DESIGN §3, seed 000)
//!
//! `lookup(parent, name)` loads the parent from the inode table (two loads, no reference
//! count), reads its attributes through the seqlock (no write), and reads the dirent map under
//! its shard's read lock (one of 4096, picked by the name's hash: the only shared write a
//! lookup makes, and one that threads working on different names rarely share). The entry gives `ino_gen`; the inode table gives the inode whose
//! `ino_gen` must match. A mismatch means the entry changed and its old inode was freed and
//! the number reused between the two reads: the lookup re-reads the entry; after a few such
//! races it re-reads under the name's stripe, where an entry and its inode are stable (an
//! inode is installed before its entry is published, and an entry is removed before its inode
//! can be freed).
//!
//! ## The rmdir protocol: excluding creates without a per-directory lock
//!
//! A create in directory D holds the stripe of `(D, name)`; an rmdir of D holds the stripe of
//! `(parent(D), name(D))`, a different lock. They exclude each other through `D.life` and the
//! ordered index, as in Dekker's algorithm:
//!
//! ```text
//! creator (Dirents::publish)                 rmdir (Dirents::kill_if_empty)
//!   C1 set D.slot_mask bit (SeqCst RMW)        R1 D.life := DYING
//!   C2 insert into the index shard (mutex)     R2 fence(SeqCst)
//!   C3 fence(SeqCst)                           R3 read D.slot_mask; count entries under
//!   C4 read D.life                                 the shard mutexes of those slots
//!      DYING: wait until it changes            R4 D.life := empty ? DEAD : ALIVE
//!      DEAD:  remove the index entry, ENOENT
//!      ALIVE: insert into the dirent map (visible)
//! ```
//!
//! *Claim: no entry is ever published in a DEAD directory, and rmdir never declares a
//! directory empty while a create in it succeeds.* The two fences are ordered in the single
//! total order of SeqCst operations. If C3 precedes R2, then R3 reads the mask bit set by C1
//! (sequenced before C3) and, locking the shard after C2's unlock, sees the index entry:
//! rmdir answers ENOTEMPTY and restores ALIVE. If R2 precedes C3, C4 reads DYING or a later
//! value: the creator waits for R4, then publishes on ALIVE (rmdir failed; it may have
//! counted this very entry) or backs out on DEAD (rmdir succeeded without it). A creator that
//! read ALIVE at C4 is therefore ordered before any rmdir that could miss it, and its entry
//! stays in the index, so every later rmdir sees it. The window between R1 and R4 takes only
//! `index_shard` leaves, so waiters are not blocked for long (they spin, then yield).
//!
//! The same protocol covers every way of adding an entry (create, mknod, mkdir, symlink,
//! link, rename into D) and every way of removing a directory (rmdir, a rename over an empty
//! directory). The check that carries it is C4 *after* C2: publishing to the index after
//! reading `life` would let an rmdir miss an entry that then becomes visible in a dead
//! directory.
//!
//! Entries enter the index before the map and leave the map before the index, so an entry is
//! counted by rmdir whenever a lookup could see it. A readdir reads names from the index and
//! reports only those the map confirms with the same cookie.
//!
//! ## Rename
//!
//! Both stripes are taken in stripe-index order (lower first), so two renames cannot deadlock
//! (ABBA). A rename that moves a directory to another parent also holds the `rename` lock,
//! taken first; it is what makes the loop check sound: under it no directory changes parent,
//! so walking `..` pointers from the target directory up to the root, looking for the source,
//! sees a stable chain (`is_ancestor`). That check is the load-bearing one: without it,
//! `rename(a, a/b/c)` would detach a cycle from the tree. A rename over an existing name
//! points the target entry at the source inode in place (`Dirents::repoint`), so a lookup of
//! the target never finds it missing; then it removes the source entry.
//!
//! ## Memory reclamation
//!
//! Inodes are reached through `crossbeam-epoch` guards. The winner of an inode's `DEAD`
//! transition removes it from the table and defers its destruction past every current guard;
//! a reader still holding a pointer can read it but cannot take a reference (the transition
//! fails on `DEAD`). A directory entry's node is owned by the dirent map and freed by its
//! remover once it has left both tables (`dir.rs`, "A node's life"): no epoch, since every
//! reader of a node holds the lock of a table that still contains it.
