//! The FUSE wire format as the dispatcher sees it: a request ([`Request`]), the reply body
//! being written ([`Out`]), how a request is answered ([`Answer`], [`Pending`]) and the out
//! header that goes before a reply ([`out_header`]). Every transport speaks it (`dispatch.rs`
//! says how a transport serves a request).
//!
//! A request is its `fuse_in_header`, its opcode's fixed-size argument structure (`arg`,
//! which may be empty) and what follows (`data`: names, written bytes). The kernel lays a
//! request out that way on both of its transports: through `/dev/fuse` in one buffer
//! ([`Request::parse`]), through io_uring with the argument structure in the entry's `op_in`
//! and the rest in its payload buffer ([`arg_size`] says where the structure ends). A reply is
//! a `fuse_out_header` followed, on success, by the body the dispatcher wrote into an [`Out`]
//! (the transport's own buffer). Kernel input that does not decode (a short argument, a name
//! without its NUL) is answered EINVAL; nothing a request holds can panic the server.

use lanefs::Errno;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi::*;

/// The largest write (and read) lanefs accepts in one request: 1 MiB, the kernel's default
/// request size limit (`fs.fuse.max_pages_limit`, 256 pages). A transport's request buffer
/// holds this much data and a page of headers; so does its reply buffer.
pub(crate) const MAX_WRITE: usize = 1 << 20;

/// One decoded request.
pub(crate) struct Request<'a> {
    pub h: fuse_in_header,
    /// The opcode's argument structure (as many bytes of it as came).
    pub arg: &'a [u8],
    /// Everything after it.
    pub data: &'a [u8],
}

/// How many bytes of a request's arguments are its opcode's fixed structure (the first
/// argument the kernel sends, which io_uring puts in `op_in`); the rest is `data`.
pub(crate) fn arg_size(opcode: u32) -> usize {
    match opcode {
        FUSE_FORGET => size_of::<fuse_forget_in>(),
        FUSE_GETATTR => size_of::<fuse_getattr_in>(),
        FUSE_SETATTR => size_of::<fuse_setattr_in>(),
        FUSE_MKNOD => size_of::<fuse_mknod_in>(),
        FUSE_MKDIR => size_of::<fuse_mkdir_in>(),
        FUSE_RENAME => size_of::<fuse_rename_in>(),
        FUSE_RENAME2 => size_of::<fuse_rename2_in>(),
        FUSE_LINK => size_of::<fuse_link_in>(),
        FUSE_OPEN | FUSE_OPENDIR => size_of::<fuse_open_in>(),
        FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS => size_of::<fuse_read_in>(),
        FUSE_WRITE => size_of::<fuse_write_in>(),
        FUSE_RELEASE | FUSE_RELEASEDIR => size_of::<fuse_release_in>(),
        FUSE_FSYNC | FUSE_FSYNCDIR => size_of::<fuse_fsync_in>(),
        // Without FUSE_SETXATTR_EXT (not asked for) the 8-byte form.
        FUSE_SETXATTR => size_of::<fuse_setxattr_in>(),
        FUSE_GETXATTR | FUSE_LISTXATTR => size_of::<fuse_getxattr_in>(),
        FUSE_FLUSH => size_of::<fuse_flush_in>(),
        FUSE_ACCESS => size_of::<fuse_access_in>(),
        FUSE_CREATE | FUSE_TMPFILE => size_of::<fuse_create_in>(),
        FUSE_INTERRUPT => size_of::<fuse_interrupt_in>(),
        FUSE_BATCH_FORGET => size_of::<fuse_batch_forget_in>(),
        FUSE_IOCTL => size_of::<fuse_ioctl_in>(),
        FUSE_FALLOCATE => size_of::<fuse_fallocate_in>(),
        FUSE_LSEEK => size_of::<fuse_lseek_in>(),
        FUSE_STATX => size_of::<fuse_statx_in>(),
        FUSE_INIT => size_of::<fuse_init_in_ext>(),
        // The channel's own (`lanefs-channel`, served by `server/paths.rs`).
        lanefs_channel::OP_STAT => size_of::<lanefs_channel::StatIn>(),
        lanefs_channel::OP_MKNOD => size_of::<fuse_mknod_in>(),
        lanefs_channel::OP_MKDIR => size_of::<fuse_mkdir_in>(),
        lanefs_channel::OP_RENAME => size_of::<lanefs_channel::RenameIn>(),
        lanefs_channel::OP_LINK => size_of::<lanefs_channel::LinkIn>(),
        lanefs_channel::OP_SETATTR => size_of::<lanefs_channel::SetattrIn>(),
        lanefs_channel::OP_FSYNC => size_of::<lanefs_channel::FsyncIn>(),
        // LOOKUP, UNLINK, RMDIR, SYMLINK, REMOVEXATTR (names only), READLINK, STATFS,
        // DESTROY (nothing), and opcodes lanefs answers ENOSYS without reading them.
        _ => 0,
    }
}

