//! The `lanefs` binary as a user runs it: background mounts, the mount-helper form that
//! `mount -t fuse.lanefs` and /etc/fstab use, `lanefs stats`, and the one-line errors.
//! Mounting needs /dev/fuse; as root (the normal case here) the tests mount with `mount(2)`
//! and unmount with `umount2(2)`, so they need nothing else, except the one that goes
//! through `mount(8)` and `mount.fuse3` (`scripts/test.sh` installs fuse3). As another user
//! they mount through `fusermount3`, and the tests that need root say so and skip.

mod common;

use common::{BIN, can_mount, is_root, lanefs, mountinfo_line_at, needs_root, umount2};

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

/// `/proc/PID/mountinfo`'s line for the topmost mount at `p` (PID `self` for this process).
fn mountinfo_line(pid: &str, p: &Path) -> Option<String> {
    mountinfo_line_at(pid, &std::fs::canonicalize(p).unwrap())
}

fn mounted(p: &Path) -> bool {
    mountinfo_line("self", p).is_some()
}

/// The per-mount options (mountinfo field 6) and the per-superblock options (the last
/// field) of the mount at `p`.
fn mount_options(p: &Path) -> (String, String) {
    let line = mountinfo_line("self", p).expect("mounted");
    let per_mount = line.split(' ').nth(5).unwrap().to_string();
    let per_sb = line.rsplit(' ').next().unwrap().to_string();
    (per_mount, per_sb)
}

/// Unmounts as `umount` does: with umount2(2) as root (no fuse3 needed), with
/// `fusermount3 -u` otherwise. Tests run in parallel in one process, and a child another test
/// forks holds copies of this test's descriptors until it execs, so an unmount can meet a
/// brief EBUSY: retried for up to 5 s.
fn unmount(p: &Path) {
    if is_root() {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        let mut tries = 0;
        let r = loop {
            // SAFETY: a valid C string; umount2 has no other preconditions.
            let r = unsafe { libc::umount2(c.as_ptr(), 0) };
            let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY);
            if r == 0 || !busy || tries == 100 {
                break r;
            }
            tries += 1;
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            r,
            0,
            "umount2 {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    } else {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(p)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fusermount3 -u: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for _ in 0..100 {
        if !mounted(p) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} still mounted", p.display());
}

/// A mount made by a test, unmounted (lazily) if the test fails before it does.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        if mounted(&self.0) {
            umount2(&self.0, libc::MNT_DETACH);
        }
    }
}

fn stats_json(p: &Path) -> serde_json::Value {
    let st = lanefs_ok(&["stats", "--json", p.to_str().unwrap()]);
    serde_json::from_slice(&st.stdout).unwrap()
}

