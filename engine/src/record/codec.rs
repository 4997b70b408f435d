//! The records' bytes: the logical body of a journal entry (docs/RECORDS.md, "Encoding").
//! Framing, sequence numbers and checksums are the store's. Every field is checked when
//! decoding (names, cookies, inode numbers, lengths against their limits, no trailing bytes),
//! and every value has exactly one encoding.

use super::{AttrChange, NewInode, Record, RecordSummary};
use crate::attr::flags;
use crate::dir::{FIRST_COOKIE, NAME_MAX};
use crate::id::{Generation, Ino, InodeId};
// The largest symlink target, xattr name and value a record may carry are the calls' own.
use crate::limits::{SYMLINK_MAX as TARGET_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX as XATTR_VALUE_MAX};
use crate::time::Timespec;

/// Why a byte string is not a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// Offset in the record's bytes where decoding failed.
    pub offset: usize,
    /// What was wrong there.
    pub what: &'static str,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {} of the record", self.what, self.offset)
    }
}

impl std::error::Error for DecodeError {}

/// Record type tags (docs/RECORDS.md, "Tags").
mod tag {
    pub const ROOT: u8 = 1;
    pub const CREATE: u8 = 2;
    pub const LINK: u8 = 3;
    pub const REMOVE: u8 = 4;
    pub const RENAME: u8 = 5;
    pub const SET_ATTR: u8 = 6;
    pub const WRITE: u8 = 7;
    pub const ALLOCATE: u8 = 8;
    pub const PUNCH: u8 = 9;
    pub const SET_XATTR: u8 = 10;
    pub const REMOVE_XATTR: u8 = 11;
    pub const FREE: u8 = 12;
    pub const SET_ACL: u8 = 13;
    pub const SET_FLAGS: u8 = 14;
    pub const CREATE_WITH_FLAGS: u8 = 15;
    pub const RENAME_WHITEOUT: u8 = 16;
    pub const TMPFILE: u8 = 17;
}

struct Enc<'o>(&'o mut Vec<u8>);

impl Enc<'_> {
    #[inline]
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    #[inline]
    fn u32(&mut self, v: u32) {
        self.u64(u64::from(v));
    }
    /// LEB128: seven bits a byte, low first, the high bit set on every byte but the last.
    #[inline]
    fn u64(&mut self, mut v: u64) {
        // Byte by byte: a copy of a variable-length slice would be a call to memcpy.
        self.0.reserve(10);
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    #[inline]
    fn id(&mut self, id: InodeId) {
        self.u64(id.ino.0);
        self.u64(id.generation.0);
    }
    #[inline]
    fn time(&mut self, t: Timespec) {
        // Zigzag, so that times before 1970 stay short.
        self.u64(((t.sec << 1) ^ (t.sec >> 63)) as u64);
        self.u32(t.nsec);
    }
    #[inline]
    fn name(&mut self, n: &[u8]) {
        assert!(n.len() <= u8::MAX as usize, "name of {} bytes", n.len());
        self.u8(n.len() as u8);
        self.0.extend_from_slice(n);
    }
    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.u32(u32::try_from(b.len()).expect("record payload below 4 GiB"));
        self.0.extend_from_slice(b);
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        self.u32(v.unwrap_or(0));
    }
    fn new_inode(&mut self, n: &NewInode<'_>) {
        self.id(n.id);
        self.u32(n.mode);
        self.u32(n.uid);
        self.u32(n.gid);
        self.u64(n.rdev);
        self.time(n.time);
        self.bytes(n.target);
        self.bytes(n.access_acl);
        self.bytes(n.default_acl);
    }
}

/// A decoder over one record's bytes. Its parts return [`Bad`] on failure and keep what
/// was wrong and where in `error`: a `Result` whose error is a unit returns its value in
/// registers, which a 24-byte error would not (decoding is most of what a checkpoint of
/// short-lived files costs).
struct Dec<'a> {
    b: &'a [u8],
    at: usize,
    error: DecodeError,
}

/// A part of a record failed to decode: [`Dec::error`] says why.
struct Bad;

type D<T> = std::result::Result<T, Bad>;

