//! `lanefs mount`, the mount-helper form (`mount -t fuse.lanefs SOURCE DIR -o opts`), and
//! `lanefs stats`.

use std::io::{Read, Write};
use std::os::unix::io::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use lanefs::{Atime, Config, Filesystem, Locking};
use lanefs_fuse::MountConfig;

/// Mounts a lanefs filesystem and serves it until SIGINT, SIGTERM or `fusermount3 -u`.
#[derive(Args)]
pub struct MountArgs {
    /// Directory to mount on.
    pub mountpoint: PathBuf,
    /// Store: `memory` (like tmpfs: gone at unmount), or a directory holding a disk store
    /// (created if empty or missing; the journal makes every change durable by fsync).
    #[arg(long, default_value = "memory")]
    pub store: String,
    /// Mount options, comma-separated, as `mount -o`: ro, rw, allow_other (the default when
    /// root mounts; noallow_other keeps a root mount to root), size=BYTES (k/m/g suffixes;
    /// a disk store: its disk's size by default), cache=BYTES (a disk store's file data kept
    /// in memory beyond what changed since its last checkpoint), inode_cache=BYTES (a disk
    /// store opened lazily: inodes kept in memory, 256 bytes each, before clean files are
    /// evicted; an eighth of memory by default),
    /// nr_inodes=N, locking=lanes|dirlock|coarse, load=lazy|whole (a disk store: read its
    /// namespace as it is reached, the default, or all when it opens), threads=N (/dev/fuse
    /// threads), ttl=SECONDS,
    /// uring=auto|on|off (serve requests through io_uring when the kernel offers it, the
    /// default; on: or fail; off: through /dev/fuse), mode=OCTAL, uid=N,
    /// gid=N, and the kernel's mount flags: nosuid/suid, nodev/dev, noexec/exec, sync/async,
    /// dirsync, noatime/atime/relatime/strictatime, nodiratime, lazytime, nosymfollow;
    /// and wait (as --wait).
    /// A mount made by root is suid,dev unless told nosuid/nodev, as tmpfs is; a user's mount
    /// goes through fusermount3, which always makes it nosuid,nodev. The options the kernel
    /// reports for a FUSE mount (user_id=, group_id=, rootmode=, fd=, max_read=, blksize=,
    /// default_permissions) are accepted and ignored, so `findmnt -no OPTIONS` output can be
    /// given back.
    #[arg(short = 'o', value_delimiter = ',')]
    pub options: Vec<String>,
    /// Return once mounted, leaving the server running in the background.
    #[arg(long)]
    pub background: bool,
    /// Say where the filesystem is mounted and how requests are served, on stderr, also
    /// with --background (the foreground says so anyway; the mount-helper form is silent
    /// unless given -v, as other mount helpers are).
    #[arg(short, long)]
    pub verbose: bool,
    /// A disk store in use by another server: wait until that server lets go of it, instead
    /// of failing at once (a store whose server was just unmounted is waited for anyway).
    #[arg(long)]
    pub wait: bool,
}

/// `lanefs fsck [--repair] DIR`.
#[derive(Args)]
pub struct FsckArgs {
    /// The store's directory.
    pub dir: PathBuf,
    /// Cut a damaged store back to its last consistent prefix, and say what was dropped.
    #[arg(long)]
    pub repair: bool,
    /// The store in use by a server: wait until it lets go of it, instead of failing at once
    /// (a store whose server was just unmounted is waited for anyway).
    #[arg(long)]
    pub wait: bool,
}

/// `lanefs compact DIR`.
#[derive(Args)]
pub struct CompactArgs {
    /// The store's directory.
    pub dir: PathBuf,
    /// The store in use by a server: wait until it lets go of it, instead of failing at once
    /// (a store whose server was just unmounted is waited for anyway).
    #[arg(long)]
    pub wait: bool,
}

/// `lanefs stats MOUNTPOINT`.
#[derive(Args)]
pub struct StatsArgs {
    /// A lanefs mountpoint.
    pub mountpoint: PathBuf,
    /// Print the raw JSON document.
    #[arg(long)]
    pub json: bool,
}

/// A size in bytes with an optional `k`, `m` or `g` suffix (`64m`).
pub(crate) fn parse_size(v: &str) -> Result<u64, String> {
    size(v)
}

