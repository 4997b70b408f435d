//! The kernel mount flags: the one table of them ([`MOUNT_FLAGS`]) and the names of
//! [`MountOption`]s.

use fuser::MountOption;

/// A mount option that is a kernel mount flag: the `MS_*` bits it sets and those it clears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountFlag {
    /// The option as `mount -o` and `/proc/self/mountinfo` spell it.
    pub name: &'static str,
    /// Bits turned on.
    pub set: libc::c_ulong,
    /// Bits turned off.
    pub clear: libc::c_ulong,
}

impl MountFlag {
    /// `flags` with this option applied.
    pub fn apply(&self, flags: libc::c_ulong) -> libc::c_ulong {
        (flags & !self.clear) | self.set
    }

    /// The bits this option decides: a later option deciding any of them overrides it.
    pub fn mask(&self) -> libc::c_ulong {
        self.set | self.clear
    }

    /// The option as [`MountOption`] names it (the type `fuser` defines, which lanefs keeps
    /// for its mount options): its own variant where it has one, a custom option otherwise.
    pub fn option(&self) -> MountOption {
        match self.name {
            "ro" => MountOption::RO,
            "rw" => MountOption::RW,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            other => MountOption::CUSTOM(other.to_string()),
        }
    }
}

const fn flag(name: &'static str, set: libc::c_ulong, clear: libc::c_ulong) -> MountFlag {
    MountFlag { name, set, clear }
}

/// Every mount option that is a kernel mount flag, with its `MS_*` bits: the one table that
/// `lanefs mount -o`, the mount helper's `-o remount` and lanefs's own `mount(2)` read. It
/// holds every flag the kernel reports for a mount in `/proc/self/mountinfo`, so the options
/// of a mounted lanefs can be given back to mount another.
pub const MOUNT_FLAGS: &[MountFlag] = &[
    flag("ro", libc::MS_RDONLY, 0),
    flag("rw", 0, libc::MS_RDONLY),
    flag("nosuid", libc::MS_NOSUID, 0),
    flag("suid", 0, libc::MS_NOSUID),
    flag("nodev", libc::MS_NODEV, 0),
    flag("dev", 0, libc::MS_NODEV),
    flag("noexec", libc::MS_NOEXEC, 0),
    flag("exec", 0, libc::MS_NOEXEC),
    flag("sync", libc::MS_SYNCHRONOUS, 0),
    flag("async", 0, libc::MS_SYNCHRONOUS),
    flag("dirsync", libc::MS_DIRSYNC, 0),
    flag(
        "noatime",
        libc::MS_NOATIME,
        libc::MS_RELATIME | libc::MS_STRICTATIME,
    ),
    flag("atime", 0, libc::MS_NOATIME),
    flag(
        "relatime",
        libc::MS_RELATIME,
        libc::MS_NOATIME | libc::MS_STRICTATIME,
    ),
    flag("norelatime", 0, libc::MS_RELATIME),
    flag(
        "strictatime",
        libc::MS_STRICTATIME,
        libc::MS_NOATIME | libc::MS_RELATIME,
    ),
    flag("nostrictatime", 0, libc::MS_STRICTATIME),
    flag("nodiratime", libc::MS_NODIRATIME, 0),
    flag("diratime", 0, libc::MS_NODIRATIME),
    flag("lazytime", libc::MS_LAZYTIME, 0),
    flag("nolazytime", 0, libc::MS_LAZYTIME),
    flag("nosymfollow", libc::MS_NOSYMFOLLOW, 0),
    flag("symfollow", 0, libc::MS_NOSYMFOLLOW),
];

/// The kernel mount flag named `name` (`nosuid`, `noatime`...), if it is one.
pub fn mount_flag(name: &str) -> Option<&'static MountFlag> {
    MOUNT_FLAGS.iter().find(|f| f.name == name)
}

/// The name of a mount option, for [`mount_flag`] and `fusermount3 -o`.
pub(super) fn option_name(o: &MountOption) -> Option<&str> {
    Some(match o {
        MountOption::RO => "ro",
        MountOption::RW => "rw",
        MountOption::Suid => "suid",
        MountOption::NoSuid => "nosuid",
        MountOption::Dev => "dev",
        MountOption::NoDev => "nodev",
        MountOption::Exec => "exec",
        MountOption::NoExec => "noexec",
        MountOption::Atime => "atime",
        MountOption::NoAtime => "noatime",
        MountOption::Sync => "sync",
        MountOption::Async => "async",
        MountOption::DirSync => "dirsync",
        MountOption::CUSTOM(s) => s,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(names: &[&str]) -> libc::c_ulong {
        names
            .iter()
            .fold(0, |f, n| mount_flag(n).expect("a flag").apply(f))
    }

    #[test]
    fn every_flag_has_one_entry_and_its_fuser_option_maps_back() {
        for f in MOUNT_FLAGS {
            assert_eq!(MOUNT_FLAGS.iter().filter(|g| g.name == f.name).count(), 1);
            assert_eq!(f.set & f.clear, 0, "{}", f.name);
            let o = f.option();
            assert_eq!(option_name(&o), Some(f.name), "{o:?}");
        }
        assert!(mount_flag("size").is_none() && mount_flag("user_id").is_none());
    }

    #[test]
    fn later_flags_override_earlier_ones() {
        assert_eq!(
            apply(&["nosuid", "nodev"]),
            libc::MS_NOSUID | libc::MS_NODEV
        );
        assert_eq!(apply(&["nosuid", "suid"]), 0);
        assert_eq!(apply(&["ro", "rw", "noexec"]), libc::MS_NOEXEC);
        assert_eq!(apply(&["noatime", "relatime"]), libc::MS_RELATIME);
        assert_eq!(apply(&["relatime", "strictatime"]), libc::MS_STRICTATIME);
        assert_eq!(apply(&["strictatime", "noatime"]), libc::MS_NOATIME);
        assert_eq!(
            apply(&["nodiratime", "noatime", "sync", "dirsync"]),
            libc::MS_NODIRATIME | libc::MS_NOATIME | libc::MS_SYNCHRONOUS | libc::MS_DIRSYNC
        );
        // Conflicting options decide the same bits.
        let (a, b) = (mount_flag("noatime").unwrap(), mount_flag("atime").unwrap());
        assert_ne!(a.mask() & b.mask(), 0);
        let (a, b) = (
            mount_flag("noatime").unwrap(),
            mount_flag("nodiratime").unwrap(),
        );
        assert_eq!(a.mask() & b.mask(), 0);
    }
}
