//! Where a call's path is: on a lanefs mount this process can reach over the channel (the
//! mount, and the path from its root), or anywhere else.
//!
//! Absolute paths are matched against the mountpoints ([`crate::mounts`]). A relative path
//! is made absolute first, with the working directory (`getcwd(2)`) or, for a directory
//! descriptor, the path the kernel keeps for it (`/proc/self/fd/N`), so that the server
//! resolves every path from its root and checks search permission on every directory on
//! the way (it never takes a starting directory on a client's word). Linux does not check
//! the directories above a working directory or a descriptor; a call the server refuses
//! with EACCES on a path made absolute here is therefore made again through the kernel.
//!
//! A call outside every lanefs mount costs a prefix comparison per mount, and, for a
//! relative path, a `getcwd` only while the working directory may be inside one: the
//! working directory's place is remembered ([`CWD`]) and forgotten by `chdir` and
//! `fchdir`. (Should a program change directory by a raw system call, the remembered
//! answer is only ever "outside", which sends its relative paths through the kernel.)

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use crate::mounts::{Mount, table, table_outside};
use crate::real::{getcwd, readlink_raw};

/// Room for a path made absolute: `PATH_MAX` twice.
pub(crate) const PATH_BUF: usize = 8192;

const UNKNOWN: u8 = 0;
const OUTSIDE: u8 = 1;
const MAYBE_INSIDE: u8 = 2;

/// Whether the working directory is outside every lanefs mount.
static CWD: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The working directory may have changed (`chdir`, `fchdir`, a new mount table).
pub(crate) fn forget_cwd() {
    CWD.store(UNKNOWN, Relaxed);
}

/// A located path: its mount, the path from the mount's root, and whether it was relative.
pub(crate) struct Located<'b> {
    pub mount: &'static Mount,
    pub rel: &'b [u8],
    pub relative: bool,
}

/// Locates `path` (relative to `dirfd`, which may be `AT_FDCWD`), using `buf` to make it
/// absolute. None: not on a reachable lanefs mount, or not something to decide here (an
/// empty path), so the call goes through the kernel.
pub(crate) fn locate<'b>(
    dirfd: libc::c_int,
    path: &'b [u8],
    buf: &'b mut std::mem::MaybeUninit<[u8; PATH_BUF]>,
) -> Option<Located<'b>> {
    if path.is_empty() {
        return None;
    }
    // The cheap look first: most paths are on no lanefs mount.
    let quick = table_outside();
    if quick.mounts.is_empty()
        || (path[0] == b'/' && quick.find(path).is_none())
        || (path[0] != b'/' && dirfd == libc::AT_FDCWD && CWD.load(Relaxed) == OUTSIDE)
    {
        return None;
    }
    let t = table();
    if t.mounts.is_empty() {
        return None;
    }
    if path[0] == b'/' {
        let (mount, rel) = t.find(path)?;
        return Some(Located {
            mount,
            rel,
            relative: false,
        });
    }
    // Zeroed only now: a path outside every mount never needs it.
    let buf = buf.write([0u8; PATH_BUF]);
    let base = if dirfd == libc::AT_FDCWD {
        if CWD.load(Relaxed) == OUTSIDE {
            return None;
        }
        let n = getcwd(&mut buf[..4096]).ok()?;
        let inside = buf[0] == b'/' && t.find(&buf[..n]).is_some();
        CWD.store(if inside { MAYBE_INSIDE } else { OUTSIDE }, Relaxed);
        if !inside {
            return None;
        }
        n
    } else {
        // A descriptor on no lanefs mount (the common case) is told by one fstat.
        let st = crate::real::fd_stat(dirfd).ok()?;
        if !t.devs.contains(&st.st_dev) || st.st_nlink == 0 {
            return None;
        }
        let mut name = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
        let digits = write_decimal(&mut name[14..], dirfd as u32);
        let cname = std::ffi::CStr::from_bytes_until_nul(&name[..14 + digits + 1]).ok()?;
        let n = readlink_raw(cname, &mut buf[..4096]).ok()?;
        if n == 0 || buf[0] != b'/' || n >= 4096 {
            return None;
        }
        n
    };
    if base + 1 + path.len() > PATH_BUF {
        return None;
    }
    buf[base] = b'/';
    buf[base + 1..base + 1 + path.len()].copy_from_slice(path);
    let full: &'b [u8] = &buf[..base + 1 + path.len()];
    let (mount, rel) = t.find(full)?;
    // The kernel limits the path it was given, not the one made here: a longer one is its.
    if rel.len() >= crate::real::PATH_MAX {
        return None;
    }
    Some(Located {
        mount,
        rel,
        relative: true,
    })
}

/// Writes `v` in decimal at the start of `out`; the number of digits.
fn write_decimal(out: &mut [u8], mut v: u32) -> usize {
    let mut tmp = [0u8; 10];
    let mut n = 0;
    loop {
        tmp[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = tmp[n - 1 - i];
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals() {
        let mut b = [0u8; 10];
        assert_eq!(write_decimal(&mut b, 0), 1);
        assert_eq!(&b[..1], b"0");
        assert_eq!(write_decimal(&mut b, 4294967295), 10);
        assert_eq!(&b[..10], b"4294967295");
    }
}