fn size(v: &str) -> Result<u64, String> {
    let (num, mul) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&v[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .map_err(|_| format!("bad size '{v}'"))
}

struct Plan {
    fs: Config,
    mount: MountConfig,
    /// The disk store's directory (`None`: memory).
    store: Option<PathBuf>,
    /// Wait for a store another server holds (`--wait`, `-o wait`).
    wait: bool,
    /// Load a disk store's namespace as it is reached (`-o load=lazy`, the default) or
    /// whole when it opens (`-o load=whole`).
    lazy: bool,
}

fn plan<'a>(a: &'a MountArgs) -> Result<Plan, String> {
    let store = match a.store.as_str() {
        "memory" => None,
        dir => Some(std::path::absolute(dir).map_err(|e| format!("store '{dir}': {e}"))?),
    };
    let mut fs = Config::default();
    let mut m = MountConfig {
        source: match &store {
            None => "lanefs:memory".into(),
            Some(d) => format!("lanefs:{}", d.display()),
        },
        // Mounted by root, lanefs is for every user, as tmpfs is: the kernel checks every
        // access with `default_permissions`, which is what makes `allow_other` safe. A user's
        // own mount stays private unless asked (it also needs user_allow_other).
        allow_other: is_root(),
        ..MountConfig::default()
    };
    // The kernel flags the options set, in order: the atime ones also tell the engine when a
    // read moves an access time (the kernel leaves that to a FUSE server).
    let mut bits: libc::c_ulong = 0;
    let mut wait = a.wait;
    let mut lazy = true;
    for o in a.options.iter().filter(|o| !o.is_empty()) {
        let (k, v) = o
            .split_once('=')
            .map_or((o.as_str(), None), |(k, v)| (k, Some(v)));
        let need = |v: Option<&'a str>| -> Result<&'a str, String> {
            v.ok_or_else(|| format!("option '{k}' needs a value"))
        };
        match k {
            "ro" | "rw" => {
                m.read_only = k == "ro";
                fs.read_only = m.read_only;
            }
            "defaults" | "auto" | "noauto" | "user" | "users" | "nofail" | "_netdev" => {}
            // lanefs's own: wait for a store another server holds (mount(8)'s way to --wait).
            "wait" if v.is_none() => wait = true,
            // Options the kernel reports for every FUSE mount (`findmnt -no OPTIONS`,
            // /proc/self/mountinfo) that lanefs sets itself: accepted, so that a mount's
            // options can be given back, and ignored (`default_permissions` is always on;
            // `user_id`, `group_id` and `rootmode` are the mounting user's and the
            // mountpoint's; `fd` is the server's own /dev/fuse descriptor).
            "default_permissions" => {}
            "user_id" | "group_id" | "fd" | "max_read" | "blksize" => {
                need(v)?
                    .parse::<u32>()
                    .map_err(|_| format!("bad {k} '{o}'"))?;
            }
            "rootmode" => {
                u32::from_str_radix(need(v)?, 8).map_err(|_| format!("bad rootmode '{o}'"))?;
            }
            "allow_other" | "allow_root" => m.allow_other = true,
            "noallow_other" => m.allow_other = false,
            _ if v.is_none() && lanefs_fuse::mount_flag(k).is_some() => {
                let f = lanefs_fuse::mount_flag(k).expect("just found");
                bits = f.apply(bits);
                // The last of conflicting options wins, as with mount(8).
                m.flags.retain(|o| {
                    lanefs_fuse::MOUNT_FLAGS
                        .iter()
                        .find(|g| g.option() == *o)
                        .is_none_or(|g| g.mask() & f.mask() == 0)
                });
                m.flags.push(f.option());
            }
            "size" => fs.max_bytes = Some(size(need(v)?)?),
            "cache" => fs.cache_bytes = Some(size(need(v)?)?),
            "inode_cache" => fs.inode_cache = Some(size(need(v)?)?),
            "nr_inodes" => {
                fs.max_inodes = Some(
                    need(v)?
                        .parse()
                        .map_err(|_| format!("bad nr_inodes '{o}'"))?,
                )
            }
            "locking" => fs.locking = need(v)?.parse::<Locking>()?,
            "load" => {
                lazy = match need(v)? {
                    "lazy" => true,
                    "whole" => false,
                    _ => return Err(format!("bad load '{o}' (lazy or whole)")),
                }
            }
            "threads" => m.threads = need(v)?.parse().map_err(|_| format!("bad threads '{o}'"))?,
            "uring" => m.uring = need(v)?.parse()?,
            "ttl" => {
                m.ttl =
                    Duration::from_secs_f64(need(v)?.parse().map_err(|_| format!("bad ttl '{o}'"))?)
            }
            "mode" => {
                fs.root_mode =
                    u32::from_str_radix(need(v)?, 8).map_err(|_| format!("bad mode '{o}'"))?
            }
            "uid" => fs.root_uid = need(v)?.parse().map_err(|_| format!("bad uid '{o}'"))?,
            "gid" => fs.root_gid = need(v)?.parse().map_err(|_| format!("bad gid '{o}'"))?,
            _ => return Err(format!("unknown mount option '{o}'")),
        }
    }
    fs.atime = if bits & libc::MS_NOATIME != 0 {
        Atime::Never
    } else if bits & libc::MS_STRICTATIME != 0 {
        Atime::Strict
    } else {
        Atime::Relative
    };
    fs.no_dir_atime = bits & libc::MS_NODIRATIME != 0;
    Ok(Plan {
        fs,
        mount: m,
        store,
        wait,
        lazy,
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    (unsafe { libc::geteuid() }) == 0
}

fn is_mountpoint(p: &Path) -> bool {
    lanefs_fuse::mount_id_at(p).is_some()
}

fn preflight(mp: &Path) -> Result<(), String> {
    let md = std::fs::metadata(mp).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{}: mountpoint does not exist", mp.display()),
        std::io::ErrorKind::PermissionDenied => format!("{}: permission denied", mp.display()),
        // ECONNABORTED: a request that reached a dead io_uring session while the kernel was
        // still tearing its rings down (that happens after the server process is reaped).
        _ if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => format!(
            "{}: a FUSE mount whose server has exited is still attached here; detach it \
             with `fusermount3 -u {}` (or `umount -l` as root), then mount again",
            mp.display(),
            mp.display()
        ),
        _ => format!("{}: {e}", mp.display()),
    })?;
    if !md.is_dir() {
        return Err(format!("{}: mountpoint is not a directory", mp.display()));
    }
    if is_mountpoint(mp) {
        return Err(format!(
            "{}: already mounted (unmount it first: fusermount3 -u {})",
            mp.display(),
            mp.display()
        ));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing: load the fuse module (modprobe fuse) or give the container the device".into());
    }
    let root = is_root();
    let has_fusermount = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .any(|d| d.join("fusermount3").exists() || d.join("fusermount").exists())
        })
        .unwrap_or(false);
    if !root && !has_fusermount {
        return Err("fusermount3 is missing: install fuse3 (apt-get install fuse3)".into());
    }
    // The FUSE library tries /dev/fuse itself before it falls back to fusermount3, and gives
    // up if the device cannot be opened at all (distributions make it 0666; some containers
    // and VMs leave it 0600).
    if !root {
        let dev = std::ffi::CString::new("/dev/fuse").expect("no NUL");
        // SAFETY: a NUL-terminated path; access(2) has no other preconditions.
        if unsafe { libc::access(dev.as_ptr(), libc::R_OK | libc::W_OK) } != 0 {
            return Err(
                "/dev/fuse is not readable and writable by this user (distributions make it \
                 0666: chmod 0666 /dev/fuse as root), or mount as root"
                    .into(),
            );
        }
    }
    Ok(())
}

