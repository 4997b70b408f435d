//! Which paths are lanefs's: the lanefs mounts of this process's mount namespace, read from
//! `/proc/self/mountinfo`.
//!
//! A mount is served over the channel when its filesystem type is `fuse.lanefs`, its root
//! is the filesystem's root, no other mount lies inside it (the server cannot see one, so a
//! path walked there would be resolved in lanefs where the kernel would cross into the
//! other filesystem), no mount covers it (one made later on its mountpoint or on a
//! directory above it, which hides it from path walks), the mount itself is neither
//! read-only nor `nosymfollow` (flags of the mount, not of the filesystem, which the server
//! never sees: a read-only bind mount of a writable lanefs is enforced by the kernel alone),
//! and `LANEFS_RUN_MOUNTS` (a `:`-separated list of mountpoints set by `lanefs run
//! --mount`), when set, names it. Anything else goes through the kernel.
//!
//! The table is read at the first call that needs it, and again whenever the mount
//! namespace changed (a descriptor of `mountinfo` kept open reports each change to `poll`:
//! one system call per path the table places on a lanefs mount, and at most one every
//! 50 ms for the others, which the kernel serves whatever the table says; `table_outside`)
//! or a connection to a server failed. A mount made
//! inside a lanefs mount is therefore seen at the next call, and the lanefs mount's paths
//! go through the kernel from then on (a directory with a mount on it is EBUSY to rmdir,
//! which only the kernel knows). Tables
//! are immutable once published; a replaced one is leaked (it is replaced only when the
//! mounts changed, a few times in a process's life), so a reader needs no lock.

use std::sync::atomic::{AtomicI32, AtomicI64, AtomicPtr, AtomicU64, Ordering::*};

use crate::real::sys;

/// One lanefs mount.
pub(crate) struct Mount {
    /// The mountpoint, as `mountinfo` shows it (unescaped), without a trailing slash.
    pub point: Vec<u8>,
    /// Its device number (`st_dev`).
    pub dev: (u32, u32),
    /// The mount id (`statx`'s `stx_mnt_id`).
    pub mnt_id: u64,
    /// The mounting user (`user_id=` of the FUSE mount): where its socket is, and the only
    /// server uid (with root's) this client trusts for it.
    pub owner: u32,
    /// Monotonic nanoseconds before which no connection is tried again (one failed).
    pub retry_at: AtomicI64,
}

/// The lanefs mounts.
pub(crate) struct Table {
    pub mounts: Vec<Mount>,
    /// The device numbers of the mounts, for a descriptor's quick test.
    pub devs: Vec<u64>,
}

static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());

/// Set once the process changed its root or its mount namespace (`chroot`, `unshare`,
/// `setns`): its paths no longer mean what the table it read says, and every call goes
/// through the kernel for the rest of its life (a program it execs reads its own table).
static ISOLATED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// No lanefs mount: the table of an isolated process.
static NONE: Table = Table {
    mounts: Vec::new(),
    devs: Vec::new(),
};

/// The process changed its root or mount namespace ([`ISOLATED`]).
pub(crate) fn isolate() {
    ISOLATED.store(true, SeqCst);
}
static LOADED_AT: AtomicI64 = AtomicI64::new(i64::MIN);

/// Monotonic clock, nanoseconds.
pub(crate) fn now_ns() -> i64 {
    // SAFETY: a zeroed timespec is a valid out-buffer.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// A descriptor of `/proc/self/mountinfo` kept open to learn of mount changes: `poll`
/// reports POLLPRI once after each change of the mount namespace (-1: none open yet, or
/// this is a forked child, which opens its own: a shared one would report each change to
/// only one of the two processes). Its inode number tells it from a descriptor the program
/// may have put at its number after closing it.
static WATCH: AtomicI32 = AtomicI32::new(-1);
static WATCH_INO: AtomicU64 = AtomicU64::new(0);

/// The current table: read at the first call, and again whenever the mounts changed.
pub(crate) fn table() -> &'static Table {
    if ISOLATED.load(Relaxed) {
        return &NONE;
    }
    let p = TABLE.load(Acquire);
    if !p.is_null() && !mounts_changed() {
        POLLED_AT.store(now_ns(), Relaxed);
        // SAFETY: published tables are leaked, never freed.
        return unsafe { &*p };
    }
    reload(true);
    POLLED_AT.store(now_ns(), Relaxed);
    // SAFETY: as above; `reload(true)` always publishes one.
    unsafe { &*TABLE.load(Acquire) }
}

