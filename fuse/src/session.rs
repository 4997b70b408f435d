//! A kernel session: INIT negotiation, the choice of transport, and serving the session
//! until it ends.
//!
//! No Rust FUSE crate serves requests through io_uring (fuser's issue 380), and fuser's
//! request decoding and reply types are private, so lanefs has its own session layer; the
//! structures of the protocol come from a crate (`abi.rs`), the ring from `io-uring`.
//! `fuser` is used only for its mount option type (`mount/`).
//!
//! [`init`] reads the kernel's INIT from the session's `/dev/fuse` descriptor and answers it
//! (what is asked for, and why: docs/DESIGN.md §7); [`serve`] then serves the session through
//! one of two transports, each a client of the dispatcher's one seam (`dispatch.rs`):
//! - **`/dev/fuse`** (`devfuse.rs`): [`MountConfig::threads`](crate::MountConfig) threads,
//!   each with its own cloned descriptor;
//! - **io_uring** (`uring.rs`), when the kernel offers `FUSE_OVER_IO_URING` (Linux 6.14 on,
//!   with `fuse.enable_uring=1`), the mount does not say `uring=off`, and this process can
//!   set up an io_uring ([`init`] tries one first). `uring=on` without it fails the mount
//!   (INIT refused, with the reason); `uring=auto` serves through `/dev/fuse`, saying why.
//!   FORGET, BATCH_FORGET and INTERRUPT still come through `/dev/fuse` (the kernel queues them
//!   outside the ring), so an io_uring session keeps one `/dev/fuse` thread for them.
//!
//! ## End of a session
//! The kernel ends a session when the filesystem is unmounted (a lazily detached mount: when
//! its last open file is closed) or aborted (`/sys/fs/fuse/connections/N/abort`): reads of
//! `/dev/fuse` then fail with ENODEV, ring entries complete with ENOTCONN, and each thread
//! exits; [`serve`] returns once every thread has. A reply written after that is dropped by
//! the kernel (ENOENT / ENODEV, ignored). A server that is killed leaves nothing behind: the
//! kernel aborts the session when the last `/dev/fuse` descriptor and ring are closed.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use zerocopy::{FromBytes, IntoBytes};

use crate::abi::*;
use crate::devfuse::{self, clone_dev, dev_worker, write_reply, write_status};
use crate::dispatch::Dispatch;
use crate::info::{COUNTER_SLOTS, SessionInfo};
use crate::wire::{MAX_WRITE, Request};

/// Pages per request asked for in INIT.
const MAX_PAGES: u16 = 256;
/// The newest ABI minor version whose structures this layer uses; the kernel's if older.
const MINOR: u32 = 40;

/// Which transport a mount uses (`-o uring=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Uring {
    /// io_uring when the kernel offers it, `/dev/fuse` otherwise.
    #[default]
    Auto,
    /// io_uring, or the mount fails.
    On,
    /// `/dev/fuse` only.
    Off,
}

impl std::str::FromStr for Uring {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Uring::Auto),
            "on" => Ok(Uring::On),
            "off" => Ok(Uring::Off),
            _ => Err(format!("bad uring '{s}' (on, off or auto)")),
        }
    }
}

