//! Shared test harness: one operation language, executed by the Linux kernel (syscalls on a
//! tmpfs directory) and by lanefs (the path API), so that results and errnos can be compared
//! step by step.
//!
//! Credentials: each identity (`Who`) runs its kernel syscalls on a thread of its own that
//! has set its filesystem uid/gid and supplementary groups with per-thread raw system calls,
//! its own umask (`unshare(CLONE_FS)`), and, for non-root identities, dropped every
//! capability, so it is a plain user to the kernel.
//!
//! Beside it: [`cases`] (the cases both run), [`seed`] (the seeds of every randomised test,
//! from `LANEFS_SEED`), [`tree`] (a whole filesystem as a map, compared) and
//! [`linearizability`] (the races of `permission_linearizability.rs` and
//! `directory_linearizability.rs`).

#![allow(dead_code)]

pub mod cases;
pub mod linearizability;
pub mod seed;
pub mod tree;

#[allow(unused_imports)] // each test binary uses some
pub use tree::{Node, Tree, assert_same_tree, cookie_of, dump, named_user_acl, tree_diff};

use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use lanefs::{Client, Ctx, Filesystem, OpenOptions, TimeSet, Timespec};

/// Who runs an operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    Root,
    User {
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
    },
}

impl Who {
    pub fn user(uid: u32, gid: u32) -> Who {
        Who::User {
            uid,
            gid,
            groups: vec![],
        }
    }
    pub fn ctx(&self) -> Ctx {
        match self {
            Who::Root => Ctx::root(),
            Who::User { uid, gid, groups } => Ctx::user(*uid, *gid).with_groups(groups),
        }
    }
}

/// A time for `Utimens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum T {
    Omit,
    Now,
    At(i64, u32),
}