/// When [`table`] last asked whether the mounts changed.
static POLLED_AT: AtomicI64 = AtomicI64::new(i64::MIN);

/// How long [`table_outside`] goes without asking whether the mounts changed.
const OUTSIDE_POLL_NS: i64 = 50_000_000;

/// The table for a path it may show on no lanefs mount, which then goes to the kernel: the
/// table as last read, asked anew (one `poll`) only once every [`OUTSIDE_POLL_NS`]. Sending
/// a path to the kernel is always right, so a lanefs mount made meanwhile costs only the
/// channel's speed for that long; a path the table does place on a lanefs mount is placed
/// again with [`table`], which always asks, so that a mount made inside a lanefs mount is
/// never missed. Calls outside every lanefs mount then cost a prefix check and a read of
/// the clock (vDSO), no system call.
pub(crate) fn table_outside() -> &'static Table {
    if ISOLATED.load(Relaxed) {
        return &NONE;
    }
    let p = TABLE.load(Acquire);
    if !p.is_null() && now_ns().saturating_sub(POLLED_AT.load(Relaxed)) < OUTSIDE_POLL_NS {
        // SAFETY: published tables are leaked, never freed.
        return unsafe { &*p };
    }
    table()
}

/// Whether the mount namespace changed since the table was read (one `poll`, no wait).
fn mounts_changed() -> bool {
    let fd = WATCH.load(Relaxed);
    if fd < 0 {
        return true;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLPRI,
        revents: 0,
    };
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ppoll of one pollfd, no timeout wait (a zero timespec), no signal mask.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ppoll,
            &mut p,
            1,
            &zero,
            std::ptr::null::<u8>(),
            0usize,
        )
    };
    r > 0 && p.revents & (libc::POLLPRI | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Opens the watch descriptor if there is none that is still ours.
fn watch() {
    let fd = WATCH.load(Relaxed);
    if fd >= 0 && crate::real::fd_ino(fd) == WATCH_INO.load(Relaxed) {
        return;
    }
    let Some(new) = open_mountinfo() else { return };
    // SAFETY: moving our own descriptor out of the way of the program's small numbers.
    let high = unsafe { libc::fcntl(new, libc::F_DUPFD_CLOEXEC, 512) };
    let new = if high >= 0 {
        crate::real::close_raw(new);
        high
    } else {
        new
    };
    // Threads making their first calls at once each open one: the first to publish keeps
    // its own, the others close theirs. (Every descriptor of this process's `mountinfo` has
    // the same inode number.)
    WATCH_INO.store(crate::real::fd_ino(new), Relaxed);
    if WATCH.compare_exchange(fd, new, AcqRel, Relaxed).is_err() {
        crate::real::close_raw(new);
    }
}

/// In a forked child: the watch descriptor is the parent's open file; the child opens its
/// own at its next call.
pub(crate) fn forget_watch() {
    let fd = WATCH.swap(-1, Relaxed);
    if fd >= 0 && crate::real::fd_ino(fd) == WATCH_INO.load(Relaxed) {
        crate::real::close_raw(fd);
    }
}

/// Reads the mount table again, unless it was read less than a second ago (`force`: read
/// it anyway). Publishes the new table only if the mounts differ.
pub(crate) fn reload(force: bool) {
    let now = now_ns();
    let last = LOADED_AT.load(Relaxed);
    if !force && now.saturating_sub(last) < 1_000_000_000 {
        return;
    }
    if LOADED_AT
        .compare_exchange(last, now, Relaxed, Relaxed)
        .is_err()
        && !force
    {
        return; // another thread reads it
    }
    // Watch first, then read: a change after the read is reported by the watch.
    watch();
    let _ = mounts_changed();
    let text = read_mountinfo().unwrap_or_default();
    let t = parse(&text, std::env::var_os("LANEFS_RUN_MOUNTS").as_deref());
    let old = TABLE.load(Acquire);
    // SAFETY: published tables are never freed.
    if !old.is_null() && same(unsafe { &*old }, &t) {
        return;
    }
    TABLE.store(Box::into_raw(Box::new(t)), Release);
}

fn open_mountinfo() -> Option<i32> {
    // SAFETY: openat of a NUL-terminated path.
    sys(unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/mountinfo".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    })
    .ok()
    .map(|fd| fd as i32)
}

fn same(a: &Table, b: &Table) -> bool {
    a.mounts.len() == b.mounts.len()
        && a.mounts
            .iter()
            .zip(&b.mounts)
            .all(|(x, y)| x.point == y.point && x.dev == y.dev && x.owner == y.owner)
}

/// `/proc/self/mountinfo`, read with system calls of this library's own.
fn read_mountinfo() -> Option<Vec<u8>> {
    let fd = open_mountinfo()?;
    let mut out = Vec::with_capacity(8192);
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes.
        let n = sys(unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) });
        match n {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => {
                crate::real::close_raw(fd);
                return None;
            }
        }
    }
    crate::real::close_raw(fd);
    Some(out)
}

