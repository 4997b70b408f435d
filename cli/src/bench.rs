//! `lanefs bench`.

use std::path::PathBuf;
use std::process::Command;

use clap::{Args, ValueEnum};
use lanefs::Locking;
use lanefs_bench::{Cell, Params, Target, Workload, report};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scale {
    /// About a minute on two cores: 1 s windows, fstree 50 x 200 files per thread.
    Quick,
    /// The seeds' own sizes: crunl and rndrename 1,000,000 iterations per thread, fstree one
    /// pass over 1000 x 1000 files per thread, orc 100 rounds over 254 files, fsmark 10,240
    /// files per thread.
    Seed,
}

/// Runs workloads and prints ops/s per thread count, ops per CPU-second, latency and the
/// engine's hottest locks. A share-nothing CPU loop runs in the same run as a baseline: the
/// machine's own scaling limit at that moment.
#[derive(Args)]
pub struct BenchArgs {
    /// Workloads, comma-separated: crunl, rndrename, fstree, walk, fsmark, orc; or `memory` (bytes
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
    /// In-process APIs, comma-separated: `inode` (the inode API a FUSE server speaks: names
    /// relative to an open directory) and `path` (`Client`: std::fs-style absolute paths,
    /// walked from the root on every call); `none` for only --store and --path runs.
    #[arg(long, value_delimiter = ',', default_value = "inode")]
    api: Vec<String>,
    /// Also run with system calls under these directories (a lanefs mount, a tmpfs, ext4).
    #[arg(long)]
    path: Vec<PathBuf>,
    /// Also run in-process (inode API, each locking mode) on a fresh disk store in a new
    /// directory under this one, removed afterwards.
    #[arg(long)]
    store: Option<PathBuf>,
    /// Run each seed's "before" and "after" side by side (crunl, rndrename: dirlock vs lanes;
    /// fstree: coarse vs lanes, cold; orc: coarse vs lanes; fsmark: lanes only, the memory
    /// store has no commit to compare) and print a table shaped like the seed's.
    #[arg(long)]
    compare: bool,
    /// fstree: drop the kernel's caches after building the trees and time one pass.
    #[arg(long)]
    cold: bool,
    /// With --store: checkpoint, close and open the disk store again after the set-up (the
    /// opening is timed and reported), so that the run reads the namespace as a remount does.
    #[arg(long, requires = "store")]
    reopen: bool,
    /// With --reopen: bound the reopened store's inode cache (inodes and directory entries)
    /// to SIZE bytes (`64m`, `1g`; default: the library's, an eighth of memory), and report
    /// what it holds after the run.
    #[arg(long, requires = "reopen", value_parser = crate::mount::parse_size)]
    inode_cache: Option<u64>,
    /// Each thread does exactly this many operations (instead of a time window).
    #[arg(long)]
    iterations: Option<u64>,
    /// Also create ext4 filesystems on loop files (plain, and with fast_commit), run on them,
    /// and remove them afterwards (root and mkfs.ext4 needed; skipped with a message
    /// otherwise).
    #[arg(long)]
    ext4: bool,
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
    /// fstree: directories x files per thread (e.g. `200x500`; default from --scale).
    #[arg(long)]
    tree: Option<String>,
    /// Files for `memory`.
    #[arg(long, default_value_t = 1_000_000)]
    files: usize,
}

/// An ext4 on a loop file, unmounted and deleted when dropped.
struct LoopExt4 {
    dir: PathBuf,
    image: PathBuf,
}

impl LoopExt4 {
    fn create(tag: &str, features: &[&str], inodes: u64) -> Result<LoopExt4, String> {
        let base = std::env::temp_dir().join(format!("lanefs-bench-{tag}-{}", std::process::id()));
        let image = base.with_extension("img");
        let run = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
        let f = std::fs::File::create(&image).map_err(|e| e.to_string())?;
        f.set_len(16 << 30).map_err(|e| e.to_string())?;
        let mut mkfs = Command::new("mkfs.ext4");
        mkfs.args(["-q", "-F", "-N", &inodes.to_string()]);
        for f in features {
            mkfs.args(["-O", f]);
        }
        run(mkfs.arg(&image))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&base))?;
        Ok(LoopExt4 { dir: base, image })
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).output();
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// `--tree DIRSxFILES`.
fn tree_size(t: &str) -> Result<(usize, usize), String> {
    let (d, f) = t
        .split_once('x')
        .ok_or_else(|| format!("--tree {t}: expected DIRSxFILES"))?;
    Ok((
        d.parse()
            .map_err(|_| format!("--tree {t}: bad directory count"))?,
        f.parse()
            .map_err(|_| format!("--tree {t}: bad file count"))?,
    ))
}

fn seed_iterations(w: Workload) -> Option<u64> {
    match w {
        Workload::Crunl | Workload::Rndrename => Some(1_000_000),
        Workload::Orc => Some(100 * 254),
        Workload::Fsmark => Some(10_240),
        Workload::Fstree => None, // one pass: see Params::cold
        Workload::Walk => None,
    }
}

/// The seed's "before" locking mode.
fn before(w: Workload) -> Option<Locking> {
    match w {
        Workload::Crunl | Workload::Rndrename => Some(Locking::DirLock),
        Workload::Fstree | Workload::Walk | Workload::Orc => Some(Locking::Coarse),
        Workload::Fsmark => None,
    }
}

