//! What the server keeps of the kernel's cached directory listings: where each directory's
//! latest read from offset 0 ends and when it was made ([`ReadEnds`]), and the thread that
//! drops listings older than the entry timeout ([`expire_listings`]). The handlers that use
//! it are in `dirs.rs`; why listings are cached and when they are dropped, in docs/DESIGN.md
//! §7, "Directory listings".

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Release};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use lanefs::{DirEnd, Ino};

use crate::notify::KernelCache;

pub(super) const READ_END_SHARDS: usize = 16;

/// Per directory: where its latest read from offset 0 ends, and when that read was made while
/// its listing has not been dropped since.
pub(super) type ReadEnds = [EndShard; READ_END_SHARDS];

#[derive(Default)]
pub(super) struct EndShard {
    ends: Mutex<HashMap<u64, (DirEnd, Option<Instant>)>>,
    /// How many of `ends` have a time (changed only under `ends`' lock): while 0, a change of
    /// a directory in this shard has no listing to drop, and takes no lock to find that out.
    pub(super) listed: AtomicUsize,
}

impl EndShard {
    pub(super) fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, (DirEnd, Option<Instant>)>> {
        self.ends.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets when `ino`'s listing was read (its entry stays, for reads under way); true if
    /// it had a time.
    pub(super) fn unlist(
        ends: &mut HashMap<u64, (DirEnd, Option<Instant>)>,
        listed: &AtomicUsize,
        ino: u64,
    ) -> bool {
        match ends.get_mut(&ino) {
            Some((_, at @ Some(_))) => {
                *at = None;
                listed.fetch_sub(1, Release);
                true
            }
            _ => false,
        }
    }
}

/// Drops the kernel's cached listing of each directory read from offset 0 more than `ttl`
/// ago, every `ttl / 4`, until the server is gone (`stop` disconnects when it drops; the
/// thread holds nothing of the server's meanwhile, so the session's descriptor closes with
/// it). A listing served from the cache comes
/// without attributes, so once the entries it names have expired (the entry timeout is
/// `ttl`), a walk through it would revalidate each with a LOOKUP; read again, the directory
/// comes with READDIRPLUS, which refreshes every entry in one request per page. Only speed
/// depends on this: a listing is right however old it is (docs/DESIGN.md §7, "Directory
/// listings").
pub(super) fn expire_listings(
    ends: std::sync::Weak<ReadEnds>,
    kc: std::sync::Weak<OnceLock<KernelCache>>,
    ttl: Duration,
    stop: std::sync::mpsc::Receiver<()>,
) {
    let period = (ttl / 4).max(Duration::from_millis(100));
    loop {
        if stop.recv_timeout(period) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        let (Some(ends), Some(kc)) = (ends.upgrade(), kc.upgrade()) else {
            return;
        };
        let Some(kc) = kc.get() else {
            continue;
        };
        let mut old = Vec::new();
        for shard in ends.iter() {
            let mut map = shard.lock();
            for (ino, (_, at)) in map.iter_mut() {
                if at.is_some_and(|t| t.elapsed() >= ttl) {
                    *at = None; // until the directory is read from offset 0 again
                    shard.listed.fetch_sub(1, Release);
                    old.push(*ino);
                }
            }
        }
        for ino in old {
            kc.drop_listing(Ino(ino));
        }
    }
}