/// `mountinfo`'s octal escapes (`\040` for a space) undone.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\' && i + 4 <= s.len() && s[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// The lanefs mounts of a `mountinfo` text, limited to `only` (`:`-separated mountpoints)
/// when given.
pub(crate) fn parse(text: &[u8], only: Option<&std::ffi::OsStr>) -> Table {
    struct Line {
        point: Vec<u8>,
        dev: (u32, u32),
        mnt_id: u64,
        parent: u64,
        lanefs: bool,
        /// Read-only or `nosymfollow` as a mount (field 6): the kernel's to enforce.
        restricted: bool,
        owner: u32,
    }
    let mut lines = Vec::new();
    for l in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let f: Vec<&[u8]> = l.split(|&b| b == b' ').collect();
        let Some(sep) = f.iter().position(|&x| x == b"-") else {
            continue;
        };
        if f.len() < 5 || f.len() < sep + 4 {
            continue;
        }
        let num = |b: &[u8]| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
        };
        let (Some(mnt_id), Some(parent)) = (num(f[0]), num(f[1])) else {
            continue;
        };
        let restricted = f[5]
            .split(|&b| b == b',')
            .any(|o| o == b"ro" || o == b"nosymfollow");
        let mut dev = f[2].split(|&b| b == b':');
        let (Some(major), Some(minor)) = (dev.next().and_then(num), dev.next().and_then(num))
        else {
            continue;
        };
        let owner = f[sep + 3]
            .split(|&b| b == b',')
            .find_map(|o| o.strip_prefix(b"user_id="))
            .and_then(num)
            .unwrap_or(0);
        let mut point = unescape(f[4]);
        while point.len() > 1 && point.ends_with(b"/") {
            point.pop();
        }
        lines.push(Line {
            point,
            dev: (major as u32, minor as u32),
            mnt_id,
            parent,
            lanefs: f[sep + 1] == b"fuse.lanefs" && f[3] == b"/",
            restricted,
            owner: owner as u32,
        });
    }
    let allowed = |p: &[u8]| match only {
        None => true,
        Some(list) => {
            use std::os::unix::ffi::OsStrExt;
            list.as_bytes()
                .split(|&b| b == b':')
                .any(|x| x.strip_suffix(b"/").unwrap_or(x) == p)
        }
    };
    let inside = |outer: &[u8], p: &[u8]| {
        p.len() > outer.len() && p.starts_with(outer) && p[outer.len()] == b'/'
    };
    // The mounts `m` is mounted on, up to the root of the table.
    let ancestors = |m: &Line| {
        let mut ids = Vec::new();
        let mut at = m.parent;
        while let Some(p) = lines.iter().find(|l| l.mnt_id == at) {
            if ids.contains(&p.mnt_id) {
                break;
            }
            ids.push(p.mnt_id);
            at = p.parent;
        }
        ids
    };
    let mut mounts = Vec::new();
    for m in lines
        .iter()
        .filter(|m| m.lanefs && !m.restricted && m.point != b"/")
    {
        // A mount on this one's point or on a directory above it that this one is not
        // mounted on covers it (it came later); one inside it is invisible to its server.
        let above = ancestors(m);
        let covered_or_nested = lines.iter().any(|o| {
            let over = o.point == m.point || o.point == b"/" || inside(&o.point, &m.point);
            !std::ptr::eq(o, m)
                && (inside(&m.point, &o.point) || over && !above.contains(&o.mnt_id))
        });
        if covered_or_nested || !allowed(&m.point) {
            continue;
        }
        mounts.push(Mount {
            point: m.point.clone(),
            dev: m.dev,
            mnt_id: m.mnt_id,
            owner: m.owner,
            retry_at: AtomicI64::new(i64::MIN),
        });
    }
    let devs = mounts
        .iter()
        .map(|m| libc::makedev(m.dev.0, m.dev.1))
        .collect();
    Table { mounts, devs }
}

