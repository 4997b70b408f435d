//! Running out of space (commit.rs, "Errors"): changes are refused with ENOSPC before they
//! show, those that free space excepted; records taken but not written are held, `fsync`
//! reports ENOSPC meanwhile, and once there is room again the held records are written and
//! the store goes on; a reopen, or the disk a power cut leaves at any point, holds every
//! change an fsync acknowledged and a prefix of the rest.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lanefs::{Client, Config, OpenOptions};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Options, open};

const SEG: u64 = 64 << 10;

fn sim(disk: &SimDisk, interval: Duration) -> Options {
    Options {
        disk: Arc::new(disk.clone()),
        segment_size: SEG,
        commit_interval: interval,
        ..Options::default()
    }
}

#[track_caller]
fn enospc<T: std::fmt::Debug>(r: std::io::Result<T>) {
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}"),
        Ok(v) => panic!("expected ENOSPC, got {v:?}"),
    }
}

/// Waits until the segment after the first is made (off the hot path, after open); fails
/// after [`LIMIT`].
fn wait_for_spare(disk: &SimDisk) {
    let t = Instant::now();
    while disk.used() < 2 * SEG {
        assert!(t.elapsed() < LIMIT, "no spare segment");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A store on `disk` holding `/kept` ("durable", synced) and an empty `/big`, whose disk is
/// then full: its current segment and the spare are all the room there is. No round runs
/// unless someone syncs (or a record is held: then every `RETRY`).
fn full_store(disk: &SimDisk) -> (lanefs_store::StoreHandle, Client) {
    let o = open(
        Path::new("/s"),
        Config::default(),
        sim(disk, Duration::from_secs(3600)),
    )
    .unwrap();
    let c = Client::root(Arc::new(o.fs));
    c.write("/kept", b"durable").unwrap();
    c.write("/big", b"").unwrap();
    sync(&c).unwrap();
    wait_for_spare(disk);
    disk.set_space(Some(disk.used()));
    (o.store, c)
}

/// The longest these tests wait for something that takes milliseconds, or seconds of
/// checkpoints (room given back): only so that a test that would wait for good fails, even on
/// a loaded machine, where the waits take longer but never decide a run.
const LIMIT: Duration = Duration::from_secs(300);

/// Retries `f` while it fails with ENOSPC, for up to [`LIMIT`] (the committer notices
/// returned space within a round or two).
#[track_caller]
fn eventually<T>(mut f: impl FnMut() -> std::io::Result<T>) -> T {
    let t = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                assert!(t.elapsed() < LIMIT, "still ENOSPC");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn sync(c: &Client) -> std::io::Result<()> {
    Ok(c.fs().sync_all()?)
}

/// What a test expects of a store's tree.
struct Expect {
    /// Names that must be there (acknowledged by an fsync).
    present: Vec<String>,
    /// Names that must not be (their removal was acknowledged, or they were refused).
    absent: Vec<String>,
    /// The contents of `/big`.
    big: Vec<u8>,
}

fn check(c: &Client, x: &Expect) {
    assert_eq!(c.read("/kept").unwrap(), b"durable");
    for p in &x.present {
        assert!(c.exists(p), "{p} is missing");
    }
    for p in &x.absent {
        assert!(!c.exists(p), "{p} is there");
    }
    assert_eq!(c.read("/big").unwrap(), x.big);
    c.fs().check_invariants().unwrap();
}

/// Opens `disk` (a crash image, or the disk after a close) and checks it.
fn reopen_and_check(disk: &SimDisk, x: &Expect) {
    let o = open(
        Path::new("/s"),
        Config::default(),
        sim(disk, Duration::from_millis(5)),
    )
    .unwrap();
    let c = Client::root(Arc::new(o.fs));
    check(&c, x);
}

/// The store runs low (the next segment cannot be made): creates, writes and mkdirs are
/// refused with ENOSPC and leave nothing visible, while every change taken is durable; unlink
/// and rmdir still work (the reserve); once space is back the store goes on, and a power
/// cut at any point keeps every acknowledged change.
#[test]
fn a_full_disk_refuses_changes_before_they_show_and_the_store_goes_on_when_space_is_back() {
    let disk = SimDisk::new();
    let o = open(
        Path::new("/s"),
        Config::default(),
        sim(&disk, Duration::from_millis(5)),
    )
    .unwrap();
    let c = Client::root(Arc::new(o.fs));
    c.write("/kept", b"durable").unwrap();
    let mut big = c
        .open(
            "/big",
            OpenOptions::new().write(true).create(true).append(true),
        )
        .unwrap();
    sync(&c).unwrap();
    wait_for_spare(&disk);
    // No segment can be made from now on: the two there are all the journal has.
    disk.set_space(Some(disk.used()));
    let mut x = Expect {
        present: vec![],
        absent: vec![],
        big: vec![],
    };
    let mut refused = [0; 3];
    for k in 0..5000 {
        if refused.iter().all(|&n| n > 0) {
            break;
        }
        let name = match k % 3 {
            0 => format!("/d{k}"),
            1 => format!("/f{k}"),
            _ => "/big".into(),
        };
        let r = match k % 3 {
            0 => c.create_dir(&name),
            1 => c
                .open(&name, OpenOptions::new().write(true).create_new(true))
                .map(drop),
            _ => big.write(&[k as u8; 2000]).map(|n| assert_eq!(n, 2000)),
        };
        match r {
            Ok(()) => {
                // What the store takes while low fits in the room left: it is durable.
                sync(&c).unwrap();
                match k % 3 {
                    2 => x.big.extend_from_slice(&[k as u8; 2000]),
                    _ => x.present.push(name),
                }
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{name}: {e}");
                refused[k % 3] += 1;
                // Nothing of the refused change shows.
                match k % 3 {
                    2 => assert_eq!(big.metadata().unwrap().len(), x.big.len() as u64),
                    _ => {
                        assert!(!c.exists(&name), "{name} was refused but is there");
                        x.absent.push(name);
                    }
                }
            }
        }
    }
    assert!(refused.iter().all(|&n| n > 0), "refused: {refused:?}");
    assert!(x.present.len() > 10 && x.big.len() > 10_000);
    // Space can be freed inside lanefs: removals are taken, and durable, from the reserve.
    let (d, f) = (x.present.remove(0), x.present.remove(0));
    c.remove_dir(&d).unwrap();
    c.remove_file(&f).unwrap();
    sync(&c).unwrap();
    x.absent.extend([d, f]);
    // Other changes are still refused.
    enospc(c.create_dir("/nope"));
    assert!(!c.exists("/nope"));
    check(&c, &x);
    // A power cut now.
    for u in [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(7)] {
        reopen_and_check(&disk.crash(u), &x);
    }
    // Space is back: the store goes on.
    disk.set_space(None);
    eventually(|| c.create_dir("/after"));
    big.write_all(b"more").unwrap();
    big.sync_all().unwrap();
    x.present.push("/after".into());
    x.big.extend_from_slice(b"more");
    check(&c, &x);
    reopen_and_check(&disk.crash(Unflushed::Lost), &x);
    drop(big);
    drop(c);
    o.store.close().unwrap();
    reopen_and_check(&disk, &x);
}

/// Records taken but not written when the journal could not grow are held, not lost: fsync
/// reports ENOSPC, changes are refused (removals excepted), a power cut leaves a prefix, and
/// once there is room the held records are written in order and the store goes on.
#[test]
fn records_held_for_lack_of_space_are_written_in_order_once_space_is_back() {
    let disk = SimDisk::new();
    let (store, c) = full_store(&disk);
    // Taken, and more than the room left in the two segments there are.
    let data = |k: usize| vec![k as u8; 4000];
    for k in 0..40 {
        c.write(format!("/f{k}"), data(k)).unwrap();
    }
    // fsync cannot make them durable.
    let f39 = c.open("/f39", OpenOptions::new().read(true)).unwrap();
    enospc(f39.sync_all());
    drop(f39);
    // Every change is refused before it shows...
    enospc(c.create_dir("/nope"));
    enospc(c.open("/nope", OpenOptions::new().write(true).create(true)));
    assert!(!c.exists("/nope"));
    let mut kept = c.open("/kept", OpenOptions::new().write(true)).unwrap();
    enospc(kept.write(b"changed"));
    drop(kept);
    assert_eq!(c.read("/kept").unwrap(), b"durable");
    // ...but a removal, which the store takes (and holds).
    c.remove_file("/f0").unwrap();
    assert!(!c.exists("/f0"));
    enospc(sync(&c));
    // A power cut now leaves a prefix of the records: files f0.. up to some point, each
    // whole but maybe the last (created, its data not yet written).
    for u in [
        Unflushed::Lost,
        Unflushed::Kept,
        Unflushed::Torn(1),
        Unflushed::Torn(2),
    ] {
        let img = disk.crash(u);
        let o = open(
            Path::new("/s"),
            Config::default(),
            sim(&img, Duration::from_millis(5)),
        )
        .unwrap();
        let c = Client::root(Arc::new(o.fs));
        c.fs().check_invariants().unwrap();
        assert_eq!(c.read("/kept").unwrap(), b"durable");
        let m = (0..40).take_while(|k| c.exists(format!("/f{k}"))).count();
        assert!(m < 40, "{u:?}: the held records cannot be there");
        for k in 0..40 {
            let got = c.read(format!("/f{k}"));
            match k {
                k if k + 1 < m => assert_eq!(got.unwrap(), data(k), "{u:?} f{k}"),
                k if k + 1 == m => {
                    let got = got.unwrap();
                    assert!(got == data(k) || got.is_empty(), "{u:?} f{k}");
                }
                _ => assert!(got.is_err(), "{u:?}: f{k} after the prefix"),
            }
        }
    }
    // Space is back: the held records are written, in order, and the store goes on.
    disk.set_space(None);
    eventually(|| sync(&c));
    eventually(|| c.create_dir("/after"));
    sync(&c).unwrap();
    let x = Expect {
        present: (1..40)
            .map(|k| format!("/f{k}"))
            .chain(["/after".into()])
            .collect(),
        absent: vec!["/f0".into(), "/nope".into()],
        big: vec![],
    };
    check(&c, &x);
    for k in 1..40 {
        assert_eq!(c.read(format!("/f{k}")).unwrap(), data(k));
    }
    reopen_and_check(&disk.crash(Unflushed::Lost), &x);
    drop(c);
    store.close().unwrap();
    reopen_and_check(&disk, &x);
}

/// Held records that still cannot be written when the store closes are reported: `close`
/// returns ENOSPC, and the store opens again with what was acknowledged.
#[test]
fn closing_with_records_held_reports_enospc() {
    let disk = SimDisk::new();
    let (store, c) = full_store(&disk);
    for k in 0..40 {
        c.write(format!("/f{k}"), vec![1; 4000]).unwrap();
    }
    enospc(sync(&c));
    drop(c);
    assert_eq!(store.close(), Err(lanefs::Errno::ENOSPC));
    disk.set_space(None);
    reopen_and_check(
        &disk,
        &Expect {
            present: vec![],
            absent: vec!["/f39".into()],
            big: vec![],
        },
    );
}

/// Unmounts a tmpfs when dropped.
struct Unmount(PathBuf);

/// A tmpfs of `size` mounted in a new temporary directory (its directory, mount point and
/// unmounter); `None`, having said why, without root or where it cannot be mounted.
fn small_tmpfs(size: &str) -> Option<(tempfile::TempDir, PathBuf, Unmount)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
        return None;
    }
    let base = tempfile::tempdir().unwrap();
    let mnt = base.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "none"])
        .arg(&mnt)
        .status();
    if !matches!(&st, Ok(s) if s.success()) {
        eprintln!("skipped: cannot mount a tmpfs at {}: {st:?}", mnt.display());
        return None;
    }
    Some((base, mnt.clone(), Unmount(mnt)))
}

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// On a real filesystem that fills up (an 8 MiB tmpfs): writes through the library end in
/// ENOSPC, a removal inside lanefs still works, and once a host file is deleted the store
/// goes on; a reopen has every acknowledged file. Needs root (to mount); skipped otherwise.
#[test]
fn a_store_on_a_full_tmpfs_goes_on_once_space_is_freed() {
    let Some((_base, mnt, _unmount)) = small_tmpfs("8m") else {
        return;
    };
    // A host file to delete later, giving space back.
    std::fs::write(mnt.join("ballast"), vec![1u8; 1 << 20]).unwrap();
    let store = mnt.join("store");
    let opts = Options {
        segment_size: 256 << 10,
        commit_interval: Duration::from_millis(5),
        ..Options::default()
    };
    let data = |k: usize| vec![(k % 251) as u8; 16 << 10];
    let o = open(&store, Config::default(), opts.clone()).unwrap();
    let c = Client::root(Arc::new(o.fs));
    let mut acked = Vec::new();
    let mut failed = None;
    for k in 0..2000 {
        let r = c.write(format!("/f{k}"), data(k)).and_then(|()| sync(&c));
        match r {
            Ok(()) => acked.push(k),
            Err(e) => {
                failed = Some((k, e));
                break;
            }
        }
    }
    let (k, e) = failed.expect("an 8 MiB tmpfs fills up");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(acked.len() > 100, "{} files before ENOSPC", acked.len());
    // The refused write left nothing (its file's create is a change of its own).
    if c.exists(format!("/f{k}")) {
        assert_eq!(c.metadata(format!("/f{k}")).unwrap().len(), 0);
    }
    // Smaller changes fit in what is left of the budget, until they do not either.
    let mut dirs = 0;
    loop {
        let d = format!("/d{dirs}");
        match c.create_dir(&d) {
            Ok(()) => dirs += 1,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                assert!(!c.exists(&d));
                break;
            }
        }
        assert!(dirs < 100_000, "mkdir is never refused");
    }
    sync(&c).unwrap();
    // Removing inside lanefs works, and is durable.
    c.remove_file("/f0").unwrap();
    sync(&c).unwrap();
    // Space comes back on the host: the store goes on.
    std::fs::remove_file(mnt.join("ballast")).unwrap();
    eventually(|| c.write(format!("/f{k}"), data(k)));
    sync(&c).unwrap();
    acked.push(k);
    for k in k + 1..k + 20 {
        c.write(format!("/f{k}"), data(k)).unwrap();
        acked.push(k);
    }
    sync(&c).unwrap();
    drop(c);
    o.store.close().unwrap();
    let o = open(&store, Config::default(), opts).unwrap();
    let c = Client::root(Arc::new(o.fs));
    assert!(!c.exists("/f0"));
    for d in 0..dirs {
        assert!(c.metadata(format!("/d{d}")).unwrap().is_dir());
    }
    for &k in &acked[1..] {
        assert_eq!(c.read(format!("/f{k}")).unwrap(), data(k), "f{k}");
    }
    c.fs().check_invariants().unwrap();
    drop(c);
    o.store.close().unwrap();
}

