//! `lanefs run`: programs run with the preloaded client reach the server over the channel,
//! and what they see and make is what they would through the kernel. Real programs make the
//! same trees as on a tmpfs; a process on the channel and the test on the kernel agree at
//! every step; pjdfstest passes under it; processes fork, change credentials and run
//! threads; a killed server fails calls instead of hanging them; garbage on a channel gets
//! errors and kernel opcodes are refused; a user the mount does not serve is refused.
//! Mounting needs root here (these tests skip otherwise).

#[path = "../../fuse/tests/pjdfstest/mod.rs"]
mod pjdfstest;

mod common;

use common::{BIN, mountinfo_line_at, needs_root, umount2};

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

fn has(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The line of `/proc/self/mountinfo` for the mount at `p`.
fn mountinfo_line(p: &Path) -> Option<String> {
    mountinfo_line_at("self", &std::fs::canonicalize(p).ok()?)
}

/// A lanefs mount made with `lanefs mount --background`, detached when dropped.
struct Mnt {
    dir: tempfile::TempDir,
}

impl Mnt {
    fn new(opts: &str) -> Mnt {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["mount", "--background"];
        if !opts.is_empty() {
            args.extend(["-o", opts]);
        }
        let out = Command::new(BIN)
            .args(&args)
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mnt { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The server's channel socket: named after the mount's device number.
    fn socket(&self) -> PathBuf {
        let line = mountinfo_line(self.path()).expect("mounted");
        let dev = line.split(' ').nth(2).unwrap().replace(':', "-");
        PathBuf::from(format!("/run/lanefs/dev-{dev}.chan"))
    }

    fn stats(&self) -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["stats", "--json"])
            .arg(self.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn channel_requests(&self) -> u64 {
        self.stats()["channel_requests"].as_u64().unwrap()
    }
}

impl Drop for Mnt {
    fn drop(&mut self) {
        umount2(self.path(), libc::MNT_DETACH);
    }
}

/// `lanefs run -- program args...`.
fn under_run(program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new(BIN);
    c.arg("run").arg("--").arg(program);
    c
}

/// Runs this test binary's test `test` alone under `lanefs run`, with `var` naming `dir`:
/// the test's child part, which then makes its libc calls through the preloaded client.
fn child_under_run(test: &str, var: &str, dir: &Path) -> std::process::Output {
    child_command(test, var, dir).output().unwrap()
}

/// `lanefs run -- python3 -c SCRIPT DIR`, run to its end.
fn python_under_run(script: &str, dir: &Path) -> std::process::Output {
    under_run("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .output()
        .unwrap()
}

/// The standard output of a command that must have succeeded (its output, both streams,
/// is the failure's message).
fn stdout_of_success(out: &std::process::Output) -> std::borrow::Cow<'_, str> {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `lanefs mount DIR` in the foreground (its stderr dropped), once the mount is there (60 s
/// at the most).
fn serve_in_foreground(dir: &Path) -> std::process::Child {
    let server = Command::new(BIN)
        .arg("mount")
        .arg(dir)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while mountinfo_line(dir).is_none_or(|l| !l.contains("fuse.lanefs")) {
        assert!(Instant::now() < deadline, "the mount never appeared");
        std::thread::sleep(Duration::from_millis(10));
    }
    server
}

/// The command [`child_under_run`] runs, for a caller that adds to it.
fn child_command(test: &str, var: &str, dir: &Path) -> Command {
    let mut c = under_run(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, dir);
    c
}

/// What a tree holds, path by path: type, permission bits, size, link count (files), a
/// symlink's target, and a file's contents.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = md.file_type();
            let what = if ft.is_symlink() {
                format!("link -> {:?}", std::fs::read_link(&p).unwrap())
            } else if ft.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", md.mode() & 0o7777)
            } else if ft.is_file() {
                let data = std::fs::read(&p).unwrap();
                let sum = data.iter().fold(0xcbf29ce484222325u64, |h, &b| {
                    (h ^ b as u64).wrapping_mul(0x100000001b3)
                });
                format!(
                    "file {:o} {} bytes, {} links, fnv {sum:x}",
                    md.mode() & 0o7777,
                    md.len(),
                    md.nlink()
                )
            } else {
                format!("other {:o}", md.mode())
            };
            out.insert(rel, what);
        }
    }
    out
}

/// The script of real programs the tree test runs: coreutils, tar, find, du, and, where the
/// machine has them, git, Python, make and cc. `$SRC` is a source tree to copy.
const PROGRAMS: &str = r#"
set -e
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'
umask 022
mkdir -p a/b/c
cp -a "$SRC" src
cp -r src copy
mv copy moved
ln -s ../moved a/b/link
ln src/main.rs hard
touch -d '2020-02-02 02:02:02' a/b/c/stamp
chmod 640 a/b/c/stamp
mkdir -m 711 private
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf arch.tar src a
mkdir untar && tar xf arch.tar -C untar
find . -name '*.rs' | sort > rs-files.txt
du -a --apparent-size src | sort -k2 > du.txt
ls -R a > ls.txt
rm -rf moved
: > empty
printf 'x%.0s' $(seq 1 5000) > big
truncate -s 100 big
mkfifo fifo
if command -v git >/dev/null; then
    git init -q repo && cp src/main.rs repo/ && cd repo && git add -A && git commit -qm one
    echo change >> main.rs && git status --porcelain > ../git-status.txt && git stash -q
    git log --format='%H %s' > ../git-log.txt && cd ..
    rm -rf repo/.git/index repo/.git/logs repo/.git/ORIG_HEAD repo/.git/hooks
    find repo/.git -name '*.sample' -delete
fi
if command -v python3 >/dev/null; then
    python3 - <<'PY'
import os, shutil
shutil.copytree("src", "pycopy", symlinks=True)
with open("walk.txt", "w") as f:
    for d, ds, fs in sorted(os.walk(".")):
        f.write(f"{d} {sorted(ds)} {sorted(fs)}\n")
os.rename("pycopy", "pycopy2")
os.makedirs("py/deep/er", exist_ok=True)
os.symlink("deep", "py/sym")
os.remove("py/sym")
PY
fi
if command -v make >/dev/null && command -v cc >/dev/null; then
    mkdir proj && cd proj
    printf '#include <stdio.h>\nint f(void);\nint main(void){printf("%%d\\n", f());return 0;}\n' > main.c
    printf 'int f(void){return 42;}\n' > f.c
    printf 'app: main.o f.o\n\tcc -o app main.o f.o\n%%.o: %%.c\n\tcc -c -o $@ $<\n' > Makefile
    make -s && ./app > ../app-out.txt && rm -f app *.o && cd ..
fi
rm -rf untar
"#;

/// Runs [`PROGRAMS`] in `dir`, under `lanefs run` when `client`; returns its stderr.
fn run_programs(dir: &Path, client: bool) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut cmd = if client {
        let mut c = under_run("bash");
        c.arg("-c").arg(PROGRAMS);
        c
    } else {
        let mut c = Command::new("bash");
        c.arg("-c").arg(PROGRAMS);
        c
    };
    let out = cmd
        .current_dir(dir)
        .env("SRC", &src)
        .output()
        .expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the programs failed (client: {client}):\n{err}"
    );
    err
}

/// Real programs make exactly the tree under `lanefs run` on a lanefs mount that they make
/// without it on a tmpfs, and their calls did go over the channel.
#[test]
fn real_programs_make_the_same_tree_under_lanefs_run() {
    if !needs_root("real_programs_make_the_same_tree_under_lanefs_run") {
        return;
    }
    let m = Mnt::new("");
    let work = m.path().join("w");
    std::fs::create_dir(&work).unwrap();
    let before = m.channel_requests();
    run_programs(&work, true);
    let served = m.channel_requests() - before;
    let reference = tempfile::tempdir_in("/dev/shm").unwrap();
    run_programs(reference.path(), false);
    let (got, want) = (snapshot(&work), snapshot(reference.path()));
    let diff: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| format!("{k:?}: want {v}, got {:?}", got.get(k)))
        .chain(
            got.iter()
                .filter(|(k, _)| !want.contains_key(*k))
                .map(|(k, v)| format!("{k:?}: extra {v}")),
        )
        .collect();
    assert!(
        diff.is_empty(),
        "{} differences (of {} entries):\n{}",
        diff.len(),
        want.len(),
        diff.join("\n")
    );
    assert!(
        served > 1000,
        "only {served} calls went over the channel: the client was not used"
    );
}

