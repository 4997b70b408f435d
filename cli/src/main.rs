//! `lanefs`: one binary for every part of lanefs.

mod bench;
mod mount;
mod run;

use clap::{Parser, Subcommand};

/// lanefs: a POSIX filesystem where operations on different names never wait for each other.
#[derive(Parser)]
#[command(name = "lanefs", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount a lanefs filesystem (FUSE) and serve it until unmounted.
    Mount(mount::MountArgs),
    /// Show the operation counts and lock statistics of a running mount.
    Stats(mount::StatsArgs),
    /// Run the workloads (crunl, rndrename, fstree, walk, fsmark, orc) in-process and on paths.
    Bench(bench::BenchArgs),
    /// Check a disk store (exit 0 when consistent); --repair cuts a damaged one back to its
    /// last consistent prefix.
    Fsck(mount::FsckArgs),
    /// Apply a disk store's journal to its checkpoint and give the room deleted files took
    /// back to the host (the store must not be mounted).
    Compact(mount::CompactArgs),
    /// Run a program whose calls on lanefs mounts go to the server directly (LD_PRELOAD).
    Run(run::RunArgs),
}

const SUBCOMMANDS: [&str; 7] = ["mount", "stats", "bench", "fsck", "compact", "run", "help"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `lanefs SOURCE MOUNTPOINT -o opts`: the form mount.fuse3 uses for `-t fuse.lanefs`.
    let helper_form =
        args.len() >= 3 && !args[1].starts_with('-') && !SUBCOMMANDS.contains(&args[1].as_str());
    let r = if helper_form {
        mount::helper(&args[1..])
    } else {
        let cmd = Cli::parse().cmd;
        if !matches!(cmd, Cmd::Mount(_)) {
            // A report piped into `head` ends quietly when the reader goes, as other command-line
            // tools do (Rust ignores SIGPIPE, and `println!` then panics). Not for the server,
            // whose sockets' peers may go at any time.
            // SAFETY: setting a signal's disposition to its default has no preconditions.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        }
        match cmd {
            Cmd::Mount(a) => mount::run(a),
            Cmd::Stats(a) => mount::stats(a),
            Cmd::Bench(a) => bench::run(a),
            Cmd::Fsck(a) => mount::fsck(a),
            Cmd::Compact(a) => mount::compact(a),
            Cmd::Run(a) => run::run(a),
        }
    };
    if let Err(e) = r {
        eprintln!("lanefs: {e}");
        std::process::exit(1);
    }
}

/// mimalloc rather than glibc malloc: the engine frees inodes through epoch reclamation, on
/// whichever thread collects them, and glibc serialises such cross-thread frees on its arena
/// locks (seen as `__lll_lock_wake_private` in profiles of `bench crunl`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Starts a thread that hands the memory mimalloc holds free back to the system, so that a
/// server whose files were deleted shrinks within about two seconds, as tmpfs does, even if it
/// then goes idle. mimalloc returns a freed page (`MADV_DONTNEED`) only once `purge_delay`
/// (1 s) has passed, and only when a later allocator call, on any thread, looks for expired
/// purges: after `rm` of gigabytes an idle server makes none, and kept them all. This thread
/// makes that call once a second: `mi_collect(false)` purges what has expired (program-wide)
/// and costs next to nothing when nothing has. The hot paths keep mimalloc's defaults.
pub(crate) fn start_purging() {
    let spawned = std::thread::Builder::new()
        .name("lanefs-purge".into())
        .spawn(|| {
            // mi_collect does nothing on a thread whose heap is not yet set up: allocate once.
            let _heap = std::hint::black_box(Box::new(0u64));
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                // SAFETY: mi_collect has no preconditions.
                unsafe { libmimalloc_sys::mi_collect(false) };
            }
        });
    if let Err(e) = spawned {
        eprintln!("lanefs: no memory purging thread: {e}");
    }
}
