//! The credentials of a request's caller.
//!
//! A FUSE request carries the caller's uid, gid and pid, not its supplementary groups or its
//! capabilities, which the engine's permission checks need (the kernel checks permissions
//! too, with the full list and the capabilities, `default_permissions`; lanefs checks again
//! so that the library is safe on its own, and the two must agree: a user granted
//! `CAP_DAC_OVERRIDE` writes where its uid may not). Both are read from `/proc/PID/status`
//! here, before the engine is called, so no engine lock is ever held across file I/O.
//!
//! Reading `/proc` costs several microseconds, more than most requests, so each request
//! thread keeps the groups of the last processes it served, keyed by (pid, uid, gid), for
//! one second. A process that changes its groups (rare: `setgroups` needs privileges) may be
//! judged with its old groups for up to a second by lanefs's second check; the kernel's own
//! check, made before the request is sent, always uses the current ones.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use lanefs::Ctx;
use smallvec::SmallVec;

type Groups = SmallVec<[u32; 8]>;

/// How long a thread trusts the groups it read for a process.
const TTL: Duration = Duration::from_secs(1);
/// Processes a thread remembers.
const ENTRIES_MAX: usize = 64;

/// What `/proc/PID/status` says of a caller: its groups and effective capabilities (None:
/// unreadable, and the engine goes by the uid).
#[derive(Clone)]
struct Status {
    groups: Groups,
    caps: Option<u64>,
}

struct Cached {
    key: (u32, u32, u32),
    read_at: Instant,
    status: Status,
}

thread_local! {
    static CACHE: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

/// Supplementary groups and effective capabilities of process `pid` from
/// `/proc/PID/status` (no groups and no word on capabilities if unreadable: the process is
/// gone, or pid 0 for the kernel itself).
fn read_status(pid: u32) -> Status {
    let none = Status {
        groups: Groups::new(),
        caps: None,
    };
    if pid == 0 {
        return none;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return none;
    };
    let s = parse_status(&status);
    Status {
        groups: s.groups,
        caps: s.caps,
    }
}

/// What the engine's checks need of a `/proc/PID/status` (or `/proc/PID/task/TID/status`)
/// text; None for a field it lacks.
pub(crate) struct ProcStatus {
    /// The filesystem user and group ids (the fourth of `Uid:` and `Gid:`).
    pub fs_ids: Option<(u32, u32)>,
    /// The supplementary groups (`Groups:`).
    pub groups: Groups,
    /// The effective capabilities (`CapEff:`).
    pub caps: Option<u64>,
}

pub(crate) fn parse_status(status: &str) -> ProcStatus {
    let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key));
    let ids = |key: &str| -> Groups {
        field(key)
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    // Real, effective, saved, filesystem: the filesystem ids decide access.
    let fs_ids = ids("Uid:").get(3).copied().zip(ids("Gid:").get(3).copied());
    ProcStatus {
        fs_ids,
        groups: ids("Groups:"),
        caps: field("CapEff:").and_then(|h| u64::from_str_radix(h.trim(), 16).ok()),
    }
}

/// What `/proc` says of the caller `(pid, uid, gid)`, from this thread's cache or `/proc`.
fn status(pid: u32, uid: u32, gid: u32) -> Status {
    let key = (pid, uid, gid);
    let now = Instant::now();
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(e) = c.iter().find(|e| e.key == key) {
            if now.duration_since(e.read_at) < TTL {
                return e.status.clone();
            }
        }
        let status = read_status(pid);
        c.retain(|e| e.key != key && now.duration_since(e.read_at) < TTL);
        if c.len() >= ENTRIES_MAX {
            c.remove(0);
        }
        c.push(Cached {
            key,
            read_at: now,
            status: status.clone(),
        });
        status
    })
}

/// The engine context of a request from `(uid, gid, pid)`, made by the kernel on the
/// caller's behalf ([`lanefs::Via::Kernel`]), umask 0: a MKNOD or MKDIR sets the umask
/// the request carries (`FUSE_DONT_MASK`: the engine applies it, or the parent's default ACL
/// instead).
pub(crate) fn ctx(uid: u32, gid: u32, pid: u32) -> Ctx {
    let s = status(pid, uid, gid);
    let c = Ctx::user(uid, gid).with_groups(&s.groups).via_kernel();
    match s.caps {
        Some(caps) => c.with_caps(caps),
        None => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_this_process_match_getgroups() {
        // SAFETY: getgroups with size 0 only returns the count.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        let mut want = vec![0 as libc::gid_t; n.max(0) as usize];
        // SAFETY: `want` has room for `n` entries.
        let n = unsafe { libc::getgroups(n, want.as_mut_ptr()) };
        want.truncate(n.max(0) as usize);
        let mut got = status(std::process::id(), 1000, 1000).groups.to_vec();
        got.sort();
        want.sort();
        want.dedup();
        got.dedup();
        assert_eq!(got, want);
        assert!(read_status(0).groups.is_empty(), "the kernel itself");
        let c = ctx(5, 6, 0);
        assert_eq!((c.uid, c.gid, c.via), (5, 6, lanefs::Via::Kernel));
        assert!(!c.keeps_setid);
    }
}