impl Table {
    /// The mount holding absolute path `p`, and the rest of the path after its mountpoint
    /// (`.` for the mountpoint itself).
    pub(crate) fn find<'p>(&self, p: &'p [u8]) -> Option<(&Mount, &'p [u8])> {
        self.mounts.iter().find_map(|m| {
            let rest = p.strip_prefix(m.point.as_slice())?;
            if rest.is_empty() {
                return Some((m, &b"."[..]));
            }
            let rest = rest.strip_prefix(b"/")?;
            let trimmed = {
                let mut r = rest;
                while let Some(x) = r.strip_prefix(b"/") {
                    r = x;
                }
                r
            };
            Some((
                m,
                if trimmed.is_empty() {
                    &b"."[..]
                } else {
                    trimmed
                },
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &[u8] = b"22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
        40 22 0:40 / /mnt/l rw,nosuid,nodev - fuse.lanefs memory rw,user_id=0,group_id=0\n\
        41 22 0:41 / /mnt/with\\040space rw - fuse.lanefs memory rw,user_id=1000,group_id=1000\n\
        42 22 0:42 / /mnt/outer rw - fuse.lanefs memory rw,user_id=0\n\
        43 42 0:43 / /mnt/outer/inner rw - tmpfs tmpfs rw\n\
        44 22 0:44 /sub /mnt/bind rw - fuse.lanefs memory rw,user_id=0\n\
        45 22 0:45 / /mnt/other rw - fuse.sshfs host: rw,user_id=0\n\
        46 22 0:40 / /mnt/ro-bind ro,relatime - fuse.lanefs memory rw,user_id=0,group_id=0\n\
        47 22 0:40 / /mnt/nosym rw,nosymfollow - fuse.lanefs memory rw,user_id=0\n\
        48 22 0:48 / /x/anc/m rw - fuse.lanefs memory rw,user_id=0\n\
        49 22 0:49 / /x/anc rw - tmpfs tmpfs rw\n\
        50 22 0:50 / /y/m rw - fuse.lanefs memory rw,user_id=0\n\
        51 50 0:51 / /y/m rw - fuse.lanefs memory rw,user_id=0\n";

    #[test]
    fn lanefs_mounts_are_found_and_the_unservable_left_out() {
        let t = parse(INFO, None);
        let points: Vec<&[u8]> = t.mounts.iter().map(|m| m.point.as_slice()).collect();
        // Not: a read-only or nosymfollow bind mount (the kernel enforces those), a lanefs
        // covered by a later mount on a directory above it (/x/anc/m) or on its own point
        // (the first /y/m, under the second, which is mounted on it and so is served).
        assert_eq!(points, vec![&b"/mnt/l"[..], b"/mnt/with space", b"/y/m"]);
        assert_eq!(t.mounts[2].mnt_id, 51);
        assert_eq!(t.mounts[1].owner, 1000);
        assert_eq!(t.mounts[0].dev, (0, 40));
        let (m, rest) = t.find(b"/mnt/l/a/b").unwrap();
        assert_eq!((m.mnt_id, rest), (40, &b"a/b"[..]));
        assert_eq!(t.find(b"/mnt/l").unwrap().1, b".");
        assert_eq!(t.find(b"/mnt/l//x").unwrap().1, b"x");
        assert!(t.find(b"/mnt/lx").is_none());
        assert!(t.find(b"/mnt/outer/inner/f").is_none());
        let only = parse(INFO, Some(std::ffi::OsStr::new("/mnt/with space/")));
        assert_eq!(only.mounts.len(), 1);
    }
}