fn explain(e: std::io::Error, mp: &Path) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => format!(
            "{}: permission denied mounting (run as root, or install fuse3 so that fusermount3 can mount for you; \
             allow_other needs user_allow_other in /etc/fuse.conf)",
            mp.display()
        ),
        _ if e.kind() == std::io::ErrorKind::NotFound => {
            format!(
                "{}: fusermount3 not found: install fuse3 (apt-get install fuse3)",
                mp.display()
            )
        }
        _ => format!("{}: mount failed: {e}", mp.display()),
    }
}

/// How long `mount --store`, `fsck` and `compact` wait, unasked, for a store held by a
/// server whose mount is gone: an unmount returns before the old server has closed the store
/// and released its lock, so a mount or fsck right after an unmount meets it closing.
const CLOSING_WAIT: Duration = Duration::from_secs(60);

/// What a lanefs server notes in its store's lock file once mounted (the store notes
/// `opened` until then): `mounted MAJOR:MINOR MOUNTPOINT`, the mount's device number as
/// `/proc/PID/mountinfo` shows it, so that whoever finds the store in use can tell a server
/// still mounted from one unmounted and closing the store ([`closing`]).
fn mounted_note(dev: (u32, u32), mp: &Path) -> String {
    format!("mounted {}:{} {}", dev.0, dev.1, mp.display())
}

