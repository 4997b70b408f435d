//! The io_uring transport (`FUSE_OVER_IO_URING`, Linux 6.14 on; the kernel's
//! `Documentation/filesystems/fuse-io-uring.rst`).
//!
//! lanefs's own code: no Rust crate implements the FUSE side of this protocol (the `io-uring`
//! crate gives the ring itself, and is used for it).
//!
//! ## Protocol
//! The kernel keeps one queue per possible CPU and puts a request on the queue of the CPU
//! its caller runs on; it switches the session to the ring only once every queue has at
//! least one registered entry. Until then it holds every new request of the session back
//! (`fuse_block_alloc`: they are not sent through `/dev/fuse` either), unless a registration
//! fails in the kernel, which turns io_uring off for the session: requests then come through
//! `/dev/fuse`. A server that cannot register at all must therefore not ask for io_uring
//! (INIT tries a ring first, [`probe`]), and one whose queues fail to start makes the kernel
//! refuse a registration on purpose ([`give_up`]). An entry is two buffers the server owns: a
//! [`fuse_uring_req_header`] (the in/out header, the opcode's argument structure, and the
//! commit id and payload size) and a payload buffer of at least the session's largest
//! request. `FUSE_IO_URING_CMD_REGISTER` (an `IORING_OP_URING_CMD` in a 128-byte SQE on the
//! `/dev/fuse` descriptor, the two buffers as an iovec array in `addr`/`len`) hands an entry
//! to its queue; it completes when the kernel has copied a request into it.
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` (with the request's commit id) makes the kernel read
//! the reply from the same buffers (the out header in the header buffer, the reply's body in
//! the payload, its size in `ring_ent_in_out.payload_sz`) and hand the entry the next request.
//! The kernel copies a request into the entry in the task that submitted the command, so
//! each queue is one thread with its own ring (`IORING_SETUP_SINGLE_ISSUER |
//! IORING_SETUP_DEFER_TASKRUN`: the copy runs when the thread waits for completions).
//!
//! ## Threads
//! One thread per queue, pinned to the queue's CPU, with [`DEPTH`] entries, of the
//! SCHED_IDLE policy under a guard where the guard can run (`handoff.rs`: so that the caller
//! a reply wakes stays on the queue's CPU). It waits for
//! completions, serves every request that arrived, and submits all their commits in the next
//! wait (one system call for a batch). A request answered later (FSYNC waiting for group
//! commit, [`Pending`]) keeps its entry; the queue goes on with its other entries, and the
//! answer comes back through the queue's mailbox: the answering thread pushes (entry, errno)
//! under the mailbox lock (a leaf lock: the crate doc, "Locks") and writes the queue's eventfd, whose
//! pending read wakes the queue thread, which commits the entry.
//!
//! ## Memory
//! The kernel writes an entry's buffers while the thread is inside `io_uring_enter`, and only
//! between the submission of a command and its completion; the thread reads and writes an
//! entry only after its completion and before its next commit. The buffers are raw
//! allocations (not references the compiler could assume unchanged across a system call),
//! freed only after the queue's thread has exited, when the kernel has cancelled its commands.
//!
//! ## End
//! When the session ends the kernel completes the entries it holds with ENOTCONN; the
//! `/dev/fuse` thread sees ENODEV, and [`Ring::stop_and_join`] wakes every queue, which exits
//! (closing its ring cancels what is still registered).

use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use zerocopy::{FromBytes, IntoBytes};

use crate::abi::*;
use crate::dispatch::{Caller, Dispatch};
use crate::handoff::Guard;
use crate::info::SessionInfo;
use crate::wire::{Answer, MAX_WRITE, Out, Pending, Request, arg_size, out_header};

/// Entries per queue: requests a queue can hold at once (served or waiting for a later
/// answer).
pub(crate) const DEPTH: usize = 16;
/// `user_data` of the eventfd read.
const WAKE: u64 = u64::MAX;
/// Requests whose data is at most this long have it copied out of the payload, so that the
/// reply can be written straight into the payload; longer data (WRITE, a large SETXATTR
/// value) is read in place and its (small) reply written to a side buffer first.
const COPY_DATA_MAX: usize = 4096;
/// The side buffer's size: the largest reply to a request with long data.
const SIDE_MAX: usize = 64 * 1024;