impl<'a> Dec<'a> {
    fn new(b: &'a [u8]) -> Dec<'a> {
        Dec {
            b,
            at: 0,
            error: DecodeError {
                offset: 0,
                what: "",
            },
        }
    }
    /// `part`'s result, its failure as the [`DecodeError`] it keeps.
    #[cfg(test)]
    fn run<T>(
        &mut self,
        part: impl FnOnce(&mut Self) -> D<T>,
    ) -> std::result::Result<T, DecodeError> {
        part(self).map_err(|Bad| self.error.clone())
    }
    fn fail<T>(&mut self, what: &'static str) -> D<T> {
        self.fail_at(self.at, what)
    }
    #[inline]
    fn take(&mut self, n: usize) -> D<&'a [u8]> {
        match self.b.get(self.at..self.at + n) {
            Some(s) => {
                self.at += n;
                Ok(s)
            }
            None => self.fail("record ends early"),
        }
    }
    #[inline]
    fn u8(&mut self) -> D<u8> {
        Ok(self.take(1)?[0])
    }
    #[inline]
    fn u32(&mut self) -> D<u32> {
        let at = self.at;
        let v = self.u64()?;
        u32::try_from(v).or_else(|_| self.fail_at(at, "number out of range"))
    }
    /// A LEB128 number in its shortest form (a longer one is refused, so that every value
    /// has exactly one encoding).
    #[inline]
    fn u64(&mut self) -> D<u64> {
        // Most numbers of a record (lengths, small ids, uid, gid, rdev) take one byte.
        match self.b.get(self.at) {
            Some(&b) if b < 0x80 => {
                self.at += 1;
                Ok(u64::from(b))
            }
            _ => self.u64_long(),
        }
    }
    fn u64_long(&mut self) -> D<u64> {
        let at = self.at;
        let rest = self.b.get(at..).unwrap_or_default();
        let mut v = 0u64;
        for (i, &b) in rest.iter().take(10).enumerate() {
            if i == 9 && b > 1 {
                return self.fail_at(at, "number out of range");
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return self.fail_at(at, "number not in its shortest form");
                }
                self.at = at + i + 1;
                return Ok(v);
            }
        }
        if rest.len() < 10 {
            self.at = self.b.len();
            return self.fail("record ends early");
        }
        self.fail_at(at, "number out of range")
    }
    fn flag(&mut self) -> D<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => self.fail("flag byte neither 0 nor 1"),
        }
    }
    #[inline]
    fn id(&mut self) -> D<InodeId> {
        let at = self.at;
        let ino = self.u64()?;
        let generation = self.u64()?;
        if ino == 0 || ino > crate::id::MAX_INO {
            return self.fail_at(at, "inode number out of range");
        }
        Ok(InodeId {
            ino: Ino(ino),
            generation: Generation(generation),
        })
    }
    #[inline]
    fn time(&mut self) -> D<Timespec> {
        let z = self.u64()?;
        let sec = (z >> 1) as i64 ^ -((z & 1) as i64);
        let nsec = self.u32()?;
        if nsec >= 1_000_000_000 {
            return self.fail("nanoseconds out of range");
        }
        Ok(Timespec::new(sec, nsec))
    }
    /// A directory entry's name: 1 to NAME_MAX bytes, no `/` or NUL, not `.` or `..`.
    #[inline]
    fn name(&mut self) -> D<&'a [u8]> {
        let at = self.at;
        let len = self.u8()? as usize;
        let n = self.take(len)?;
        let bad = n.is_empty()
            || n.len() > NAME_MAX
            || n.iter().any(|&c| c == b'/' || c == 0)
            || n == b"."
            || n == b"..";
        if bad {
            return self.fail_at(at, "invalid entry name");
        }
        Ok(n)
    }
    #[inline]
    fn bytes(&mut self, max: usize) -> D<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return self.fail("payload longer than its limit");
        }
        self.take(len)
    }
    #[inline]
    fn cookie(&mut self) -> D<u64> {
        let c = self.u64()?;
        if !crate::dir::valid_cookie(c) {
            return self.fail("readdir cookie out of range");
        }
        Ok(c)
    }
    fn opt_u32(&mut self, present: bool) -> D<Option<u32>> {
        let v = self.u32()?;
        Ok(present.then_some(v))
    }
    #[inline]
    fn new_inode(&mut self) -> D<NewInode<'a>> {
        let id = self.id()?;
        let at = self.at;
        let mode = self.u32()?;
        if crate::attr::FileType::from_mode(mode).is_none() || mode > 0xFFFF {
            return self.fail_at(at, "mode without a valid file type");
        }
        Ok(NewInode {
            id,
            mode,
            uid: self.u32()?,
            gid: self.u32()?,
            rdev: self.u64()?,
            time: self.time()?,
            target: self.bytes(TARGET_MAX)?,
            access_acl: self.acl()?,
            default_acl: self.acl()?,
        })
    }
    /// Inode flags, all of them among `allowed`.
    #[inline]
    fn flags(&mut self, allowed: u32) -> D<u32> {
        let at = self.at;
        let f = self.u32()?;
        if f & !allowed != 0 {
            return self.fail_at(at, "unknown inode flags");
        }
        Ok(f)
    }
    #[cold]
    fn fail_at<T>(&mut self, offset: usize, what: &'static str) -> D<T> {
        self.error = DecodeError { offset, what };
        Err(Bad)
    }
    /// An ACL's bytes: empty, or a valid ACL.
    #[inline]
    fn acl(&mut self) -> D<&'a [u8]> {
        let at = self.at;
        let b = self.bytes(XATTR_VALUE_MAX)?;
        if !b.is_empty() && crate::acl::Acl::parse(b).is_err() {
            return self.fail_at(at, "invalid ACL");
        }
        Ok(b)
    }
}

/// Presence bits of [`AttrChange`]'s fields, in the byte before them.
mod present {
    pub const MODE: u8 = 1;
    pub const UID: u8 = 2;
    pub const GID: u8 = 4;
    pub const SIZE: u8 = 8;
    pub const ATIME: u8 = 16;
    pub const MTIME: u8 = 32;
    pub const CTIME: u8 = 64;
}