/// The device number and mountpoint in a [`mounted_note`].
fn parse_mounted_note(note: &str) -> Option<(&str, &str)> {
    note.strip_prefix("mounted ")?.split_once(' ')
}

/// Whether `holder` is a lanefs server whose mount is gone from its mount table: it was
/// unmounted and is closing the store (or serves only files still open on a lazily detached
/// mount). A server still mounted, one not yet mounted, fsck, compact, or a holder that cannot
/// be told are not.
fn closing(holder: &lanefs_store::Holder) -> bool {
    let (Some(pid), Some((dev, mp))) = (holder.pid, parse_mounted_note(&holder.note)) else {
        return false;
    };
    // Both the device and the mount point: an anonymous device number freed by the unmount
    // is soon given to the next FUSE mount, anywhere.
    let ours = |l: &str| {
        let f: Vec<&str> = l.split(' ').collect();
        f.get(2) == Some(&dev) && f.get(4).is_some_and(|m| crate::run::unescape(m) == mp)
    };
    match std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) {
        Ok(table) => !table.lines().any(ours),
        // Gone meanwhile (the lock goes with it), or exiting: a process whose main thread
        // has exited has no mount table to show (EINVAL) while its other threads, and so
        // its open files and the lock, live on a little longer. Only a table we may not
        // read tells nothing.
        Err(e) => e.kind() != std::io::ErrorKind::PermissionDenied,
    }
}

/// Who holds the store, for the refusal: `the lanefs server with pid 123, mounted on /mnt`
/// (`unmounted from /mnt` where `closing`).
fn describe(holder: &Option<lanefs_store::Holder>, closing: bool) -> String {
    let Some(h) = holder else {
        return "another process".into();
    };
    let Some(pid) = h.pid else {
        return "another process".into();
    };
    if let Some((_, mp)) = parse_mounted_note(&h.note) {
        let how = if closing {
            "unmounted from"
        } else {
            "mounted on"
        };
        return format!("the lanefs server with pid {pid}, {how} {mp}");
    }
    match h.note.as_str() {
        "opened" => format!("the lanefs server with pid {pid}, which is opening it"),
        "fsck" | "fsck --repair" | "compact" => format!("`lanefs {}` with pid {pid}", h.note),
        "" => format!("another process, pid {pid}"),
        other => format!("process {pid} ({})", other.replace('\n', " ")),
    }
}