/// One operation; paths are relative to the test's base directory.
#[derive(Clone, Debug)]
pub enum Op {
    Mkdir(String, u32),
    Rmdir(String),
    /// open(O_CREAT|O_EXCL|O_WRONLY, mode) + close
    Create(String, u32),
    /// open(flags, mode) + close
    Open(String, i32, u32),
    Unlink(String),
    Rename(String, String, u32),
    Link(String, String),
    Symlink(String, String),
    Readlink(String),
    Mknod(String, u32, u64),
    Stat(String),
    Lstat(String),
    Chmod(String, u32),
    Chown(String, Option<u32>, Option<u32>),
    Truncate(String, u64),
    /// open(O_WRONLY) + pwrite + close
    Write(String, u64, Vec<u8>),
    /// open(O_WRONLY|O_APPEND) + write + close
    Append(String, Vec<u8>),
    Read(String),
    ReadDir(String),
    Access(String, u32),
    SetXattr(String, String, Vec<u8>, i32),
    GetXattr(String, String),
    ListXattr(String),
    RemoveXattr(String, String),
    Utimens(String, T, T),
    /// Records the path's (atime, mtime, ctime) under a label.
    Stamp(&'static str, String),
    /// Which of (atime, mtime, ctime) differ from the stamp.
    Changed(&'static str, String),
    SameIno(String, String),
    SleepMs(u64),
    /// open(O_RDONLY|O_NONBLOCK) + ioctl(FS_IOC_GETFLAGS) + close (`lsattr`)
    GetFlags(String),
    /// open(O_RDONLY|O_NONBLOCK) + ioctl(FS_IOC_SETFLAGS) + close (`chattr`)
    SetFlags(String, u32),
    /// open(O_RDONLY|O_NONBLOCK) + ioctl(FS_IOC_FSGETXATTR) + close: the `fsx_xflags`
    GetXflags(String),
    /// open(O_RDONLY|O_NONBLOCK) + ioctl(FS_IOC_FSSETXATTR) + close, with these
    /// `fsx_xflags` and the other fields 0
    SetXflags(String, u32),
    /// open(dir, O_TMPFILE | flags, mode) + pwrite(data, 0) + (if a name is given)
    /// linkat("/proc/self/fd/N", name, AT_SYMLINK_FOLLOW) + fstat + close: the stat after
    /// the link and the link's errno (`Val::Tmpfile`), or the open's errno
    Tmpfile {
        dir: String,
        flags: i32,
        mode: u32,
        data: Vec<u8>,
        link: Option<String>,
    },
}

/// `FS_IOC_FSGETXATTR` and `FS_IOC_FSSETXATTR` (`_IOR/_IOW('X', 31/32, struct fsxattr)`).
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `FS_IOC_GETFLAGS` and `FS_IOC_SETFLAGS` (`_IOR/_IOW('f', 1/2, long)`).
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;

/// `struct fsxattr`.
#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

/// The `FS_XFLAG_*` of the four `chattr` flags, as `fileattr_fill_flags` maps them.
pub const XFLAGS: [(u32, u32); 4] = [
    (lanefs::FS_IMMUTABLE_FL, 0x8),
    (lanefs::FS_APPEND_FL, 0x10),
    (lanefs::FS_NODUMP_FL, 0x80),
    (lanefs::FS_NOATIME_FL, 0x40),
];

/// What `stat` shows that must match tmpfs (inode numbers and times are compared by
/// `SameIno` and `Changed` instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatView {
    pub fmt: u32,
    pub perm: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub rdev: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Val {
    Unit,
    Stat(StatView),
    Bytes(Vec<u8>),
    Names(Vec<Vec<u8>>),
    Times(bool, bool, bool),
    Bool(bool),
    Flags(u32),
    /// An `O_TMPFILE` file's stat, and the errno of the link that tried to name it.
    Tmpfile(StatView, Option<i32>),
}

pub type Outcome = Result<Val, i32>;

/// Something that runs operations.
pub trait Executor {
    fn run(&mut self, who: &Who, op: &Op) -> Outcome;
}

// ----- the kernel -----------------------------------------------------------------------------

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(rc: i64) -> Result<(), i32> {
    if rc < 0 { Err(errno()) } else { Ok(()) }
}

const TMPFS_MAGIC: i64 = 0x0102_1994;

/// A fresh directory on a kernel tmpfs: under /dev/shm when that is tmpfs, otherwise a
/// tmpfs mounted for the test run (needs root).
pub fn kernel_tmpfs_dir(tag: &str) -> PathBuf {
    let candidates = [PathBuf::from("/dev/shm"), std::env::temp_dir()];
    for c in candidates {
        let p = cstr(&c);
        // SAFETY: statfs writes into the zeroed struct we pass.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `p` is a valid C string and `sfs` a valid out-pointer.
        if unsafe { libc::statfs(p.as_ptr(), &mut sfs) } == 0 && sfs.f_type as i64 == TMPFS_MAGIC {
            let d = c.join(format!(
                "lanefs-test-{tag}-{}-{}",
                std::process::id(),
                rand_suffix()
            ));
            std::fs::create_dir(&d).expect("create test dir on tmpfs");
            set_mode(&d, 0o777);
            return d;
        }
    }
    let mnt = std::env::temp_dir().join(format!(
        "lanefs-tmpfs-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&mnt).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&mnt)
        .status();
    assert!(
        st.is_ok_and(|s| s.success()),
        "no tmpfs available: /dev/shm is not tmpfs and mounting one at {} failed (run as root)",
        mnt.display()
    );
    let d = mnt.join(tag);
    std::fs::create_dir(&d).unwrap();
    set_mode(&d, 0o777);
    d
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn set_mode(p: &Path, mode: u32) {
    let c = cstr(p);
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::chmod(c.as_ptr(), mode) }, 0);
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Becomes `who` for the calling thread only.
fn become_thread(who: &Who, umask: u32) {
    // SAFETY: plain system calls on this thread's own credentials; arguments are valid.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_FS), 0, "unshare(CLONE_FS)");
        libc::umask(umask);
        if let Who::User { uid, gid, groups } = who {
            let gs: Vec<libc::gid_t> = groups.clone();
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, gs.len(), gs.as_ptr()),
                0,
                "setgroups"
            );
            libc::syscall(libc::SYS_setfsgid, *gid);
            libc::syscall(libc::SYS_setfsuid, *uid);
            let hdr = CapHeader {
                version: 0x2008_0522,
                pid: 0,
            };
            let data = [CapData::default(); 2];
            assert_eq!(
                libc::syscall(libc::SYS_capset, &hdr, data.as_ptr()),
                0,
                "capset"
            );
        }
    }
}

type Job = Box<dyn FnOnce() -> Outcome + Send>;

/// Runs operations as the kernel sees them, on a tmpfs directory.
pub struct Kernel {
    base: PathBuf,
    umask: u32,
    workers: HashMap<Who, mpsc::Sender<(Job, mpsc::Sender<Outcome>)>>,
    stamps: HashMap<&'static str, (Timespec, Timespec, Timespec)>,
}

impl Kernel {
    pub fn new(tag: &str, umask: u32) -> Kernel {
        Kernel::at(kernel_tmpfs_dir(tag), umask)
    }