/// The running queues of one session.
pub(crate) struct Ring {
    queues: Vec<(Arc<Mailbox>, JoinHandle<Buffers>)>,
    ended: Arc<AtomicBool>,
    /// The queue threads' guard and its thread (`handoff.rs`), where they run SCHED_IDLE.
    guard: Option<(Arc<Guard>, JoinHandle<()>)>,
}

impl Ring {
    pub(crate) fn queues(&self) -> usize {
        self.queues.len()
    }

    /// Wakes every queue to see that the session ended, waits for their threads, and frees
    /// their buffers.
    pub(crate) fn stop_and_join(self) {
        self.ended.store(true, Ordering::Release);
        if let Some((g, h)) = self.guard {
            g.stop();
            drop(h.join());
        }
        for (m, _) in &self.queues {
            m.wake();
        }
        for (_, h) in self.queues {
            // The thread has exited: the kernel cancelled its commands, the buffers are free.
            drop(h.join());
        }
    }
}

/// Answers handed to a queue by other threads.
struct Mailbox {
    /// (entry, errno) of each [`Pending`] answered.
    done: Mutex<Vec<(u16, i32)>>,
    efd: OwnedFd,
}

impl Mailbox {
    fn post(&self, ent: u16, errno: i32) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((ent, errno));
        self.wake();
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to an eventfd we own.
        unsafe { libc::write(self.efd.as_raw_fd(), (&raw const one).cast(), 8) };
    }
}

/// A raw, zeroed allocation the kernel may write into (see the module doc, "Memory").
struct Raw {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: `Raw` is plain memory owned by one queue thread at a time (moved to it, and back to
// the joining thread after it exits).
unsafe impl Send for Raw {}

impl Raw {
    fn new(len: usize) -> Raw {
        let layout = Layout::from_size_align(len.max(8), 4096).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Raw { ptr, layout }
    }

    /// The buffer as a slice.
    ///
    /// # Safety
    /// The kernel must not be writing it: its entry has completed and not been committed
    /// again, and no other slice of it is alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes(&self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `layout.size()` bytes; exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `Raw::new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// One ring entry's memory.
struct Ent {
    header: Raw,
    payload: Raw,
    /// The iovec array REGISTER points to.
    iov: Raw,
    /// The commit id of the request the entry holds.
    commit_id: u64,
}

/// Everything the kernel may write into, kept until the queue's thread has exited.
struct Buffers {
    ents: Vec<Ent>,
    _wake_buf: Raw,
}

/// The possible CPUs (`/sys/devices/system/cpu/possible`, e.g. `0-3,8`): the kernel makes
/// one queue for each.
fn possible_cpus() -> usize {
    let Ok(s) = std::fs::read_to_string("/sys/devices/system/cpu/possible") else {
        return std::thread::available_parallelism().map_or(1, |n| n.get());
    };
    s.trim()
        .split(',')
        .filter_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            Some(b.parse::<usize>().ok()?.max(a.parse::<usize>().ok()?) + 1)
        })
        .max()
        .unwrap_or(1)
}

/// Whether this process can set up a ring as the queues do (`io_uring_setup(2)` may be
/// refused: `kernel.io_uring_disabled`, a seccomp filter).
pub(crate) fn probe() -> io::Result<()> {
    new_ring(8).map(drop)
}

/// Why the queues did not start.
#[derive(Debug)]
pub(crate) struct StartError {
    pub error: io::Error,
    /// The kernel has turned io_uring off for the session and sends its requests through
    /// `/dev/fuse`; false: it still holds them back for a ring that will not come, until the
    /// session ends.
    pub fell_back: bool,
}

/// Makes the kernel stop waiting for the ring of the session of `dev`: a REGISTER for a
/// queue that does not exist, which it refuses, turning io_uring off for the session (a
/// refused registration does that; requests then come through `/dev/fuse`). Ok when the
/// kernel refused it.
fn give_up(dev: &File) -> io::Result<()> {
    let mut ring = new_ring(2)?;
    let iov = Raw::new(2 * size_of::<libc::iovec>());
    // Checked before anything else the command names: no queue has this number.
    let e = register_sqe(dev.as_raw_fd(), u16::MAX, &iov).user_data(0);
    push(&mut ring, &e)?;
    ring.submit_and_wait(1)?;
    let r = ring.completion().next().map_or(0, |c| c.result());
    drop(ring);
    if r < 0 {
        Ok(())
    } else {
        Err(io::Error::other(
            "the kernel took a registration for no queue",
        ))
    }
}

/// Starts one queue per possible CPU on the session of `dev` (INIT answered with
/// `FUSE_OVER_IO_URING`); returns once each has registered its entries, or the first error
/// (then the kernel serves the session through `/dev/fuse`, if it could be made to give up
/// on the ring).
pub(crate) fn start(
    dev: &Arc<File>,
    server: &Arc<dyn Dispatch>,
    info: &Arc<SessionInfo>,
    ended: &Arc<AtomicBool>,
) -> Result<Ring, StartError> {
    start_queues(dev, server, info, ended).map_err(|error| {
        // A registration the kernel refused has turned io_uring off already; one that never
        // reached it (a ring not set up) has not, and the session's requests wait.
        let fell_back = give_up(dev).is_ok();
        StartError { error, fell_back }
    })
}

fn start_queues(
    dev: &Arc<File>,
    server: &Arc<dyn Dispatch>,
    info: &Arc<SessionInfo>,
    ended: &Arc<AtomicBool>,
) -> io::Result<Ring> {
    let n = possible_cpus();
    let payload = MAX_WRITE.max(8192);
    let guard = Guard::new(info);
    let mut ring = Ring {
        queues: Vec::new(),
        ended: ended.clone(),
        guard: None,
    };
    let mut readies = Vec::new();
    for qid in 0..n {
        // SAFETY: eventfd has no memory preconditions.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mailbox = Arc::new(Mailbox {
            done: Mutex::new(Vec::new()),
            // SAFETY: `efd` is a new descriptor nothing else owns.
            efd: unsafe { OwnedFd::from_raw_fd(efd) },
        });
        let (tx, rx) = mpsc::channel();
        let (dev, server, info, ended, mb, guard) = (
            dev.clone(),
            server.clone(),
            info.clone(),
            ended.clone(),
            mailbox.clone(),
            guard.clone(),
        );
        let h = std::thread::Builder::new()
            .name(format!("lanefs-q{qid}"))
            .spawn(move || {
                queue_main(qid, payload, &dev, &*server, &info, &ended, mb, guard, tx)
            })?;
        ring.queues.push((mailbox, h));
        readies.push(rx);
    }
    for rx in readies {
        let r = rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("a queue thread died")));
        if let Err(e) = r {
            ring.stop_and_join();
            return Err(e);
        }
    }
    if let Some(g) = guard {
        // Without its guard the queue threads keep the normal policy: they are made
        // SCHED_IDLE only by the guard.
        if let Ok(h) = g.start() {
            info.set_sched_idle();
            ring.guard = Some((g, h));
        }
    }
    Ok(ring)
}

