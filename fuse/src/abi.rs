//! The FUSE kernel ABI: the structures of `include/uapi/linux/fuse.h`.
//!
//! Everything up to ABI 7.31 comes from `polyfuse-kernel` (its structures derive `zerocopy`'s
//! `FromBytes` / `IntoBytes`, so requests are decoded and replies encoded without `unsafe`).
//! Defined here is only what that crate (the newest release, 0.2.0, stops at 7.31) lacks and
//! lanefs needs, each with the kernel version that added it:
//! - the extended INIT structures (7.36: `flags2`, the upper 32 bits of the flags, read by
//!   the kernel only when the reply sets `FUSE_INIT_EXT`);
//! - the INIT flags `FUSE_HANDLE_KILLPRIV_V2` (7.33), `FUSE_INIT_EXT` (7.36) and
//!   `FUSE_OVER_IO_URING` (7.42, bit 41 of the 64-bit flags);
//! - `FUSE_WRITE_KILL_SUIDGID` (7.33; the same bit as 7.31's `FUSE_WRITE_KILL_PRIV`, renamed)
//!   and `FATTR_KILL_SUIDGID` (7.33);
//! - the `FUSE_TMPFILE` opcode (7.37, fuse_create_in in, fuse_entry_out + fuse_open_out out);
//! - the `FUSE_STATX` opcode and its structures (7.39, Linux 6.6): `fuse_statx_in` in,
//!   `fuse_statx_out` (a `fuse_statx`, with `fuse_sx_time` timestamps) out;
//! - the io_uring transport (7.42): `fuse_uring_req_header`, `fuse_uring_ent_in_out`,
//!   `fuse_uring_cmd_req` and the two commands;
//! - `FUSE_DEV_IOC_CLONE`, the ioctl that binds a new `/dev/fuse` descriptor to a session;
//! - the `FUSE_NOTIFY_PRUNE` notification (7.45, Linux 6.18) and `fuse_notify_prune_out`.

#![allow(non_camel_case_types)]

pub use polyfuse_kernel::*;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// INIT flag: the server takes away set-id bits and capabilities itself (7.33).
pub const FUSE_HANDLE_KILLPRIV_V2: u64 = 1 << 28;
/// INIT flag: `flags2` is valid (7.36).
pub const FUSE_INIT_EXT: u64 = 1 << 30;
/// INIT flag (in `flags2`): requests may be served through io_uring (7.42).
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;

/// WRITE flag: the writer lacks `CAP_FSETID`; set-id bits must go (7.33).
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// SETATTR valid bit: set-id bits must go (7.33): on a truncate by a caller without
/// `CAP_FSETID`, and on every change of owner or group.
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;

/// Opcode: create an unnamed file in a directory (`O_TMPFILE`, 7.37).
pub const FUSE_TMPFILE: u32 = 51;

/// Opcode: the attributes as `statx(2)` has them (7.39). The kernel sends it instead of
/// GETATTR when a `statx` asks for more than `STATX_BASIC_STATS` (the birth time) and its
/// cached attributes are stale; ENOSYS makes it stop (`fuse_update_get_attr`).
pub const FUSE_STATX: u32 = 52;

/// `_IOR(229, 0, uint32_t)`: clone a session onto a freshly opened `/dev/fuse`.
pub const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// `struct fuse_init_in` as of 7.36 (the kernel sends this whole size from 7.36 on).
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_init_in_ext {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

/// `struct fuse_init_out` as of 7.43.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_init_out_ext {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

/// Notification (7.45): the kernel drops the unused dentries of the inodes whose node ids
/// follow a `fuse_notify_prune_out` (`d_prune_aliases`), and with them, unless something
/// else holds them, the inodes, each of which it then FORGETs. A kernel before it answers
/// the write with EINVAL.
pub const FUSE_NOTIFY_PRUNE: u32 = 9;

/// `struct fuse_notify_prune_out` (7.45): the head of `FUSE_NOTIFY_PRUNE`, followed by
/// `count` node ids (`u64` each).
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_notify_prune_out {
    pub count: u32,
    pub padding: u32,
    pub spare: u64,
}

/// `struct fuse_statx_in` (7.39): the argument of `FUSE_STATX`.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_statx_in {
    /// `FUSE_GETATTR_FH` when `fh` is set.
    pub getattr_flags: u32,
    pub reserved: u32,
    pub fh: u64,
    /// The `AT_STATX_*` sync flags (the kernel sends 0).
    pub sx_flags: u32,
    /// The `STATX_*` fields wanted (the kernel asks for `STATX_BASIC_STATS | STATX_BTIME`).
    pub sx_mask: u32,
}

