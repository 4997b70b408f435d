//! `lanefs bench`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use lanefs::Locking;
use lanefs_bench::{Params, Target, Workload, report};

#[derive(Clone, Copy, ValueEnum)]
enum Scale {
    /// About a minute on two cores.
    Quick,
    /// The seeds' own sizes (fstree 1000 x 1000 files per thread, 5 s windows).
    Seed,
}

/// Runs workloads and prints ops/s per thread count, ops per CPU-second, latency and the
/// engine's hottest locks. Every in-process cell also runs a share-nothing CPU loop in the
/// same run, the machine's own scaling limit at that moment.
#[derive(Args)]
pub struct BenchArgs {
    /// Workloads, comma-separated: crunl, rndrename, fstree, fsmark, orc; or `memory` (bytes
    /// per empty file at --files files).
    #[arg(value_delimiter = ',', required = true)]
    workloads: Vec<String>,
    /// Thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,8,32")]
    threads: Vec<usize>,
    /// In-process locking modes, comma-separated (lanes, dirlock, coarse); `none` to run only
    /// on --path.
    #[arg(long, value_delimiter = ',', default_value = "lanes")]
    locking: Vec<String>,
    /// Also run with system calls under these directories (a lanefs mount, a tmpfs, ext4).
    #[arg(long)]
    path: Vec<PathBuf>,
    /// Runs of every cell, round-robin; the report gives medians.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Measuring window per cell, seconds (default from --scale).
    #[arg(long)]
    seconds: Option<f64>,
    /// Sizes.
    #[arg(long, value_enum, default_value_t = Scale::Quick)]
    scale: Scale,
    /// Leave out the share-nothing baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Print one JSON object per cell (medians) on stdout; the table goes to stderr.
    #[arg(long)]
    json: bool,
    /// Draw ops/s against threads into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Files for `memory`.
    #[arg(long, default_value_t = 1_000_000)]
    files: usize,
}

pub fn run(a: BenchArgs) -> Result<(), String> {
    let mut p = match a.scale {
        Scale::Quick => Params::quick(),
        Scale::Seed => Params::seed(),
    };
    if let Some(s) = a.seconds {
        p.seconds = s;
    }
    if a.threads.is_empty() || a.threads.contains(&0) {
        return Err("--threads needs positive counts".into());
    }
    let mut workloads = Vec::new();
    for w in &a.workloads {
        if w == "memory" {
            let per = lanefs_bench::memory_per_file(a.files);
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"workload": "memory", "files": a.files, "bytes_per_file": per})
                );
            } else {
                println!(
                    "memory: {per:.0} bytes per empty file (inode + entry, 16-byte names) at {} files",
                    a.files
                );
            }
            continue;
        }
        workloads.push(w.parse::<Workload>()?);
    }
    let mut targets: Vec<Target> = Vec::new();
    for l in &a.locking {
        if l != "none" {
            targets.push(Target::Engine(l.parse::<Locking>()?));
        }
    }
    for path in &a.path {
        if !path.is_dir() {
            return Err(format!("--path {}: not a directory", path.display()));
        }
        targets.push(Target::Path(path.clone()));
    }
    if !a.no_baseline {
        targets.push(Target::ShareNothing);
    }
    let mut cells = Vec::new();
    let total = workloads.len() * targets.len() * a.threads.len() * a.repeat;
    let mut done = 0;
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    for _ in 0..a.repeat {
        for &w in &workloads {
            for t in &targets {
                for &n in &a.threads {
                    done += 1;
                    if progress {
                        eprint!(
                            "\r[{done}/{total}] {} {} T={n}          ",
                            w.name(),
                            t.label()
                        );
                    }
                    cells.push(lanefs_bench::run_cell(w, t, n, &p)?);
                }
            }
        }
    }
    if total > 0 && progress {
        eprintln!();
    }
    let med = report::medians(&cells);
    if a.json {
        for c in &med {
            println!("{}", serde_json::to_string(c).map_err(|e| e.to_string())?);
        }
        if !med.is_empty() {
            eprint!("{}", report::table(&med, a.repeat));
        }
    } else if !med.is_empty() {
        print!("{}", report::table(&med, a.repeat));
    }
    if let Some(path) = &a.plot {
        report::plot_svg(&med, path)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}