/// Pins the calling thread to `cpu` (best effort: an offline CPU's queue is served anyway).
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit of `set`; `cpu` is below CPU_SETSIZE or ignored.
    unsafe {
        if cpu < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// A URING_CMD on `fd`: `cmd_op` for queue `qid` with `commit_id`.
fn uring_cmd(fd: i32, cmd_op: u32, qid: u16, commit_id: u64) -> opcode::UringCmd80 {
    let req = fuse_uring_cmd_req {
        flags: 0,
        commit_id,
        qid,
        padding: [0; 6],
    };
    let mut cmd = [0u8; 80];
    cmd[..size_of::<fuse_uring_cmd_req>()].copy_from_slice(req.as_bytes());
    opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd)
}

/// The REGISTER command of an entry: `addr` is its iovec array, `len` the count (2).
/// `io-uring` 0.7's `UringCmd80` sets `addr` but not `len`, so the SQE's `len` field (bytes
/// 24..28 of `struct io_uring_sqe`) is set on the built entry's bytes.
fn register_sqe(fd: i32, qid: u16, iov: &Raw) -> squeue::Entry128 {
    let e = uring_cmd(fd, FUSE_IO_URING_CMD_REGISTER, qid, 0)
        .addr(Some(iov.ptr as u64))
        .build();
    // SAFETY: `Entry128` is `repr(C)`, 128 bytes of plain data (a 64-byte `io_uring_sqe` and
    // 64 bytes of command); every bit pattern is a valid value of both types.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

type Uring = IoUring<squeue::Entry128, cqueue::Entry>;

fn new_ring(entries: u32) -> io::Result<Uring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
        .or_else(|_| IoUring::builder().build(entries))
}