pub fn run(a: BenchArgs) -> Result<(), String> {
    let base = match a.scale {
        Scale::Quick => Params::quick(),
        Scale::Seed => Params::seed(),
    };
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
    let mut engines: Vec<Locking> = Vec::new();
    for l in &a.locking {
        if l != "none" {
            engines.push(l.parse::<Locking>()?);
        }
    }
    let mut paths: Vec<PathBuf> = Vec::new();
    for path in &a.path {
        if !path.is_dir() {
            return Err(format!("--path {}: not a directory", path.display()));
        }
        paths.push(path.clone());
    }
    let mut loops = Vec::new();
    if a.ext4 {
        // Room for the largest cell's trees (each cell removes its own when it ends).
        let tree = match &a.tree {
            Some(t) => tree_size(t)?,
            None => (base.fstree_dirs, base.fstree_files),
        };
        let largest = a.threads.iter().max().copied().unwrap_or(1) * tree.0 * (tree.1 + 1);
        let inodes = (largest as u64 * 11 / 10 + 100_000).max(if a.scale == Scale::Seed {
            24_000_000
        } else {
            2_000_000
        });
        for (tag, feats) in [("ext4", &[][..]), ("ext4-fc", &["fast_commit"][..])] {
            match LoopExt4::create(tag, feats, inodes) {
                Ok(l) => {
                    paths.push(l.dir.clone());
                    loops.push(l);
                }
                Err(e) => eprintln!("{tag}: skipped ({e})"),
            }
        }
    }
    // On a terminal, one line on stderr, rewritten in place, says which cell runs and where
    // it is (the prefill, set-up, warm-up, how much of the window or of the fixed work), and
    // is cleared at the end; elsewhere (a pipe, a file, --json's consumers) nothing is added.
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    let clear = || {
        if progress {
            eprint!("\r\x1b[K");
        }
    };
    let mut cells = Vec::new();
    let mut plan: Vec<(Workload, Vec<Target>)> = Vec::new();
    for &w in &workloads {
        let mut targets: Vec<Target> = Vec::new();
        let mut modes = engines.clone();
        if a.compare {
            for m in before(w).into_iter().chain([Locking::Lanes]) {
                if !modes.contains(&m) {
                    modes.push(m);
                }
            }
        }
        for m in modes {
            for api in &a.api {
                targets.push(match api.as_str() {
                    "inode" => Target::Engine(m),
                    "path" => Target::Paths(m),
                    "none" => continue,
                    other => return Err(format!("--api {other}: expected inode, path or none")),
                });
            }
            if let Some(dir) = &a.store {
                targets.push(Target::Store(m, dir.clone()));
            }
        }
        targets.extend(paths.iter().cloned().map(Target::Path));
        if !a.no_baseline {
            targets.push(Target::ShareNothing);
        }
        plan.push((w, targets));
    }
    let total: usize =
        plan.iter().map(|(_, t)| t.len()).sum::<usize>() * a.threads.len() * a.repeat;
    let mut done = 0;
    for _ in 0..a.repeat {
        for (w, targets) in &plan {
            let mut p = base.clone();
            if let Some(s) = a.seconds {
                p.seconds = s;
            }
            if let Some(t) = &a.tree {
                (p.fstree_dirs, p.fstree_files) = tree_size(t)?;
            }
            p.cold = *w == Workload::Fstree && (a.cold || a.compare || a.scale == Scale::Seed);
            p.reopen = a.reopen;
            p.inode_cache = a.inode_cache;
            p.iterations = a.iterations.or(if a.scale == Scale::Seed {
                seed_iterations(*w)
            } else {
                None
            });
            for t in targets {
                for &n in &a.threads {
                    done += 1;
                    let cell = format!("{} {} T={n}", w.name(), t.label());
                    let mut show = |stage: lanefs_bench::Stage| {
                        if progress {
                            eprint!(
                                "\r\x1b[K[{done}/{total}, {:.0} s] {cell}: {stage}",
                                started.elapsed().as_secs_f64()
                            );
                        }
                    };
                    let c = lanefs_bench::run_cell_reporting(*w, t, n, &p, &mut show)
                        .inspect_err(|_| clear())?;
                    cells.push(c);
                }
            }
        }
    }
    clear();
    let med = report::medians(&cells);
    let mut text = report::table(&med, a.repeat);
    if a.compare {
        text.push_str(&compare_table(&med));
    }
    if a.json {
        for c in &med {
            println!("{}", serde_json::to_string(c).map_err(|e| e.to_string())?);
        }
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(path) = &a.plot {
        report::plot_svg(&med, path)?;
        eprintln!("plot written to {}", path.display());
    }
    drop(loops);
    Ok(())
}

/// Before and after per thread count, as the seeds report them.
fn compare_table(cells: &[Cell]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut ws: Vec<Workload> = cells.iter().map(|c| c.workload).collect();
    ws.dedup();
    for w in ws {
        let Some(b) = before(w) else { continue };
        let _ = writeln!(
            out,
            "\n{} — before ({}) and after (lanes), {}/s",
            w.name(),
            b.name(),
            w.unit()
        );
        let _ = writeln!(
            out,
            "  {:>4} {:>14} {:>14} {:>10}",
            "T", "before", "after", "change"
        );
        let mut ts: Vec<usize> = cells
            .iter()
            .filter(|c| c.workload == w)
            .map(|c| c.threads)
            .collect();
        ts.sort_unstable();
        ts.dedup();
        for t in ts {
            let get = |l: Locking| {
                cells
                    .iter()
                    .find(|c| c.workload == w && c.threads == t && c.target == l.name())
                    .map(|c| c.ops_per_sec)
            };
            if let (Some(x), Some(y)) = (get(b), get(Locking::Lanes)) {
                let _ = writeln!(
                    out,
                    "  {t:>4} {x:>14.0} {y:>14.0} {:>+9.0}%",
                    (y / x - 1.0) * 100.0
                );
            }
        }
    }
    out
}