impl Record<'_> {
    /// Appends the record's bytes to `out` (docs/RECORDS.md, "Encoding").
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut e = Enc(out);
        match *self {
            Record::Root { inode } => {
                e.u8(tag::ROOT);
                e.new_inode(&inode);
            }
            Record::Create {
                dir,
                name,
                cookie,
                inode,
                flags,
            } => {
                // Tag CREATE_WITH_FLAGS carries the inherited flags after the inode; a create
                // with none is a plain CREATE, without them.
                e.u8(if flags == 0 {
                    tag::CREATE
                } else {
                    tag::CREATE_WITH_FLAGS
                });
                e.id(dir);
                e.name(name);
                e.u64(cookie);
                e.new_inode(&inode);
                if flags != 0 {
                    e.u32(flags);
                }
            }
            Record::Link {
                dir,
                name,
                cookie,
                inode,
                time,
            } => {
                e.u8(tag::LINK);
                e.id(dir);
                e.name(name);
                e.u64(cookie);
                e.id(inode);
                e.time(time);
            }
            Record::Remove {
                dir,
                name,
                inode,
                time,
            } => {
                e.u8(tag::REMOVE);
                e.id(dir);
                e.name(name);
                e.id(inode);
                e.time(time);
            }
            Record::Rename {
                from,
                from_name,
                to,
                to_name,
                inode,
                replaced,
                exchange,
                cookie,
                time,
            } => {
                e.u8(tag::RENAME);
                e.id(from);
                e.name(from_name);
                e.id(to);
                e.name(to_name);
                e.id(inode);
                e.u8(u8::from(replaced.is_some()) | u8::from(exchange) << 1);
                if let Some(r) = replaced {
                    e.id(r);
                }
                e.u64(cookie);
                e.time(time);
            }
            Record::SetAttr { inode, change: c } => {
                e.u8(tag::SET_ATTR);
                e.id(inode);
                let mut bits = 0;
                for (set, bit) in [
                    (c.mode.is_some(), present::MODE),
                    (c.uid.is_some(), present::UID),
                    (c.gid.is_some(), present::GID),
                    (c.size.is_some(), present::SIZE),
                    (c.atime.is_some(), present::ATIME),
                    (c.mtime.is_some(), present::MTIME),
                    (c.ctime.is_some(), present::CTIME),
                ] {
                    if set {
                        bits |= bit;
                    }
                }
                e.u8(bits);
                e.opt_u32(c.mode);
                e.opt_u32(c.uid);
                e.opt_u32(c.gid);
                e.u64(c.size.unwrap_or(0));
                for t in [c.atime, c.mtime, c.ctime] {
                    e.time(t.unwrap_or_default());
                }
            }
            Record::Write {
                inode,
                offset,
                data,
                time,
            } => {
                e.u8(tag::WRITE);
                e.id(inode);
                e.u64(offset);
                e.time(time);
                e.bytes(data);
            }
            Record::Allocate {
                inode,
                offset,
                len,
                keep_size,
                time,
            } => {
                e.u8(tag::ALLOCATE);
                e.id(inode);
                e.u64(offset);
                e.u64(len);
                e.u8(u8::from(keep_size));
                e.time(time);
            }
            Record::Punch {
                inode,
                offset,
                len,
                time,
            } => {
                e.u8(tag::PUNCH);
                e.id(inode);
                e.u64(offset);
                e.u64(len);
                e.time(time);
            }
            Record::SetXattr {
                inode,
                name,
                value,
                time,
            } => {
                e.u8(tag::SET_XATTR);
                e.id(inode);
                e.bytes(name);
                e.bytes(value);
                e.time(time);
            }
            Record::SetAcl {
                inode,
                default,
                acl,
                mode,
                time,
            } => {
                e.u8(tag::SET_ACL);
                e.id(inode);
                e.u8(u8::from(default));
                e.bytes(acl);
                e.u32(mode);
                e.time(time);
            }
            Record::RemoveXattr { inode, name, time } => {
                e.u8(tag::REMOVE_XATTR);
                e.id(inode);
                e.bytes(name);
                e.time(time);
            }
            Record::Free { inode } => {
                e.u8(tag::FREE);
                e.id(inode);
            }
            Record::SetFlags { inode, flags, time } => {
                e.u8(tag::SET_FLAGS);
                e.id(inode);
                e.u32(flags);
                e.time(time);
            }
            Record::RenameWhiteout {
                from,
                from_name,
                to,
                to_name,
                inode,
                replaced,
                cookie,
                time,
                whiteout,
                whiteout_cookie,
                whiteout_flags,
            } => {
                e.u8(tag::RENAME_WHITEOUT);
                e.id(from);
                e.name(from_name);
                e.id(to);
                e.name(to_name);
                e.id(inode);
                e.u8(u8::from(replaced.is_some()));
                if let Some(r) = replaced {
                    e.id(r);
                }
                e.u64(cookie);
                e.time(time);
                e.new_inode(&whiteout);
                e.u64(whiteout_cookie);
                e.u32(whiteout_flags);
            }
            Record::Tmpfile { inode, flags } => {
                e.u8(tag::TMPFILE);
                e.new_inode(&inode);
                e.u32(flags);
            }
        }
    }

    /// The record's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