/// `struct fuse_sx_time` (7.39): a `statx_timestamp`.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_sx_time {
    pub tv_sec: i64,
    pub tv_nsec: u32,
    pub reserved: i32,
}

/// `struct fuse_statx` (7.39): the fields of `struct statx`, less the mount id.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_statx {
    /// The `STATX_*` fields filled in.
    pub mask: u32,
    pub blksize: u32,
    /// `STATX_ATTR_*` bits.
    pub attributes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
    pub spare0: [u16; 1],
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// The `STATX_ATTR_*` bits this filesystem supports.
    pub attributes_mask: u64,
    pub atime: fuse_sx_time,
    pub btime: fuse_sx_time,
    pub ctime: fuse_sx_time,
    pub mtime: fuse_sx_time,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub spare2: [u64; 14],
}

/// `struct fuse_statx_out` (7.39): the reply of `FUSE_STATX`.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_statx_out {
    /// How long the kernel may keep the attributes (as `fuse_attr_out`'s).
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub flags: u32,
    pub spare: [u64; 2],
    pub stat: fuse_statx,
}

/// Before 7.23 the kernel reads only this much of the INIT reply.
pub const FUSE_COMPAT_22_INIT_OUT_SIZE: usize = 24;

/// io_uring command: register a ring entry (its header and payload buffers) with a queue.
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
/// io_uring command: answer the request an entry holds and make it available again.
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// Size of `fuse_uring_req_header::in_out` (a `fuse_in_header` in, `fuse_out_header` out).
pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
/// Size of `fuse_uring_req_header::op_in` (the opcode's own header, the request's first
/// argument).
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;

/// `struct fuse_uring_ent_in_out`: the request's commit id and payload size (in), the
/// reply's payload size (out).
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_uring_ent_in_out {
    pub flags: u64,
    pub commit_id: u64,
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: the first of an entry's two buffers.
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_uring_req_header {
    pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
    pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: fuse_uring_ent_in_out,
}

/// Offset of `ring_ent_in_out` in [`fuse_uring_req_header`].
pub const FUSE_URING_ENT_IN_OUT_OFFSET: usize =
    FUSE_URING_IN_OUT_HEADER_SZ + FUSE_URING_OP_IN_OUT_SZ;

/// `struct fuse_uring_cmd_req`: the command data of an `IORING_OP_URING_CMD` submission (in
/// the second half of a 128-byte SQE).
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct fuse_uring_cmd_req {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes `fuse.h` gives (a wrong one would misplace every field after it).
    #[test]
    fn sizes_match_the_kernel_header() {
        assert_eq!(size_of::<fuse_init_in_ext>(), 64);
        assert_eq!(size_of::<fuse_init_out_ext>(), 64);
        assert_eq!(size_of::<fuse_uring_ent_in_out>(), 32);
        assert_eq!(size_of::<fuse_uring_req_header>(), 288);
        assert_eq!(size_of::<fuse_uring_cmd_req>(), 24);
        assert_eq!(size_of::<fuse_in_header>(), 40);
        assert_eq!(size_of::<fuse_entry_out>(), 128);
        assert_eq!(size_of::<fuse_attr_out>(), 104);
        assert_eq!(size_of::<fuse_setattr_in>(), 88);
        assert_eq!(size_of::<fuse_write_in>(), 40);
        assert_eq!(size_of::<fuse_statx_in>(), 24);
        assert_eq!(size_of::<fuse_sx_time>(), 16);
        assert_eq!(size_of::<fuse_statx>(), 256);
        assert_eq!(size_of::<fuse_statx_out>(), 288);
    }
}
