//! POSIX access control lists: the `system.posix_acl_access` and `system.posix_acl_default`
//! attributes, with the semantics of Linux tmpfs (which supports them).
//!
//! The engine stores an inode's ACLs in its extended attributes, under those two names, and
//! marks their presence with the inode flags `ACL` and `DEFAULT_ACL`, so a permission check
//! on an inode without an access ACL reads nothing more than its mode (`fs/mod.rs`,
//! `Filesystem::permission`). Setting, removing and chmod-ing an ACL is one
//! `Record::SetAcl`, made under the inode's xattr shard lock and then its attribute seqlock
//! (`fs/apply.rs`). This module is the computation, on values it is handed (no locks, no
//! I/O, so it may run inside the attribute seqlock's write section):
//! - [`Acl`]: a valid ACL, parsed from and rendered to the attribute value format Linux uses
//!   (a little-endian `u32` version, 2, then one little-endian `{u16 tag, u16 perm, u32 id}`
//!   per entry);
//! - [`set_xattr`] / [`remove_xattr`]: what `setxattr` and `removexattr` of the two names
//!   do, errors included and in the kernel's order (`getxattr` returns the stored bytes);
//! - [`check`] / [`permission`]: the access check for a non-root caller on an inode that has
//!   an access ACL;
//! - [`Acl::chmod`]: what `chmod` does to an access ACL;
//! - [`inherit`]: the mode and the ACLs of a new inode created in a directory.
//!
//! Linux behaviours the engine has to keep, each checked against the kernel by the
//! differential test at the bottom of this file:
//! - An access ACL that mode bits can express (exactly USER_OBJ, GROUP_OBJ and OTHER) is not
//!   stored: setting it sets the mode's permission bits and removes a stored access ACL. A
//!   MASK entry alone makes an ACL not expressible, so every stored access ACL has a MASK,
//!   and the mode's group bits are that MASK's permissions ([`Acl::chmod`] keeps them so).
//!   Default ACLs are stored as given, even the 3-entry ones.
//! - Entries keep the order they were set in. The kernel requires the class order (USER_OBJ,
//!   USER..., GROUP_OBJ, GROUP..., MASK, OTHER) but neither sorts named entries by id nor
//!   refuses two entries with the same tag and id; `getxattr` returns them as set, and
//!   [`permission`] uses the first that matches.
//! - An empty value or a bare header (no entries) removes the ACL, as `removexattr` does;
//!   neither fails with ENODATA when there is nothing to remove. (`setfacl -k` removes the
//!   default ACL so; `setfacl -b` removes the access ACL by setting an expressible one.)
//!   `XATTR_CREATE` and `XATTR_REPLACE` are ignored.
//! - Setting or removing an access ACL, expressible or not, clears `S_ISGID` when the caller
//!   is neither root nor in the file's group; removing one leaves the permission bits alone.
//! - Symlinks have no ACLs (EOPNOTSUPP); other file types do. A default ACL on a
//!   non-directory is refused with EACCES, but removing it succeeds and changes nothing.
//! - Every successful set or remove changes ctime, except the no-op removal above
//!   ([`SetOutcome::Nothing`]).
//! - `listxattr` lists a name only while that ACL is stored, and `chown` leaves ACLs
//!   unchanged.
//! - Root (uid 0) is handled by the caller, as in `perm::check`: an ACL is only consulted for
//!   other callers.

use std::fmt::{self, Write as _};

use crate::attr::AttrVals;
use crate::errno::{Errno, Result};
use crate::limits::XATTR_SIZE_MAX;
use crate::perm::Ctx;

/// Name of the access ACL attribute.
pub(crate) const ACL_ACCESS_NAME: &[u8] = b"system.posix_acl_access";
/// Name of the default ACL attribute (directories only).
pub(crate) const ACL_DEFAULT_NAME: &[u8] = b"system.posix_acl_default";

/// Version number in the value header (`POSIX_ACL_XATTR_VERSION`).
const VERSION: u32 = 2;
const HEADER_LEN: usize = 4;
const ENTRY_LEN: usize = 8;
/// Id written for entries that carry none (`ACL_UNDEFINED_ID`); also an invalid uid/gid.
const UNDEFINED_ID: u32 = u32::MAX;

/// Wire tag of the file owner's entry.
pub(crate) const TAG_USER_OBJ: u16 = 0x01;
/// Wire tag of a named user's entry.
pub(crate) const TAG_USER: u16 = 0x02;
/// Wire tag of the owning group's entry.
pub(crate) const TAG_GROUP_OBJ: u16 = 0x04;
/// Wire tag of a named group's entry.
pub(crate) const TAG_GROUP: u16 = 0x08;
/// Wire tag of the mask entry.
pub(crate) const TAG_MASK: u16 = 0x10;
/// Wire tag of the entry for everyone else.
pub(crate) const TAG_OTHER: u16 = 0x20;

/// Which of the two ACLs of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AclKind {
    /// `system.posix_acl_access`: decides access to the inode.
    Access,
    /// `system.posix_acl_default`: inherited by inodes created in a directory.
    Default,
}

impl AclKind {
    /// The kind an attribute name denotes, if it is one of the two ACL names.
    pub(crate) fn from_name(name: &[u8]) -> Option<AclKind> {
        match name {
            ACL_ACCESS_NAME => Some(AclKind::Access),
            ACL_DEFAULT_NAME => Some(AclKind::Default),
            _ => None,
        }
    }

    /// The attribute name of this kind.
    #[cfg(test)]
    pub(crate) fn name(self) -> &'static [u8] {
        match self {
            AclKind::Access => ACL_ACCESS_NAME,
            AclKind::Default => ACL_DEFAULT_NAME,
        }
    }
}

/// Whom an entry is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    /// The file's owner.
    UserObj,
    /// The user with this uid.
    User(u32),
    /// The file's group.
    GroupObj,
    /// The group with this gid.
    Group(u32),
    /// The upper bound on what USER, GROUP_OBJ and GROUP entries grant.
    Mask,
    /// Everyone no other entry matches.
    Other,
}

impl Tag {
    /// The wire tag.
    pub(crate) fn code(self) -> u16 {
        match self {
            Tag::UserObj => TAG_USER_OBJ,
            Tag::User(_) => TAG_USER,
            Tag::GroupObj => TAG_GROUP_OBJ,
            Tag::Group(_) => TAG_GROUP,
            Tag::Mask => TAG_MASK,
            Tag::Other => TAG_OTHER,
        }
    }

    /// The wire id: the uid or gid of a named entry, `0xFFFFFFFF` for the others.
    pub(crate) fn id(self) -> u32 {
        match self {
            Tag::User(id) | Tag::Group(id) => id,
            _ => UNDEFINED_ID,
        }
    }
}

/// One entry: a tag and the permissions it grants (`MAY_READ | MAY_WRITE | MAY_EXEC` bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Whom the entry is about.
    pub tag: Tag,
    /// Permission bits, `0..=7` in a valid ACL.
    pub perm: u32,
}

impl Entry {
    /// An entry.
    #[cfg(test)]
    pub(crate) fn new(tag: Tag, perm: u32) -> Entry {
        Entry { tag, perm }
    }
}

/// A valid ACL: one USER_OBJ, GROUP_OBJ and OTHER entry, named USER and GROUP entries only
/// with a MASK, at most one MASK, all in class order (USER_OBJ, USER..., GROUP_OBJ,
/// GROUP..., MASK, OTHER), permissions within `rwx`, named ids not `0xFFFFFFFF`. Named
/// entries keep the order they were given in (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Acl {
    entries: Box<[Entry]>,
}

/// Reads a little-endian `u16` at `at`.
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Reads a little-endian `u32` at `at`.
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// First stage of parsing, as the kernel orders its checks: the value's shape (EINVAL), its
/// version (EOPNOTSUPP), each entry's tag and named id (EINVAL). `None` when the value has
/// no entries (empty, or a bare header): the ACL is to be removed. Permissions and the
/// entries' structure are checked later by [`validate`].
fn decode(value: &[u8]) -> Result<Option<Vec<Entry>>> {
    if value.is_empty() {
        return Ok(None);
    }
    if value.len() < HEADER_LEN {
        return Err(Errno::EINVAL);
    }
    if le32(value, 0) != VERSION {
        return Err(Errno::EOPNOTSUPP);
    }
    let body = &value[HEADER_LEN..];
    if body.len() % ENTRY_LEN != 0 {
        return Err(Errno::EINVAL);
    }
    if body.is_empty() {
        return Ok(None);
    }
    let mut entries = Vec::with_capacity(body.len() / ENTRY_LEN);
    for e in body.chunks_exact(ENTRY_LEN) {
        let (code, perm, id) = (le16(e, 0), u32::from(le16(e, 2)), le32(e, 4));
        let tag = match code {
            TAG_USER_OBJ => Tag::UserObj,
            TAG_USER if id != UNDEFINED_ID => Tag::User(id),
            TAG_GROUP_OBJ => Tag::GroupObj,
            TAG_GROUP if id != UNDEFINED_ID => Tag::Group(id),
            TAG_MASK => Tag::Mask,
            TAG_OTHER => Tag::Other,
            _ => return Err(Errno::EINVAL),
        };
        entries.push(Entry { tag, perm });
    }
    Ok(Some(entries))
}