/// A store that fills its host filesystem with its own files, all fsynced, gets the room
/// back when they are deleted through lanefs: nothing is deleted on the host. The
/// checkpoint that must apply the records since the last one (the deleted files' writes
/// among them) fails for lack of room at first; its retry writes none of the data of files
/// that its records free, commits, and removes the segments it covers. Then the store
/// takes writes again, and a reopen has what was acknowledged.
#[test]
fn a_store_that_filled_its_tmpfs_with_files_goes_on_once_they_are_deleted() {
    let Some((_base, mnt, _unmount)) = small_tmpfs("16m") else {
        return;
    };
    let store = mnt.join("store");
    let opts = Options {
        segment_size: 1 << 20,
        commit_interval: Duration::from_millis(5),
        checkpoint_poll: Duration::from_millis(20),
        checkpoint_retry: Duration::from_millis(50),
        checkpoint_retry_max: Duration::from_millis(400),
        // No checkpoint before the journal fills the host.
        checkpoint_segments: 1000,
        ..Options::default()
    };
    let data = |k: usize| vec![(k % 251) as u8 | 1; 64 << 10];
    let o = open(&store, Config::default(), opts.clone()).unwrap();
    let c = Client::root(Arc::new(o.fs));
    c.write("/kept", b"durable").unwrap();
    let mut written = 0;
    loop {
        let r = c
            .write(format!("/f{written}"), data(written))
            .and_then(|()| sync(&c));
        match r {
            Ok(()) => written += 1,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                break;
            }
        }
        assert!(written < 1000, "a 16 MiB tmpfs never fills");
    }
    assert!(written >= 8, "{written} files of 64 KiB before ENOSPC");
    for k in 0..=written {
        match c.remove_file(format!("/f{k}")) {
            Ok(()) => {}
            Err(e) if k == written && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("unlink /f{k}: {e}"),
        }
    }
    // Room comes back only through checkpoints: a file of 64 KiB is taken and made
    // durable. (The room the deleted files had in the checkpoint's database stays in its
    // file, for the data of later checkpoints: the journal gets what the host has left.)
    let t = Instant::now();
    loop {
        match c.write("/after", data(1)).and_then(|()| sync(&c)) {
            Ok(()) => break,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                assert!(
                    t.elapsed() < LIMIT,
                    "still ENOSPC {LIMIT:?} after every file was deleted: {:?}\n{}",
                    o.store.checkpoint_status(),
                    listing(&store)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    }
    // The store goes on: small changes, and a reopen with everything acknowledged.
    for k in 0..16 {
        c.create_dir(format!("/d{k}")).unwrap();
        c.write(format!("/d{k}/small"), b"x").unwrap();
    }
    sync(&c).unwrap();
    drop(c);
    o.store.close().unwrap();
    let o = open(&store, Config::default(), opts).unwrap();
    let c = Client::root(Arc::new(o.fs));
    assert_eq!(c.read("/kept").unwrap(), b"durable");
    assert_eq!(c.read("/after").unwrap(), data(1));
    for k in 0..16 {
        assert_eq!(c.read(format!("/d{k}/small")).unwrap(), b"x", "d{k}");
    }
    for k in 0..=written {
        assert!(!c.exists(format!("/f{k}")), "f{k}");
    }
    c.fs().check_invariants().unwrap();
    drop(c);
    o.store.close().unwrap();
}

/// A store with default options that fills its host (a 64 MiB tmpfs) with files of 512 KiB
/// faster than checkpoints run, then has half of them deleted through lanefs, is not wedged:
/// the checkpoint that frees the journal's segments (copying the data of the files still live
/// in them) finds room, the held records are written, and files are taken again (a few: the
/// room the deleted files had in `checkpoint.redb` stays in that file while the store is open,
/// for later checkpoints, not for the journal). A reopen has what was acknowledged.
#[test]
fn a_store_that_filled_its_tmpfs_goes_on_once_some_files_are_deleted() {
    let Some((_base, mnt, _unmount)) = small_tmpfs("64m") else {
        return;
    };
    let store = mnt.join("store");
    let data = |k: usize| vec![(k % 251) as u8 | 1; 512 << 10];
    let o = open(&store, Config::default(), Options::default()).unwrap();
    let c = Client::root(Arc::new(o.fs));
    let mut written = 0;
    loop {
        match c.write(format!("/f{written}"), data(written)) {
            Ok(()) => written += 1,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                break;
            }
        }
        assert!(written < 1000, "a 64 MiB tmpfs never fills");
    }
    let _ = c.remove_file(format!("/f{written}"));
    let _ = sync(&c);
    // Half the host at least: the journal's segments, its spare and the checkpoint's reserve
    // take a few MiB of it.
    assert!(written >= 64, "{written} files of 512 KiB before ENOSPC");
    let deleted: Vec<usize> = (0..written).step_by(2).collect();
    for &k in &deleted {
        c.remove_file(format!("/f{k}")).unwrap();
    }
    let t = Instant::now();
    loop {
        match c.write("/after", data(7)).and_then(|()| sync(&c)) {
            Ok(()) => break,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                assert!(
                    t.elapsed() < LIMIT,
                    "no file taken {LIMIT:?} after {} of {written} were deleted: {:?}\n{}",
                    deleted.len(),
                    o.store.checkpoint_status(),
                    listing(&store)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    }
    c.create_dir("/d").unwrap();
    c.write("/d/small", b"x").unwrap();
    sync(&c).unwrap();
    drop(c);
    o.store.close().unwrap();
    let o = open(&store, Config::default(), Options::default()).unwrap();
    let c = Client::root(Arc::new(o.fs));
    for k in 0..written {
        if deleted.contains(&k) {
            assert!(!c.exists(format!("/f{k}")), "f{k}");
        } else {
            assert_eq!(c.read(format!("/f{k}")).unwrap(), data(k), "f{k}");
        }
    }
    assert_eq!(c.read("/after").unwrap(), data(7));
    assert_eq!(c.read("/d/small").unwrap(), b"x");
    c.fs().check_invariants().unwrap();
    drop(c);
    o.store.close().unwrap();
}

/// `statfs` through a store reports as available no more than its host has: a full host
/// shows none (while the filesystem's own count of free blocks is large), room given back
/// shows as it comes, and an unbounded host leaves the filesystem's count.
#[test]
fn statfs_reports_no_more_available_than_the_host_has() {
    let disk = SimDisk::new();
    let (_store, c) = full_store(&disk);
    let st = c.fs().statfs();
    assert!(st.bfree > 1000, "{st:?}");
    assert_eq!(st.bavail, 0, "{st:?}");
    disk.set_space(Some(disk.used() + (1 << 20)));
    let st = c.fs().statfs();
    // (The journal may make its next segment, SEG, meanwhile.)
    let most = (1 << 20) / 4096;
    assert!(
        st.bavail <= most && st.bavail >= most - SEG / 4096,
        "{st:?}"
    );
    disk.set_space(None);
    let st = c.fs().statfs();
    assert_eq!(st.bavail, st.bfree, "{st:?}");
}

/// `ls -lR` of `dir`, for a failure's message.
fn listing(dir: &Path) -> String {
    let out = Command::new("ls").arg("-lR").arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