/// Runs `f` on the store in `dir`. Where another process holds the store: with `wait`, again
/// every 50 ms until it lets go; else again while the holder is a server whose mount is
/// gone ([`closing`], for up to [`CLOSING_WAIT`]); else it fails at once, in one line that
/// names the holder. `wait_flag` is how the command asks to wait, for that line.
fn when_unlocked<T>(
    dir: &Path,
    wait: bool,
    wait_flag: &str,
    mut f: impl FnMut() -> Result<T, lanefs_store::StoreError>,
) -> Result<T, String> {
    let start = std::time::Instant::now();
    loop {
        match f() {
            Err(lanefs_store::StoreError::Locked { path, holder }) => {
                let closing = holder.as_ref().is_some_and(closing);
                if wait || (closing && start.elapsed() < CLOSING_WAIT) {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                return Err(if closing {
                    format!(
                        "{}: the store is in use by {}, which has not let go of it ({}) in {} s \
                         (files still open on a lazily detached mount keep it serving); \
                         {wait_flag} waits for it",
                        dir.display(),
                        describe(&holder, true),
                        path.display(),
                        CLOSING_WAIT.as_secs()
                    )
                } else {
                    format!(
                        "{}: the store is in use by {} (it holds {}); unmount it first, or \
                         {wait_flag} waits for it",
                        dir.display(),
                        describe(&holder, false),
                        path.display(),
                    )
                });
            }
            r => return r.map_err(|e| e.to_string()),
        }
    }
}

/// Opens the store in `dir` ([`when_unlocked`]).
fn open_store(
    dir: &Path,
    cfg: Config,
    wait: bool,
    lazy: bool,
) -> Result<lanefs_store::Opened, String> {
    let opts = lanefs_store::Options {
        lazy,
        ..lanefs_store::Options::default()
    };
    when_unlocked(dir, wait, "--wait (-o wait)", || {
        lanefs_store::open(dir, cfg.clone(), opts.clone())
    })
}

/// Mounts and serves; `ready` is told once the mount is in place. With `verbose` it says
/// so on stderr, naming the transport.
fn serve(plan: Plan, mp: &Path, verbose: bool, ready: impl FnOnce()) -> Result<(), String> {
    crate::start_purging();
    // Before the mount, while stat of the mountpoint asks no FUSE server.
    let canon_mp = std::fs::canonicalize(mp).unwrap_or_else(|_| mp.to_path_buf());
    let (fs, store) = match &plan.store {
        None => (Filesystem::new(plan.fs), None),
        Some(dir) => {
            let o = open_store(dir, plan.fs, plan.wait, plan.lazy)?;
            if o.report.torn_tail {
                eprintln!(
                    "lanefs: {}: dropped a torn journal tail (a commit cut by a crash, never acknowledged)",
                    dir.display()
                );
            }
            (o.fs, Some(o.store))
        }
    };
    let fs = Arc::new(fs);
    let mut control = None;
    let fs2 = fs.clone();
    // SIGINT/SIGTERM unmount; the session then ends and mount() returns. Caught from before
    // the mount exists (a signal meanwhile waits in `signals`), so that one sent as soon as
    // the mount is seen never meets the default action, which would leave it dead.
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ]);
    let r = lanefs_fuse::mount(fs, mp, &plan.mount, |m| {
        let mut unmount = m.unmount;
        if let (Some(store), Some(dev)) = (&store, lanefs_fuse::mount_dev_at(&canon_mp)) {
            // For whoever finds the store in use: by whom, and whether still mounted.
            let _ = store.note_holder(&mounted_note(dev, &canon_mp));
        }
        if verbose {
            eprintln!(
                "lanefs: {} mounted; requests served through {}",
                mp.display(),
                m.info.describe()
            );
        }
        control = lanefs_fuse::serve_control(fs2, Some(m.info), mp)
            .inspect_err(|e| eprintln!("lanefs: no `lanefs stats` for {}: {e}", mp.display()))
            .ok();
        if let Ok(mut signals) = signals {
            let mp = mp.to_path_buf();
            std::thread::spawn(move || {
                let mut signals = signals.forever();
                if signals.next().is_some() {
                    if let Err(e) = unmount() {
                        eprintln!("lanefs: unmount {}: {e}", mp.display());
                    }
                }
                // A second signal while files on a detached mount are still open: stop now.
                if signals.next().is_some() {
                    std::process::exit(0);
                }
            });
        }
        ready();
    });
    drop(control);
    let r = r.map_err(|e| explain(e, mp));
    if let Some(store) = store {
        // What the last requests changed is committed before the store is released.
        store
            .close()
            .map_err(|e| format!("{}: the store stopped: {e}", store_dir(&plan.store)))?;
    }
    r
}

fn store_dir(s: &Option<PathBuf>) -> String {
    s.as_ref()
        .map_or("memory".into(), |d| d.display().to_string())
}

pub fn fsck(a: FsckArgs) -> Result<(), String> {
    let opts = lanefs_store::Options::default();
    if a.repair {
        let r = when_unlocked(&a.dir, a.wait, "--wait", || {
            lanefs_store::fsck::repair(&a.dir, &opts)
        })?;
        match r.cut_at {
            None => println!(
                "{}: consistent, nothing to repair ({} records)",
                a.dir.display(),
                r.kept
            ),
            Some(f) => println!(
                "{}: cut back to its first {} records (dropped {} bytes of journal) at: {f}",
                a.dir.display(),
                r.kept,
                r.dropped_bytes
            ),
        }
        return Ok(());
    }
    let r = when_unlocked(&a.dir, a.wait, "--wait", || {
        lanefs_store::fsck::check(&a.dir, &opts)
    })?;
    println!(
        "{}: consistent: a checkpoint up to record {}, then {} records in {} journal segments, {} inodes{}",
        a.dir.display(),
        r.checkpoint_lsn,
        r.records,
        r.segments,
        r.inodes,
        if r.torn_tail {
            " (ends with a torn tail, which opening drops)"
        } else {
            ""
        }
    );
    Ok(())
}