impl<'a> Request<'a> {
    /// Splits one whole request, laid out as one read of `/dev/fuse` returns it (header,
    /// argument structure, data; the header's `len` says how much of `buf` is the request).
    /// `None` when `buf` is shorter than its header says.
    pub(crate) fn parse(buf: &'a [u8]) -> Option<Request<'a>> {
        let (h, rest) = fuse_in_header::read_from_prefix(buf).ok()?;
        let rest = rest.get(..(h.len as usize).checked_sub(size_of::<fuse_in_header>())?)?;
        let (arg, data) = rest.split_at(arg_size(h.opcode).min(rest.len()));
        Some(Request { h, arg, data })
    }

    /// The argument structure; EINVAL when the kernel sent less of it.
    pub(crate) fn arg<T: FromBytes>(&self) -> Result<T, Errno> {
        T::read_from_prefix(self.arg)
            .map(|(t, _)| t)
            .map_err(|_| Errno::EINVAL)
    }

    /// `data` as NUL-terminated strings: the first and what follows its NUL.
    pub(crate) fn name(&self) -> Result<(&'a [u8], &'a [u8]), Errno> {
        cstr(self.data)
    }
}

/// The string up to the first NUL of `b`, and what follows the NUL.
pub(crate) fn cstr(b: &[u8]) -> Result<(&[u8], &[u8]), Errno> {
    let n = b.iter().position(|&c| c == 0).ok_or(Errno::EINVAL)?;
    Ok((&b[..n], &b[n + 1..]))
}

/// A reply body being written into a transport's buffer.
pub(crate) struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Out<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Out<'a> {
        Out { buf, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `b`; false (and nothing appended) when it does not fit.
    pub(crate) fn push(&mut self, b: &[u8]) -> bool {
        match self.buf.get_mut(self.len..self.len + b.len()) {
            Some(d) => {
                d.copy_from_slice(b);
                self.len += b.len();
                true
            }
            None => false,
        }
    }

    pub(crate) fn push_obj<T: IntoBytes + Immutable>(&mut self, t: &T) -> bool {
        self.push(t.as_bytes())
    }

    /// Up to `n` bytes of room after what was written, for [`Out::grow`] to keep.
    pub(crate) fn room(&mut self, n: usize) -> &mut [u8] {
        let end = (self.len + n).min(self.buf.len());
        &mut self.buf[self.len..end]
    }

    /// Keeps `n` bytes written into [`Out::room`].
    pub(crate) fn grow(&mut self, n: usize) {
        self.len = (self.len + n).min(self.buf.len());
    }

    /// Drops everything written.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Drops what was written after the first `len` bytes.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// What the dispatcher did with a request.
pub(crate) enum Answer {
    /// Answer now: 0 with the body written, or an errno (the body is not sent).
    Reply(i32),
    /// A [`Pending`] answers it.
    Later,
    /// The opcode takes no answer.
    None,
}

/// A request answered later, from another thread (an empty reply with an errno, the only
/// kind lanefs defers). Answered exactly once: dropped without [`Pending::answer`], it
/// answers EIO, so no request is ever left without a reply.
pub(crate) struct Pending(Option<Box<dyn FnOnce(i32) + Send>>);

impl Pending {
    /// A pending answer that `f` sends (called once, with 0 or an errno).
    pub(crate) fn new(f: impl FnOnce(i32) + Send + 'static) -> Pending {
        Pending(Some(Box::new(f)))
    }

    /// Sends the answer: 0, or `e`'s errno.
    pub(crate) fn answer(mut self, r: lanefs::Result<()>) {
        if let Some(f) = self.0.take() {
            f(r.err().map_or(0, |e| e.code()));
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(libc::EIO);
        }
    }
}

/// The out header of the reply to request `unique`: `errno` (0: success) and a body of
/// `body_len` bytes, which only a success carries (an error's body is not sent).
pub(crate) fn out_header(unique: u64, errno: i32, body_len: usize) -> fuse_out_header {
    let body_len = if errno == 0 { body_len } else { 0 };
    fuse_out_header {
        len: (size_of::<fuse_out_header>() + body_len) as u32,
        error: -errno,
        unique,
    }
}
