//! # Locking in the lanefs engine
//!
//! **Update this file whenever a lock class, what it protects, or the order of acquisition
//! changes.** It is the one place where all of them are written down; code that relies on a
//! rule below cites it.
//!
//! ## Lock classes and what they protect
//!
//! | class (`LockClass`) | instances | protects |
//! |---|---|---|
//! | `coarse` | 1 per filesystem | everything; taken around every operation, `Locking::Coarse` only |
//! | `rename` | 1 per filesystem | the parent pointers (`DirBody::parent`) of all directories; taken only by a rename that moves a directory to another parent (and, in `dirlock` mode, by every cross-directory rename, as Linux's `s_vfs_rename_mutex`) |
//! | `dirlock` | 1 per directory (`DirBody::lock`) | all entries of that directory; `Locking::DirLock` only |
//! | `stripe` | 16384 per filesystem (`NSTRIPES`) | the directory entry `(parent, name)` for every name hashing to the stripe: its existence, the inode it names, the link count changes adding or removing it implies, and the order of the records that change it |
//! | `dirent_shard` | 4096 per filesystem (`NMAP`, read-write) | one shard of the dirent map: which `(parent, name)` keys exist in it and the entry nodes they own, with what each names (inode and type, changed together by a rename under the write lock); read by lookups, written by a reveal, a removal or a rename (each under the name's stripe) |
//! | `index_shard` | 256 per filesystem | the `words` of the runs whose `(directory, slot)` hashes to it (`dir/index.rs`); an entry node is freed only after its remover took it out of its run under this lock |
//! | `file_data` | 1 per regular file (`RwLock`) | the file's pages and its size (which also lives in the attributes, written under this lock), and the order of its data records |
//! | `attr` | 1 per inode (seqlock, writers only) | mode, flags (the engine's and the `chattr` ones), uid, gid, size, blocks, times, and the order of attribute records (SetAttr, SetFlags) |
//! | `xattr` | 256 per filesystem | one shard of the extended-attribute table (`xattr.rs`), and the order of xattr records |
//! | `ino_alloc` | 1 per thread slot | that slot's free inode numbers, fresh numbers and generations |
//! | `handles` | 1 per thread slot | that slot's shard of the open-file table |
//! | `inode_hash` | 1 per lazily loaded filesystem | `dirlock` and `coarse` modes only (the seed-000 "before"): taken by a miss of the inode table around its look and again around its insert (`fs/lazy.rs`); a leaf |
//!
//! Global locks off every hot path (uncounted; each is a leaf):
//! - the **inode-number spill list** (`id.rs`, 1 per filesystem): taken when a slot's free
//!   list passes 8192 numbers (once per 4096 frees) or a slot with no numbers left drains it;
//! - the **thread-slot pool** (`slots.rs`, 1 per process): taken once when a thread first
//!   calls the engine and once when it exits;
//! - the **loads under way** of a lazily loaded filesystem (`fs/lazy.rs`: 64 shards of a
//!   map from inode number to its load's cell, and of the inodes the eviction pass parked,
//!   each a leaf mutex held only to find, add or take out a cell or a parked inode, never
//!   during a load; taken also by a change labelling an inode that is not in the table,
//!   under the locks that order the change). A load is a table miss (`iget` and the
//!   functions beside it): mostly before the operation takes a lock, but also under the
//!   stripes it holds (`iget_named`, a rename's walk up `..` under `rename` and its
//!   stripes). It takes only locks ranked below those: while it inserts a directory's
//!   entries, `index_shard` and `dirent_shard` locks one at a time, as a create does; for
//!   the files' xattrs, their `xattr` shard; its store read is a leaf. It waits on another
//!   number's cell only for a directory's files, and a file's load waits on nothing, holds
//!   no stripe and takes no lock a waiter holds, so loads never wait in a cycle;
//! - the **inode evictor** (`fs/lazy.rs`, 1 per lazily loaded filesystem): try-locked by
//!   the inode eviction pass, which runs at the start of an operation (no lock held), and
//!   locked by `hold_eviction` (a check of the whole table, no lock held); inside it the
//!   pass try-locks one file's `file_data` at a time, and takes a shard of the loads under
//!   way (a leaf, as above) to park an inode; to drop one, the inode's `xattr` shard and
//!   inside it the loads shard, the order in which a change that labels a parked inode
//!   takes them (`relabel`, called from `commit` under whatever locks order the change,
//!   `xattr` among them). Nothing else is taken under a loads shard. To drop a directory
//!   the pass also takes, with no loads shard held, the `index_shard` and `dirent_shard`
//!   locks of its entries one at a time (as a removal does, but without stripes: nothing
//!   else can reach them), and before that, to check that none of its entries names an
//!   inode in memory, its index shards one at a time. While it does, a miss on that
//!   directory waits on the loads shard's condition variable (releasing the shard) for the
//!   drop to end: a wait ranked as a lock just below `stripe`, as the missing operation
//!   may hold stripes, `rename` or `dirlock`s, none of which the drop takes, and holds no
//!   `dirent_shard`, `index_shard`, `xattr` or loads shard lock, which it does take;
//! - the **evictor** (`fs/cache.rs`, 1 per filesystem): try-locked by the eviction pass,
//!   which a read or write runs after releasing its locks once the store declared file pages
//!   kept; inside it the pass try-locks one file's `file_data` at a time (never waits);
//! - the **changed-page wait** (`data.rs`, "Changed pages"; 1 per filesystem, in its
//!   `PageEpochs`): taken by a writer past the store's budget of changed pages, with no other
//!   lock held, to wait for a checkpoint; by the store when it declares one kept or says it
//!   cannot take one (under its own checkpoint lock, which nothing of the engine nests
//!   under). Inside it, and from a change that finds a checkpoint due (under `file_data`),
//!   the store's wake-up callback takes only a lock of the store's (a leaf);
//! - the **invalidation sink** (`notify.rs`, 1 per filesystem, a read-write lock): read only
//!   by a mutation made through the library (not by the kernel) while a FUSE mount has a sink
//!   installed, after the operation has released every other lock; written when a mount
//!   installs or removes its sink.
//!
//! The **store** ([`crate::Store`]) is called while the locks that order a change are held
//! (see "Records" below) and must take only locks of its own that nothing of the engine
//! nests under: to the engine, a store's locks are leaves.
//!
//! Not locks, but shared state with rules of their own:
//! - the **inode table**: lock-free; slots are written only by `install` (a number fresh from
//!   the allocator, or a record's during recovery), `install_loaded` (a load, holding the
//!   number's cell), `try_remove` (by the winner of the inode's `DEAD` transition), and, in a
//!   lazily loaded filesystem, `detach` and `reinstall` (the eviction pass parking an inode
//!   and a miss or the pass taking it back), both under the number's shard of the loads
//!   under way (`fs/lazy.rs`, "Eviction");
//! - the **lifecycle word** of an inode (`inode.rs`): atomic transitions only; the one that
//!   empties an unnamed file held only by the kernel's lookups (`Inode::empty`, `EMPTIED`)
//!   is made under the file's `file_data` lock, taken by `Filesystem::reap_unlinked`
//!   (`fs/unlinked.rs`) with no other lock held (the `coarse` one in that mode), after it
//!   asked the kernel through the invalidation sink, with no lock held at all; the
//!   **unlinked set** there (64 shards, each a leaf mutex) is touched by a transition's
//!   caller with no engine lock held but those `free_inode` may be called under, and by a
//!   FORGET of a noted file (its start and end); its **wait lock** (1 per filesystem) is
//!   taken by an asker waiting for a FORGET or a freeing under way, with no engine lock
//!   held, and by whoever changed an entry, after releasing its shard, to wake it: the
//!   waiter takes a shard inside it, nothing else;
//! - a directory's **life** (ALIVE, DYING, DEAD; `dir/life.rs`): named transitions, made
//!   only by a thread holding the stripe of the directory's own name (rmdir, or a rename
//!   over it); see the removal protocol below;
//! - a directory's **run set** (`dir/index.rs`): replaced by compare-and-swap, under the
//!   index-shard lock of the slot it adds; runs' `live` counts: atomics changed under their
//!   shard lock, read without it;
//! - per-slot counters (statistics, cookie sequences, quota reserves): atomics;
//! - the **kernel-held counts** (`notify.rs`, `KernelHeld`): one atomic per inode number,
//!   raised by a kernel caller's lookup reference before it reads the attributes it answers
//!   with, lowered by FORGET (before the reference), read by a library change's report, by
//!   a transition's caller that notes an unlinked file, and by `Inode::empty`; SeqCst
//!   fences order them. A report that waits for a count to reach 0 parks on the count's
//!   address (`parking_lot_core`, whose bucket lock is a leaf) and the FORGET that takes it
//!   to 0 unparks it, holding no engine lock either way;
//! - the **revocation lanes** (`revoke.rs`): per thread, one cache line of sequence numbers,
//!   one per bucket of directories, odd while the thread has an entry change in flight in a
//!   directory of the bucket; written only by the thread that owns the lane (plain stores),
//!   read by a revoker. SeqCst fences order them against a directory's attributes (see
//!   "Revocation" below). The process-wide list of lanes only grows (a compare-and-swap of
//!   its head when a thread finds no free lane); a lane is handed to another thread only
//!   after its owner exits.
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
//!         dirent_shard   (two of them, by a rename only: lower shard index first)
//!         index_shard    (leaf)
//!         ino_alloc      (leaf)
//!         handles        (leaf)
//!         file_data
//!           xattr
//!             attr       (leaf: the writer's closure computes and appends a record)
//! ```
//!
//! Every rank is acquired in non-decreasing order by every path, so no cycle of waiters can
//! form: at the top, `coarse` and `rename` are single locks; `dirlock`s, `stripe`s and a
//! rename's two `dirent_shard`s are sorted before acquisition; below the stripes only
//! `file_data → xattr → attr` nest (a write removes a file's capabilities and set-id bits
//! while holding its data lock; an xattr change makes its permission check, its record and
//! its change inside the inode's seqlock while holding its xattr shard, so that a chmod,
//! chown or `chattr`, inside the same seqlock, is entirely before or after it). Two waits
//! are not lock
//! acquisitions, both with stripes held, both between a creator in directory D and a removal
//! of D (below): a creator waits for a removal's decision, and the removal holds only the
//! stripe of D's own name and takes, until it decides, only index-shard and dirent-shard
//! locks (one at a time, leaves) and its store append; a removal that finds D's counted
//! entries all still being published waits, with D alive, for their creators, which need
//! no stripe to reveal or take back an entry. So both waits end.
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
//! | lookup | none | one `dirent_shard` (read) |
//! | getattr, access, readlink | none | none (a directory's size is counted without a lock) |
//! | path walk (`Client`) | none | one `dirent_shard` (read) per component |
//! | create, mknod, mkdir, symlink, link | `(parent, name)` | `ino_alloc`, the creating slot's `index_shard` in the parent, `dirent_shard` (read, then write), `attr` of the parent once per clock tick |
//! | tmpfile (`O_TMPFILE`) | none | `ino_alloc`; `xattr` of the directory (its default ACL, if it has one) and of the new inode (an inherited ACL); `handles`: each alone, none nested. The directory is only read (no entry, no time); an rmdir racing it is not excluded, since neither changes what the other reads, and the file is refused only if the directory was already dead |
//! | link of a tmpfile (its first name) | as link | as link: the first name raises the link count from 0 in the same lifecycle transition that clears the inode's `LINKABLE` mark (`inode.rs`), so no lock is added |
//! | unlink | `(parent, name)` | `dirent_shard`, `index_shard` of the entry's run, `attr` |
//! | rmdir | `(parent, name)` | as unlink; the victim's emptiness is counted without a lock, and when it has entries, their `index_shard`s and `dirent_shard`s (read, one at a time) find whether one is visible |
//! | rename | `(p1, n1)` and `(p2, n2)` | both names' `dirent_shard`s (write, together), `index_shard`s; `rename` first if a directory changes parent; with `RENAME_WHITEOUT` also `ino_alloc`, the whiteout's `index_shard` in `p1`, `xattr` of `p1` (read its default ACL) and of the whiteout (an inherited ACL), before the map shards |
//! | open, release | none | `handles` of a slot |
//! | read, lseek (data/hole) | none | `handles` (not by inode), `file_data` (shared; a page the store keeps is read from the store under it) |
//! | write, truncate, fallocate | none | `handles` (not by inode), `file_data` (exclusive), `attr`; `xattr` if the file has extended attributes |
//! | readdir | none | `handles`, the `index_shard`s of the directory's runs, `dirent_shard`s (read) |
//! | setattr | none | `attr` of the inode; with an access ACL, `xattr` of the inode around it (a chmod rewrites the ACL) |
//! | setxattr, removexattr | none | `xattr` of the inode, and `attr` inside it (the checks, the record and the change) |
//! | get_flags | none | none (one load of the flags word) |
//! | set_flags | none | `attr` of the inode (the checks, the record and the change inside it) |
//!
//! A create or unlink therefore writes nothing that every other name in the same directory
//! writes: the stripe is chosen by the name, the index shard by the directory and the
//! creating thread's slot, cookies come from the slot's own sequence, inode numbers and
//! generations from the slot's own ranges, and the directory's mtime/ctime is stored only when
//! the coarse clock ticks (`time.rs`). There is no entry counter and no per-directory lock.
//! Every entry change (create, mknod, mkdir, symlink, link, unlink, rmdir, rename) also
//! marks itself in flight, for its length, on its own thread's revocation lane, which no
//! other thread writes (`revoke.rs`).
//!
//! An operation that changes an inode it did not find under a stripe (setattr, write,
//! fallocate, xattrs, an atime update) holds a reference on it for its length
//! (`Filesystem::hold`), so the inode is not freed, and its `Free` record not appended,
//! before the operation's own records. That writes the inode's lifecycle word, which the
//! operation writes anyway; never a parent's.
//!
//! ## Lookups take no directory lock and no reference
//!
//! `lookup(parent, name)` loads the parent from the inode table (two loads, no reference
//! count), reads its attributes through the seqlock (no write), and reads the dirent map under
//! its shard's read lock (one of 4096, picked by the name's hash: the only shared write a
//! lookup makes, one that threads working on different names rarely share). The entry names
//! an inode by number and generation; the inode table gives the inode whose generation must
//! match. A mismatch means the entry changed and its old inode was freed and the number
//! reused between the two reads: the lookup re-reads the entry; after a few such races it
//! re-reads under the name's stripe, where an entry and its inode are stable (an inode is
//! installed before its entry is revealed, and an entry is removed before its inode can be
//! freed).
//!
//! ## Revocation: entry changes and a change of their directory's permission
//!
//! Linux makes an entry change's checks of its directory (`may_create`, `may_delete`: write
//! and search permission, 'i' and 'a', the sticky rule) and the change under the
//! directory's inode lock, which a chmod, chown, ACL change or `chattr` of the directory
//! also takes; so an entry change that passed its checks is visible before a change that
//! takes the permission away returns. lanefs has no per-directory lock on the entry
//! changes' path (the removal protocol below exists for the same reason), and orders them
//! with a grace period paid by the rare *revoker* instead (`revoke.rs`, with its argument and
//! loom model):
//! - an entry change in directory D makes its thread's sequence number for D's bucket odd
//!   (a plain store to a line only its thread writes), then a SeqCst fence, *then* reads D's
//!   attributes for its checks; it makes the number even again once its change is visible
//!   or refused. A rename counts itself in both directories;
//! - a revoker (`setattr` of a directory's mode, owner or group; `set_flags`; a change of
//!   its access or default ACL) makes its change, releases every lock, then a SeqCst fence,
//!   then reads every thread's number for D's bucket and waits, for each it found odd,
//!   until it changes.
//!
//! As in Dekker's algorithm, either the entry change's checks see the revoker's change, or
//! the revoker sees the count and waits until the entry change is visible: so the revoker
//! returns only after every entry change that checked the old attributes has landed, and
//! what callers see is a serial order. The wait ends: a counted entry change waits only for
//! locks and waits listed above, none of them held by a revoker while it waits, and no
//! operation revokes while it is counted; each wait is for one entry change, the one in
//! flight when the revoker looked. A revoker takes no lock and writes nothing shared (in
//! `coarse` mode it holds `coarse`, and then finds no entry change in flight).
//!
//! Not covered, as Linux does not cover them either (it checks them before it locks the
//! victim): `may_delete`'s look at the victim (its 'i' and 'a', its owner for the sticky
//! rule), and the write permission a directory moving to another parent needs on itself.
//! An xattr change is ordered against a chmod, chown, `chattr` or ACL change by the seqlock
//! and the xattr shard instead (above, "Ordering").
//!
//! ## The removal protocol: excluding creates without a per-directory lock
//!
//! A create in directory D holds the stripe of `(D, name)`; an rmdir of D holds the stripe of
//! `(parent(D), name(D))`, a different lock. They exclude each other through D's life word
//! and its runs' counts, as in Dekker's algorithm, with one SeqCst fence on each side; the
//! protocol, its argument and its loom model are in `dir/life.rs`. It covers every way of
//! adding an entry (create, mknod, mkdir, symlink, link, rename into D) and every way of
//! removing a directory (rmdir, a rename over an empty directory). Its outcomes are a
//! serial order: a removal answers ENOTEMPTY only when one of the entries it counted is
//! visible in the map, and a creator it refuses is told ENOENT only after D's name has left
//! the map. Entries enter the index
//! before the map and leave the map before the index, so an entry is counted by a removal
//! whenever a lookup could see it. A readdir reads names from the index and reports only
//! those the map confirms with the same cookie.
//!
//! A parent's link count moves while the entry causing the move is in its index (`+1` when a
//! new subdirectory's name is revealed, `-1` while a removed or moved-out subdirectory's name
//! is still there), so a parent about to lose a link is never found empty: its count never
//! changes after it is dead.
//!
//! ## Rename
//!
//! Both stripes are taken in stripe-index order (lower first), so two renames cannot deadlock
//! (ABBA). A rename that moves a directory to another parent also holds the `rename` lock,
//! taken first; it is what makes the loop check sound: under it no directory changes parent,
//! so walking `..` pointers from the target directory up to the root, looking for the source,
//! sees a stable chain (`is_ancestor`). That check is the load-bearing one: without it,
//! `rename(a, a/b/c)` would detach a cycle from the tree; a chain that runs into a removed
//! directory answers ENOENT, never "not an ancestor". The map changes of a rename (the new
//! name, the replaced or exchanged target, the removed source), with the link counts and
//! `..` that go with them, are made while both names' map shards are write-locked, so a
//! lookup of either name sees the rename entirely or not at all.
//!
//! ## Records
//!
//! Every change is appended to the store as a record while the locks that order it are held
//! and before any of it is visible (`fs/apply.rs` says where, kind by kind): none for a
//! tmpfile's record (nothing else can reach its inode before it is installed, after the
//! append), the stripes of the names it changes for namespace records, inside a removal's decision for an rmdir or
//! a rename over a directory, the data lock for data records, the attribute seqlock for
//! attribute records, the xattr shard lock for xattr records. Two changes whose order
//! matters share one of those locks (or one causally follows the other), so the order in
//! which records are appended is an order in which they can be replayed
//! (docs/RECORDS.md, "Order").
//!
//! ## Memory reclamation
//!
//! Inodes are reached through `crossbeam-epoch` guards. The winner of an inode's `DEAD`
//! transition removes it from the table and defers its destruction past every current guard;
//! a reader still holding a pointer can read it but cannot take a reference (the transition
//! fails on `DEAD`). A directory's runs and run set are freed with it. A directory entry's
//! node is owned by the dirent map and freed by its remover once it has left both tables
//! (`dir/node.rs`, "A node's life"): no epoch, since every reader of a node holds the lock of
//! a table that still contains it.