/// A shell run under `lanefs run` that executes one command line at a time, for a test that
/// alternates between it and the kernel.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Shell {
    fn new(dir: &Path) -> Shell {
        let mut child = under_run("bash")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Shell {
            child,
            stdin,
            stdout,
        }
    }

    /// Runs `line` (stderr joined to stdout); its output and exit status.
    fn run(&mut self, line: &str) -> (String, i32) {
        writeln!(self.stdin, "{line} 2>&1; echo \"__done $?\"").unwrap();
        let mut out = String::new();
        loop {
            let mut l = String::new();
            assert!(self.stdout.read_line(&mut l).unwrap() > 0, "the shell went");
            // Output without a final newline runs into the marker's line.
            if let Some(at) = l.find("__done ") {
                out.push_str(&l[..at]);
                return (out, l[at + 7..].trim().parse().unwrap());
            }
            out.push_str(&l);
        }
    }

    /// Runs `line`, which must succeed; its output.
    fn ok(&mut self, line: &str) -> String {
        let (out, rc) = self.run(line);
        assert_eq!(rc, 0, "{line}: {out}");
        out
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A process on the channel and this test on the kernel (with its caches: a minute's entry
/// and attribute timeouts) see each other's every change at once: names made, removed and
/// renamed, sizes, modes, link counts, listings.
#[test]
fn the_channel_and_the_kernel_agree_at_every_step() {
    if !needs_root("the_channel_and_the_kernel_agree_at_every_step") {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    let mut sh = Shell::new(p);
    // The kernel caches the absence of x (a negative entry), then the channel makes it.
    assert!(std::fs::metadata(p.join("x")).is_err());
    sh.ok("touch x");
    assert_eq!(std::fs::metadata(p.join("x")).unwrap().len(), 0);
    std::fs::write(p.join("x"), b"hello").unwrap();
    assert_eq!(sh.ok("stat -c %s x").trim(), "5");
    let ino = std::fs::metadata(p.join("x")).unwrap().ino();
    sh.ok("mv x y");
    assert!(std::fs::metadata(p.join("x")).is_err(), "x gone");
    assert_eq!(std::fs::metadata(p.join("y")).unwrap().ino(), ino);
    assert_eq!(names(p), ["y"]);
    sh.ok("mkdir d && touch d/a d/b");
    assert_eq!(names(&p.join("d")), ["a", "b"]);
    assert_eq!(std::fs::metadata(p.join("d")).unwrap().nlink(), 2);
    std::fs::remove_file(p.join("d/a")).unwrap();
    assert_eq!(sh.ok("ls d").trim(), "b");
    sh.ok("mkdir d/sub");
    assert_eq!(std::fs::metadata(p.join("d")).unwrap().nlink(), 3);
    sh.ok("rm -r d");
    assert!(std::fs::metadata(p.join("d")).is_err());
    assert_eq!(names(p), ["y"]);
    sh.ok("chmod 600 y");
    assert_eq!(
        std::fs::metadata(p.join("y")).unwrap().mode() & 0o7777,
        0o600
    );
    sh.ok("ln y z && ln -s y s");
    assert_eq!(std::fs::metadata(p.join("y")).unwrap().nlink(), 2);
    assert_eq!(std::fs::read_link(p.join("s")).unwrap(), Path::new("y"));
    assert_eq!(std::fs::read(p.join("s")).unwrap(), b"hello");
    std::fs::rename(p.join("y"), p.join("w")).unwrap();
    assert_eq!(sh.ok("cat w"), "hello");
    assert_ne!(sh.run("stat y").1, 0, "y is gone on the channel too");
    assert_ne!(sh.run("cat s").1, 0, "the symlink dangles");
    sh.ok("rm z w s");
    assert!(names(p).is_empty());
    std::fs::create_dir(p.join("k")).unwrap();
    sh.ok("touch k/f && mv k/f k/g && rm k/g && rmdir k");
    assert!(std::fs::metadata(p.join("k")).is_err());
    assert!(m.channel_requests() > 10);
}

/// A name made over the channel is reported to the kernel without an entry invalidation
/// (which takes the directory's lock in the kernel) only when the kernel can hold nothing
/// under it: not after the kernel looked the name up and found nothing, not after the kernel
/// removed or renamed it away (its dentry turns negative), not while the directory's listing
/// may be in the kernel's cache. In each of those cases the kernel sees the new name at once.
/// A removal over the channel takes none when the kernel holds nothing of the name.
#[test]
fn new_names_over_the_channel_take_the_kernels_directory_lock_only_when_needed() {
    if !needs_root("new_names_over_the_channel_take_the_kernels_directory_lock_only_when_needed") {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    let mut sh = Shell::new(p);
    // (entry invalidations, new names reported without one)
    let counts = || {
        let s = m.stats();
        let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}: {s}"));
        (n("report_entry_invalidations"), n("report_names_unlocked"))
    };
    // Makes `line` over the channel; checks whether it took an entry invalidation.
    let made = |sh: &mut Shell, line: &str, locked: bool| {
        let (e0, u0) = counts();
        sh.ok(line);
        let (e1, u1) = counts();
        if locked {
            assert!(e1 > e0, "{line}: no entry invalidation ({e0} -> {e1})");
        } else {
            assert_eq!(e1, e0, "{line}: an entry invalidation");
            assert!(u1 > u0, "{line}: not reported ({u0} -> {u1})");
        }
    };
    // Names the kernel never saw.
    made(&mut sh, "mkdir d", false);
    made(&mut sh, "touch d/a d/b", false);
    made(&mut sh, "ln d/a d/c && ln -s a d/s", false);
    let meta = |n: &str| std::fs::symlink_metadata(p.join(n));
    assert_eq!(meta("d/c").unwrap().ino(), meta("d/a").unwrap().ino());
    assert!(meta("d/s").unwrap().file_type().is_symlink());
    // The kernel looked the name up and keeps its absence.
    assert!(meta("d/n").is_err());
    made(&mut sh, "touch d/n", true);
    assert!(
        meta("d/n").unwrap().is_file(),
        "the kernel's negative entry was dropped"
    );
    // The kernel removed the name (its dentry turned negative).
    std::fs::remove_file(p.join("d/b")).unwrap();
    made(&mut sh, "touch d/b", true);
    assert!(meta("d/b").unwrap().is_file());
    std::fs::create_dir(p.join("k")).unwrap();
    std::fs::remove_dir(p.join("k")).unwrap();
    made(&mut sh, "mkdir k", true);
    assert!(meta("k").unwrap().is_dir());
    // The kernel renamed the name away.
    let a = meta("d/a").unwrap().ino();
    std::fs::rename(p.join("d/a"), p.join("d/e")).unwrap();
    made(&mut sh, "touch d/a", true);
    assert_ne!(meta("d/a").unwrap().ino(), a, "a new file");
    assert_eq!(meta("d/e").unwrap().ino(), a);
    // The kernel read the listing: the next new name drops it, the one after does not.
    assert_eq!(names(&p.join("d")), ["a", "b", "c", "e", "n", "s"]);
    made(&mut sh, "touch d/x", true);
    made(&mut sh, "touch d/y", false);
    assert_eq!(
        names(&p.join("d")),
        ["a", "b", "c", "e", "n", "s", "x", "y"]
    );
    made(&mut sh, "touch d/z", true);
    assert_eq!(
        names(&p.join("d")),
        ["a", "b", "c", "e", "n", "s", "x", "y", "z"]
    );
    // Removals: of a name the kernel never saw, the directory's attributes only; of one it
    // looked up, the entry invalidation, and the kernel sees the name gone at once.
    made(&mut sh, "mkdir r && ln -s x r/u && ln -s x r/v", false);
    made(&mut sh, "rm r/u", false);
    assert!(meta("r/u").is_err());
    assert!(meta("r/v").unwrap().file_type().is_symlink());
    made(&mut sh, "rm r/v", true);
    assert!(meta("r/v").is_err(), "the kernel's entry was dropped");
    // A file made and closed over the channel (a deferred descriptor the kernel never
    // opened) and removed again: no entry invalidation either way.
    made(
        &mut sh,
        "python3 -c \"import os; os.close(os.open('r/w', os.O_CREAT | os.O_WRONLY))\"",
        false,
    );
    made(&mut sh, "rm r/w", false);
    assert!(meta("r/w").is_err());
    // A rename of names the kernel never saw, and of one it looked up.
    made(&mut sh, "ln -s x r/m && mv r/m r/n", false);
    assert!(meta("r/m").is_err());
    assert!(meta("r/n").unwrap().file_type().is_symlink());
    made(&mut sh, "mv r/n r/o", true);
    assert!(meta("r/n").is_err(), "the kernel's entry was dropped");
    assert!(meta("r/o").unwrap().file_type().is_symlink());
    made(&mut sh, "rm r/o", true);
    assert!(names(&p.join("r")).is_empty());
}

/// pjdfstest, the POSIX suite, run under `lanefs run`: the same result as through the
/// kernel (`fuse/tests/mount.rs`).
#[test]
fn pjdfstest_passes_under_lanefs_run() {
    if !needs_root("pjdfstest_passes_under_lanefs_run") {
        return;
    }
    let Some(bin) = pjdfstest::pjdfstest() else {
        return;
    };
    let m = Mnt::new("");
    let before = m.channel_requests();
    pjdfstest::run_pjdfstest(
        &bin,
        m.path(),
        &[OsStr::new(BIN), OsStr::new("run"), OsStr::new("--")],
    );
    assert!(m.channel_requests() - before > 1000, "the channel was used");
}

/// Threads creating in one directory, a forked child, and a child that drops to another
/// user: each call is made with the caller's own credentials, which the server learns from
/// the socket (a forked child and a process whose ids changed connect anew).
#[test]
fn threads_forks_and_credential_changes_under_lanefs_run() {
    if !needs_root("threads_forks_and_credential_changes_under_lanefs_run") || !has("python3") {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    let script = r#"
import os, sys, threading
M = sys.argv[1]
os.mkdir(f"{M}/t")
def work(i):
    for j in range(200):
        path = f"{M}/t/{i}-{j}"
        open(path, "w").close()
        if j % 2:
            os.unlink(path)
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print(len(os.listdir(f"{M}/t")))
pid = os.fork()
if pid == 0:
    os.mkdir(f"{M}/child")
    os._exit(0)
os.waitpid(pid, 0)
print(os.path.isdir(f"{M}/child"))
os.mkdir(f"{M}/open")
os.chmod(f"{M}/open", 0o777)
os.chmod(f"{M}/child", 0o755)
pid = os.fork()
if pid == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    open(f"{M}/open/mine", "w").close()
    try:
        os.mkdir(f"{M}/child/nope")
        print("mkdir allowed")
    except PermissionError:
        print("mkdir denied")
    sys.stdout.flush()
    os._exit(0)
os.waitpid(pid, 0)
"#;
    let out = python_under_run(script, p);
    let text = stdout_of_success(&out);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["800", "True", "mkdir denied"]
    );
    let mine = std::fs::metadata(p.join("open/mine")).unwrap();
    assert_eq!((mine.uid(), mine.gid()), (65534, 65534));
    assert_eq!(names(&p.join("t")).len(), 800);
    assert!(m.channel_requests() > 1600);
}

/// A server killed while a client holds a channel to it: the client's next call fails
/// (ENOTCONN, as on a dead FUSE mount) instead of waiting for an answer forever.
#[test]
fn a_killed_server_fails_calls_instead_of_hanging() {
    if !needs_root("a_killed_server_fails_calls_instead_of_hanging") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut server = serve_in_foreground(dir.path());
    let p = dir.path().to_str().unwrap().to_string();
    // bash's own redirections and `[ -e ]` use the channel from bash's one thread.
    let script = format!(
        ": > {p}/a && echo connected; read _; : > {p}/b; echo \"rc=$?\"; [ -e {p}/a ]; echo \"stat=$?\""
    );
    let mut sh = under_run("bash")
        .arg("-c")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(sh.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "connected");
    server.kill().unwrap();
    server.wait().unwrap();
    writeln!(sh.stdin.take().unwrap()).unwrap();
    // Bounded: a hang is a failure, not a stuck test run.
    let deadline = Instant::now() + Duration::from_secs(60);
    while sh.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = sh.kill();
            panic!("a call on a killed server's channel hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    // The create fails; the stat after it finishes too (the kernel may answer it from its
    // attribute cache, as it does on any dead FUSE mount).
    assert!(rest.contains("rc=1") && rest.contains("stat="), "{rest}");
    umount2(dir.path(), libc::MNT_DETACH);
}

/// The device number of the mount at `p`, as `major-minor` (the channel socket's name).
fn dev_of(p: &Path) -> String {
    let line = mountinfo_line(p).expect("mounted");
    line.split(' ').nth(2).unwrap().replace(':', "-")
}

/// A server that stops after a lazy unmount leaves alone the channel socket of a mount made
/// meanwhile that was given its device number (the kernel frees the number at the unmount,
/// and the next mount takes the lowest free one): it removes its socket only while the name
/// is still its own. It removed the new server's, whose clients then went through the
/// kernel (seen as a flaky `lanefs run` test while other tests mounted and unmounted).
#[test]
fn a_stopping_server_leaves_the_socket_of_the_next_mount() {
    if !needs_root("a_stopping_server_leaves_the_socket_of_the_next_mount") {
        return;
    }
    for _attempt in 0..20 {
        let a = tempfile::tempdir().unwrap();
        let mut old = serve_in_foreground(a.path());
        let dev = dev_of(a.path());
        let pid = old.id() as libc::pid_t;
        // The old server is held until the new mount's server has bound its socket.
        // SAFETY: signals to our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        assert_eq!(umount2(a.path(), libc::MNT_DETACH), 0);
        let b = Mnt::new("");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while old.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the old server did not stop");
            std::thread::sleep(Duration::from_millis(10));
        }
        if dev_of(b.path()) != dev {
            // Another test's mount took the number: again.
            continue;
        }
        assert!(
            b.socket().exists(),
            "the old server removed the new mount's socket {}",
            b.socket().display()
        );
        assert!(
            Raw::connect(&b.socket()).is_ok(),
            "the new server serves it"
        );
        return;
    }
    eprintln!("a_stopping_server_leaves_the_socket_of_the_next_mount: no device number reused");
}

/// A raw client of the channel, for the tests that misbehave on purpose.
struct Raw {
    map: *mut u8,
    _sock: std::os::fd::OwnedFd,
}

impl Raw {
    /// Connects to `socket`; the server's refusal (its errno) otherwise.
    fn connect(socket: &Path) -> Result<Raw, i32> {
        use lanefs_channel::*;
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: socket creation.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0) };
        assert!(fd >= 0);
        // SAFETY: ours.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a zeroed sockaddr_un is valid.
        let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, &s) in a.sun_path.iter_mut().zip(socket.as_os_str().as_bytes()) {
            *d = s as libc::c_char;
        }
        let len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: a valid address.
        let r = unsafe { libc::connect(fd, (&raw const a).cast(), len) };
        assert_eq!(r, 0, "connect {}", socket.display());
        // First the thread id (the protocol: the server reads this thread's credentials).
        // SAFETY: gettid has no preconditions; send of 4 bytes of ours.
        let tid = (unsafe { libc::syscall(libc::SYS_gettid) } as u32).to_ne_bytes();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::send(fd, tid.as_ptr().cast(), 4, 0) }, 4);
        let mut hello = Hello::default();
        let mut iov = libc::iovec {
            iov_base: (&raw mut hello).cast(),
            iov_len: size_of::<Hello>(),
        };
        let mut cbuf = [0u64; 4];
        // SAFETY: a zeroed msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&cbuf);
        // SAFETY: recvmsg into our buffers.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
        assert_eq!(n, size_of::<Hello>() as isize);
        if hello.error != 0 {
            return Err(hello.error);
        }
        // SAFETY: the control message the kernel wrote.
        let memfd = unsafe { *libc::CMSG_DATA(libc::CMSG_FIRSTHDR(&msg)).cast::<i32>() };
        // SAFETY: mapping the memfd we were sent.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MAP_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        // A sealed memfd cannot be grown by the client.
        // SAFETY: ftruncate of our copy of the memfd.
        let grown = unsafe { libc::ftruncate(memfd, 1 << 20) };
        assert_ne!(grown, 0, "the memfd is sealed");
        // SAFETY: ours.
        unsafe { libc::close(memfd) };
        Ok(Raw {
            map: map.cast(),
            _sock: sock,
        })
    }

    fn shared(&self) -> &lanefs_channel::Shared {
        // SAFETY: the mapping starts with the header.
        unsafe { &*(self.map as *const lanefs_channel::Shared) }
    }

    /// Sends `bytes` as a request claiming length `claimed`; the reply's errno.
    fn call(&self, bytes: &[u8], claimed: u32) -> i32 {
        use lanefs_channel::*;
        use std::sync::atomic::Ordering::SeqCst;
        let n = bytes.len().min(BUF_LEN);
        // SAFETY: within the buffer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.add(BUF_OFFSET), n) };
        let s = self.shared();
        s.req_len.store(claimed, SeqCst);
        s.state.store(REQUEST, SeqCst);
        futex_wake(&s.state);
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.state.load(SeqCst) != REPLY {
            assert!(Instant::now() < deadline, "no reply");
            assert_eq!(s.closed.load(SeqCst), 0, "the server closed the channel");
            std::thread::yield_now();
        }
        // SAFETY: the reply's header is in the buffer.
        let h: fuse_out_header =
            unsafe { std::ptr::read_unaligned(self.map.add(BUF_OFFSET).cast()) };
        -h.error
    }

    /// A well-formed request: `op`, `arg`, and NUL-terminated `paths`.
    fn request(op: u32, nodeid: u64, arg: &[u8], paths: &[&[u8]]) -> Vec<u8> {
        use zerocopy::IntoBytes;
        let len = 40 + arg.len() + paths.iter().map(|p| p.len() + 1).sum::<usize>();
        let h = lanefs_channel::fuse_in_header {
            len: len as u32,
            opcode: op,
            unique: 1,
            nodeid,
            ..Default::default()
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(arg);
        for p in paths {
            v.extend_from_slice(p);
            v.push(0);
        }
        v
    }
}