pub fn compact(a: CompactArgs) -> Result<(), String> {
    let r = when_unlocked(&a.dir, a.wait, "--wait", || {
        lanefs_store::compact(&a.dir, lanefs_store::Options::default())
    })?;
    println!(
        "{}: {} records applied; checkpoint and journal {} MiB -> {} MiB",
        a.dir.display(),
        r.applied,
        r.before >> 20,
        r.after >> 20
    );
    Ok(())
}

pub fn run(a: MountArgs) -> Result<(), String> {
    let plan = plan(&a)?;
    preflight(&a.mountpoint)?;
    if !a.background {
        // In the foreground the line is the only sign the mount is up.
        return serve(plan, &a.mountpoint, true, || {});
    }
    // Background: fork before any thread exists; the child mounts and reports through a pipe.
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the process is single-threaded here (no thread has been spawned yet).
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            // SAFETY: the child owns both ends; it keeps only the write end.
            let w = unsafe {
                libc::close(fds[0]);
                libc::setsid();
                std::fs::File::from_raw_fd(fds[1])
            };
            // The write end is dropped as soon as the outcome is reported, so the parent sees
            // end of file and returns.
            let w = std::cell::RefCell::new(Some(w));
            let mp = a.mountpoint.clone();
            let r = serve(plan, &mp, a.verbose, || {
                if let Some(mut w) = w.borrow_mut().take() {
                    let _ = w.write_all(b"ok");
                }
                // Detach stdio from the caller's terminal now that the mount is up.
                if let Ok(null) = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
                {
                    use std::os::unix::io::AsRawFd;
                    // SAFETY: dup2 onto the standard descriptors of this process.
                    unsafe {
                        libc::dup2(null.as_raw_fd(), 0);
                        libc::dup2(null.as_raw_fd(), 1);
                        libc::dup2(null.as_raw_fd(), 2);
                    }
                }
            });
            if let (Err(e), Some(mut w)) = (&r, w.borrow_mut().take()) {
                let _ = w.write_all(e.as_bytes());
            }
            std::process::exit(if r.is_ok() { 0 } else { 1 });
        }
        _child => {
            // SAFETY: the parent keeps only the read end.
            let mut rd = unsafe {
                libc::close(fds[1]);
                std::fs::File::from_raw_fd(fds[0])
            };
            let mut msg = String::new();
            let _ = rd.read_to_string(&mut msg);
            if msg.starts_with("ok") {
                Ok(())
            } else if msg.is_empty() {
                Err("the background server exited before mounting".into())
            } else {
                Err(msg)
            }
        }
    }
}

/// The mount-helper form: `lanefs SOURCE MOUNTPOINT [-o opts]`, as `mount.fuse3` runs it for
/// `mount -t fuse.lanefs SOURCE MOUNTPOINT -o opts` and /etc/fstab entries. Always returns once
/// mounted, silently unless given `-v`, as other mount helpers are (mount(8) and xfstests
/// take anything on stderr for trouble).
pub fn helper(args: &[String]) -> Result<(), String> {
    let mut pos = Vec::new();
    let mut options = Vec::new();
    let mut verbose = false;
    let mut it = args.iter();
    while let Some(x) = it.next() {
        if x == "-v" || x == "--verbose" {
            verbose = true;
        } else if x == "-o" {
            options.extend(
                it.next()
                    .ok_or("-o needs options")?
                    .split(',')
                    .map(String::from),
            );
        } else if let Some(o) = x.strip_prefix("-o") {
            options.extend(o.split(',').map(String::from));
        } else if x.starts_with('-') {
            return Err(format!("unknown flag '{x}' in mount-helper form"));
        } else {
            pos.push(x.clone());
        }
    }
    let [source, mountpoint] = pos.as_slice() else {
        return Err("usage: lanefs SOURCE MOUNTPOINT [-o OPTIONS] (SOURCE is 'memory' or a store directory)".into());
    };
    if options.iter().any(|o| o == "remount") {
        return remount(Path::new(mountpoint), &options);
    }
    // A mounted lanefs names itself `lanefs:STORE`; mount(8) hands that back on a remount or
    // when the mount table is replayed.
    let store = source.strip_prefix("lanefs:").unwrap_or(source);
    run(MountArgs {
        mountpoint: mountpoint.into(),
        store: store.to_string(),
        options,
        background: true,
        verbose,
        wait: false,
    })
}

