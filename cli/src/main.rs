//! `lanefs`: one binary for every part of lanefs.

mod bench;
mod mount;

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
    /// Run the seed workloads (crunl, rndrename, fstree, fsmark, orc) in-process and on paths.
    Bench(bench::BenchArgs),
    /// Check a disk store (exit 0 when consistent); --repair cuts a damaged one back to its
    /// last consistent prefix.
    Fsck(mount::FsckArgs),
}

const SUBCOMMANDS: [&str; 5] = ["mount", "stats", "bench", "fsck", "help"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `lanefs SOURCE MOUNTPOINT -o opts`: the form mount.fuse3 uses for `-t fuse.lanefs`.
    let helper_form =
        args.len() >= 3 && !args[1].starts_with('-') && !SUBCOMMANDS.contains(&args[1].as_str());
    let r = if helper_form {
        mount::helper(&args[1..])
    } else {
        match Cli::parse().cmd {
            Cmd::Mount(a) => mount::run(a),
            Cmd::Stats(a) => mount::stats(a),
            Cmd::Bench(a) => bench::run(a),
            Cmd::Fsck(a) => mount::fsck(a),
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
