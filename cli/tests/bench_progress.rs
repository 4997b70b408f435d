//! `lanefs bench` shows where it is on a terminal (which cell, and within it the prefill,
//! the set-up, the warm-up and how much of the window or of the fixed work is done), on one
//! line of stderr rewritten in place and cleared at the end; and adds nothing where stderr is
//! not a terminal.

mod common;

use common::BIN;

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

/// A short run: one cell of crunl, and one of share-nothing.
const ARGS: [&str; 8] = [
    "bench",
    "crunl",
    "--threads",
    "1",
    "--repeat",
    "1",
    "--seconds",
    "0.3",
];

/// Runs `lanefs ARGS` with stderr on a new pseudo-terminal; returns stdout and what the
/// terminal got.
fn on_a_terminal(args: &[&str]) -> (String, String) {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: valid out-pointers; no name, termios or window size asked for.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty gave two open descriptors, each owned here once.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    // The terminal is read while the command runs (its buffer is small); the read ends with
    // EIO once the command, the slave's last holder, has exited.
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    });
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    // The Command, holding the parent's copy of the slave, is gone: only the child held it.
    let tty = reader.join().unwrap();
    assert!(status.success(), "{tty}");
    (out, tty)
}

#[test]
fn bench_shows_progress_on_a_terminal_and_nothing_elsewhere() {
    let (out, tty) = on_a_terminal(&ARGS);
    assert!(
        out.contains("crunl — one op"),
        "the report on stdout: {out}"
    );
    // Each stage of each cell, on the line rewritten in place.
    for stage in [
        "\r\x1b[K[1/2, ",
        "] crunl lanes T=1: prefilling 100000 files",
        "] crunl lanes T=1: setting up",
        "] crunl lanes T=1: warming up (0.2 s)",
        "] crunl lanes T=1: measuring, 0.3/0.3 s",
        "\r\x1b[K[2/2, ",
        "] crunl share-nothing T=1: measuring, 0.3/0.3 s",
    ] {
        assert!(tty.contains(stage), "{stage:?} in {tty:?}");
    }
    // Fixed work says how much of it is done, up to all of it.
    let (_, tty) = on_a_terminal(&[
        "bench",
        "crunl",
        "--threads",
        "2",
        "--repeat",
        "1",
        "--no-baseline",
        "--iterations",
        "5000",
    ]);
    assert!(
        tty.contains("] crunl lanes T=2: measuring, 10000/10000 operations (100%)"),
        "{tty:?}"
    );
    // The line is cleared at the end, leaving the terminal as it was.
    assert!(tty.ends_with("\r\x1b[K"), "{tty:?}");

    // Not on a terminal: the report, and nothing else.
    let o = Command::new(BIN).args(ARGS).output().unwrap();
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");
    assert!(String::from_utf8_lossy(&o.stdout).contains("crunl — one op"));
}