    /// Runs on an existing directory of any filesystem (removed when dropped).
    pub fn at(base: PathBuf, umask: u32) -> Kernel {
        Kernel {
            base,
            umask,
            workers: HashMap::new(),
            stamps: HashMap::new(),
        }
    }

    fn on_thread(&mut self, who: &Who, job: Job) -> Outcome {
        let umask = self.umask;
        let tx = self.workers.entry(who.clone()).or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<(Job, mpsc::Sender<Outcome>)>();
            let w = who.clone();
            std::thread::spawn(move || {
                become_thread(&w, umask);
                for (job, reply) in rx {
                    let _ = reply.send(job());
                }
            });
            tx
        });
        let (rtx, rrx) = mpsc::channel();
        tx.send((job, rtx)).expect("worker alive");
        rrx.recv().expect("worker replied")
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    fn times(&mut self, who: &Who, p: PathBuf) -> Result<(Timespec, Timespec, Timespec), i32> {
        match self.on_thread(
            who,
            Box::new(move || kstat(&p, true).map(|s| Val::Bytes(times_bytes(&s)))),
        )? {
            Val::Bytes(b) => Ok(bytes_times(&b)),
            _ => unreachable!(),
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.workers.clear();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn times_bytes(s: &libc::stat) -> Vec<u8> {
    let mut v = Vec::new();
    for (sec, nsec) in [
        (s.st_atime, s.st_atime_nsec),
        (s.st_mtime, s.st_mtime_nsec),
        (s.st_ctime, s.st_ctime_nsec),
    ] {
        v.extend_from_slice(&sec.to_le_bytes());
        v.extend_from_slice(&(nsec as u32).to_le_bytes());
    }
    v
}

fn bytes_times(b: &[u8]) -> (Timespec, Timespec, Timespec) {
    let t = |i: usize| {
        Timespec::new(
            i64::from_le_bytes(b[i * 12..i * 12 + 8].try_into().unwrap()),
            u32::from_le_bytes(b[i * 12 + 8..i * 12 + 12].try_into().unwrap()),
        )
    };
    (t(0), t(1), t(2))
}

fn kstat(p: &Path, follow: bool) -> Result<libc::stat, i32> {
    let c = cstr(p);
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    let rc = unsafe {
        if follow {
            libc::stat(c.as_ptr(), &mut st)
        } else {
            libc::lstat(c.as_ptr(), &mut st)
        }
    };
    check(rc as i64).map(|_| st)
}

fn view(st: &libc::stat) -> StatView {
    let fmt = st.st_mode & libc::S_IFMT;
    StatView {
        fmt,
        perm: st.st_mode & 0o7777,
        nlink: st.st_nlink,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        blocks: if fmt == libc::S_IFREG {
            st.st_blocks as u64
        } else {
            0
        },
        rdev: if fmt == libc::S_IFCHR || fmt == libc::S_IFBLK {
            st.st_rdev
        } else {
            0
        },
    }
}

fn ts(t: T) -> libc::timespec {
    match t {
        T::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        T::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        T::At(s, n) => libc::timespec {
            tv_sec: s,
            tv_nsec: n as i64,
        },
    }
}

/// open(O_RDONLY|O_NONBLOCK), one of the four flag ioctls with `v`, close.
fn flags_ioctl(path: &CString, cmd: u32, v: u32) -> Outcome {
    // SAFETY: a valid C string, and ioctl arguments that live through the call and have the
    // size the command's number encodes.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK);
        check(fd as i64)?;
        let mut flags = v as libc::c_int;
        let mut x = FsXattr {
            xflags: v,
            ..FsXattr::default()
        };
        let arg: *mut libc::c_void = match cmd {
            FS_IOC_GETFLAGS | FS_IOC_SETFLAGS => (&raw mut flags).cast(),
            _ => (&raw mut x).cast(),
        };
        let r = libc::ioctl(fd, cmd as _, arg);
        let e = errno();
        libc::close(fd);
        if r < 0 {
            return Err(e);
        }
        Ok(match cmd {
            FS_IOC_GETFLAGS => Val::Flags(flags as u32),
            FS_IOC_FSGETXATTR => Val::Flags(x.xflags),
            _ => Val::Unit,
        })
    }
}

/// open(`path`, `flags`), `write` on the descriptor, close: what was written, or the errno
/// of the open or of the write.
///
/// # Safety
/// `write` must be safe to call with an open descriptor.
unsafe fn write_fd(path: &CString, flags: i32, write: impl FnOnce(i32) -> isize) -> Outcome {
    // SAFETY: `path` is a valid C string; `write` is the caller's.
    unsafe {
        let fd = libc::open(path.as_ptr(), flags);
        check(fd as i64)?;
        let n = write(fd);
        let e = errno();
        libc::close(fd);
        if n < 0 { Err(e) } else { Ok(count(n as u64)) }
    }
}

fn kernel_op(base: &Path, op: Op) -> Outcome {
    let p = |r: &str| cstr(&base.join(r));
    // SAFETY: each call gets valid C strings and buffers owned by this frame.
    unsafe {
        match op {
            Op::Mkdir(a, m) => check(libc::mkdir(p(&a).as_ptr(), m) as i64).map(|_| Val::Unit),
            Op::Rmdir(a) => check(libc::rmdir(p(&a).as_ptr()) as i64).map(|_| Val::Unit),
            Op::Create(a, m) => {
                let fd = libc::open(
                    p(&a).as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    m,
                );
                check(fd as i64)?;
                libc::close(fd);
                Ok(Val::Unit)
            }
            Op::Open(a, flags, m) => {
                let fd = libc::open(p(&a).as_ptr(), flags, m);
                check(fd as i64)?;
                libc::close(fd);
                Ok(Val::Unit)
            }
            Op::Unlink(a) => check(libc::unlink(p(&a).as_ptr()) as i64).map(|_| Val::Unit),
            Op::Rename(a, b, flags) => check(libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                p(&a).as_ptr(),
                libc::AT_FDCWD,
                p(&b).as_ptr(),
                flags,
            ))
            .map(|_| Val::Unit),
            Op::Link(a, b) => {
                check(libc::link(p(&a).as_ptr(), p(&b).as_ptr()) as i64).map(|_| Val::Unit)
            }
            Op::Symlink(t, a) => {
                let t = CString::new(t).unwrap();
                check(libc::symlink(t.as_ptr(), p(&a).as_ptr()) as i64).map(|_| Val::Unit)
            }
            Op::Readlink(a) => {
                let mut buf = vec![0u8; 8192];
                let n = libc::readlink(p(&a).as_ptr(), buf.as_mut_ptr().cast(), buf.len());
                check(n as i64)?;
                buf.truncate(n as usize);
                Ok(Val::Bytes(buf))
            }
            Op::Mknod(a, m, rdev) => {
                check(libc::mknod(p(&a).as_ptr(), m, rdev) as i64).map(|_| Val::Unit)
            }
            Op::Stat(a) => kstat(&base.join(a), true).map(|s| Val::Stat(view(&s))),
            Op::Lstat(a) => kstat(&base.join(a), false).map(|s| Val::Stat(view(&s))),
            Op::Chmod(a, m) => check(libc::chmod(p(&a).as_ptr(), m) as i64).map(|_| Val::Unit),
            Op::Chown(a, u, g) => check(libc::chown(
                p(&a).as_ptr(),
                u.unwrap_or(u32::MAX),
                g.unwrap_or(u32::MAX),
            ) as i64)
            .map(|_| Val::Unit),
            Op::Truncate(a, n) => {
                check(libc::truncate(p(&a).as_ptr(), n as i64) as i64).map(|_| Val::Unit)
            }
            Op::Write(a, off, data) => write_fd(&p(&a), libc::O_WRONLY, |fd| {
                libc::pwrite(fd, data.as_ptr().cast(), data.len(), off as i64)
            }),
            Op::Append(a, data) => write_fd(&p(&a), libc::O_WRONLY | libc::O_APPEND, |fd| {
                libc::write(fd, data.as_ptr().cast(), data.len())
            }),
            Op::Read(a) => {
                let fd = libc::open(p(&a).as_ptr(), libc::O_RDONLY);
                check(fd as i64)?;
                let mut out = Vec::new();
                let mut buf = vec![0u8; 65536];
                loop {
                    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                    if n < 0 {
                        let e = errno();
                        libc::close(fd);
                        return Err(e);
                    }
                    if n == 0 {
                        break;
                    }
                    out.extend_from_slice(&buf[..n as usize]);
                }
                libc::close(fd);
                Ok(Val::Bytes(out))
            }
            Op::ReadDir(a) => match std::fs::read_dir(base.join(a)) {
                Ok(rd) => {
                    let mut names: Vec<Vec<u8>> = rd
                        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
                        .collect();
                    names.sort();
                    Ok(Val::Names(names))
                }
                Err(e) => Err(e.raw_os_error().unwrap()),
            },
            // AT_EACCESS: check with the filesystem ids, as lanefs's callers present them
            // (plain access() would use this thread's real uid, which stays 0).
            Op::Access(a, mask) => check(libc::faccessat(
                libc::AT_FDCWD,
                p(&a).as_ptr(),
                mask as i32,
                libc::AT_EACCESS,
            ) as i64)
            .map(|_| Val::Unit),
            Op::SetXattr(a, n, v, flags) => {
                let n = CString::new(n).unwrap();
                check(libc::setxattr(
                    p(&a).as_ptr(),
                    n.as_ptr(),
                    v.as_ptr().cast(),
                    v.len(),
                    flags,
                ) as i64)
                .map(|_| Val::Unit)
            }
            Op::GetXattr(a, n) => {
                let n = CString::new(n).unwrap();
                let mut buf = vec![0u8; 70000];
                let r = libc::getxattr(
                    p(&a).as_ptr(),
                    n.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                );
                check(r as i64)?;
                buf.truncate(r as usize);
                Ok(Val::Bytes(buf))
            }
            Op::ListXattr(a) => {
                let mut buf = vec![0u8; 70000];
                let r = libc::listxattr(p(&a).as_ptr(), buf.as_mut_ptr().cast(), buf.len());
                check(r as i64)?;
                buf.truncate(r as usize);
                Ok(xattr_names(&buf))
            }
            Op::RemoveXattr(a, n) => {
                let n = CString::new(n).unwrap();
                check(libc::removexattr(p(&a).as_ptr(), n.as_ptr()) as i64).map(|_| Val::Unit)
            }
            Op::Utimens(a, at, mt) => {
                let t = [ts(at), ts(mt)];
                check(libc::utimensat(libc::AT_FDCWD, p(&a).as_ptr(), t.as_ptr(), 0) as i64)
                    .map(|_| Val::Unit)
            }
            Op::SameIno(a, b) => {
                let x = kstat(&base.join(a), false)?;
                let y = kstat(&base.join(b), false)?;
                Ok(Val::Bool(x.st_ino == y.st_ino))
            }
            Op::SleepMs(ms) => sleep_ms(ms),
            Op::GetFlags(a) => flags_ioctl(&p(&a), FS_IOC_GETFLAGS, 0),
            Op::SetFlags(a, f) => flags_ioctl(&p(&a), FS_IOC_SETFLAGS, f),
            Op::GetXflags(a) => flags_ioctl(&p(&a), FS_IOC_FSGETXATTR, 0),
            Op::SetXflags(a, x) => flags_ioctl(&p(&a), FS_IOC_FSSETXATTR, x),
            Op::Tmpfile {
                dir,
                flags,
                mode,
                data,
                link,
            } => {
                let fd = libc::open(p(&dir).as_ptr(), libc::O_TMPFILE | flags, mode);
                check(fd as i64)?;
                let n = libc::pwrite(fd, data.as_ptr().cast(), data.len(), 0);
                assert_eq!(n, data.len() as isize, "tmpfile write");
                let linked = match link {
                    Some(to) => {
                        let from = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
                        let r = libc::linkat(
                            libc::AT_FDCWD,
                            from.as_ptr(),
                            libc::AT_FDCWD,
                            p(&to).as_ptr(),
                            libc::AT_SYMLINK_FOLLOW,
                        );
                        (r < 0).then(errno)
                    }
                    None => None,
                };
                let mut st: libc::stat = std::mem::zeroed();
                let r = libc::fstat(fd, &mut st);
                libc::close(fd);
                check(r as i64)?;
                Ok(Val::Tmpfile(view(&st), linked))
            }
            Op::Stamp(..) | Op::Changed(..) => unreachable!("handled by the executor"),
        }
    }
}

impl Executor for Kernel {
    fn run(&mut self, who: &Who, op: &Op) -> Outcome {
        match op {
            Op::Stamp(label, a) => {
                let t = self.times(who, self.p(a))?;
                self.stamps.insert(label, t);
                Ok(Val::Unit)
            }
            Op::Changed(label, a) => {
                let t = self.times(who, self.p(a))?;
                let s = self.stamps[label];
                Ok(Val::Times(t.0 != s.0, t.1 != s.1, t.2 != s.2))
            }
            op => {
                let base = self.base.clone();
                let op = op.clone();
                self.on_thread(who, Box::new(move || kernel_op(&base, op)))
            }
        }
    }
}

// ----- lanefs ---------------------------------------------------------------------------------

/// Runs operations on a lanefs filesystem through the path API, under `/t`.
pub struct Lanes {
    pub fs: Arc<Filesystem>,
    umask: u32,
    stamps: HashMap<&'static str, (Timespec, Timespec, Timespec)>,
}

/// `SleepMs`, for either executor.
fn sleep_ms(ms: u64) -> Outcome {
    std::thread::sleep(std::time::Duration::from_millis(ms));
    Ok(Val::Unit)
}

/// What `Write` and `Append` answer: how many bytes were written.
fn count(n: u64) -> Val {
    Val::Bytes(n.to_le_bytes().to_vec())
}

/// A `ListXattr` answer from the NUL-separated names in `buf`: sorted, without the
/// `security.*` ones.
fn xattr_names(buf: &[u8]) -> Val {
    let mut names: Vec<Vec<u8>> = buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    names.retain(|n| !n.starts_with(b"security."));
    names.sort();
    Val::Names(names)
}

/// `f` of the inode at path `a` (found as `c`), both failures as errnos.
fn by_ino<T>(
    c: &Client,
    a: &str,
    f: impl FnOnce(lanefs::Ino) -> lanefs::Result<T>,
) -> Result<T, i32> {
    c.metadata(p(a))
        .map_err(io_errno)
        .and_then(|m| f(m.ino()).map_err(|e| e.0))
}

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().expect("lanefs errors carry an errno")
}

