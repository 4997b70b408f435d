//! The seam between the transports and the request handling: [`Dispatch`].
//!
//! A transport carries requests to the server and replies back; the dispatcher (the
//! [`Server`](crate::Server), `server/`) turns each request into exactly one engine call.
//! Every transport serves through this one trait and knows nothing else of the server:
//! `/dev/fuse` (`devfuse.rs`), io_uring (`uring.rs`) and, next, the channel of `lanefs run`.
//! To serve one request a transport
//!
//! 1. obtains it in the FUSE wire format ([`Request`]: `fuse_in_header`, the opcode's
//!    argument structure, the data after it), e.g. with [`Request::parse`] from one buffer;
//! 2. says who made it ([`Caller`]): the kernel, on behalf of the process its header names
//!    ([`Caller::Kernel`]), or credentials the transport learned itself
//!    ([`Caller::Known`]: the channel learns them from the socket's peer credentials, not
//!    from the header);
//! 3. calls [`Dispatch::dispatch`] with an [`Out`] over its reply buffer (the bytes after
//!    the out header) and a `later` that makes a [`Pending`] for an answer sent from
//!    another thread;
//! 4. sends what the [`Answer`] says: for [`Answer::Reply`], the out header
//!    ([`out_header`](crate::wire::out_header)) and, when the errno is 0, the body written
//!    into the [`Out`]; nothing for [`Answer::None`] (FORGET, BATCH_FORGET, INTERRUPT); and
//!    for [`Answer::Later`] nothing now: the [`Pending`] that `later` made sends an empty
//!    reply with the errno it is given, once, from whichever thread answers (FSYNC and
//!    FSYNCDIR wait for the store's group commit on the committer's thread, not the request
//!    thread's). A [`Pending`] dropped unanswered answers EIO.
//!
//! The dispatcher answers every request on its own, without waiting for anything a caller
//! could give up on, except FSYNC, which waits at most one group commit of the store; so
//! **interrupts** are read and not acted on (the kernel allows a server to ignore one, and
//! the original request is answered as usual, once: an early EINTR would have to race the
//! committer's answer).

use lanefs::Ctx;

use crate::abi::fuse_in_header;
use crate::creds;
use crate::wire::{Answer, Out, Pending, Request};

/// Who made a request: whose credentials its engine call runs with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Caller<'a> {
    /// The kernel, serving the process whose uid, gid and pid the request's header carries
    /// (`/dev/fuse`, io_uring). Its supplementary groups are read from `/proc` (`creds.rs`),
    /// and the engine treats the call as the kernel's ([`lanefs::Via::Kernel`]: lookup
    /// references, and the checks the kernel made before it sent the request).
    Kernel,
    /// Credentials the transport established itself; the header's uid, gid and pid are
    /// ignored. A handler that needs a changed context (a umask, `keeps_setid`) changes a
    /// copy.
    Known(&'a Ctx),
}

impl Caller<'_> {
    /// The engine context of a request with header `h` from this caller.
    pub(crate) fn ctx(&self, h: &fuse_in_header) -> Ctx {
        match self {
            Caller::Kernel => creds::ctx(h.uid, h.gid, h.pid),
            Caller::Known(c) => (*c).clone(),
        }
    }
}

/// What serves requests: the one entry point of the request handling (module doc).
pub(crate) trait Dispatch: Send + Sync {
    /// Serves `req` from `from` with one engine call, writes the reply body into `out`, and
    /// says how the request is answered. `later` is called at most once, for a request
    /// answered from another thread; the transport then sends nothing until the [`Pending`]
    /// it made answers.
    fn dispatch(
        &self,
        req: &Request,
        from: Caller,
        out: &mut Out,
        later: &dyn Fn() -> Pending,
    ) -> Answer;

    /// Called by the transport thread that reads FORGETs after each one: waits up to `max`
    /// so that the FORGETs the kernel queues meanwhile come as one BATCH_FORGET, and less
    /// while the engine waits for a FORGET (`lanefs::Filesystem::forget_pause`).
    fn forget_pause(&self, max: std::time::Duration);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_caller_is_not_read_from_the_header() {
        let h = fuse_in_header {
            uid: 5,
            gid: 6,
            pid: 0,
            ..Default::default()
        };
        let kernel = Caller::Kernel.ctx(&h);
        assert_eq!(
            (kernel.uid, kernel.gid, kernel.via),
            (5, 6, lanefs::Via::Kernel)
        );
        let known = Ctx::user(7, 8).with_groups(&[9]);
        let c = Caller::Known(&known).ctx(&h);
        assert_eq!((c.uid, c.gid, c.via), (7, 8, lanefs::Via::Library));
        assert_eq!(c.groups(), &[9]);
    }
}