/// What a misbehaving client can do: the kernel's own opcodes (a READ by inode number, a
/// FORGET, a GETATTR of any inode) are refused (ENOSYS), garbage gets errors, and the
/// server goes on serving that channel and the mount.
#[test]
fn garbage_and_kernel_opcodes_on_the_channel_get_errors() {
    if !needs_root("garbage_and_kernel_opcodes_on_the_channel_get_errors") {
        return;
    }
    use zerocopy::IntoBytes;
    let m = Mnt::new("");
    std::fs::write(m.path().join("secret"), b"data").unwrap();
    std::fs::set_permissions(m.path().join("secret"), PermissionsExt::from_mode(0o600)).unwrap();
    let ino = std::fs::metadata(m.path().join("secret")).unwrap().ino();
    let raw = Raw::connect(&m.socket()).expect("root is served");
    let stat = lanefs_channel::StatIn::default();
    let ok = Raw::request(lanefs_channel::OP_STAT, 1, stat.as_bytes(), &[b"secret"]);
    assert_eq!(raw.call(&ok, ok.len() as u32), 0);
    for op in [
        1u32, /* LOOKUP */ 2, /* FORGET */ 3, /* GETATTR */ 15, /* READ */
        16, /* WRITE */ 26, /* INIT */ 42, /* BATCH_FORGET */
    ] {
        let r = Raw::request(op, ino, &[0u8; 64], &[b"x"]);
        assert_eq!(raw.call(&r, r.len() as u32), libc::ENOSYS, "opcode {op}");
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..2000 {
        let len = (next() % 300) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 2 == 0 && bytes.len() >= 8 {
            // A channel opcode with garbage after it.
            let op = lanefs_channel::OP_STAT + (next() % 12) as u32;
            bytes[4..8].copy_from_slice(&op.to_le_bytes());
        }
        let claimed = match round % 3 {
            0 => len as u32,
            1 => next() as u32,
            _ => (next() % 100_000) as u32,
        };
        let e = raw.call(&bytes, claimed);
        assert!(e >= 0, "round {round}: a reply with errno {e}");
    }
    assert_eq!(
        raw.call(&ok, ok.len() as u32),
        0,
        "the channel still serves"
    );
    assert_eq!(std::fs::read(m.path().join("secret")).unwrap(), b"data");
}

/// A mount that does not serve other users (`noallow_other`) refuses them on the channel as
/// the kernel does on the mount.
#[test]
fn other_users_are_refused_without_allow_other() {
    if let Ok(sock) = std::env::var("LANEFS_TEST_CONNECT") {
        // The child's part: connect as the user it runs as, and say what came back.
        match Raw::connect(Path::new(&sock)) {
            Ok(_) => println!("served"),
            Err(e) => println!("refused {e}"),
        }
        return;
    }
    if !needs_root("other_users_are_refused_without_allow_other") {
        return;
    }
    let m = Mnt::new("noallow_other");
    // This test's child part, as this user or as `nobody` (65534).
    let child = |nobody: bool| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args([
            "--exact",
            "other_users_are_refused_without_allow_other",
            "--nocapture",
        ])
        .env("LANEFS_TEST_CONNECT", m.socket());
        if nobody {
            c.uid(65534).gid(65534);
        }
        c.output().unwrap()
    };
    let out = child(false);
    assert!(String::from_utf8_lossy(&out.stdout).contains("served"));
    // The socket is the mounting user's alone (mode 0600), and the server refuses others
    // even through a descriptor handed to them.
    let mode = std::fs::metadata(m.socket()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    std::fs::set_permissions(m.socket(), PermissionsExt::from_mode(0o666)).unwrap();
    let out = child(true);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("refused {}", libc::EACCES)),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// stress-ng's filesystem stressors with `--verify`, under `lanefs run`: each succeeds, as it
/// does through the kernel on the same mount. (Skipped where stress-ng is not installed;
/// `scripts/test.sh` installs it as root.)
#[test]
fn stress_ng_filesystem_stressors_pass_under_lanefs_run() {
    if !needs_root("stress_ng_filesystem_stressors_pass_under_lanefs_run") {
        return;
    }
    if !has("stress-ng") {
        assert!(
            std::env::var_os("LANEFS_REQUIRE_STRESS_NG").is_none(),
            "stress-ng is required here but not installed"
        );
        eprintln!("stress-ng not installed: NOT RUN");
        return;
    }
    let m = Mnt::new("");
    let before = m.channel_requests();
    for s in [
        "dir", "dirdeep", "dentry", "link", "symlink", "rename", "chmod", "chown", "utime",
        "mknod", "filename",
    ] {
        for client in [false, true] {
            let args = [
                format!("--{s}"),
                "2".into(),
                format!("--{s}-ops"),
                "100".into(),
                "--verify".into(),
                "--timeout".into(),
                "2s".into(),
                "--temp-path".into(),
                m.path().to_string_lossy().into_owned(),
            ];
            let out = if client {
                under_run("stress-ng").args(&args).output().unwrap()
            } else {
                Command::new("stress-ng").args(&args).output().unwrap()
            };
            let text = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("successful run completed"),
                "stress-ng --{s} (client: {client}) failed:\n{text}"
            );
        }
    }
    assert!(m.channel_requests() - before > 1000, "the channel was used");
}

