//! `-o uring=on|auto|off` where io_uring cannot be had: with `fuse.enable_uring` off (the
//! kernel offers no FUSE over io_uring in INIT), and with the server's rings refused (the
//! kernel offers it, but `io_uring_setup(2)` fails in the server, as under a container's
//! seccomp profile or `kernel.io_uring_disabled`; here a seccomp filter on the server alone).
//! - `uring=on` fails clearly: a non-zero exit, one error line naming io_uring and why, no
//!   mount left in the mount table, no server process (or serving thread) left, nothing
//!   hanging; in the foreground and with `--background`, and through the library
//!   ([`lanefs_fuse::mount`], [`lanefs_fuse::mount_background`]);
//! - `uring=auto` (and no `uring=`) mounts on `/dev/fuse`, works, and says so in its one line
//!   and in `lanefs stats`;
//! - a `uring=off` mount does not notice `fuse.enable_uring` changing under it.
//!
//! `fuse.enable_uring` is the whole machine's: a FUSE mount made anywhere while it is off
//! gets no io_uring (mounts already made keep theirs). So the tests that turn it off do so
//! only where nothing else can be mounting through io_uring meanwhile ([`Settings::take`]):
//! as root, with `LANEFS_URING` unset or `off` (scripts/test.sh runs this binary in its first
//! pass, where every mount is on `/dev/fuse`, and not in its io_uring pass), one test at a
//! time (a lock in this binary), holding `/run/lanefs-enable_uring.lock` exclusively
//! (scripts/test.sh holds it shared through its io_uring pass), and only when no other lanefs
//! mount is in the mount table and no other process runs with `LANEFS_URING` set to something
//! else than `off`; otherwise they skip with a message. The setting is put back as soon as
//! the mounts under test are made, and in any case when the test ends or fails; a watchdog
//! process puts it back should the test process die first (killed by a timeout, say).
//! With `LANEFS_KEEP_ENABLE_URING` set (not empty, not `0`; a machine shared with others,
//! whose setting is not this run's to change) nothing is written to it: a test that would
//! have to change it skips with a message, and one that needs the value it already has runs.

mod common;

use common::{BIN, is_root, mountinfo_line_at};

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lanefs_fuse::{MountConfig, Uring};

/// The kernel's switch for FUSE over io_uring (Linux 6.14 on, `CONFIG_FUSE_IO_URING`).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
/// Taken exclusively while the setting is changed; scripts/test.sh takes it shared for its
/// io_uring pass.
const LOCK: &str = "/run/lanefs-enable_uring.lock";
/// How long a command or a file system call may take before it counts as hanging.
const LIMIT: Duration = Duration::from_secs(30);

/// One test of this binary at a time: some change a machine-wide setting, and the thread
/// checks count this process's threads.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `LANEFS_KEEP_ENABLE_URING` says to leave `fuse.enable_uring` as it is (module doc).
fn keep_enable_uring() -> bool {
    std::env::var("LANEFS_KEEP_ENABLE_URING").is_ok_and(|v| !v.is_empty() && v != "0")
}

fn enable_uring() -> String {
    std::fs::read_to_string(ENABLE_URING)
        .unwrap_or_else(|e| panic!("{ENABLE_URING}: {e}"))
        .trim()
        .to_string()
}

/// Whether the test can run at all (root, and a kernel with FUSE over io_uring); otherwise it
/// says why it skips.
fn runnable(test: &str) -> bool {
    if !is_root() {
        eprintln!("{test}: SKIPPED: needs root (run the tests as root: scripts/test.sh)");
        return false;
    }
    if !Path::new(ENABLE_URING).exists() {
        eprintln!("{test}: SKIPPED: no {ENABLE_URING}: this kernel has no FUSE over io_uring");
        return false;
    }
    true
}

/// Other processes on this machine that may be mounting through io_uring: those whose
/// environment sets `LANEFS_URING` to something else than `off` (an io_uring pass of
/// scripts/test.sh, from this checkout or another, sets it to `on` in every process it runs).
fn other_io_uring_users() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        for var in env.split(|&b| b == 0) {
            if let Some(v) = var.strip_prefix(b"LANEFS_URING=")
                && v != b"off"
            {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                found.push(format!(
                    "pid {pid} ({}) LANEFS_URING={}",
                    comm.trim(),
                    String::from_utf8_lossy(v)
                ));
            }
        }
    }
    found
}

