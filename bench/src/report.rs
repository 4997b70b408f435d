//! Medians of repeated runs, tables and plots.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use crate::Cell;

/// Median of `v` (which must be non-empty).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Collapses repeats of each (workload, target, threads) into one cell holding the medians
/// (ops/s, ops/CPU-s, p50, p99); the order of first appearance is kept.
pub fn medians(cells: &[Cell]) -> Vec<Cell> {
    let mut order: Vec<(String, String, usize)> = Vec::new();
    let mut groups: BTreeMap<(String, String, usize), Vec<&Cell>> = BTreeMap::new();
    for c in cells {
        let k = (c.workload.name().to_string(), c.target.clone(), c.threads);
        if !groups.contains_key(&k) {
            order.push(k.clone());
        }
        groups.entry(k).or_default().push(c);
    }
    order
        .into_iter()
        .map(|k| {
            let g = &groups[&k];
            let m =
                |f: &dyn Fn(&Cell) -> f64| median(&mut g.iter().map(|c| f(c)).collect::<Vec<_>>());
            let mut rep = g[0].clone();
            rep.ops_per_sec = m(&|c| c.ops_per_sec);
            rep.ops_per_cpu_sec = m(&|c| c.ops_per_cpu_sec);
            rep.p50_ns = m(&|c| c.p50_ns as f64) as u64;
            rep.p99_ns = m(&|c| c.p99_ns as f64) as u64;
            rep.ops = m(&|c| c.ops as f64) as u64;
            if let Some(r) = &mut rep.reopened {
                r.seconds = m(&|c| c.reopened.map_or(f64::NAN, |r| r.seconds));
            }
            rep
        })
        .collect()
}

fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The speedup of `target` at `threads` over its own T=1, for workload `w`.
pub fn speedup(cells: &[Cell], w: crate::Workload, target: &str, threads: usize) -> Option<f64> {
    let at = |t: usize| {
        cells
            .iter()
            .find(|c| c.workload == w && c.target == target && c.threads == t)
            .map(|c| c.ops_per_sec)
    };
    Some(at(threads)? / at(1)?)
}

/// Under `head` (if any cell has one), a row per target of `f`'s figure for each of its
/// cells, by thread count.
fn per_cell_rows(
    out: &mut String,
    cs: &[&Cell],
    (targets, tw, threads): (&[String], usize, &[usize]),
    head: &str,
    f: impl Fn(&Cell) -> Option<String>,
) {
    if !cs.iter().any(|c| f(c).is_some()) {
        return;
    }
    let _ = writeln!(out, "  {head}");
    for tg in targets {
        let row: Vec<String> = threads
            .iter()
            .filter_map(|t| {
                let c = cs.iter().find(|c| &c.target == tg && c.threads == *t)?;
                Some(format!("T={t}: {}", f(c)?))
            })
            .collect();
        if !row.is_empty() {
            let _ = writeln!(out, "    {tg:tw$} {}", row.join("; "));
        }
    }
}