impl<'a> Record<'a> {
    /// Decodes the bytes [`Record::encode`] wrote; every field is checked (names, cookies,
    /// inode numbers, lengths against their limits, no trailing bytes).
    pub fn decode(b: &'a [u8]) -> std::result::Result<Record<'a>, DecodeError> {
        let mut d = Dec::new(b);
        Self::decode_in(&mut d).map_err(|Bad| d.error)
    }

    fn decode_in(d: &mut Dec<'a>) -> D<Record<'a>> {
        let b = d.b;
        let rec = match d.u8()? {
            tag::ROOT => Record::Root {
                inode: d.new_inode()?,
            },
            tag::CREATE => Record::Create {
                dir: d.id()?,
                name: d.name()?,
                cookie: d.cookie()?,
                inode: d.new_inode()?,
                flags: 0,
            },
            tag::LINK => Record::Link {
                dir: d.id()?,
                name: d.name()?,
                cookie: d.cookie()?,
                inode: d.id()?,
                time: d.time()?,
            },
            tag::REMOVE => Record::Remove {
                dir: d.id()?,
                name: d.name()?,
                inode: d.id()?,
                time: d.time()?,
            },
            tag::RENAME => {
                let (from, from_name, to, to_name, inode) =
                    (d.id()?, d.name()?, d.id()?, d.name()?, d.id()?);
                let at = d.at;
                let bits = d.u8()?;
                if bits > 3 {
                    return d.fail_at(at, "unknown rename flags");
                }
                let replaced = if bits & 1 != 0 { Some(d.id()?) } else { None };
                let exchange = bits & 2 != 0;
                let at = d.at;
                let cookie = d.u64()?;
                let cookie_ok = if replaced.is_some() {
                    cookie == 0
                } else {
                    cookie >= FIRST_COOKIE && !exchange
                };
                if !cookie_ok {
                    return d.fail_at(at, "rename cookie does not fit its shape");
                }
                Record::Rename {
                    from,
                    from_name,
                    to,
                    to_name,
                    inode,
                    replaced,
                    exchange,
                    cookie,
                    time: d.time()?,
                }
            }
            tag::SET_ATTR => {
                let inode = d.id()?;
                let at = d.at;
                let bits = d.u8()?;
                if bits >= 128 {
                    return d.fail_at(at, "unknown attribute bits");
                }
                let has = |b| bits & b != 0;
                let mode = d.opt_u32(has(present::MODE))?;
                let uid = d.opt_u32(has(present::UID))?;
                let gid = d.opt_u32(has(present::GID))?;
                let size = d.u64()?;
                let atime = d.time()?;
                let mtime = d.time()?;
                let ctime = d.time()?;
                Record::SetAttr {
                    inode,
                    change: AttrChange {
                        mode,
                        uid,
                        gid,
                        size: has(present::SIZE).then_some(size),
                        atime: has(present::ATIME).then_some(atime),
                        mtime: has(present::MTIME).then_some(mtime),
                        ctime: has(present::CTIME).then_some(ctime),
                    },
                }
            }
            tag::WRITE => Record::Write {
                inode: d.id()?,
                offset: d.u64()?,
                time: d.time()?,
                data: d.bytes(u32::MAX as usize)?,
            },
            tag::ALLOCATE => Record::Allocate {
                inode: d.id()?,
                offset: d.u64()?,
                len: d.u64()?,
                keep_size: d.flag()?,
                time: d.time()?,
            },
            tag::PUNCH => Record::Punch {
                inode: d.id()?,
                offset: d.u64()?,
                len: d.u64()?,
                time: d.time()?,
            },
            tag::SET_XATTR => Record::SetXattr {
                inode: d.id()?,
                name: d.bytes(XATTR_NAME_MAX)?,
                value: d.bytes(XATTR_VALUE_MAX)?,
                time: d.time()?,
            },
            tag::REMOVE_XATTR => Record::RemoveXattr {
                inode: d.id()?,
                name: d.bytes(XATTR_NAME_MAX)?,
                time: d.time()?,
            },
            tag::FREE => Record::Free { inode: d.id()? },
            tag::SET_ACL => Record::SetAcl {
                inode: d.id()?,
                default: d.flag()?,
                acl: d.acl()?,
                mode: d.u32()?,
                time: d.time()?,
            },
            tag::SET_FLAGS => Record::SetFlags {
                inode: d.id()?,
                flags: d.flags(flags::USER)?,
                time: d.time()?,
            },
            tag::CREATE_WITH_FLAGS => {
                let (dir, name, cookie, inode) = (d.id()?, d.name()?, d.cookie()?, d.new_inode()?);
                let at = d.at;
                let flags = d.flags(flags::INHERITED)?;
                if flags == 0 {
                    return d.fail_at(at, "inherited flags empty");
                }
                Record::Create {
                    dir,
                    name,
                    cookie,
                    inode,
                    flags,
                }
            }
            tag::RENAME_WHITEOUT => {
                let (from, from_name, to, to_name, inode) =
                    (d.id()?, d.name()?, d.id()?, d.name()?, d.id()?);
                let at = d.at;
                let replaced = match d.u8()? {
                    0 => None,
                    1 => Some(d.id()?),
                    _ => {
                        return d.fail_at(at, "unknown rename flags");
                    }
                };
                let at = d.at;
                let cookie = d.u64()?;
                if (cookie == 0) != replaced.is_some()
                    || replaced.is_none() && cookie < FIRST_COOKIE
                {
                    return d.fail_at(at, "rename cookie does not fit its shape");
                }
                let time = d.time()?;
                let at = d.at;
                let whiteout = d.new_inode()?;
                if whiteout.mode & libc::S_IFMT != libc::S_IFCHR || whiteout.rdev != 0 {
                    return d.fail_at(at, "whiteout is not a character device 0/0");
                }
                Record::RenameWhiteout {
                    from,
                    from_name,
                    to,
                    to_name,
                    inode,
                    replaced,
                    cookie,
                    time,
                    whiteout,
                    whiteout_cookie: d.cookie()?,
                    whiteout_flags: d.flags(flags::INHERITED)?,
                }
            }
            tag::TMPFILE => {
                let at = d.at;
                let inode = d.new_inode()?;
                let plain = inode.mode & libc::S_IFMT == libc::S_IFREG
                    && inode.rdev == 0
                    && inode.target.is_empty()
                    && inode.default_acl.is_empty();
                if !plain {
                    return d.fail_at(at, "tmpfile is not a plain regular file");
                }
                Record::Tmpfile {
                    inode,
                    flags: d.flags(flags::INHERITED)?,
                }
            }
            _ => {
                return d.fail_at(0, "unknown record tag");
            }
        };
        if d.at != b.len() {
            return d.fail("trailing bytes after the record");
        }
        Ok(rec)
    }
}

impl RecordSummary {
    /// A Create's, Remove's or Free's fields that [`RecordSummary`] holds, checked as
    /// [`Record::decode`] checks them (every field of the record, and that nothing follows
    /// it), without building the record; a Rename decoded whole, and its summary;
    /// [`RecordSummary::Other`] for other kinds, which are not checked.
    pub fn decode(b: &[u8]) -> std::result::Result<RecordSummary, DecodeError> {
        let mut d = Dec::new(b);
        Self::decode_in(&mut d).map_err(|Bad| d.error)
    }

    fn decode_in(d: &mut Dec<'_>) -> D<RecordSummary> {
        let g = match d.b.first() {
            Some(&tag::CREATE) | Some(&tag::CREATE_WITH_FLAGS) => {
                let flagged = d.u8()? == tag::CREATE_WITH_FLAGS;
                let (dir, _, cookie, inode) = (d.id()?, d.name()?, d.cookie()?, d.new_inode()?);
                if flagged {
                    let at = d.at;
                    if d.flags(flags::INHERITED)? == 0 {
                        return d.fail_at(at, "inherited flags empty");
                    }
                }
                RecordSummary::Create {
                    dir,
                    cookie,
                    inode: inode.id,
                    mode: inode.mode,
                    time: inode.time,
                }
            }
            Some(&tag::REMOVE) => {
                d.u8()?;
                let (dir, _, inode, time) = (d.id()?, d.name()?, d.id()?, d.time()?);
                RecordSummary::Remove { dir, inode, time }
            }
            Some(&tag::FREE) => {
                d.u8()?;
                RecordSummary::Free { inode: d.id()? }
            }
            Some(&tag::RENAME) => return Ok(RecordSummary::of(&Record::decode_in(d)?)),
            _ => return Ok(RecordSummary::Other),
        };
        if d.at != d.b.len() {
            return d.fail("trailing bytes after the record");
        }
        Ok(g)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn id(ino: u64, g: u64) -> InodeId {
        InodeId {
            ino: Ino(ino),
            generation: Generation(g),
        }
    }

    fn t(s: i64) -> Timespec {
        Timespec::new(s, 123_456_789)
    }

    /// One record of every kind, with every optional part present in some and absent in
    /// others.
    pub(crate) fn samples() -> Vec<Record<'static>> {
        let file = NewInode {
            id: id(1025, 7),
            mode: libc::S_IFREG | 0o644,
            uid: 1000,
            gid: 100,
            rdev: 0,
            target: b"",
            time: t(1_700_000_000),
            access_acl: b"",
            default_acl: b"",
        };
        let link = NewInode {
            mode: libc::S_IFLNK | 0o777,
            target: b"../some/where",
            ..file
        };
        vec![
            Record::Root {
                inode: NewInode {
                    id: InodeId::ROOT,
                    mode: libc::S_IFDIR | 0o1777,
                    ..file
                },
            },
            Record::Create {
                dir: InodeId::ROOT,
                name: b"f",
                cookie: FIRST_COOKIE + 1,
                inode: file,
                flags: 0,
            },
            Record::Create {
                dir: id(9, 3),
                name: &[0xFF; 255],
                cookie: FIRST_COOKIE << 3,
                inode: link,
                flags: 0,
            },
            Record::Link {
                dir: id(9, 3),
                name: b"hard",
                cookie: FIRST_COOKIE + 2,
                inode: id(1025, 7),
                time: t(-5),
            },
            Record::Remove {
                dir: id(9, 3),
                name: b"hard",
                inode: id(1025, 7),
                time: t(0),
            },
            Record::Rename {
                from: id(9, 3),
                from_name: b"a",
                to: id(10, 4),
                to_name: b"b",
                inode: id(1025, 7),
                replaced: None,
                exchange: false,
                cookie: FIRST_COOKIE + 9,
                time: t(1),
            },
            Record::Rename {
                from: id(9, 3),
                from_name: b"a",
                to: id(9, 3),
                to_name: b"b",
                inode: id(1025, 7),
                replaced: Some(id(1026, 8)),
                exchange: true,
                cookie: 0,
                time: t(2),
            },
            Record::SetAttr {
                inode: id(1025, 7),
                change: AttrChange::default(),
            },
            Record::SetAttr {
                inode: id(1025, 7),
                change: AttrChange {
                    mode: Some(libc::S_IFREG | 0o4755),
                    uid: Some(0),
                    gid: Some(u32::MAX),
                    size: Some(u64::MAX >> 1),
                    atime: Some(t(3)),
                    mtime: Some(t(4)),
                    ctime: Some(t(5)),
                },
            },
            Record::Write {
                inode: id(1025, 7),
                offset: 4090,
                data: b"0123456789",
                time: t(6),
            },
            Record::Allocate {
                inode: id(1025, 7),
                offset: 0,
                len: 1 << 20,
                keep_size: true,
                time: t(7),
            },
            Record::Punch {
                inode: id(1025, 7),
                offset: 100,
                len: 8192,
                time: t(8),
            },
            Record::SetXattr {
                inode: id(1025, 7),
                name: b"user.k",
                value: b"",
                time: t(9),
            },
            Record::RemoveXattr {
                inode: id(1025, 7),
                name: b"user.k",
                time: t(10),
            },
            Record::Free { inode: id(1025, 7) },
            Record::Create {
                dir: id(9, 3),
                name: b"with-acls",
                cookie: FIRST_COOKIE + 10,
                inode: NewInode {
                    mode: libc::S_IFDIR | 0o750,
                    access_acl: ACL,
                    default_acl: ACL,
                    ..file
                },
                flags: 0,
            },
            Record::SetAcl {
                inode: id(1025, 7),
                default: false,
                acl: ACL,
                mode: libc::S_IFREG | 0o640,
                time: t(11),
            },
            Record::SetAcl {
                inode: id(1025, 7),
                default: true,
                acl: b"",
                mode: libc::S_IFDIR | 0o755,
                time: t(12),
            },
            Record::SetFlags {
                inode: id(1025, 7),
                flags: flags::IMMUTABLE | flags::NOATIME,
                time: t(13),
            },
            Record::SetFlags {
                inode: id(1025, 7),
                flags: 0,
                time: t(14),
            },
            Record::Create {
                dir: id(9, 3),
                name: b"inherits",
                cookie: FIRST_COOKIE + 11,
                inode: file,
                flags: flags::NODUMP,
            },
            Record::RenameWhiteout {
                from: id(9, 3),
                from_name: b"a",
                to: id(10, 4),
                to_name: b"b",
                inode: id(1025, 7),
                replaced: None,
                cookie: FIRST_COOKIE + 12,
                time: t(15),
                whiteout: whiteout(),
                whiteout_cookie: FIRST_COOKIE + 13,
                whiteout_flags: 0,
            },
            Record::RenameWhiteout {
                from: id(9, 3),
                from_name: b"a",
                to: id(9, 3),
                to_name: b"b",
                inode: id(1025, 7),
                replaced: Some(id(1026, 8)),
                cookie: 0,
                time: t(16),
                whiteout: NewInode {
                    access_acl: ACL,
                    ..whiteout()
                },
                whiteout_cookie: FIRST_COOKIE + 14,
                whiteout_flags: flags::NODUMP | flags::NOATIME,
            },
            Record::Tmpfile {
                inode: file,
                flags: 0,
            },
            Record::Tmpfile {
                inode: NewInode {
                    id: id(1028, 10),
                    mode: libc::S_IFREG | 0o600,
                    access_acl: ACL,
                    ..file
                },
                flags: flags::NOATIME,
            },
        ]
    }

    fn whiteout() -> NewInode<'static> {
        NewInode {
            id: id(1027, 9),
            mode: libc::S_IFCHR,
            uid: 1000,
            gid: 100,
            rdev: 0,
            target: b"",
            time: t(15),
            access_acl: b"",
            default_acl: b"",
        }
    }

    /// `u::rw-,u:1000:r--,g::r--,m::r--,o::---`
    const ACL: &[u8] = b"\x02\x00\x00\x00\x01\x00\x06\x00\xff\xff\xff\xff\x02\x00\x04\x00\xe8\x03\x00\x00\x04\x00\x04\x00\xff\xff\xff\xff\x10\x00\x04\x00\xff\xff\xff\xff\x20\x00\x00\x00\xff\xff\xff\xff";

    #[test]
    fn every_kind_round_trips() {
        for r in samples() {
            let b = r.to_bytes();
            assert_eq!(Record::decode(&b), Ok(r), "{r:?}");
        }
    }

    /// A summary gives what decoding gives, for every kind, and refuses what decoding
    /// refuses (with the same error) for the kinds it reads: every cut, extension and byte
    /// changed.
    #[test]
    fn a_summary_agrees_with_decoding() {
        let summarized = |b: &[u8]| match b.first() {
            Some(
                &(tag::CREATE | tag::CREATE_WITH_FLAGS | tag::REMOVE | tag::FREE | tag::RENAME),
            ) => Record::decode(b).map(|r| RecordSummary::of(&r)),
            _ => Ok(RecordSummary::Other),
        };
        for r in samples() {
            let b = r.to_bytes();
            assert_eq!(
                RecordSummary::decode(&b),
                Ok(RecordSummary::of(&r)),
                "{r:?}"
            );
            let mut variants: Vec<Vec<u8>> = (0..b.len()).map(|cut| b[..cut].to_vec()).collect();
            variants.push([&b[..], &[0]].concat());
            for at in 0..b.len() {
                for v in [0u8, 1, 0x7f, 0x80, 0xff, b[at] ^ 1] {
                    let mut m = b.clone();
                    m[at] = v;
                    variants.push(m);
                }
            }
            for v in variants {
                assert_eq!(
                    RecordSummary::decode(&v),
                    summarized(&v),
                    "{r:?} as {v:02x?}"
                );
            }
        }
    }

    #[test]
    fn every_truncation_and_every_extension_is_refused() {
        for r in samples() {
            let b = r.to_bytes();
            for cut in 0..b.len() {
                assert!(Record::decode(&b[..cut]).is_err(), "{r:?} cut at {cut}");
            }
            let mut longer = b.clone();
            longer.push(0);
            let e = Record::decode(&longer).unwrap_err();
            assert_eq!(e.offset, b.len());
        }
    }

    #[test]
    fn bad_fields_are_named_with_their_offset() {
        let mut b = Record::Free { inode: id(5, 1) }.to_bytes();
        b[0] = 200;
        assert_eq!(
            Record::decode(&b),
            Err(DecodeError {
                offset: 0,
                what: "unknown record tag"
            })
        );
        let b = [tag::FREE, 0, 1]; // inode 0
        assert_eq!(
            Record::decode(&b).unwrap_err().what,
            "inode number out of range"
        );
        let rm = |name: &'static [u8]| Record::Remove {
            dir: id(9, 3),
            name,
            inode: id(5, 1),
            time: t(0),
        };
        for bad in [&b"a/b"[..], b"a\0", b".", b".."] {
            let e = Record::decode(&rm(bad).to_bytes()).unwrap_err();
            assert_eq!((e.offset, e.what), (3, "invalid entry name"), "{bad:?}");
        }
        let mut b = Vec::new();
        let mut e = Enc(&mut b);
        e.u8(tag::WRITE);
        e.id(id(5, 1));
        e.u64(0);
        e.u64(0);
        e.u32(1_000_000_000);
        e.bytes(b"x");
        assert_eq!(
            Record::decode(&b).unwrap_err().what,
            "nanoseconds out of range"
        );
        let link = |cookie| Record::Link {
            dir: id(9, 3),
            name: b"x",
            cookie,
            inode: id(5, 1),
            time: t(0),
        };
        for bad in [0, FIRST_COOKIE - 1, 65 << 48, u64::MAX] {
            let e = Record::decode(&link(bad).to_bytes()).unwrap_err();
            assert_eq!(e.what, "readdir cookie out of range", "{bad:#x}");
        }
        for good in [FIRST_COOKIE, (65 << 48) - 1] {
            assert!(Record::decode(&link(good).to_bytes()).is_ok(), "{good:#x}");
        }
    }