impl Uring {
    /// The default: `auto`, or what the environment variable `LANEFS_URING` says (`on`,
    /// `off`, `auto`), so that a test run can put every mount it makes on one transport.
    pub fn from_env() -> Uring {
        std::env::var("LANEFS_URING")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}

/// What INIT settled.
#[derive(Debug)]
pub(crate) struct Negotiated {
    /// The kernel will take io_uring registrations.
    pub uring: bool,
    /// The kernel opens directories by itself (`FUSE_NO_OPENDIR_SUPPORT`): the dispatcher
    /// is to answer OPENDIR with ENOSYS (`server/`).
    pub no_opendir: bool,
    /// With `uring=auto`: the kernel offered io_uring, but this process cannot set up a ring
    /// (why), so it was not asked for.
    pub no_ring: Option<String>,
}

/// Reads INIT from `dev` and answers it: the capabilities the server needs (docs/DESIGN.md
/// §7, "What is negotiated with the kernel"), and io_uring if `mode` allows, the kernel offers it and
/// this process can set up a ring. With `Uring::On` and no io_uring, INIT is refused and the
/// error says why.
///
/// The ring is tried before io_uring is asked for because a session that settled on
/// io_uring has no way back to `/dev/fuse` short of a registration the kernel refuses:
/// until every queue has registered, Linux holds each new request of the session back
/// instead of sending it through `/dev/fuse` (`fuse_block_alloc`), and a server whose
/// `io_uring_setup(2)` is refused (`kernel.io_uring_disabled`, a container's seccomp
/// profile) could register nothing, leaving every request waiting.
pub(crate) fn init(dev: &File, mode: Uring) -> io::Result<Negotiated> {
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    loop {
        let n = match devfuse::read(dev, &mut buf) {
            Ok(n) => n,
            Err(e) if devfuse::retry(&e) => continue,
            Err(e) => return Err(e),
        };
        let Some(req) = Request::parse(&buf[..n]) else {
            continue;
        };
        if req.h.opcode != FUSE_INIT {
            // Nothing comes before INIT; answer whatever does and wait for it.
            write_status(dev, req.h.unique, libc::EIO);
            continue;
        }
        let (major, minor, max_readahead, offered) =
            match fuse_init_in_ext::read_from_prefix(req.arg) {
                Ok((i, _)) => {
                    let high = if u64::from(i.flags) & FUSE_INIT_EXT != 0 {
                        u64::from(i.flags2) << 32
                    } else {
                        0
                    };
                    (i.major, i.minor, i.max_readahead, u64::from(i.flags) | high)
                }
                Err(_) => match req.arg::<fuse_init_in>() {
                    Ok(i) => (i.major, i.minor, i.max_readahead, u64::from(i.flags)),
                    Err(_) => {
                        write_status(dev, req.h.unique, libc::EINVAL);
                        continue;
                    }
                },
            };
        let mut out = fuse_init_out_ext {
            major: FUSE_KERNEL_VERSION,
            minor: MINOR.min(minor),
            ..Default::default()
        };
        if major > FUSE_KERNEL_VERSION {
            // The kernel sends INIT again with major 7.
            write_reply(
                dev,
                req.h.unique,
                &out.as_bytes()[..FUSE_COMPAT_22_INIT_OUT_SIZE],
            );
            continue;
        }
        if major < FUSE_KERNEL_VERSION || minor < 12 {
            write_status(dev, req.h.unique, libc::EPROTO);
            return Err(io::Error::other(format!(
                "the kernel speaks FUSE {major}.{minor}; lanefs needs 7.12 or newer"
            )));
        }
        let uring_offered = offered & FUSE_OVER_IO_URING != 0;
        if mode == Uring::On && !uring_offered {
            write_status(dev, req.h.unique, libc::EPROTO);
            return Err(io::Error::other(format!("uring=on: {}", why_no_uring())));
        }
        let no_ring = match mode {
            Uring::Off => None,
            _ if !uring_offered => None,
            _ => crate::uring::probe()
                .err()
                .map(|e| why_registration_failed(&e)),
        };
        if let (Uring::On, Some(why)) = (mode, &no_ring) {
            write_status(dev, req.h.unique, libc::EPROTO);
            return Err(io::Error::other(format!(
                "uring=on: the kernel offers FUSE over io_uring, but this process cannot set \
                 up an io_uring: {why}"
            )));
        }
        let mut want = u64::from(
            FUSE_ASYNC_READ
                | FUSE_BIG_WRITES
                | FUSE_MAX_PAGES
                | FUSE_PARALLEL_DIROPS
                | FUSE_DO_READDIRPLUS
                | FUSE_READDIRPLUS_AUTO
                | FUSE_CACHE_SYMLINKS
                | FUSE_POSIX_ACL
                | FUSE_DONT_MASK
                | FUSE_EXPORT_SUPPORT,
        ) | FUSE_HANDLE_KILLPRIV_V2;
        if mode != Uring::Off && no_ring.is_none() {
            want |= FUSE_OVER_IO_URING;
        }
        let flags = (want & offered) | FUSE_INIT_EXT;
        out.max_readahead = max_readahead;
        out.flags = flags as u32;
        out.flags2 = (flags >> 32) as u32;
        out.max_background = 16;
        out.congestion_threshold = 12;
        out.max_write = MAX_WRITE as u32;
        out.time_gran = 1;
        out.max_pages = MAX_PAGES;
        let body = if minor < 23 {
            &out.as_bytes()[..FUSE_COMPAT_22_INIT_OUT_SIZE]
        } else {
            out.as_bytes()
        };
        write_reply(dev, req.h.unique, body);
        return Ok(Negotiated {
            uring: flags & FUSE_OVER_IO_URING != 0,
            no_opendir: offered & u64::from(FUSE_NO_OPENDIR_SUPPORT) != 0,
            no_ring,
        });
    }
}

/// The kernel's switch for FUSE over io_uring (present where it was built with
/// `CONFIG_FUSE_IO_URING`, Linux 6.14 on).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why the kernel did not offer `FUSE_OVER_IO_URING` in INIT, for the error of `uring=on`.
fn why_no_uring() -> String {
    match std::fs::read_to_string(ENABLE_URING) {
        Err(_) => "this kernel has no FUSE over io_uring (Linux 6.14 or newer built with \
                   CONFIG_FUSE_IO_URING is needed; or mount with uring=auto or uring=off)"
            .into(),
        Ok(v) if v.trim() == "N" => format!(
            "FUSE over io_uring is turned off in this kernel (fuse.enable_uring is N; as \
             root: echo Y > {ENABLE_URING}; or mount with uring=auto or uring=off)"
        ),
        // Turned on since the kernel sent INIT.
        Ok(_) => "the kernel did not offer FUSE over io_uring for this mount \
                  (fuse.enable_uring was off when it was made)"
            .into(),
    }
}

/// `e`, an error setting up or registering an io_uring, with the kernel setting that explains
/// it.
fn why_registration_failed(e: &io::Error) -> String {
    const DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";
    let setting = |p: &str| std::fs::read_to_string(p).map(|v| v.trim().to_string());
    match e.raw_os_error() {
        // io_uring_setup(2) refused: io_uring is disabled (2) or limited to a group (1).
        Some(libc::EPERM) => match setting(DISABLED) {
            Ok(v) if v != "0" => format!("{e}: kernel.io_uring_disabled is {v}"),
            _ => format!(
                "{e}: io_uring_setup(2) is refused to this process (a seccomp filter, as \
                 container runtimes install, or a security module)"
            ),
        },
        // The kernel's FUSE refuses ring commands on a connection made without io_uring.
        Some(libc::EOPNOTSUPP) if setting(ENABLE_URING).is_ok_and(|v| v == "N") => {
            format!("{e}: fuse.enable_uring is N")
        }
        _ => e.to_string(),
    }
}

/// Serves the session of `dev` (INIT answered) on `threads` `/dev/fuse` threads (or io_uring,
/// `uring.rs`) until it ends.
pub(crate) fn serve(
    dev: Arc<File>,
    server: Arc<dyn Dispatch>,
    info: Arc<SessionInfo>,
    neg: Negotiated,
    threads: usize,
    mode: Uring,
) -> io::Result<()> {
    let ended = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let spawn_dev =
        |slot: usize, fd: Arc<File>, side: bool, handles: &mut Vec<_>| -> io::Result<()> {
            let (server, info, ended) = (server.clone(), info.clone(), ended.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("lanefs-dev{slot}"))
                    .spawn(move || {
                        dev_worker(fd, &*server, &info, slot, side);
                        ended.store(true, Ordering::Release);
                    })?,
            );
            Ok(())
        };
    if let Some(why) = &neg.no_ring {
        eprintln!("lanefs: io_uring cannot be set up ({why}); serving through /dev/fuse");
    }
    if neg.uring {
        match crate::uring::start(&dev, &server, &info, &ended) {
            Ok(ring) => {
                info.set_transport(true, ring.queues());
                // FORGET and INTERRUPT still come through /dev/fuse.
                spawn_dev(COUNTER_SLOTS - 1, dev.clone(), true, &mut handles)?;
                for h in handles {
                    let _ = h.join();
                }
                ring.stop_and_join();
                return Ok(());
            }
            Err(e) if mode == Uring::On || !e.fell_back => {
                // Serve what reaches /dev/fuse while the caller unmounts: with the kernel
                // fallen back, what is in flight; otherwise nothing (new requests wait for a
                // ring that will not come, and fail when the session ends).
                spawn_dev(0, dev.clone(), false, &mut handles)?;
                std::mem::forget(handles);
                let why = why_registration_failed(&e.error);
                return Err(io::Error::other(if mode == Uring::On {
                    format!("uring=on: io_uring registration failed: {why}")
                } else {
                    format!(
                        "io_uring registration failed ({why}), and the kernel still waits for \
                         it: the mount cannot be served"
                    )
                }));
            }
            Err(e) => {
                eprintln!(
                    "lanefs: io_uring registration failed ({}); serving through /dev/fuse",
                    why_registration_failed(&e.error)
                );
            }
        }
    }
    info.set_transport(false, 0);
    for slot in 0..threads.max(1) {
        let fd = if slot == 0 {
            dev.clone()
        } else {
            clone_dev(&dev)
        };
        spawn_dev(slot, fd, false, &mut handles)?;
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}