/// Pushes `e`, submitting first if the submission queue is full.
fn push(ring: &mut Uring, e: &squeue::Entry128) -> io::Result<()> {
    loop {
        // SAFETY: every buffer an entry names (iovecs, entry buffers, the eventfd read's u64)
        // lives in `Buffers`, which outlives the ring (module doc, "Memory").
        if unsafe { ring.submission().push(e) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

#[allow(clippy::too_many_arguments)]
fn queue_main(
    qid: usize,
    payload: usize,
    dev: &File,
    server: &dyn Dispatch,
    info: &SessionInfo,
    ended: &AtomicBool,
    mailbox: Arc<Mailbox>,
    guard: Option<Arc<Guard>>,
    ready: mpsc::Sender<io::Result<()>>,
) -> Buffers {
    pin(qid);
    // A thread the guard cannot watch keeps the normal policy. The enrolment ends when this
    // function returns, before the thread exits.
    let enrolment = guard.and_then(|g| g.enrol().ok());
    let guard = enrolment.as_ref().map(|e| e.guard());
    let ents: Vec<Ent> = (0..DEPTH)
        .map(|_| {
            let header = Raw::new(size_of::<fuse_uring_req_header>());
            let payload = Raw::new(payload);
            let iov = Raw::new(2 * size_of::<libc::iovec>());
            let v = [
                libc::iovec {
                    iov_base: header.ptr.cast(),
                    iov_len: size_of::<fuse_uring_req_header>(),
                },
                libc::iovec {
                    iov_base: payload.ptr.cast(),
                    iov_len: payload.layout.size(),
                },
            ];
            // SAFETY: `iov` holds room for two iovecs, suitably aligned (4096).
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), iov.ptr.cast(), 2) };
            Ent {
                header,
                payload,
                iov,
                commit_id: 0,
            }
        })
        .collect();
    let mut bufs = Buffers {
        ents,
        _wake_buf: Raw::new(8),
    };
    let fail = |e: io::Error| {
        let _ = ready.send(Err(e));
    };
    let mut ring = match new_ring((2 * DEPTH + 8) as u32) {
        Ok(r) => r,
        Err(e) => {
            fail(e);
            return bufs;
        }
    };
    let fd = dev.as_raw_fd();
    let q = qid as u16;
    let wake_sqe = opcode::Read::new(types::Fd(mailbox.efd.as_raw_fd()), bufs._wake_buf.ptr, 8)
        .build()
        .user_data(WAKE)
        .into();
    for (i, ent) in bufs.ents.iter().enumerate() {
        let e = register_sqe(fd, q, &ent.iov).user_data(i as u64);
        if let Err(e) = push(&mut ring, &e) {
            fail(e);
            return bufs;
        }
    }
    if let Err(e) = push(&mut ring, &wake_sqe).and_then(|()| ring.submit().map(drop)) {
        fail(e);
        return bufs;
    }
    // A registration the kernel refused completes at once with its error; one that it took
    // completes only when a request arrives.
    let mut backlog: Vec<(u64, i32)> = ring
        .completion()
        .map(|c| (c.user_data(), c.result()))
        .collect();
    if let Some(&(_, r)) = backlog.iter().find(|&&(u, r)| u != WAKE && r < 0) {
        fail(io::Error::from_raw_os_error(-r));
        return bufs;
    }
    let _ = ready.send(Ok(()));
    drop(ready);

    let mut live = DEPTH;
    let mut side = vec![0u8; SIDE_MAX];
    let mut copy = vec![0u8; COPY_DATA_MAX];
    loop {
        if !backlog.is_empty()
            && let Some(g) = &guard
        {
            g.touch();
        }
        for (u, r) in std::mem::take(&mut backlog) {
            if u == WAKE {
                let done =
                    std::mem::take(&mut *mailbox.done.lock().unwrap_or_else(|e| e.into_inner()));
                for (i, errno) in done {
                    let ent = &bufs.ents[i as usize];
                    // SAFETY: the entry holds a request answered later: the kernel is not
                    // writing it until this commit.
                    let h = unsafe { ent.header.bytes() };
                    set_reply(h, ent.commit_id, errno, 0);
                    let c = uring_cmd(fd, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, q, ent.commit_id)
                        .build()
                        .user_data(u64::from(i));
                    if push(&mut ring, &c).is_err() {
                        return bufs;
                    }
                }
                if ended.load(Ordering::Acquire) || push(&mut ring, &wake_sqe).is_err() {
                    return bufs;
                }
                continue;
            }
            let i = u as usize;
            if r < 0 || i >= DEPTH {
                // ENOTCONN / ECANCELED: the session is ending and the kernel gave the entry
                // back.
                live -= 1;
                continue;
            }
            info.count(qid);
            let ent = &mut bufs.ents[i];
            let mb = mailbox.clone();
            let later = move || {
                let mb = mb.clone();
                Pending::new(move |e| mb.post(i as u16, e))
            };
            // SAFETY: the entry has completed: it holds a request and the kernel does not
            // touch it until it is committed below (or by the mailbox).
            let (h, p) = unsafe { (ent.header.bytes(), ent.payload.bytes()) };
            match serve_entry(server, h, p, &mut side, &mut copy, &later) {
                Some(commit_id) => {
                    ent.commit_id = commit_id;
                    let c = uring_cmd(fd, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, q, commit_id)
                        .build()
                        .user_data(u);
                    if push(&mut ring, &c).is_err() {
                        return bufs;
                    }
                }
                None => {
                    // Answered later: remember whom to commit for.
                    let io = ent_in_out(h);
                    ent.commit_id = io.commit_id;
                }
            }
        }
        if live == 0 || ended.load(Ordering::Acquire) {
            return bufs;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(_) => return bufs,
        }
        backlog.extend(ring.completion().map(|c| (c.user_data(), c.result())));
    }
}

