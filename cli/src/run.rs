//! `lanefs run`: runs a program with the preloaded client (`client/`), so that its calls on
//! lanefs mounts go to their servers over the channel, around the kernel's directory lock.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The client library's file name, as cargo builds it.
const LIB: &str = "liblanefs_client.so";

#[derive(clap::Args)]
#[command(
    about = "Run a program whose calls on lanefs mounts go to the server directly",
    long_about = "Runs CMD with the lanefs client preloaded (LD_PRELOAD; its children inherit \
                  it). Calls that create, remove, rename and stat names on a lanefs mount go to \
                  the mount's server over shared memory instead of through the kernel, whose \
                  directory lock serialises them; a file it creates is opened through the kernel \
                  only when the program first uses the descriptor for more than `close`; \
                  everything else (reads, writes, mmap, locks, other filesystems) goes through \
                  the kernel as usual. Set-user-id and \
                  statically linked programs run without the client (through the kernel)."
)]
pub struct RunArgs {
    /// Serve only these mounts over the channel (default: every lanefs mount); repeatable.
    #[arg(long = "mount", value_name = "MNT")]
    mounts: Vec<PathBuf>,
    /// Send a `stat` of a name the kernel holds through the kernel, which answers it from its
    /// caches, faster than the channel; weaker: such a stat can show a change later than the
    /// channel shows it (docs/DESIGN.md, "The channel of lanefs run"). Sets
    /// `LANEFS_RUN_WARM_STAT=1`.
    #[arg(long)]
    warm_stat: bool,
    /// Open every file a program creates through the kernel at once, instead of when the
    /// program first uses its descriptor for more than `close` (a *deferred* descriptor,
    /// docs/DESIGN.md, "The channel of lanefs run"). Sets `LANEFS_RUN_DEFER=0`.
    #[arg(long)]
    no_defer: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<OsString>,
}

/// Where the client library is: `LANEFS_CLIENT_LIB`, else the newest of: beside this binary
/// (as `cargo build` leaves them both), in `deps/` under it (where `cargo test --workspace`
/// leaves it), and `../lib/` from it (an installed tree).
fn client_lib() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("LANEFS_CLIENT_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("where is this binary? {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    // `cargo test` leaves the library in deps/ without copying it up.
    let candidates = [
        dir.join(LIB),
        dir.join("deps").join(LIB),
        dir.join("../lib").join(LIB),
        dir.join("../lib/lanefs").join(LIB),
    ];
    // The newest: after `cargo build` and `cargo test` in turn, each place may hold one.
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p.clone())
        .ok_or_else(|| {
            format!(
                "the client library {LIB} is not beside {} (build it with `cargo build \
                 --release`, or set LANEFS_CLIENT_LIB)",
                exe.display()
            )
        })
}

/// Whether `p` is a lanefs mountpoint (its line in this process's mount table).
fn is_lanefs_mount(p: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let Some(sep) = f.iter().position(|&x| x == "-") else {
            return false;
        };
        f.len() > sep + 1
            && f[sep + 1] == "fuse.lanefs"
            && f.get(4)
                .is_some_and(|m| unescape(m) == p.as_os_str().to_string_lossy())
    })
}

/// A `/proc/PID/mountinfo` field with its octal escapes (`\040` for a space) undone.
pub(crate) fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

pub fn run(a: RunArgs) -> Result<(), String> {
    let lib = client_lib()?;
    let lib = std::fs::canonicalize(&lib).unwrap_or(lib);
    let mut mounts = Vec::new();
    for m in &a.mounts {
        let c = std::fs::canonicalize(m).map_err(|e| format!("{}: {e}", m.display()))?;
        if !is_lanefs_mount(&c) {
            return Err(format!("{}: not a lanefs mountpoint", m.display()));
        }
        mounts.push(c.to_string_lossy().into_owned());
    }
    let mut preload = OsString::from(&lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]).env("LD_PRELOAD", preload);
    if mounts.is_empty() {
        cmd.env_remove("LANEFS_RUN_MOUNTS");
    } else {
        cmd.env("LANEFS_RUN_MOUNTS", mounts.join(":"));
    }
    if a.warm_stat {
        cmd.env("LANEFS_RUN_WARM_STAT", "1");
    }
    if a.no_defer {
        cmd.env("LANEFS_RUN_DEFER", "0");
    }
    let e = cmd.exec();
    Err(format!("{}: {e}", a.cmd[0].to_string_lossy()))
}