impl Lanes {
    pub fn new(fs: Arc<Filesystem>, umask: u32) -> Lanes {
        let root = Client::root(fs.clone());
        root.create_dir("/t").unwrap();
        root.set_permissions("/t", 0o777).unwrap();
        Lanes {
            fs,
            umask,
            stamps: HashMap::new(),
        }
    }

    fn client(&self, who: &Who) -> Client {
        Client::new(self.fs.clone(), who.ctx().with_umask(self.umask))
    }
}

fn p(rel: &str) -> String {
    format!("/t/{rel}")
}

fn lstat_view(m: lanefs::Metadata) -> StatView {
    let a = m.attr;
    let fmt = a.mode & libc::S_IFMT;
    StatView {
        fmt,
        perm: a.mode & 0o7777,
        nlink: a.nlink as u64,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        blocks: if fmt == libc::S_IFREG { a.blocks } else { 0 },
        rdev: a.rdev,
    }
}

fn tset(t: T) -> Option<TimeSet> {
    match t {
        T::Omit => None,
        T::Now => Some(TimeSet::Now),
        T::At(s, n) => Some(TimeSet::At(Timespec::new(s, n))),
    }
}

impl Executor for Lanes {
    fn run(&mut self, who: &Who, op: &Op) -> Outcome {
        use std::io::{Read, Write};
        let c = self.client(who);
        let unit = |r: std::io::Result<()>| r.map(|_| Val::Unit).map_err(io_errno);
        match op.clone() {
            Op::Mkdir(a, m) => unit(c.create_dir_mode(p(&a), m)),
            Op::Rmdir(a) => unit(c.remove_dir(p(&a))),
            Op::Create(a, m) => unit(
                c.open(
                    p(&a),
                    OpenOptions::new().write(true).create_new(true).mode(m),
                )
                .map(drop),
            ),
            Op::Open(a, flags, m) => {
                let acc = flags & libc::O_ACCMODE;
                let mut o = OpenOptions::new();
                o.read(acc != libc::O_WRONLY)
                    .write(acc != libc::O_RDONLY)
                    .append(flags & libc::O_APPEND != 0)
                    .truncate(flags & libc::O_TRUNC != 0)
                    .create(flags & libc::O_CREAT != 0)
                    .create_new(flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0)
                    .nofollow(flags & libc::O_NOFOLLOW != 0)
                    .custom_flags(flags & libc::O_DIRECTORY)
                    .mode(m);
                unit(c.open(p(&a), &o).map(drop))
            }
            Op::Unlink(a) => unit(c.remove_file(p(&a))),
            Op::Rename(a, b, flags) => unit(c.rename_with_flags(p(&a), p(&b), flags)),
            Op::Link(a, b) => unit(c.hard_link(p(&a), p(&b))),
            Op::Symlink(t, a) => unit(c.symlink(t, p(&a))),
            Op::Readlink(a) => c.read_link(p(&a)).map(Val::Bytes).map_err(io_errno),
            Op::Mknod(a, m, rdev) => unit(c.mknod(p(&a), m, rdev)),
            Op::Stat(a) => c
                .metadata(p(&a))
                .map(|m| Val::Stat(lstat_view(m)))
                .map_err(io_errno),
            Op::Lstat(a) => c
                .symlink_metadata(p(&a))
                .map(|m| Val::Stat(lstat_view(m)))
                .map_err(io_errno),
            Op::Chmod(a, m) => unit(c.set_permissions(p(&a), m)),
            Op::Chown(a, u, g) => unit(c.chown(p(&a), u, g)),
            Op::Truncate(a, n) => unit(c.truncate(p(&a), n)),
            Op::Write(a, off, data) => c
                .open(p(&a), OpenOptions::new().write(true))
                .and_then(|f| f.write_at(&data, off))
                .map(|n| count(n as u64))
                .map_err(io_errno),
            Op::Append(a, data) => c
                .open(p(&a), OpenOptions::new().append(true))
                .and_then(|mut f| f.write(&data))
                .map(|n| count(n as u64))
                .map_err(io_errno),
            Op::Read(a) => c
                .open(p(&a), OpenOptions::new().read(true))
                .and_then(|mut f| {
                    let mut v = Vec::new();
                    f.read_to_end(&mut v).map(|_| v)
                })
                .map(Val::Bytes)
                .map_err(io_errno),
            Op::ReadDir(a) => c
                .read_dir(p(&a))
                .map(|v| {
                    let mut names: Vec<Vec<u8>> = v.into_iter().map(|e| e.name).collect();
                    names.sort();
                    Val::Names(names)
                })
                .map_err(io_errno),
            Op::Access(a, mask) => unit(c.access(p(&a), mask)),
            Op::SetXattr(a, n, v, flags) => by_ino(&c, &a, |ino| {
                self.fs.setxattr(c.ctx(), ino, n.as_bytes(), &v, flags)
            })
            .map(|_| Val::Unit),
            Op::GetXattr(a, n) => {
                by_ino(&c, &a, |ino| self.fs.getxattr(c.ctx(), ino, n.as_bytes())).map(Val::Bytes)
            }
            Op::ListXattr(a) => {
                by_ino(&c, &a, |ino| self.fs.listxattr(c.ctx(), ino)).map(|buf| xattr_names(&buf))
            }
            Op::RemoveXattr(a, n) => by_ino(&c, &a, |ino| {
                self.fs.removexattr(c.ctx(), ino, n.as_bytes())
            })
            .map(|_| Val::Unit),
            Op::Utimens(a, at, mt) => unit(c.set_times(p(&a), tset(at), tset(mt))),
            Op::Stamp(label, a) => {
                let m = c.metadata(p(&a)).map_err(io_errno)?;
                self.stamps
                    .insert(label, (m.attr.atime, m.attr.mtime, m.attr.ctime));
                Ok(Val::Unit)
            }
            Op::Changed(label, a) => {
                let m = c.metadata(p(&a)).map_err(io_errno)?;
                let s = self.stamps[label];
                Ok(Val::Times(
                    m.attr.atime != s.0,
                    m.attr.mtime != s.1,
                    m.attr.ctime != s.2,
                ))
            }
            Op::SameIno(a, b) => {
                let x = c.symlink_metadata(p(&a)).map_err(io_errno)?;
                let y = c.symlink_metadata(p(&b)).map_err(io_errno)?;
                Ok(Val::Bool(x.ino() == y.ino()))
            }
            Op::SleepMs(ms) => sleep_ms(ms),
            Op::Tmpfile {
                dir,
                flags,
                mode,
                data,
                link,
            } => {
                let acc = flags & libc::O_ACCMODE;
                let mut o = OpenOptions::new();
                o.read(acc != libc::O_WRONLY)
                    .write(acc != libc::O_RDONLY)
                    .create_new(flags & libc::O_EXCL != 0)
                    .mode(mode);
                let f = c.open_tmpfile(p(&dir), &o).map_err(io_errno)?;
                assert_eq!(f.write_at(&data, 0).unwrap(), data.len(), "tmpfile write");
                let linked = link.and_then(|to| c.link_file(&f, p(&to)).err().map(io_errno));
                let m = f.metadata().map_err(io_errno)?;
                Ok(Val::Tmpfile(lstat_view(m), linked))
            }
            // As the kernel's side: the open(O_RDONLY) needs read permission, then the
            // ioctl is the inode API's flags call (the FS_IOC_FS*XATTR forms translate the
            // four flags, and refuse the rest, as the FUSE server does).
            Op::GetFlags(a) | Op::SetFlags(a, _) | Op::GetXflags(a) | Op::SetXflags(a, _) => {
                let m = c.metadata(p(&a)).map_err(io_errno)?;
                c.access(p(&a), libc::R_OK as u32).map_err(io_errno)?;
                let fs = &self.fs;
                let r = match op {
                    Op::GetFlags(_) => fs.get_flags(m.ino()).map(Val::Flags),
                    Op::SetFlags(_, f) => fs.set_flags(c.ctx(), m.ino(), *f).map(|_| Val::Unit),
                    Op::GetXflags(_) => fs.get_flags(m.ino()).map(|f| {
                        let x = XFLAGS.iter().filter(|(fl, _)| f & fl != 0);
                        Val::Flags(x.map(|(_, x)| x).sum())
                    }),
                    Op::SetXflags(_, x) => {
                        let f: u32 = XFLAGS
                            .iter()
                            .filter(|(_, xf)| x & xf != 0)
                            .map(|(f, _)| f)
                            .sum();
                        let known: u32 = XFLAGS.iter().map(|(_, xf)| xf).sum();
                        // Other common xflags (sync 0x20, dax 0x8000, projinherit 0x200)
                        // become flags tmpfs refuses.
                        let other = if x & !known != 0 { 0x8 } else { 0 };
                        fs.set_flags(c.ctx(), m.ino(), f | other).map(|_| Val::Unit)
                    }
                    _ => unreachable!(),
                };
                r.map_err(|e| e.0)
            }
        }
    }
}

/// Runs `steps` on both executors and panics at the first difference, naming the step.
/// Returns how many steps succeeded (so callers can tell a test that only met errors).
pub fn compare(
    case: &str,
    k: &mut dyn Executor,
    l: &mut dyn Executor,
    steps: &[(Who, Op)],
) -> usize {
    let mut ok = 0;
    let show = std::env::var_os("LANEFS_SHOW_STEPS").is_some();
    for (i, (who, op)) in steps.iter().enumerate() {
        let a = k.run(who, op);
        let b = l.run(who, op);
        if show {
            eprintln!("{case} {i}: {op:?} as {who:?} -> {}", fmt_outcome(&a));
        }
        ok += a.is_ok() as usize;
        assert_eq!(
            fmt_outcome(&a),
            fmt_outcome(&b),
            "case '{case}', step {i}: {op:?} as {who:?}\n  kernel: {}\n  lanefs: {}",
            fmt_outcome(&a),
            fmt_outcome(&b)
        );
    }
    ok
}

pub fn fmt_outcome(o: &Outcome) -> String {
    match o {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => format!("Err({})", lanefs::Errno(*e).name().unwrap_or("?")),
    }
}