/// The lanefs mounts in the mount table (their mountpoints).
fn lanefs_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(" - fuse.lanefs "))
        .filter_map(|l| l.split(' ').nth(4).map(String::from))
        .collect()
}

/// `fuse.enable_uring` changed by one test, put back to the value it had when this is dropped
/// (at the end of the test, or as it unwinds from a failure), or by a watchdog process
/// should the test process die first.
struct Settings {
    /// The value before, and the watchdog, once changed.
    saved: Option<(String, Child)>,
    /// `LOCK`, held exclusively (released when the file closes, after the setting is back).
    _lock: File,
}

impl Settings {
    /// The right to change `fuse.enable_uring`, or `None` (with a message saying why the
    /// test skips) where doing so could disturb something else.
    fn take(test: &str) -> Option<Settings> {
        let skip = |why: String| {
            eprintln!("{test}: SKIPPED: {why}");
            None
        };
        if !runnable(test) {
            return None;
        }
        // The tests that take this turn it off (or on, through `uring_offered`, which skips
        // first under this variable).
        if keep_enable_uring() && enable_uring() != "N" {
            return skip(format!(
                "LANEFS_KEEP_ENABLE_URING is set, and {ENABLE_URING} is {}: the test would \
                 have to change it",
                enable_uring()
            ));
        }
        match std::env::var("LANEFS_URING") {
            Err(_) => {}
            Ok(v) if v == "off" => {}
            Ok(v) => {
                return skip(format!(
                    "LANEFS_URING={v}: other tests of this run may be mounting through \
                     io_uring, and fuse.enable_uring is the whole machine's (scripts/test.sh \
                     runs this with LANEFS_URING=off)"
                ));
            }
        }
        let lock = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(LOCK)
            .unwrap_or_else(|e| panic!("{LOCK}: {e}"));
        let start = Instant::now();
        // SAFETY: flock on a descriptor this function owns.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if start.elapsed() > Duration::from_secs(20) {
                return skip(format!(
                    "{LOCK} is held (an io_uring pass of scripts/test.sh is running)"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let others = other_io_uring_users();
        if !others.is_empty() {
            return skip(format!(
                "other processes may be mounting through io_uring, and fuse.enable_uring is \
                 the whole machine's: {}",
                others.join(", ")
            ));
        }
        let mounts = lanefs_mounts();
        if !mounts.is_empty() {
            return skip(format!(
                "other lanefs mounts are in use, and fuse.enable_uring is the whole \
                 machine's: {}",
                mounts.join(", ")
            ));
        }
        Some(Settings {
            saved: None,
            _lock: lock,
        })
    }

    /// Sets `fuse.enable_uring` to `value` (`Y` or `N`); writes nothing if it is so already.
    fn set(&mut self, value: &str) {
        if enable_uring() == value {
            return;
        }
        assert!(
            !keep_enable_uring(),
            "LANEFS_KEEP_ENABLE_URING is set, but {ENABLE_URING} is no longer {value} as it was"
        );
        if self.saved.is_none() {
            let before = enable_uring();
            // Puts the value back unless told `done` first: at end of file, when this
            // process is gone without saying it.
            let watchdog = Command::new("sh")
                .args([
                    "-c",
                    "read -r x; [ \"$x\" = done ] || printf '%s\\n' \"$1\" > \"$2\"",
                    "sh",
                    &before,
                    ENABLE_URING,
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the watchdog (sh)");
            self.saved = Some((before, watchdog));
        }
        std::fs::write(ENABLE_URING, value)
            .unwrap_or_else(|e| panic!("{ENABLE_URING} = {value}: {e}"));
        assert_eq!(enable_uring(), value, "{ENABLE_URING}");
    }
}

impl Drop for Settings {
    fn drop(&mut self) {
        let Some((before, mut watchdog)) = self.saved.take() else {
            return;
        };
        let r = std::fs::write(ENABLE_URING, &before);
        let now = std::fs::read_to_string(ENABLE_URING).unwrap_or_default();
        if r.is_err() || now.trim() != before {
            // Not a panic: this may run while a failed test unwinds. The watchdog tries again.
            eprintln!(
                "uring_unavailable: could not put {ENABLE_URING} back to {before} ({r:?}, it \
                 reads {})",
                now.trim()
            );
            drop(watchdog.stdin.take());
        } else if let Some(mut w) = watchdog.stdin.take() {
            let _ = w.write_all(b"done\n");
        }
        let _ = watchdog.wait();
    }
}

/// The seccomp filter that makes `io_uring_setup(2)` fail with EPERM, as
/// `kernel.io_uring_disabled=2` does for the whole machine and container runtimes' default
/// seccomp profiles do for a container.
fn no_io_uring_filter() -> [libc::sock_filter; 6] {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    // struct seccomp_data: int nr at 0, u32 arch at 4.
    [
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        jeq(AUDIT_ARCH, 0, 3),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jeq(libc::SYS_io_uring_setup as u32, 0, 1),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Installs `filter` on the calling thread (inherited by the threads and processes it starts
/// from then on). Async-signal-safe: no allocation.
fn install(filter: &[libc::sock_filter; 6]) -> std::io::Result<()> {
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments; PR_SET_SECCOMP reads
    // the program, which outlives the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &raw const prog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What a finished `lanefs` command printed.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `lanefs args` and waits for it, at most [`LIMIT`] (then kills it and fails: a hang).
/// Its output goes to files, not pipes, so that a background server that keeps them open
/// cannot hold the test up. `LANEFS_URING` is not passed on: a mount without `uring=` gets
/// the documented default, `auto`. `no_io_uring`: `io_uring_setup(2)` fails in it.
fn lanefs_with(args: &[&str], no_io_uring: bool) -> Ran {
    let mut out = tempfile::tempfile().unwrap();
    let mut err = tempfile::tempfile().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("LANEFS_URING")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    if no_io_uring {
        let filter = no_io_uring_filter();
        // SAFETY: the hook only makes system calls (prctl), no allocation or lock.
        unsafe { cmd.pre_exec(move || install(&filter)) };
    }
    let mut child = cmd.spawn().expect("run lanefs");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lanefs {args:?} still running after {LIMIT:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let read = |f: &mut File| {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    Ran {
        status,
        stdout: read(&mut out),
        stderr: read(&mut err),
    }
}

fn lanefs(args: &[&str]) -> Ran {
    lanefs_with(args, false)
}

/// Runs `f` on a thread and fails if it has not returned within [`LIMIT`] (a call into a
/// mount that hangs fails the test instead of holding it, and the setting, forever).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(LIMIT)
        .unwrap_or_else(|_| panic!("{what}: still running after {LIMIT:?}: it hangs"))
}

/// `/proc/self/mountinfo`'s line for the topmost mount at `p` (canonical; not looked up on
/// the filesystem, which would wait for a server that does not answer).
fn mountinfo_line(p: &Path) -> Option<String> {
    mountinfo_line_at("self", p)
}

fn mounted(p: &Path) -> bool {
    mountinfo_line(p).is_some()
}

/// A mountpoint of a test, detached (lazily) if the test fails with something mounted there.
struct Mountpoint {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mountpoint {
    fn new() -> Mountpoint {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        Mountpoint { path, _dir: dir }
    }

    fn s(&self) -> &str {
        self.path.to_str().unwrap()
    }

    /// Unmounts, as `umount` does, and waits for the server to be gone.
    fn unmount(&self) {
        let c = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; umount2 has no other preconditions.
        let r = unsafe { libc::umount2(c.as_ptr(), 0) };
        assert_eq!(
            r,
            0,
            "umount {}: {}",
            self.s(),
            std::io::Error::last_os_error()
        );
        assert!(!mounted(&self.path));
        servers_gone(&self.path);
    }
}

impl Drop for Mountpoint {
    fn drop(&mut self) {
        let c = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; umount2 has no other preconditions.
        while mounted(&self.path) && unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {}
    }
}

/// The live processes (not zombies) with `mp` among their arguments: the servers of `mp`.
fn servers_of(mp: &Path) -> Vec<(i32, String)> {
    let mp = mp.as_os_str().as_bytes();
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if pid == me || !cmdline.split(|&b| b == 0).any(|a| a == mp) {
            continue;
        }
        // The state follows the command name in parentheses: "PID (COMM) S ...".
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
        {
            continue;
        }
        found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
    }
    found
}

/// Waits (at most a few seconds) until no server of `mp` is left; kills what is left, and
/// fails, after that.
fn servers_gone(mp: &Path) {
    let start = Instant::now();
    loop {
        let left = servers_of(mp);
        if left.is_empty() {
            return;
        }
        if start.elapsed() > Duration::from_secs(10) {
            for (pid, _) in &left {
                // SAFETY: kill(2) of a process this test started (its command line names
                // this test's own temporary mountpoint).
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            panic!("server processes left for {}: {left:?}", mp.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The mountpoint is a plain empty directory again, answered at once (the mount table was
/// checked first; a dead or hanging mount left there would fail or block).
fn plain_empty_dir(mp: &Path) {
    let p = mp.to_path_buf();
    let n = within("listing the mountpoint", move || {
        std::fs::read_dir(&p).map(|d| d.count())
    });
    assert_eq!(n.unwrap(), 0, "{}", mp.display());
}

/// `lanefs mount -o uring=on` (in the foreground, and with `--background`) at `mp` failed
/// as it should: status 1, one line on stderr naming io_uring and saying `why`, nothing
/// mounted, no server left.
fn refused(mp: &Mountpoint, why: &str, no_io_uring: bool) {
    for background in [false, true] {
        let mut args = vec!["mount", "-o", "uring=on", mp.s()];
        if background {
            args.insert(1, "--background");
        }
        let r = lanefs_with(&args, no_io_uring);
        let err = r.stderr.trim_end();
        assert_eq!(r.status.code(), Some(1), "lanefs {args:?}: {}", r.stderr);
        assert_eq!(err.lines().count(), 1, "lanefs {args:?}: one line: {err}");
        assert!(
            err.starts_with(&format!("lanefs: {}: mount failed: uring=on: ", mp.s()))
                && err.contains("io_uring")
                && err.contains(why),
            "lanefs {args:?}: {err}"
        );
        assert!(r.stdout.is_empty(), "lanefs {args:?}: {}", r.stdout);
        assert!(!mounted(&mp.path), "lanefs {args:?} left a mount behind");
        servers_gone(&mp.path);
        plain_empty_dir(&mp.path);
    }
}

/// `lanefs mount --background -v -o OPTIONS` at `mp`: mounted; what it printed on stderr
/// (`-v`: the line saying how requests are served).
fn mount_background(mp: &Mountpoint, options: &str, no_io_uring: bool) -> Vec<String> {
    let r = lanefs_with(
        &["mount", "--background", "-v", "-o", options, mp.s()],
        no_io_uring,
    );
    assert!(r.status.success(), "-o {options}: {}", r.stderr);
    assert!(mounted(&mp.path));
    r.stderr.lines().map(String::from).collect()
}

/// `lines` has the one line saying that `mp` is served through `/dev/fuse`, and only that
/// besides `others`.
fn says_dev_fuse(mp: &Mountpoint, lines: &[String], others: usize) {
    let served: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("served through"))
        .collect();
    assert_eq!(
        served,
        [&format!(
            "lanefs: {} mounted; requests served through /dev/fuse",
            mp.s()
        )],
        "{lines:?}"
    );
    assert_eq!(lines.len(), 1 + others, "{lines:?}");
}

/// A file written through the mount reads back, and `lanefs stats` (JSON and text) says
/// the mount is served through `/dev/fuse`.
fn works_on_dev_fuse(mp: &Mountpoint, name: &str) {
    let (f, body) = (mp.path.join(name), name.as_bytes().to_vec());
    within("writing and reading a file", move || {
        std::fs::write(&f, &body).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), body);
    });
    let st = lanefs(&["stats", "--json", mp.s()]);
    assert!(st.status.success(), "{}", st.stderr);
    let v: serde_json::Value = serde_json::from_str(&st.stdout).unwrap();
    assert_eq!(v["transport"], "/dev/fuse", "{v}");
    assert_eq!(v["uring_queues"], 0, "{v}");
    assert!(v["requests"].as_u64().unwrap() > 0, "{v}");
    let st = lanefs(&["stats", mp.s()]);
    assert!(st.status.success(), "{}", st.stderr);
    let line = st
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("transport "))
        .unwrap_or_else(|| panic!("no transport line: {}", st.stdout));
    assert!(
        line.trim_start()
            .starts_with("transport /dev/fuse, requests "),
        "{line}"
    );
    assert!(
        !st.stdout.contains("io_uring") && !st.stdout.contains("queues"),
        "{}",
        st.stdout
    );
}

/// With `fuse.enable_uring` off the kernel offers no io_uring in INIT: `uring=on` is refused
/// in one line that names io_uring and the setting, leaves no mount and no server, and the
/// directory can be mounted again at once.
#[test]
fn uring_on_fails_clearly_when_enable_uring_is_off() {
    let _one = serial();
    let Some(mut settings) = Settings::take("uring_on_fails_clearly_when_enable_uring_is_off")
    else {
        return;
    };
    let mp = Mountpoint::new();
    settings.set("N");
    refused(&mp, "fuse.enable_uring is N", false);
    // Nothing was left that would stop the next mount.
    let lines = mount_background(&mp, "uring=auto", false);
    drop(settings);
    says_dev_fuse(&mp, &lines, 0);
    works_on_dev_fuse(&mp, "after");
    mp.unmount();
}

/// With `fuse.enable_uring` off, `uring=auto` and no `uring=` (auto, the default) mount on
/// `/dev/fuse`, say so in their one line and in `lanefs stats`, and work; they stay there
/// after the setting is back.
#[test]
fn uring_auto_serves_through_dev_fuse_when_enable_uring_is_off() {
    let _one = serial();
    let Some(mut settings) =
        Settings::take("uring_auto_serves_through_dev_fuse_when_enable_uring_is_off")
    else {
        return;
    };
    let (auto, default) = (Mountpoint::new(), Mountpoint::new());
    settings.set("N");
    let auto_lines = mount_background(&auto, "uring=auto", false);
    // `lanefs` runs without LANEFS_URING here: no uring= is auto.
    let default_lines = mount_background(&default, "size=1m", false);
    drop(settings);
    says_dev_fuse(&auto, &auto_lines, 0);
    says_dev_fuse(&default, &default_lines, 0);
    works_on_dev_fuse(&auto, "auto");
    works_on_dev_fuse(&default, "default");
    auto.unmount();
    default.unmount();
}

/// A `uring=off` mount never asks for io_uring: made before `fuse.enable_uring` is turned
/// off, it keeps working while it is off and after it is back, as does one made while it is
/// off.
#[test]
fn uring_off_mounts_do_not_notice_enable_uring_changing() {
    let _one = serial();
    let Some(mut settings) = Settings::take("uring_off_mounts_do_not_notice_enable_uring_changing")
    else {
        return;
    };
    let (before, during) = (Mountpoint::new(), Mountpoint::new());
    let lines = mount_background(&before, "uring=off", false);
    says_dev_fuse(&before, &lines, 0);
    works_on_dev_fuse(&before, "one");
    settings.set("N");
    works_on_dev_fuse(&before, "two");
    let lines = mount_background(&during, "uring=off", false);
    says_dev_fuse(&during, &lines, 0);
    works_on_dev_fuse(&during, "one");
    drop(settings);
    works_on_dev_fuse(&before, "three");
    works_on_dev_fuse(&during, "two");
    before.unmount();
    during.unmount();
}

/// What `uring=on` says when the server's `io_uring_setup(2)` is refused.
const RINGS_REFUSED: &str = "cannot set up an io_uring: Operation not permitted (os error 1): io_uring_setup(2) is refused to this process";

/// Makes the kernel offer FUSE over io_uring for a test of refused rings, where the test can
/// run at all ([`runnable`]): turns `fuse.enable_uring` on, under [`Settings`] (given back
/// when dropped), if it is off. `None`: the test is to skip (said on stderr); `Some(None)`:
/// it was on already.
fn uring_offered(test: &str) -> Option<Option<Settings>> {
    if !runnable(test) {
        return None;
    }
    if enable_uring() == "Y" {
        return Some(None);
    }
    if keep_enable_uring() {
        eprintln!(
            "{test}: SKIPPED: {ENABLE_URING} is N and LANEFS_KEEP_ENABLE_URING says to leave it \
             so (the test needs it Y)"
        );
        return None;
    }
    let mut s = Settings::take(test)?;
    s.set("Y");
    Some(Some(s))
}

/// With the kernel offering FUSE over io_uring but the server's rings refused
/// (`io_uring_setup(2)` fails with EPERM under a seccomp filter on the server alone), INIT
/// settles on io_uring and its registration fails: `uring=on` is refused in one line naming
/// io_uring and why, in the foreground and in the background (which reported a mount made,
/// and exited 0, before), leaving nothing behind; `uring=auto` falls back to `/dev/fuse` and
/// says why. Nothing machine-wide changes unless `fuse.enable_uring` is off (then it is
/// turned on for the test, under [`Settings`]).
#[test]
fn uring_on_fails_clearly_when_the_servers_rings_are_refused() {
    let test = "uring_on_fails_clearly_when_the_servers_rings_are_refused";
    let _one = serial();
    let Some(settings) = uring_offered(test) else {
        return;
    };
    let mp = Mountpoint::new();
    refused(&mp, RINGS_REFUSED, true);
    let lines = mount_background(&mp, "uring=auto", true);
    drop(settings);
    says_dev_fuse(&mp, &lines, 1);
    assert!(
        lines[0].starts_with("lanefs: io_uring cannot be set up (Operation not permitted (os error 1): io_uring_setup(2) is refused")
            && lines[0].ends_with("); serving through /dev/fuse"),
        "{lines:?}"
    );
    works_on_dev_fuse(&mp, "fallback");
    mp.unmount();
}

/// The threads serving FUSE sessions in this process (io_uring queues, `/dev/fuse` readers,
/// session threads).
fn serving_threads() -> HashSet<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let comm = comm.trim();
            ["lanefs-dev", "lanefs-q", "lanefs-session"]
                .iter()
                .any(|p| comm.starts_with(p))
                .then(|| format!("{} {comm}", t.file_name().to_string_lossy()))
        })
        .collect()
}

/// Waits (at most a few seconds) until the serving threads are those of `before` (or fewer).
fn no_new_serving_threads(before: &HashSet<String>) {
    let start = Instant::now();
    loop {
        let new: Vec<String> = serving_threads().difference(before).cloned().collect();
        if new.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "threads left by a failed mount: {new:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn filesystem() -> Arc<lanefs::Filesystem> {
    Arc::new(lanefs::Filesystem::new(lanefs::Config::default()))
}

fn config(uring: Uring) -> MountConfig {
    MountConfig {
        uring,
        allow_other: true,
        ..MountConfig::default()
    }
}

/// Runs `f` on a thread (under the seccomp filter with `no_io_uring`, which the threads it
/// starts inherit), failing if it has not returned within [`LIMIT`].
fn library<T: Send + 'static>(
    what: &str,
    no_io_uring: bool,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    within(what, move || {
        if no_io_uring {
            install(&no_io_uring_filter()).expect("install the seccomp filter");
        }
        f()
    })
}

/// Both library calls with `Uring::On` fail with an error naming io_uring and `why`, leave
/// no mount and no serving thread, and never report a mount ([`lanefs_fuse::mount`]'s
/// `on_mounted` is not called).
fn library_refuses(mp: &Mountpoint, why: &str, no_io_uring: bool) {
    let before = serving_threads();
    let p = mp.path.clone();
    let r = library("mount_background(uring=on)", no_io_uring, move || {
        lanefs_fuse::mount_background(filesystem(), &p, &config(Uring::On)).map(drop)
    });
    let e = r
        .expect_err("mount_background with Uring::On and no io_uring")
        .to_string();
    assert!(e.contains("io_uring") && e.contains(why), "{e}");
    assert!(!e.contains('\n'), "{e}");
    assert!(!mounted(&mp.path));
    no_new_serving_threads(&before);
    plain_empty_dir(&mp.path);

    let p = mp.path.clone();
    let (r, reported) = library("mount(uring=on)", no_io_uring, move || {
        let mut reported = false;
        let r = lanefs_fuse::mount(filesystem(), &p, &config(Uring::On), |_| reported = true);
        (r, reported)
    });
    let e = r
        .expect_err("mount with Uring::On and no io_uring")
        .to_string();
    assert!(e.contains("io_uring") && e.contains(why), "{e}");
    assert!(!reported, "on_mounted called for a mount that failed");
    assert!(!mounted(&mp.path));
    no_new_serving_threads(&before);
    plain_empty_dir(&mp.path);
}

/// A library mount with `Uring::Auto`: on `/dev/fuse`, saying so.
fn library_auto(
    mp: &Mountpoint,
    no_io_uring: bool,
) -> (lanefs_fuse::Mount, Arc<lanefs::Filesystem>) {
    let fs = filesystem();
    let (fs2, p) = (fs.clone(), mp.path.clone());
    let m = library("mount_background(uring=auto)", no_io_uring, move || {
        lanefs_fuse::mount_background(fs2, &p, &config(Uring::Auto))
    })
    .expect("mount_background with Uring::Auto");
    (m, fs)
}

/// `m` is served through `/dev/fuse`, says so, and works.
fn library_works_on_dev_fuse(mp: &Mountpoint, mut m: lanefs_fuse::Mount, fs: &lanefs::Filesystem) {
    let info = m.info().clone();
    assert_eq!(info.transport(), "/dev/fuse");
    assert!(!info.is_uring());
    assert_eq!(info.queues(), 0);
    assert_eq!(info.describe(), "/dev/fuse");
    let f = mp.path.join("f");
    within("writing and reading a file", move || {
        std::fs::write(&f, b"library").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"library");
    });
    let v = lanefs_fuse::stats_json(fs, Some(&info));
    assert_eq!(v["transport"], "/dev/fuse", "{v}");
    assert_eq!(v["uring_queues"], 0, "{v}");
    within("unmount", move || m.unmount()).unwrap();
    assert!(!mounted(&mp.path));
}

/// The same through the library: with `fuse.enable_uring` off, `Uring::On` fails at INIT and
/// `Uring::Auto` serves through `/dev/fuse`.
#[test]
fn library_uring_on_fails_and_auto_falls_back_when_enable_uring_is_off() {
    let _one = serial();
    let Some(mut settings) =
        Settings::take("library_uring_on_fails_and_auto_falls_back_when_enable_uring_is_off")
    else {
        return;
    };
    let mp = Mountpoint::new();
    settings.set("N");
    library_refuses(&mp, "fuse.enable_uring is N", false);
    let (m, fs) = library_auto(&mp, false);
    drop(settings);
    library_works_on_dev_fuse(&mp, m, &fs);
}

/// The same through the library with the server's rings refused: `Uring::On` fails when its
/// rings cannot be registered (after INIT), `Uring::Auto` falls back to `/dev/fuse`.
#[test]
fn library_uring_on_fails_and_auto_falls_back_when_the_rings_are_refused() {
    let test = "library_uring_on_fails_and_auto_falls_back_when_the_rings_are_refused";
    let _one = serial();
    let Some(settings) = uring_offered(test) else {
        return;
    };
    let mp = Mountpoint::new();
    library_refuses(&mp, RINGS_REFUSED, true);
    let (m, fs) = library_auto(&mp, true);
    drop(settings);
    library_works_on_dev_fuse(&mp, m, &fs);
}
