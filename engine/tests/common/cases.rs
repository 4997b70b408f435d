//! Scripted differential cases, shared by the engine's kernel comparison and the FUSE mount's.

#![allow(dead_code)]

use super::{Op, Op::*, T, Who};
use lanefs::{FS_APPEND_FL, FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL};

/// A named list of steps with the umask they run under.
pub struct Case {
    pub name: &'static str,
    pub umask: u32,
    pub steps: Vec<(Who, Op)>,
}

impl Case {
    fn new(name: &'static str, umask: u32, steps: &[(Who, Op)]) -> Case {
        Case {
            name,
            umask,
            steps: steps.to_vec(),
        }
    }
}

/// Every case, for suites that run them all.
pub fn all() -> Vec<Case> {
    vec![
        basics_nlink_sizes_and_readdir(),
        error_codes(),
        rename_edge_cases(),
        permissions_as_plain_users(),
        setgid_directories(),
        umask_applies_to_new_inodes(),
        data_and_sizes(),
        timestamps_follow_posix(),
        extended_attributes(),
        posix_acls(),
        inode_flags(),
        rename_whiteout(),
        o_tmpfile(),
    ]
}

pub fn root() -> Who {
    Who::Root
}
pub fn u1() -> Who {
    Who::User {
        uid: 1000,
        gid: 1000,
        groups: vec![1000, 3000],
    }
}
pub fn u2() -> Who {
    Who::User {
        uid: 2000,
        gid: 2000,
        groups: vec![2000],
    }
}
fn s(x: &str) -> String {
    x.to_string()
}
fn as_root(ops: Vec<Op>) -> Vec<(Who, Op)> {
    ops.into_iter().map(|o| (root(), o)).collect()
}