/// `mount -o remount,...` of a mounted lanefs: changes the kernel's mount flags (`ro`/`rw`,
/// `nosuid`, `nodev`, `noexec`, `noatime`, `sync`...), keeping those not named. The VFS then
/// refuses writes to a read-only mount with EROFS before they reach lanefs. Options of the
/// filesystem itself (`size=`, `nr_inodes=`, `locking=`...) are fixed at mount time; mount(8)
/// passes them again from fstab, so they are accepted and left as they are.
fn remount(mp: &Path, options: &[String]) -> Result<(), String> {
    if !is_mountpoint(mp) {
        return Err(format!("{}: not mounted", mp.display()));
    }
    let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: path contains NUL", mp.display()))?;
    let mut flags =
        lanefs_fuse::mount_flags_at(mp).map_err(|e| format!("{}: {e}", mp.display()))?;
    for f in options.iter().filter_map(|o| lanefs_fuse::mount_flag(o)) {
        flags = f.apply(flags);
    }
    // SAFETY: `c` is a valid C string; source, type and data may be null for a remount.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(format!(
            "{}: remount: {}",
            mp.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

pub fn stats(a: StatsArgs) -> Result<(), String> {
    let v = lanefs_fuse::read_stats(&a.mountpoint)?;
    if a.json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "lanefs at {} (locking: {})",
        a.mountpoint.display(),
        v["locking"].as_str().unwrap_or("?")
    );
    println!(
        "  transport {}{}, requests {}, server CPU {}",
        v["transport"].as_str().unwrap_or("?"),
        match (v["uring_queues"].as_u64(), v["uring_sched_idle"].as_bool()) {
            (Some(q), Some(true)) if q > 0 => format!(
                " ({q} queues, SCHED_IDLE, {} boosts)",
                v["uring_boosts"].as_u64().unwrap_or(0)
            ),
            (Some(q), _) if q > 0 => format!(" ({q} queues)"),
            _ => String::new(),
        },
        v["requests"],
        match (v["server_cpu_ns"].as_u64(), v["requests"].as_u64()) {
            (Some(ns), Some(r)) if r > 0 => {
                format!(
                    "{:.3} s ({:.2} us per request)",
                    ns as f64 / 1e9,
                    ns as f64 / 1e3 / r as f64
                )
            }
            (Some(ns), _) => format!("{:.3} s", ns as f64 / 1e9),
            _ => "?".into(),
        }
    );
    if let (Some(c), Some(r)) = (
        v["channel_connections"].as_u64(),
        v["channel_requests"].as_u64(),
    ) {
        println!("  channel of `lanefs run`: {c} connections, {r} requests");
    }
    if let (Some(e), Some(u)) = (
        v["report_entry_invalidations"].as_u64(),
        v["report_names_unlocked"].as_u64(),
    ) {
        println!(
            "  library and channel changes told to the kernel: {e} entry invalidations (each \
             takes the directory's lock in the kernel), {u} names made, removed or renamed without one"
        );
    }
    println!(
        "  inodes used {} ({} read from the store so far, {} evicted since), blocks used {}, \
         open handles {}",
        v["inodes_used"],
        v["inodes_loaded"],
        v["inodes_evicted"],
        v["blocks_used"],
        v["open_handles"]
    );
    println!(
        "  inodes in memory {}, entries {} ({} of held directories; {} inodes the kernel \
         was asked to let go of) ({}, bound {})",
        v["inodes_in_memory"],
        v["entries_in_memory"],
        v["entries_held"],
        v["inodes_pruned"],
        bytes(&v["inode_cache_bytes"]),
        match v["inode_cache_bound"].is_null() {
            true => "none".to_string(),
            false => bytes(&v["inode_cache_bound"]),
        }
    );
    println!(
        "  file data {}, server resident memory {}",
        bytes(&v["data_bytes"]),
        bytes(&v["resident_bytes"])
    );
    println!(
        "  file data in memory {} (bound {}), allocated zeros {}, in the store only {}",
        bytes(&v["data_memory_bytes"]),
        bytes(&v["data_memory_bound"]),
        bytes(&v["data_zero_bytes"]),
        bytes(&v["data_store_bytes"])
    );
    println!("  operations:");
    if let Some(ops) = v["ops"].as_object() {
        for (k, n) in ops.iter().filter(|(_, n)| n.as_u64().unwrap_or(0) > 0) {
            println!("    {k:<12} {n}");
        }
    }
    println!("  locks (acquired / contended / waited):");
    if let Some(locks) = v["locks"].as_object() {
        for (k, l) in locks
            .iter()
            .filter(|(_, l)| l["acquired"].as_u64().unwrap_or(0) > 0)
        {
            let ms = l["wait_ns"].as_u64().unwrap_or(0) as f64 / 1e6;
            println!(
                "    {k:<12} {} / {} / {ms:.1} ms",
                l["acquired"], l["contended"]
            );
        }
    }
    Ok(())
}

