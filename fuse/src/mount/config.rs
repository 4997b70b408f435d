//! How to mount: [`MountConfig`].

use std::time::Duration;

use fuser::MountOption;

use crate::session::Uring;

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Entry and attribute cache timeout given to the kernel.
    pub ttl: Duration,
    /// Request threads (default: one per CPU; more only adds wake-ups on an idle machine).
    pub threads: usize,
    /// Let other users use the mount (`allow_other`).
    pub allow_other: bool,
    /// Mount read-only.
    pub read_only: bool,
    /// Shown as the mount's source (`fsname`).
    pub source: String,
    /// Kernel mount flags (nosuid, nodev, noexec, sync, ...).
    pub flags: Vec<MountOption>,
    /// The transport (`-o uring=`): io_uring when the kernel offers it (`auto`, the default
    /// unless `LANEFS_URING` says otherwise, [`Uring::from_env`]), always (`on`: the mount
    /// fails without it), or never (`off`: `/dev/fuse`).
    pub uring: Uring,
    /// Serve the channel of `lanefs run` (`-o nochannel` turns it off): programs run under
    /// `lanefs run` reach the server directly for the calls it serves (`channel.rs`).
    pub channel: bool,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            ttl: Duration::from_secs(60),
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            allow_other: false,
            read_only: false,
            source: "lanefs".into(),
            flags: Vec::new(),
            uring: Uring::from_env(),
            channel: true,
        }
    }
}