/// The `statx` fields of each of `names` in `dir`, through whatever serves this process's
/// `statx` (the channel under `lanefs run`, else the kernel), a line each: the mask, the
/// attributes and their mask, and the basic fields.
fn statx_lines(dir: &Path, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let c = CString::new(dir.join(name).as_os_str().as_bytes()).unwrap();
            // SAFETY: statx is plain old data; all-zero is a valid value.
            let mut sx: libc::statx = unsafe { std::mem::zeroed() };
            let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
            // SAFETY: a valid C string and a writable struct statx.
            let r = unsafe {
                libc::statx(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                    mask,
                    &mut sx,
                )
            };
            assert_eq!(r, 0, "statx {name}: {}", std::io::Error::last_os_error());
            format!(
                "{name}: mask {:#x} attributes {:#x} attributes_mask {:#x} ino {} mode {:o} \
                 nlink {} uid {} gid {} size {} blocks {} rdev {}:{} mtime {}.{} btime {}.{}",
                sx.stx_mask,
                sx.stx_attributes,
                sx.stx_attributes_mask,
                sx.stx_ino,
                sx.stx_mode,
                sx.stx_nlink,
                sx.stx_uid,
                sx.stx_gid,
                sx.stx_size,
                sx.stx_blocks,
                sx.stx_rdev_major,
                sx.stx_rdev_minor,
                sx.stx_mtime.tv_sec,
                sx.stx_mtime.tv_nsec,
                sx.stx_btime.tv_sec,
                sx.stx_btime.tv_nsec,
            )
        })
        .collect()
}

/// `statx` under `lanefs run` (the channel) reports what it reports through the kernel,
/// for inodes with the flags 'i', 'a' and 'd' (`chattr`) too: the same `stx_attributes` and
/// `stx_attributes_mask` (the kernel drops the `STATX_ATTR_*` bits lanefs's FUSE_STATX
/// carries, so the channel does not report them either; see `client/src/calls.rs`), the
/// mount root's `STATX_ATTR_MOUNT_ROOT`, and the same birth time.
#[test]
fn statx_under_lanefs_run_agrees_with_the_kernel() {
    const NAMES: [&str; 9] = [
        ".", "i", "a", "n", "plain", "dir", "dir/fifo", "dir/link", "dir/chr",
    ];
    if let Ok(dir) = std::env::var("LANEFS_TEST_STATX") {
        // The child's part, under `lanefs run`: its statx calls go over the channel. (The
        // harness's own "test ... " has no newline before the test's output.)
        for l in statx_lines(Path::new(&dir), &NAMES) {
            println!("\nstatx {l}");
        }
        return;
    }
    if !needs_root("statx_under_lanefs_run_agrees_with_the_kernel") || !has("chattr") {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    let out = Command::new("sh")
        .arg("-c")
        .arg(
            "set -e; echo data > i; touch a n plain; mkdir dir; chattr +i i; chattr +a a; \
             chattr +d n; chattr +ia plain; chattr +d dir; mkfifo dir/fifo; \
             ln -s target dir/link; mknod dir/chr c 259 300",
        )
        .current_dir(p)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let kernel = statx_lines(p, &NAMES);
    let before = m.channel_requests();
    let out = child_under_run(
        "statx_under_lanefs_run_agrees_with_the_kernel",
        "LANEFS_TEST_STATX",
        p,
    );
    let text = stdout_of_success(&out);
    let channel: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("statx "))
        .collect();
    assert_eq!(
        channel, kernel,
        "the channel's statx (left), the kernel's (right)"
    );
    assert!(
        m.channel_requests() - before >= NAMES.len() as u64,
        "the calls went over the channel"
    );
    // Again through the kernel, after the channel's calls: nothing moved.
    assert_eq!(statx_lines(p, &NAMES), kernel);
}

