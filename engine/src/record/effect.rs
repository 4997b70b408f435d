//! What each record does to an inode's attributes, written once.
//!
//! Two places apply records to attributes: the engine, to a live inode's values inside its
//! attribute seqlock (`fs/apply.rs`, live and in recovery), and a store's checkpoint, to the
//! inode values it keeps (the disk store's `checkpoint/apply.rs`). Both go through the
//! functions here, over [`Attributes`], so that a record means the same thing to both: a
//! checkpoint loaded again gives the attributes that replaying its records would.
//!
//! Times follow one rule: a time a record carries is set exactly where the record chose it
//! (a `SetAttr`'s times, a write's mtime), and advanced to ([`Timespec::advance`]) where
//! other changes of the same inode may have stamped it later within the clock's lag (the
//! ctime of a status change, a directory's mtime and ctime when its entries change).

use super::AttrChange;
use crate::attr::flag_bits::flags;
use crate::time::Timespec;

/// An inode's attributes as records change them: implemented by the engine's live values
/// and by a store's kept inode values.
pub trait Attributes {
    /// Type and permission bits.
    fn mode(&mut self) -> &mut u32;
    /// Owner.
    fn uid(&mut self) -> &mut u32;
    /// Group.
    fn gid(&mut self) -> &mut u32;
    /// Size in bytes.
    fn size(&mut self) -> &mut u64;
    /// Access time.
    fn atime(&mut self) -> &mut Timespec;
    /// Modification time.
    fn mtime(&mut self) -> &mut Timespec;
    /// Change time.
    fn ctime(&mut self) -> &mut Timespec;
    /// Inode flags: the user's (`FS_IMMUTABLE_FL` and the other `chattr` flags) and any the
    /// implementation keeps beside them, which records leave alone.
    fn flags(&mut self) -> &mut u32;
}

/// Implements [`Attributes`] for a struct with fields `mode`, `uid`, `gid`, `flags` (u32),
/// `size` (u64), `atime`, `mtime` and `ctime` ([`Timespec`]).
#[macro_export]
macro_rules! impl_attributes {
    ($t:ty) => {
        impl $crate::Attributes for $t {
            fn mode(&mut self) -> &mut u32 {
                &mut self.mode
            }
            fn uid(&mut self) -> &mut u32 {
                &mut self.uid
            }
            fn gid(&mut self) -> &mut u32 {
                &mut self.gid
            }
            fn size(&mut self) -> &mut u64 {
                &mut self.size
            }
            fn atime(&mut self) -> &mut $crate::Timespec {
                &mut self.atime
            }
            fn mtime(&mut self) -> &mut $crate::Timespec {
                &mut self.mtime
            }
            fn ctime(&mut self) -> &mut $crate::Timespec {
                &mut self.ctime
            }
            fn flags(&mut self) -> &mut u32 {
                &mut self.flags
            }
        }
    };
}

impl AttrChange {
    /// A `SetAttr`: every field present is set exactly (the mode's type bits stay). A size
    /// changes the size only; what it does to the file's pages is the caller's.
    pub fn apply(&self, v: &mut impl Attributes) {
        if let Some(mode) = self.mode {
            let m = v.mode();
            *m = (*m & libc::S_IFMT) | (mode & 0o7777);
        }
        set(v.uid(), self.uid);
        set(v.gid(), self.gid);
        set(v.size(), self.size);
        set(v.atime(), self.atime);
        set(v.mtime(), self.mtime);
        set(v.ctime(), self.ctime);
    }
}

fn set<T>(field: &mut T, to: Option<T>) {
    if let Some(x) = to {
        *field = x;
    }
}

/// A status change at `time` (a link, an unlink, a rename of the inode, an xattr): ctime
/// advances to it.
pub fn status_changed(v: &mut impl Attributes, time: Timespec) {
    let c = v.ctime();
    *c = c.advance(time);
}

/// A directory's entries changed at `time` (a name made, removed or moved in it): mtime and
/// ctime advance to it.
pub fn entries_changed(v: &mut impl Attributes, time: Timespec) {
    let m = v.mtime();
    *m = m.advance(time);
    status_changed(v, time);
}

/// A file's contents changed at `time` (`Write`, `Allocate`, `Punch`): the size grows to
/// `end` if given, mtime is `time`, ctime advances to it.
pub fn contents_changed(v: &mut impl Attributes, time: Timespec, end: Option<u64>) {
    if let Some(end) = end {
        let s = v.size();
        *s = (*s).max(end);
    }
    *v.mtime() = time;
    status_changed(v, time);
}

/// A `SetFlags`: the user flags become `user` (others the implementation keeps stay), ctime
/// advances to `time`.
pub fn flags_set(v: &mut impl Attributes, user: u32, time: Timespec) {
    let f = v.flags();
    *f = (*f & !flags::USER) | (user & flags::USER);
    status_changed(v, time);
}

/// A `SetAcl`: the mode becomes `mode` (an access ACL's permission bits), ctime advances to
/// `time`.
pub fn acl_set(v: &mut impl Attributes, mode: u32, time: Timespec) {
    *v.mode() = mode;
    status_changed(v, time);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    struct V {
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        atime: Timespec,
        mtime: Timespec,
        ctime: Timespec,
        flags: u32,
    }

    crate::impl_attributes!(V);

    fn t(s: i64) -> Timespec {
        Timespec::new(s, 0)
    }

    #[test]
    fn a_setattr_sets_what_it_carries_and_keeps_the_type() {
        let mut v = V {
            mode: libc::S_IFDIR | 0o755,
            ctime: t(100),
            ..V::default()
        };
        AttrChange {
            mode: Some(libc::S_IFREG | 0o4700),
            size: Some(7),
            ctime: Some(t(50)),
            ..AttrChange::default()
        }
        .apply(&mut v);
        assert_eq!(v.mode, libc::S_IFDIR | 0o4700);
        assert_eq!(
            (v.size, v.uid, v.ctime),
            (7, 0, t(50)),
            "set exactly, not advanced"
        );
    }

    #[test]
    fn contents_set_mtime_and_advance_ctime() {
        let mut v = V {
            size: 10,
            mtime: t(100),
            ctime: t(100),
            ..V::default()
        };
        contents_changed(&mut v, t(95), Some(5));
        assert_eq!(v.size, 10, "a size only grows");
        assert_eq!(v.mtime, t(95), "the record's mtime, exactly");
        assert_eq!(v.ctime, t(100), "a ctime within the lag ahead stays");
        contents_changed(&mut v, t(200), Some(20));
        assert_eq!((v.size, v.mtime, v.ctime), (20, t(200), t(200)));
    }

    #[test]
    fn flags_replace_the_users_and_keep_the_others() {
        let inner = 1 << 20;
        assert_eq!(inner & flags::USER, 0);
        let mut v = V {
            flags: inner | flags::APPEND,
            ..V::default()
        };
        flags_set(&mut v, flags::NODUMP, t(3));
        assert_eq!(v.flags, inner | flags::NODUMP);
        assert_eq!(v.ctime, t(3));
        acl_set(&mut v, libc::S_IFREG | 0o640, t(4));
        assert_eq!((v.mode, v.ctime), (libc::S_IFREG | 0o640, t(4)));
        entries_changed(&mut v, t(5));
        assert_eq!((v.mtime, v.ctime), (t(5), t(5)));
    }
}
