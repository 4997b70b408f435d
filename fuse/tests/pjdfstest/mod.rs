//! pjdfstest (the Rust port of the POSIX filesystem test suite, `cargo install pjdfstest`),
//! run against a mounted directory: shared by the mount's tests (`mount.rs`) and those of
//! `lanefs run` (`cli/tests/run.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pjdfstest binary; `None` (having said so) where it is not installed and not required.
pub fn pjdfstest() -> Option<PathBuf> {
    let bin = std::env::var_os("LANEFS_PJDFSTEST")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("pjdfstest"))
                    .find(|b| b.exists())
            })
        })
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(Path::new(&home).join(".cargo/bin/pjdfstest")).filter(|b| b.exists())
        });
    let Some(bin) = bin else {
        assert!(
            std::env::var_os("LANEFS_REQUIRE_PJDFSTEST").is_none(),
            "pjdfstest is required here but not installed"
        );
        eprintln!("pjdfstest not installed (cargo install pjdfstest): NOT RUN");
        return None;
    };
    Some(bin)
}

/// Two unprivileged users with their primary groups, as pjdfstest's `dummy_auth` wants them
/// (names it can look up): `nobody` first, then the first other user the machine knows whose
/// primary group resolves. Machines differ (a minimal image may lack `daemon`), so the
/// names are not fixed.
fn pjdfstest_users() -> [(String, String); 2] {
    let getent = |db: &str, key: Option<&str>| -> String {
        let out = Command::new("getent")
            .arg(db)
            .args(key)
            .output()
            .expect("getent runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut users: Vec<(String, String)> = Vec::new();
    for line in getent("passwd", None).lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 || f[2] == "0" || users.iter().any(|(u, _)| u == f[0]) {
            continue;
        }
        let Some(group) = getent("group", Some(f[3]))
            .split(':')
            .next()
            .filter(|g| !g.trim().is_empty())
            .map(str::to_owned)
        else {
            continue;
        };
        users.push((f[0].to_owned(), group));
    }
    users.sort_by_key(|(u, _)| u != "nobody");
    assert!(
        users.len() >= 2,
        "pjdfstest needs two unprivileged users with primary groups; this machine has {users:?}"
    );
    [users[0].clone(), users[1].clone()]
}

/// Runs pjdfstest in the mounted directory `mnt`, through the command `wrapper` when it is
/// not empty (`lanefs run --`); fails with its failures.
pub fn run_pjdfstest(bin: &Path, mnt: &Path, wrapper: &[&std::ffi::OsStr]) {
    let work = tempfile::tempdir().unwrap();
    let conf = work.path().join("pjdfstest.toml");
    let [(u1, g1), (u2, g2)] = pjdfstest_users();
    std::fs::write(
        &conf,
        format!(
            r#"[features]
posix_fallocate = {{}}
rename_ctime = {{}}
utimensat = {{}}
utime_now = {{}}

[settings]
naptime = 0.02
allow_remount = false
expected_failures = []

[dummy_auth]
entries = [["{u1}", "{g1}"], ["{u2}", "{g2}"]]
"#
        ),
    )
    .unwrap();
    let secondary = work.path().join("secondary");
    std::fs::create_dir(&secondary).unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let out = cmd
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(mnt)
        .arg("-s")
        .arg(&secondary)
        .current_dir(mnt)
        .output()
        .expect("pjdfstest runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Each FAILED line with the panic message pjdfstest prints under it (indented lines).
    let mut failed: Vec<&str> = Vec::new();
    let mut in_failure = false;
    for l in stdout.lines() {
        if l.contains("FAILED") {
            in_failure = true;
        } else if !l.starts_with(['\t', ' ']) {
            in_failure = false;
        }
        if in_failure {
            failed.push(l);
        }
    }
    let summary = stdout.lines().find(|l| l.starts_with("Summary"));
    assert!(
        out.status.success() && failed.is_empty(),
        "pjdfstest failed:\n{}\n{summary:?}\n{}",
        failed.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", summary.unwrap_or("no summary"));
}
