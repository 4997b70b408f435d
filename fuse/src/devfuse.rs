//! The `/dev/fuse` transport: [`MountConfig::threads`](crate::MountConfig) threads, each
//! with its own descriptor cloned onto the session (`FUSE_DEV_IOC_CLONE`, so each has its
//! own processing queue in the kernel), each reading a request, answering it with one
//! `write`, and reading the next ([`dev_worker`]). A [`Pending`] writes its reply to the
//! descriptor its request came from (the kernel looks the request up in that descriptor's
//! queue).
//!
//! An io_uring session keeps one `/dev/fuse` thread too: the kernel sends FORGET,
//! BATCH_FORGET and INTERRUPT through `/dev/fuse` on either transport (it queues them outside
//! the ring), and takes notifications (`notify.rs`) only there.
//!
//! A reply or notification is one `write` ([`write_all_once`]), so replies from several
//! threads never interleave; a reply written after the session ended is dropped by the
//! kernel (ENOENT / ENODEV, ignored).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use zerocopy::IntoBytes;

use crate::abi::*;
use crate::dispatch::{Caller, Dispatch};
use crate::info::SessionInfo;
use crate::wire::{Answer, MAX_WRITE, Out, Pending, Request, out_header};

/// One `read` of `fd` into `buf`.
pub(crate) fn read(fd: &File, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the descriptor is open.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A read of `/dev/fuse` that should just be made again: interrupted by a signal, or the
/// request it would have returned was interrupted and is gone (ENOENT).
pub(crate) fn retry(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::ENOENT)
    )
}

/// Writes `b` to `fd` in one `write`.
pub(crate) fn write_all_once(fd: &File, b: &[u8]) -> io::Result<()> {
    // SAFETY: `b` is valid for `b.len()` bytes; the descriptor is open while `fd` lives.
    let n = unsafe { libc::write(fd.as_raw_fd(), b.as_ptr().cast(), b.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends a reply with no body and `errno` (0: success) for request `unique` to `fd`.
pub(crate) fn write_status(fd: &File, unique: u64, errno: i32) {
    // ENOENT: the request was interrupted and is gone; ENODEV: the session is.
    let _ = write_all_once(fd, out_header(unique, errno, 0).as_bytes());
}

/// Sends a successful reply with body `body` for request `unique` to `fd`.
pub(crate) fn write_reply(fd: &File, unique: u64, body: &[u8]) {
    let mut b = out_header(unique, 0, body.len()).as_bytes().to_vec();
    b.extend_from_slice(body);
    let _ = write_all_once(fd, &b);
}

/// A new descriptor for the session of `master`, with its own processing queue; `master`
/// itself where cloning fails.
pub(crate) fn clone_dev(master: &Arc<File>) -> Arc<File> {
    let Ok(f) = File::options().read(true).write(true).open("/dev/fuse") else {
        return master.clone();
    };
    let id = master.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the session's descriptor) from the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FUSE_DEV_IOC_CLONE, &id as *const u32) };
    if r != 0 {
        return master.clone();
    }
    Arc::new(f)
}

/// How long the `/dev/fuse` thread of an io_uring session waits after a FORGET before it
/// reads again (see [`dev_worker`]).
const FORGET_BATCH_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// Serves requests from one `/dev/fuse` descriptor until the session ends.
///
/// `side` marks the one `/dev/fuse` thread of an io_uring session, which gets only FORGET,
/// BATCH_FORGET and INTERRUPT. The kernel queues a FORGET for every inode it evicts (each
/// unlinked file's, in the caller's `unlink`) and wakes a reader blocked on the descriptor,
/// often on the other CPU: that wake-up cost the caller more than its whole FUSE request
/// did. So after a FORGET this thread waits [`FORGET_BATCH_WAIT`] before its next read:
/// forgets queued meanwhile wake nobody, and the next read takes them all as one
/// BATCH_FORGET. A FORGET only returns lookup references (an unlinked inode's number is
/// freed a millisecond later); an INTERRUPT is read and not acted on (`dispatch.rs`), so
/// neither is delayed at a cost to any caller. The one caller a FORGET can hold up, a
/// library change whose report waits for the kernel to let go of an inode
/// (`lanefs::notify`), cuts the wait short ([`Dispatch::forget_pause`]).
pub(crate) fn dev_worker(
    fd: Arc<File>,
    server: &dyn Dispatch,
    info: &SessionInfo,
    slot: usize,
    side: bool,
) {
    let mut inbuf = vec![0u8; MAX_WRITE + 4096];
    let hsz = size_of::<fuse_out_header>();
    let mut outbuf = vec![0u8; hsz + MAX_WRITE + 4096];
    loop {
        let n = match read(&fd, &mut inbuf) {
            Ok(n) => n,
            Err(e) if retry(&e) => continue,
            // ENODEV: unmounted or aborted.
            Err(_) => return,
        };
        info.count(slot);
        let Some(req) = Request::parse(&inbuf[..n]) else {
            continue;
        };
        let unique = req.h.unique;
        let (hbuf, body) = outbuf.split_at_mut(hsz);
        let mut out = Out::new(body);
        let later = || {
            let fd = fd.clone();
            Pending::new(move |e| write_status(&fd, unique, e))
        };
        match server.dispatch(&req, Caller::Kernel, &mut out, &later) {
            Answer::Reply(e) => {
                let h = out_header(unique, e, out.len());
                hbuf.copy_from_slice(h.as_bytes());
                if let Err(e) = write_all_once(&fd, &outbuf[..h.len as usize])
                    && e.raw_os_error() == Some(libc::ENODEV)
                {
                    return;
                }
            }
            Answer::Later | Answer::None => {
                if side && matches!(req.h.opcode, FUSE_FORGET | FUSE_BATCH_FORGET) {
                    server.forget_pause(FORGET_BATCH_WAIT);
                }
            }
        }
    }
}