/// The child part of [`late_calls_raw_forks_and_statx_arguments_under_lanefs_run`], run
/// under `lanefs run` in `dir`: its libc calls reach the preloaded client.
fn late_calls_child(dir: &Path) {
    let c = |s: &str| CString::new(dir.join(s).as_os_str().as_bytes()).unwrap();
    // A first call over the channel, so that the thread has one when it forks.
    // SAFETY: valid C strings; plain system call wrappers.
    unsafe {
        let fd = libc::open(c("made").as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
        assert!(fd >= 0, "create: {}", std::io::Error::last_os_error());
        libc::close(fd);
    }
    // A fork that runs no pthread_atfork handler (as glibc's _Fork, or a raw fork): the
    // child's calls must not touch the parent's channel, which it does not have.
    // SAFETY: a fork by clone(SIGCHLD); the child makes one call and exits at once.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
    if pid == 0 {
        // SAFETY: as above.
        let r = unsafe { libc::mkdir(c("by-raw-fork").as_ptr(), 0o755) };
        // SAFETY: leaving the child at once.
        unsafe { libc::_exit(if r == 0 { 0 } else { 3 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    println!("\nraw fork status {status}");
    // statx arguments the kernel refuses, refused the same way over the channel.
    // SAFETY: statx is plain old data; all-zero is valid.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let sync = libc::AT_STATX_FORCE_SYNC | libc::AT_STATX_DONT_SYNC;
    for (flags, mask) in [(0, 0x8000_0000u32), (sync, libc::STATX_BASIC_STATS)] {
        // SAFETY: a valid C string and a writable struct statx.
        let r = unsafe { libc::statx(libc::AT_FDCWD, c("made").as_ptr(), flags, mask, &mut sx) };
        let e = std::io::Error::last_os_error().raw_os_error();
        println!("\nstatx {flags:#x} {mask:#x}: {r} {e:?}");
    }
    // A call from an atexit handler, which runs after this thread's thread-locals (the
    // client's channels among them) are gone: through the kernel, not an abort.
    extern "C" fn at_exit() {
        let p = std::env::var("LANEFS_TEST_LATE").unwrap() + "/made";
        let p = CString::new(p).unwrap();
        // SAFETY: a valid C string.
        unsafe { libc::unlink(p.as_ptr()) };
    }
    // SAFETY: registering a function that only unlinks a file.
    unsafe { libc::atexit(at_exit) };
}

/// A call made from an `atexit` handler (after the thread's channels were dropped: `git gc`
/// aborted there), a fork that runs no `pthread_atfork` handler (a raw `fork`, glibc's
/// `_Fork`; its child crashed on the parent's channel), and `statx` arguments the kernel
/// refuses (EINVAL over the channel as through the kernel).
#[test]
fn late_calls_raw_forks_and_statx_arguments_under_lanefs_run() {
    if let Ok(dir) = std::env::var("LANEFS_TEST_LATE") {
        late_calls_child(Path::new(&dir));
        return;
    }
    if !needs_root("late_calls_raw_forks_and_statx_arguments_under_lanefs_run") {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    let out = child_under_run(
        "late_calls_raw_forks_and_statx_arguments_under_lanefs_run",
        "LANEFS_TEST_LATE",
        p,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{text}{err}", out.status);
    assert!(
        text.contains("raw fork status 0"),
        "the raw fork's child: {text}{err}"
    );
    assert!(p.join("by-raw-fork").is_dir());
    let einval = Some(libc::EINVAL);
    assert!(
        text.contains(&format!("statx 0x0 0x80000000: -1 {einval:?}")),
        "{text}"
    );
    let sync = libc::AT_STATX_FORCE_SYNC | libc::AT_STATX_DONT_SYNC;
    assert!(
        text.contains(&format!("statx {sync:#x} 0x7ff: -1 {einval:?}")),
        "{text}"
    );
    assert!(!p.join("made").exists(), "the atexit handler's unlink");
}

/// What the mount table says beyond the filesystem: a read-only or `nosymfollow` bind mount
/// of a lanefs mount is enforced under `lanefs run` as through the kernel, and a lanefs
/// mount covered by a later mount on a directory above it is not reached.
#[test]
fn bind_mount_flags_and_covered_mounts_under_lanefs_run() {
    if !needs_root("bind_mount_flags_and_covered_mounts_under_lanefs_run") {
        return;
    }
    let m = Mnt::new("");
    let outer = tempfile::tempdir().unwrap();
    let (ro, nosym, anc) = (
        outer.path().join("ro"),
        outer.path().join("nosym"),
        outer.path().join("anc"),
    );
    let sh = |script: &str| {
        under_run("sh")
            .arg("-c")
            .arg(script)
            .env("M", m.path())
            .env("RO", &ro)
            .env("NOSYM", &nosym)
            .env("ANC", &anc)
            .output()
            .unwrap()
    };
    let set_up = Command::new("sh")
        .arg("-c")
        .arg(
            "set -e; mkdir \"$RO\" \"$NOSYM\" \"$ANC\" \"$ANC/m\" \"$M/dir\"; \
             ln -s dir \"$M/link\"; touch \"$M/dir/f\"; \
             mount --bind \"$M\" \"$RO\"; mount -o remount,bind,ro \"$RO\"; \
             mount --bind \"$M\" \"$NOSYM\"",
        )
        .env("M", m.path())
        .env("RO", &ro)
        .env("NOSYM", &nosym)
        .env("ANC", &anc)
        .output()
        .unwrap();
    let undo = || {
        for d in [&anc.join("m"), &anc, &ro, &nosym] {
            umount2(d, libc::MNT_DETACH);
        }
    };
    if !set_up.status.success() {
        undo();
        panic!("set-up: {}", String::from_utf8_lossy(&set_up.stderr));
    }
    // `nosymfollow` needs Linux 5.10 and a mount(8) that knows it (util-linux 2.36).
    let nosymfollow = Command::new("mount")
        .args(["-o", "remount,bind,nosymfollow"])
        .arg(&nosym)
        .status()
        .unwrap()
        .success();
    let out = sh(
        "touch \"$RO/new\" 2>&1; mkdir \"$RO/d\" 2>&1; rm \"$RO/dir/f\" 2>&1; \
         stat -c %n \"$NOSYM/link/f\" 2>&1; touch \"$NOSYM/link/g\" 2>&1; true",
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // A lanefs mount at ANC/m, then a tmpfs over ANC: the lanefs mount is hidden.
    let hidden = Command::new(BIN)
        .args(["mount", "--background"])
        .arg(anc.join("m"))
        .status()
        .unwrap();
    let covered = hidden.success()
        && Command::new("sh")
            .arg("-c")
            .arg("touch \"$ANC/m/under\" && mount -t tmpfs tmpfs \"$ANC\"")
            .env("ANC", &anc)
            .status()
            .unwrap()
            .success();
    let hidden_text = covered.then(|| {
        let o = sh("stat -c %n \"$ANC/m/under\" 2>&1; mkdir \"$ANC/m/new\" 2>&1; true");
        String::from_utf8_lossy(&o.stdout).into_owned()
    });
    // Taken down in order: the tmpfs first, then the lanefs mount it hid.
    umount2(&anc, libc::MNT_DETACH);
    undo();
    assert_eq!(
        text.matches("Read-only file system").count(),
        3,
        "touch, mkdir and rm through the read-only bind mount: {text}"
    );
    assert!(!m.path().join("new").exists() && m.path().join("dir/f").exists());
    if nosymfollow {
        assert_eq!(
            text.matches("Too many levels of symbolic links").count(),
            2,
            "stat and touch through a symlink on the nosymfollow mount: {text}"
        );
        assert!(!m.path().join("dir/g").exists());
    } else {
        eprintln!("no nosymfollow mounts here: that part is not checked");
    }
    let hidden_text = hidden_text.expect("the covered mount was set up");
    assert_eq!(
        hidden_text.matches("No such file or directory").count(),
        2,
        "stat and mkdir in a lanefs mount a tmpfs covers: {hidden_text}"
    );
}

/// A directory renamed under `lanefs run` while a process works inside it: the kernel
/// moves it (the channel could only drop its cached name), so the process's working
/// directory keeps a path, and its relative creates land where it is, in the renamed
/// directory, not in a new directory made at the old path.
#[test]
fn a_directory_renamed_under_a_working_directory_keeps_its_path() {
    if !needs_root("a_directory_renamed_under_a_working_directory_keeps_its_path") {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    std::fs::create_dir_all(p.join("w/a/b")).unwrap();
    let out = under_run("sh")
        .arg("-c")
        .arg(
            "cd \"$M/w/a/b\" && mv \"$M/w/a\" \"$M/w/a2\" && mkdir -p \"$M/w/a/b\" && \
             touch new && mkdir newdir && pwd -P",
        )
        .env("M", p)
        .output()
        .unwrap();
    let text = stdout_of_success(&out);
    assert_eq!(text.trim(), p.join("w/a2/b").to_str().unwrap());
    assert!(p.join("w/a2/b/new").is_file() && p.join("w/a2/b/newdir").is_dir());
    assert_eq!(names(&p.join("w/a/b")), Vec::<String>::new());
}

/// Capabilities, not the uid, decide, as in the kernel: a root that dropped
/// `CAP_DAC_OVERRIDE` is refused what the kernel refuses it under `lanefs run`, and a user
/// granted it (and `CAP_FOWNER`) may, under `lanefs run` and through the mount alike, what
/// the kernel lets it (the engine checks again after the kernel, and refused it). And a
/// create whose open then fails leaves no file (the kernel's `open(O_CREAT)` makes none).
#[test]
fn dropped_capabilities_and_failed_creates_under_lanefs_run() {
    if !needs_root("dropped_capabilities_and_failed_creates_under_lanefs_run")
        || !has("setpriv")
        || !has("python3")
    {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    std::fs::create_dir(p.join("other")).unwrap();
    std::fs::set_permissions(p.join("other"), PermissionsExt::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(p.join("other"), Some(65534), Some(65534)).unwrap();
    let out = Command::new("setpriv")
        .args([
            "--bounding-set=-dac_override,-dac_read_search,-fowner",
            "--inh-caps=-all",
        ])
        .arg(BIN)
        .args(["run", "--", "sh", "-c"])
        .arg("mkdir \"$M/other/x\" 2>&1; true")
        .env("M", p)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Permission denied"), "{text}{out:?}");
    assert!(!p.join("other/x").exists());
    std::fs::write(p.join("roots"), b"").unwrap();
    for (i, client) in [false, true].into_iter().enumerate() {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "--inh-caps=+dac_override,+fowner",
            "--ambient-caps=+dac_override,+fowner",
        ]);
        if client {
            cmd.arg(BIN).args(["run", "--"]);
        }
        let out = cmd
            .args(["sh", "-c"])
            .arg(format!(
                "mkdir \"$M/other/by-cap{i}\" && chmod 604 \"$M/roots\" && echo done"
            ))
            .env("M", p)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.trim(), "done", "client {client}: {out:?}");
        assert!(p.join(format!("other/by-cap{i}")).is_dir());
    }
    let script = r#"
import os, resource, sys
M = sys.argv[1]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    os.open(f"{M}/no-fd-left", os.O_CREAT | os.O_WRONLY, 0o644)
    print("created")
except OSError as e:
    print(e.errno)
"#;
    let out = python_under_run(script, p);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), libc::EMFILE.to_string(), "{out:?}");
    assert!(
        !p.join("no-fd-left").exists(),
        "the failed create left its file"
    );
}

/// The child part of [`threads_own_credentials_namespaces_and_signals_under_lanefs_run`],
/// run under `lanefs run` in `dir` as root.
fn own_credentials_child(dir: &Path) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let c = |s: &str| CString::new(dir.join(s).as_os_str().as_bytes()).unwrap();
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // 1. A signal handler's calls, while the interrupted call is in flight, go through the
    // kernel: never into the interrupted call's channel (whose reply one then got).
    static LINK: std::sync::OnceLock<CString> = std::sync::OnceLock::new();
    LINK.set(c("lnk")).unwrap();
    // SAFETY: valid C strings.
    unsafe { libc::symlink(c"target".as_ptr(), c("lnk").as_ptr()) };
    extern "C" fn on_alarm(_: libc::c_int) {
        let mut b = [0u8; 64];
        let p = LINK.get().unwrap();
        // SAFETY: readlink into our buffer; async-signal-safe.
        unsafe {
            libc::readlink(p.as_ptr(), b.as_mut_ptr().cast(), b.len());
            libc::readlink(p.as_ptr(), b.as_mut_ptr().cast(), b.len());
        }
    }
    let wrong = AtomicU64::new(0);
    // SAFETY: installing a handler that makes only async-signal-safe calls; a 200 µs timer.
    unsafe {
        libc::signal(libc::SIGALRM, on_alarm as *const () as libc::sighandler_t);
        let t = libc::timeval {
            tv_sec: 0,
            tv_usec: 200,
        };
        let it = libc::itimerval {
            it_interval: t,
            it_value: t,
        };
        libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut());
    }
    let d = c("d");
    for _ in 0..3000 {
        // SAFETY: valid C strings, a writable stat.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::mkdir(d.as_ptr(), 0o755) == 0
                && (libc::lstat(d.as_ptr(), &mut st) != 0
                    || st.st_mode & libc::S_IFMT != libc::S_IFDIR)
            {
                wrong.fetch_add(1, Relaxed);
            }
            if libc::rmdir(d.as_ptr()) != 0 && errno() != libc::EINTR {
                wrong.fetch_add(1, Relaxed);
            }
        }
    }
    // SAFETY: stopping the timer.
    unsafe {
        let zero: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_REAL, &zero, std::ptr::null_mut());
    }
    println!("\nsignal anomalies {}", wrong.load(Relaxed));
    // 2. A thread's own credentials: a raw setresuid in one thread, setfsuid in another.
    let r = c("r/by-thread");
    let raw = std::thread::spawn(move || {
        // SAFETY: a raw system call on this thread's credentials alone.
        unsafe { libc::syscall(libc::SYS_setresuid, 1000, 1000, 1000) };
        // SAFETY: a valid C string.
        let ok = unsafe { libc::mkdir(r.as_ptr(), 0o755) } == 0;
        if ok { 0 } else { errno() }
    });
    println!("\nraw thread mkdir {}", raw.join().unwrap());
    let f = c("open/fs");
    let fs = std::thread::spawn(move || {
        // SAFETY: this thread's fs uid alone.
        unsafe { libc::setfsuid(1000) };
        // SAFETY: a valid C string.
        unsafe { libc::mkdir(f.as_ptr(), 0o755) }
    });
    println!("\nsetfsuid thread mkdir {}", fs.join().unwrap());
    // 3. A switch among a process's own ids by raw system calls, in a child.
    // SAFETY: fork; the child makes calls and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: raw system calls on the child's credentials; valid C strings.
        let code = unsafe {
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
            libc::syscall(libc::SYS_setresgid, 1000, 1000, 1000);
            libc::syscall(libc::SYS_setresuid, 1000, 65534, 65534);
            libc::mkdir(c("open/as-65534").as_ptr(), 0o755);
            libc::syscall(libc::SYS_setresuid, 1000, 1000, 1000);
            if libc::mkdir(c("priv/x").as_ptr(), 0o755) == 0 {
                0
            } else {
                errno()
            }
        };
        // SAFETY: leaving the child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    println!("\nswitched ids mkdir {}", libc::WEXITSTATUS(status));
}

/// Credentials are a thread's own and the kernel's user namespace maps them: under `lanefs
/// run`, a thread that made a raw `setresuid` or a `setfsuid` is served with its own ids;
/// a process that switched among its ids by raw system calls is served with the new ones;
/// a process in another user namespace (`unshare -r`) is refused the channel, and the
/// kernel maps it. And a signal handler's calls never take the reply of the call they
/// interrupted.
#[test]
fn threads_own_credentials_namespaces_and_signals_under_lanefs_run() {
    let test = "threads_own_credentials_namespaces_and_signals_under_lanefs_run";
    if let Ok(dir) = std::env::var("LANEFS_TEST_CREDS") {
        own_credentials_child(Path::new(&dir));
        return;
    }
    if !needs_root(test) {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    let dirs = [
        ("r", 0o755, 0),
        ("open", 0o1777, 0),
        ("priv", 0o700, 65534),
        ("u", 0o755, 1000),
    ];
    for (d, mode, owner) in dirs {
        std::fs::create_dir(p.join(d)).unwrap();
        std::fs::set_permissions(p.join(d), PermissionsExt::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(p.join(d), Some(owner), Some(owner)).unwrap();
    }
    let out = child_under_run(test, "LANEFS_TEST_CREDS", p);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{err}");
    let eacces = libc::EACCES;
    for want in [
        "signal anomalies 0".to_string(),
        format!("raw thread mkdir {eacces}"),
        "setfsuid thread mkdir 0".to_string(),
        format!("switched ids mkdir {eacces}"),
    ] {
        assert!(text.contains(&want), "{want}: {text}{err}");
    }
    assert!(!p.join("r/by-thread").exists() && !p.join("priv/x").exists());
    assert_eq!(std::fs::metadata(p.join("open/fs")).unwrap().uid(), 1000);
    if has("unshare") {
        // Root mapped to root in a new user namespace has no capability over the mount's
        // files, so another user's directory refuses it (EACCES).
        let out = under_run("unshare")
            .args(["-r", "sh", "-c", "mkdir \"$M/u/ns\" 2>&1; true"])
            .env("M", p)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // Where user namespaces are not allowed, unshare itself fails (on its stderr): the
        // case cannot arise there.
        if out.status.success() {
            assert!(text.contains("Permission denied"), "{text}{out:?}");
            assert!(!p.join("u/ns").exists());
        } else {
            eprintln!("{test}: no user namespace here: {out:?}");
        }
    }
}

/// `stat` of `path` through whatever serves this process's libc calls: (inode, mode) or the
/// errno.
fn libc_stat(path: &Path) -> Result<(u64, u32), i32> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a zeroed struct stat is valid; `c` is a valid C string.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `st` is writable.
    if unsafe { libc::stat(c.as_ptr(), &mut st) } == 0 {
        Ok((st.st_ino, st.st_mode))
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

/// The child part of [`warm_stats_go_through_the_kernel_and_stay_right`], under `lanefs run`
/// in `dir`: every step's `stat` is checked against what the step made.
fn warm_stats_child(dir: &Path) {
    let (f, g) = (dir.join("f"), dir.join("g"));
    let create = |p: &Path| {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644) };
        assert!(fd >= 0, "create {}", p.display());
        // SAFETY: a valid C string and a writable struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `st` is writable.
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(fd) };
        st.st_ino
    };
    let ino = create(&f);
    for _ in 0..200 {
        assert_eq!(libc_stat(&f).map(|s| s.0), Ok(ino));
    }
    let c = CString::new(f.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::chmod(c.as_ptr(), 0o600) }, 0);
    assert_eq!(libc_stat(&f), Ok((ino, libc::S_IFREG | 0o600)));
    // The kernel's cached attributes, stale or not, are not what AT_STATX_DONT_SYNC gets.
    for _ in 0..2 {
        // SAFETY: a zeroed struct statx is valid.
        let mut sx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a writable struct.
        let r = unsafe {
            libc::statx(
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::AT_STATX_DONT_SYNC,
                libc::STATX_BASIC_STATS,
                &mut sx,
            )
        };
        assert_eq!((r, u32::from(sx.stx_mode)), (0, libc::S_IFREG | 0o600));
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::unlink(c.as_ptr()) }, 0);
    assert_eq!(libc_stat(&f), Err(libc::ENOENT));
    let again = create(&f);
    assert_eq!(libc_stat(&f).map(|s| s.0), Ok(again));
    assert_eq!(libc_stat(&f).map(|s| s.0), Ok(again));
    let cg = CString::new(g.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::rename(c.as_ptr(), cg.as_ptr()) }, 0);
    assert_eq!(libc_stat(&f), Err(libc::ENOENT));
    assert_eq!(libc_stat(&g).map(|s| s.0), Ok(again));
    assert_eq!(libc_stat(&g).map(|s| s.0), Ok(again));
    println!("\nwarm stats checked");
}