pub fn basics_nlink_sizes_and_readdir() -> Case {
    Case::new(
        "basics",
        0o022,
        &as_root(vec![
            Mkdir(s("d"), 0o755),
            Stat(s("d")),
            Create(s("d/f"), 0o644),
            Mkdir(s("d/sub"), 0o777),
            Stat(s("d")),
            Stat(s("d/f")),
            Stat(s("d/sub")),
            ReadDir(s("d")),
            Link(s("d/f"), s("d/g")),
            Stat(s("d/f")),
            SameIno(s("d/f"), s("d/g")),
            Symlink(s("f"), s("d/l")),
            Lstat(s("d/l")),
            Stat(s("d/l")),
            Readlink(s("d/l")),
            Readlink(s("d/f")),
            Mknod(s("d/fifo"), libc::S_IFIFO | 0o600, 0),
            Mknod(s("d/chr"), libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
            Mknod(s("d/plain"), 0o600, 0),
            Mknod(s("d/dir"), libc::S_IFDIR | 0o600, 0),
            Stat(s("d/chr")),
            Stat(s("d/plain")),
            Stat(s("d")),
            ReadDir(s("d")),
            Unlink(s("d/g")),
            Stat(s("d/f")),
            Rmdir(s("d/sub")),
            Stat(s("d")),
            Rmdir(s("d")),
        ]),
    )
}

pub fn error_codes() -> Case {
    let long = "x".repeat(256);
    let max = "y".repeat(255);
    Case::new(
        "errors",
        0o022,
        &as_root(vec![
            Stat(s("nope")),
            Stat(s("nope/x")),
            Create(s("f"), 0o644),
            Create(s("f"), 0o644),
            Mkdir(s("f"), 0o755),
            Stat(s("f/x")),
            Create(s("f/x"), 0o644),
            Mkdir(s("d"), 0o755),
            Create(s("d/inner"), 0o644),
            Rmdir(s("d")),
            Rmdir(s("f")),
            Unlink(s("d")),
            Rmdir(s("d/.")),
            Rmdir(s("d/..")),
            Mkdir(s("d/."), 0o755),
            Unlink(s("d/..")),
            Create(s(&long), 0o644),
            Create(s(&max), 0o644),
            Stat(s(&max)),
            Mkdir(s(&long), 0o755),
            Stat(s(&long)),
            Symlink(s("loop2"), s("loop1")),
            Symlink(s("loop1"), s("loop2")),
            Stat(s("loop1")),
            Lstat(s("loop1")),
            Open(s("loop1"), libc::O_RDONLY, 0),
            Symlink(s(""), s("empty")),
            Link(s("d"), s("dlink")),
            Link(s("nope"), s("x")),
            Link(s("f"), s("d/inner")),
            Read(s("d")),
            Open(s("d"), libc::O_WRONLY, 0),
            Open(s("f"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
            Open(s("f/"), libc::O_RDONLY, 0),
            Open(s("d/"), libc::O_RDONLY, 0),
            Open(s("new/"), libc::O_CREAT | libc::O_WRONLY, 0o644),
            Open(s("d"), libc::O_CREAT | libc::O_WRONLY, 0o644),
            Open(s("f"), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
            Truncate(s("d"), 0),
            Unlink(s("f/")),
            Rmdir(s("nope")),
            ReadDir(s("f")),
            Stat(s("")),
        ]),
    )
}

pub fn rename_edge_cases() -> Case {
    Case::new(
        "rename",
        0o022,
        &as_root(vec![
            Mkdir(s("a"), 0o755),
            Mkdir(s("a/b"), 0o755),
            Mkdir(s("a/b/c"), 0o755),
            Create(s("a/f"), 0o644),
            Link(s("a/f"), s("a/f2")),
            Create(s("g"), 0o644),
            // onto itself, and onto another name of itself: nothing happens
            Rename(s("a/f"), s("a/f"), 0),
            Rename(s("a/f"), s("a/f2"), 0),
            Stat(s("a/f")),
            Stat(s("a/f2")),
            // a directory into its own subtree
            Rename(s("a"), s("a/b/c/a"), 0),
            Rename(s("a/b"), s("a/b/c/x"), 0),
            Rename(s("a/b"), s("a/b"), 0),
            // onto an ancestor of the source
            Rename(s("a/b/c"), s("a"), 0),
            // type mismatches and non-empty targets
            Rename(s("g"), s("a/b"), 0),
            Rename(s("a/b"), s("g"), 0),
            Mkdir(s("e"), 0o755),
            Rename(s("e"), s("a"), 0),
            Rename(s("e"), s("a/b/c"), 0),
            Stat(s("a/b")),
            Stat(s("a/b/c")),
            Stat(s("e")),
            // file over file, across directories
            Rename(s("g"), s("a/f"), 0),
            Stat(s("a/f")),
            Stat(s("a/f2")),
            Stat(s("g")),
            // directory across parents updates both nlinks
            Mkdir(s("m"), 0o755),
            Rename(s("a/b"), s("m/b"), 0),
            Stat(s("a")),
            Stat(s("m")),
            Stat(s("m/b/c")),
            // NOREPLACE and EXCHANGE
            Create(s("x"), 0o644),
            Create(s("y"), 0o600),
            Rename(s("x"), s("y"), libc::RENAME_NOREPLACE),
            Rename(s("x"), s("z"), libc::RENAME_NOREPLACE),
            Rename(s("z"), s("nothere"), libc::RENAME_EXCHANGE),
            Rename(s("z"), s("y"), libc::RENAME_EXCHANGE),
            Stat(s("z")),
            Stat(s("y")),
            Rename(s("z"), s("m/b"), libc::RENAME_EXCHANGE),
            Stat(s("z")),
            Stat(s("m/b")),
            Stat(s("m")),
            Stat(s(".")),
            Rename(
                s("z"),
                s("m/b"),
                libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
            ),
            Rename(s("z"), s("y"), 0x100),
            // exchanging a directory with its own descendant
            Rename(s("m"), s("m/b"), libc::RENAME_EXCHANGE),
            // dots and trailing slashes
            Rename(s("m/."), s("q"), 0),
            Rename(s("y"), s("m/.."), 0),
            Rename(s("y/"), s("q"), 0),
            Rename(s("m/"), s("q/"), 0),
            Stat(s("q")),
            Rename(s("nope"), s("q2"), 0),
            ReadDir(s(".")),
        ]),
    )
}

pub fn permissions_as_plain_users() -> Case {
    let mut steps = as_root(vec![
        Mkdir(s("ro"), 0o555),
        Mkdir(s("noexec"), 0o666),
        Create(s("noexec/f"), 0o644),
        Mkdir(s("noread"), 0o311),
        Create(s("noread/f"), 0o644),
        Mkdir(s("sticky"), 0o1777),
        Mkdir(s("shared"), 0o777),
        Create(s("secret"), 0o600),
        Create(s("rootfile"), 0o644),
        Mkdir(s("grp"), 0o770),
        Chown(s("grp"), Some(0), Some(3000)),
        Create(s("suid"), 0o4755),
    ]);
    let user = vec![
        Create(s("ro/f"), 0o644),
        Mkdir(s("ro/d"), 0o755),
        Stat(s("noexec/f")),
        ReadDir(s("noexec")),
        ReadDir(s("noread")),
        Stat(s("noread/f")),
        Read(s("secret")),
        Write(s("rootfile"), 0, b"x".to_vec()),
        Read(s("rootfile")),
        Access(s("rootfile"), 4),
        Access(s("rootfile"), 2),
        Access(s("rootfile"), 1),
        Access(s("secret"), 0),
        Chmod(s("rootfile"), 0o777),
        Chown(s("rootfile"), Some(1000), None),
        Utimens(s("rootfile"), T::Now, T::Now),
        Utimens(s("rootfile"), T::At(1, 0), T::Omit),
        // group access via a supplementary group
        Create(s("grp/mine"), 0o640),
        Stat(s("grp/mine")),
        ReadDir(s("grp")),
        // the user's own files
        Create(s("shared/u1"), 0o644),
        Chown(s("shared/u1"), Some(1000), Some(3000)),
        Stat(s("shared/u1")),
        Chown(s("shared/u1"), None, Some(2000)),
        Chown(s("shared/u1"), Some(2000), None),
        Chmod(s("shared/u1"), 0o2755),
        Stat(s("shared/u1")),
        Chown(s("shared/u1"), None, Some(1000)),
        Chmod(s("shared/u1"), 0o6755),
        Stat(s("shared/u1")),
        Utimens(s("shared/u1"), T::At(1000, 5), T::At(2000, 7)),
        Create(s("sticky/u1"), 0o644),
        Create(s("sticky/keep"), 0o666),
        Link(s("rootfile"), s("shared/hl")),
        Link(s("secret"), s("shared/hl2")),
        Mknod(s("shared/dev"), libc::S_IFCHR | 0o644, 0),
        Mknod(s("shared/fifo"), libc::S_IFIFO | 0o644, 0),
        Stat(s("shared/fifo")),
        // writing a set-uid file as its (non-root) owner clears set-uid
        Create(s("shared/w"), 0o644),
        Chmod(s("shared/w"), 0o6775),
        Write(s("shared/w"), 0, b"data".to_vec()),
        Stat(s("shared/w")),
        Chmod(s("shared/w"), 0o4755),
        Truncate(s("shared/w"), 1),
        Stat(s("shared/w")),
    ];
    steps.extend(user.into_iter().map(|o| (u1(), o)));
    let other = vec![
        Unlink(s("sticky/u1")),
        Rename(s("sticky/u1"), s("sticky/moved"), 0),
        Rename(s("sticky/keep"), s("shared/moved"), 0),
        Write(s("sticky/keep"), 0, b"ok".to_vec()),
        Unlink(s("shared/u1")),
        Stat(s("grp/mine")),
        Chmod(s("shared/w"), 0o777),
        Create(s("sticky/u2"), 0o644),
    ];
    steps.extend(other.into_iter().map(|o| (u2(), o)));
    steps.push((u1(), Unlink(s("sticky/u2"))));
    steps.push((u1(), Unlink(s("sticky/u1"))));
    steps.push((root(), Unlink(s("sticky/u2"))));
    steps.push((root(), Stat(s("suid"))));
    steps.push((root(), Write(s("suid"), 0, b"r".to_vec())));
    steps.push((root(), Stat(s("suid"))));
    steps.push((root(), Chown(s("suid"), Some(1000), None)));
    steps.push((root(), Stat(s("suid"))));
    // chown(path, -1, -1) takes set-id bits as a change of owner does: set-user-ID always,
    // set-group-ID when group-executable or the caller is outside the group and not root.
    for (who, mode) in [
        (root(), 0o6755),
        (root(), 0o2745),
        (u1(), 0o6755),
        (u1(), 0o2745),
        (u2(), 0o6755),
    ] {
        steps.push((root(), Chmod(s("suid"), mode)));
        steps.push((who, Chown(s("suid"), None, None)));
        steps.push((root(), Stat(s("suid"))));
    }
    Case::new("perms", 0o022, &steps)
}

pub fn setgid_directories() -> Case {
    let mut steps = as_root(vec![
        Mkdir(s("sg"), 0o777),
        Chown(s("sg"), Some(0), Some(3000)),
        Chmod(s("sg"), 0o2777),
        Stat(s("sg")),
    ]);
    steps.extend(
        vec![
            Mkdir(s("sg/sub"), 0o755),
            Stat(s("sg/sub")),
            Create(s("sg/f"), 0o2755),
            Stat(s("sg/f")),
            Mkdir(s("sg/sub/deeper"), 0o700),
            Stat(s("sg/sub/deeper")),
        ]
        .into_iter()
        .map(|o| (u1(), o)),
    );
    // u2 is not in group 3000: a set-gid executable it creates loses set-gid.
    steps.extend(
        vec![
            Create(s("sg/g"), 0o2755),
            Stat(s("sg/g")),
            Create(s("sg/h"), 0o2745),
            Stat(s("sg/h")),
        ]
        .into_iter()
        .map(|o| (u2(), o)),
    );
    Case::new("setgid", 0, &steps)
}

pub fn umask_applies_to_new_inodes() -> Case {
    Case::new(
        "umask",
        0o027,
        &[
            (root(), Mkdir(s("d"), 0o777)),
            (root(), Create(s("f"), 0o666)),
            (root(), Mkdir(s("e"), 0o7777)),
            (root(), Symlink(s("f"), s("l"))),
            (root(), Stat(s("d"))),
            (root(), Stat(s("f"))),
            (root(), Stat(s("e"))),
            (root(), Lstat(s("l"))),
        ],
    )
}

pub fn data_and_sizes() -> Case {
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    Case::new(
        "data",
        0,
        &as_root(vec![
            Create(s("f"), 0o644),
            Write(s("f"), 0, b"hello world".to_vec()),
            Read(s("f")),
            Write(s("f"), 5, b"!".to_vec()),
            Read(s("f")),
            Write(s("f"), 10_000, b"far".to_vec()),
            Stat(s("f")),
            Read(s("f")),
            Append(s("f"), b"tail".to_vec()),
            Stat(s("f")),
            Truncate(s("f"), 3),
            Read(s("f")),
            Stat(s("f")),
            Truncate(s("f"), 1 << 40),
            Stat(s("f")),
            Truncate(s("f"), 0),
            Write(s("f"), 0, big.clone()),
            Read(s("f")),
            Stat(s("f")),
            Open(s("f"), libc::O_WRONLY | libc::O_TRUNC, 0),
            Stat(s("f")),
            Open(s("f"), libc::O_RDONLY | libc::O_TRUNC, 0),
            Write(s("f"), 4096 * 3, b"z".to_vec()),
            Stat(s("f")),
        ]),
    )
}

pub fn timestamps_follow_posix() -> Case {
    let ms = 30;
    Case::new(
        "times",
        0,
        &as_root(vec![
            Mkdir(s("d"), 0o755),
            Create(s("d/f"), 0o644),
            Stamp("d", s("d")),
            Stamp("f", s("d/f")),
            SleepMs(ms),
            Create(s("d/g"), 0o644),
            Changed("d", s("d")),
            Changed("f", s("d/f")),
            Stamp("d", s("d")),
            SleepMs(ms),
            Write(s("d/f"), 0, b"x".to_vec()),
            Changed("f", s("d/f")),
            Changed("d", s("d")),
            Stamp("f", s("d/f")),
            SleepMs(ms),
            Read(s("d/f")),
            Changed("f", s("d/f")),
            Stamp("f", s("d/f")),
            SleepMs(ms),
            Read(s("d/f")),
            Changed("f", s("d/f")),
            Chmod(s("d/f"), 0o600),
            Changed("f", s("d/f")),
            Stamp("f", s("d/f")),
            SleepMs(ms),
            Link(s("d/f"), s("d/h")),
            Changed("f", s("d/f")),
            Changed("d", s("d")),
            Stamp("f", s("d/f")),
            Stamp("d", s("d")),
            SleepMs(ms),
            Rename(s("d/h"), s("d/i"), 0),
            Changed("f", s("d/f")),
            Changed("d", s("d")),
            Stamp("f", s("d/f")),
            Stamp("d", s("d")),
            SleepMs(ms),
            Unlink(s("d/i")),
            Changed("f", s("d/f")),
            Changed("d", s("d")),
            Stamp("f", s("d/f")),
            SleepMs(ms),
            Truncate(s("d/f"), 1),
            Changed("f", s("d/f")),
            Truncate(s("d/f"), 0),
            Changed("f", s("d/f")),
            // Truncating to the same size stamps a file with data (tmpfs trims its pages) but
            // not a sparse one; an O_TRUNC open stamps even an empty file.
            Write(s("d/f"), 0, b"abc".to_vec()),
            Stamp("f", s("d/f")),
            SleepMs(ms),
            Truncate(s("d/f"), 3),
            Changed("f", s("d/f")),
            Create(s("d/e"), 0o644),
            Truncate(s("d/e"), 100),
            Stamp("e", s("d/e")),
            SleepMs(ms),
            Truncate(s("d/e"), 100),
            Changed("e", s("d/e")),
            Create(s("d/z"), 0o644),
            Stamp("z", s("d/z")),
            SleepMs(ms),
            Open(s("d/z"), libc::O_WRONLY | libc::O_TRUNC, 0),
            Changed("z", s("d/z")),
            Truncate(s("d/f"), 0),
            Stamp("f", s("d/f")),
            SleepMs(ms),
            Utimens(s("d/f"), T::At(100, 1), T::At(200, 2)),
            Changed("f", s("d/f")),
            Stat(s("d/f")),
            Stamp("d", s("d")),
            SleepMs(ms),
            ReadDir(s("d")),
            Changed("d", s("d")),
        ]),
    )
}

pub fn extended_attributes() -> Case {
    let mut steps = as_root(vec![
        Create(s("f"), 0o644),
        Mkdir(s("d"), 0o755),
        Symlink(s("f"), s("l")),
        Mknod(s("p"), libc::S_IFIFO | 0o666, 0),
        SetXattr(s("f"), s("user.a"), b"1".to_vec(), 0),
        GetXattr(s("f"), s("user.a")),
        SetXattr(s("f"), s("user.a"), b"2".to_vec(), libc::XATTR_CREATE),
        SetXattr(s("f"), s("user.b"), b"".to_vec(), libc::XATTR_REPLACE),
        SetXattr(s("f"), s("user.a"), b"22".to_vec(), libc::XATTR_REPLACE),
        GetXattr(s("f"), s("user.a")),
        GetXattr(s("f"), s("user.none")),
        SetXattr(s("f"), s("trusted.t"), b"tt".to_vec(), 0),
        SetXattr(s("d"), s("user.d"), b"dir".to_vec(), 0),
        SetXattr(s("p"), s("user.x"), b"x".to_vec(), 0),
        GetXattr(s("p"), s("user.x")),
        SetXattr(s("f"), s("bogus.x"), b"x".to_vec(), 0),
        SetXattr(s("f"), s("user.flags"), b"x".to_vec(), 4),
        ListXattr(s("f")),
        RemoveXattr(s("f"), s("user.a")),
        RemoveXattr(s("f"), s("user.a")),
        ListXattr(s("f")),
        ListXattr(s("d")),
    ]);
    steps.extend(
        vec![
            GetXattr(s("f"), s("user.b")),
            GetXattr(s("f"), s("trusted.t")),
            ListXattr(s("f")),
            SetXattr(s("f"), s("user.c"), b"c".to_vec(), 0),
            SetXattr(s("f"), s("trusted.c"), b"c".to_vec(), 0),
            RemoveXattr(s("f"), s("user.b")),
        ]
        .into_iter()
        .map(|o| (u1(), o)),
    );
    Case::new("xattr", 0, &steps)
}

/// An ACL in the attribute value format: version 2, then `(tag, perm, id)` entries.
pub fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

pub fn posix_acls() -> Case {
    const NONE: u32 = u32::MAX;
    let (uo, u, go, m, o) = (1u16, 2u16, 4u16, 0x10u16, 0x20u16);
    let default = acl(&[
        (uo, 7, NONE),
        (u, 5, 1000),
        (go, 5, NONE),
        (m, 7, NONE),
        (o, 0, NONE),
    ]);
    let named = acl(&[
        (uo, 6, NONE),
        (u, 6, 1000),
        (go, 4, NONE),
        (m, 6, NONE),
        (o, 0, NONE),
    ]);
    let search_only = acl(&[
        (uo, 7, NONE),
        (u, 1, 1000),
        (go, 0, NONE),
        (m, 1, NONE),
        (o, 0, NONE),
    ]);
    let group = acl(&[
        (uo, 6, NONE),
        (go, 0, NONE),
        (8, 4, 3000),
        (m, 4, NONE),
        (o, 0, NONE),
    ]);
    let mut steps = as_root(vec![
        // Inheritance: the default ACL masks a new inode's mode instead of the umask (077).
        Mkdir(s("d"), 0o755),
        SetXattr(s("d"), s(DEFAULT), default.clone(), 0),
        GetXattr(s("d"), s(DEFAULT)),
        ListXattr(s("d")),
        Stat(s("d")),
        Create(s("d/f"), 0o666),
        Stat(s("d/f")),
        GetXattr(s("d/f"), s(ACCESS)),
        GetXattr(s("d/f"), s(DEFAULT)),
        Mkdir(s("d/sub"), 0o777),
        Stat(s("d/sub")),
        GetXattr(s("d/sub"), s(ACCESS)),
        GetXattr(s("d/sub"), s(DEFAULT)),
        Mknod(s("d/fifo"), libc::S_IFIFO | 0o644, 0),
        Stat(s("d/fifo")),
        Symlink(s("f"), s("d/l")),
        Lstat(s("d/l")),
        // Outside `d` the umask applies.
        Create(s("f"), 0o666),
        Stat(s("f")),
        // A named user: the mode's group bits become the mask.
        SetXattr(s("f"), s(ACCESS), named.clone(), 0),
        Stat(s("f")),
        GetXattr(s("f"), s(ACCESS)),
        ListXattr(s("f")),
        // An ACL the mode bits express is not stored: it sets the mode.
        Create(s("plain"), 0o600),
        SetXattr(
            s("plain"),
            s(ACCESS),
            acl(&[(uo, 6, NONE), (go, 4, NONE), (o, 4, NONE)]),
            0,
        ),
        Stat(s("plain")),
        GetXattr(s("plain"), s(ACCESS)),
        ListXattr(s("plain")),
        // Where ACLs do not go, and malformed ones.
        SetXattr(s("d/l"), s(ACCESS), named.clone(), 0),
        SetXattr(s("f"), s(DEFAULT), default.clone(), 0),
        SetXattr(s("f"), s(ACCESS), b"\x02\x00\x00\x00\x01".to_vec(), 0),
        SetXattr(
            s("f"),
            s(ACCESS),
            acl(&[(uo, 6, NONE), (u, 6, 1000), (go, 4, NONE), (o, 0, NONE)]),
            0,
        ),
        SetXattr(
            s("f"),
            s(ACCESS),
            acl(&[(go, 4, NONE), (uo, 6, NONE), (o, 0, NONE)]),
            0,
        ),
        // Search through a directory only a named user may search.
        Mkdir(s("priv"), 0o700),
        Create(s("priv/x"), 0o644),
        SetXattr(s("priv"), s(ACCESS), search_only, 0),
        Stat(s("priv")),
        // A named group (3000 is a supplementary group of u1).
        Create(s("grp"), 0o600),
        SetXattr(s("grp"), s(ACCESS), group, 0),
        Stat(s("grp")),
    ]);
    let user = |who: Who, ops: Vec<Op>| ops.into_iter().map(move |o| (who.clone(), o));
    steps.extend(user(
        u1(),
        vec![
            Read(s("f")),
            Write(s("f"), 0, b"x".to_vec()),
            Access(s("f"), 6),
            Access(s("f"), 1),
            Utimens(s("f"), T::Now, T::Now),
            Utimens(s("f"), T::At(1, 0), T::Omit),
            Chmod(s("f"), 0o600),
            SetXattr(s("f"), s(ACCESS), named.clone(), 0),
            GetXattr(s("f"), s(ACCESS)),
            Stat(s("priv/x")),
            Read(s("priv/x")),
            ReadDir(s("priv")),
            Create(s("priv/y"), 0o644),
            Read(s("grp")),
            Write(s("grp"), 0, b"g".to_vec()),
            Create(s("d/mine"), 0o644),
            Read(s("d/f")),
        ],
    ));
    steps.extend(user(
        u2(),
        vec![
            Read(s("f")),
            Access(s("f"), 4),
            Stat(s("priv/x")),
            Read(s("grp")),
        ],
    ));
    steps.extend(as_root(vec![
        // A chmod rewrites the owner, mask and other entries.
        Chmod(s("f"), 0o640),
        Stat(s("f")),
        GetXattr(s("f"), s(ACCESS)),
        Chown(s("f"), Some(2000), None),
        GetXattr(s("f"), s(ACCESS)),
        Chown(s("f"), Some(0), None),
    ]));
    steps.extend(user(
        u1(),
        vec![Read(s("f")), Write(s("f"), 0, b"y".to_vec())],
    ));
    steps.extend(as_root(vec![
        // Removing: an empty value, removexattr, and a removal of nothing.
        SetXattr(s("f"), s(ACCESS), Vec::new(), 0),
        Stat(s("f")),
        ListXattr(s("f")),
        RemoveXattr(s("d"), s(DEFAULT)),
        RemoveXattr(s("d"), s(DEFAULT)),
        ListXattr(s("d")),
        Create(s("d/after"), 0o666),
        Stat(s("d/after")),
        GetXattr(s("d/sub"), s(DEFAULT)),
        Create(s("d/sub/deep"), 0o666),
        Stat(s("d/sub/deep")),
        GetXattr(s("d/sub/deep"), s(ACCESS)),
    ]));
    steps.extend(user(u1(), vec![Read(s("f"))]));
    Case::new("posix_acl", 0o077, &steps)
}

fn user(who: Who, ops: Vec<Op>) -> Vec<(Who, Op)> {
    ops.into_iter().map(|o| (who.clone(), o)).collect()
}

const IMM: u32 = FS_IMMUTABLE_FL;
const APP: u32 = FS_APPEND_FL;
const NODUMP: u32 = FS_NODUMP_FL;
const NOATIME: u32 = FS_NOATIME_FL;
/// `FS_SYNC_FL` and `FS_CASEFOLD_FL`: flags tmpfs does not keep (EOPNOTSUPP).
const SYNC: u32 = 0x8;
const CASEFOLD: u32 = 0x4000_0000;

/// `chattr` / `lsattr` flags: who may set which, what tmpfs refuses, what an immutable or
/// append-only file or directory refuses, inheritance, and no atime under 'A'. Only steps
/// that a mount answers as tmpfs does (an open for writing of an immutable file succeeds
/// through a mount, whose kernel does not know the flag: `inode_flags_at_open`).
pub fn inode_flags() -> Case {
    let ms = 30;
    let mut steps = as_root(vec![
        Mkdir(s("d"), 0o777),
        Create(s("d/f"), 0o666),
        Write(s("d/f"), 0, b"hello".to_vec()),
        Chown(s("d/f"), Some(1000), Some(1000)),
        Mkdir(s("d/sub"), 0o777),
        Create(s("d/sub/x"), 0o666),
        Create(s("d/g"), 0o666),
        Mknod(s("d/fifo"), libc::S_IFIFO | 0o666, 0),
        Symlink(s("f"), s("d/l")),
        Chmod(s("d"), 0o777),
        Chmod(s("d/sub"), 0o777),
        Chmod(s("d/f"), 0o666),
        Chmod(s("d/g"), 0o666),
        Chmod(s("d/sub/x"), 0o666),
        GetFlags(s("d/f")),
        GetFlags(s("d")),
        GetFlags(s("d/fifo")),
        SetFlags(s("d/fifo"), NODUMP),
        GetFlags(s("d/l")),
        SetFlags(s("d/f"), 0x1),
        SetFlags(s("d/f"), SYNC),
        SetFlags(s("d/f"), CASEFOLD),
        SetFlags(s("d/sub"), CASEFOLD),
        GetXflags(s("d/f")),
    ]);
    steps.extend(user(
        u1(),
        vec![
            Stamp("f", s("d/f")),
            SleepMs(ms),
            SetFlags(s("d/f"), NODUMP),
            Changed("f", s("d/f")),
            GetFlags(s("d/f")),
            SetFlags(s("d/f"), NODUMP | NOATIME),
            SetFlags(s("d/f"), APP),
            SetFlags(s("d/f"), IMM | NODUMP),
            SetFlags(s("d/f"), SYNC),
            SetFlags(s("d/f"), SYNC | APP),
            GetXflags(s("d/f")),
        ],
    ));
    steps.extend(user(
        u2(),
        vec![
            GetFlags(s("d/f")),
            SetFlags(s("d/f"), 0),
            SetFlags(s("d/f"), SYNC),
        ],
    ));
    steps.extend(as_root(vec![
        // FS_IOC_FSSETXATTR: the four flags as xflags; anything else is refused.
        SetXflags(s("d/f"), 0x80),
        GetFlags(s("d/f")),
        SetXflags(s("d/f"), 0x20),
        SetXflags(s("d/f"), 0x1),
        SetXflags(s("d/f"), 0),
        GetFlags(s("d/f")),
        // Immutable: the owner may keep 'i' while changing the others, not drop it.
        SetFlags(s("d/f"), IMM | NODUMP),
    ]));
    steps.extend(user(
        u1(),
        vec![
            SetFlags(s("d/f"), IMM),
            GetFlags(s("d/f")),
            SetFlags(s("d/f"), 0),
            Write(s("d/f"), 0, b"x".to_vec()),
            Append(s("d/f"), b"x".to_vec()),
            Truncate(s("d/f"), 1),
            Chmod(s("d/f"), 0o600),
            Chown(s("d/f"), Some(1000), None),
            Utimens(s("d/f"), T::Now, T::Now),
            Utimens(s("d/f"), T::At(1, 0), T::Omit),
            SetXattr(s("d/f"), s("user.k"), b"v".to_vec(), 0),
            RemoveXattr(s("d/f"), s("user.k")),
            GetXattr(s("d/f"), s("user.k")),
            Access(s("d/f"), 4),
            Read(s("d/f")),
            Unlink(s("d/f")),
            Rename(s("d/f"), s("d/f2"), 0),
            Rename(s("d/g"), s("d/f"), 0),
            Link(s("d/f"), s("d/f3")),
        ],
    ));
    steps.extend(as_root(vec![
        Chmod(s("d/f"), 0o600),
        Unlink(s("d/f")),
        Truncate(s("d/f"), 0),
        Write(s("d/f"), 0, b"x".to_vec()),
        SetXattr(s("d/f"), s("trusted.k"), b"v".to_vec(), 0),
        Rename(s("d/f"), s("d/f"), 0),
        Stat(s("d/f")),
        // Append only.
        SetFlags(s("d/f"), APP),
    ]));
    steps.extend(user(
        u1(),
        vec![
            Write(s("d/f"), 0, b"x".to_vec()),
            Append(s("d/f"), b"!".to_vec()),
            Read(s("d/f")),
            Truncate(s("d/f"), 1),
            Chmod(s("d/f"), 0o600),
            Utimens(s("d/f"), T::Now, T::Now),
            Utimens(s("d/f"), T::Now, T::Omit),
            Utimens(s("d/f"), T::At(1, 0), T::Omit),
            Access(s("d/f"), 2),
            Unlink(s("d/f")),
            Rename(s("d/f"), s("d/f2"), 0),
            Link(s("d/f"), s("d/f3")),
            SetXattr(s("d/f"), s("user.k"), b"v".to_vec(), 0),
        ],
    ));
    steps.extend(user(
        u2(),
        vec![
            Utimens(s("d/f"), T::Now, T::Now),
            Append(s("d/f"), b"?".to_vec()),
        ],
    ));
    steps.extend(as_root(vec![
        Stat(s("d/f")),
        SetFlags(s("d/f"), 0),
        Write(s("d/f"), 0, b"X".to_vec()),
        Read(s("d/f")),
        // An immutable directory.
        SetFlags(s("d/sub"), IMM),
    ]));
    steps.extend(user(
        u1(),
        vec![
            Create(s("d/sub/y"), 0o644),
            Mkdir(s("d/sub/z"), 0o755),
            Symlink(s("x"), s("d/sub/s")),
            Mknod(s("d/sub/p"), libc::S_IFIFO | 0o644, 0),
            Unlink(s("d/sub/x")),
            Rename(s("d/sub/x"), s("d/sub/x2"), 0),
            Rename(s("d/g"), s("d/sub/g"), 0),
            Rename(s("d/sub/x"), s("d/x"), 0),
            Link(s("d/g"), s("d/sub/g")),
            Write(s("d/sub/x"), 0, b"in".to_vec()),
            ReadDir(s("d/sub")),
            Unlink(s("d/sub/nothing")),
        ],
    ));
    steps.extend(as_root(vec![
        Chmod(s("d/sub/x"), 0o600),
        Rmdir(s("d/sub")),
        Rename(s("d/sub"), s("d/sub2"), 0),
        Chmod(s("d/sub"), 0o755),
        Open(s("d/sub/x"), libc::O_RDONLY | libc::O_CREAT, 0o644),
        Mkdir(s("d/sub/x"), 0o755),
        Rename(s("d/sub/x"), s("d/sub/x"), 0),
        // An append-only directory: entries come, none go.
        SetFlags(s("d/sub"), APP),
    ]));
    steps.extend(user(
        u1(),
        vec![
            Create(s("d/sub/y"), 0o666),
            Unlink(s("d/sub/y")),
            Rename(s("d/sub/x"), s("d/sub/x2"), 0),
            Rename(s("d/g"), s("d/sub/g"), 0),
            Rename(s("d/sub/g"), s("d/g"), 0),
            Create(s("d/h"), 0o644),
            Rename(s("d/h"), s("d/sub/y"), 0),
            Mkdir(s("d/sub/m"), 0o755),
            Rmdir(s("d/sub/m")),
            ReadDir(s("d/sub")),
        ],
    ));
    steps.extend(as_root(vec![
        Rmdir(s("d/sub")),
        Chmod(s("d/sub"), 0o755),
        SetXattr(s("d/sub"), s("user.k"), b"v".to_vec(), 0),
        // New inodes inherit 'd' and 'A' (not 'a' or 'i').
        SetFlags(s("d/sub"), APP | NODUMP | NOATIME),
        Create(s("d/sub/inh"), 0o644),
        Create(s("d/sub/inh2"), 0o644),
        Mkdir(s("d/sub/inhd"), 0o755),
        Symlink(s("inh"), s("d/sub/inhl")),
        SetFlags(s("d/sub"), NODUMP | NOATIME),
        GetFlags(s("d/sub/inh")),
        GetFlags(s("d/sub/inhd")),
        GetFlags(s("d/sub/inhl")),
        Create(s("d/sub/inhd/deep"), 0o644),
        GetFlags(s("d/sub/inhd/deep")),
        // 'A': reads leave the access time alone. (Each file is read once: through a mount
        // a second read comes from the kernel's page cache, whatever the flags.)
        Write(s("d/sub/inh"), 0, b"data".to_vec()),
        Write(s("d/sub/inh2"), 0, b"data".to_vec()),
        Utimens(s("d/sub/inh"), T::At(1000, 0), T::At(1000, 0)),
        Utimens(s("d/sub/inh2"), T::At(1000, 0), T::At(1000, 0)),
        Stamp("a", s("d/sub/inh")),
        SleepMs(ms),
        Read(s("d/sub/inh")),
        Changed("a", s("d/sub/inh")),
        SetFlags(s("d/sub/inh2"), 0),
        Stamp("a", s("d/sub/inh2")),
        SleepMs(ms),
        Read(s("d/sub/inh2")),
        Changed("a", s("d/sub/inh2")),
        SetFlags(s("d/sub"), 0),
        Rmdir(s("d/sub/inhd")),
    ]));
    Case::new("inode_flags", 0o022, &steps)
}

/// What an open and `access` see of 'i' and 'a' (kernel comparison only: through a mount the
/// kernel decides them itself, not knowing the flags, and the writes are refused instead).
pub fn inode_flags_at_open() -> Case {
    Case::new(
        "inode_flags_at_open",
        0o022,
        &as_root(vec![
            Create(s("f"), 0o666),
            SetFlags(s("f"), IMM),
            Access(s("f"), 2),
            Access(s("f"), 4),
            Open(s("f"), libc::O_WRONLY, 0),
            Open(s("f"), libc::O_RDWR, 0),
            Open(s("f"), libc::O_RDONLY, 0),
            Open(s("f"), libc::O_RDONLY | libc::O_TRUNC, 0),
            SetFlags(s("f"), APP),
            Open(s("f"), libc::O_WRONLY, 0),
            Open(s("f"), libc::O_RDWR, 0),
            Open(s("f"), libc::O_WRONLY | libc::O_APPEND, 0),
            Open(s("f"), libc::O_RDWR | libc::O_APPEND, 0),
            Open(s("f"), libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC, 0),
            Open(s("f"), libc::O_RDONLY | libc::O_TRUNC, 0),
            SetFlags(s("f"), 0),
            Open(s("f"), libc::O_WRONLY | libc::O_TRUNC, 0),
        ]),
    )
}

const ACCESS: &str = "system.posix_acl_access";
const DEFAULT: &str = "system.posix_acl_default";

/// An access ACL with a named user: owner rw, user 1234 rwx, group rx, mask rwx, other none.
fn named_acl() -> Vec<u8> {
    acl(&[
        (0x01, 6, u32::MAX),
        (0x02, 7, 1234),
        (0x04, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 0, u32::MAX),
    ])
}

/// `renameat2(RENAME_WHITEOUT)`: the source name is left naming a new character device 0/0
/// (mode 0, the caller's owner and the directory's setgid group, an inherited ACL), link
/// counts, directories, refusals, and plain users (no capability needed).
pub fn rename_whiteout() -> Case {
    const W: u32 = libc::RENAME_WHITEOUT;
    let named = named_acl();
    let mut steps = as_root(vec![
        Mkdir(s("s"), 0o755),
        Mkdir(s("t"), 0o755),
        Create(s("s/a"), 0o644),
        Write(s("s/a"), 0, b"x".to_vec()),
        Stat(s("s")),
        Rename(s("s/a"), s("s/b"), W),
        Lstat(s("s/a")),
        Lstat(s("s/b")),
        Stat(s("s")),
        ReadDir(s("s")),
        Rename(s("s/b"), s("t/b"), W),
        Lstat(s("s/b")),
        Stat(s("t")),
        // Over an existing name (a whiteout), and back.
        Rename(s("t/b"), s("s/a"), W),
        Lstat(s("t/b")),
        Read(s("s/a")),
        Rename(s("s/a"), s("s/x"), W | libc::RENAME_EXCHANGE),
        Rename(s("s/a"), s("s/b"), W | libc::RENAME_NOREPLACE),
        Rename(s("s/a"), s("s/n"), W | libc::RENAME_NOREPLACE),
        Rename(s("s/nothing"), s("s/q"), W),
        Rename(s("s/n"), s("s/n"), W),
        Link(s("s/n"), s("s/n2")),
        Rename(s("s/n"), s("s/n2"), W),
        Lstat(s("s/n")),
        Rename(s("s/n"), s("s/n"), 0x10),
        // Directories.
        Mkdir(s("s/dir"), 0o755),
        Create(s("s/dir/in"), 0o644),
        Stat(s("s")),
        Rename(s("s/dir"), s("t/dir"), W),
        Stat(s("s")),
        Stat(s("t")),
        Lstat(s("s/dir")),
        Stat(s("t/dir/in")),
        Mkdir(s("t/full"), 0o755),
        Create(s("t/full/x"), 0o644),
        Mkdir(s("s/d2"), 0o755),
        Rename(s("s/d2"), s("t/full"), W),
        Lstat(s("s/d2")),
        Mkdir(s("t/empty"), 0o755),
        Rename(s("s/d2"), s("t/empty"), W),
        Lstat(s("s/d2")),
        Stat(s("t/empty")),
        Stat(s("t")),
        Mkdir(s("t/dir/sub"), 0o755),
        Rename(s("t/dir"), s("t/dir/sub/y"), W),
        ReadDir(s("s")),
        ReadDir(s("t")),
        // The whiteout is unlinked and renamed like any device.
        Unlink(s("s/b")),
        Rename(s("s/dir"), s("s/w"), 0),
        Lstat(s("s/w")),
        // A setgid directory, a sticky one, and one with a default ACL.
        Mkdir(s("g"), 0o777),
        Chmod(s("g"), 0o2777),
        Chown(s("g"), None, Some(3000)),
        Mkdir(s("st"), 0o777),
        Chmod(s("st"), 0o1777),
        Mkdir(s("acl"), 0o777),
        SetXattr(s("acl"), s(DEFAULT), named, 0),
        Create(s("acl/x"), 0o644),
        Rename(s("acl/x"), s("acl/y"), W),
        Lstat(s("acl/x")),
        GetXattr(s("acl/x"), s(ACCESS)),
        // Flags of the directories still apply.
        Create(s("s/c"), 0o644),
        SetFlags(s("s"), APP),
        Rename(s("s/c"), s("s/c2"), W),
        SetFlags(s("s"), IMM),
        Rename(s("s/c"), s("s/c2"), W),
        SetFlags(s("s"), 0),
        SetFlags(s("s/c"), IMM),
        Rename(s("s/c"), s("s/c2"), W),
        SetFlags(s("s/c"), 0),
    ]);
    steps.extend(user(
        u1(),
        vec![
            Create(s("g/f"), 0o644),
            Rename(s("g/f"), s("g/h"), W),
            Lstat(s("g/f")),
            Lstat(s("g/h")),
            Create(s("st/m"), 0o644),
            Rename(s("s/c"), s("s/z"), W),
            Mknod(s("g/w"), libc::S_IFCHR, 0),
            Mknod(s("g/w2"), libc::S_IFCHR | 0o644, 0),
            Mknod(s("g/w3"), libc::S_IFCHR | 0o644, 0x0103),
            Mknod(s("g/w4"), libc::S_IFBLK, 0),
            Lstat(s("g/w")),
            Lstat(s("g/w2")),
        ],
    ));
    steps.extend(user(
        u2(),
        vec![
            Rename(s("st/m"), s("st/n"), W),
            Create(s("st/o"), 0o644),
            Rename(s("st/o"), s("st/p"), W),
            Lstat(s("st/o")),
            ReadDir(s("g")),
        ],
    ));
    Case::new("rename_whiteout", 0o022, &steps)
}

fn tmp(dir: &str, flags: i32, mode: u32, data: &[u8], link: Option<&str>) -> Op {
    Tmpfile {
        dir: s(dir),
        flags,
        mode,
        data: data.to_vec(),
        link: link.map(s),
    }
}

/// `open(O_TMPFILE)` and `linkat` of the file through `/proc/self/fd`: the new file's mode,
/// owner, group (setgid directories), size and blocks, link count before and after the
/// link; the errnos of the open (read-only access, not a directory, missing, no write
/// permission) and of the link (`O_EXCL`, a taken name); the directory's times untouched
/// by a tmpfile never named.
pub fn o_tmpfile() -> Case {
    let rw = libc::O_RDWR;
    Case::new(
        "o_tmpfile",
        0o022,
        &[
            (root(), Mkdir(s("d"), 0o755)),
            (root(), Mkdir(s("w"), 0o777)),
            (root(), Chmod(s("w"), 0o777)),
            (root(), Mkdir(s("g"), 0o777)),
            (root(), Chown(s("g"), None, Some(3000))),
            (root(), Chmod(s("g"), 0o2777)),
            (root(), Create(s("d/f"), 0o644)),
            (root(), tmp("d", rw, 0o640, b"data", Some("d/named"))),
            (root(), Stat(s("d/named"))),
            (root(), Read(s("d/named"))),
            (root(), ReadDir(s("d"))),
            (root(), Stamp("d", s("d"))),
            (root(), SleepMs(20)),
            (root(), tmp("d", libc::O_WRONLY, 0o666, &[7; 9000], None)),
            (root(), Changed("d", s("d"))),
            (
                root(),
                tmp("d", rw | libc::O_EXCL, 0o600, b"x", Some("d/excl")),
            ),
            (root(), tmp("d", rw, 0o600, b"", Some("d/f"))),
            (root(), ReadDir(s("d"))),
            (root(), Stat(s("d"))),
            (root(), tmp("d", libc::O_RDONLY, 0o600, b"", None)),
            (root(), tmp("d/f", rw, 0o600, b"", None)),
            (root(), tmp("missing", rw, 0o600, b"", None)),
            (u1(), tmp("d", rw, 0o600, b"", None)),
            (u1(), tmp("w", rw, 0o4777, b"mine", Some("w/u1"))),
            (u1(), Stat(s("w/u1"))),
            (u1(), tmp("g", rw, 0o2775, b"", Some("g/in-group"))),
            (u2(), tmp("g", rw, 0o2775, b"", Some("g/not-in-group"))),
            (u2(), tmp("g", rw, 0o640, &[1; 5000], Some("g/in-group"))),
            (root(), ReadDir(s("g"))),
            (root(), Stat(s("g/not-in-group"))),
        ],
    )
}

/// `may_delete` checks an immutable or append-only victim (EPERM) before its type (EISDIR,
/// ENOTDIR), for unlink, rmdir, and each side of a rename, whiteouts included; and no
/// attribute of an immutable or append-only inode changes, POSIX ACLs included (EPERM,
/// before any check of the ACL itself), even a removal of one it does not have. The
/// library's order only: through a mount the kernel checks a type before it asks the server
/// (it does not know a FUSE inode's flags), so this case is not in [`all`].
pub fn flags_before_types() -> Case {
    const W: u32 = libc::RENAME_WHITEOUT;
    const X: u32 = libc::RENAME_EXCHANGE;
    let named = named_acl();
    let mut steps = Vec::new();
    for (flag, tag) in [(IMM, "i"), (APP, "a")] {
        let d = tag.to_string();
        let p = |x: &str| format!("{d}/{x}");
        let mut ops = vec![
            Mkdir(d.clone(), 0o777),
            Mkdir(p("dir"), 0o777),
            Mkdir(p("dir2"), 0o777),
            Create(p("file"), 0o644),
            Create(p("file2"), 0o644),
            Create(p("plain"), 0o644),
            Mkdir(p("plaindir"), 0o777),
            SetFlags(p("dir"), flag),
            SetFlags(p("file"), flag),
            // The victim's flags before its type.
            Unlink(p("dir")),
            Rmdir(p("file")),
            Unlink(p("file")),
            Rmdir(p("dir")),
            // A rename's target: its flags before its type.
            Rename(p("plain"), p("dir"), 0),
            Rename(p("plaindir"), p("file"), 0),
            Rename(p("plain"), p("dir"), W),
            Rename(p("plaindir"), p("file"), W),
            Rename(p("plain"), p("dir"), X),
            Rename(p("plaindir"), p("file"), X),
            // Its source: the same.
            Rename(p("dir"), p("plain"), 0),
            Rename(p("file"), p("plaindir"), 0),
            Rename(p("dir"), p("plain"), W),
            Rename(p("file"), p("plaindir"), W),
            Rename(p("file"), p("new"), W),
            // ACLs and other attributes of a flagged inode.
            SetXattr(p("file"), s(ACCESS), named.clone(), 0),
            SetXattr(p("file"), s(DEFAULT), named.clone(), 0),
            RemoveXattr(p("file"), s(ACCESS)),
            RemoveXattr(p("file"), s(DEFAULT)),
            SetXattr(p("dir"), s(DEFAULT), named.clone(), 0),
            RemoveXattr(p("dir"), s(DEFAULT)),
            RemoveXattr(p("dir"), s(ACCESS)),
            SetXattr(p("file"), s("user.k"), b"v".to_vec(), 0),
            RemoveXattr(p("file"), s("user.k")),
            // An append-only or immutable directory: nothing leaves it.
            SetFlags(p("dir2"), flag),
            Mkdir(p("dir2/sub"), 0o777),
            ReadDir(p("dir2")),
            Lstat(p("dir")),
            Lstat(p("file")),
            Lstat(p("plain")),
            Lstat(p("new")),
            SetFlags(p("dir"), 0),
            SetFlags(p("file"), 0),
            SetFlags(p("dir2"), 0),
        ];
        if flag == APP {
            // Entries may be added to an append-only directory, never removed or replaced.
            ops.splice(
                ops.len() - 3..ops.len() - 3,
                vec![
                    SetFlags(p("dir2"), flag),
                    Create(p("dir2/x"), 0o644),
                    Mkdir(p("dir2/y"), 0o777),
                    Unlink(p("dir2/x")),
                    Rmdir(p("dir2/y")),
                    Rename(p("dir2/x"), p("dir2/y"), 0),
                    Rename(p("dir2/x"), p("dir2/z"), 0),
                    Rename(p("plain"), p("dir2/x"), 0),
                    Rename(p("plain"), p("dir2/w"), 0),
                    ReadDir(p("dir2")),
                ],
            );
        }
        steps.extend(as_root(ops));
    }
    Case::new("flags_before_types", 0o022, &steps)
}
