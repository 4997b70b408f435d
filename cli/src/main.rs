//! `lanefs`: one binary for every part of lanefs.

mod bench;

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
    /// Run the seed workloads (crunl, rndrename, fstree, fsmark, orc) in-process and on paths.
    Bench(bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Bench(a) => bench::run(a),
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