/// A byte count as `8.0 MiB (8388608 bytes)`; `?` where the server did not report it.
fn bytes(v: &serde_json::Value) -> String {
    let Some(n) = v.as_u64() else {
        return "?".into();
    };
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} bytes")
    } else {
        format!("{x:.1} {} ({n} bytes)", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanefs_fuse::MountOption;

    fn args(options: &str) -> MountArgs {
        MountArgs {
            mountpoint: "/mnt".into(),
            store: "memory".into(),
            options: options.split(',').map(String::from).collect(),
            background: false,
            verbose: false,
            wait: false,
        }
    }

    /// Every option the kernel reports for a FUSE mount is accepted; the flags among them
    /// are kept, the last of conflicting ones winning.
    #[test]
    fn the_options_the_kernel_reports_are_accepted() {
        let p = plan(&args(
            "rw,nosuid,nodev,noexec,relatime,nodiratime,noatime,rw,user_id=0,group_id=0,\
             rootmode=40000,default_permissions,allow_other,max_read=131072,blksize=4096,fd=7",
        ))
        .unwrap();
        assert!(p.mount.allow_other && !p.mount.read_only);
        let names: Vec<MountOption> = ["nosuid", "nodev", "noexec", "nodiratime", "noatime"]
            .iter()
            .map(|n| lanefs_fuse::mount_flag(n).unwrap().option())
            .collect();
        assert_eq!(p.mount.flags, names);
        let p = plan(&args("ro,nosuid,suid,strictatime")).unwrap();
        assert!(p.mount.read_only && p.fs.read_only);
        assert_eq!(
            p.mount.flags,
            [MountOption::Suid, MountOption::CUSTOM("strictatime".into())]
        );
        assert_eq!((p.fs.atime, p.fs.no_dir_atime), (Atime::Strict, false));
        // The engine's access-time policy follows the last atime option.
        for (opts, want) in [
            ("", (Atime::Relative, false)),
            ("noatime", (Atime::Never, false)),
            ("noatime,relatime,nodiratime", (Atime::Relative, true)),
            ("strictatime,noatime", (Atime::Never, false)),
            ("noatime,atime", (Atime::Relative, false)),
        ] {
            let p = plan(&args(opts)).unwrap();
            assert_eq!((p.fs.atime, p.fs.no_dir_atime), want, "{opts}");
        }
        assert_eq!(
            plan(&args("uring=on")).unwrap().mount.uring,
            lanefs_fuse::Uring::On
        );
        assert_eq!(
            plan(&args("uring=off")).unwrap().mount.uring,
            lanefs_fuse::Uring::Off
        );
        assert_eq!(
            plan(&args("uring=auto")).unwrap().mount.uring,
            lanefs_fuse::Uring::Auto
        );
        // `wait`, lanefs's own, is --wait; never passed to the kernel.
        let p = plan(&args("wait,nosuid")).unwrap();
        assert!(p.wait && !plan(&args("nosuid")).unwrap().wait);
        assert_eq!(p.mount.flags, [MountOption::NoSuid]);
        for bad in [
            "wait=1",
            "uring=yes",
            "uring",
            "user_id=root",
            "rootmode=9",
            "fd",
            "max_read=-1",
            "nosuid=1",
        ] {
            assert!(plan(&args(bad)).is_err(), "{bad}");
        }
    }

    /// A server counts as closing once its mount point no longer shows its mount, even
    /// where its device number now belongs to another mount (the next FUSE mount takes the
    /// number an unmount freed).
    #[test]
    fn closing_asks_for_the_device_at_the_mount_point() {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line: Vec<&str> = table.lines().next().unwrap().split(' ').collect();
        let (dev, mp) = (line[2], crate::run::unescape(line[4]));
        let holder = |note: String| lanefs_store::Holder {
            pid: Some(std::process::id()),
            note,
        };
        assert!(!closing(&holder(format!("mounted {dev} {mp}"))));
        assert!(closing(&holder(format!(
            "mounted {dev} /no/such/mount/point"
        ))));
        assert!(closing(&holder(format!("mounted 4095:1048575 {mp}"))));
    }
}