/// Second stage of parsing: permissions within `rwx`, and the structure of a valid ACL (see
/// [`Acl`]); EINVAL otherwise.
fn validate(entries: &[Entry]) -> Result<()> {
    // Where we are in the class order: what may come next.
    #[derive(PartialEq, PartialOrd)]
    enum State {
        Start,
        Users,
        Groups,
        AfterMask,
        Done,
    }
    let mut state = State::Start;
    let mut named = false;
    let mut mask = false;
    for e in entries {
        if e.perm & !7 != 0 {
            return Err(Errno::EINVAL);
        }
        state = match (e.tag, state) {
            (Tag::UserObj, State::Start) => State::Users,
            (Tag::User(_), State::Users) => {
                named = true;
                State::Users
            }
            (Tag::GroupObj, State::Users) => State::Groups,
            (Tag::Group(_), State::Groups) => {
                named = true;
                State::Groups
            }
            (Tag::Mask, State::Groups) => {
                mask = true;
                State::AfterMask
            }
            (Tag::Other, State::Groups | State::AfterMask) => State::Done,
            _ => return Err(Errno::EINVAL),
        };
    }
    if state != State::Done || (named && !mask) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

impl Acl {
    /// Parses an attribute value that holds at least one entry. Errors as Linux gives them
    /// for `setxattr`: EINVAL for a value shorter than the header, a length that is not a
    /// whole number of entries, an unknown tag, a named entry with id `0xFFFFFFFF`,
    /// permissions beyond `rwx`, or an invalid structure (see [`Acl`]); EOPNOTSUPP for a
    /// version other than 2. A value with no entries, which `setxattr` takes as removal
    /// ([`set_xattr`]), is not an ACL: EINVAL.
    pub(crate) fn parse(value: &[u8]) -> Result<Acl> {
        match decode(value)? {
            Some(entries) => Acl::from_entries(&entries),
            None => Err(Errno::EINVAL),
        }
    }

    /// The ACL of these entries, in this order, if they make a valid one (EINVAL otherwise).
    pub(crate) fn from_entries(entries: &[Entry]) -> Result<Acl> {
        validate(entries)?;
        Ok(Acl {
            entries: entries.into(),
        })
    }

    /// The 3-entry ACL equivalent to the permission bits of `mode`.
    #[cfg(test)]
    pub(crate) fn from_mode(mode: u32) -> Acl {
        Acl {
            entries: Box::new([
                Entry::new(Tag::UserObj, (mode >> 6) & 7),
                Entry::new(Tag::GroupObj, (mode >> 3) & 7),
                Entry::new(Tag::Other, mode & 7),
            ]),
        }
    }

    /// The attribute value, as `getxattr` returns it: version 2, then the entries in order,
    /// with id `0xFFFFFFFF` for USER_OBJ, GROUP_OBJ, MASK and OTHER.
    pub(crate) fn to_xattr(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in self.entries.iter() {
            out.extend_from_slice(&e.tag.code().to_le_bytes());
            // A valid entry's permissions fit in 3 bits.
            out.extend_from_slice(&(e.perm as u16).to_le_bytes());
            out.extend_from_slice(&e.tag.id().to_le_bytes());
        }
        out
    }

    fn perm_of(&self, tag: Tag) -> Option<u32> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    /// The MASK entry's permissions, if there is one.
    pub(crate) fn mask(&self) -> Option<u32> {
        self.perm_of(Tag::Mask)
    }

    /// The permission bits (`0o777`) that mode bits alone would give, if they express this
    /// ACL exactly: only when it has no named entries and no MASK. An access ACL for which
    /// this is `Some` is not stored; setting it only sets these bits.
    pub(crate) fn equiv_mode(&self) -> Option<u32> {
        // A valid ACL of three entries is USER_OBJ, GROUP_OBJ, OTHER.
        (self.entries.len() == 3).then(|| self.mode_bits())
    }

    /// The permission bits (`0o777`) of a file with this access ACL: owner bits from
    /// USER_OBJ, group bits from MASK if there is one (else from GROUP_OBJ), other bits from
    /// OTHER.
    pub(crate) fn mode_bits(&self) -> u32 {
        let mut owner = 0;
        let mut group_obj = 0;
        let mut mask = None;
        let mut other = 0;
        for e in self.entries.iter() {
            match e.tag {
                Tag::UserObj => owner = e.perm,
                Tag::GroupObj => group_obj = e.perm,
                Tag::Mask => mask = Some(e.perm),
                Tag::Other => other = e.perm,
                Tag::User(_) | Tag::Group(_) => {}
            }
        }
        (owner << 6) | (mask.unwrap_or(group_obj) << 3) | other
    }

    /// What `chmod(mode)` does to an access ACL: USER_OBJ and OTHER take the mode's owner and
    /// other bits; MASK takes its group bits if there is a MASK, else GROUP_OBJ does. Named
    /// entries are kept; the ACL stays valid and, with a MASK, stays stored.
    pub(crate) fn chmod(&mut self, mode: u32) {
        self.limit_or_set(mode, false);
    }

    /// With `limit`, ands the class entries with `mode`'s bits (inheritance); without, sets
    /// them to those bits (chmod). The group class is MASK if there is one, else GROUP_OBJ.
    fn limit_or_set(&mut self, mode: u32, limit: bool) {
        let has_mask = self.mask().is_some();
        for e in self.entries.iter_mut() {
            let bits = match e.tag {
                Tag::UserObj => (mode >> 6) & 7,
                Tag::Mask => (mode >> 3) & 7,
                Tag::GroupObj if !has_mask => (mode >> 3) & 7,
                Tag::Other => mode & 7,
                _ => continue,
            };
            e.perm = if limit { e.perm & bits } else { bits };
        }
    }
}

/// Short text form, as `setfacl --test` prints it: `u::rw-,u:1000:r--,g::r--,m::r--,o::r--`.
impl fmt::Display for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match e.tag {
                Tag::UserObj => f.write_str("u::")?,
                Tag::User(id) => write!(f, "u:{id}:")?,
                Tag::GroupObj => f.write_str("g::")?,
                Tag::Group(id) => write!(f, "g:{id}:")?,
                Tag::Mask => f.write_str("m::")?,
                Tag::Other => f.write_str("o::")?,
            }
            for (bit, c) in [(4, 'r'), (2, 'w'), (1, 'x')] {
                f.write_char(if e.perm & bit != 0 { c } else { '-' })?;
            }
        }
        Ok(())
    }
}

fn file_type(mode: u32) -> u32 {
    mode & libc::S_IFMT
}

/// What a successful `setxattr` or `removexattr` of an ACL name does to the inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SetOutcome {
    /// Nothing, not even ctime: removing the default ACL of a non-directory.
    Nothing,
    /// Set the inode's mode to `mode` (type bits included, as given), replace its ACL of
    /// the kind that was set with `acl` (`None`: remove it if present; the other kind is
    /// untouched), and change ctime.
    Apply {
        /// The new mode.
        mode: u32,
        /// The ACL to store, or `None` to store none.
        acl: Option<Acl>,
    },
}

/// `setxattr(name of kind, value)` by `ctx` on an inode with attributes `a` (flags are
/// ignored for ACL names). Errors in the kernel's order: E2BIG for a value over 64 KiB; the
/// value's shape, version, tags and ids (EINVAL, EOPNOTSUPP; see [`Acl::parse`]);
/// EOPNOTSUPP on a symlink; for a default ACL on a non-directory EACCES, or
/// [`SetOutcome::Nothing`] if the value has no entries; EPERM unless `ctx` is root or the
/// owner; then permissions and structure (EINVAL). A value with no entries removes the ACL.
/// Setting an access ACL sets the mode's permission bits ([`Acl::mode_bits`]) and stores the
/// ACL only if [`Acl::equiv_mode`] is `None`; setting or removing one clears `S_ISGID`
/// unless `ctx` is root or in the inode's group.
pub(crate) fn set_xattr(
    ctx: &Ctx,
    a: &AttrVals,
    kind: AclKind,
    value: &[u8],
) -> Result<SetOutcome> {
    if value.len() > XATTR_SIZE_MAX {
        return Err(Errno::E2BIG);
    }
    let entries = decode(value)?;
    if file_type(a.mode) == libc::S_IFLNK {
        return Err(Errno::EOPNOTSUPP);
    }
    if kind == AclKind::Default && file_type(a.mode) != libc::S_IFDIR {
        return match entries {
            Some(_) => Err(Errno::EACCES),
            None => Ok(SetOutcome::Nothing),
        };
    }
    if !crate::perm::owner_or_root(ctx, a) {
        return Err(Errno::EPERM);
    }
    let acl = entries.map(|e| Acl::from_entries(&e)).transpose()?;
    if kind == AclKind::Default {
        return Ok(SetOutcome::Apply { mode: a.mode, acl });
    }
    let mut mode = a.mode;
    if let Some(acl) = &acl {
        mode = (mode & !0o777) | acl.mode_bits();
    }
    if !crate::perm::in_group_or_fsetid(ctx, a.gid) {
        mode &= !libc::S_ISGID;
    }
    Ok(SetOutcome::Apply {
        mode,
        acl: acl.filter(|a| a.equiv_mode().is_none()),
    })
}

/// `removexattr(name of kind)`: the same as setting an empty value (see [`set_xattr`]); it
/// succeeds when there is no ACL to remove.
pub(crate) fn remove_xattr(ctx: &Ctx, a: &AttrVals, kind: AclKind) -> Result<SetOutcome> {
    set_xattr(ctx, a, kind, &[])
}

/// `getxattr` of an ACL name on an inode with mode `mode` whose stored ACL of that kind is
/// `stored`: EOPNOTSUPP on a symlink, ENODATA when none is stored, else its value. Anyone
/// who can reach the inode may read its ACLs.
#[cfg(test)]
pub(crate) fn get_xattr(mode: u32, stored: Option<&Acl>) -> Result<Vec<u8>> {
    if file_type(mode) == libc::S_IFLNK {
        return Err(Errno::EOPNOTSUPP);
    }
    stored.map(Acl::to_xattr).ok_or(Errno::ENODATA)
}