    #[test]
    fn numbers_have_one_encoding() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, 1 << 48, u64::MAX] {
            let mut b = Vec::new();
            Enc(&mut b).u64(v);
            let mut d = Dec::new(&b);
            assert_eq!(d.run(Dec::u64), Ok(v));
            assert_eq!(d.at, b.len());
        }
        let refused = |b: &[u8]| Dec::new(b).run(Dec::u64).unwrap_err().what;
        assert_eq!(refused(&[0x80, 0x00]), "number not in its shortest form");
        assert_eq!(refused(&[0xff; 10]), "number out of range");
        assert_eq!(refused(&[0x80]), "record ends early");
        let mut big = [0xff; 10];
        big[9] = 0x02; // 2^64
        assert_eq!(refused(&big), "number out of range");
        let mut b = Vec::new();
        Enc(&mut b).u64(1 << 32);
        assert_eq!(
            Dec::new(&b).run(Dec::u32).unwrap_err().what,
            "number out of range"
        );
        for s in [0i64, -1, 1, i64::MIN, i64::MAX, 1_700_000_000] {
            let mut b = Vec::new();
            Enc(&mut b).time(Timespec::new(s, 5));
            assert_eq!(Dec::new(&b).run(Dec::time), Ok(Timespec::new(s, 5)));
        }
    }

    /// A number reads the same, to the same length, and is refused the same way, whatever
    /// bytes follow it in the record.
    #[test]
    fn numbers_read_whole_words_and_bytes_alike() {
        let mut values = vec![0u64, u64::MAX];
        for k in 1..64 {
            values.extend([(1u64 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        for v in values {
            let mut b = Vec::new();
            Enc(&mut b).u64(v);
            let n = b.len();
            for tail in 0..10 {
                let mut t = b.clone();
                t.extend(std::iter::repeat_n(0xa5, tail));
                let mut d = Dec::new(&t);
                assert_eq!(d.run(Dec::u64), Ok(v), "{v} with {tail} bytes after");
                assert_eq!(d.at, n, "{v} with {tail} bytes after");
            }
        }
        // Longer forms than the shortest, of every length, with and without bytes after.
        for len in 2..=10 {
            for tail in [0, 8] {
                let mut t = vec![0x81; len - 1];
                t.push(0);
                t.extend(std::iter::repeat_n(0, tail));
                let e = Dec::new(&t).run(Dec::u64).unwrap_err();
                let want = ("number not in its shortest form", 0);
                assert_eq!((e.what, e.offset), want, "{len} bytes, {tail} after");
            }
        }
        // Cut short, wherever the cut falls.
        for len in 1..10 {
            let t = vec![0x80; len];
            let e = Dec::new(&t).run(Dec::u64).unwrap_err();
            assert_eq!((e.what, e.offset), ("record ends early", len));
        }
    }

    /// The sizes docs/RECORDS.md quotes for the records of a create and an unlink.
    #[test]
    fn common_records_are_small() {
        let new = NewInode {
            id: id(123_456, 3),
            mode: libc::S_IFREG | 0o644,
            uid: 1000,
            gid: 1000,
            rdev: 0,
            target: b"",
            time: Timespec::new(1_800_000_000, 123_456_789),
            access_acl: b"",
            default_acl: b"",
        };
        let create = Record::Create {
            dir: id(5000, 1),
            name: b"file-000123",
            cookie: FIRST_COOKIE + 12_345_678,
            inode: new,
            flags: 0,
        };
        let remove = Record::Remove {
            dir: id(5000, 1),
            name: b"file-000123",
            inode: id(123_456, 3),
            time: Timespec::new(1_800_000_000, 123_456_789),
        };
        let free = Record::Free {
            inode: id(123_456, 3),
        };
        let sizes = [create, remove, free].map(|r| r.to_bytes().len());
        assert_eq!(sizes, [47, 29, 5]);
    }

    #[test]
    fn flags_and_whiteouts_are_checked() {
        let mut b = Record::SetFlags {
            inode: id(5, 1),
            flags: flags::APPEND,
            time: t(0),
        }
        .to_bytes();
        assert_eq!(b[3], flags::APPEND as u8);
        b[3] = 0x8; // FS_SYNC_FL
        let e = Record::decode(&b).unwrap_err();
        assert_eq!((e.offset, e.what), (3, "unknown inode flags"));
        let create = |flags| Record::Create {
            dir: id(9, 3),
            name: b"x",
            cookie: FIRST_COOKIE,
            inode: whiteout(),
            flags,
        };
        // A create with no flags is a plain Create; with flags, they follow the inode.
        assert_eq!(create(0).to_bytes()[0], tag::CREATE);
        let mut b = create(flags::NODUMP).to_bytes();
        assert_eq!(b[0], tag::CREATE_WITH_FLAGS);
        assert_eq!(*b.last().unwrap(), flags::NODUMP as u8);
        for (f, what) in [
            (0, "inherited flags empty"),
            (flags::IMMUTABLE as u8, "unknown inode flags"),
        ] {
            *b.last_mut().unwrap() = f;
            assert_eq!(Record::decode(&b).unwrap_err().what, what);
        }
        let rw = |whiteout| Record::RenameWhiteout {
            from: id(9, 3),
            from_name: b"a",
            to: id(9, 3),
            to_name: b"b",
            inode: id(1025, 7),
            replaced: None,
            cookie: FIRST_COOKIE,
            time: t(0),
            whiteout,
            whiteout_cookie: FIRST_COOKIE + 1,
            whiteout_flags: 0,
        };
        for w in [
            NewInode {
                rdev: 1,
                ..whiteout()
            },
            NewInode {
                mode: libc::S_IFREG,
                ..whiteout()
            },
        ] {
            let e = Record::decode(&rw(w).to_bytes()).unwrap_err();
            assert_eq!(e.what, "whiteout is not a character device 0/0");
        }
        let mut b = rw(whiteout()).to_bytes();
        let shape = 1 + 2 + 2 + 2 + 2 + 3; // tag, 9.3, "a", 9.3, "b", 1025.7
        b[shape] = 2; // an exchange bit: no such shape for a whiteout
        assert_eq!(Record::decode(&b).unwrap_err().what, "unknown rename flags");
    }

    #[test]
    fn a_tmpfile_is_a_plain_regular_file() {
        let file = NewInode {
            mode: libc::S_IFREG | 0o600,
            ..whiteout()
        };
        let tmp = |inode, flags| Record::Tmpfile { inode, flags };
        for bad in [
            NewInode {
                mode: libc::S_IFDIR | 0o700,
                ..file
            },
            NewInode {
                mode: libc::S_IFLNK | 0o777,
                target: b"t",
                ..file
            },
            NewInode { rdev: 5, ..file },
            NewInode {
                target: b"t",
                ..file
            },
            NewInode {
                default_acl: ACL,
                ..file
            },
        ] {
            let e = Record::decode(&tmp(bad, 0).to_bytes()).unwrap_err();
            assert_eq!(
                (e.offset, e.what),
                (1, "tmpfile is not a plain regular file"),
                "{bad:?}"
            );
        }
        let e = Record::decode(&tmp(file, flags::APPEND).to_bytes()).unwrap_err();
        assert_eq!(e.what, "unknown inode flags", "only inherited flags");
        let ok = tmp(file, flags::NODUMP);
        assert_eq!(Record::decode(&ok.to_bytes()), Ok(ok));
    }

    /// docs/RECORDS.md, read at build time: its worked example decodes to the record it
    /// describes, and its table of kinds lists the tags the encoder writes.
    #[test]
    fn the_format_document_matches_the_code() {
        let doc = include_str!("../../../docs/RECORDS.md");
        let example = doc
            .split("```text\n")
            .nth(1)
            .and_then(|s| s.split("```").next())
            .expect("the example block");
        let bytes: Vec<u8> = example
            .lines()
            .flat_map(|l| {
                l.split_whitespace()
                    .take_while(|w| w.len() == 2 && u8::from_str_radix(w, 16).is_ok())
                    .map(|w| u8::from_str_radix(w, 16).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        let want = Record::Create {
            dir: InodeId::ROOT,
            name: b"f",
            cookie: FIRST_COOKIE + 1,
            inode: NewInode {
                id: id(1025, 7),
                mode: libc::S_IFREG | 0o644,
                uid: 1000,
                gid: 100,
                rdev: 0,
                target: b"",
                time: Timespec::new(1_700_000_000, 500_000_000),
                access_acl: b"",
                default_acl: b"",
            },
            flags: 0,
        };
        assert_eq!(Record::decode(&bytes), Ok(want));
        assert_eq!(want.to_bytes(), bytes);
        // "| 2 | Create |" rows of the kinds table, against one sample of each kind.
        let kinds: Vec<(u8, &str)> = doc
            .lines()
            .filter_map(|l| {
                let mut cells = l.split('|').map(str::trim).skip(1);
                let tag = cells.next()?.parse().ok()?;
                let kind = cells.next()?;
                (!kind.contains(' ')).then_some((tag, kind))
            })
            .collect();
        let mut seen: Vec<(u8, String)> = samples()
            .iter()
            .map(|r| {
                let kind = format!("{r:?}");
                let kind = kind.split([' ', '{']).next().unwrap().to_string();
                (r.to_bytes()[0], kind)
            })
            .collect();
        seen.sort();
        seen.dedup();
        let documented: Vec<(u8, String)> = kinds.iter().map(|&(t, k)| (t, k.into())).collect();
        assert_eq!(documented, seen);
    }
}