/// With `LANEFS_RUN_WARM_STAT=1` (`lanefs run --warm-stat`), a `stat` of a name the kernel
/// holds goes through the kernel (its caches answer it without a round trip to the server,
/// faster than the channel), and what it answers stays right while the names change over
/// the channel: a chmod, an unlink, a new file under the old name, a rename. Without it,
/// every stat goes over the channel.
#[test]
fn warm_stats_go_through_the_kernel_and_stay_right() {
    if let Ok(dir) = std::env::var("LANEFS_TEST_WARM_STATS") {
        warm_stats_child(Path::new(&dir));
        return;
    }
    if !needs_root("warm_stats_go_through_the_kernel_and_stay_right") {
        return;
    }
    let m = Mnt::new("");
    let child = |warm: bool| {
        let mut c = child_command(
            "warm_stats_go_through_the_kernel_and_stay_right",
            "LANEFS_TEST_WARM_STATS",
            m.path(),
        );
        if warm {
            c.env("LANEFS_RUN_WARM_STAT", "1");
        }
        c.output().unwrap()
    };
    // By default every stat goes over the channel.
    let before = m.channel_requests();
    let out = child(false);
    assert!(out.status.success(), "{out:?}");
    let served = m.channel_requests() - before;
    assert!(
        served >= 208,
        "{served} requests over the channel for 208 stats"
    );
    std::fs::remove_file(m.path().join("g")).unwrap();
    let before = m.channel_requests();
    let out = child(true);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("warm stats checked"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The two creates, the first stat of each name, the chmod, unlink and rename, and the
    // stats after the unlink and rename: far fewer than the 208 stats made.
    let served = m.channel_requests() - before;
    assert!(
        (5..60).contains(&served),
        "{served} requests over the channel for 208 stats and 6 changes"
    );
    // What the child left, through the kernel.
    assert!(!m.path().join("f").exists());
    assert_eq!(
        std::fs::metadata(m.path().join("g")).unwrap().ino(),
        std::fs::metadata(m.path().join("g")).unwrap().ino()
    );
}

/// The child part of [`deferred_descriptors_under_threads_and_forks`], run under `lanefs
/// run` in `dir`. Eight threads each make files over and over, each file in one of four
/// ways, and check every step: created and closed at once (the kernel never opens it),
/// fsynced and closed (over the channel too), written and read back (the descriptor is
/// opened through the kernel at its first use), and unlinked while open by this process
/// (kept readable). Every tenth round forks with a file just created: the child writes
/// through the inherited descriptor, the parent after it; they share one offset. Prints
/// the names each thread kept.
fn deferred_child(dir: &Path) {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o022) };
    let rounds = 150;
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for r in 0..rounds {
                    let p = dir.join(format!("t{t}-{r}"));
                    let open = |flags: i32| {
                        // SAFETY: a valid C string.
                        let fd = unsafe { libc::open(c(&p).as_ptr(), flags, 0o640) };
                        assert!(fd >= 0, "{p:?}: {}", std::io::Error::last_os_error());
                        // SAFETY: a descriptor just opened, owned by the File from now on.
                        unsafe { std::fs::File::from_raw_fd(fd) }
                    };
                    let excl = libc::O_CREAT | libc::O_EXCL;
                    match r % 4 {
                        0 => drop(open(excl | libc::O_WRONLY)),
                        1 => {
                            let f = open(excl | libc::O_WRONLY | libc::O_CLOEXEC);
                            f.sync_all().unwrap();
                            f.sync_data().unwrap();
                        }
                        2 => {
                            let mut f = open(excl | libc::O_RDWR);
                            f.write_all(format!("{t}-{r}").as_bytes()).unwrap();
                            f.seek(SeekFrom::Start(0)).unwrap();
                            let mut back = String::new();
                            f.read_to_string(&mut back).unwrap();
                            assert_eq!(back, format!("{t}-{r}"));
                            assert_eq!(f.metadata().unwrap().len(), back.len() as u64);
                        }
                        _ => {
                            let mut f = open(excl | libc::O_RDWR);
                            std::fs::remove_file(&p).unwrap();
                            f.write_all(b"gone").unwrap();
                            f.seek(SeekFrom::Start(0)).unwrap();
                            let mut back = String::new();
                            f.read_to_string(&mut back).unwrap();
                            assert_eq!(back, "gone", "{p:?} unlinked while open");
                            assert_eq!(f.metadata().unwrap().nlink(), 0);
                            continue;
                        }
                    }
                    if r % 10 == 5 {
                        let q = dir.join(format!("fork{t}-{r}"));
                        let mut f = {
                            // SAFETY: a valid C string.
                            let fd =
                                unsafe { libc::open(c(&q).as_ptr(), excl | libc::O_WRONLY, 0o600) };
                            assert!(fd >= 0);
                            // SAFETY: as above.
                            unsafe { std::fs::File::from_raw_fd(fd) }
                        };
                        // SAFETY: the child writes and exits at once, touching no lock.
                        let pid = unsafe { libc::fork() };
                        if pid == 0 {
                            // SAFETY: a write of a static buffer, then _exit.
                            unsafe {
                                let ok = libc::write(f.as_raw_fd(), b"child ".as_ptr().cast(), 6);
                                libc::_exit(if ok == 6 { 0 } else { 1 });
                            }
                        }
                        let mut status = 0;
                        // SAFETY: waiting for our own child.
                        unsafe { libc::waitpid(pid, &mut status, 0) };
                        assert_eq!(status, 0, "the child's write");
                        f.write_all(b"parent").unwrap();
                        drop(f);
                        assert_eq!(std::fs::read(&q).unwrap(), b"child parent", "one offset");
                        std::fs::remove_file(&q).unwrap();
                    }
                }
            });
        }
    });
    deferred_edges(dir);
    println!("deferred done");
}