/// Where a root server's control socket for the mount at `p` (as process `pid` sees it)
/// is: named after the mount's device number, mountinfo's third field.
fn root_socket(pid: &str, p: &Path) -> PathBuf {
    let line = mountinfo_line(pid, p).expect("mounted");
    let dev = line.split(' ').nth(2).unwrap().replace(':', "-");
    PathBuf::from(format!("/run/lanefs/dev-{dev}.sock"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `lanefs ARGS`, which must succeed (its stderr is the failure's message).
fn lanefs_ok(args: &[&str]) -> Output {
    let out = lanefs(args);
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

/// Mounts with `lanefs ARGS`, which must succeed, at `mp`: detached if the test fails first.
fn mount_at(mp: &Path, args: &[&str]) -> Mounted {
    lanefs_ok(args);
    Mounted(mp.to_path_buf())
}

/// A test's temporary directory, or None where this process cannot mount (`can_mount`; with
/// `root`, `needs_root`), having said why the test skips.
fn mount_dir(test: &str, root: bool) -> Option<tempfile::TempDir> {
    let can = if root {
        needs_root(test)
    } else {
        can_mount(test)
    };
    can.then(|| tempfile::tempdir().unwrap())
}

/// A store's directory (`store`, not made) and a mountpoint (`mnt`, made) in `dir`.
fn store_and_mnt(dir: &Path) -> (PathBuf, PathBuf) {
    let mp = dir.join("mnt");
    std::fs::create_dir(&mp).unwrap();
    (dir.join("store"), mp)
}

/// The directories `names`, made in `dir`.
fn subdirs<const N: usize>(dir: &Path, names: [&str; N]) -> [PathBuf; N] {
    names.map(|n| {
        let p = dir.join(n);
        std::fs::create_dir(&p).unwrap();
        p
    })
}

#[test]
fn background_mount_stats_and_unmount() {
    let Some(dir) = mount_dir("background_mount_stats_and_unmount", false) else {
        return;
    };
    let mp = dir.path();
    lanefs_ok(&[
        "mount",
        "--background",
        "-o",
        "size=8m,nr_inodes=1000",
        mp.to_str().unwrap(),
    ]);
    assert!(mounted(mp));
    // Mounted by root, it serves every user (as tmpfs does): allow_other is on.
    let line = mountinfo_line("self", mp).unwrap();
    assert_eq!(line.contains("allow_other"), is_root(), "{line}");
    let socket = is_root().then(|| root_socket("self", mp));
    std::fs::write(mp.join("hello"), b"world").unwrap();
    assert_eq!(std::fs::read(mp.join("hello")).unwrap(), b"world");
    // statfs reflects the options.
    let df = Command::new("df").arg("-k").arg(mp).output().unwrap();
    assert!(
        String::from_utf8_lossy(&df.stdout).contains("8192"),
        "{}",
        String::from_utf8_lossy(&df.stdout)
    );
    let st = lanefs_ok(&["stats", "--json", mp.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    // Through the mount the kernel creates regular files with MKNOD (no-open mode).
    assert!(v["ops"]["mknod"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["locks"]["stripe"]["acquired"].as_u64().unwrap() >= 1);
    let human = lanefs(&["stats", mp.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("mknod"));
    // Mounting again on the same directory is refused with a clear message.
    let again = lanefs(&["mount", "--background", mp.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already mounted"),
        "{}",
        stderr(&again)
    );
    unmount(mp);
    // The server exits and removes its control socket right after the unmount.
    if let Some(socket) = socket {
        for _ in 0..250 {
            if !socket.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
    let mut gone = lanefs(&["stats", mp.to_str().unwrap()]);
    for _ in 0..100 {
        if !gone.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        gone = lanefs(&["stats", mp.to_str().unwrap()]);
    }
    assert!(!gone.status.success());
    assert!(
        stderr(&gone).contains("no running lanefs mount"),
        "{}",
        stderr(&gone)
    );
}

#[test]
fn clear_errors_for_bad_mountpoints_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let o = lanefs(&["mount", missing.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let o = lanefs(&["mount", file.to_str().unwrap()]);
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    let o = lanefs(&["mount", "-o", "bogus", dir.path().to_str().unwrap()]);
    assert!(
        stderr(&o).contains("unknown mount option 'bogus'"),
        "{}",
        stderr(&o)
    );
    // A store that cannot be one: the error names it, on one line.
    let o = lanefs(&[
        "mount",
        "--store",
        file.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(file.to_str().unwrap()) && stderr(&o).contains("Not a directory"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).lines().count(), 1, "one line: {}", stderr(&o));
}

/// `mount -t fuse.lanefs memory DIR -o ...` makes mount.fuse3 run `lanefs memory DIR -o ...`
/// (with `lanefs` found in the system's PATH). The test uses mount.fuse3's explicit form,
/// `mount -t fuse /path/to/lanefs#memory DIR`, which runs the same command line without
/// installing the binary.
#[test]
fn mount_through_mount_fuse3() {
    let Some(dir) = mount_dir("mount_through_mount_fuse3", true) else {
        return;
    };
    let mp = dir.path();
    let out = Command::new("mount")
        .args(["-t", "fuse", "-o", "size=4m,allow_other,locking=dirlock"])
        .arg(format!("{BIN}#memory"))
        .arg(mp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount -t fuse.lanefs (needs mount.fuse3 from fuse3, which scripts/test.sh installs): {}",
        stderr(&out)
    );
    assert!(mounted(mp));
    let _m = Mounted(mp.to_path_buf());
    // Silent on success, as mount helpers are (xfstests takes output for failure).
    assert_eq!(stderr(&out), "");
    assert!(out.stdout.is_empty());
    std::fs::create_dir(mp.join("d")).unwrap();
    let st = lanefs(&["stats", "--json", mp.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["locking"], "dirlock");
    unmount(mp);
    // The helper form directly, as fstab's mount.fuse3 line runs it.
    lanefs_ok(&["memory", mp.to_str().unwrap(), "-o", "ro"]);
    let e = std::fs::create_dir(mp.join("x")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    unmount(mp);
}

/// The same with a disk store's directory as the source (fstab's
/// `/var/lib/fs /mnt fuse.lanefs ...`): what is written comes back through a second mount of
/// the helper form.
#[test]
fn mount_a_disk_store_through_mount_fuse3() {
    let Some(dir) = mount_dir("mount_a_disk_store_through_mount_fuse3", true) else {
        return;
    };
    let store = tempfile::tempdir().unwrap();
    let mp = dir.path();
    let out = Command::new("mount")
        .args(["-t", "fuse", "-o", "allow_other"])
        .arg(format!("{BIN}#{}", store.path().display()))
        .arg(mp)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount -t fuse: {}", stderr(&out));
    assert!(mounted(mp));
    assert_eq!(stderr(&out), "");
    std::fs::create_dir(mp.join("d")).unwrap();
    std::fs::write(mp.join("d/f"), b"kept").unwrap();
    std::fs::File::open(mp.join("d/f"))
        .unwrap()
        .sync_all()
        .unwrap();
    unmount(mp);
    assert!(store.path().join("lanefs.store").exists());
    lanefs_ok(&[
        store.path().to_str().unwrap(),
        mp.to_str().unwrap(),
        "-o",
        "ro",
    ]);
    assert_eq!(std::fs::read(mp.join("d/f")).unwrap(), b"kept");
    unmount(mp);
}

#[test]
fn foreground_mount_ends_on_sigterm() {
    let Some(dir) = mount_dir("foreground_mount_ends_on_sigterm", false) else {
        return;
    };
    let mp = dir.path().to_path_buf();
    let mut child = Command::new(BIN)
        .args(["mount", mp.to_str().unwrap()])
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if mounted(&mp) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(mounted(&mp));
    std::fs::write(mp.join("f"), b"x").unwrap();
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert!(!mounted(&mp), "unmounted on SIGTERM");
}

#[test]
fn help_names_every_command() {
    let o = lanefs(&["--help"]);
    let s = String::from_utf8_lossy(&o.stdout);
    for c in ["mount", "stats", "bench"] {
        assert!(s.contains(c), "{s}");
    }
    let o = lanefs(&["bench", "nonsense"]);
    assert!(
        stderr(&o).contains("unknown workload 'nonsense'"),
        "{}",
        stderr(&o)
    );
}

/// A mount whose server was killed leaves a dead FUSE mount behind; mounting there again says
/// so and how to detach it, instead of "Transport endpoint is not connected".
#[test]
fn mounting_over_a_dead_server_says_how_to_detach_it() {
    let Some(dir) = mount_dir("mounting_over_a_dead_server_says_how_to_detach_it", false) else {
        return;
    };
    let mp = dir.path();
    let mut server = Command::new(BIN)
        .args(["mount", mp.to_str().unwrap()])
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if mounted(mp) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(mounted(mp));
    let stale = is_root().then(|| root_socket("self", mp));
    server.kill().unwrap();
    server.wait().unwrap();
    let again = lanefs(&["mount", "--background", mp.to_str().unwrap()]);
    assert!(!again.status.success());
    let msg = stderr(&again);
    assert!(
        msg.contains("server has exited") && msg.contains("fusermount3 -u"),
        "{msg}"
    );
    assert_eq!(msg.trim_end().lines().count(), 1, "one line: {msg}");
    // Tidy up the killed server's socket while the dead mount still holds its device
    // number (no other server can have taken the name).
    if let Some(stale) = stale {
        let _ = std::fs::remove_file(stale);
    }
    unmount(mp);
}

/// A mount made by root is suid,dev unless told otherwise, as a kernel tmpfs and
/// `mount -t fuse.lanefs` are: a device node made on it works, here /dev/null's (1, 3).
/// `nosuid` and `nodev` are still honoured.
#[test]
fn root_mount_defaults_to_suid_and_dev_like_tmpfs() {
    let Some(dir) = mount_dir("root_mount_defaults_to_suid_and_dev_like_tmpfs", true) else {
        return;
    };
    let mp = dir.path();
    let _guard = mount_at(mp, &["mount", "--background", mp.to_str().unwrap()]);
    let (per_mount, _) = mount_options(mp);
    let flags: Vec<&str> = per_mount.split(',').collect();
    assert!(
        !flags.contains(&"nosuid") && !flags.contains(&"nodev"),
        "{per_mount}"
    );
    let null = mp.join("null");
    let c = CString::new(null.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; mknod has no other preconditions.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    std::fs::write(&null, b"into the void").expect("write to a device node on a root mount");
    assert_eq!(std::fs::read(&null).unwrap(), b"", "it is /dev/null");
    unmount(mp);

    lanefs_ok(&[
        "mount",
        "--background",
        "-o",
        "nosuid,nodev",
        mp.to_str().unwrap(),
    ]);
    let (per_mount, _) = mount_options(mp);
    let flags: Vec<&str> = per_mount.split(',').collect();
    assert!(
        flags.contains(&"nosuid") && flags.contains(&"nodev"),
        "{per_mount}"
    );
    // SAFETY: as above.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    let e = std::fs::write(&null, b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "nodev: {e}");
    unmount(mp);

    let help = lanefs(&["mount", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("suid,dev unless told nosuid/nodev"), "{help}");
}

/// The options the kernel reports for a lanefs mount (`findmnt -no OPTIONS`, or mountinfo's
/// per-mount and per-superblock fields) mount another one, through the mount-helper form and
/// through `lanefs mount -o`, with the same kernel flags.
#[test]
fn options_the_kernel_reports_mount_again() {
    let Some(dir) = mount_dir("options_the_kernel_reports_mount_again", false) else {
        return;
    };
    let [a, b, c, d] = subdirs(dir.path(), ["a", "b", "c", "d"]);
    let _ga = mount_at(
        &a,
        &[
            "mount",
            "--background",
            "-o",
            "noexec,nodiratime,noatime,sync,size=4m",
            a.to_str().unwrap(),
        ],
    );
    let (per_mount, per_sb) = mount_options(&a);
    assert!(per_sb.contains("user_id="), "{per_sb}");
    let reported = format!("{per_mount},{per_sb}");

    let out = lanefs(&["memory", b.to_str().unwrap(), "-o", &reported]);
    assert!(
        out.status.success(),
        "helper form -o {reported}: {}",
        stderr(&out)
    );
    let _gb = Mounted(b.clone());
    assert_eq!(mount_options(&b).0, per_mount, "-o {reported}");

    let out = lanefs(&[
        "mount",
        "--background",
        "-o",
        &reported,
        c.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "lanefs mount -o {reported}: {}",
        stderr(&out)
    );
    let _gc = Mounted(c.clone());
    assert_eq!(mount_options(&c).0, per_mount, "-o {reported}");

    // findmnt's form of the same, where findmnt is installed.
    if let Ok(f) = Command::new("findmnt")
        .args(["-no", "OPTIONS"])
        .arg(&a)
        .output()
    {
        let opts = String::from_utf8_lossy(&f.stdout).trim().to_string();
        if f.status.success() {
            unmount(&c);
            let out = lanefs(&["mount", "--background", "-o", &opts, c.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "lanefs mount -o {opts}: {}",
                stderr(&out)
            );
            assert_eq!(mount_options(&c).0, per_mount, "-o {opts}");
        }
    }
    // The rest of what the kernel can report for a FUSE mount.
    let _gd = mount_at(
        &d,
        &[
            "mount",
            "--background",
            "-o",
            "max_read=131072,blksize=4096,rootmode=40000,fd=9,strictatime,relatime",
            d.to_str().unwrap(),
        ],
    );
    let o = lanefs(&["mount", "-o", "user_id=me", a.to_str().unwrap()]);
    assert!(
        stderr(&o).contains("bad user_id 'user_id=me'"),
        "{}",
        stderr(&o)
    );
    for p in [&d, &c, &b, &a] {
        unmount(p);
    }
}

/// `mount -o remount` through the helper form changes the kernel flags named and keeps the
/// others.
#[test]
fn remount_changes_the_named_flags_only() {
    let Some(dir) = mount_dir("remount_changes_the_named_flags_only", true) else {
        return;
    };
    let mp = dir.path();
    let _guard = mount_at(mp, &["memory", mp.to_str().unwrap(), "-o", "nodev,noatime"]);
    lanefs_ok(&[
        "memory",
        mp.to_str().unwrap(),
        "-o",
        "remount,ro,noexec,size=1g",
    ]);
    let (per_mount, _) = mount_options(mp);
    let flags: Vec<&str> = per_mount.split(',').collect();
    for f in ["ro", "nodev", "noexec", "noatime"] {
        assert!(flags.contains(&f), "{f} in {per_mount}");
    }
    let e = std::fs::create_dir(mp.join("x")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    lanefs_ok(&[
        "memory",
        mp.to_str().unwrap(),
        "-o",
        "remount,rw,exec,strictatime",
    ]);
    let (per_mount, _) = mount_options(mp);
    let flags: Vec<&str> = per_mount.split(',').collect();
    assert!(
        flags.contains(&"rw") && flags.contains(&"nodev"),
        "{per_mount}"
    );
    assert!(
        !flags.contains(&"noexec") && !flags.contains(&"noatime") && !flags.contains(&"relatime"),
        "{per_mount}"
    );
    std::fs::create_dir(mp.join("x")).unwrap();
    unmount(mp);
}

/// A lanefs server in the foreground, in a mount namespace of its own, stopped (and its
/// namespace with its mount gone) when dropped.
struct NsServer(Child);

impl NsServer {
    fn start(mp: &Path) -> NsServer {
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", BIN, "mount"])
            .arg(mp)
            .spawn()
            .expect("unshare runs");
        let s = NsServer(child);
        for _ in 0..250 {
            if mountinfo_line(&s.pid(), mp).is_some_and(|l| l.contains("fuse.lanefs")) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no lanefs mount in the new namespace");
    }

    fn pid(&self) -> String {
        self.0.id().to_string()
    }

    /// Runs `args` in this server's mount namespace.
    fn run(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.pid(), "-m", "--"])
            .args(args)
            .output()
            .expect("nsenter runs")
    }

    fn stats(&self, mp: &Path) -> serde_json::Value {
        let out = self.run(&[BIN, "stats", "--json", mp.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// SIGTERM, as Ctrl-C: the server unmounts and exits.
    fn stop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let status = self.0.wait().unwrap();
        assert!(status.success(), "{status:?}");
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Two servers mounted on one path in two mount namespaces each answer `lanefs stats` in
/// their own namespace, and stopping one leaves the other's socket: the socket is named
/// after the mount's device number, not its path.
#[test]
fn stats_sockets_are_per_mount_not_per_path() {
    let Some(dir) = mount_dir("stats_sockets_are_per_mount_not_per_path", true) else {
        return;
    };
    let mp = dir.path();
    let mut one = NsServer::start(mp);
    let mut two = NsServer::start(mp);
    assert!(!mounted(mp), "the mounts stay in their namespaces");
    let m = mp.to_str().unwrap();
    assert!(one.run(&["touch", &format!("{m}/1")]).status.success());
    let made = two.run(&[
        "touch",
        &format!("{m}/a"),
        &format!("{m}/b"),
        &format!("{m}/c"),
    ]);
    assert!(made.status.success(), "{}", stderr(&made));
    // The root directory and the files each one made.
    assert_eq!(one.stats(mp)["inodes_used"], 2);
    assert_eq!(two.stats(mp)["inodes_used"], 4);
    let (sock1, sock2) = (root_socket(&one.pid(), mp), root_socket(&two.pid(), mp));
    assert_ne!(sock1, sock2);
    assert!(sock1.exists() && sock2.exists());
    let ino = |p: &Path| std::fs::symlink_metadata(p).ok().map(|m| m.ino());
    let first = ino(&sock1);
    one.stop();
    assert_eq!(two.stats(mp)["inodes_used"], 4);
    // Gone, or another one: a mount made meanwhile by a test beside this one can have been
    // given the device number the stopped one freed, and so its socket's name.
    assert_ne!(ino(&sock1), first, "the stopped server removed its socket");
    assert!(sock2.exists(), "and left the other's");
    two.stop();
    assert!(!sock2.exists());
}

/// `lanefs stats` reports the file data stored and the server's resident memory: writing
/// 8 MiB raises the data figure by 8 MiB.
#[test]
fn stats_report_file_data_and_resident_memory() {
    let Some(dir) = mount_dir("stats_report_file_data_and_resident_memory", false) else {
        return;
    };
    let mp = dir.path();
    let _guard = mount_at(mp, &["mount", "--background", mp.to_str().unwrap()]);
    std::fs::write(mp.join("small"), b"x").unwrap();
    let before = stats_json(mp);
    let data0 = before["data_bytes"].as_u64().expect("data_bytes");
    assert!(before["resident_bytes"].as_u64().expect("resident_bytes") > 0);
    std::fs::write(mp.join("big"), vec![0x5a; 8 << 20]).unwrap();
    let after = stats_json(mp);
    let data1 = after["data_bytes"].as_u64().unwrap();
    let grew = data1 - data0;
    assert!(
        (8 << 20..=(8 << 20) + (64 << 10)).contains(&grew),
        "data grew by {grew} bytes: {after}"
    );
    // The memory store keeps that data in the server's memory.
    let resident = after["resident_bytes"].as_u64().unwrap();
    assert!(resident >= data1, "resident {resident} < data {data1}");
    let human = lanefs(&["stats", mp.to_str().unwrap()]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains(&format!("file data 8.0 MiB ({data1} bytes)"))
            && human.contains("server resident memory"),
        "{human}"
    );
    unmount(mp);
}

/// A server that is killed leaves its control socket behind; the next server to start
/// removes it once nothing has answered on it for a second.
#[test]
fn a_killed_servers_socket_is_removed_by_the_next_server() {
    let Some(dir) = mount_dir(
        "a_killed_servers_socket_is_removed_by_the_next_server",
        true,
    ) else {
        return;
    };
    let [dead, live] = subdirs(dir.path(), ["dead", "live"]);
    let mut server = Command::new(BIN)
        .args(["mount", dead.to_str().unwrap()])
        .spawn()
        .unwrap();
    let _gdead = Mounted(dead.clone());
    for _ in 0..200 {
        if mounted(&dead) && root_socket("self", &dead).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stale = root_socket("self", &dead);
    assert!(stale.exists());
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(stale.exists(), "SIGKILL leaves the socket");
    let st = lanefs(&["stats", dead.to_str().unwrap()]);
    assert!(
        stderr(&st).contains("no running lanefs mount answers there"),
        "{}",
        stderr(&st)
    );
    std::thread::sleep(Duration::from_millis(1100));
    // The dead mount is still attached, so the new mount has another device number.
    let _glive = mount_at(&live, &["mount", "--background", live.to_str().unwrap()]);
    assert_ne!(root_socket("self", &live), stale);
    assert!(!stale.exists(), "{} is still there", stale.display());
    unmount(&live);
    unmount(&dead);
}

/// Takes the lock a store's server holds (`lanefs.lock` in the store's directory), as
/// another process that says nothing in it would; released when the file is dropped.
fn hold_store_lock(store: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(store).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(store.join("lanefs.lock"))
        .unwrap();
    // SAFETY: `f` is an open descriptor for the duration of the call.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
    f
}

/// A store another process holds is refused at once by `mount --store`, `fsck` and
/// `compact`, in one line that names the holder's pid and how to wait for it.
#[test]
fn a_store_in_use_is_refused_at_once_naming_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mp) = store_and_mnt(dir.path());
    // A store (made in-process) that fsck and compact would take.
    let o = lanefs_store::open(
        &store,
        lanefs::Config::default(),
        lanefs_store::Options::default(),
    )
    .unwrap();
    drop(o.fs);
    o.store.close().unwrap();
    let _held = hold_store_lock(&store);
    let s = store.to_str().unwrap();
    for args in [
        &["mount", "--store", s, mp.to_str().unwrap()][..],
        &["fsck", s],
        &["fsck", "--repair", s],
        &["compact", s],
    ] {
        let o = lanefs(args);
        assert!(!o.status.success(), "{args:?}");
        let e = stderr(&o);
        assert!(
            e.contains(&format!(
                "{s}: the store is in use by another process, pid {}",
                std::process::id()
            )) && e.contains("--wait"),
            "{args:?}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{args:?}: one line: {e}");
    }
    assert!(!mounted(&mp));
}

/// A store a server has mounted is refused at once by a second mount, `fsck` and `compact`,
/// naming the server's pid and mountpoint; once the server is stopped, fsck goes ahead.
#[test]
fn a_mounted_store_is_refused_at_once_naming_its_server() {
    use std::io::BufRead;
    let Some(dir) = mount_dir(
        "a_mounted_store_is_refused_at_once_naming_its_server",
        false,
    ) else {
        return;
    };
    let store = dir.path().join("store");
    let [mp, other] = ["mnt", "other"].map(|n| {
        let p = dir.path().join(n);
        std::fs::create_dir(&p).unwrap();
        std::fs::canonicalize(p).unwrap()
    });
    let (s, m) = (store.to_str().unwrap(), mp.to_str().unwrap());
    let mut server = Command::new(BIN)
        .args(["mount", "--store", s, m])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _m = Mounted(mp.clone());
    // In the foreground the server says when it is mounted.
    let mut err = std::io::BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.starts_with(&format!("lanefs: {m} mounted; requests served through")),
        "{line}"
    );
    let holder = format!(
        "{s}: the store is in use by the lanefs server with pid {}, mounted on {m}",
        server.id()
    );
    for args in [
        &[
            "mount",
            "--background",
            "--store",
            s,
            other.to_str().unwrap(),
        ][..],
        &["fsck", s],
        &["compact", s],
    ] {
        let o = lanefs(args);
        assert!(!o.status.success(), "{args:?}");
        let e = stderr(&o);
        assert!(
            e.contains(&holder) && e.contains("unmount it first"),
            "{args:?}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{args:?}: one line: {e}");
    }
    assert!(!mounted(&other));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    assert!(server.wait().unwrap().success());
    lanefs_ok(&["fsck", s]);
}

/// A store is mounted and checked again right after its server is unmounted, without
/// --wait: the server, unmounted, may still be closing the store, and that is waited for.
#[test]
fn a_store_is_mounted_and_checked_again_right_after_an_unmount() {
    let Some(dir) = mount_dir(
        "a_store_is_mounted_and_checked_again_right_after_an_unmount",
        false,
    ) else {
        return;
    };
    let (store, mp) = store_and_mnt(dir.path());
    let (s, m) = (store.to_str().unwrap(), mp.to_str().unwrap());
    for round in 0..4u8 {
        let o = lanefs(&["mount", "--background", "--store", s, m]);
        assert!(o.status.success(), "round {round}: {}", stderr(&o));
        let _m = Mounted(mp.clone());
        for r in 0..round {
            assert_eq!(std::fs::read(mp.join(format!("f{r}"))).unwrap(), [r]);
        }
        std::fs::write(mp.join(format!("f{round}")), [round]).unwrap();
        unmount(&mp);
        if round % 2 == 1 {
            let o = lanefs(&["fsck", s]);
            assert!(o.status.success(), "round {round}: {}", stderr(&o));
        }
    }
}

/// A server unmounted but not yet done closing its store (here stopped with SIGSTOP right
/// after its unmount) is waited for, unasked, by `fsck`, which goes ahead once it lets go.
#[test]
fn fsck_waits_for_an_unmounted_server_still_closing_the_store() {
    let Some(dir) = mount_dir(
        "fsck_waits_for_an_unmounted_server_still_closing_the_store",
        false,
    ) else {
        return;
    };
    let (store, mp) = store_and_mnt(dir.path());
    let (s, m) = (store.to_str().unwrap(), mp.to_str().unwrap());
    let _m = mount_at(&mp, &["mount", "--background", "--store", s, m]);
    std::fs::write(mp.join("f"), b"x").unwrap();
    // The lock file's first line is the server's pid (docs/STORE.md, "The lock file").
    let lock = std::fs::read_to_string(store.join("lanefs.lock")).unwrap();
    let server: i32 = lock.lines().next().unwrap().parse().unwrap();
    // SAFETY: signalling the background server this test started.
    assert_eq!(unsafe { libc::kill(server, libc::SIGSTOP) }, 0);
    unmount(&mp);
    let mut fsck = Command::new(BIN)
        .args(["fsck", s])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // fsck tries the lock, and sleeps between tries: once it has slept 60 times, it has gone
    // on past the store's own retries (20 sleeps a try) into the command's wait.
    let slept = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
    };
    while fsck.try_wait().unwrap().is_none() && slept(fsck.id()).is_some_and(|n| n < 60) {
        std::thread::yield_now();
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(server, libc::SIGCONT) }, 0);
    let o = fsck.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("consistent"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// `fsck` (and `--repair`, and `compact`) of a directory holding no store, of a missing
/// directory and of a regular file say what it is, in one line naming it, and leave it as it
/// was: no lock file in an empty directory.
#[test]
fn fsck_of_what_is_not_a_store_says_what_it_is_and_leaves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let missing = dir.path().join("missing");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    for (d, what) in [
        (&empty, "no lanefs.store"),
        (&missing, "no such directory"),
        (&file, "not a directory"),
    ] {
        let d = d.to_str().unwrap();
        for args in [&["fsck", d][..], &["fsck", "--repair", d], &["compact", d]] {
            let o = lanefs(args);
            assert!(!o.status.success(), "{args:?}");
            assert_eq!(
                stderr(&o),
                format!("lanefs: {d}: not a lanefs store: {what}\n"),
                "{args:?}"
            );
        }
    }
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    assert!(!missing.exists());
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

/// Mounted through the mount-helper form (as mount(8) runs lanefs) or with --background,
/// lanefs says nothing on success, as other mount helpers; with -v it says where it is
/// mounted and how requests are served.
#[test]
fn helper_and_background_mounts_are_silent_unless_verbose() {
    let Some(dir) = mount_dir(
        "helper_and_background_mounts_are_silent_unless_verbose",
        false,
    ) else {
        return;
    };
    let mp = dir.path();
    let m = mp.to_str().unwrap();
    for (args, talks) in [
        (&["memory", m, "-o", "size=1m"][..], false),
        (&["mount", "--background", m], false),
        (&["memory", m, "-v", "-o", "size=1m"], true),
        (&["mount", "--background", "--verbose", m], true),
        (&["mount", "--background", "-v", m], true),
    ] {
        let o = lanefs(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let _m = Mounted(mp.to_path_buf());
        if talks {
            assert!(
                stderr(&o).starts_with(&format!("lanefs: {m} mounted; requests served through "))
                    && stderr(&o).lines().count() == 1,
                "{args:?}: {}",
                stderr(&o)
            );
        } else {
            assert_eq!(stderr(&o), "", "{args:?}");
        }
        assert!(o.stdout.is_empty(), "{args:?}");
        unmount(mp);
    }
}

/// Mounting a store with --wait waits for the process holding it to let go of it (here
/// after a second), then mounts.
#[test]
fn mounting_waits_for_a_store_being_released() {
    let Some(dir) = mount_dir("mounting_waits_for_a_store_being_released", false) else {
        return;
    };
    let (store, mp) = store_and_mnt(dir.path());
    let held = hold_store_lock(&store);
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1000));
        drop(held);
    });
    let start = std::time::Instant::now();
    let _m = mount_at(
        &mp,
        &[
            "mount",
            "--background",
            "--wait",
            "--store",
            store.to_str().unwrap(),
            mp.to_str().unwrap(),
        ],
    );
    assert!(start.elapsed() >= Duration::from_millis(900));
    release.join().unwrap();
    std::fs::write(mp.join("hello"), b"world").unwrap();
    assert_eq!(std::fs::read(mp.join("hello")).unwrap(), b"world");
    unmount(&mp);
}

/// `lanefs compact`: run right after an unmount, it waits for the old server to let go of the
/// store (as `fsck` does), and with --wait for any holder; it applies the journal, and gives the room of files deleted since back
/// to the host; the files kept read back, and fsck finds the store consistent.
#[test]
fn compact_waits_for_the_store_and_gives_deleted_files_room_back() {
    let Some(dir) = mount_dir(
        "compact_waits_for_the_store_and_gives_deleted_files_room_back",
        false,
    ) else {
        return;
    };
    let (store, mp) = store_and_mnt(dir.path());
    let (s, m) = (store.to_str().unwrap(), mp.to_str().unwrap());
    let keep: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let checkpoint_len = || {
        std::fs::metadata(store.join("checkpoint.redb"))
            .unwrap()
            .len()
    };
    let serve = |f: &dyn Fn()| {
        let _m = mount_at(&mp, &["mount", "--background", "--store", s, m]);
        f();
        unmount(&mp);
    };
    serve(&|| {
        std::fs::write(mp.join("keep"), &keep).unwrap();
        std::fs::write(mp.join("big"), vec![7u8; 24 << 20]).unwrap();
    });
    // fsck waits for the server, which may still be closing the store after the unmount.
    lanefs_ok(&["fsck", s]);
    // Held for a second more, as by a server still closing the store.
    let held = hold_store_lock(&store);
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1000));
        drop(held);
    });
    let o = lanefs_ok(&["compact", "--wait", s]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("records applied"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    release.join().unwrap();
    let full = checkpoint_len();
    assert!(full > 24 << 20, "the files are in the checkpoint: {full}");
    serve(&|| std::fs::remove_file(mp.join("big")).unwrap());
    lanefs_ok(&["compact", s]);
    let small = checkpoint_len();
    assert!(small < 4 << 20, "checkpoint.redb {full} -> {small} bytes");
    lanefs_ok(&["fsck", s]);
    serve(&|| {
        assert_eq!(std::fs::read(mp.join("keep")).unwrap(), keep);
        assert!(!mp.join("big").exists());
    });
    // Not a store: refused, and nothing is made.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = lanefs(&["compact", empty.to_str().unwrap()]);
    assert!(!o.status.success());
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
}