/// May a non-root caller `uid`, in the groups `in_group` accepts, access for `want`
/// (`MAY_READ | MAY_WRITE | MAY_EXEC` bits) an inode with mode `mode`, owner `owner`, group
/// `group` and access ACL `acl`? Root is the caller's business (`perm::check` lets it
/// through before looking at any ACL).
///
/// As Linux decides it: the owner gets the mode's owner bits. Then, if the mode's group bits
/// (the MASK) are not all clear, the ACL decides (POSIX.1e): a USER entry for `uid` grants
/// its permissions limited by the MASK; otherwise, if the caller is in the owning group or
/// in any GROUP entry's group, access is granted when one of those entries grants `want`
/// and the MASK does too, and refused otherwise; otherwise OTHER decides. If the group bits
/// are all clear, the ACL is not consulted (a Linux shortcut, which lets named users and
/// groups through on OTHER's permissions): the owning group gets nothing, everyone else
/// gets OTHER's bits.
pub(crate) fn permission(
    acl: &Acl,
    mode: u32,
    owner: u32,
    group: u32,
    uid: u32,
    in_group: impl Fn(u32) -> bool,
    want: u32,
) -> Result<()> {
    let want = want & 7;
    let grants = |perm: u32| {
        if want & !perm == 0 {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    };
    if uid == owner {
        return grants((mode >> 6) & 7);
    }
    if mode & 0o070 == 0 {
        return grants(if in_group(group) { 0 } else { mode & 7 });
    }
    let mask = acl.mask().unwrap_or(7);
    if let Some(e) = acl.entries.iter().find(|e| e.tag == Tag::User(uid)) {
        return grants(e.perm & mask);
    }
    let mut member = false;
    for e in acl.entries.iter() {
        let gid = match e.tag {
            Tag::GroupObj => group,
            Tag::Group(gid) => gid,
            _ => continue,
        };
        if in_group(gid) {
            member = true;
            if grants(e.perm).is_ok() {
                return grants(mask);
            }
        }
    }
    if member {
        return Err(Errno::EACCES);
    }
    grants(acl.perm_of(Tag::Other).unwrap_or(0))
}

/// [`permission`] for caller `ctx` (not root) on an inode with attributes `a` and access ACL
/// `acl`. The engine's `perm::check` would call this, after its root case, when the inode
/// has an access ACL, and keep its mode-bit check for inodes without one.
pub(crate) fn check(ctx: &Ctx, a: &AttrVals, acl: &Acl, want: u32) -> Result<()> {
    permission(
        acl,
        a.mode,
        a.uid,
        a.gid,
        ctx.uid,
        |g| ctx.in_group(g),
        want,
    )
}

/// The mode and ACLs of a new inode, from its parent directory's default ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inherited {
    /// The new inode's mode: the requested mode with its permission bits replaced.
    pub mode: u32,
    /// Access ACL to store on the new inode.
    pub access: Option<Acl>,
    /// Default ACL to store on the new inode (directories only).
    pub default: Option<Acl>,
}