/// The single-threaded cases of [`deferred_child`], each a way a program uses a new file's
/// descriptor that the first use must survive.
fn deferred_edges(dir: &Path) {
    let c = |n: &str| CString::new(dir.join(n).as_os_str().as_bytes()).unwrap();
    let create = |n: &str, flags: i32| {
        // SAFETY: a valid C string.
        let fd = unsafe { libc::open(c(n).as_ptr(), libc::O_CREAT | libc::O_EXCL | flags, 0o644) };
        assert!(fd >= 0, "{n}: {}", std::io::Error::last_os_error());
        fd
    };
    let write = |fd: i32, b: &[u8]| {
        // SAFETY: a write of a live buffer.
        let r = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        assert_eq!(r, b.len() as isize, "{}", std::io::Error::last_os_error());
    };
    let in_child = |f: &dyn Fn() -> bool| {
        // SAFETY: the child runs `f` and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: exiting the child.
            unsafe { libc::_exit(if f() { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        status == 0
    };
    // Standard output reopened on a new file: the C library writes it with its own system
    // calls, so descriptors 0 to 2 are never deferred.
    assert!(in_child(&|| {
        // SAFETY: closing stdout, then a printf and a flush through the C library.
        unsafe {
            libc::close(1);
            let fd = libc::open(c("stdout").as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
            libc::printf(c"to stdout\n".as_ptr());
            libc::fflush(std::ptr::null_mut());
            fd == 1
        }
    }));
    assert_eq!(std::fs::read(dir.join("stdout")).unwrap(), b"to stdout\n");
    // A failed dup2 onto it, and close_range's close-on-exec.
    let fd = create("dupfail", libc::O_WRONLY);
    // SAFETY: dup2 of a number that is not open fails and changes nothing.
    assert_eq!(unsafe { libc::dup2(60_999, fd) }, -1);
    let cloexec = libc::CLOSE_RANGE_CLOEXEC as i32;
    // SAFETY: marks one descriptor close-on-exec.
    let r = unsafe { libc::close_range(fd as u32, fd as u32, cloexec) };
    assert_eq!(r, 0);
    write(fd, b"kept");
    // SAFETY: reads the descriptor's flags.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFD) }, libc::FD_CLOEXEC);
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
    assert_eq!(std::fs::read(dir.join("dupfail")).unwrap(), b"kept");
    // Opened again through /proc/self/fd: the file, not the placeholder.
    let fd = create("proc", libc::O_RDWR);
    let again = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
    // SAFETY: a valid C string.
    let fd2 = unsafe { libc::open(again.as_ptr(), libc::O_WRONLY) };
    assert!(fd2 >= 0);
    write(fd2, b"via proc");
    // SAFETY: closing our descriptors.
    unsafe { (libc::close(fd), libc::close(fd2)) };
    assert_eq!(std::fs::read(dir.join("proc")).unwrap(), b"via proc");
    // A POSIX record lock taken through another descriptor of the file stays while the
    // deferred one is first used (settling closes a descriptor of the file, which would drop
    // it) and goes when the deferred one is closed (as closing any descriptor of it does).
    let fd = create("locked", libc::O_RDWR);
    let other = CString::new(dir.join("locked").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    let fd2 = unsafe { libc::open(other.as_ptr(), libc::O_RDWR) };
    assert!(fd2 >= 0);
    let lock = |fd: i32, cmd: i32, kind: i32| {
        // SAFETY: a zeroed flock is a valid argument.
        let mut l: libc::flock = unsafe { std::mem::zeroed() };
        l.l_type = kind as i16;
        l.l_whence = libc::SEEK_SET as i16;
        // SAFETY: fcntl with a live flock.
        let r = unsafe { libc::fcntl(fd, cmd, &mut l) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        l.l_type as i32
    };
    lock(fd2, libc::F_SETLK, libc::F_WRLCK);
    write(fd, b"under lock");
    let held_in_child = |fd: i32| {
        in_child(&|| {
            // SAFETY: a zeroed flock is a valid argument.
            let mut l: libc::flock = unsafe { std::mem::zeroed() };
            l.l_type = libc::F_WRLCK as i16;
            // SAFETY: fcntl with a live flock, in the child.
            unsafe {
                libc::fcntl(fd, libc::F_GETLK, &mut l) == 0 && l.l_type != libc::F_UNLCK as i16
            }
        })
    };
    assert!(
        held_in_child(fd2),
        "the lock went when the deferred descriptor was first used"
    );
    // SAFETY: closing our descriptors.
    unsafe { (libc::close(fd), libc::close(fd2)) };
    let fd3 = create("locked2", libc::O_RDWR);
    // SAFETY: a valid C string.
    let fd4 = unsafe { libc::open(c("locked2").as_ptr(), libc::O_RDWR) };
    lock(fd4, libc::F_SETLK, libc::F_WRLCK);
    // SAFETY: closing the other descriptor, never used.
    unsafe { libc::close(fd3) };
    assert!(
        !held_in_child(fd4),
        "the lock stayed when a descriptor of the file was closed"
    );
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd4) };
    let _ = lock;
    // Privileges dropped, and the file locked down, before the first write: the file was
    // opened with the credentials that made it, as the kernel's open(O_CREAT) does.
    let open_dir = dir.join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(
        in_child(&|| {
            // SAFETY: plain system call wrappers on valid C strings.
            unsafe {
                let log = libc::open(c("log").as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600);
                let ok = libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(65534, 65534, 65534) == 0
                    && libc::setresuid(65534, 65534, 65534) == 0;
                let mine = libc::open(
                    c("open/mine").as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY,
                    0o644,
                );
                let locked = libc::chmod(c("open/mine").as_ptr(), 0) == 0;
                ok && locked
                    && libc::write(log, b"root's".as_ptr().cast(), 6) == 6
                    && libc::write(mine, b"nobody's".as_ptr().cast(), 8) == 8
            }
        }),
        "writes after the privileges or the mode changed"
    );
    assert_eq!(std::fs::read(dir.join("log")).unwrap(), b"root's");
    assert_eq!(std::fs::read(dir.join("open/mine")).unwrap(), b"nobody's");
}

/// Deferred descriptors (a file created over the channel is opened through the kernel at
/// its first use, `client/src/fds.rs`) under eight threads and forks: every file has the
/// contents, size, link count and mode its thread gave it, through the mount too, and the
/// directory holds exactly the files kept.
#[test]
fn deferred_descriptors_under_threads_and_forks() {
    if let Ok(dir) = std::env::var("LANEFS_TEST_DEFERRED") {
        deferred_child(Path::new(&dir));
        return;
    }
    if !needs_root("deferred_descriptors_under_threads_and_forks") {
        return;
    }
    let m = Mnt::new("");
    let p = m.path();
    let out = child_under_run(
        "deferred_descriptors_under_threads_and_forks",
        "LANEFS_TEST_DEFERRED",
        p,
    );
    let text = stdout_of_success(&out);
    assert!(text.contains("deferred done"), "{text}");
    let mut want = Vec::new();
    for t in 0..8 {
        for r in (0..150).filter(|r| r % 4 != 3) {
            want.push(format!("t{t}-{r}"));
            let meta = std::fs::metadata(p.join(format!("t{t}-{r}"))).unwrap();
            assert_eq!(meta.mode() & 0o777, 0o640, "t{t}-{r}");
            let size = if r % 4 == 2 {
                format!("{t}-{r}").len() as u64
            } else {
                0
            };
            assert_eq!((meta.len(), meta.nlink()), (size, 1), "t{t}-{r}");
        }
    }
    want.extend(
        [
            "dupfail", "locked", "locked2", "log", "open", "proc", "stdout",
        ]
        .map(String::from),
    );
    want.sort();
    assert_eq!(names(p), want);
    assert!(m.channel_requests() > 8 * 150);
}