fn ent_in_out(h: &[u8]) -> fuse_uring_ent_in_out {
    fuse_uring_ent_in_out::read_from_prefix(&h[FUSE_URING_ENT_IN_OUT_OFFSET..])
        .map(|(x, _)| x)
        .unwrap_or_default()
}

/// Writes the out header (`errno`, body of `len` bytes) of request `unique` into an entry's
/// header buffer.
fn set_reply(h: &mut [u8], unique: u64, errno: i32, len: usize) {
    let oh = out_header(unique, errno, len);
    h[..size_of::<fuse_out_header>()].copy_from_slice(oh.as_bytes());
    let mut io = ent_in_out(h);
    io.payload_sz = oh.len - size_of::<fuse_out_header>() as u32;
    h[FUSE_URING_ENT_IN_OUT_OFFSET
        ..FUSE_URING_ENT_IN_OUT_OFFSET + size_of::<fuse_uring_ent_in_out>()]
        .copy_from_slice(io.as_bytes());
}

/// Serves the request in an entry (`h`, its header buffer; `p`, its payload) and writes the
/// reply into it; returns the commit id to commit now, or `None` when a [`Pending`] answers
/// it later.
fn serve_entry(
    server: &dyn Dispatch,
    h: &mut [u8],
    p: &mut [u8],
    side: &mut [u8],
    copy: &mut [u8],
    later: &dyn Fn() -> Pending,
) -> Option<u64> {
    let io = ent_in_out(h);
    let Ok((ih, _)) = fuse_in_header::read_from_prefix(&h[..]) else {
        return Some(io.commit_id);
    };
    let arg_end = FUSE_URING_IN_OUT_HEADER_SZ + arg_size(ih.opcode).min(FUSE_URING_OP_IN_OUT_SZ);
    let psz = (io.payload_sz as usize).min(p.len());
    let answer;
    let len;
    {
        let arg = &h[FUSE_URING_IN_OUT_HEADER_SZ..arg_end];
        if psz <= COPY_DATA_MAX {
            // Short data: copied aside, the reply goes straight into the payload.
            copy[..psz].copy_from_slice(&p[..psz]);
            let req = Request {
                h: ih,
                arg,
                data: &copy[..psz],
            };
            let mut out = Out::new(p);
            answer = server.dispatch(&req, Caller::Kernel, &mut out, later);
            len = out.len();
        } else {
            // Long data (WRITE, SETXATTR): read in place; the short reply goes aside first.
            let req = Request {
                h: ih,
                arg,
                data: &p[..psz],
            };
            let mut out = Out::new(side);
            answer = server.dispatch(&req, Caller::Kernel, &mut out, later);
            len = out.len();
        }
    }
    let errno = match answer {
        Answer::Reply(e) => e,
        Answer::Later => return None,
        // Nothing that takes no answer comes through the ring (FORGET and INTERRUPT come
        // through /dev/fuse); should one, the entry is committed with an empty success.
        Answer::None => 0,
    };
    if errno == 0 && psz > COPY_DATA_MAX {
        p[..len].copy_from_slice(&side[..len]);
    }
    set_reply(h, ih.unique, errno, len);
    Some(ih.unique)
}