/// Mode and ACLs of an inode created with mode `mode` (permission bits, with the setuid,
/// setgid and sticky bits the creating call keeps; other bits pass through), under `umask`,
/// in a directory whose default ACL is `parent_default`. Symlinks get no ACLs: do not call
/// this for them.
///
/// Without a default ACL, the umask applies and nothing is stored. With one, the umask is
/// ignored: the access ACL is the default ACL with USER_OBJ, OTHER, and MASK (GROUP_OBJ if
/// there is no MASK) limited by `mode`'s owner, other and group bits; the mode's permission
/// bits become that ACL's [`Acl::mode_bits`], and the ACL is stored only if mode bits cannot
/// express it. A new directory also takes the default ACL, unchanged, as its own.
pub(crate) fn inherit(
    parent_default: Option<&Acl>,
    mode: u32,
    umask: u32,
    is_dir: bool,
) -> Inherited {
    let Some(default) = parent_default else {
        return Inherited {
            mode: mode & !(umask & 0o777),
            access: None,
            default: None,
        };
    };
    let mut access = default.clone();
    access.limit_or_set(mode, true);
    Inherited {
        mode: (mode & !0o777) | access.mode_bits(),
        access: access.equiv_mode().is_none().then_some(access),
        default: is_dir.then(|| default.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perm::{MAY_EXEC, MAY_READ, MAY_WRITE};
    use crate::time::Timespec;

    const UO: u16 = TAG_USER_OBJ;
    const U: u16 = TAG_USER;
    const GO: u16 = TAG_GROUP_OBJ;
    const G: u16 = TAG_GROUP;
    const M: u16 = TAG_MASK;
    const O: u16 = TAG_OTHER;
    const NONE: u32 = UNDEFINED_ID;

    /// A value in the wire format, from raw `(tag, perm, id)` triples.
    fn wire(version: u32, entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = version.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    /// Entries from the short text form (`u::rw-,u:1000:r,g::r--,m::r,o::-`), unvalidated.
    fn entries(text: &str) -> Vec<Entry> {
        text.split(',')
            .map(|e| {
                let mut parts = e.splitn(3, ':');
                let (t, id, p) = (
                    parts.next().unwrap(),
                    parts.next().unwrap(),
                    parts.next().unwrap(),
                );
                let id = (!id.is_empty()).then(|| id.parse::<u32>().expect("numeric id"));
                let tag = match (t, id) {
                    ("u" | "user", None) => Tag::UserObj,
                    ("u" | "user", Some(id)) => Tag::User(id),
                    ("g" | "group", None) => Tag::GroupObj,
                    ("g" | "group", Some(id)) => Tag::Group(id),
                    ("m" | "mask", None) => Tag::Mask,
                    ("o" | "other", None) => Tag::Other,
                    _ => panic!("bad entry {e:?}"),
                };
                let perm = p.chars().fold(0, |acc, c| {
                    acc | match c {
                        'r' => 4,
                        'w' => 2,
                        'x' => 1,
                        '-' => 0,
                        _ => panic!("bad perm {p:?}"),
                    }
                });
                Entry::new(tag, perm)
            })
            .collect()
    }

    /// A valid ACL from the short text form.
    fn acl(text: &str) -> Acl {
        Acl::from_entries(&entries(text)).unwrap_or_else(|e| panic!("{text}: {e:?}"))
    }

    fn attrs(mode: u32, uid: u32, gid: u32) -> AttrVals {
        let t = Timespec::default();
        AttrVals {
            mode,
            flags: 0,
            uid,
            gid,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    #[test]
    fn wire_format_matches_linux() {
        // The bytes tmpfs returns after `setfacl -m u:1000:rw,m::r` on a 0644 file.
        let linux = "0200000001000600ffffffff02000600e803000004000400ffffffff\
                     10000400ffffffff20000400ffffffff";
        let a = acl("u::rw-,u:1000:rw-,g::r--,m::r--,o::r--");
        let hex: String = a.to_xattr().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, linux);
        assert_eq!(Acl::parse(&a.to_xattr()), Ok(a.clone()));
        assert_eq!(a.to_string(), "u::rw-,u:1000:rw-,g::r--,m::r--,o::r--");
        assert_eq!(a.mask(), Some(4));
        // Ids of USER_OBJ, GROUP_OBJ, MASK and OTHER are ignored, and written as 0xFFFFFFFF.
        let odd = wire(
            2,
            &[(UO, 6, 5), (U, 6, 1000), (GO, 4, 0), (M, 4, 7), (O, 4, 9)],
        );
        assert_eq!(Acl::parse(&odd), Ok(a.clone()));
        assert_eq!(Acl::parse(&odd).unwrap().to_xattr(), a.to_xattr());
    }

    #[test]
    fn wire_errors() {
        let base = [(UO, 6, NONE), (GO, 4, NONE), (O, 4, NONE)];
        let good = wire(2, &base);
        let mut trailing = good.clone();
        trailing.push(0);
        let mut trailing4 = good.clone();
        trailing4.extend_from_slice(&[0; 4]);
        let mut v1_trailing = wire(1, &base);
        v1_trailing.push(0);
        let cases: Vec<(&str, Vec<u8>, Errno)> = vec![
            ("shorter than the header", vec![2, 0, 0], Errno::EINVAL),
            ("version 1", wire(1, &base), Errno::EOPNOTSUPP),
            ("version 0", vec![0; 4], Errno::EOPNOTSUPP),
            ("version 3", wire(3, &base), Errno::EOPNOTSUPP),
            ("version before length", v1_trailing, Errno::EOPNOTSUPP),
            ("trailing byte", trailing, Errno::EINVAL),
            ("trailing half entry", trailing4, Errno::EINVAL),
            ("header only", wire(2, &[]), Errno::EINVAL),
            ("empty", vec![], Errno::EINVAL),
            (
                "tag 0",
                wire(2, &[(UO, 6, NONE), (0, 0, 0), (GO, 4, NONE), (O, 4, NONE)]),
                Errno::EINVAL,
            ),
            (
                "tag 3",
                wire(2, &[(UO, 6, NONE), (3, 0, 0), (GO, 4, NONE), (O, 4, NONE)]),
                Errno::EINVAL,
            ),
            (
                "tag 0x40",
                wire(
                    2,
                    &[(UO, 6, NONE), (GO, 4, NONE), (O, 4, NONE), (0x40, 0, 0)],
                ),
                Errno::EINVAL,
            ),
            (
                "user id -1",
                wire(
                    2,
                    &[
                        (UO, 6, NONE),
                        (U, 6, NONE),
                        (GO, 4, NONE),
                        (M, 4, NONE),
                        (O, 4, NONE),
                    ],
                ),
                Errno::EINVAL,
            ),
            (
                "group id -1",
                wire(
                    2,
                    &[
                        (UO, 6, NONE),
                        (GO, 4, NONE),
                        (G, 6, NONE),
                        (M, 4, NONE),
                        (O, 4, NONE),
                    ],
                ),
                Errno::EINVAL,
            ),
            (
                "perm 8",
                wire(2, &[(UO, 8, NONE), (GO, 4, NONE), (O, 4, NONE)]),
                Errno::EINVAL,
            ),
            (
                "perm 0xffff",
                wire(2, &[(UO, 6, NONE), (GO, 4, NONE), (O, 0xffff, NONE)]),
                Errno::EINVAL,
            ),
        ];
        for (what, value, want) in cases {
            assert_eq!(Acl::parse(&value), Err(want), "{what}");
        }
        assert!(Acl::parse(&good).is_ok());
        // User and group ids 0 are ordinary ids.
        let zero = wire(
            2,
            &[
                (UO, 6, NONE),
                (U, 6, 0),
                (GO, 4, NONE),
                (G, 1, 0),
                (M, 4, NONE),
                (O, 4, NONE),
            ],
        );
        assert_eq!(
            Acl::parse(&zero).unwrap().to_string(),
            "u::rw-,u:0:rw-,g::r--,g:0:--x,m::r--,o::r--"
        );
    }

    #[test]
    fn structure_errors() {
        for bad in [
            "g::r,o::r",
            "u::rw,o::r",
            "u::rw,g::r",
            "u::rw,u::rw,g::r,o::r",
            "u::rw,g::r,g::r,o::r",
            "u::rw,g::r,o::r,o::r",
            "u::rw,g::r,m::r,m::r,o::r",
            "g::r,u::rw,o::r",
            "u::rw,g::r,o::r,m::r",
            "u::rw,g::r,u:5:r,m::r,o::r",
            "u::rw,g:5:r,g::r,m::r,o::r",
            "u::rw,g::r,m::r,u:5:r,o::r",
            "u::rw,u:5:r,g::r,o::r",
            "u::rw,g::r,g:5:r,o::r",
            "u::rw,g::r,m::r",
            "m::r,u::rw,g::r,o::r",
            "u::rw,g::r,o::r,u:5:r",
        ] {
            assert_eq!(
                Acl::from_entries(&entries(bad)),
                Err(Errno::EINVAL),
                "{bad}"
            );
        }
        let mut e = entries("u::rw,g::r,o::r");
        e[1].perm = 8;
        assert_eq!(Acl::from_entries(&e), Err(Errno::EINVAL));
        assert!(Acl::from_entries(&[]).is_err());
    }

    #[test]
    fn named_entries_keep_their_order_and_duplicates() {
        // Linux neither sorts named entries by id nor refuses duplicates; neither do we.
        let text = "u::rw-,u:7:r--,u:3:---,u:3:rwx,g::r--,g:9:-w-,g:9:r--,m::rwx,o::---";
        let a = acl(text);
        assert_eq!(a.to_string(), text);
        assert_eq!(Acl::parse(&a.to_xattr()), Ok(a.clone()));
        // The first entry for uid 3 decides.
        let in_none = |_: u32| false;
        assert_eq!(
            permission(&a, 0o670, 1, 2, 3, in_none, MAY_READ),
            Err(Errno::EACCES)
        );
        // Any of the group entries may grant.
        assert!(permission(&a, 0o670, 1, 2, 4, |g| g == 9, MAY_READ).is_ok());
        assert!(permission(&a, 0o670, 1, 2, 4, |g| g == 9, MAY_WRITE).is_ok());
    }

    #[test]
    fn kinds_and_names() {
        assert_eq!(
            AclKind::from_name(b"system.posix_acl_access"),
            Some(AclKind::Access)
        );
        assert_eq!(
            AclKind::from_name(b"system.posix_acl_default"),
            Some(AclKind::Default)
        );
        assert_eq!(AclKind::from_name(b"system.posix_acl"), None);
        assert_eq!(AclKind::from_name(b"user.posix_acl_access"), None);
        for k in [AclKind::Access, AclKind::Default] {
            assert_eq!(AclKind::from_name(k.name()), Some(k));
        }
    }

    #[test]
    fn equivalence_and_mode_bits() {
        assert_eq!(acl("u::rwx,g::r-x,o::r--").equiv_mode(), Some(0o754));
        assert_eq!(Acl::from_mode(0o100640).to_string(), "u::rw-,g::r--,o::---");
        assert_eq!(Acl::from_mode(0o640).equiv_mode(), Some(0o640));
        // A MASK alone makes an ACL not expressible as a mode.
        let masked = acl("u::rw,g::rw,m::r,o::r");
        assert_eq!(masked.equiv_mode(), None);
        assert_eq!(masked.mode_bits(), 0o644);
        let named = acl("u::rw,u:5:rwx,g::r,m::-w-,o::-");
        assert_eq!(named.equiv_mode(), None);
        assert_eq!(named.mode_bits(), 0o620, "group bits from MASK");
        assert_eq!(acl("u::-,g::rwx,o::x").mode_bits(), 0o071);
    }

    #[test]
    fn chmod_updates_the_class_entries() {
        let mut a = acl("u::rw,u:5:rwx,g::r,g:6:rw,m::rwx,o::r");
        a.chmod(0o751);
        assert_eq!(a.to_string(), "u::rwx,u:5:rwx,g::r--,g:6:rw-,m::r-x,o::--x");
        assert_eq!(a.mode_bits(), 0o751);
        let mut m = acl("u::rw,g::r,m::r,o::r");
        m.chmod(0o070);
        assert_eq!(m.to_string(), "u::---,g::r--,m::rwx,o::---");
        // Without a MASK, GROUP_OBJ takes the group bits.
        let mut plain = Acl::from_mode(0o644);
        plain.chmod(0o4712);
        assert_eq!(plain.to_string(), "u::rwx,g::--x,o::-w-");
        assert_eq!(plain.equiv_mode(), Some(0o712));
    }

    #[test]
    fn permission_algorithm() {
        let a = acl("u::rw,u:10:rwx,u:11:r,g::rw,g:20:r,g:21:x,m::rw,o::r");
        let mode = libc::S_IFREG | a.mode_bits();
        let (owner, group) = (1, 2);
        let p = |uid: u32, groups: &[u32], want: u32| {
            permission(&a, mode, owner, group, uid, |g| groups.contains(&g), want)
        };
        // Owner: the mode's owner bits, whatever groups.
        assert!(p(1, &[2], MAY_READ | MAY_WRITE).is_ok());
        assert_eq!(p(1, &[], MAY_EXEC), Err(Errno::EACCES));
        // Named user, limited by the MASK: rwx & rw-.
        assert!(p(10, &[], MAY_READ | MAY_WRITE).is_ok());
        assert_eq!(p(10, &[], MAY_EXEC), Err(Errno::EACCES));
        // A named user entry decides even when a group entry would grant more.
        assert_eq!(p(11, &[2], MAY_WRITE), Err(Errno::EACCES));
        // Owning group.
        assert!(p(12, &[2], MAY_READ | MAY_WRITE).is_ok());
        // Named group.
        assert!(p(12, &[20], MAY_READ).is_ok());
        assert_eq!(p(12, &[20], MAY_WRITE), Err(Errno::EACCES));
        // Member of a matching group that does not grant: no fallback to OTHER.
        assert_eq!(p(12, &[21], MAY_READ), Err(Errno::EACCES));
        // One matching entry must grant everything wanted; entries do not add up.
        assert_eq!(p(12, &[20, 21], MAY_READ | MAY_EXEC), Err(Errno::EACCES));
        assert!(p(12, &[20, 21], MAY_READ).is_ok());
        // A granting group entry is still limited by the MASK (g:21 has x, the MASK has not).
        assert_eq!(p(12, &[21], MAY_EXEC), Err(Errno::EACCES));
        // Other.
        assert!(p(13, &[], MAY_READ).is_ok());
        assert_eq!(p(13, &[], MAY_WRITE), Err(Errno::EACCES));
        // Nothing wanted: granted.
        assert!(p(12, &[21], 0).is_ok());
    }

    #[test]
    fn permission_with_empty_mask_falls_back_to_mode_bits() {
        // Linux consults the ACL only when the mode's group bits (the MASK) are not all
        // clear: with m::---, named users and groups get OTHER's bits.
        let a = acl("u::rw,u:10:rwx,g::rw,g:20:rwx,m::---,o::r");
        let mode = libc::S_IFREG | a.mode_bits();
        assert_eq!(mode & 0o777, 0o604);
        let p = |uid: u32, groups: &[u32], want: u32| {
            permission(&a, mode, 1, 2, uid, |g| groups.contains(&g), want)
        };
        assert!(p(10, &[], MAY_READ).is_ok());
        assert_eq!(p(10, &[], MAY_WRITE), Err(Errno::EACCES));
        assert!(p(11, &[20], MAY_READ).is_ok());
        assert_eq!(p(11, &[2], MAY_READ), Err(Errno::EACCES), "owning group: 0");
        assert!(p(1, &[], MAY_READ | MAY_WRITE).is_ok());
    }

    #[test]
    fn check_uses_ctx_groups() {
        let a = acl("u::rw,g::-,g:20:rw,m::rw,o::-");
        let v = attrs(libc::S_IFREG | a.mode_bits(), 1, 2);
        assert!(check(&Ctx::user(5, 20), &v, &a, MAY_WRITE).is_ok());
        assert!(check(&Ctx::user(5, 7).with_groups(&[20]), &v, &a, MAY_WRITE).is_ok());
        assert_eq!(
            check(&Ctx::user(5, 7), &v, &a, MAY_READ),
            Err(Errno::EACCES)
        );
        assert_eq!(
            check(&Ctx::user(5, 2), &v, &a, MAY_READ),
            Err(Errno::EACCES)
        );
    }

    #[test]
    fn inherit_without_default_applies_umask() {
        let i = inherit(None, 0o666, 0o022, false);
        assert_eq!(
            i,
            Inherited {
                mode: 0o644,
                access: None,
                default: None
            }
        );
        assert_eq!(inherit(None, 0o4777, 0o027, false).mode, 0o4750);
        assert_eq!(inherit(None, 0o1777, 0o7777, true).mode, 0o1000);
    }

    #[test]
    fn inherit_from_default() {
        let d = acl("u::rwx,u:10:rwx,g::r-x,g:20:rwx,m::rwx,o::r-x");
        // The umask is ignored; the class entries are limited by the requested mode.
        let f = inherit(Some(&d), 0o666, 0o077, false);
        assert_eq!(f.mode, 0o664);
        assert_eq!(
            f.access.as_ref().unwrap().to_string(),
            "u::rw-,u:10:rwx,g::r-x,g:20:rwx,m::rw-,o::r--"
        );
        assert_eq!(f.default, None);
        let f = inherit(Some(&d), 0o640, 0, false);
        assert_eq!(f.mode, 0o640);
        assert_eq!(
            f.access.unwrap().to_string(),
            "u::rw-,u:10:rwx,g::r-x,g:20:rwx,m::r--,o::---"
        );
        // A directory also takes the default ACL as its own; special bits pass through.
        let dir = inherit(Some(&d), 0o1777, 0o022, true);
        assert_eq!(dir.mode, 0o1775);
        assert_eq!(dir.access.as_ref(), Some(&d));
        assert_eq!(dir.default.as_ref(), Some(&d));
        // Without a MASK, GROUP_OBJ is limited; an expressible result is not stored.
        let plain = acl("u::rwx,g::rwx,o::rwx");
        let f = inherit(Some(&plain), 0o4750, 0o077, false);
        assert_eq!(
            f,
            Inherited {
                mode: 0o4750,
                access: None,
                default: None
            }
        );
        let sub = inherit(Some(&plain), 0o755, 0o077, true);
        assert_eq!(
            (sub.mode, sub.access, sub.default),
            (0o755, None, Some(plain.clone()))
        );
        // A MASK alone is kept, so the ACL is stored.
        let m = acl("u::rwx,g::rwx,m::r-x,o::r-x");
        let f = inherit(Some(&m), 0o666, 0o022, false);
        assert_eq!(f.mode, 0o644);
        assert_eq!(f.access.unwrap().to_string(), "u::rw-,g::rwx,m::r--,o::r--");
    }

    #[test]
    fn set_xattr_errors_in_kernel_order() {
        let root = Ctx::root();
        let owner = Ctx::user(500, 501);
        let stranger = Ctx::user(7, 7);
        let file = attrs(libc::S_IFREG | 0o644, 500, 600);
        let dir = attrs(libc::S_IFDIR | 0o755, 500, 600);
        let link = attrs(libc::S_IFLNK | 0o777, 500, 600);
        let good = acl("u::rw,u:5:r,g::r,m::r,o::r").to_xattr();
        let v1 = wire(1, &[(UO, 6, NONE)]);
        let bad_tag = wire(2, &[(UO, 6, NONE), (0x40, 0, 0)]);
        let bad_perm = wire(2, &[(UO, 8, NONE), (GO, 4, NONE), (O, 4, NONE)]);
        let no_other = wire(2, &[(UO, 6, NONE), (GO, 4, NONE)]);
        let hdr = wire(2, &[]);
        let big = vec![0; XATTR_SIZE_MAX + 1];
        use AclKind::{Access, Default};
        let err = |c: &Ctx, a: &AttrVals, k, v: &[u8]| set_xattr(c, a, k, v).err();
        assert_eq!(err(&root, &file, Access, &big), Some(Errno::E2BIG));
        // The value's shape and version come first, even on a symlink or for a stranger.
        assert_eq!(err(&stranger, &link, Access, b"ab"), Some(Errno::EINVAL));
        assert_eq!(err(&stranger, &link, Access, &v1), Some(Errno::EOPNOTSUPP));
        assert_eq!(
            err(&stranger, &file, Default, &bad_tag),
            Some(Errno::EINVAL)
        );
        // Then symlinks, which have no ACLs.
        assert_eq!(err(&root, &link, Access, &good), Some(Errno::EOPNOTSUPP));
        assert_eq!(
            err(&root, &link, Access, &bad_perm),
            Some(Errno::EOPNOTSUPP)
        );
        assert_eq!(err(&root, &link, Default, &hdr), Some(Errno::EOPNOTSUPP));
        // Then a default ACL on a non-directory.
        assert_eq!(err(&stranger, &file, Default, &good), Some(Errno::EACCES));
        assert_eq!(err(&root, &file, Default, &no_other), Some(Errno::EACCES));
        assert_eq!(
            set_xattr(&stranger, &file, Default, &hdr),
            Ok(SetOutcome::Nothing)
        );
        assert_eq!(
            remove_xattr(&stranger, &file, Default),
            Ok(SetOutcome::Nothing)
        );
        // Then ownership.
        assert_eq!(err(&stranger, &file, Access, &bad_perm), Some(Errno::EPERM));
        assert_eq!(err(&stranger, &dir, Default, &hdr), Some(Errno::EPERM));
        assert_eq!(remove_xattr(&stranger, &file, Access), Err(Errno::EPERM));
        // Then the entries.
        assert_eq!(err(&owner, &file, Access, &bad_perm), Some(Errno::EINVAL));
        assert_eq!(err(&owner, &dir, Default, &no_other), Some(Errno::EINVAL));
        assert!(set_xattr(&owner, &dir, Default, &good).is_ok());
    }

    #[test]
    fn set_xattr_outcomes() {
        let root = Ctx::root();
        let sgid_file = attrs(libc::S_IFREG | libc::S_ISGID | 0o755, 500, 600);
        let named = acl("u::rw,u:5:rwx,g::r-x,m::r-x,o::r");
        let apply = |mode, acl| SetOutcome::Apply { mode, acl };
        // A non-expressible access ACL is stored and sets the mode's permission bits.
        assert_eq!(
            set_xattr(&root, &sgid_file, AclKind::Access, &named.to_xattr()),
            Ok(apply(
                libc::S_IFREG | libc::S_ISGID | 0o654,
                Some(named.clone())
            ))
        );
        // An expressible one is not stored.
        let equiv = Acl::from_mode(0o700).to_xattr();
        assert_eq!(
            set_xattr(&root, &sgid_file, AclKind::Access, &equiv),
            Ok(apply(libc::S_IFREG | libc::S_ISGID | 0o700, None))
        );
        // The owner outside the file's group loses S_ISGID; in it, keeps it.
        let out = Ctx::user(500, 501);
        let r = set_xattr(&out, &sgid_file, AclKind::Access, &equiv);
        assert_eq!(r, Ok(apply(libc::S_IFREG | 0o700, None)));
        let member = Ctx::user(500, 501).with_groups(&[600]);
        let r = set_xattr(&member, &sgid_file, AclKind::Access, &equiv);
        assert_eq!(r, Ok(apply(libc::S_IFREG | libc::S_ISGID | 0o700, None)));
        // Removing leaves the permission bits alone, but S_ISGID goes the same way.
        for value in [&[][..], &wire(2, &[])] {
            let r = set_xattr(&out, &sgid_file, AclKind::Access, value);
            assert_eq!(r, Ok(apply(libc::S_IFREG | 0o755, None)));
            let r = set_xattr(&member, &sgid_file, AclKind::Access, value);
            assert_eq!(r, Ok(apply(sgid_file.mode, None)));
        }
        assert_eq!(
            remove_xattr(&out, &sgid_file, AclKind::Access),
            Ok(apply(libc::S_IFREG | 0o755, None))
        );
        // A default ACL is stored as given, even a 3-entry one, and leaves the mode alone.
        let dir = attrs(libc::S_IFDIR | libc::S_ISGID | 0o755, 500, 600);
        let plain = Acl::from_mode(0o750);
        assert_eq!(
            set_xattr(&out, &dir, AclKind::Default, &plain.to_xattr()),
            Ok(apply(dir.mode, Some(plain)))
        );
        assert_eq!(
            remove_xattr(&out, &dir, AclKind::Default),
            Ok(apply(dir.mode, None))
        );
        // FIFOs (and other non-symlink types) have access ACLs.
        let fifo = attrs(libc::S_IFIFO | 0o644, 500, 600);
        assert!(matches!(
            set_xattr(&root, &fifo, AclKind::Access, &named.to_xattr()),
            Ok(SetOutcome::Apply { acl: Some(_), .. })
        ));
    }

    #[test]
    fn get_xattr_cases() {
        let a = acl("u::rw,g::r,m::r,o::r");
        assert_eq!(get_xattr(libc::S_IFREG | 0o644, Some(&a)), Ok(a.to_xattr()));
        assert_eq!(get_xattr(libc::S_IFDIR | 0o755, None), Err(Errno::ENODATA));
        assert_eq!(
            get_xattr(libc::S_IFLNK | 0o777, None),
            Err(Errno::EOPNOTSUPP)
        );
    }

    /// Differential test against the kernel: the same operations on a fresh tmpfs (which
    /// supports POSIX ACLs) and on a model built from this module, comparing after each one
    /// the mode, the raw values of both ACL attributes, and which of `r`, `w`, `x` (all 7
    /// combinations) each of a set of non-root callers may access.
    mod kernel {
        use super::*;
        use crate::perm;
        use std::ffi::{CStr, CString};
        use std::os::unix::ffi::OsStrExt;
        use std::path::Path;
        use std::process::Command;

        /// Credentials of a process.
        #[derive(Clone, Copy, Debug)]
        struct Who {
            uid: u32,
            gid: u32,
            groups: &'static [u32],
        }

        const fn who(uid: u32, gid: u32, groups: &'static [u32]) -> Who {
            Who { uid, gid, groups }
        }

        /// Owner and group of every target inode.
        const OWNER: u32 = 500;
        const GROUP: u32 = 600;
        const ROOT: Who = who(0, 0, &[]);
        /// The owner, not in the file's group.
        const OWNER_OUT: Who = who(OWNER, 501, &[]);
        /// The owner, in the file's group.
        const OWNER_IN: Who = who(OWNER, GROUP, &[]);
        /// Neither owner nor in any group the ACLs name.
        const STRANGER: Who = who(4004, 1000, &[]);

        /// Callers whose access is compared (the ACLs name users 4000, 4001, groups 5000, 5001).
        const CALLERS: &[Who] = &[
            OWNER_OUT,
            OWNER_IN,
            who(4000, 1000, &[]),
            who(4000, GROUP, &[]),
            who(4000, 5000, &[]),
            who(4001, GROUP, &[]),
            who(4001, 1000, &[GROUP, 5001]),
            who(4002, 1000, &[5000]),
            who(4002, 5000, &[GROUP]),
            who(4003, 5001, &[5000]),
            STRANGER,
        ];

        fn ctx(w: Who) -> Ctx {
            Ctx::user(w.uid, w.gid).with_groups(w.groups)
        }

        fn cpath(p: &Path) -> CString {
            CString::new(p.as_os_str().as_bytes()).unwrap()
        }

        fn cname(kind: AclKind) -> &'static CStr {
            match kind {
                AclKind::Access => c"system.posix_acl_access",
                AclKind::Default => c"system.posix_acl_default",
            }
        }

        fn errno() -> i32 {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(254)
        }

        fn to_result(code: i32) -> Result<()> {
            if code == 0 { Ok(()) } else { Err(Errno(code)) }
        }

        /// A tmpfs mounted on a fresh directory, unmounted on drop.
        struct Tmpfs {
            dir: tempfile::TempDir,
        }

        impl Tmpfs {
            /// Mounts one, or says why it cannot and returns `None`.
            fn mount() -> Option<Tmpfs> {
                // SAFETY: geteuid has no preconditions.
                if unsafe { libc::geteuid() } != 0 {
                    eprintln!(
                        "skipped: the kernel differential test mounts a tmpfs and needs root"
                    );
                    return None;
                }
                let dir = tempfile::Builder::new()
                    .prefix("lanefs-acl-")
                    .tempdir()
                    .ok()?;
                let at = cpath(dir.path());
                // SAFETY: every pointer is a NUL-terminated string that outlives the call.
                let rc = unsafe {
                    libc::mount(
                        c"tmpfs".as_ptr(),
                        at.as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        c"mode=0755".as_ptr().cast(),
                    )
                };
                if rc != 0 {
                    eprintln!(
                        "skipped: mount -t tmpfs failed: {}",
                        std::io::Error::last_os_error()
                    );
                    return None;
                }
                let fs = Tmpfs { dir };
                let probe = fs.path().join("probe");
                std::fs::write(&probe, b"").unwrap();
                let value = acl("u::rw,u:4000:r,g::r,m::r,o::r").to_xattr();
                if let Err(e) = k_set(&probe, AclKind::Access, &value, 0, ROOT) {
                    eprintln!("skipped: this kernel's tmpfs does not take POSIX ACLs ({e:?})");
                    return None;
                }
                std::fs::remove_file(&probe).unwrap();
                Some(fs)
            }

            fn path(&self) -> &Path {
                self.dir.path()
            }
        }

        impl Drop for Tmpfs {
            fn drop(&mut self) {
                let at = cpath(self.dir.path());
                // SAFETY: `at` is a NUL-terminated path.
                unsafe { libc::umount2(at.as_ptr(), libc::MNT_DETACH) };
            }
        }

        /// Runs `f` in a forked child with credentials `who` and returns its exit status.
        fn in_child(who: Who, f: impl FnOnce() -> i32) -> i32 {
            let groups: Vec<libc::gid_t> = who.groups.to_vec();
            // SAFETY: the child only makes async-signal-safe libc calls on memory prepared
            // before the fork (`f` must not allocate), then leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
            if pid == 0 {
                // SAFETY: `groups` holds `groups.len()` gids; the id calls take plain values.
                let ok = who.uid == 0
                    || unsafe {
                        libc::setgroups(groups.len(), groups.as_ptr()) == 0
                            && libc::setresgid(who.gid, who.gid, who.gid) == 0
                            && libc::setresuid(who.uid, who.uid, who.uid) == 0
                    };
                let code = if ok { f() } else { 255 };
                // SAFETY: ends the child without running anything of the parent's.
                unsafe { libc::_exit(code) }
            }
            let mut status = 0;
            // SAFETY: `status` is a valid out-pointer and `pid` our child.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            assert_eq!(r, pid);
            assert!(libc::WIFEXITED(status), "child died: {status:#x}");
            libc::WEXITSTATUS(status)
        }

        fn k_set(path: &Path, kind: AclKind, value: &[u8], flags: i32, who: Who) -> Result<()> {
            let p = cpath(path);
            to_result(in_child(who, || {
                // SAFETY: path and name are NUL-terminated, value points to its length.
                let r = unsafe {
                    libc::lsetxattr(
                        p.as_ptr(),
                        cname(kind).as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        flags,
                    )
                };
                if r == 0 { 0 } else { errno() }
            }))
        }

        fn k_remove(path: &Path, kind: AclKind, who: Who) -> Result<()> {
            let p = cpath(path);
            to_result(in_child(who, || {
                // SAFETY: path and name are NUL-terminated.
                let r = unsafe { libc::lremovexattr(p.as_ptr(), cname(kind).as_ptr()) };
                if r == 0 { 0 } else { errno() }
            }))
        }

        fn k_get(path: &Path, kind: AclKind) -> Result<Vec<u8>> {
            let p = cpath(path);
            let mut buf = vec![0u8; XATTR_SIZE_MAX + 16];
            // SAFETY: path and name are NUL-terminated; buf has room for `buf.len()` bytes.
            let n = unsafe {
                libc::lgetxattr(
                    p.as_ptr(),
                    cname(kind).as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                return Err(Errno(errno()));
            }
            buf.truncate(n as usize);
            Ok(buf)
        }

        fn k_stat(path: &Path) -> libc::stat {
            let p = cpath(path);
            // SAFETY: an all-zero stat is a valid value to be overwritten.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: p is NUL-terminated and st a valid out-pointer.
            let r = unsafe { libc::lstat(p.as_ptr(), &mut st) };
            assert_eq!(r, 0, "lstat {}", path.display());
            st
        }

        fn k_mode(path: &Path) -> u32 {
            k_stat(path).st_mode
        }

        fn k_ctime(path: &Path) -> (i64, i64) {
            let st = k_stat(path);
            (st.st_ctime, st.st_ctime_nsec)
        }

        /// The ACL names `listxattr` lists, sorted.
        fn k_list_acls(path: &Path) -> Vec<Vec<u8>> {
            let p = cpath(path);
            let mut buf = vec![0u8; 4096];
            // SAFETY: p is NUL-terminated; buf has room for `buf.len()` bytes.
            let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            assert!(n >= 0, "llistxattr: {}", std::io::Error::last_os_error());
            buf.truncate(n as usize);
            let mut names: Vec<Vec<u8>> = buf
                .split(|&b| b == 0)
                .filter(|n| AclKind::from_name(n).is_some())
                .map(<[u8]>::to_vec)
                .collect();
            names.sort();
            names
        }

        /// Runs `op`, the kernel side of an ACL change for which the module gave `ours`
        /// (`Ok(true)`: the inode changes), and checks that ctime moves exactly then.
        fn k_change(
            label: &str,
            path: &Path,
            ours: &Result<bool>,
            op: impl FnOnce() -> Result<()>,
        ) -> Result<()> {
            let changes = matches!(ours, Ok(true));
            if changes {
                // Let the clock move past the current ctime.
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let before = k_ctime(path);
            let r = op();
            let moved = k_ctime(path) != before;
            if r.is_ok() == ours.is_ok() {
                assert_eq!(moved, changes, "{label}: ctime moved: {moved}");
            }
            r
        }

        fn k_ok(what: &str, r: libc::c_int) {
            assert!(r == 0, "{what}: {}", std::io::Error::last_os_error());
        }

        fn k_chown(path: &Path, uid: u32, gid: u32) {
            let p = cpath(path);
            // SAFETY: p is NUL-terminated.
            k_ok("lchown", unsafe { libc::lchown(p.as_ptr(), uid, gid) });
        }

        fn k_chmod(path: &Path, mode: u32) {
            let p = cpath(path);
            // SAFETY: p is NUL-terminated.
            k_ok("chmod", unsafe { libc::chmod(p.as_ptr(), mode) });
        }

        /// Bit `want - 1` set for each `want` in 1..=7 that `who` may access; 255 on an error
        /// other than EACCES. Checks the inode itself, through an `O_PATH` descriptor, so that
        /// no directory on the way is searched.
        fn k_access(path: &Path, who: Who) -> i32 {
            let p = cpath(path);
            // SAFETY: p is NUL-terminated.
            let fd = unsafe { libc::open(p.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
            assert!(fd >= 0, "open O_PATH {}", path.display());
            let bits = in_child(who, || {
                let mut bits = 0;
                for want in 1..=7 {
                    // SAFETY: an empty NUL-terminated path relative to a valid descriptor.
                    let r = unsafe {
                        libc::syscall(
                            libc::SYS_faccessat2,
                            fd,
                            c"".as_ptr(),
                            want,
                            libc::AT_EMPTY_PATH,
                        )
                    };
                    if r == 0 {
                        bits |= 1 << (want - 1);
                    } else if errno() != libc::EACCES {
                        return 255;
                    }
                }
                bits
            });
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            bits
        }

        /// What this module says an inode is.
        #[derive(Clone, Debug)]
        struct Model {
            mode: u32,
            uid: u32,
            gid: u32,
            access: Option<Acl>,
            default: Option<Acl>,
        }

        impl Model {
            fn attrs(&self) -> AttrVals {
                attrs(self.mode, self.uid, self.gid)
            }

            fn stored(&self, kind: AclKind) -> Option<&Acl> {
                match kind {
                    AclKind::Access => self.access.as_ref(),
                    AclKind::Default => self.default.as_ref(),
                }
            }

            /// Applies `set_xattr`; `Ok(true)` when the inode changes (and its ctime).
            fn set(&mut self, kind: AclKind, value: &[u8], who: Who) -> Result<bool> {
                let ctx = if who.uid == 0 { Ctx::root() } else { ctx(who) };
                match set_xattr(&ctx, &self.attrs(), kind, value)? {
                    SetOutcome::Nothing => Ok(false),
                    SetOutcome::Apply { mode, acl } => {
                        self.mode = mode;
                        match kind {
                            AclKind::Access => self.access = acl,
                            AclKind::Default => self.default = acl,
                        }
                        Ok(true)
                    }
                }
            }

            fn access_bits(&self, who: Who) -> i32 {
                let (ctx, a) = (ctx(who), self.attrs());
                let mut bits = 0;
                for want in 1..=7 {
                    let r = match &self.access {
                        Some(acl) => check(&ctx, &a, acl, want),
                        None => perm::check(&ctx, &a, want),
                    };
                    if r.is_ok() {
                        bits |= 1 << (want - 1);
                    }
                }
                bits
            }
        }

        fn show(v: &Result<Vec<u8>>) -> String {
            match v {
                Ok(b) => match Acl::parse(b) {
                    Ok(a) => format!("{a}"),
                    Err(e) => format!("unparsable ({e:?}) {b:02x?}"),
                },
                Err(e) => format!("{e:?}"),
            }
        }

        /// Compares the kernel's inode at `path` with `m`: mode, both attributes, access.
        fn compare(label: &str, path: &Path, m: &Model) {
            let mode = k_mode(path);
            let listed: Vec<&[u8]> = [AclKind::Access, AclKind::Default]
                .into_iter()
                .filter(|&k| m.stored(k).is_some())
                .map(AclKind::name)
                .collect();
            assert_eq!(k_list_acls(path), listed, "{label}: listxattr");
            assert_eq!(
                mode, m.mode,
                "{label}: mode {mode:o}, module says {:o}",
                m.mode
            );
            for kind in [AclKind::Access, AclKind::Default] {
                let k = k_get(path, kind);
                let ours = get_xattr(m.mode, m.stored(kind));
                assert!(
                    k == ours,
                    "{label}: {kind:?} ACL: kernel {}, module {}",
                    show(&k),
                    show(&ours)
                );
            }
            if mode & libc::S_IFMT == libc::S_IFLNK {
                return;
            }
            for &w in CALLERS {
                let k = k_access(path, w);
                assert_ne!(k, 255, "{label}: access check as {w:?} failed oddly");
                let ours = m.access_bits(w);
                assert!(
                    k == ours,
                    "{label}: {w:?} may access for wants {}, module says {} (mode {:o}, ACL {})",
                    wants(k),
                    wants(ours),
                    m.mode,
                    m.access.as_ref().map_or("none".into(), |a| a.to_string())
                );
            }
        }

        fn wants(bits: i32) -> String {
            let v: Vec<String> = (1..=7)
                .filter(|w| bits & (1 << (w - 1)) != 0)
                .map(|w: u32| format!("{w}"))
                .collect();
            format!("[{}]", v.join(" "))
        }

        /// What `setfacl ARGS` will write, from `setfacl --test ARGS`: for each kind it
        /// changes, the value (empty to remove).
        fn setfacl_plan(args: &str, path: &Path) -> Vec<(AclKind, Vec<u8>)> {
            let out = Command::new("setfacl")
                .arg("--test")
                .args(args.split_whitespace())
                .arg(path)
                .output()
                .expect("run setfacl");
            assert!(out.status.success(), "setfacl --test {args}: {out:?}");
            let text = String::from_utf8(out.stdout).unwrap();
            let (_, rest) = text.trim_end_matches('\n').split_once(": ").unwrap();
            let tokens: Vec<&str> = rest.split(',').collect();
            let split = if tokens[0] == "*" {
                1
            } else {
                tokens
                    .iter()
                    .position(|t| t.starts_with("d:") || *t == "*" || t.is_empty())
                    .unwrap_or(tokens.len())
            };
            let (access, default) = tokens.split_at(split);
            let mut plan = Vec::new();
            if access != ["*"] {
                plan.push((AclKind::Access, acl(&access.join(",")).to_xattr()));
            }
            match default {
                ["*"] => {}
                [""] => plan.push((AclKind::Default, Vec::new())),
                d => {
                    let d: Vec<&str> = d.iter().map(|e| e.strip_prefix("d:").unwrap()).collect();
                    plan.push((AclKind::Default, acl(&d.join(",")).to_xattr()));
                }
            }
            plan
        }

        #[derive(Clone, Copy, PartialEq)]
        enum Target {
            File,
            Dir,
            Symlink,
            Fifo,
        }

        enum Op {
            /// Raw setxattr by `Who` with flags.
            Set(AclKind, Vec<u8>, Who, i32),
            /// removexattr by `Who`.
            Remove(AclKind, Who),
            /// `setfacl ARGS` as root; the model gets what `setfacl --test ARGS` says it sets.
            Setfacl(&'static str),
            /// chmod as root.
            Chmod(u32),
            /// Creates an entry in the target directory as root with this mode and umask, and
            /// compares it with [`inherit`]; then gives it to OWNER:GROUP and compares access.
            Create { mode: u32, umask: u32, dir: bool },
        }

        fn set(kind: AclKind, value: Vec<u8>) -> Op {
            Op::Set(kind, value, ROOT, 0)
        }

        struct Case {
            name: &'static str,
            target: Target,
            mode: u32,
            ops: Vec<Op>,
        }

        fn run_case(root: &Path, n: usize, case: &Case) {
            let dir = root.join(format!("{n}"));
            std::fs::create_dir(&dir).unwrap();
            k_chmod(&dir, 0o755);
            let t = dir.join("t");
            let ty = match case.target {
                Target::File => {
                    std::fs::write(&t, b"").unwrap();
                    libc::S_IFREG
                }
                Target::Dir => {
                    std::fs::create_dir(&t).unwrap();
                    libc::S_IFDIR
                }
                Target::Symlink => {
                    std::os::unix::fs::symlink("elsewhere", &t).unwrap();
                    libc::S_IFLNK
                }
                Target::Fifo => {
                    let p = cpath(&t);
                    // SAFETY: p is NUL-terminated.
                    k_ok("mkfifo", unsafe { libc::mkfifo(p.as_ptr(), 0o600) });
                    libc::S_IFIFO
                }
            };
            k_chown(&t, OWNER, GROUP);
            let mode = if case.target == Target::Symlink {
                0o777
            } else {
                k_chmod(&t, case.mode);
                case.mode
            };
            let mut m = Model {
                mode: ty | mode,
                uid: OWNER,
                gid: GROUP,
                access: None,
                default: None,
            };
            compare(&format!("{}: initial", case.name), &t, &m);
            let mut children = 0;
            for (i, op) in case.ops.iter().enumerate() {
                let label = format!("{} op {i}", case.name);
                match op {
                    Op::Set(kind, value, who, flags) => {
                        let ours = m.set(*kind, value, *who);
                        let k =
                            k_change(&label, &t, &ours, || k_set(&t, *kind, value, *flags, *who));
                        assert_eq!(k, ours.map(|_| ()), "{label}: set {kind:?} as {who:?}");
                    }
                    Op::Remove(kind, who) => {
                        let ours = m.set(*kind, &[], *who);
                        let k = k_change(&label, &t, &ours, || k_remove(&t, *kind, *who));
                        assert_eq!(k, ours.map(|_| ()), "{label}: remove {kind:?} as {who:?}");
                    }
                    Op::Setfacl(args) => {
                        for (kind, value) in setfacl_plan(args, &t) {
                            m.set(kind, &value, ROOT)
                                .unwrap_or_else(|e| panic!("{label}: {kind:?}: {e:?}"));
                        }
                        let st = Command::new("setfacl")
                            .args(args.split_whitespace())
                            .arg(&t)
                            .status()
                            .unwrap();
                        assert!(st.success(), "{label}: setfacl {args}");
                    }
                    Op::Chmod(mode) => {
                        k_chmod(&t, *mode);
                        m.mode = (m.mode & libc::S_IFMT) | (mode & 0o7777);
                        if let Some(a) = m.access.as_mut() {
                            a.chmod(*mode);
                        }
                    }
                    Op::Create { mode, umask, dir } => {
                        children += 1;
                        let c = t.join(format!("c{children}"));
                        let p = cpath(&c);
                        let (mode, umask, dir) = (*mode, *umask, *dir);
                        let r = in_child(ROOT, || {
                            // SAFETY: umask takes a plain value; p is NUL-terminated.
                            unsafe {
                                libc::umask(umask);
                                if dir {
                                    if libc::mkdir(p.as_ptr(), mode) != 0 {
                                        return errno();
                                    }
                                } else {
                                    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
                                    let fd = libc::open(p.as_ptr(), flags, mode);
                                    if fd < 0 {
                                        return errno();
                                    }
                                    libc::close(fd);
                                }
                            }
                            0
                        });
                        assert_eq!(r, 0, "{label}: create");
                        // What the creating calls keep of the mode (mkdir drops setuid/setgid).
                        let (ty, requested) = if dir {
                            (libc::S_IFDIR, mode & 0o1777)
                        } else {
                            (libc::S_IFREG, mode & 0o7777)
                        };
                        let inh = inherit(m.default.as_ref(), requested, umask, dir);
                        let mut cm = Model {
                            mode: ty | inh.mode,
                            uid: 0,
                            gid: 0,
                            access: inh.access,
                            default: inh.default,
                        };
                        let clabel = format!("{label}: created {mode:o} umask {umask:o}");
                        compare(&clabel, &c, &cm);
                        // chown may drop setuid/setgid; permission bits and ACLs stay.
                        k_chown(&c, OWNER, GROUP);
                        let after = k_mode(&c);
                        assert_eq!(after & 0o777, cm.mode & 0o777, "{clabel}: chown");
                        (cm.mode, cm.uid, cm.gid) = (after, OWNER, GROUP);
                        compare(&format!("{clabel}, chowned"), &c, &cm);
                    }
                }
                compare(&label, &t, &m);
            }
        }

        fn have_setfacl() -> bool {
            Command::new("setfacl")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        }

        fn run(cases: Vec<Case>) {
            let Some(fs) = Tmpfs::mount() else { return };
            let setfacl = have_setfacl();
            let mut skipped = 0;
            for (n, case) in cases.iter().enumerate() {
                if !setfacl && case.ops.iter().any(|o| matches!(o, Op::Setfacl(_))) {
                    skipped += 1;
                    continue;
                }
                run_case(fs.path(), n, case);
            }
            if skipped > 0 {
                eprintln!("skipped {skipped} cases: setfacl not found (apt-get install acl)");
            }
        }

        fn raw(entries: &[(u16, u16, u32)]) -> Vec<u8> {
            wire(2, entries)
        }

        fn txt(text: &str) -> Vec<u8> {
            acl(text).to_xattr()
        }

        use AclKind::{Access, Default};

        fn file(name: &'static str, mode: u32, ops: Vec<Op>) -> Case {
            Case {
                name,
                target: Target::File,
                mode,
                ops,
            }
        }

        fn dir(name: &'static str, mode: u32, ops: Vec<Op>) -> Case {
            Case {
                name,
                target: Target::Dir,
                mode,
                ops,
            }
        }

        fn create(mode: u32, umask: u32, dir: bool) -> Op {
            Op::Create { mode, umask, dir }
        }

        #[test]
        fn setfacl_and_chmod_match_the_kernel() {
            use Op::{Chmod, Setfacl};
            run(vec![
                file(
                    "named user, explicit mask",
                    0o644,
                    vec![Setfacl("-m u:4000:rw,m::r")],
                ),
                file(
                    "mask recomputed by setfacl, then chmod",
                    0o644,
                    vec![
                        Setfacl("-m u:4000:rwx,g:5000:rx"),
                        Chmod(0o751),
                        Chmod(0o600),
                        Chmod(0o007),
                        Chmod(0o070),
                        Setfacl("-m m::rw"),
                    ],
                ),
                file(
                    "empty mask: ACL not consulted",
                    0o644,
                    vec![
                        Setfacl("-n -m u:4000:rwx,g:5000:rw,m::---"),
                        Setfacl("-n -m o::rw"),
                        Setfacl("-n -m m::x"),
                        Chmod(0o606),
                    ],
                ),
                file(
                    "expressible ACLs only set the mode",
                    0o644,
                    vec![
                        Setfacl("-m g::rwx,o::---"),
                        Setfacl("-m u::x"),
                        Setfacl("-b"),
                    ],
                ),
                file(
                    "-x leaves a MASK, which is stored",
                    0o640,
                    vec![Setfacl("-m u:4000:rw"), Setfacl("-x u:4000"), Setfacl("-b")],
                ),
                file(
                    "group entries do not add up",
                    0o644,
                    vec![
                        Setfacl("-m g:5000:r,g:5001:w,g::x"),
                        Setfacl("-m u:4001:rwx,o::-"),
                        Chmod(0o777),
                    ],
                ),
                dir(
                    "access ACL on a directory",
                    0o755,
                    vec![Setfacl("-m u:4000:x,g:5000:r,o::-"), Chmod(0o711)],
                ),
                Case {
                    name: "fifo",
                    target: Target::Fifo,
                    mode: 0o644,
                    ops: vec![
                        Setfacl("-m u:4000:r"),
                        set(Default, txt("u::rw,g::r,o::r")),
                        Chmod(0o640),
                    ],
                },
            ]);
        }

        #[test]
        fn inheritance_matches_the_kernel() {
            use Op::{Chmod, Setfacl};
            let all_creates = || {
                vec![
                    create(0o666, 0o022, false),
                    create(0o600, 0o077, false),
                    create(0o640, 0o000, false),
                    create(0o4755, 0o022, false),
                    create(0o000, 0o000, false),
                    create(0o777, 0o022, true),
                    create(0o700, 0o000, true),
                    create(0o1777, 0o027, true),
                    create(0o2755, 0o022, true),
                ]
            };
            let with = |mut first: Vec<Op>| {
                first.extend(all_creates());
                first
            };
            run(vec![
                dir("no default ACL: umask", 0o755, all_creates()),
                dir(
                    "setfacl -d -m u:4000:rwx",
                    0o755,
                    with(vec![Setfacl("-d -m u:4000:rwx")]),
                ),
                dir(
                    "3-entry default",
                    0o755,
                    with(vec![Setfacl("-d -m u::rwx,g::rx,o::r")]),
                ),
                dir(
                    "4-entry default (MASK, no named entries)",
                    0o755,
                    with(vec![set(Default, txt("u::rwx,g::rwx,m::r-x,o::r-x"))]),
                ),
                dir(
                    "default with an empty MASK",
                    0o755,
                    with(vec![set(
                        Default,
                        txt("u::rwx,u:4000:rwx,g::rwx,g:5000:rwx,m::-,o::r-x"),
                    )]),
                ),
                dir(
                    "default without MASK, wide open",
                    0o755,
                    with(vec![set(Default, txt("u::rw,g::rw,o::rw"))]),
                ),
                dir(
                    "unsorted default inherited as is",
                    0o755,
                    with(vec![set(
                        Default,
                        txt("u::rwx,u:4001:r-x,u:4000:rwx,g::r-x,m::rwx,o::-"),
                    )]),
                ),
                dir(
                    "both ACLs, then setfacl -k",
                    0o755,
                    vec![
                        Setfacl("-m d:u:4000:rw,d:g:5000:rwx,u:4001:x"),
                        create(0o666, 0o022, false),
                        create(0o777, 0o022, true),
                        Setfacl("-k"),
                        create(0o666, 0o022, false),
                        create(0o777, 0o022, true),
                    ],
                ),
                dir(
                    "chmod leaves the default ACL alone",
                    0o755,
                    vec![
                        Setfacl("-m u:4000:rx,d:u:4000:rwx"),
                        Chmod(0o700),
                        create(0o666, 0o022, false),
                        create(0o755, 0o022, true),
                    ],
                ),
            ]);
        }

        #[test]
        fn raw_values_match_the_kernel() {
            const N: u32 = NONE;
            let named = || txt("u::rw,u:4000:rw,g::r,m::r,o::r");
            let base = [(UO, 6, N), (GO, 4, N), (O, 4, N)];
            let mut trailing = raw(&base);
            trailing.push(0);
            let mut half = raw(&base);
            half.extend_from_slice(&[0; 4]);
            // 4 + 8 * 8191 = 65532 bytes: the largest value under 64 KiB; one more entry is
            // over.
            let many = |n: u32| {
                let mut e = vec![(UO, 6, N)];
                e.extend((0..n).map(|i| (U, 4, 10_000 + i)));
                e.extend([(GO, 4, N), (M, 6, N), (O, 4, N)]);
                raw(&e)
            };
            let invalid: Vec<Vec<u8>> = vec![
                b"ab".to_vec(),
                vec![0; 4],
                wire(1, &base),
                wire(3, &base),
                wire(1, &[]),
                trailing,
                half,
                raw(&[(UO, 6, N), (0, 0, 0), (GO, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (3, 0, 0), (GO, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (O, 4, N), (0x40, 0, 0)]),
                raw(&[(UO, 6, N), (U, 6, N), (GO, 4, N), (M, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (G, 6, N), (M, 4, N), (O, 4, N)]),
                raw(&[(UO, 8, N), (GO, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (O, 0x8000, N)]),
                raw(&[(UO, 6, N), (GO, 4, N)]),
                raw(&[(GO, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (UO, 6, N), (GO, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (GO, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (M, 4, N), (M, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (O, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (O, 4, N), (M, 4, N)]),
                raw(&[(GO, 4, N), (UO, 6, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (G, 4, 5000), (GO, 4, N), (M, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (U, 4, 4000), (M, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (U, 4, 4000), (GO, 4, N), (O, 4, N)]),
                raw(&[(UO, 6, N), (GO, 4, N), (G, 4, 5000), (O, 4, N)]),
                many(8192),
            ];
            let every_invalid = |kind: AclKind, who: Who| -> Vec<Op> {
                invalid
                    .iter()
                    .map(|v| Op::Set(kind, v.clone(), who, 0))
                    .collect()
            };
            let mut on_file = vec![set(Access, named())];
            on_file.extend(every_invalid(Access, ROOT));
            on_file.extend(every_invalid(Access, STRANGER));
            on_file.extend(every_invalid(Default, ROOT));
            on_file.extend(every_invalid(Default, OWNER_OUT));
            let mut on_dir = vec![set(Default, named())];
            on_dir.extend(every_invalid(Access, OWNER_OUT));
            on_dir.extend(every_invalid(Default, ROOT));
            on_dir.extend(every_invalid(Default, STRANGER));
            let mut on_link = every_invalid(Access, ROOT);
            on_link.extend(every_invalid(Default, STRANGER));
            on_link.extend([
                set(Access, named()),
                set(Access, raw(&[])),
                Op::Remove(Access, ROOT),
                Op::Remove(Default, STRANGER),
            ]);
            let sgid = 0o2775;
            run(vec![
                file("invalid values on a file", 0o644, on_file),
                dir("invalid values on a directory", 0o755, on_dir),
                Case {
                    name: "symlink",
                    target: Target::Symlink,
                    mode: 0,
                    ops: on_link,
                },
                file(
                    "unsorted and duplicate named entries",
                    0o644,
                    vec![set(
                        Access,
                        raw(&[
                            (UO, 6, N),
                            (U, 7, 4001),
                            (U, 0, 4000),
                            (U, 7, 4000),
                            (GO, 4, N),
                            (G, 7, 5001),
                            (G, 0, 5000),
                            (G, 7, 5000),
                            (M, 7, N),
                            (O, 4, N),
                        ]),
                    )],
                ),
                file(
                    "MASK alone is stored; an expressible ACL removes it",
                    0o644,
                    vec![
                        set(Access, raw(&[(UO, 6, 1), (GO, 4, 2), (M, 2, 3), (O, 4, 4)])),
                        set(Access, txt("u::rwx,g::r-x,o::r-x")),
                    ],
                ),
                file(
                    "largest value",
                    0o644,
                    vec![set(Access, many(8191)), set(Access, raw(&[]))],
                ),
                file(
                    "empty values and removal",
                    0o644,
                    vec![
                        Op::Remove(Access, ROOT),
                        set(Access, vec![]),
                        set(Access, raw(&[])),
                        set(Access, named()),
                        set(Access, raw(&[])),
                        set(Access, named()),
                        set(Access, vec![]),
                        set(Access, named()),
                        Op::Remove(Access, ROOT),
                        Op::Remove(Access, ROOT),
                        Op::Remove(Default, ROOT),
                        set(Default, vec![]),
                        set(Default, raw(&[])),
                    ],
                ),
                dir(
                    "default: empty values and removal",
                    0o755,
                    vec![
                        Op::Remove(Default, ROOT),
                        set(Default, named()),
                        set(Default, raw(&[])),
                        set(Default, txt("u::rwx,g::rx,o::-")),
                        set(Default, vec![]),
                        set(Default, named()),
                        Op::Remove(Default, OWNER_OUT),
                        Op::Remove(Default, OWNER_OUT),
                    ],
                ),
                file(
                    "XATTR_CREATE and XATTR_REPLACE are ignored",
                    0o644,
                    vec![
                        Op::Set(Access, named(), ROOT, libc::XATTR_REPLACE),
                        Op::Set(
                            Access,
                            txt("u::r,u:4001:rw,g::r,m::rw,o::-"),
                            ROOT,
                            libc::XATTR_CREATE,
                        ),
                    ],
                ),
                file(
                    "who may set: owner, root; S_ISGID",
                    sgid,
                    vec![
                        Op::Set(Access, named(), STRANGER, 0),
                        Op::Remove(Access, STRANGER),
                        Op::Set(Default, named(), STRANGER, 0),
                        Op::Remove(Default, STRANGER),
                        Op::Set(Access, named(), OWNER_IN, 0),
                        Op::Chmod(sgid),
                        Op::Set(Access, named(), OWNER_OUT, 0),
                        Op::Chmod(sgid),
                        Op::Set(Access, txt("u::rwx,g::rwx,o::rx"), OWNER_OUT, 0),
                        Op::Chmod(sgid),
                        Op::Set(Access, named(), ROOT, 0),
                        Op::Chmod(sgid),
                        Op::Remove(Access, OWNER_OUT),
                        Op::Set(Access, named(), who(OWNER, 501, &[GROUP]), 0),
                    ],
                ),
                dir(
                    "who may set on a directory",
                    sgid,
                    vec![
                        Op::Set(Default, named(), STRANGER, 0),
                        Op::Set(Default, named(), OWNER_OUT, 0),
                        Op::Remove(Default, STRANGER),
                        Op::Set(Access, named(), OWNER_OUT, 0),
                        Op::Remove(Default, OWNER_OUT),
                    ],
                ),
                file(
                    "special bits survive",
                    0o7644,
                    vec![
                        set(Access, named()),
                        Op::Chmod(0o6750),
                        set(Access, txt("u::rwx,g::rwx,o::rwx")),
                    ],
                ),
            ]);
        }
    }
}