/// A plain-text report: per workload, ops/s with the speedup over T=1, ops per CPU-second,
/// latency, and the hottest engine locks at the highest thread count.
pub fn table(cells: &[Cell], repeats: usize) -> String {
    let mut out = String::new();
    let mut workloads: Vec<_> = cells.iter().map(|c| c.workload).collect();
    workloads.dedup();
    for w in workloads {
        let cs: Vec<&Cell> = cells.iter().filter(|c| c.workload == w).collect();
        let mut threads: Vec<usize> = cs.iter().map(|c| c.threads).collect();
        threads.sort_unstable();
        threads.dedup();
        let mut targets: Vec<String> = Vec::new();
        for c in &cs {
            if !targets.contains(&c.target) {
                targets.push(c.target.clone());
            }
        }
        let tw = targets.iter().map(String::len).max().unwrap_or(6).max(6);
        let _ = writeln!(
            out,
            "\n{} — one op = {}; median of {repeats} run(s)",
            w.name(),
            w.unit()
        );
        for (title, f) in [
            (
                "ops/s (speedup over T=1)",
                (|c: &Cell| c.ops_per_sec) as fn(&Cell) -> f64,
            ),
            ("ops per CPU-second", |c: &Cell| c.ops_per_cpu_sec),
        ] {
            let _ = write!(out, "  {title}\n  {:tw$}", "target");
            for t in &threads {
                let _ = write!(out, " {:>17}", format!("T={t}"));
            }
            out.push('\n');
            for tg in &targets {
                let _ = write!(out, "  {tg:tw$}");
                let base = cs
                    .iter()
                    .find(|c| &c.target == tg && c.threads == 1)
                    .map(|c| c.ops_per_sec);
                for t in &threads {
                    let cell = cs.iter().find(|c| &c.target == tg && c.threads == *t);
                    let s = match cell {
                        Some(c) if title.starts_with("ops/s") => match base {
                            Some(b) if b > 0.0 => {
                                format!("{} ({:.2}x)", human(f(c)), c.ops_per_sec / b)
                            }
                            _ => human(f(c)),
                        },
                        Some(c) => human(f(c)),
                        None => "-".into(),
                    };
                    let _ = write!(out, " {s:>17}");
                }
                out.push('\n');
            }
        }
        // Each target's T=2 speedup divided by the share-nothing loop's. Not a fraction: the
        // loop is no ceiling (on a shared or small machine it may get less of the CPUs than a
        // target measured at another moment, or lose more to SMT siblings or turbo), so the
        // ratio exceeds 1 where a target scaled better than the loop did.
        if targets.iter().any(|t| t == "share-nothing") && threads.contains(&2) {
            if let Some(sn) = speedup(cells, w, "share-nothing", 2) {
                let _ = writeln!(
                    out,
                    "  T=2 speedup relative to share-nothing's ({sn:.2}x) in the same run \
                     (1.00: the same; above 1: scaled better than that loop):"
                );
                for tg in targets.iter().filter(|t| *t != "share-nothing") {
                    if let Some(s) = speedup(cells, w, tg, 2) {
                        let _ = writeln!(out, "    {tg:tw$} {:.2}", s / sn);
                    }
                }
            }
        }
        if cs.iter().any(|c| c.commits.is_some_and(|k| k.flushes > 0)) {
            let _ = writeln!(out, "  disk store: journal records per flush, flushes/s");
            for tg in &targets {
                let row: Vec<String> = threads
                    .iter()
                    .filter_map(|t| {
                        let c = cs.iter().find(|c| &c.target == tg && c.threads == *t)?;
                        let k = c.commits.filter(|k| k.flushes > 0)?;
                        Some(format!(
                            "T={t}: {:.1}, {}",
                            k.records as f64 / k.flushes as f64,
                            human(k.flushes as f64 / c.seconds)
                        ))
                    })
                    .collect();
                if !row.is_empty() {
                    let _ = writeln!(out, "    {tg:tw$} {}", row.join("; "));
                }
            }
        }
        let reopened = |c: &Cell| {
            let r = c.reopened?;
            Some(format!("{:.2} s ({})", r.seconds, human(r.inodes as f64)))
        };
        per_cell_rows(
            &mut out,
            &cs,
            (&targets, tw, &threads),
            "disk store checkpointed, closed and opened again before the run: seconds \
             (inodes the opening read)",
            reopened,
        );
        let cache_after = |c: &Cell| {
            let a = c.cache_after?;
            Some(format!(
                "{} / {} ({:.0} MiB), {} ({}), {:.0} MiB",
                human(a.inodes as f64),
                human(a.entries as f64),
                a.cache_bytes as f64 / (1 << 20) as f64,
                human(a.evicted as f64),
                human(a.dirs_evicted as f64),
                a.rss as f64 / (1 << 20) as f64
            ))
        };
        per_cell_rows(
            &mut out,
            &cs,
            (&targets, tw, &threads),
            "the reopened store after the run: inodes / entries in memory (counted bytes), \
             evicted (directories), process resident memory",
            cache_after,
        );
        let tmax = *threads.last().unwrap_or(&1);
        let _ = writeln!(out, "  latency at T={tmax} (sampled): p50 / p99");
        for tg in &targets {
            if let Some(c) = cs.iter().find(|c| &c.target == tg && c.threads == tmax) {
                let _ = writeln!(out, "    {tg:tw$} {:>8} ns / {:>8} ns", c.p50_ns, c.p99_ns);
            }
        }
        for c in cs
            .iter()
            .filter(|c| c.threads == tmax && !c.locks.is_empty())
        {
            let rows: Vec<String> = c
                .locks
                .iter()
                .map(|l| {
                    format!(
                        "{} {} acq, {} contended, {:.1} ms waited",
                        l.class,
                        l.acquired,
                        l.contended,
                        l.wait_ns as f64 / 1e6
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  hottest locks, {} at T={tmax}: {}",
                c.target,
                rows.join("; ")
            );
        }
    }
    out
}

/// Draws ops/s against thread count, one line per target and workload, as SVG.
pub fn plot_svg(cells: &[Cell], path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    if path.extension().and_then(|e| e.to_str()) != Some("svg") {
        return Err(format!("{}: only .svg plots are supported", path.display()));
    }
    let mut series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for c in cells {
        let label = format!("{} {}", c.workload.name(), c.target);
        match series.iter_mut().find(|(l, _)| *l == label) {
            Some((_, pts)) => pts.push((c.threads, c.ops_per_sec)),
            None => series.push((label, vec![(c.threads, c.ops_per_sec)])),
        }
    }
    let tmax = cells.iter().map(|c| c.threads).max().unwrap_or(1) as f64;
    let ymax = cells.iter().map(|c| c.ops_per_sec).fold(1.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("lanefs bench: ops/s against threads", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((1f64..tmax.max(2.0)).log_scale(), 0f64..ymax)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("threads (log scale)")
        .y_desc("operations per second")
        .y_label_formatter(&|y| human(*y))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (label, mut pts)) in series.into_iter().enumerate() {
        pts.sort_by_key(|p| p.0);
        let color = Palette99::pick(i).to_rgba();
        let data: Vec<(f64, f64)> = pts.iter().map(|&(t, y)| (t as f64, y)).collect();
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Workload;

    fn cell(target: &str, threads: usize, ops: f64) -> Cell {
        Cell {
            workload: Workload::Crunl,
            unit: "x",
            threads,
            target: target.into(),
            ops: ops as u64,
            seconds: 1.0,
            ops_per_sec: ops,
            ops_per_cpu_sec: ops,
            p50_ns: 10,
            p99_ns: 20,
            locks: vec![],
            commits: None,
            cold: false,
            caches_dropped: false,
            reopened: None,
            cache_after: None,
        }
    }

    #[test]
    fn medians_speedups_table_and_plot() {
        let cells = vec![
            cell("lanes", 1, 100.0),
            cell("lanes", 2, 190.0),
            cell("lanes", 1, 120.0),
            cell("lanes", 2, 150.0),
            cell("lanes", 1, 110.0),
            cell("lanes", 2, 200.0),
            cell("share-nothing", 1, 10.0),
            cell("share-nothing", 2, 20.0),
        ];
        let m = medians(&cells);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].ops_per_sec, 110.0);
        assert_eq!(m[1].ops_per_sec, 190.0);
        assert!((speedup(&m, Workload::Crunl, "lanes", 2).unwrap() - 190.0 / 110.0).abs() < 1e-9);
        assert_eq!(speedup(&m, Workload::Orc, "lanes", 2), None, "per workload");
        let t = table(&m, 3);
        assert!(t.contains("share-nothing's (2.00x)"), "{t}");
        assert!(t.contains("(1.73x)"), "{t}");
        let p = std::env::temp_dir().join(format!("lanefs-plot-{}.svg", std::process::id()));
        plot_svg(&m, &p).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.contains("<svg") && svg.contains("crunl lanes"));
        std::fs::remove_file(p).unwrap();
        assert!(plot_svg(&m, Path::new("x.png")).is_err());
    }

    /// The T=2 figure against share-nothing is a ratio of speedups, labelled as one: above 1
    /// where the target scaled better than the loop in that run.
    #[test]
    fn the_share_nothing_ratio_says_what_it_is() {
        let cells = vec![
            cell("lanes", 1, 100.0),
            cell("lanes", 2, 190.0),
            cell("share-nothing", 1, 10.0),
            cell("share-nothing", 2, 16.0),
        ];
        let t = table(&cells, 1);
        assert!(
            t.contains("  T=2 speedup relative to share-nothing's (1.60x) in the same run"),
            "{t}"
        );
        assert!(t.contains("\n    lanes         1.19\n"), "{t}");
        assert!(!t.contains("fraction"), "{t}");
    }
}
